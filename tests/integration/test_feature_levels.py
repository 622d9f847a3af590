"""Feature levels on real processes (docs/operating/upgrades.md): a new cluster starts at
the newest metadata.version and every process advertises what it supports; a cluster
whose ZooKeeper was written by versions before feature levels starts at 1, where a
kept prepared transaction (KIP-939) is kept as those versions kept it, and is raised
with `exactly features upgrade`, after which the recovery fences the previous
instance; a level below the one finalized is refused; a process never runs at a
level it does not know, neither from the start nor when it is raised under it; a
node's Kafka broker id is its data directory's."""
from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import pytest
from kazoo.client import KazooClient

from clusters import new_chroot
from exactly import AdminClient, PreparedTxnState
from exactly_tools.devcluster import DevCluster, DevClusterError, pid_alive
from kafka_requests import call as kafka_call
from services.common.cluster.state import broker_id
from waiting import wait_for

from .remote_producer import RemoteProducer
from .test_kip939_fencing import FENCED
from .test_txn_prepare import _name, create_topic

pytestmark = pytest.mark.integration

EXACTLY = pathlib.Path(sys.executable).parent / "exactly"
METADATA = 3


def _exactly(cluster: DevCluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXACTLY), *args, "--bootstrap-server", cluster.bootstrap_servers],
                          capture_output=True, text=True, timeout=120)


def _zk(cluster: DevCluster) -> KazooClient:
    zk = KazooClient(hosts=cluster.zookeeper)
    zk.start(timeout=15)
    return zk


def _txn_partitions_recording(cluster: DevCluster, level: int) -> set[str]:
    text = "".join((cluster.dir / "logs" / f"{n}.log").read_text() for n in cluster.services if n.startswith("txn-"))
    return set(re.findall(rf"__transaction_state-(\d+) records metadata.version {level}", text))


def test_a_new_cluster_is_at_the_newest_level_and_refuses_to_go_below_it(cluster):
    described = json.loads(_exactly(cluster, "features", "describe", "--json").stdout)
    assert described["finalized"] == {"metadata.version": 3}
    assert described["supported"] == {"metadata.version": [1, 3]}
    assert {p["node_id"]: (p["supported"], p["advertised"]) for p in described["processes"]} == {
        n: ({"metadata.version": [1, 3]}, True) for n in cluster.services}
    assert _exactly(cluster, "features", "upgrade").stdout.strip() == "metadata.version is already 3."
    refused = _exactly(cluster, "features", "downgrade", "--feature", "metadata.version=2")
    assert refused.returncode == 1 and ("InvalidUpdateVersionError: metadata.version 3 cannot be lowered to 2"
                                        in refused.stderr), refused.stderr
    # Every __transaction_state partition records the level (4 in a dev cluster).
    wait_for(lambda: len(_txn_partitions_recording(cluster, 3)) == 4, 30, "the feature-level records")
    # The broker ids: each data directory's, the derivation of the versions before it,
    # registered and answered on the Kafka port.
    for name, svc in cluster.services.items():
        props = (cluster.dir / name / "meta.properties").read_text()
        assert f"broker.id={broker_id(name)}\n" in props and f"exactly.node.id={name}\n" in props
    brokers = kafka_call(cluster.services["pl-0"].kafka_address, METADATA, 9, {"topics": []}).brokers
    assert {b.node_id for b in brokers} == {broker_id(n) for n in cluster.services}


def test_a_cluster_of_the_versions_before_feature_levels_starts_at_1_and_is_raised(zk, tmp_path):
    chroot = new_chroot(zk, "lvl1")
    before = KazooClient(hosts=chroot)
    before.start(timeout=15)
    before.ensure_path("/exactly/topics")  # what a version before feature levels leaves in ZooKeeper
    before.stop()
    before.close()
    cluster = DevCluster(tmp_path / "cluster")
    try:
        cluster.up(3, 1, 1, zookeeper=chroot)
        described = json.loads(_exactly(cluster, "features", "describe", "--json").stdout)
        assert described["finalized"] == {"metadata.version": 1}
        # At 1, InitProducerId(keep_prepared_txn) keeps the transaction under its pair
        # and appends nothing, as the versions before it did: the epoch moves once, at
        # the completion.
        topic = create_topic(cluster)
        prepared, tid = _recover(cluster, topic, "lvl1")
        assert _epoch(cluster, tid) == prepared.epoch + 1
        assert not _txn_partitions_recording(cluster, 2)
        dry = _exactly(cluster, "features", "upgrade", "--dry-run")
        assert dry.stdout.strip() == "metadata.version can be 3 (was 1).", dry.stderr
        raised = _exactly(cluster, "features", "upgrade", "--feature", "metadata.version=2")
        assert raised.stdout.strip() == "metadata.version is now 2 (was 1).", raised.stderr
        wait_for(lambda: len(_txn_partitions_recording(cluster, 2)) == 4, 30, "the feature-level records")
        # At 2 the recovery bumps the client-facing epoch and fences the previous instance.
        prepared, tid = _recover(cluster, topic, "lvl2", zombie_fenced=True)
        assert _epoch(cluster, tid) == prepared.epoch + 2
        # Then to 3: the coordinators lead their own __transaction_state partitions,
        # and the transactions of level 2 are still there to complete.
        raised = _exactly(cluster, "features", "upgrade")
        assert raised.stdout.strip() == "metadata.version is now 3 (was 2).", raised.stderr
        wait_for(lambda: len(_txn_partitions_recording(cluster, 3)) == 4, 30, "the feature-level records")
        assert _epoch(cluster, tid) == prepared.epoch + 2
        prepared, tid = _recover(cluster, topic, "lvl3", zombie_fenced=True)
        assert _epoch(cluster, tid) == prepared.epoch + 2
    finally:
        cluster.down()


def _recover(cluster: DevCluster, topic: str, prefix: str, zombie_fenced: bool = False) -> tuple[PreparedTxnState, str]:
    """A prepared transaction of instance Z, kept and committed by instance R; whether
    Z's completion is then fenced (level 2) or taken for a retry (level 1)."""
    tid = _name(prefix)
    with RemoteProducer(cluster.bootstrap_servers, tid) as z:
        z.ok("init")
        z.ok("begin")
        z.ok("send", topic, "t1", 0)
        state = z.ok("prepare")
        with RemoteProducer(cluster.bootstrap_servers, tid) as r:
            r.ok("init", True)
            assert r.ok("prepared_state") == state
            assert r.ok("complete", state) == "committed"
        late = z.call("complete", state)
        assert (late.get("error") == FENCED) is zombie_fenced, late
    return PreparedTxnState.deserialize(state), tid


def _epoch(cluster: DevCluster, tid: str) -> int:
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        return admin.describe_transactions([tid])[tid].producer_epoch


def test_a_process_never_runs_at_a_level_it_does_not_know(make_cluster):
    cluster = make_cluster(partition_leaders=1)
    zk = _zk(cluster)
    try:
        # A newer version finalized metadata.version 4 (written by hand here): every
        # process of this version stops, naming it ...
        zk.set("/exactly/features", b'{"version": 1, "features": {"metadata.version": 4}}')
        for name, svc in cluster.services.items():
            wait_for(lambda svc=svc: not pid_alive(svc.pid), 60, f"{name} to stop")
            assert ("CRITICAL services.common.transport.server: metadata.version 4 is finalized in ZooKeeper"
                    in (cluster.dir / "logs" / f"{name}.log").read_text())
        # ... and does not start again.
        with pytest.raises(DevClusterError, match="pl-0 exited during start-up"):
            cluster.restart("pl-0", timeout_s=60)
        assert cluster._procs["pl-0"].wait(30) == 2
        assert ("pl-0 does not start: metadata.version 4 is finalized in ZooKeeper (/exactly/features), and this "
                "version of Exactly supports metadata.version 1-3: run a version that supports 4"
                in (cluster.dir / "logs" / "pl-0.log").read_text())
    finally:
        zk.stop()
        zk.close()
