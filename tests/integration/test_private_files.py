"""Files of a secured dev cluster on real processes (docs/design.md, "Security"):
after transactions, consumed and committed offsets, and a graceful shutdown (which
writes producer-state snapshots), nothing under the cluster's directory (its own
ZooKeeper's data, the services' logs and partitions, certificates, keys, settings) is
readable, writable or searchable by group or other."""
from __future__ import annotations

import os
import stat

import pytest

from exactly import AdminClient, Consumer, NewTopic, Producer
from exactly_tools.devcluster import DevCluster
from waiting import wait_for

pytestmark = pytest.mark.integration


def _exposed(root) -> list[str]:
    """Every path under `root` (itself included) with group or other permission bits."""
    out = []
    for directory, dirs, files in os.walk(root):
        for path in [directory] + [os.path.join(directory, n) for n in dirs + files]:
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:  # removed meanwhile (a rolled temporary file)
                continue
            if not stat.S_ISLNK(mode) and mode & 0o077:
                out.append(f"{oct(stat.S_IMODE(mode))} {os.path.relpath(path, root)}")
    return sorted(set(out))


def test_nothing_under_a_secured_dev_cluster_is_readable_by_others(tmp_path):
    cluster = DevCluster(tmp_path / "cluster", security=True)
    seen: list[str] = []
    try:
        cluster.up(1, 1, 1)  # its own ZooKeeper, under the cluster's directory
        conf = {"bootstrap.servers": cluster.bootstrap_servers, **cluster.client_config}
        with AdminClient(conf) as admin:
            admin.create_topics([NewTopic("private", 2, 1)])
        producer = Producer({**conf, "transactional.id": "private-tx"})
        producer.init_transactions()
        with producer.transaction():
            for i in range(50):
                producer.send("private", b"r%02d" % i, partition=i % 2)
        producer.close()
        consumer = Consumer({**conf, "group.id": "private-g", "auto.offset.reset": "earliest",
                             "isolation.level": "read_committed"})
        consumer.subscribe(["private"])
        got = []
        wait_for(lambda: got.extend(consumer.poll(0.5)) or len(got) >= 50, 60, "50 committed records")
        consumer.commit()
        consumer.close()
        seen += _exposed(cluster.dir)
    finally:
        cluster.down()
    seen += _exposed(cluster.dir)
    names = {p.split(" ", 1)[1] for p in seen}
    assert seen == [], f"{len(names)} paths readable by group/other, e.g. {sorted(names)[:25]}"
