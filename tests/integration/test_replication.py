"""Partition replication and leader election through ZooKeeper, with real processes:
replication factor 3, min.insync.replicas 2, unclean election off (issue 3 parts 1-2;
KIP-101 for leader epochs and truncation).

- A leader killed with SIGKILL: a new leader is elected from the ISR once its
  ZooKeeper session expires; the idempotent SDK producer carries on after a metadata
  refresh; nothing acknowledged is lost, nothing is duplicated.
- A leader paused with SIGSTOP past its session timeout, then resumed: it acknowledges
  no write after the new leader was elected, and what it accepted before is kept once.
- acks=all with a single in-sync replica left answers NOT_ENOUGH_REPLICAS and
  writes nothing a consumer can see; once a replica is back in the ISR, acks=all works.
"""
from __future__ import annotations

import concurrent.futures
import signal
import threading
import time
import uuid

import grpc
import pytest

from exactly import AdminClient, Consumer, NewTopic, Producer, TopicPartition, errors
from exactly_wire.clock import wall_clock_ms
from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg

from waiting import wait_for

pytestmark = pytest.mark.integration

SESSION_MS = 4000
PROPS = {
    "zookeeper.session.timeout.ms": str(SESSION_MS),
    "replica.lag.time.max.ms": "3000",
    "min.insync.replicas": "2",
    "transaction.state.log.replication.factor": "3",
    "offsets.topic.replication.factor": "3",
}


@pytest.fixture
def rf3(make_cluster):
    return make_cluster(partition_leaders=3, txn_coordinators=1, group_coordinators=1, props=PROPS)


def create_topic(cluster, partitions: int = 1) -> str:
    topic = f"repl-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    try:
        admin.create_topics([NewTopic(topic, partitions, replication_factor=3)], timeout=60)
    finally:
        admin.close()
    return topic


def describe(cluster, topic: str, partition: int = 0, exclude: tuple[str, ...] = ()):
    """(leader id, ISR) of a partition as a live partition leader not in `exclude` sees it."""
    servers = ",".join(s.address for n, s in cluster.services.items()
                       if s.role == "partition_leader" and n not in exclude)
    admin = AdminClient({"bootstrap.servers": servers, "request.timeout.ms": 3000})
    try:
        p = admin.describe_topics([topic])[topic].partitions[partition]
        return p.leader_id, tuple(p.isr)
    finally:
        admin.close()


def seen(cluster, topic: str, partition: int = 0, exclude: tuple[str, ...] = ()):
    """`describe`, or (None, ()) while no live partition leader answers in time (a
    retriable error: one that is taking over or catching up on a loaded machine), for
    waits, whose own deadline bounds how long that may last."""
    try:
        return describe(cluster, topic, partition, exclude)
    except errors.ExactlyError as exc:
        if not exc.retriable:
            raise
        return None, ()


def wait_isr(cluster, topic: str, expected: set[str], exclude: tuple[str, ...] = (), timeout_s: float = 20.0):
    return wait_for(lambda: set(seen(cluster, topic, exclude=exclude)[1]) == expected, timeout_s,
                    f"ISR {sorted(expected)}")


def producer(cluster, **conf) -> Producer:
    base = {"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 5, "acks": "all",
            "enable.idempotence": True, "request.timeout.ms": 5000, "retry.backoff.max.ms": 500}
    base.update(conf)
    return Producer(base)


def read_all(cluster, topic: str, expected: int, timeout_s: float = 30.0, settle_s: float = 1.5,
             partition: int = 0) -> list:
    """Every record of `partition` (read_committed), polling until `expected` arrived
    and then `settle_s` more to catch any extra."""
    c = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "auto.offset.reset": "earliest",
                  "fetch.max.wait.ms": 100, "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        c.assign([TopicPartition(topic, partition)])
        out: list = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            out += c.poll(0.2)
        end = time.monotonic() + settle_s
        while time.monotonic() < end:
            out += c.poll(0.1)
        return out
    finally:
        c.close()


class Sender:
    """Sends numbered records from a thread and remembers which were acknowledged."""

    def __init__(self, p: Producer, topic: str, prefix: str):
        self.p, self.topic, self.prefix = p, topic, prefix
        self.acked: set[bytes] = set()
        self.failed: list[BaseException] = []
        self.sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _done(self, value: bytes, fut: concurrent.futures.Future) -> None:
        exc = fut.exception()
        with self._lock:
            if exc is None:
                self.acked.add(value)
            else:
                self.failed.append(exc)

    def send(self, n: int) -> None:
        for _ in range(n):
            value = f"{self.prefix}-{self.sent}".encode()
            self.sent += 1
            self.p.send(self.topic, value, partition=0).add_done_callback(
                lambda f, v=value: self._done(v, f))

    def start(self, every_s: float = 0.01) -> None:
        def loop():
            while not self._stop.is_set():
                self.send(1)
                time.sleep(every_s)
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def test_sigkill_of_the_leader_elects_a_new_leader_and_loses_nothing(rf3):
    topic = create_topic(rf3)
    leader, isr = describe(rf3, topic)
    assert len(isr) == 3
    p = producer(rf3)
    sender = Sender(p, topic, "a")
    try:
        sender.send(200)
        p.flush(30)
        assert len(sender.acked) == 200 and not sender.failed
        sender.start()
        time.sleep(0.5)
        killed_at = time.monotonic()
        rf3.kill(leader)
        new_leader = wait_for(lambda: (lambda st: st[0] if st[0] not in (None, leader) else None)(
            seen(rf3, topic, exclude=(leader,))), SESSION_MS / 1000 + 5, "a new leader")
        elected_after = time.monotonic() - killed_at
        acked_at_election = len(sender.acked)
        # The producer continues on the new leader.
        wait_for(lambda: len(sender.acked) >= acked_at_election + 100, 20, "acknowledgements from the new leader")
        sender.stop()
        p.flush(30)
    finally:
        sender.stop()
        p.close(10)
    assert new_leader in isr and elected_after < SESSION_MS / 1000 + 5
    assert not sender.failed, sender.failed[:3]
    assert len(sender.acked) == sender.sent
    got = [r.value for r in read_all(rf3, topic, len(sender.acked))]
    assert len(got) == len(set(got)), "duplicates"
    assert set(got) == sender.acked
    # Offsets stay in send order (idempotence kept the order across the failover).
    assert got == sorted(got, key=lambda v: int(v.split(b"-")[1]))


def _raw_produce(address: str, topic: str, value: bytes, pid: int, seq: int, acks: int = -1,
                 timeout_s: float = 30.0) -> grpc.Future:
    batch = records.encode_batch([(None, value, (), wall_clock_ms())], producer_id=pid, producer_epoch=0,
                                 base_sequence=seq)
    ch = grpc.insecure_channel(address)
    stub = pbg.PartitionLeaderStub(ch)
    req = pb.ProduceRequest(acks=acks, timeout_ms=int(timeout_s * 1000), topics=[pb.TopicProduceData(
        name=topic, partitions=[pb.PartitionProduceData(partition=0, records=batch)])])
    fut = stub.Produce.future(req, timeout=timeout_s + 5)
    fut.add_done_callback(lambda f: ch.close())
    return fut


def _error_of(fut: grpc.Future) -> int:
    try:
        return fut.result().topics[0].partitions[0].error_code
    except grpc.RpcError as exc:
        return {grpc.StatusCode.DEADLINE_EXCEEDED: ErrorCode.REQUEST_TIMED_OUT}.get(exc.code(),
                                                                                     ErrorCode.NETWORK_EXCEPTION)


def test_paused_leader_acknowledges_nothing_after_a_new_leader_was_elected(rf3):
    topic = create_topic(rf3)
    leader, isr = describe(rf3, topic)
    address = rf3.services[leader].address
    p = producer(rf3)
    sender = Sender(p, topic, "b")
    stopped = False
    try:
        sender.send(100)
        p.flush(30)
        assert len(sender.acked) == 100
        rf3.signal(leader, signal.SIGSTOP)
        stopped = True
        # Sent to the paused leader before anyone noticed: they wait in its socket.
        early = [_raw_produce(address, topic, f"zombie-early-{i}".encode(), 910_000 + i, 0, acks)
                 for i, acks in enumerate((-1, 1))]
        new_leader = wait_for(lambda: (lambda st: st[0] if st[0] not in (None, leader) else None)(
            seen(rf3, topic, exclude=(leader,))), SESSION_MS / 1000 + 5, "a new leader")
        # Writes go on at the new leader while the old one sleeps.
        sender.send(100)
        p.flush(40)
        assert len(sender.acked) == 200 and not sender.failed, sender.failed[:3]
        late = [_raw_produce(address, topic, f"zombie-late-{i}".encode(), 920_000 + i, 0, acks)
                for i, acks in enumerate((-1, 1))]
        rf3.signal(leader, signal.SIGCONT)
        stopped = False
        codes = [_error_of(f) for f in early + late]
        assert all(c != ErrorCode.NONE for c in codes), [ErrorCode(c).name for c in codes]
        # Once awake it knows it is a follower.
        after = wait_for(lambda: (lambda c: c if c == ErrorCode.NOT_LEADER_OR_FOLLOWER else None)(_error_of(
            _raw_produce(address, topic, b"zombie-after", 930_000, 0, 1, timeout_s=5))), 20,
            "NOT_LEADER_OR_FOLLOWER from the old leader")
        assert after == ErrorCode.NOT_LEADER_OR_FOLLOWER
        # It catches up as a follower and rejoins the ISR.
        wait_isr(rf3, topic, set(isr), timeout_s=30)
        sender.send(50)
        p.flush(30)
    finally:
        if stopped:
            rf3.signal(leader, signal.SIGCONT)
        p.close(10)
    assert new_leader != leader and len(sender.acked) == 250 and not sender.failed
    got = [r.value for r in read_all(rf3, topic, 250)]
    assert len(got) == len(set(got)), "duplicates"
    assert set(got) == sender.acked, sorted(set(got) ^ sender.acked)[:5]


def test_acks_all_with_one_in_sync_replica_left_is_refused_and_invisible(rf3):
    topic = create_topic(rf3)
    leader, isr = describe(rf3, topic)
    p = producer(rf3)
    try:
        for i in range(20):
            p.send(topic, f"c-{i}".encode(), partition=0)
        p.flush(30)
    finally:
        p.close(10)
    followers = [r for r in isr if r != leader]
    survivor = followers[0]
    for name in (leader, followers[1]):
        rf3.kill(name)
    wait_for(lambda: seen(rf3, topic, exclude=(leader, followers[1])) == (survivor, (survivor,)),
             SESSION_MS / 1000 + 10, "the survivor leading alone")
    address = rf3.services[survivor].address
    # Through the SDK: no retries, so the error surfaces.
    plain = Producer({"bootstrap.servers": address, "acks": "all", "enable.idempotence": False, "retries": 0,
                      "linger.ms": 0, "request.timeout.ms": 5000})
    try:
        with pytest.raises(errors.NotEnoughReplicasError):
            plain.send(topic, b"c-refused-sdk", partition=0).result(30)
    finally:
        plain.close(10)
    # On the wire.
    assert _error_of(_raw_produce(address, topic, b"c-refused-raw", 940_000, 0, -1)) == ErrorCode.NOT_ENOUGH_REPLICAS
    got = [r.value for r in read_all(rf3, topic, 20, settle_s=1.0)]
    assert got == [f"c-{i}".encode() for i in range(20)]
    # A replica back in the ISR makes acks=all work again; still nothing refused shows up.
    rf3.restart(followers[1])
    wait_isr(rf3, topic, {survivor, followers[1]}, exclude=(leader,), timeout_s=30)
    p = producer(rf3)
    try:
        p.send(topic, b"c-after", partition=0).result(30)
    finally:
        p.close(10)
    got = [r.value for r in read_all(rf3, topic, 21, settle_s=1.0)]
    assert got == [f"c-{i}".encode() for i in range(20)] + [b"c-after"]
