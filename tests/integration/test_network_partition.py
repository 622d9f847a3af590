"""Network partitions with real processes (tests/netfault.py): a service that keeps
running but loses ZooKeeper, its peers, or everything (docs/design.md, "Failure
model", "Replication", "Coordinator ownership"). Replication factor 3,
min.insync.replicas 2, ZooKeeper session timeout 4 s.

- A partition leader cut off from ZooKeeper, while clients and followers still reach
  it: a new leader is elected once its session expires; the old leader acknowledges
  nothing after that (every write sent to it fails, whatever its acks); nothing
  acknowledged is lost or duplicated; healed, it rejoins as a follower and its log
  ends up byte for byte the new leader's.
- A partition leader cut off from its peers (it keeps ZooKeeper and its clients): it
  drops the unreachable followers from the ISR and refuses acks=all
  (NOT_ENOUGH_REPLICAS) instead of acknowledging alone; healed, the followers catch up
  and an idempotent producer's records are all there once.
- A transaction coordinator cut off from ZooKeeper (still reaching the partition
  leaders and its clients), or isolated from everything: the other coordinator takes
  its `__transaction_state` partitions over (coordinator epoch + 1, writer-epoch
  fence), transactions keep committing; the deposed one cannot hand out a producer
  epoch and resigns; healed, it takes its partitions back; every committed record is
  read once, no aborted one.
"""
from __future__ import annotations

import json
import pathlib
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field

import grpc
import pytest
from kazoo.client import KazooClient

import netfault
from exactly import AdminClient, Consumer, NewTopic, Producer, TopicPartition, errors
from exactly_wire.clock import wall_clock_ms
from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from netfault import network_faults  # noqa: F401 - fixture
from waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

E = ErrorCode
SESSION_MS = 4000
PROPS = {
    "zookeeper.session.timeout.ms": str(SESSION_MS),
    "replica.lag.time.max.ms": "3000",
    "min.insync.replicas": "2",
    "transaction.state.log.replication.factor": "3",
    "offsets.topic.replication.factor": "3",
}
TXN = 1  # FindCoordinator key type


@pytest.fixture
def rf3(make_cluster):
    return make_cluster(partition_leaders=3, txn_coordinators=1, group_coordinators=1, props=PROPS)


def create_topic(cluster, partitions: int = 1) -> str:
    topic = f"part-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(topic, partitions, replication_factor=3)], timeout=60)
    return topic


def describe(cluster, topic: str, exclude: tuple[str, ...] = ()) -> tuple[str | None, tuple[str, ...]]:
    """(leader id, ISR) of partition 0 as the partition leaders not in `exclude` see it."""
    servers = ",".join(s.address for n, s in cluster.services.items()
                       if s.role == "partition_leader" and n not in exclude)
    with AdminClient({"bootstrap.servers": servers, "request.timeout.ms": 3000}) as admin:
        p = admin.describe_topics([topic])[topic].partitions[0]
        return p.leader_id, tuple(p.isr)


def new_leader(cluster, topic: str, old: str):
    """The leader of partition 0 if it is not `old` (as the other replicas see it)."""
    leader, _ = describe(cluster, topic, exclude=(old,))
    return leader if leader not in (None, old) else None


def state_znode(cluster, topic: str) -> tuple[dict, int]:
    """(content, mtime in wall-clock ms) of partition 0's state znode."""
    zk = KazooClient(hosts=cluster.zookeeper)
    zk.start(timeout=15)
    try:
        data, stat = zk.get(f"/exactly/topics/{topic}/0/state")
        return json.loads(data), stat.mtime
    finally:
        zk.stop()
        zk.close()


def idempotent_producer(cluster) -> Producer:
    return Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 5, "acks": "all",
                     "enable.idempotence": True, "request.timeout.ms": 5000, "retry.backoff.max.ms": 500})


def log_ends(cluster, topic: str, partitions: int, isolation_level: str) -> dict[TopicPartition, int]:
    """Per partition, the end a consumer of `isolation_level` sees: the LSO under
    read_committed, the high watermark under read_uncommitted."""
    c = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "isolation.level": isolation_level,
                  "enable.auto.commit": False})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_end(tps)
        return {tp: c.position(tp, timeout=60) for tp in tps}
    finally:
        c.close()


def read_committed(cluster, topic: str, partitions: int = 1, timeout_s: float = 60.0) -> list[bytes]:
    """Every value of `topic` (read_committed) up to its end, once every transaction
    written so far is complete: EndTxn answers once the outcome is durable and the
    markers follow, so the last transactions of producers that just returned from
    commit_transaction() may still be waiting for theirs (LSO below the high
    watermark)."""
    ends = wait_for(lambda: (lambda lso, hw: lso == hw and lso)(
        log_ends(cluster, topic, partitions, "read_committed"), log_ends(cluster, topic, partitions, "read_uncommitted")),
        timeout_s, f"every transaction on {topic} to complete (LSO = high watermark)")
    c = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "isolation.level": "read_committed",
                  "enable.auto.commit": False, "fetch.max.wait.ms": 100})
    try:
        tps = list(ends)
        c.assign(tps)
        c.seek_to_beginning(tps)
        out: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        while any(c.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"reading {topic} did not reach its end"
            out += [r.value for r in c.poll(0.2)]
        return out
    finally:
        c.close()


def log_bytes(cluster, name: str, topic: str, partition: int = 0) -> bytes:
    """The record batches of a replica's log on disk, segment after segment."""
    d = pathlib.Path(cluster.dir) / name / "logs" / f"{topic}-{partition}"
    return b"".join(p.read_bytes() for p in sorted(d.glob("*.log")))


class Sender:
    """Sends numbered records with the SDK from a thread; remembers acknowledgements."""

    def __init__(self, p: Producer, topic: str, prefix: str):
        self.p, self.topic, self.prefix = p, topic, prefix
        self.acked: set[bytes] = set()
        self.failed: list[BaseException] = []
        self.sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _done(self, value: bytes, fut) -> None:
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
            self.p.send(self.topic, value, partition=0).add_done_callback(lambda f, v=value: self._done(v, f))

    def start(self, every_s: float = 0.01) -> None:
        self._stop.clear()

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
            self._thread = None


@dataclass
class RawWrite:
    value: bytes
    acks: int
    sent_at: float  # monotonic s
    done_at: float = 0.0  # monotonic s
    done_wall_ms: int = 0
    code: int = -1


class DirectWriter:
    """Writes straight to one partition leader over gRPC (no SDK, no re-routing),
    one record per request with its own producer id, acks alternating -1 and 1: what
    a client with stale metadata would send to a deposed leader."""

    def __init__(self, address: str, topic: str, prefix: str, first_pid: int):
        self.topic, self.prefix, self.next_pid = topic, prefix, first_pid
        self.channel = grpc.insecure_channel(address)
        self.stub = pbg.PartitionLeaderStub(self.channel)
        self.writes: list[RawWrite] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def send(self, acks: int, timeout_s: float = 5.0) -> grpc.Future:
        value = f"{self.prefix}-{len(self.writes)}".encode()
        batch = records.encode_batch([(None, value, (), wall_clock_ms())], producer_id=self.next_pid,
                                     producer_epoch=0, base_sequence=0)
        self.next_pid += 1
        w = RawWrite(value, acks, time.monotonic())
        with self._lock:
            self.writes.append(w)
        req = pb.ProduceRequest(acks=acks, timeout_ms=int(timeout_s * 1000), topics=[pb.TopicProduceData(
            name=self.topic, partitions=[pb.PartitionProduceData(partition=0, records=batch)])])
        fut = self.stub.Produce.future(req, timeout=timeout_s + 5)

        def done(f: grpc.Future) -> None:
            try:
                code = f.result().topics[0].partitions[0].error_code
            except grpc.RpcError as exc:
                code = E.REQUEST_TIMED_OUT if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED \
                    else E.NETWORK_EXCEPTION
            w.done_wall_ms, w.done_at, w.code = wall_clock_ms(), time.monotonic(), code
        fut.add_done_callback(done)
        return fut

    def answer(self, acks: int, timeout_s: float = 5.0) -> int:
        """Send one write and wait for its error code."""
        fut = self.send(acks, timeout_s)
        try:
            fut.result()
        except grpc.RpcError:
            pass
        w = self.writes[-1]
        wait_for(lambda: w.code != -1, 5, "the answer to be recorded", interval_s=0.01)
        return w.code

    def start(self, every_s: float = 0.05) -> None:
        def loop():
            n = 0
            while not self._stop.is_set():
                self.send(-1 if n % 2 == 0 else 1)
                n += 1
                time.sleep(every_s)
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def settle(self, timeout_s: float = 20.0) -> None:
        wait_for(lambda: all(w.code != -1 for w in self.writes), timeout_s, "answers to every direct write")

    def close(self) -> None:
        self.stop()
        self.channel.close()


def test_leader_cut_off_from_zookeeper_acknowledges_nothing_after_a_new_leader_was_elected(rf3, network_faults):
    topic = create_topic(rf3)
    leader, isr = describe(rf3, topic)
    assert len(isr) == 3
    p = idempotent_producer(rf3)
    sender = Sender(p, topic, "a")
    direct = DirectWriter(rf3.services[leader].address, topic, "direct", 960_000)
    try:
        sender.send(100)
        p.flush(30)
        assert len(sender.acked) == 100 and not sender.failed
        sender.start()
        with network_faults.cut(rf3, leader, network_faults.ZOOKEEPER) as fault:
            direct.start()
            elected = wait_for(lambda: new_leader(rf3, topic, leader), SESSION_MS / 1000 + 5, "a new leader")
            elected_at = time.monotonic()
            state, election_ms = state_znode(rf3, topic)
            acked_at_election = len(sender.acked)
            # Writes go on at the new leader while the old one is still cut off.
            wait_for(lambda: len(sender.acked) >= acked_at_election + 100, 30, "acknowledgements from the new leader")
            for acks in (-1, 1, 0):
                direct.send(acks)
            direct.stop()
            direct.settle()
            assert fault.active
        # Healed: its session is gone, so it learns it is a follower and catches up.
        wait_for(lambda: direct.answer(1) == E.NOT_LEADER_OR_FOLLOWER, 30, "NOT_LEADER_OR_FOLLOWER from the old leader", interval_s=0.3)
        wait_for(lambda: set(describe(rf3, topic)[1]) == set(isr), 30, f"ISR {sorted(isr)}")
        sender.stop()
        sender.send(50)
        p.flush(30)
    finally:
        sender.stop()
        direct.close()
        p.close(10)

    assert elected != leader and elected in isr and state["leader"] == elected
    assert elected_at - fault.started < SESSION_MS / 1000 + 5
    # Nothing sent to the old leader after the election was acknowledged, whatever
    # the acks (acks=0 has no answer to check and is judged by the log below) ...
    after = [w for w in direct.writes if w.sent_at >= elected_at and w.acks != 0]
    assert after and all(w.code != E.NONE for w in after), \
        [(w.value, w.acks, ErrorCode(w.code).name) for w in after if w.code == E.NONE]
    # ... and what it acknowledged, it did before the election (in ZooKeeper's time).
    acked_direct = [w for w in direct.writes if w.code == E.NONE and w.acks != 0]
    last_ack = max((w.done_at for w in acked_direct), default=fault.started) - fault.started
    print(f"{elected} elected {elected_at - fault.started:.2f} s after the cut; {len(acked_direct)} of "
          f"{len(direct.writes)} direct writes acknowledged, the last {last_ack:.2f} s after the cut; {len(after)} "
          f"sent after the election: {sorted({ErrorCode(w.code).name for w in after})}")
    assert all(w.done_wall_ms < election_ms for w in acked_direct), \
        [(w.value, w.acks, w.done_wall_ms - election_ms) for w in acked_direct if w.done_wall_ms >= election_ms]
    assert not sender.failed, sender.failed[:3]
    assert len(sender.acked) == sender.sent
    # Every acknowledged acks=all record is read back once from the new leader; the
    # rest is only what was sent, at most once.
    got = read_committed(rf3, topic)
    assert len(got) == len(set(got)), "duplicates"
    must = sender.acked | {w.value for w in acked_direct if w.acks == -1}
    assert must <= set(got), sorted(must - set(got))[:5]
    sent_direct = {w.value for w in direct.writes}
    assert set(got) <= sender.acked | sent_direct, sorted(set(got) - sender.acked - sent_direct)[:5]
    late_values = {w.value for w in direct.writes if w.sent_at >= elected_at}
    assert not late_values & set(got), sorted(late_values & set(got))[:5]
    # The old leader's log converged to the new leader's, byte for byte.
    rf3.down()
    new_log = log_bytes(rf3, elected, topic)
    assert new_log and all(log_bytes(rf3, r, topic) == new_log for r in isr)


def test_leader_cut_off_from_its_peers_refuses_acks_all_and_loses_nothing(rf3, network_faults):
    topic = create_topic(rf3)
    leader, isr = describe(rf3, topic)
    p = idempotent_producer(rf3)
    sender = Sender(p, topic, "b")
    direct = DirectWriter(rf3.services[leader].address, topic, "direct", 970_000)
    try:
        sender.send(100)
        p.flush(30)
        assert len(sender.acked) == 100
        sender.start()
        with network_faults.cut(rf3, leader, network_faults.PEERS):
            # It keeps its ZooKeeper session, so it stays leader and shrinks the ISR to itself.
            wait_for(lambda: describe(rf3, topic) == (leader, (leader,)), 20, "the ISR to shrink to the leader", interval_s=0.25)
            # Alone in the ISR, below min.insync.replicas: acks=all is refused, on the wire ...
            code = direct.answer(-1)
            assert code == E.NOT_ENOUGH_REPLICAS, ErrorCode(code).name
            # ... and the SDK producer gets no acknowledgement while it lasts (it sends
            # on meanwhile).
            acked, sent = len(sender.acked), sender.sent
            wait_for(lambda: sender.sent >= sent + 100, 20, "more records sent")
            assert direct.answer(-1) == E.NOT_ENOUGH_REPLICAS
            assert len(sender.acked) == acked
        wait_for(lambda: set(describe(rf3, topic)[1]) == set(isr), 30, f"ISR {sorted(isr)}")
        wait_for(lambda: len(sender.acked) >= acked + 50, 30, "the producer to resume")
        sender.stop()
        p.flush(30)
    finally:
        sender.stop()
        direct.close()
        p.close(10)
    assert not sender.failed, sender.failed[:3]
    assert len(sender.acked) == sender.sent
    got = read_committed(rf3, topic)
    assert len(got) == len(set(got)), "duplicates"
    assert set(got) == sender.acked, sorted(set(got) ^ sender.acked)[:5]
    # The idempotent producer's retries kept the order.
    assert got == sorted(got, key=lambda v: int(v.split(b"-")[1]))
    rf3.down()
    logs = {r: log_bytes(rf3, r, topic) for r in isr}
    assert len(set(logs.values())) == 1, {r: len(b) for r, b in logs.items()}


# ---------------------------------------------------------------- coordinators

def find_coordinator(cluster, key: str) -> pb.FindCoordinatorResponse | None:
    """FindCoordinator(transactional id) answered by a partition leader; None on error."""
    for name, s in cluster.services.items():
        if s.role != "partition_leader":
            continue
        with grpc.insecure_channel(s.address) as ch:
            try:
                r = pbg.ClusterStub(ch).FindCoordinator(pb.FindCoordinatorRequest(key=key, key_type=TXN), timeout=5)
            except grpc.RpcError:
                continue
            return r if r.error_code == E.NONE else None
    return None


def txn_stub_call(cluster, name: str, method: str, request, timeout_s: float = 10.0):
    with grpc.insecure_channel(cluster.services[name].address) as ch:
        return getattr(pbg.TransactionCoordinatorStub(ch), method)(request, timeout=timeout_s)


def describe_txn(cluster, name: str, tid: str) -> int:
    """Error code of DescribeTransactions(tid) at coordinator `name` (NETWORK_EXCEPTION
    when it does not answer)."""
    try:
        r = txn_stub_call(cluster, name, "DescribeTransactions",
                          pb.DescribeTransactionsRequest(transactional_ids=[tid]), 3)
    except grpc.RpcError:
        return E.NETWORK_EXCEPTION
    return r.transaction_states[0].error_code


@dataclass
class TxnRunner:
    """A transactional SDK producer committing small transactions from a thread.
    Every transaction's values are recorded as committed (commit_transaction
    returned) or aborted (abort_transaction returned)."""

    cluster: object
    tid: str
    topic: str
    committed: list[bytes] = field(default_factory=list)
    aborted: list[bytes] = field(default_factory=list)
    commits: int = 0
    errors: list[BaseException] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"txn-{self.tid}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        p = Producer({"bootstrap.servers": self.cluster.bootstrap_servers, "transactional.id": self.tid,
                      "linger.ms": 5, "request.timeout.ms": 5000, "max.block.ms": 60000,
                      "transaction.timeout.ms": 60000})
        try:
            self._retry(lambda: p.init_transactions(60))
            n = 0
            while not self._stop.is_set():
                values = [f"{self.tid}-{n}-{i}".encode() for i in range(5)]
                n += 1
                p.begin_transaction()
                try:
                    for v in values:
                        p.send(self.topic, v, key=v)
                    self._retry(lambda: p.commit_transaction(60))
                except errors.ProducerFencedError:
                    raise
                except errors.ExactlyError:
                    self._retry(lambda: p.abort_transaction(60))
                    self.aborted += values
                    continue
                self.committed += values
                self.commits += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)
        finally:
            p.close(30)

    def _retry(self, fn, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return fn()
            except errors.KafkaTimeoutError:
                if time.monotonic() > deadline:
                    raise

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)


def stalled(cluster, runners: list[TxnRunner], marks: dict[str, int], what: str) -> str:
    """The failure message of a wait for commits: per producer its commits since the
    mark, its errors, its thread's stack, and its transaction as each coordinator sees it."""
    frames = sys._current_frames()
    lines = [what]
    for r in runners:
        lines.append(f"{r.tid}: {r.commits - marks[r.tid]} commits since the mark, errors {r.errors!r}")
        if r.commits < marks[r.tid] + 3 and r._thread is not None and r._thread.ident in frames:
            lines += ["    " + ln for ln in "".join(traceback.format_stack(frames[r._thread.ident])[-8:]).splitlines()]
            for name in ("txn-0", "txn-1"):
                try:
                    st = txn_stub_call(cluster, name, "DescribeTransactions",
                                       pb.DescribeTransactionsRequest(transactional_ids=[r.tid]), 3).transaction_states[0]
                    lines.append(f"    {name}: error {st.error_code} state {st.state} PID {st.producer_id} "
                                 f"epoch {st.producer_epoch} partitions {[(t.topic, list(t.partitions)) for t in st.topics]}")
                except grpc.RpcError as exc:
                    lines.append(f"    {name}: {exc.code()}")
    return "\n".join(lines)


def coordinator_epoch(cluster, partition: int) -> tuple[str, int]:
    zk = KazooClient(hosts=cluster.zookeeper)
    zk.start(timeout=15)
    try:
        data, _ = zk.get(f"/exactly/coordinators/txn/{partition}")
        d = json.loads(data)
        return d["owner"], int(d["coordinator_epoch"])
    finally:
        zk.stop()
        zk.close()


@pytest.mark.parametrize("mode", [netfault.ZOOKEEPER, netfault.ALL], ids=["cut-from-zookeeper", "isolated"])
def test_transaction_coordinator_cut_off_is_deposed_and_transactions_commit_exactly_once(make_cluster,
                                                                                        network_faults, mode):
    cluster = make_cluster(partition_leaders=3, txn_coordinators=2, group_coordinators=1, props=PROPS)
    topic = create_topic(cluster, partitions=3)
    # Two transactional ids per coordinator.
    by_owner: dict[str, list[tuple[str, pb.FindCoordinatorResponse]]] = {"txn-0": [], "txn-1": []}
    while min(len(v) for v in by_owner.values()) < 2:
        tid = f"tx-{uuid.uuid4().hex[:8]}"
        found = wait_for(lambda: find_coordinator(cluster, tid), 30, f"the coordinator of {tid}")
        if len(by_owner[found.node_id]) < 2:
            by_owner[found.node_id].append((tid, found))
    victim, survivor = "txn-0", "txn-1"
    victim_tids = [tid for tid, _ in by_owner[victim]]
    epochs_before = {f.partition: f.coordinator_epoch for _, f in by_owner[victim]}
    runners = [TxnRunner(cluster, tid, topic) for tids in by_owner.values() for tid, _ in tids]
    try:
        for r in runners:
            r.start()
        wait_for(lambda: all(r.commits >= 3 for r in runners), 60, "every producer committing")
        with network_faults.cut(cluster, victim, mode) as fault:
            wait_for(lambda: all(
                (lambda f: f is not None and f.node_id == survivor)(find_coordinator(cluster, t))
                for t in victim_tids), SESSION_MS / 1000 + 10, f"{survivor} to coordinate {victim}'s transactional ids")
            took = time.monotonic() - fault.started
            for partition, before in epochs_before.items():
                owner, epoch = coordinator_epoch(cluster, partition)
                assert owner == survivor and epoch > before
            # Transactions go on with the survivor while the victim is still cut off.
            marks = {r.tid: r.commits for r in runners}
            wait_for(lambda: all(r.commits >= marks[r.tid] + 3 for r in runners), 60,
                         lambda: stalled(cluster, runners, marks, "transactions to commit with the survivor"))
            if mode == netfault.ALL:
                assert describe_txn(cluster, victim, victim_tids[0]) == E.NETWORK_EXCEPTION  # unreachable
            if mode == netfault.ZOOKEEPER:
                # The survivor has loaded the partitions (fence appended) ...
                wait_for(lambda: all(
                    describe_txn(cluster, survivor, t) == E.NONE for t in victim_tids), 30, "the survivor serving")
                # ... so the deposed coordinator, still reachable, cannot hand out an epoch:
                # its write to __transaction_state is fenced by the partition leader.
                stale = txn_stub_call(cluster, victim, "InitProducerId", pb.InitProducerIdRequest(
                    transactional_id=victim_tids[0], transaction_timeout_ms=60000, producer_id=-1,
                    producer_epoch=-1))
                assert stale.error_code != E.NONE, stale
                # Fenced, it resigns that partition though ZooKeeper is still out of its reach.
                wait_for(lambda: describe_txn(cluster, victim, victim_tids[0]) ==
                           E.NOT_COORDINATOR, 30, f"{victim} to resign")
            assert fault.active
        # Healed: the victim registers again and takes its partitions back.
        wait_for(lambda: any(
            (lambda f: f is not None and f.node_id == victim)(find_coordinator(cluster, t)) for t in victim_tids), SESSION_MS / 1000 + 20, f"{victim} to coordinate again")
        marks = {r.tid: r.commits for r in runners}
        wait_for(lambda: all(r.commits >= marks[r.tid] + 3 for r in runners), 60,
                 lambda: stalled(cluster, runners, marks, "transactions to commit after the heal"))
    finally:
        for r in runners:
            r.stop()
    assert took < SESSION_MS / 1000 + 10
    assert not [e for r in runners for e in r.errors], [(r.tid, r.errors) for r in runners if r.errors]
    committed = [v for r in runners for v in r.committed]
    aborted = {v for r in runners for v in r.aborted}
    got = read_committed(cluster, topic, partitions=3)
    assert len(got) == len(set(got)), "duplicates"
    assert set(got) == set(committed), (sorted(set(committed) - set(got))[:5], sorted(set(got) - set(committed))[:5])
    assert not aborted & set(got)
