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

import json
import threading
import time
import uuid

import grpc
import pytest

from exactly import AdminClient, Consumer, NewTopic, Producer, TopicPartition, errors

from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from clusters import zookeeper_client
from waiting import wait_for

pytestmark = pytest.mark.integration

PARTITIONS = 3
TXN = 1  # FindCoordinator's key type of a transactional.id
TRANSACTION_STATE = "__transaction_state"
PROPS = {
    "zookeeper.session.timeout.ms": "4000",
    "replica.lag.time.max.ms": "3000",
    "min.insync.replicas": "2",
    "transaction.state.log.replication.factor": "3",
    "offsets.topic.replication.factor": "3",
}
BEFORE_KILL = 15  # transactions acknowledged before the kill
AFTER_KILL = 15  # and after it
RUN_S = 120.0  # the producer's bound on the whole run


class TransactionalLoad:
    """A thread committing transaction i as one record "i-p" to each partition p, in
    order, acks=all. `acknowledged`: the i whose commit_transaction() returned;
    `in_commit` is set while a commit is in progress. A commit that times out is called
    again (as commit_transaction() allows); one that fails otherwise is aborted, or the
    producer replaced when its error is fatal: those transactions' outcome is either,
    and only all-or-nothing is checked for them."""

    def __init__(self, bootstrap: str, topic: str):
        self.bootstrap, self.topic = bootstrap, topic
        self.tid = f"node-kill-{uuid.uuid4().hex[:8]}"
        self.acknowledged: list[int] = []
        self.failures: list[str] = []
        self.in_commit = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="transactional-load", daemon=True)

    def _producer(self) -> Producer:
        producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.tid, "acks": "all",
                             "transaction.timeout.ms": 60000, "max.block.ms": 60000})
        producer.init_transactions()
        return producer

    def _run(self) -> None:
        deadline = time.monotonic() + RUN_S
        producer = self._producer()
        i = 0
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                producer.begin_transaction()
                for p in range(PARTITIONS):
                    producer.send(self.topic, value=f"{i}-{p}".encode(), partition=p)
                self.in_commit.set()
                try:
                    self._commit(producer, deadline)
                    self.acknowledged.append(i)
                except errors.ExactlyError as exc:
                    self.failures.append(f"{i}: {type(exc).__name__}: {exc}")
                    if exc.fatal:
                        producer.close()
                        producer = self._producer()
                    else:
                        producer.abort_transaction()
                finally:
                    self.in_commit.clear()
                i += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            producer.close()

    @staticmethod
    def _commit(producer: Producer, deadline: float) -> None:
        while True:
            try:
                producer.commit_transaction(timeout=20)
                return
            except errors.KafkaTimeoutError:
                if time.monotonic() > deadline:
                    raise


def _committed(bootstrap: str, topic: str) -> dict[int, list[str]]:
    """partition -> the values a read_committed consumer reads, up to the end offsets
    (the last stable offsets) once no transaction is open."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "isolation.level": "read_committed",
                         "enable.auto.commit": False, "group.id": f"check-{uuid.uuid4().hex[:6]}"})
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(tps)
        ends = consumer.end_offsets(tps)
        out: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}

        def caught_up() -> bool:
            for message in consumer.poll(timeout=1.0, max_records=1000):
                out[message.partition].append(message.value.decode())
            return all(consumer.position(tp) >= ends[tp] for tp in tps)
        wait_for(caught_up, 60, "the read_committed consumer to reach the end offsets")
        return out
    finally:
        consumer.close()


# metadata.version 3 (unstable): the coordinator leads its own partition, so its node is one process.
LEVEL_3 = {**PROPS, "unstable.feature.versions.enable": "true"}


@pytest.mark.parametrize("level", [2, 3])
def test_sigkill_of_the_coordinators_node_mid_commit_loses_nothing_acknowledged(make_cluster, level):
    cluster = make_cluster(partition_leaders=3, txn_coordinators=2, group_coordinators=1,
                           props=LEVEL_3 if level == 3 else PROPS)
    if level == 3:
        wait_for(lambda: _coordinator_led(cluster), 60, "every __transaction_state partition led by its owner")
    topic = f"node-kill-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(topic, PARTITIONS, replication_factor=3)], timeout=60)
    load = TransactionalLoad(cluster.bootstrap_servers, topic)
    load.thread.start()
    try:
        wait_for(lambda: len(load.acknowledged) >= BEFORE_KILL or load.error, 60, "transactions before the kill")
        assert load.error is None, load.error
        owner, log_partition, leader = _node(cluster, load.tid)
        if level == 3:
            assert leader == owner and owner.startswith("txn-"), (owner, leader)
        else:
            assert leader.startswith("pl-") and owner.startswith("txn-"), (owner, leader)
        if level == 3:
            replicas, _ = _replicas_and_leader(cluster, log_partition)
            assert replicas[0] == owner and len(replicas) == 3, replicas
            epoch_at_kill = _leader_epoch(cluster, log_partition)
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

    values = _committed(cluster.bootstrap_servers, topic)
    seen: dict[int, set[int]] = {}
    for p, got in values.items():
        assert len(got) == len(set(got)), f"partition {p} holds a record twice"
        for value in got:
            i, q = map(int, value.split("-"))
            assert q == p
            seen.setdefault(i, set()).add(p)
    partial = {i: ps for i, ps in seen.items() if ps != set(range(PARTITIONS))}
    assert not partial, f"transactions visible in part: {partial}"
    lost = [i for i in load.acknowledged if i not in seen]
    assert not lost, f"acknowledged transactions lost: {lost}; failures: {load.failures}"
    killed = owner if leader == owner else f"{owner} and {leader}"
    print(f"killed {killed} (leader of __transaction_state-{log_partition}) mid-commit: "
          f"{len(load.acknowledged)} acknowledged, {len(seen)} committed, failures: {load.failures}")
    if level == 3:
        # The failover ended as designed: the new owner leads the partition, and the killed
        # coordinator's replica was replaced (the replication factor stays 3).
        wait_for(lambda: _coordinator_led(cluster, [log_partition]), 60, "the new owner leading the partition")
        replicas, _ = _replicas_and_leader(cluster, log_partition)
        assert owner not in replicas and len(replicas) == 3, replicas
        # Two elections at least: an in-sync partition leader in the interim (the new owner was
        # no replica yet), then the new owner once it caught up.
        assert _leader_epoch(cluster, log_partition) >= epoch_at_kill + 2


def _node(cluster, tid: str) -> tuple[str, int, str]:
    """(the transaction coordinator owning `tid`, its __transaction_state partition, the
    partition leader leading that partition), as FindCoordinator and Metadata give them."""
    with grpc.insecure_channel(cluster.services["pl-0"].address) as channel:
        stub = pbg.ClusterStub(channel)
        found = stub.FindCoordinator(pb.FindCoordinatorRequest(key=tid, key_type=TXN), timeout=10)
        assert found.error_code == 0, found
        md = stub.Metadata(pb.MetadataRequest(topics=[TRANSACTION_STATE]), timeout=10)
    [leader] = [p.leader_id for p in md.topics[0].partitions if p.partition == found.partition]
    return found.node_id, found.partition, leader


def _replicas_and_leader(cluster, partition: int) -> tuple[list[str], str | None]:
    """(replicas, leader) of a __transaction_state partition, read from ZooKeeper."""
    zk = zookeeper_client(cluster)
    try:
        body = json.loads(zk.get(f"/exactly/topics/{TRANSACTION_STATE}")[0])
        state = json.loads(zk.get(f"/exactly/topics/{TRANSACTION_STATE}/{partition}/state")[0])
        return body["partitions"][str(partition)], state["leader"]
    finally:
        zk.stop()
        zk.close()


def _leader_epoch(cluster, partition: int) -> int:
    zk = zookeeper_client(cluster)
    try:
        return json.loads(zk.get(f"/exactly/topics/{TRANSACTION_STATE}/{partition}/state")[0])["leader_epoch"]
    finally:
        zk.stop()
        zk.close()


def _coordinator_led(cluster, partitions=None) -> bool:
    """Whether each (or each of `partitions`) __transaction_state partition is led by its
    first replica, a live transaction coordinator, with no replica left to remove."""
    zk = zookeeper_client(cluster)
    try:
        body = json.loads(zk.get(f"/exactly/topics/{TRANSACTION_STATE}")[0])
        for p, replicas in body["partitions"].items():
            if partitions is not None and int(p) not in partitions:
                continue
            state = json.loads(zk.get(f"/exactly/topics/{TRANSACTION_STATE}/{p}/state")[0])
            if not replicas[0].startswith("txn-") or state["leader"] != replicas[0] or p in body.get("removing", {}):
                return False
        return True
    finally:
        zk.stop()
        zk.close()
