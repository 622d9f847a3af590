"""A dev cluster in its own ZooKeeper chroot, for module-scoped fixtures that share
one cluster between tests; a private PostgreSQL server for fixtures."""
from __future__ import annotations

import pathlib
import uuid
from typing import Iterator

from kazoo.client import KazooClient

from exactly_tools.devcluster import DevCluster
from services.common.cluster import features
from exactly_tools.pgserver import PostgresServer, private_data_dir


# The transaction log on two replicas: the owning coordinator and a partition leader.
# A new cluster runs at metadata.version 3, where the owner leads its own
# __transaction_state partitions; at the default replication factor 1 it holds their
# only copy, so a coordinator's death takes them offline until it restarts (as a
# broker's does in Kafka). Tests of a coordinator failover replicate the log.
REPLICATED_TXN_LOG = {"transaction.state.log.replication.factor": "2"}


def new_chroot(zk: str, prefix: str, level: int | None = None) -> str:
    """`zk` with a fresh `/<prefix>-<random>` chroot appended, created in ZooKeeper;
    with `level`, metadata.version finalized there at that level (`/exactly/features`),
    so that a cluster started in it runs at `level` rather than the newest."""
    root = f"/{prefix}-{uuid.uuid4().hex[:12]}"
    client = KazooClient(hosts=zk)
    client.start()
    try:
        client.ensure_path(root)
        if level is not None:
            client.create(f"{root}{features.FEATURES_PATH}", features.encode_finalized(level), makepath=True)
    finally:
        client.stop()
        client.close()
    return zk + root


def chrooted_cluster(zk: str, directory: pathlib.Path, prefix: str, security: bool = False,
                     leaders: int = 3, txn_coordinators: int = 1, group_coordinators: int = 1) -> DevCluster:
    """Start `leaders` partition leaders, `txn_coordinators` transaction coordinators and
    `group_coordinators` group coordinators under a fresh `/<prefix>-<random>` chroot of
    `zk`; the caller calls `down()`."""
    cluster = DevCluster(directory, security=security)
    cluster.up(leaders, txn_coordinators, group_coordinators, zookeeper=new_chroot(zk, prefix))
    return cluster


def zookeeper_client(cluster: DevCluster, timeout_s: float = 30.0) -> KazooClient:
    """A started KazooClient on the cluster's ZooKeeper (its chroot), authenticated with
    the services' digest on a secured cluster (whose znodes nobody else may read); the
    caller stops and closes it."""
    auth = []
    props = cluster.zookeeper_properties
    if cluster.security and props.exists():
        conf = dict(line.split("=", 1) for line in props.read_text().split() if "=" in line)
        auth = [("digest", f"{conf['zookeeper.digest.username']}:{conf['zookeeper.digest.password']}")]
    client = KazooClient(hosts=cluster.zookeeper, timeout=10, auth_data=auth)
    client.start(timeout=timeout_s)
    return client


def certificate_conf(cluster: DevCluster, name: str, **extra) -> dict:
    """SDK settings of a client holding the certificate `name` issued by a secured
    cluster's CA (DIR/certs/<name>.pem and .key), plus `extra`."""
    certs = cluster.dir / "certs"
    return {"bootstrap.servers": cluster.bootstrap_servers, "security.protocol": "SSL",
            "ssl.ca.location": str(certs / "ca.pem"), "ssl.certificate.location": str(certs / f"{name}.pem"),
            "ssl.key.location": str(certs / f"{name}.key"), **extra}


def admin_client(cluster: DevCluster):
    """An AdminClient with the cluster's admin settings (User:admin on a secured one)."""
    from exactly import AdminClient
    return AdminClient({"bootstrap.servers": cluster.bootstrap_servers, **cluster.client_config})


def committed(cluster: DevCluster, group: str, tps) -> dict:
    """TopicPartition -> the offset `group` committed for it (None: none), read as a
    read_committed consumer reads it: its OffsetFetch sets require_stable (KIP-447) and
    waits while a transaction's offsets are pending, so a commit_transaction() that
    returned shows even before its markers reach the group coordinator."""
    from exactly import Consumer
    with Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group,
                   "isolation.level": "read_committed", **cluster.client_config}) as c:
        return {tp: (om.offset if om is not None else None) for tp, om in c.committed(tps, timeout=30).items()}


def module_cluster(zk: str, tmp_path_factory, prefix: str, **sizes) -> Iterator[DevCluster]:
    """For a module-scoped fixture (`yield from module_cluster(zk, tmp_path_factory, "x")`):
    a chrooted_cluster for the module's tests (`sizes`: its leaders, txn_coordinators,
    group_coordinators), torn down after them."""
    cluster = chrooted_cluster(zk, tmp_path_factory.mktemp(prefix), prefix, **sizes)
    try:
        yield cluster
    finally:
        cluster.down()


def running_postgres() -> Iterator[PostgresServer]:
    """For a fixture (`yield from running_postgres()`): a started PostgreSQL server
    (Debian's postgresql, exactly_tools.pgserver) with a private data directory on a
    free port; stopped and deleted afterwards."""
    server = PostgresServer(private_data_dir())
    try:
        server.start()
        yield server
    finally:
        server.remove()
