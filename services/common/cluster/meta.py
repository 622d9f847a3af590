"""`<data dir>/meta.properties`: who a data directory belongs to and in which layout
(Kafka's meta.properties): its node id, the Kafka broker id Kafka clients know the node
by, and the version of the directory's layout (features.py, format "data-directory":
the partition directories and their files without a version of their own, the offset
indexes and the recovery-point, high-watermark and log-start-offset checkpoints; 0,
as every version before the file wrote them).

    version=0
    broker.id=<int32 in [0, 2**24)>
    exactly.node.id=<node id>

The broker id is written the first time a process runs on the directory, from the node
id (`cluster.state.broker_id`, the derivation every version before this file used, so a
node keeps the id it had), and read back ever after: a later version that derived ids
otherwise would still give an existing node the id its clients and monitoring know. A
directory written for another node id is refused (its logs belong to that node), as is
a version of this file that this code does not read.
"""
from __future__ import annotations

import io
import os
import pathlib

from jproperties import Properties

from .features import check_readable

META_FILE = "meta.properties"
META_VERSION = 0


class MetaPropertiesError(RuntimeError):
    """The data directory's meta.properties belongs to another node or is unreadable."""


def load_or_create(data_dir: pathlib.Path, node_id: str, derive) -> int:
    """The broker id of `node_id` on `data_dir`: read from its meta.properties, or, when
    the file does not exist yet, `derive(node_id)` written to it (atomically: a
    temporary file fsynced and renamed). Raises MetaPropertiesError (another node's
    directory, a malformed file), UnknownFormatVersion (a newer version of the file)
    or OSError."""
    path = data_dir / META_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        broker = derive(node_id)
        _write(path, node_id, broker)
        return broker
    props = Properties()
    try:
        props.load(raw, "utf-8")
        version = int(props["version"].data)
        owner = props["exactly.node.id"].data
        broker = int(props["broker.id"].data)
    except (KeyError, ValueError) as exc:
        raise MetaPropertiesError(f"{path} is malformed ({exc!r}); move it away to derive the broker id again") \
            from None
    check_readable("data-directory", version, str(path))
    if owner != node_id:
        raise MetaPropertiesError(f"{path} belongs to node {owner!r}, not {node_id!r}: give this process its "
                                  "own data directory")
    return broker


def _write(path: pathlib.Path, node_id: str, broker: int) -> None:
    tmp = path.with_name(META_FILE + ".tmp")
    props = Properties()
    props["version"], props["broker.id"], props["exactly.node.id"] = str(META_VERSION), str(broker), node_id
    buf = io.BytesIO()
    props.store(buf, encoding="utf-8", timestamp=False)
    body = buf.getvalue()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
