"""A dev cluster in its own ZooKeeper chroot, for module-scoped fixtures that share
one cluster between tests."""
from __future__ import annotations

import pathlib
import uuid

from kazoo.client import KazooClient

from exactly_tools.devcluster import DevCluster


def chrooted_cluster(zk: str, directory: pathlib.Path, prefix: str, security: bool = False) -> DevCluster:
    """Start 3 partition leaders and one coordinator of each kind under a fresh
    `/<prefix>-<random>` chroot of `zk`; the caller calls `down()`."""
    root = f"/{prefix}-{uuid.uuid4().hex[:12]}"
    client = KazooClient(hosts=zk)
    client.start()
    client.ensure_path(root)
    client.stop()
    client.close()
    cluster = DevCluster(directory, security=security)
    cluster.up(3, 1, 1, zookeeper=zk + root)
    return cluster
