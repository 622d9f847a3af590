"""The write path's gate order (services/partition_leader/produce.py): the checks a
leader can make alone run before any transaction coordinator is asked, so a malformed
transactional batch is refused without its partition being added to (KIP-890 part 2)
or verified in (part 1) the producer's transaction."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest

from exactly_wire.error_codes import ErrorCode
from services.common.cluster.state import PartitionState, TopicInfo
from services.partition_leader.produce import ProduceContext
from services.partition_leader.replica_manager import ProduceEntry, ReplicaManager

from services.partition_leader.partition import ValidatedBatch
from services.partition_leader.produce import ProducePipeline
from services.partition_leader.replicas import HostedReplicas

from .conftest import append_records, make_batch, valid
from .test_replica_manager import FakeCluster

TP = ("r", 0)


class CountingVerifier:
    """A transaction coordinator that confirms everything and records each call."""

    def __init__(self):
        self.adds, self.verifies = [], []

    async def verify(self, transactional_id, producer_id, producer_epoch, topic, partition, deadline, group_id=""):
        self.verifies.append((transactional_id, producer_id, producer_epoch, topic, partition))
        return ErrorCode.NONE

    async def add(self, transactional_id, producer_id, producer_epoch, topic, partition, deadline):
        self.adds.append((transactional_id, producer_id, producer_epoch, topic, partition))
        return ErrorCode.NONE


def _leader_of_r(tmp_path, store, clock, partitions: int = 1, configs: dict | None = None) -> ReplicaManager:
    """The single-replica leader ("me") of partitions 0..`partitions`-1 of topic r."""
    cluster = FakeCluster({"r": TopicInfo("r", {p: ["me"] for p in range(partitions)}, configs or {}, False,
                                          {p: PartitionState("me", 1, ("me",), version=0)
                                           for p in range(partitions)})})
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, cluster, store, clock))
    m.hosted.refresh()
    return m


@pytest.fixture
def manager(tmp_path, store, clock):
    """Single-replica leader of r-0 whose batches may be at most 2000 bytes."""
    m = _leader_of_r(tmp_path, store, clock, configs={"max.message.bytes": "2000"})
    m.hosted.verifier = CountingVerifier()
    yield m
    m.hosted.close()


def _flip_last_byte(batch: bytes) -> bytes:
    return batch[:-1] + bytes([batch[-1] ^ 0xFF])


MALFORMED = {
    "bad CRC": (lambda: _flip_last_byte(make_batch(1, pid=9, seq=0, txn=True)), ErrorCode.CORRUPT_MESSAGE),
    "two batches": (lambda: make_batch(1, pid=9, seq=0, txn=True) + make_batch(1, pid=9, seq=1, txn=True),
                    ErrorCode.INVALID_REQUEST),
    "epoch out of range": (lambda: make_batch(1, pid=9, epoch=-5, seq=0, txn=True), ErrorCode.INVALID_RECORD),
    "too large": (lambda: make_batch(1, pid=9, seq=0, txn=True, value_size=4000), ErrorCode.MESSAGE_TOO_LARGE),
}


@pytest.mark.parametrize("add_partitions", [True, False], ids=["implicit add", "verification"])
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_transactional_batch_never_reaches_the_coordinator(manager, case, add_partitions):
    make, expected = MALFORMED[case]

    async def main():
        [res] = await append_records(manager, 1, [ProduceEntry("r", 0, make())], transactional_id="tx",
                                     add_partitions=add_partitions)
        return res
    res = asyncio.run(main())
    assert res.error == expected, res
    verifier = manager.hosted.verifier
    assert verifier.adds == [] and verifier.verifies == []  # nothing added to the transaction
    p = manager.hosted.replicas[TP]
    assert p.log_end_offset == 0 and not p.producers.ongoing


def test_a_well_formed_transactional_batch_is_added_once_then_appended(manager):
    async def main():
        [res] = await append_records(manager, 1, [ProduceEntry("r", 0, make_batch(1, pid=9, seq=0, txn=True))],
                                     transactional_id="tx", add_partitions=True)
        return res
    assert asyncio.run(main()).error == ErrorCode.NONE
    assert manager.hosted.verifier.adds == [("tx", 9, 0, "r", 0)] and manager.hosted.verifier.verifies == []
    assert manager.hosted.replicas[TP].log_end_offset == 1


def test_the_produce_context_is_frozen():
    ctx = ProduceContext(acks=-1, deadline=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.acks = 1  # type: ignore[misc]


def test_every_gate_has_one_shape():
    """After `validate`, which makes the ProduceBatch, each gate takes the request's
    context and that batch and answers a refusal or nothing."""
    for gate in ("authorize", "check_size", "writer_claim", "verify"):
        code = getattr(ProducePipeline, gate).__code__
        assert code.co_varnames[:code.co_argcount] == ("self", "ctx", "b"), gate
        assert getattr(ProducePipeline, gate).__annotations__["return"] == "AppendResult | None", gate


def test_the_size_is_checked_once_by_the_write_path(manager):
    """The write path refuses a batch above max.message.bytes; Partition.append takes
    the validated batch as it is, with no second look at its size or shape."""
    big = make_batch(1, value_size=4000)
    [res] = asyncio.run(append_records(manager, 1, [ProduceEntry("r", 0, big)]))
    assert res.error == ErrorCode.MESSAGE_TOO_LARGE and manager.hosted.replicas[TP].log_end_offset == 0
    assert manager.hosted.replicas[TP].append(valid(big)).error == ErrorCode.NONE
    assert isinstance(ValidatedBatch.check(big), ValidatedBatch)


# ------------------------------------------------------------ TxnPartitionsAdded
def _first_batch(manager, seq: int):
    async def main():
        [res] = await append_records(manager, -1, [ProduceEntry("r", 0, make_batch(1, pid=9, seq=seq, txn=True))],
                                     transactional_id="tx")
        return res
    return asyncio.run(main())


def _marker(manager, coordinator_epoch: int = 2):
    from services.partition_leader.produce import MarkerEntry
    [[res]] = asyncio.run(manager.write_markers([MarkerEntry(9, 0, True, coordinator_epoch, (TP,), 1)]))
    assert res.error == ErrorCode.NONE, res
    return res


def test_a_noticed_add_verifies_the_first_batch_without_asking_until_the_pids_next_marker(manager):
    """The coordinator's notice, with the position this leader gave after the PID's last
    marker, stands as the verification of the next transaction's first batch: appended
    with no call. Once that transaction's marker is written, the notice is spent: the
    following transaction's first batch is asked about."""
    verifier, p = manager.hosted.verifier, manager.hosted.replicas[TP]
    marker = _marker(manager)
    assert manager.note_txn_partition_added("tx", 9, 0, 2, "r", 0, marker.leader_epoch, marker.offset + 1)
    assert _first_batch(manager, 0).error == ErrorCode.NONE and verifier.verifies == []
    marker = _marker(manager)
    assert _first_batch(manager, 1).error == ErrorCode.NONE and verifier.verifies == [("tx", 9, 0, "r", 0)]
    assert p.log_end_offset == 4


@pytest.mark.parametrize("case", ["another leader epoch", "beyond the log end", "an older coordinator epoch",
                                  "a negative offset", "another transactional.id", "not after a marker",
                                  "after a marker since superseded"])
def test_a_notice_that_cannot_be_trusted_is_not_noted_and_the_batch_is_asked_about(manager, case):
    """Each part of a notice is checked against the leader's own state; a position must
    name this log's latest marker of the PID (a position of a deleted topic of the same
    name, or one a later marker superseded, is not noted)."""
    verifier = manager.hosted.verifier
    marker = _marker(manager, coordinator_epoch=2)
    tid, epoch, offset, coordinator_epoch = "tx", marker.leader_epoch, marker.offset + 1, 2
    if case == "not after a marker":
        offset = marker.offset
    elif case == "after a marker since superseded":
        _marker(manager, coordinator_epoch=2)
    elif case == "another leader epoch":
        epoch += 1
    elif case == "beyond the log end":
        offset = 1000
    elif case == "an older coordinator epoch":
        coordinator_epoch = 1
    elif case == "a negative offset":
        offset = -1
    else:
        tid = "other"
    noted = manager.note_txn_partition_added(tid, 9, 0, coordinator_epoch, "r", 0, epoch, offset)
    assert noted is (case == "another transactional.id")  # noted under its own id, never used for "tx"
    assert _first_batch(manager, 0).error == ErrorCode.NONE and verifier.verifies == [("tx", 9, 0, "r", 0)]


def test_a_writer_claim_zookeeper_does_not_answer_refuses_the_batch_and_appends_nothing(tmp_path, store, clock):
    """The writer-claim gate reads the coordinator claim from ZooKeeper when it has none
    cached. A coordinator cut off from ZooKeeper must not wait for the connection to come
    back: the read waits at most a lease's length (here, without leases, 5 s) and the
    batch is refused NOT_LEADER_OR_FOLLOWER (the coordinator loads the partition again),
    nothing appended; a marker on the offsets topic, which checks the claim too, is
    refused the same way. Once ZooKeeper answers, both go in."""
    from kazoo.handlers.threading import KazooTimeoutError

    from exactly_wire.clock import wall_clock_ms
    from services.common.cluster.ownership import fence_batch
    from services.common.protocol import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
    from services.partition_leader.produce import MarkerEntry

    def internal(name):
        return TopicInfo(name, {0: ["me"]}, {}, True, {0: PartitionState("me", 1, ("me",), version=0)})
    cluster = FakeCluster({TRANSACTION_STATE_TOPIC: internal(TRANSACTION_STATE_TOPIC),
                           CONSUMER_OFFSETS_TOPIC: internal(CONSUMER_OFFSETS_TOPIC)})
    asked: list[float] = []

    def unanswered(topic, partition, timeout_s):
        asked.append(timeout_s)
        raise KazooTimeoutError()
    cluster.writer_claim = unanswered
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, cluster, store, clock))
    m.hosted.refresh()
    try:
        fence = ProduceEntry(TRANSACTION_STATE_TOPIC, 0, fence_batch(7, 0, wall_clock_ms()))
        res = asyncio.run(append_records(m, 1, [fence], timeout_ms=30_000, origin="coordinator"))[0]
        p, _ = m.hosted.get(TRANSACTION_STATE_TOPIC, 0)
        assert res.error == ErrorCode.NOT_LEADER_OR_FOLLOWER and "ZooKeeper" in res.message
        assert p.log_end_offset == 0 and asked == [5.0]
        # A marker on the offsets topic checks the claim too (it may not name the writer id).
        [[marker]] = asyncio.run(m.write_markers([MarkerEntry(9, 0, True, 0, ((CONSUMER_OFFSETS_TOPIC, 0),))]))
        offsets, _ = m.hosted.get(CONSUMER_OFFSETS_TOPIC, 0)
        assert marker.error == ErrorCode.NOT_LEADER_OR_FOLLOWER and offsets.log_end_offset == 0 and len(asked) == 2
        cluster.writer_claim = lambda topic, partition, timeout_s: (7, 0, -1)
        res = asyncio.run(append_records(m, 1, [fence], timeout_ms=30_000, origin="coordinator"))[0]
        assert res.error == ErrorCode.NONE and p.log_end_offset == 1
        [[marker]] = asyncio.run(m.write_markers([MarkerEntry(9, 0, True, 0, ((CONSUMER_OFFSETS_TOPIC, 0),))]))
        assert marker.error == ErrorCode.NONE and offsets.log_end_offset == 1
    finally:
        m.hosted.close()


class _WaitingVerifier(CountingVerifier):
    """Confirms a batch only once the test opens `gate`."""

    def __init__(self, gate: asyncio.Future):
        super().__init__()
        self.gate = gate

    async def add(self, transactional_id, producer_id, producer_epoch, topic, partition, deadline):
        await self.gate
        return await super().add(transactional_id, producer_id, producer_epoch, topic, partition, deadline)


def test_an_entry_that_waits_holds_back_only_its_own_answer(tmp_path, store, clock):
    """Partition 0's transactional batch waits for its add; partition 1's plain batch is
    appended meanwhile; the answers come back together, in the request's order."""
    m = _leader_of_r(tmp_path, store, clock, partitions=2)

    async def main():
        gate = asyncio.get_running_loop().create_future()
        m.hosted.verifier = _WaitingVerifier(gate)
        request = asyncio.ensure_future(append_records(
            m, 1, [ProduceEntry("r", 0, make_batch(1, pid=9, seq=0, txn=True)), ProduceEntry("r", 1, make_batch(2))],
            transactional_id="tx", add_partitions=True))
        for _ in range(3):
            await asyncio.sleep(0)
        appended_meanwhile = [m.hosted.replicas[("r", p)].log_end_offset for p in (0, 1)]
        assert not request.done()
        gate.set_result(None)
        results = await request
        return appended_meanwhile, results, m.hosted.replicas[("r", 0)].log_end_offset
    try:
        appended_meanwhile, results, end = asyncio.run(main())
    finally:
        m.hosted.close()
    assert appended_meanwhile == [0, 2]
    assert [r.error for r in results] == [ErrorCode.NONE, ErrorCode.NONE]
    assert end == 1
