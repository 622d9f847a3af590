"""The group coordinator as a real process (real ZooKeeper, partition leaders and
transaction coordinator), driven with raw gRPC stubs.

- Transactional offsets (KIP-98 design doc, "Consumer Coordinator"): invisible
  until the COMMIT marker the transaction coordinator writes to the group's
  __consumer_offsets partition after AddOffsetsToTxn + EndTxn, discarded on ABORT;
  KIP-447 require_stable answers UNSTABLE_OFFSET_COMMIT meanwhile.
- KIP-447 fencing: TxnOffsetCommit with a stale generation -> ILLEGAL_GENERATION.
- "Consumer Coordinator Startup": after SIGKILL + restart the coordinator replays
  __consumer_offsets (offsets, pending transactional offsets, group generations).
"""
from __future__ import annotations

import concurrent.futures
import uuid

import grpc
import pytest

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg

from waiting import wait_for

pytestmark = pytest.mark.integration

TOPIC = "orders"


def _uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _retry(call, ok, timeout_s: float = 30.0, what: str = ""):
    """Call until `ok(result)` and return the result; coordinators may still be
    electing or loading (a transport error counts as not ok)."""
    last: list = [None]

    def attempt():
        try:
            last[0] = call()
        except grpc.RpcError as exc:
            last[0] = exc
            return None
        return (last[0],) if ok(last[0]) else None
    return wait_for(attempt, timeout_s, lambda: f"{what or 'condition'} (last answer: {last[0]})")[0]


class Client:
    """Raw stubs against a dev cluster, finding coordinators like a client does."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.channels: dict[str, grpc.Channel] = {}

    def channel(self, address: str) -> grpc.Channel:
        if address not in self.channels:
            self.channels[address] = grpc.insecure_channel(address)
        return self.channels[address]

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()

    def find(self, key: str, key_type: int) -> str:
        admin = pbg.ClusterStub(self.channel(self.cluster.services["pl-0"].address))
        resp = _retry(lambda: admin.FindCoordinator(pb.FindCoordinatorRequest(key=key, key_type=key_type),
                                                    timeout=10),
                      lambda r: not isinstance(r, grpc.RpcError) and r.error_code == 0, what=f"coordinator of {key}")
        return f"{resp.host}:{resp.port}"

    def group(self, group_id: str) -> pbg.GroupCoordinatorStub:
        return pbg.GroupCoordinatorStub(self.channel(self.find(group_id, 0)))

    def txn(self, transactional_id: str) -> pbg.TransactionCoordinatorStub:
        return pbg.TransactionCoordinatorStub(self.channel(self.find(transactional_id, 1)))

    # ---------------------------------------------------------------- group calls

    def call_group(self, group_id: str, method: str, request, ok=lambda r: True, timeout_s=30.0):
        """Send to the group's coordinator, retrying coordinator moves and loading."""
        retriable = {ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                     ErrorCode.COORDINATOR_NOT_AVAILABLE}

        def once():
            return getattr(self.group(group_id), method)(request, timeout=30)

        def done(r):
            if isinstance(r, grpc.RpcError):
                return False
            codes = {r.error_code} if hasattr(r, "error_code") else \
                {p.error_code for t in r.topics for p in t.partitions}
            return not (codes & retriable) and ok(r)

        return _retry(once, done, timeout_s, what=f"{method} on {group_id}")

    def commit(self, group_id: str, offsets: dict[int, int], generation_id: int = -1, member_id: str = ""):
        resp = self.call_group(group_id, "OffsetCommit", pb.OffsetCommitRequest(
            group_id=group_id, generation_id=generation_id, member_id=member_id,
            topics=[_topic(offsets)]))
        return {p.partition: p.error_code for p in resp.topics[0].partitions}

    def fetch(self, group_id: str, partitions, require_stable: bool) -> tuple[int, dict[int, tuple[int, int]]]:
        resp = self.call_group(group_id, "OffsetFetch", pb.OffsetFetchRequest(
            group_id=group_id, require_stable=require_stable,
            topics=[pb.TopicPartitions(topic=TOPIC, partitions=list(partitions))]))
        return resp.error_code, {p.partition: (p.committed_offset, p.error_code)
                                 for t in resp.topics for p in t.partitions}

    def join(self, group_id: str, member_id: str = "", session_timeout_ms: int = 30000,
             rebalance_timeout_ms: int = 20000) -> pb.JoinGroupResponse:
        return self.call_group(group_id, "JoinGroup", pb.JoinGroupRequest(
            group_id=group_id, member_id=member_id, session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms, protocol_type="consumer", topics=[TOPIC]))

    # ---------------------------------------------------------------- transactions

    def init_producer(self, transactional_id: str) -> tuple[int, int]:
        resp = _retry(lambda: self.txn(transactional_id).InitProducerId(pb.InitProducerIdRequest(
            transactional_id=transactional_id, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1),
            timeout=30), lambda r: not isinstance(r, grpc.RpcError) and r.error_code == 0,
            what="InitProducerId")
        return resp.producer_id, resp.producer_epoch

    def add_offsets(self, transactional_id: str, pid: int, epoch: int, group_id: str) -> None:
        _retry(lambda: self.txn(transactional_id).AddOffsetsToTxn(pb.AddOffsetsToTxnRequest(
            transactional_id=transactional_id, producer_id=pid, producer_epoch=epoch, group_id=group_id),
            timeout=30), lambda r: not isinstance(r, grpc.RpcError) and r.error_code == 0, what="AddOffsetsToTxn")

    def txn_commit(self, transactional_id: str, group_id: str, pid: int, epoch: int, offsets: dict[int, int],
                   generation_id: int = -1, member_id: str = "") -> dict[int, int]:
        resp = self.call_group(group_id, "TxnOffsetCommit", pb.TxnOffsetCommitRequest(
            transactional_id=transactional_id, group_id=group_id, producer_id=pid, producer_epoch=epoch,
            generation_id=generation_id, member_id=member_id, topics=[_topic(offsets)]))
        return {p.partition: p.error_code for p in resp.topics[0].partitions}

    def end_txn(self, transactional_id: str, pid: int, epoch: int, committed: bool) -> None:
        _retry(lambda: self.txn(transactional_id).EndTxn(pb.EndTxnRequest(
            transactional_id=transactional_id, producer_id=pid, producer_epoch=epoch, committed=committed),
            timeout=30), lambda r: not isinstance(r, grpc.RpcError) and r.error_code == 0, what="EndTxn")


def _topic(offsets: dict[int, int]) -> pb.OffsetCommitTopic:
    return pb.OffsetCommitTopic(name=TOPIC, partitions=[
        pb.OffsetCommitPartition(partition=p, committed_offset=o, committed_leader_epoch=-1)
        for p, o in offsets.items()])


@pytest.fixture
def client(cluster):
    c = Client(cluster)
    yield c
    c.close()


def _wait_stable(client: Client, group_id: str, partitions, timeout_s: float = 30.0):
    return _retry(lambda: client.fetch(group_id, partitions, require_stable=True),
                  lambda r: r[0] == ErrorCode.NONE, timeout_s, what="stable offsets")


def test_transactional_offsets_visible_only_after_commit(client):
    group, tid = _uid("g"), _uid("tx")
    assert client.commit(group, {0: 3}) == {0: ErrorCode.NONE}
    pid, epoch = client.init_producer(tid)
    client.add_offsets(tid, pid, epoch, group)
    assert client.txn_commit(tid, group, pid, epoch, {0: 10, 1: 20}) == {0: ErrorCode.NONE, 1: ErrorCode.NONE}

    assert client.fetch(group, [0, 1], require_stable=False) == \
        (ErrorCode.NONE, {0: (3, ErrorCode.NONE), 1: (-1, ErrorCode.NONE)})
    top, parts = client.fetch(group, [0, 1], require_stable=True)
    assert top == ErrorCode.UNSTABLE_OFFSET_COMMIT
    assert parts == {0: (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT), 1: (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT)}

    client.end_txn(tid, pid, epoch, committed=True)
    assert _wait_stable(client, group, [0, 1]) == \
        (ErrorCode.NONE, {0: (10, ErrorCode.NONE), 1: (20, ErrorCode.NONE)})


def test_transactional_offsets_discarded_on_abort(client):
    group, tid = _uid("g"), _uid("tx")
    assert client.commit(group, {0: 3}) == {0: ErrorCode.NONE}
    pid, epoch = client.init_producer(tid)
    client.add_offsets(tid, pid, epoch, group)
    assert client.txn_commit(tid, group, pid, epoch, {0: 10}) == {0: ErrorCode.NONE}
    assert client.fetch(group, [0], require_stable=True)[0] == ErrorCode.UNSTABLE_OFFSET_COMMIT
    client.end_txn(tid, pid, epoch, committed=False)
    assert _wait_stable(client, group, [0]) == (ErrorCode.NONE, {0: (3, ErrorCode.NONE)})


def test_txn_offset_commit_with_stale_generation_is_fenced(client):
    group, tid = _uid("g"), _uid("tx")
    a = client.join(group)
    assert (a.error_code, a.generation_id) == (ErrorCode.NONE, 1)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        join_b = pool.submit(client.join, group)
        # b's join opens a rebalance: a hears it on its heartbeat and rejoins.
        _retry(lambda: client.call_group(group, "Heartbeat", pb.HeartbeatRequest(
            group_id=group, generation_id=1, member_id=a.member_id)),
            lambda r: r.error_code == ErrorCode.REBALANCE_IN_PROGRESS, what="rebalance")
        a2 = client.join(group, a.member_id)
        b = join_b.result(timeout=30)
    assert a2.generation_id == b.generation_id == 2

    pid, epoch = client.init_producer(tid)
    client.add_offsets(tid, pid, epoch, group)
    assert client.txn_commit(tid, group, pid, epoch, {0: 5}, generation_id=1, member_id=a.member_id) == \
        {0: ErrorCode.ILLEGAL_GENERATION}
    assert client.txn_commit(tid, group, pid, epoch, {0: 5}, generation_id=2, member_id="stranger") == \
        {0: ErrorCode.UNKNOWN_MEMBER_ID}
    assert client.txn_commit(tid, group, pid, epoch, {0: 6}, generation_id=2, member_id=a.member_id) == \
        {0: ErrorCode.NONE}
    client.end_txn(tid, pid, epoch, committed=True)
    assert _wait_stable(client, group, [0]) == (ErrorCode.NONE, {0: (6, ErrorCode.NONE)})


def test_offsets_and_groups_replayed_after_sigkill(cluster, client):
    group, tid = _uid("g"), _uid("tx")
    a = client.join(group)
    assert client.commit(group, {0: 7, 1: 8}, generation_id=a.generation_id, member_id=a.member_id) == \
        {0: ErrorCode.NONE, 1: ErrorCode.NONE}
    pid, epoch = client.init_producer(tid)
    client.add_offsets(tid, pid, epoch, group)
    assert client.txn_commit(tid, group, pid, epoch, {1: 80}) == {1: ErrorCode.NONE}

    cluster.kill("group-0")
    cluster.restart("group-0")

    # Committed offsets are back; the transactional one is still pending.
    assert client.fetch(group, [0, 1], require_stable=False) == \
        (ErrorCode.NONE, {0: (7, ErrorCode.NONE), 1: (8, ErrorCode.NONE)})
    assert client.fetch(group, [1], require_stable=True)[0] == ErrorCode.UNSTABLE_OFFSET_COMMIT
    client.end_txn(tid, pid, epoch, committed=True)
    assert _wait_stable(client, group, [0, 1]) == \
        (ErrorCode.NONE, {0: (7, ErrorCode.NONE), 1: (80, ErrorCode.NONE)})

    # The member survived the failover, and generations keep rising.
    hb = client.call_group(group, "Heartbeat", pb.HeartbeatRequest(
        group_id=group, generation_id=a.generation_id, member_id=a.member_id))
    assert hb.error_code == ErrorCode.NONE
    sync = client.call_group(group, "SyncGroup", pb.SyncGroupRequest(
        group_id=group, generation_id=a.generation_id, member_id=a.member_id))
    assert sync.error_code == ErrorCode.NONE
    assert client.call_group(group, "LeaveGroup", pb.LeaveGroupRequest(
        group_id=group, member_id=a.member_id)).error_code == ErrorCode.NONE
    c = client.join(group)
    assert c.error_code == ErrorCode.NONE and c.generation_id == a.generation_id + 2


def test_a_phantom_txn_offset_commit_is_refused(client):
    """KIP-890 part 1 on a real cluster: a TxnOffsetCommit without AddOffsetsToTxn, and
    one delayed past the end of its transaction, are refused; the group's offsets stay
    stable (no UNSTABLE_OFFSET_COMMIT forever, nothing committed by a later marker)."""
    group, tid = _uid("g"), _uid("tx")
    assert client.commit(group, {0: 3}) == {0: ErrorCode.NONE}
    pid, epoch = client.init_producer(tid)
    assert client.txn_commit(tid, group, pid, epoch, {0: 99}) == {0: ErrorCode.INVALID_TXN_STATE}
    assert client.fetch(group, [0], require_stable=True) == (ErrorCode.NONE, {0: (3, ErrorCode.NONE)})
    # A real transaction commits offset 10; a delayed TxnOffsetCommit of it arriving after
    # the commit (its epoch is now the old one) is refused, and the next COMMIT of the
    # producer cannot rewind the group to it.
    client.add_offsets(tid, pid, epoch, group)
    assert client.txn_commit(tid, group, pid, epoch, {0: 10}) == {0: ErrorCode.NONE}
    client.end_txn(tid, pid, epoch, committed=True)
    assert _wait_stable(client, group, [0]) == (ErrorCode.NONE, {0: (10, ErrorCode.NONE)})
    late = client.txn_commit(tid, group, pid, epoch, {0: 4})
    assert late[0] in (ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.INVALID_TXN_STATE)
    epoch += 1
    client.add_offsets(tid, pid, epoch, group)
    client.end_txn(tid, pid, epoch, committed=True)
    assert _wait_stable(client, group, [0]) == (ErrorCode.NONE, {0: (10, ErrorCode.NONE)})
