"""metadata.version 3 (a new cluster's level): transaction coordinators lead
their own `__transaction_state` partitions (docs/design/coordinator-local-logs.md). Three
of its failure-model cases with real processes, a real ZooKeeper, replication factor 3,
min.insync.replicas 2 and acks=all, each under a transactional load whose every
acknowledged transaction must be read once and none in part:

- the level raised from 2 to 3 while producers commit: each owner becomes its
  partitions' first replica, catches up and leads, and a partition leader's replica
  leaves, so the replication factor stays 3;
- EIO on the leading coordinator's log directory: its partitions' leadership moves to
  in-sync partition leaders and it goes on as their owner, appending through them;
- the coordinator leading a partition paused (SIGSTOP) past its ZooKeeper session: the
  other coordinator takes the partition over (through an interim partition leader) and
  the producer goes on committing; the paused one, resumed, finds itself deposed (its
  lease lapsed, the writer epoch fences its late appends), follows, and takes its
  partitions back as their owner and leader.
"""
from __future__ import annotations

import json
import signal
import uuid

import pytest

from exactly import AdminClient, FeatureUpdate, NewTopic
from exactly_tools.devcluster import DevCluster
from clusters import new_chroot, zookeeper_client
from faults.diskfs import under_faults
from waiting import wait_for

from .txn_load import (PARTITIONS, RF3_PROPS, TransactionalLoad, check_all_or_nothing, coordinator_led, coordinator_node,
                       replicas_and_leader)

pytestmark = pytest.mark.integration

PROPS = {**RF3_PROPS, "transaction.state.log.num.partitions": "4"}
STEP = 10  # transactions each load acknowledges between two checkpoints


def _level(cluster: DevCluster) -> int:
    zk = zookeeper_client(cluster)
    try:
        return json.loads(zk.get("/exactly/features")[0])["features"]["metadata.version"]
    finally:
        zk.stop()
        zk.close()


def _progress(loads: list[TransactionalLoad], what: str, timeout_s: float = 90.0) -> None:
    """Wait until every load acknowledged STEP more transactions."""
    marks = [len(load.acknowledged) + STEP for load in loads]
    wait_for(lambda: all(len(load.acknowledged) >= m for load, m in zip(loads, marks))
             or any(load.error for load in loads), timeout_s, what)
    for load in loads:
        assert load.error is None, load.error


def _run(loads: list[TransactionalLoad]) -> None:
    for load in loads:
        load.thread.start()


def _finish(cluster: DevCluster, topic: str, loads: list[TransactionalLoad]) -> None:
    for load in loads:
        load.stop.set()
    for load in loads:
        load.thread.join(120)
        assert not load.thread.is_alive()
    check_all_or_nothing(cluster.bootstrap_servers, topic, loads)


def _topic(cluster: DevCluster) -> str:
    topic = f"led-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(topic, PARTITIONS, replication_factor=3)], timeout=60)
    return topic


def test_raising_the_level_to_3_under_load_makes_each_owner_the_leader_of_its_partitions(zk, tmp_path):
    chroot = new_chroot(zk, "raise", level=2)  # an existing cluster at level 2
    cluster = DevCluster(tmp_path / "cluster", props=dict(PROPS))
    cluster.up(3, 2, 1, zookeeper=chroot)
    loads: list[TransactionalLoad] = []
    try:
        assert _level(cluster) == 2
        assert all(replicas_and_leader(cluster, p)[0][0].startswith("pl-") for p in range(4))
        topic = _topic(cluster)
        loads = [TransactionalLoad(cluster.bootstrap_servers, topic, index=n) for n in range(2)]
        _run(loads)
        _progress(loads, "transactions at level 2")
        with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
            admin.update_features({"metadata.version": FeatureUpdate(3, "upgrade")})
        assert _level(cluster) == 3
        wait_for(lambda: coordinator_led(cluster), 60, "every partition led by its owner")
        for p in range(4):
            replicas, leader = replicas_and_leader(cluster, p)
            assert leader == replicas[0] and leader.startswith("txn-") and len(replicas) == 3, (p, replicas)
            assert sum(r.startswith("txn-") for r in replicas) == 1, replicas
        _progress(loads, "transactions at level 3")
        _finish(cluster, topic, loads)
    finally:
        for load in loads:
            load.stop.set()
        cluster.down()


def test_a_coordinator_paused_past_its_session_is_replaced_then_takes_its_partitions_back(make_cluster):
    cluster = make_cluster(partition_leaders=3, txn_coordinators=2, group_coordinators=1, props=PROPS)
    wait_for(lambda: coordinator_led(cluster), 60, "every partition led by its owner")
    topic = _topic(cluster)
    loads = [TransactionalLoad(cluster.bootstrap_servers, topic)]
    try:
        _run(loads)
        _progress(loads, "transactions before the pause")
        owner, partition, leader = coordinator_node(cluster, loads[0].tid)
        assert leader == owner, (owner, leader)
        other = next(n for n in cluster.services if n.startswith("txn-") and n != owner)
        cluster.signal(owner, signal.SIGSTOP)
        try:
            # Its session ends; the other coordinator owns the partition, first through an
            # interim partition leader, then as its leader; the producer goes on committing.
            wait_for(lambda: replicas_and_leader(cluster, partition)[1] == other, 60,
                     f"{other} leading __transaction_state-{partition}")
            _progress(loads, "transactions while the owner is paused")
        finally:
            cluster.signal(owner, signal.SIGCONT)
        # Back in the cluster, it owns its partitions again (sorted ids) and leads them.
        wait_for(lambda: replicas_and_leader(cluster, partition)[1] == owner and coordinator_led(cluster), 60,
                 f"{owner} leading its partitions again")
        _progress(loads, "transactions after the resume")
        _finish(cluster, topic, loads)
        replicas, _ = replicas_and_leader(cluster, partition)
        assert replicas[0] == owner and len(replicas) == 3 and other not in replicas, replicas
    finally:
        for load in loads:
            load.stop.set()


def test_eio_on_the_leading_coordinators_log_dir_moves_the_log_and_transactions_go_on(make_cluster):
    """KIP-112 on a coordinator: writes under its log directory fail (EIO, the FUSE
    filesystem of tests/faults/diskfs.py). It publishes the directory offline, the
    controller gives the leadership of its partitions to in-sync partition leaders, and
    the coordinator, still their owner, appends through them: the producer goes on
    committing, nothing acknowledged is lost and nothing is visible in part."""
    cluster = make_cluster(partition_leaders=3, txn_coordinators=1, group_coordinators=1, props=PROPS)
    disk = under_faults(cluster, "txn-0")
    loads: list[TransactionalLoad] = []
    try:
        wait_for(lambda: coordinator_led(cluster), 60, "every partition led by its owner")
        topic = _topic(cluster)
        loads.append(TransactionalLoad(cluster.bootstrap_servers, topic))
        _run(loads)
        _progress(loads, "transactions before the fault")
        owner, partition, leader = coordinator_node(cluster, loads[0].tid)
        assert owner == leader == "txn-0", (owner, leader)
        disk.set(eio=["write", "fsync"], paths=["logs/"])
        wait_for(lambda: (lambda rl: rl[1] is not None and rl[1].startswith("pl-"))(
            replicas_and_leader(cluster, partition)), 60, f"a partition leader leading __transaction_state-{partition}")
        _progress(loads, "transactions after the fault")
        assert coordinator_node(cluster, loads[0].tid)[0] == "txn-0"  # still the owner
        _finish(cluster, topic, loads)
    finally:
        for load in loads:
            load.stop.set()
        cluster.kill("txn-0")
        disk.close()
