"""Replication factor 3 with acks=all: SIGKILL of a transaction coordinator's node while
the producer is inside commit_transaction() loses nothing acknowledged, duplicates
nothing, and leaves every transaction all or nothing (KIP-98 design document,
"Discussion on Coordinator Failure During Transaction Completion", "Transaction
Coordinator Startup"; docs/design/coordinator-local-logs.md).

The coordinator's node: the transaction coordinator that owns the producer's
transactional.id and the partition leader leading that coordinator's
`__transaction_state` partition (a Kafka broker is both). Both are SIGKILLed at once,
mid-commit, and stay dead. The other coordinator claims the partition once the killed
one's ZooKeeper session expires, loads it from the newly elected leader among the two
replicas left (min.insync.replicas 2, so every record it acknowledged was on both), and
completes what the killed one had prepared; the producer's retried EndTxn meets the
outcome. Real processes, a real ZooKeeper, real RocksDB and gRPC over loopback.
"""
from __future__ import annotations

import uuid

import pytest

from exactly import AdminClient, NewTopic

from waiting import wait_for

from .txn_load import (PARTITIONS, RF3_PROPS, RUN_S, TransactionalLoad, check_all_or_nothing, coordinator_led,
                       coordinator_node, leader_epoch, replicas_and_leader)

pytestmark = pytest.mark.integration

BEFORE_KILL = 15  # transactions acknowledged before the kill
AFTER_KILL = 15  # and after it


# At metadata.version 3 (a new cluster's) the coordinator leads its own partition, so
# its node is one process; at 2 (a cluster upgraded from 0.1.0 before the level is
# raised) a partition leader leads it.
@pytest.mark.parametrize("level", [2, 3])
def test_sigkill_of_the_coordinators_node_mid_commit_loses_nothing_acknowledged(make_cluster, level):
    cluster = make_cluster(partition_leaders=3, txn_coordinators=2, group_coordinators=1, props=RF3_PROPS, level=level)
    if level == 3:
        wait_for(lambda: coordinator_led(cluster), 60, "every __transaction_state partition led by its owner")
    topic = f"node-kill-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(topic, PARTITIONS, replication_factor=3)], timeout=60)
    load = TransactionalLoad(cluster.bootstrap_servers, topic)
    load.thread.start()
    try:
        wait_for(lambda: len(load.acknowledged) >= BEFORE_KILL or load.error, 60, "transactions before the kill")
        assert load.error is None, load.error
        owner, log_partition, leader = coordinator_node(cluster, load.tid)
        if level == 3:
            assert leader == owner and owner.startswith("txn-"), (owner, leader)
        else:
            assert leader.startswith("pl-") and owner.startswith("txn-"), (owner, leader)
        if level == 3:
            replicas, _ = replicas_and_leader(cluster, log_partition)
            assert replicas[0] == owner and len(replicas) == 3, replicas
            epoch_at_kill = leader_epoch(cluster, log_partition)
        assert load.in_commit.wait(30), "no commit in progress"
        cluster.kill(owner)
        if leader != owner:
            cluster.kill(leader)
        acknowledged_at_kill = len(load.acknowledged)
        wait_for(lambda: len(load.acknowledged) >= acknowledged_at_kill + AFTER_KILL or load.error, RUN_S,
                 "transactions after the kill")
        assert load.error is None, load.error
    finally:
        load.stop.set()
        load.thread.join(RUN_S)
    assert not load.thread.is_alive()

    seen = check_all_or_nothing(cluster.bootstrap_servers, topic, [load])
    killed = owner if leader == owner else f"{owner} and {leader}"
    print(f"killed {killed} (leader of __transaction_state-{log_partition}) mid-commit: "
          f"{len(load.acknowledged)} acknowledged, {len(seen)} committed, failures: {load.failures}")
    if level == 3:
        # The failover ended as designed: the new owner leads the partition, and the killed
        # coordinator's replica was replaced (the replication factor stays 3).
        wait_for(lambda: coordinator_led(cluster, [log_partition]), 60, "the new owner leading the partition")
        replicas, _ = replicas_and_leader(cluster, log_partition)
        assert owner not in replicas and len(replicas) == 3, replicas
        # Two elections at least: an in-sync partition leader in the interim (the new owner was
        # no replica yet), then the new owner once it caught up.
        assert leader_epoch(cluster, log_partition) >= epoch_at_kill + 2
