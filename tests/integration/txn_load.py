"""A transactional load and the read_committed check of what it committed, for the
failure tests of the transaction coordinator (test_coordinator_node_kill,
test_coordinator_led_logs): every acknowledged transaction must be read once, none in
part (KIP-98 design document, "Discussion on Coordinator Failure During Transaction
Completion")."""
from __future__ import annotations

import json
import threading
import time
import uuid

import grpc

from exactly import Consumer, Producer, TopicPartition, errors
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from clusters import zookeeper_client
from waiting import wait_for

PARTITIONS = 3
RUN_S = 120.0  # each producer's bound on its whole run
TRANSACTION_STATE = "__transaction_state"
# The failure tests' cluster: replication factor 3 with min.insync.replicas 2 for the
# internal topics, and sessions and lag short enough that a failover takes seconds.
RF3_PROPS = {
    "zookeeper.session.timeout.ms": "4000",
    "replica.lag.time.max.ms": "3000",
    "min.insync.replicas": "2",
    "transaction.state.log.replication.factor": "3",
    "offsets.topic.replication.factor": "3",
}
TXN = 1  # FindCoordinator's key type of a transactional.id


class TransactionalLoad:
    """A thread committing transaction i as one record "n-i-p" to each partition p (n:
    the load's `index`), in
    order, acks=all. `acknowledged`: the i whose commit_transaction() returned;
    `in_commit` is set while a commit is in progress. A commit that times out is called
    again (as commit_transaction() allows); one that fails otherwise is aborted, or the
    producer replaced when its error is fatal: those transactions' outcome is either,
    and only all-or-nothing is checked for them."""

    def __init__(self, bootstrap: str, topic: str, index: int = 0):
        self.bootstrap, self.topic, self.index = bootstrap, topic, index
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
                    producer.send(self.topic, value=f"{self.index}-{i}-{p}".encode(), partition=p)
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


def check_all_or_nothing(bootstrap: str, topic: str, loads: list["TransactionalLoad"]) -> dict[int, set[int]]:
    """Read `topic` read_committed and check each load's transactions: none visible in
    part, no record twice, every acknowledged one there. Returns transaction -> the
    partitions that hold it, per load (keyed by the load's index)."""
    values = _committed(bootstrap, topic)
    seen: dict[tuple[int, int], set[int]] = {}
    for p, got in values.items():
        assert len(got) == len(set(got)), f"partition {p} holds a record twice"
        for value in got:
            who, i, q = value.split("-")
            assert int(q) == p
            seen.setdefault((int(who), int(i)), set()).add(p)
    partial = {k: ps for k, ps in seen.items() if ps != set(range(PARTITIONS))}
    assert not partial, f"transactions visible in part: {partial}"
    for n, load in enumerate(loads):
        lost = [i for i in load.acknowledged if (n, i) not in seen]
        assert not lost, f"acknowledged transactions of load {n} lost: {lost}; failures: {load.failures}"
    return seen


# ---------------------------------------------------------------- metadata.version 3: coordinator-led logs

def replicas_and_leader(cluster, partition: int) -> tuple[list[str], str | None]:
    """(replicas, leader) of a __transaction_state partition, read from ZooKeeper."""
    zk = zookeeper_client(cluster)
    try:
        body = json.loads(zk.get(f"/exactly/topics/{TRANSACTION_STATE}")[0])
        state = json.loads(zk.get(f"/exactly/topics/{TRANSACTION_STATE}/{partition}/state")[0])
        return body["partitions"][str(partition)], state["leader"]
    finally:
        zk.stop()
        zk.close()


def leader_epoch(cluster, partition: int) -> int:
    zk = zookeeper_client(cluster)
    try:
        return json.loads(zk.get(f"/exactly/topics/{TRANSACTION_STATE}/{partition}/state")[0])["leader_epoch"]
    finally:
        zk.stop()
        zk.close()


def coordinator_led(cluster, partitions=None) -> bool:
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


def coordinator_node(cluster, tid: str) -> tuple[str, int, str]:
    """(the transaction coordinator owning `tid`, its __transaction_state partition, the
    partition leader leading that partition), as FindCoordinator and Metadata give them."""
    with grpc.insecure_channel(cluster.services["pl-0"].address) as channel:
        stub = pbg.ClusterStub(channel)
        found = stub.FindCoordinator(pb.FindCoordinatorRequest(key=tid, key_type=TXN), timeout=10)
        assert found.error_code == 0, found
        md = stub.Metadata(pb.MetadataRequest(topics=[TRANSACTION_STATE]), timeout=10)
    [leader] = [p.leader_id for p in md.topics[0].partitions if p.partition == found.partition]
    return found.node_id, found.partition, leader
