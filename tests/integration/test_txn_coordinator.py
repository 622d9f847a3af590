"""The transaction coordinator as a real process (real ZooKeeper, real partition
leaders), driven with raw gRPC stubs and record batches: two-phase commit with
markers, roll-forward after a SIGKILL between PrepareCommit and CompleteCommit
(design doc "Transaction Coordinator Startup", "Discussion on Coordinator Failure
During Transaction Completion"), timeout abort with fencing ("Coordinator-side
Transaction Expiration"), PID uniqueness across restarts, request errors
("Transaction Coordinator Request Handling")."""
from __future__ import annotations

import time
import urllib.request
import uuid

import grpc
import pytest

from exactly import Producer
from exactly_wire.clock import wall_clock_ms
from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg

from waiting import wait_for

pytestmark = pytest.mark.integration

E = ErrorCode
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


class Client:
    """Raw stubs: the transaction coordinator txn-0, and partition leaders by metadata."""

    def __init__(self, cluster):
        self.cluster = cluster
        self._channels: dict[str, grpc.Channel] = {}
        self.tids: dict[int, str] = {}  # producer id -> transactional.id (from init)

    def channel(self, address: str) -> grpc.Channel:
        if address not in self._channels:
            self._channels[address] = grpc.insecure_channel(address)
        return self._channels[address]

    @property
    def txn(self) -> pbg.TransactionCoordinatorStub:
        return pbg.TransactionCoordinatorStub(self.channel(self.cluster.services["txn-0"].address))

    @property
    def admin(self) -> pbg.ClusterStub:
        """Cluster RPCs from a partition leader (up while the coordinator is killed)."""
        return pbg.ClusterStub(self.channel(self.cluster.services["pl-0"].address))

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()

    def create_topic(self, partitions: int = 2) -> str:
        name = f"txn-{uuid.uuid4().hex[:8]}"
        resp = self.admin.CreateTopics(pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=1)]), timeout=30)
        assert resp.topics[0].error_code == E.NONE, resp.topics[0].error_message
        return name

    def leader(self, topic: str, partition: int) -> pbg.PartitionLeaderStub:
        def once():
            md = self.admin.Metadata(pb.MetadataRequest(topics=[topic]), timeout=30)
            nodes = {n.node_id: n for n in md.nodes}
            for p in md.topics[0].partitions:
                if p.partition == partition and p.leader_id in nodes:
                    n = nodes[p.leader_id]
                    return pbg.PartitionLeaderStub(self.channel(f"{n.host}:{n.port}"))
            return None
        return wait_for(once, 30, f"a leader for {topic}-{partition}")

    def produce(self, topic: str, partition: int, data: bytes, transactional_id: str | None = None,
                add: bool = False) -> pb.PartitionProduceResponse:
        """Produce one batch; a transactional one carries the transactional.id its PID
        was initialised for unless `transactional_id` is given (the leader verifies it
        with the coordinator, KIP-890; with `add`, the leader adds the partition to the
        transaction itself, KIP-890 part 2)."""
        if transactional_id is None:
            transactional_id = self.tids.get(records.parse_header(data).producer_id, "")
        deadline = time.monotonic() + 30
        while True:
            resp = self.leader(topic, partition).Produce(pb.ProduceRequest(
                acks=-1, timeout_ms=5000, transactional_id=transactional_id, add_partitions_to_txn=add, topics=[
                pb.TopicProduceData(name=topic, partitions=[pb.PartitionProduceData(
                    partition=partition, records=data)])]), timeout=30)
            part = resp.topics[0].partitions[0]
            if part.error_code not in (E.UNKNOWN_TOPIC_OR_PARTITION, E.NOT_LEADER_OR_FOLLOWER) \
                    or time.monotonic() > deadline:
                return part
            time.sleep(0.1)

    def fetch(self, topic: str, partition: int, isolation_level: int) -> pb.FetchPartitionResponse:
        resp = self.leader(topic, partition).Fetch(pb.FetchRequest(
            max_wait_ms=0, isolation_level=isolation_level, topics=[pb.FetchTopic(topic=topic, partitions=[
                pb.FetchPartition(partition=partition, fetch_offset=0, partition_max_bytes=1 << 20,
                                  current_leader_epoch=-1)])]), timeout=30)
        return resp.responses[0].partitions[0]

    def data_values(self, topic: str, partition: int, isolation_level: int) -> list[bytes]:
        """Values of data records; read_committed drops aborted transactions the way the
        consumer does (design doc "Consumer": aborted-transaction list + ABORT markers)."""
        part = self.fetch(topic, partition, isolation_level)
        assert part.error_code == E.NONE
        pending = sorted((a.first_offset, a.producer_id) for a in part.aborted_transactions)
        aborting: set[int] = set()
        out = []
        for pos, h in records.iter_batches(part.records):
            while pending and pending[0][0] <= h.base_offset:
                aborting.add(pending.pop(0)[1])
            if h.is_control:
                aborting.discard(h.producer_id)
            elif not (isolation_level == READ_COMMITTED and h.is_transactional and h.producer_id in aborting):
                out += [r.value for r in records.decode_records(part.records, pos, h)]
        return out

    def markers(self, topic: str, partition: int) -> list[tuple[int, int, int, int]]:
        """(producer id, producer epoch, control type, coordinator epoch) of the markers."""
        part = self.fetch(topic, partition, READ_UNCOMMITTED)
        out = []
        for pos, h in records.iter_batches(part.records):
            if h.is_control:
                [rec] = records.decode_records(part.records, pos, h)
                ctype, cepoch = records.decode_control_record(rec)
                out.append((h.producer_id, h.producer_epoch, ctype, cepoch))
        return out

    # -------------------------------------------------------- coordinator calls, retried
    def call(self, method: str, request, retriable=(E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE,
                                                    E.NOT_COORDINATOR), timeout_s: float = 30.0):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                resp = getattr(self.txn, method)(request, timeout=10)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
                continue
            code = _code(resp)
            if code not in retriable or time.monotonic() > deadline:
                return resp
            time.sleep(0.05)

    def init(self, tid: str, timeout_ms: int = 60000) -> pb.InitProducerIdResponse:
        r = self._init(tid, timeout_ms)
        self.tids[r.producer_id] = tid
        return r

    def _init(self, tid: str, timeout_ms: int) -> pb.InitProducerIdResponse:
        return self.call("InitProducerId", pb.InitProducerIdRequest(
            transactional_id=tid, transaction_timeout_ms=timeout_ms, producer_id=-1, producer_epoch=-1),
            retriable=(E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR,
                       E.CONCURRENT_TRANSACTIONS))

    def add(self, tid: str, pid: int, epoch: int, topic: str, partitions: list[int]) -> set[int]:
        resp = self.call("AddPartitionsToTxn", pb.AddPartitionsToTxnRequest(
            transactional_id=tid, producer_id=pid, producer_epoch=epoch,
            topics=[pb.TopicPartitions(topic=topic, partitions=partitions)]),
            retriable=(E.COORDINATOR_LOAD_IN_PROGRESS, E.CONCURRENT_TRANSACTIONS, E.UNKNOWN_TOPIC_OR_PARTITION))
        return {p.error_code for t in resp.results for p in t.partitions}

    def end(self, tid: str, pid: int, epoch: int, committed: bool) -> int:
        return self.call("EndTxn", pb.EndTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                                                    committed=committed)).error_code

    def describe(self, tid: str) -> pb.TransactionDescription:
        return self.txn.DescribeTransactions(pb.DescribeTransactionsRequest(transactional_ids=[tid]),
                                             timeout=10).transaction_states[0]


def _code(resp) -> int:
    if hasattr(resp, "error_code"):
        return resp.error_code
    codes = {p.error_code for t in resp.results for p in t.partitions}
    return codes.pop() if len(codes) == 1 else E.NONE


def txn_batch(pid: int, epoch: int, values: list[str], seq: int = 0) -> bytes:
    now = wall_clock_ms()
    return records.encode_batch([(None, v.encode(), (), now) for v in values], producer_id=pid,
                                producer_epoch=epoch, base_sequence=seq, transactional=True)


@pytest.fixture
def client(cluster):
    c = Client(cluster)
    yield c
    c.close()


def test_commit_writes_markers_to_every_partition(client):
    topic = client.create_topic(partitions=3)
    tid = f"t-{uuid.uuid4().hex[:6]}"
    r = client.init(tid)
    assert r.error_code == E.NONE
    assert client.add(tid, r.producer_id, r.producer_epoch, topic, [0, 1, 2]) == {E.NONE}
    for p in range(3):
        assert client.produce(topic, p, txn_batch(r.producer_id, r.producer_epoch, [f"v{p}"])).error_code == E.NONE
    assert client.data_values(topic, 0, READ_COMMITTED) == []
    assert client.end(tid, r.producer_id, r.producer_epoch, True) == E.NONE
    for p in range(3):
        assert wait_for(lambda: client.data_values(topic, p, READ_COMMITTED), 30, "committed data") == \
            [f"v{p}".encode()]
        [(pid, epoch, ctype, _)] = client.markers(topic, p)
        # KIP-890 part 2: the transaction ends under the next epoch.
        assert (pid, epoch, ctype) == (r.producer_id, r.producer_epoch + 1, records.CONTROL_COMMIT)
    assert wait_for(lambda: client.describe(tid).state == "CompleteCommit", 30, "CompleteCommit")
    assert client.end(tid, r.producer_id, r.producer_epoch, True) == E.NONE  # retry of a completed commit
    assert client.end(tid, r.producer_id, r.producer_epoch, False) == E.INVALID_TXN_STATE


def test_sigkill_between_prepare_and_complete_rolls_forward(make_cluster):
    cluster = make_cluster(props={"exactly.test.pause.after.prepare.ms": "4000",
                                  "exactly.txn.end.completion.wait.ms": "0"})
    client = Client(cluster)
    try:
        topic = client.create_topic(partitions=2)
        tid = f"t-{uuid.uuid4().hex[:6]}"
        r = client.init(tid)
        pid, epoch = r.producer_id, r.producer_epoch
        assert client.add(tid, pid, epoch, topic, [0, 1]) == {E.NONE}
        for p in range(2):
            assert client.produce(topic, p, txn_batch(pid, epoch, [f"a{p}", f"b{p}"])).error_code == E.NONE
        assert client.end(tid, pid, epoch, True) == E.NONE  # PrepareCommit is in the log
        assert client.describe(tid).state == "PrepareCommit"
        cluster.kill("txn-0")  # within the pause: no marker written yet
        for p in range(2):
            assert client.markers(topic, p) == []
            assert client.data_values(topic, p, READ_COMMITTED) == []
        cluster.restart("txn-0")
        for p in range(2):
            assert wait_for(lambda: client.data_values(topic, p, READ_COMMITTED), 30, "roll-forward") == \
                [f"a{p}".encode(), f"b{p}".encode()]
            [(mpid, mepoch, ctype, cepoch)] = client.markers(topic, p)
            assert (mpid, mepoch, ctype) == (pid, epoch + 1, records.CONTROL_COMMIT) and cepoch >= 1
        assert wait_for(lambda: client.describe(tid).state == "CompleteCommit", 30, "CompleteCommit")
        # The producer's retried EndTxn after failover succeeds, and it goes on.
        assert client.end(tid, pid, epoch, True) == E.NONE
        assert client.add(tid, pid, epoch, topic, [0]) == {E.PRODUCER_FENCED}  # the epoch before the bump
        assert client.add(tid, pid, epoch + 1, topic, [0]) == {E.NONE}
    finally:
        client.close()


def test_transaction_timeout_aborts_and_fences(make_cluster):
    cluster = make_cluster(props={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "100"})
    client = Client(cluster)
    try:
        topic = client.create_topic(partitions=1)
        tid = f"t-{uuid.uuid4().hex[:6]}"
        r = client.init(tid, timeout_ms=1000)
        pid, epoch = r.producer_id, r.producer_epoch
        assert client.add(tid, pid, epoch, topic, [0]) == {E.NONE}
        assert client.produce(topic, 0, txn_batch(pid, epoch, ["zombie"])).error_code == E.NONE
        d = wait_for(lambda: (lambda d: d if d.state == "CompleteAbort" else None)(client.describe(tid)),
                     20, "timeout abort")
        assert (d.producer_id, d.producer_epoch) == (pid, epoch + 1)
        assert client.markers(topic, 0) == [(pid, epoch + 1, records.CONTROL_ABORT, client.markers(topic, 0)[0][3])]
        part = client.fetch(topic, 0, READ_COMMITTED)
        assert [a.producer_id for a in part.aborted_transactions] == [pid]
        assert client.data_values(topic, 0, READ_COMMITTED) == []
        # The zombie is fenced by the coordinator and by the partition leader.
        assert client.end(tid, pid, epoch, True) == E.PRODUCER_FENCED
        assert client.add(tid, pid, epoch, topic, [0]) == {E.PRODUCER_FENCED}
        assert client.produce(topic, 0, txn_batch(pid, epoch, ["late"], seq=1)).error_code in \
            (E.INVALID_PRODUCER_EPOCH, E.PRODUCER_FENCED)
        # A new instance gets a newer epoch and commits.
        r2 = client.init(tid, timeout_ms=60000)
        assert (r2.error_code, r2.producer_id, r2.producer_epoch) == (E.NONE, pid, epoch + 2)
        assert client.add(tid, pid, r2.producer_epoch, topic, [0]) == {E.NONE}
        assert client.produce(topic, 0, txn_batch(pid, r2.producer_epoch, ["fresh"])).error_code == E.NONE
        assert client.end(tid, pid, r2.producer_epoch, True) == E.NONE
        assert wait_for(lambda: client.data_values(topic, 0, READ_COMMITTED), 30, "committed data") == [b"fresh"]
    finally:
        client.close()


def test_init_with_ongoing_transaction_fences_previous_instance(client):
    topic = client.create_topic(partitions=1)
    tid = f"t-{uuid.uuid4().hex[:6]}"
    r = client.init(tid)
    assert client.add(tid, r.producer_id, r.producer_epoch, topic, [0]) == {E.NONE}
    assert client.produce(topic, 0, txn_batch(r.producer_id, r.producer_epoch, ["old"])).error_code == E.NONE
    first = client.txn.InitProducerId(pb.InitProducerIdRequest(
        transactional_id=tid, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1), timeout=10)
    assert first.error_code == E.CONCURRENT_TRANSACTIONS
    r2 = client.init(tid)  # retried until the abort completed
    assert (r2.error_code, r2.producer_id, r2.producer_epoch) == (E.NONE, r.producer_id, r.producer_epoch + 2)
    assert client.markers(topic, 0)[0][:3] == (r.producer_id, r.producer_epoch + 1, records.CONTROL_ABORT)
    assert client.end(tid, r.producer_id, r.producer_epoch, True) == E.PRODUCER_FENCED


def test_pid_never_reused_across_coordinator_restarts(cluster, client):
    def idempotent_pid() -> int:
        resp = client.call("InitProducerId", pb.InitProducerIdRequest(transactional_id="", producer_id=-1,
                                                                       producer_epoch=-1))
        assert resp.error_code == E.NONE and resp.producer_epoch == 0
        return resp.producer_id

    tid = f"t-{uuid.uuid4().hex[:6]}"
    seen = [idempotent_pid() for _ in range(5)]
    first = client.init(tid)
    seen.append(first.producer_id)
    for kill in (True, False):
        (cluster.kill if kill else cluster.stop)("txn-0")
        cluster.restart("txn-0")
        new = [idempotent_pid() for _ in range(5)]
        assert not set(new) & set(seen), (new, seen)
        assert min(new) > max(seen)
        seen += new
    again = client.init(tid)  # the mapping survives: same PID, next epochs
    assert (again.producer_id, again.producer_epoch) == (first.producer_id, first.producer_epoch + 1)


def test_request_errors_and_service_keeps_serving(make_cluster):
    cluster = make_cluster(partition_leaders=1, group_coordinators=0,
                           props={"transaction.max.timeout.ms": "5000"})
    client = Client(cluster)
    try:
        tid = f"t-{uuid.uuid4().hex[:6]}"
        assert client.init(tid, timeout_ms=5001).error_code == E.INVALID_TRANSACTION_TIMEOUT
        assert client.init(tid, timeout_ms=0).error_code == E.INVALID_TRANSACTION_TIMEOUT
        r = client.init(tid, timeout_ms=5000)
        assert r.error_code == E.NONE
        assert client.end(tid, r.producer_id, r.producer_epoch, True) == E.INVALID_TXN_STATE
        assert client.end(tid, r.producer_id, r.producer_epoch, False) == E.INVALID_TXN_STATE
        assert client.end(tid, r.producer_id + 1, r.producer_epoch, True) == E.INVALID_PRODUCER_ID_MAPPING
        assert client.end("never-initialised", 1, 0, True) == E.INVALID_PRODUCER_ID_MAPPING
        topic = client.create_topic(partitions=1)
        assert client.add(tid, r.producer_id, r.producer_epoch, "no-such-topic", [0]) == \
            {E.UNKNOWN_TOPIC_OR_PARTITION}
        # still serving
        assert client.add(tid, r.producer_id, r.producer_epoch, topic, [0]) == {E.NONE}
        assert client.end(tid, r.producer_id, r.producer_epoch, False) == E.NONE
        assert wait_for(lambda: client.describe(tid).state == "CompleteAbort", 30, "CompleteAbort")
        listing = client.txn.ListTransactions(pb.ListTransactionsRequest(), timeout=10)
        assert (listing.error_code, [t.transactional_id for t in listing.transaction_states]) == (E.NONE, [tid])
    finally:
        client.close()


def test_add_offsets_marks_the_groups_consumer_offsets_partition(client):
    topic = client.create_topic(partitions=1)
    tid = f"t-{uuid.uuid4().hex[:6]}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    r = client.init(tid)
    assert client.add(tid, r.producer_id, r.producer_epoch, topic, [0]) == {E.NONE}
    resp = client.call("AddOffsetsToTxn", pb.AddOffsetsToTxnRequest(
        transactional_id=tid, producer_id=r.producer_id, producer_epoch=r.producer_epoch, group_id=group))
    assert resp.error_code == E.NONE
    fc = client.admin.FindCoordinator(pb.FindCoordinatorRequest(key=group, key_type=0), timeout=10)
    offsets_tp = ("__consumer_offsets", fc.partition)
    d = client.describe(tid)
    assert offsets_tp in {(t.topic, p) for t in d.topics for p in t.partitions}
    assert client.end(tid, r.producer_id, r.producer_epoch, True) == E.NONE
    wait_for(lambda: any(m[:3] == (r.producer_id, r.producer_epoch + 1, records.CONTROL_COMMIT)
                         for m in client.markers(*offsets_tp)), 30, "marker on __consumer_offsets")


def test_late_duplicate_marker_and_late_batch_of_a_finished_transaction_are_fenced(client):
    """KIP-890 part 2 on a real cluster. T1 commits (its markers carry epoch e+1); T2
    runs at e+1 and writes its first batch; a delayed duplicate of T1's COMMIT marker
    then reaches the partition leader: refused, so T2's partial data is not committed.
    T2 aborts: none of its records is visible. A delayed retry of T2's batch (epoch
    e+1) after the abort (markers at e+2) is refused too."""
    topic = client.create_topic(partitions=1)
    tid = f"t-{uuid.uuid4().hex[:6]}"
    r = client.init(tid)
    pid, epoch = r.producer_id, r.producer_epoch
    assert client.add(tid, pid, epoch, topic, [0]) == {E.NONE}
    assert client.produce(topic, 0, txn_batch(pid, epoch, ["t1"])).error_code == E.NONE
    assert client.end(tid, pid, epoch, True) == E.NONE
    wait_for(lambda: client.describe(tid).state == "CompleteCommit", 30, "T1 to complete")
    [(_, t1_marker_epoch, _, coordinator_epoch)] = client.markers(topic, 0)
    assert t1_marker_epoch == epoch + 1

    epoch += 1  # T2
    assert client.add(tid, pid, epoch, topic, [0]) == {E.NONE}
    t2_batch = txn_batch(pid, epoch, ["t2-partial"])
    assert client.produce(topic, 0, t2_batch).error_code == E.NONE
    stale = client.leader(topic, 0).WriteTxnMarkers(pb.WriteTxnMarkersRequest(markers=[pb.WritableTxnMarker(
        producer_id=pid, producer_epoch=t1_marker_epoch, committed=True, coordinator_epoch=coordinator_epoch,
        transaction_version=2, topics=[pb.TopicPartitions(topic=topic, partitions=[0])])]), timeout=10)
    assert stale.markers[0].topics[0].partitions[0].error_code == E.INVALID_PRODUCER_EPOCH
    assert client.data_values(topic, 0, READ_COMMITTED) == [b"t1"]  # T2 still undecided
    assert client.end(tid, pid, epoch, False) == E.NONE
    wait_for(lambda: client.describe(tid).state == "CompleteAbort", 30, "T2 to abort")
    late = client.produce(topic, 0, t2_batch)  # the same batch, delayed in the network
    assert late.error_code in (E.INVALID_PRODUCER_EPOCH, E.PRODUCER_FENCED)
    assert wait_for(lambda: client.data_values(topic, 0, READ_COMMITTED) == [b"t1"] or None, 30,
                    "read_committed to show only T1") is True
    assert [m[:3] for m in client.markers(topic, 0)] == [(pid, epoch, records.CONTROL_COMMIT),
                                                         (pid, epoch + 1, records.CONTROL_ABORT)]


def test_implicit_adds_start_the_transaction_and_fence_a_late_batch(client):
    """KIP-890 part 2 on a real cluster: with add_partitions_to_txn the leader adds the
    partition to the producer's transaction itself (no AddPartitionsToTxn from the
    producer; the coordinator shows it Ongoing with the partition), and the commit
    makes the batch visible. A delayed batch of that finished transaction (the old
    epoch) sent with the same flag is not added to anything: refused as fenced, the
    log and the LSO unchanged. A batch for a transactional.id whose PID is someone
    else's is refused, and a batch under the new epoch starts the next transaction."""
    topic = client.create_topic(partitions=2)
    tid = f"t-{uuid.uuid4().hex[:6]}"
    r = client.init(tid)
    pid, epoch = r.producer_id, r.producer_epoch
    first = txn_batch(pid, epoch, ["t1-a"])
    assert client.produce(topic, 0, first, add=True).error_code == E.NONE
    assert client.produce(topic, 1, txn_batch(pid, epoch, ["t1-b"]), add=True).error_code == E.NONE
    d = client.describe(tid)
    assert d.state == "Ongoing" and {(t.topic, p) for t in d.topics for p in t.partitions} == \
        {(topic, 0), (topic, 1)}
    assert client.end(tid, pid, epoch, True) == E.NONE
    assert wait_for(lambda: client.data_values(topic, 0, READ_COMMITTED), 30, "the commit") == [b"t1-a"]
    wait_for(lambda: client.describe(tid).state == "CompleteCommit", 30, "T1 to complete")
    hw = client.fetch(topic, 0, READ_UNCOMMITTED).high_watermark
    late = client.produce(topic, 0, first, add=True)
    assert late.error_code in (E.INVALID_PRODUCER_EPOCH, E.PRODUCER_FENCED), late
    other = client.init(f"t-{uuid.uuid4().hex[:6]}")
    forged = client.produce(topic, 0, txn_batch(other.producer_id, other.producer_epoch, ["forged"]),
                            transactional_id=tid, add=True)
    assert forged.error_code == E.INVALID_TXN_STATE, forged
    part = client.fetch(topic, 0, READ_COMMITTED)
    assert part.high_watermark == hw and part.last_stable_offset == hw
    assert client.describe(tid).state == "CompleteCommit"
    assert client.produce(topic, 0, txn_batch(pid, epoch + 1, ["t2"]), add=True).error_code == E.NONE
    assert client.describe(tid).state == "Ongoing"
    assert client.end(tid, pid, epoch + 1, True) == E.NONE
    assert wait_for(lambda: client.data_values(topic, 0, READ_COMMITTED) == [b"t1-a", b"t2"] or None, 30,
                    "T2 committed") is True


def _answered(cluster, service: str, method: str) -> float:
    """`method` calls `service` answered (its RPC metrics: calls carried on the tunnel
    are counted as direct ones)."""
    name = "exactly_rpc_request_duration_seconds_count{"
    with urllib.request.urlopen(f"http://{cluster.services[service].metrics_address}/metrics", timeout=30) as r:
        lines = r.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith(name) and f'method="{method}"' in line)


def _adds_answered(cluster) -> float:
    """AddPartitionsToTxn calls the transaction coordinator answered (the leaders'
    implicit adds and verifications come over the tunnel, counted the same)."""
    return _answered(cluster, "txn-0", "AddPartitionsToTxn")


def test_back_to_back_transactions_are_completed_by_the_next_ones_record(make_cluster):
    """exactly.txn.handover.wait.ms: the completion of a producer committing back to
    back waits, once its markers are written, for that producer's next transaction,
    whose Ongoing record then also completes it. 40 SDK transactions take 2 transaction-
    log appends each (Ongoing, PrepareCommit; a Complete record of their own only for
    the first, which nothing marked back to back yet, and the last, after the wait),
    where 3 each are written without the wait; every record is committed, and the
    last transaction completes once the wait ends without a next one."""
    cluster = make_cluster(partition_leaders=1, props={"exactly.txn.handover.wait.ms": "500"})
    client = Client(cluster)
    topic = client.create_topic(partitions=1)
    tid = f"t-{uuid.uuid4().hex[:6]}"
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": tid, "linger.ms": 0})
    try:
        producer.init_transactions()
        before = _answered(cluster, "pl-0", "CoordinatorProduce")
        for i in range(40):
            producer.begin_transaction()
            producer.send(topic, value=f"v{i}".encode(), partition=0)
            producer.commit_transaction()
        appends = _answered(cluster, "pl-0", "CoordinatorProduce") - before
        assert wait_for(lambda: client.describe(tid).state == "CompleteCommit" or None, 30,
                        "the last transaction to complete after the wait") is True
        assert wait_for(lambda: len(client.data_values(topic, 0, READ_COMMITTED)) == 40 or None, 30,
                        "the 40 records committed") is True
    finally:
        producer.close()
        client.close()
    assert appends <= 2 * 40 + 1, f"{appends} transaction-log appends for 40 transactions"


def test_back_to_back_transactions_add_each_partition_once(client, cluster):
    """KIP-890 part 2: an SDK producer committing 1-record transactions back to back.
    Each transaction's first batch is added to it by the leader while the previous
    transaction's marker (at the epoch its EndTxn bumped to, the batch's own) may reach
    the leader during that add; the marker ends an earlier transaction, so the batch is
    appended after one add (VerificationGuard): one AddPartitionsToTxn per transaction,
    and every transaction committed."""
    topic = client.create_topic(partitions=1)
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": f"t-{uuid.uuid4().hex[:6]}",
                         "linger.ms": 0})
    try:
        producer.init_transactions()
        before = _adds_answered(cluster)
        for i in range(60):
            producer.begin_transaction()
            producer.send(topic, value=f"v{i}".encode(), partition=0)
            producer.commit_transaction()
        adds = _adds_answered(cluster) - before
    finally:
        producer.close()
    assert adds == 60, f"{adds} AddPartitionsToTxn for 60 transactions"
    assert wait_for(lambda: len(client.data_values(topic, 0, READ_COMMITTED)) == 60 or None, 30,
                    "the 60 records committed") is True


def test_a_transactional_batch_no_coordinator_knows_is_refused(client):
    """KIP-890 part 1 on a real cluster: a raw transactional batch (PID 987654, epoch 0,
    sequence 0) without transactional.id, without InitProducerId or
    AddPartitionsToTxn, used to be appended and pin the LSO forever. It is refused with
    INVALID_TXN_STATE, the log is unchanged, and a later plain record is readable
    under read_committed (the LSO is the high watermark)."""
    topic = client.create_topic(partitions=1)
    rogue = txn_batch(987654, 0, ["rogue"])
    refused = client.produce(topic, 0, rogue, transactional_id="")
    assert (refused.error_code, refused.base_offset) == (E.INVALID_TXN_STATE, -1)
    # With a transactional.id whose transaction does not hold the partition: refused too.
    tid = f"t-{uuid.uuid4().hex[:6]}"
    r = client.init(tid)
    unknown = client.produce(topic, 0, txn_batch(r.producer_id, r.producer_epoch, ["not added"]))
    assert unknown.error_code == E.INVALID_TXN_STATE
    plain = records.encode_batch([(None, b"plain", (), wall_clock_ms())])
    assert client.produce(topic, 0, plain).error_code == E.NONE
    part = client.fetch(topic, 0, READ_COMMITTED)
    assert part.last_stable_offset == part.high_watermark == 1
    assert client.data_values(topic, 0, READ_COMMITTED) == [b"plain"]


def test_a_data_batch_with_a_higher_epoch_than_the_coordinator_issued_is_refused(client):
    topic = client.create_topic(partitions=1)
    tid = f"t-{uuid.uuid4().hex[:6]}"
    r = client.init(tid)
    assert client.add(tid, r.producer_id, r.producer_epoch, topic, [0]) == {E.NONE}
    forged = client.produce(topic, 0, txn_batch(r.producer_id, r.producer_epoch + 5, ["forged"]))
    assert forged.error_code == E.INVALID_PRODUCER_EPOCH
    assert client.produce(topic, 0, txn_batch(r.producer_id, r.producer_epoch, ["real"])).error_code == E.NONE
    assert client.end(tid, r.producer_id, r.producer_epoch, True) == E.NONE
    assert wait_for(lambda: client.data_values(topic, 0, READ_COMMITTED), 30, "the commit") == [b"real"]
    assert [m[:3] for m in client.markers(topic, 0)] == [(r.producer_id, r.producer_epoch + 1,
                                                         records.CONTROL_COMMIT)]
