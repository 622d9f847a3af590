"""A dev cluster in its own ZooKeeper chroot, for module-scoped fixtures that share
one cluster between tests."""
from __future__ import annotations

import pathlib
import uuid

from kazoo.client import KazooClient

from exactly_tools.devcluster import DevCluster


def new_chroot(zk: str, prefix: str) -> str:
    """`zk` with a fresh `/<prefix>-<random>` chroot appended, created in ZooKeeper."""
    root = f"/{prefix}-{uuid.uuid4().hex[:12]}"
    client = KazooClient(hosts=zk)
    client.start()
    try:
        client.ensure_path(root)
    finally:
        client.stop()
        client.close()
    return zk + root


def chrooted_cluster(zk: str, directory: pathlib.Path, prefix: str, security: bool = False,
                     leaders: int = 3) -> DevCluster:
    """Start `leaders` partition leaders and one coordinator of each kind under a fresh
    `/<prefix>-<random>` chroot of `zk`; the caller calls `down()`."""
    cluster = DevCluster(directory, security=security)
    cluster.up(leaders, 1, 1, zookeeper=new_chroot(zk, prefix))
    return cluster
