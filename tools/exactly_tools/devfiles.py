"""Where a dev cluster lives and what its files say, for `exactly-dev` and for the
`exactly` command line (which imports no server code): the default directory
(`$EXACTLY_DEV_DIR`, else `.run/dev` under the current directory), the bootstrap
addresses in its `cluster.json`, and the names of the client property files `exactly-dev up`
writes there.
"""
from __future__ import annotations

import json
import os
import pathlib

# The directory `exactly-dev` uses without --dir, and where `exactly` looks for a dev cluster.
DEV_DIR_ENV = "EXACTLY_DEV_DIR"
DEFAULT_DEV_DIR = ".run/dev"
# The bootstrap address every `exactly` command and the README's examples read.
BOOTSTRAP_ENV = "EXACTLY_BOOTSTRAP_SERVER"
STATE_FILE = "cluster.json"
# Client properties (Kafka's --command-config format) written by `exactly-dev up`:
# bootstrap.servers and, on a secured cluster, TLS with the admin's certificate.
CLIENT_PROPERTIES = "client.properties"
# Kafka clients (librdkafka, the Java client, kcat -F): the Kafka port's bootstrap and security.
KAFKA_CLIENT_PROPERTIES = "kafka-client.properties"


def default_dir() -> pathlib.Path:
    """The dev cluster directory when none is given: $EXACTLY_DEV_DIR, else .run/dev."""
    return pathlib.Path(os.environ.get(DEV_DIR_ENV) or DEFAULT_DEV_DIR)


def cluster_bootstrap(directory: str | os.PathLike | None = None) -> str | None:
    """The gRPC bootstrap addresses of the dev cluster in `directory` (default
    `default_dir()`) from its cluster.json; None when there is no cluster there."""
    path = pathlib.Path(directory if directory is not None else default_dir()) / STATE_FILE
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return body.get("bootstrap_servers") or None


__all__ = ["DEV_DIR_ENV", "DEFAULT_DEV_DIR", "BOOTSTRAP_ENV", "STATE_FILE", "CLIENT_PROPERTIES",
           "KAFKA_CLIENT_PROPERTIES", "default_dir", "cluster_bootstrap"]
