"""Kafka's delayed produce and delayed fetch in the domain, without gRPC: the
ReplicaManager's `append_records`, `write_markers` and `fetch_messages` over real
partitions, with a manual monotonic clock and a purgatory whose deadlines expire only
when the test says so (`expire_due`). Waiting is observed through the purgatory, never
by sleeping."""
from __future__ import annotations

import asyncio

import pytest

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from services.common.cluster.state import PartitionState, TopicInfo
from services.common.protocol import MARKER_LEADER_DEADLINE_MS, REQUEST_ARRIVAL_S
from services.partition_leader.purgatory import HIGH_WATERMARK, LAST_STABLE, LOG_END, Purgatory, Watch
from services.partition_leader.replica_manager import FetchEntry, MarkerEntry, ProduceEntry, ReplicaManager
from services.partition_leader.servicer import PartitionLeaderServicer

from .conftest import make_batch, append_records
from .test_replica_manager import FakeCluster
from .test_replication_servicer import FakeLeases
from services.partition_leader.replicas import HostedReplicas

TP = ("r", 0)


@pytest.fixture
def manager(tmp_path, store, clock, now):
    """Leader "me" of r-0 (replicas me, x; ISR both; min.insync.replicas 2)."""
    cluster = FakeCluster({"r": TopicInfo("r", {0: ["me", "x"]}, {"min.insync.replicas": "2"}, False,
                                          {0: PartitionState("me", 3, ("me", "x"), version=0)})})
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, cluster, store, clock, monotonic_s=now.now_s))
    m.hosted.purgatory = Purgatory(now.now_s, timers=False)
    m.hosted.refresh()
    yield m
    m.hosted.close()


async def parked(m: ReplicaManager, n: int = 1) -> None:
    """Let the event loop run until `n` requests wait in the purgatory."""
    for _ in range(200):
        if len(m.hosted.purgatory) >= n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{len(m.hosted.purgatory)} requests parked, expected {n}")


def follower_fetch(m: ReplicaManager, offset: int):
    return m.fetch_messages([FetchEntry("r", 0, offset, 1 << 20, 3)], replica_id="x")


def produce(m: ReplicaManager, batch: bytes, acks: int = -1, timeout_ms: int = 1000):
    return asyncio.ensure_future(append_records(m, acks, [ProduceEntry("r", 0, batch)], timeout_ms))


def test_acks_all_completes_when_the_high_watermark_passes_the_batch(manager):
    async def main():
        pending = produce(manager, make_batch(3))
        await parked(manager)
        assert not pending.done()
        [res] = await follower_fetch(manager, 0)  # the follower reads the batch
        assert res.error == ErrorCode.NONE and res.records and res.high_watermark == 0
        await parked(manager)
        assert not pending.done()
        await follower_fetch(manager, 3)  # its next fetch reports it has it: the HW moves
        [done] = await pending
        assert (done.error, done.base_offset) == (ErrorCode.NONE, 0)
        assert len(manager.hosted.purgatory) == 0
    asyncio.run(main())


def test_acks_all_after_the_isr_shrank_below_min_insync(manager):
    async def main():
        pending = produce(manager, make_batch(1))
        await parked(manager)
        p = manager.hosted.replicas[TP]
        p.set_isr(("me",), 1)  # the follower left the ISR: the HW passes the batch at once
        manager.hosted.purgatory.notify(TP)
        [res] = await pending
        assert (res.error, res.base_offset) == (ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, 0)
    asyncio.run(main())


def test_acks_all_when_leadership_moves_while_waiting(manager):
    async def main():
        pending = produce(manager, make_batch(1))
        await parked(manager)
        manager.hosted.replicas[TP].become_follower("x", 4, ("me", "x"))
        manager.hosted.purgatory.notify(TP)
        [res] = await pending
        assert res.error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    asyncio.run(main())


def test_acks_all_times_out_at_the_deadline(manager, now):
    async def main():
        pending = produce(manager, make_batch(1), timeout_ms=500)
        await parked(manager)
        now.advance(499)
        assert manager.hosted.purgatory.expire_due() == 0 and not pending.done()
        now.advance(1)
        assert manager.hosted.purgatory.expire_due() == 1
        [res] = await pending
        assert (res.error, res.base_offset) == (ErrorCode.REQUEST_TIMED_OUT, 0)
    asyncio.run(main())


def test_acks_one_answers_after_the_local_append(manager):
    async def main():
        [res] = await append_records(manager, 1, [ProduceEntry("r", 0, make_batch(2))])
        assert (res.error, res.base_offset) == (ErrorCode.NONE, 0)
        [bad] = await append_records(manager, 2, [ProduceEntry("r", 0, make_batch(2))])
        assert bad.error == ErrorCode.INVALID_REQUIRED_ACKS
    asyncio.run(main())


@pytest.mark.parametrize("confirmed", [False, True])
def test_a_leader_confirms_its_lease_before_appending(manager, confirmed):
    async def main():
        leases = FakeLeases(confirmed)
        manager.hosted.leases = leases
        p = manager.hosted.replicas[TP]
        p.set_isr(("me",), 1)
        p.lease_until = 0.0  # the lease ran out: leadership must be confirmed first
        [res] = await append_records(manager, 1, [ProduceEntry("r", 0, make_batch(2))])
        if confirmed:
            assert res.error == ErrorCode.NONE and p.log_end_offset == 2
        else:
            assert res.error == ErrorCode.NOT_LEADER_OR_FOLLOWER and p.log_end_offset == 0
        assert leases.calls >= 1
        # acks=0 never waits for a confirmation.
        leases.calls = 0
        await append_records(manager, 0, [ProduceEntry("r", 0, make_batch(1, pid=-1))])
        assert leases.calls == 0
    asyncio.run(main())


def test_markers_wait_like_acks_all(manager):
    async def main():
        await produce(manager, make_batch(1, pid=7, seq=0, txn=True), acks=1)
        pending = asyncio.ensure_future(manager.write_markers([MarkerEntry(7, 0, True, 0, (TP, ("r", 9)))]))
        await parked(manager)
        await follower_fetch(manager, 2)
        [[ok, unknown]] = await pending
        assert (ok.error, ok.offset) == (ErrorCode.NONE, 1)
        assert unknown.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    asyncio.run(main())


def test_a_marker_whose_deadline_passed_before_it_could_be_appended_is_dropped(manager, now):
    """The leadership lease is confirmed only after the request's deadline passed:
    the coordinator may have given up on the request and written the marker again,
    so the late marker is not appended (REQUEST_TIMED_OUT) and the producer's
    transaction stays open until a marker within its deadline ends it."""
    class LateLeases:
        async def ensure(self, p, deadline, vouched=None) -> bool:
            now.set_ms(deadline * 1000 + 1)
            return True

    async def main():
        p = manager.hosted.replicas[TP]
        await produce(manager, make_batch(1, pid=7, seq=0, txn=True), acks=1)
        manager.hosted.leases = LateLeases()
        p.lease_until = 0.0  # the lease ran out: leadership must be confirmed first
        [[late]] = await manager.write_markers([MarkerEntry(7, 0, True, 0, (TP,))])
        assert late.error == ErrorCode.REQUEST_TIMED_OUT
        assert p.log_end_offset == 1  # no marker appended
        manager.hosted.leases = None
        pending = asyncio.ensure_future(manager.write_markers([MarkerEntry(7, 0, True, 0, (TP,))]))
        await parked(manager)
        await follower_fetch(manager, 2)
        [[ok]] = await pending
        assert (ok.error, ok.offset) == (ErrorCode.NONE, 1)
    asyncio.run(main())


def test_a_markers_deadline_counts_from_the_requests_arrival(manager, now):
    """WriteTxnMarkers that arrived MARKER_LEADER_DEADLINE_MS ago and was held before
    its handler ran (a quota mute, in the interceptors): its deadline counts from the
    arrival the transport recorded (REQUEST_ARRIVAL_S), not from the handler's start,
    so the marker is not appended (REQUEST_TIMED_OUT); one that arrived within it is."""
    servicer = PartitionLeaderServicer(manager)
    request = pb.WriteTxnMarkersRequest(markers=[pb.WritableTxnMarker(
        producer_id=7, producer_epoch=0, committed=True, coordinator_epoch=0,
        topics=[pb.TopicPartitions(topic="r", partitions=[0])])])

    async def write_arrived(ago_s: float) -> int:
        token = REQUEST_ARRIVAL_S.set(now.now_s() - ago_s)
        try:
            resp = await servicer.WriteTxnMarkers(request, None)
        finally:
            REQUEST_ARRIVAL_S.reset(token)
        return resp.markers[0].topics[0].partitions[0].error_code

    async def main():
        p = manager.hosted.replicas[TP]
        await produce(manager, make_batch(1, pid=7, seq=0, txn=True), acks=1)
        late = asyncio.ensure_future(write_arrived(MARKER_LEADER_DEADLINE_MS / 1000 + 0.001))
        for _ in range(200):  # answered without waiting for anything
            if late.done():
                break
            await asyncio.sleep(0)
        if not late.done():
            late.cancel()
            raise AssertionError(f"the late marker was appended (log end {p.log_end_offset}) and waits for acks")
        assert late.result() == ErrorCode.REQUEST_TIMED_OUT
        assert p.log_end_offset == 1  # no marker appended
        pending = asyncio.ensure_future(write_arrived(MARKER_LEADER_DEADLINE_MS / 1000 - 1))
        await parked(manager)
        await follower_fetch(manager, 2)
        assert await pending == ErrorCode.NONE and p.log_end_offset == 2
    asyncio.run(main())


def test_fetch_long_polls_until_enough_bytes(manager, now):
    async def main():
        batch = make_batch(1)
        manager.hosted.replicas[TP].set_isr(("me",), 1)  # one replica: appends are committed at once
        waiting = asyncio.ensure_future(manager.fetch_messages(
            [FetchEntry("r", 0, 0)], max_wait_ms=5000, min_bytes=2 * len(batch)))
        await parked(manager)
        await append_records(manager, 1, [ProduceEntry("r", 0, batch)])
        await parked(manager)  # woken, one batch is not min_bytes: waiting again
        assert not waiting.done()
        await append_records(manager, 1, [ProduceEntry("r", 0, make_batch(1))])
        [res] = await waiting
        assert res.error == ErrorCode.NONE
        assert [h.base_offset for _, h in records.iter_batches(res.records)] == [0, 1]
    asyncio.run(main())


def test_fetch_answers_what_there_is_at_the_deadline(manager, now):
    async def main():
        manager.hosted.replicas[TP].set_isr(("me",), 1)
        waiting = asyncio.ensure_future(manager.fetch_messages([FetchEntry("r", 0, 0)], max_wait_ms=300))
        await parked(manager)
        now.advance(300)
        manager.hosted.purgatory.expire_due()
        [res] = await waiting
        assert (res.error, res.records, res.high_watermark) == (ErrorCode.NONE, b"", 0)
        # A failed partition answers at once, without waiting.
        [gone] = await manager.fetch_messages([FetchEntry("r", 5, 0)], max_wait_ms=300)
        assert gone.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and len(manager.hosted.purgatory) == 0
    asyncio.run(main())


class FakeVerifier:
    """The coordinator's answer for every verification, and the calls seen; `before`
    runs while the verification is in flight (e.g. a marker arriving)."""

    def __init__(self, answer=ErrorCode.NONE, before=None):
        self.answer, self.before, self.calls = answer, before, []

    async def verify(self, transactional_id, producer_id, producer_epoch, topic, partition, deadline, group_id=""):
        self.calls.append((transactional_id, producer_id, producer_epoch, topic, partition))
        if self.before is not None:
            self.before()
        return self.answer


def txn_produce(m, batch, tid="tx"):
    return append_records(m, 1, [ProduceEntry("r", 0, batch)], transactional_id=tid)


def test_a_transactional_batch_is_verified_before_it_starts_a_transaction(manager):
    async def main():
        manager.hosted.replicas[TP].set_isr(("me",), 1)
        manager.hosted.verifier = FakeVerifier()
        [ok] = await txn_produce(manager, make_batch(1, pid=9, seq=0, txn=True))
        assert ok.error == ErrorCode.NONE and manager.hosted.verifier.calls == [("tx", 9, 0, "r", 0)]
        [more] = await txn_produce(manager, make_batch(1, pid=9, seq=1, txn=True))  # same transaction
        assert more.error == ErrorCode.NONE and len(manager.hosted.verifier.calls) == 1
    asyncio.run(main())


@pytest.mark.parametrize("answer", [ErrorCode.INVALID_TXN_STATE, ErrorCode.INVALID_PRODUCER_EPOCH])
def test_a_batch_the_coordinator_does_not_confirm_is_refused(manager, answer):
    async def main():
        manager.hosted.replicas[TP].set_isr(("me",), 1)
        manager.hosted.verifier = FakeVerifier(answer)
        [res] = await txn_produce(manager, make_batch(1, pid=9, seq=0, txn=True))
        p = manager.hosted.replicas[TP]
        assert res.error == answer and p.log_end_offset == 0 and p.last_stable_offset == p.high_watermark
        [rogue] = await txn_produce(manager, make_batch(1, pid=987654, seq=0, txn=True), tid="")
        assert rogue.error == ErrorCode.INVALID_TXN_STATE and "without a transactional.id" in rogue.message
        assert len(manager.hosted.verifier.calls) == 1  # no transactional.id: no coordinator to ask
    asyncio.run(main())


def test_a_marker_during_verification_makes_the_append_fail(manager):
    """The verification succeeded, but the transaction it confirmed ended (a marker
    arrived) before the append: the batch would open a transaction nobody knows. Under
    transaction version 2 only a marker above the batch's epoch can end it (and the
    epoch refuses the batch); a version 1 marker at its epoch drops the guard."""
    async def main():
        p = manager.hosted.replicas[TP]  # ISR (me, x): markers have their min.insync.replicas
        manager.hosted.verifier = FakeVerifier(before=lambda: p.write_marker(9, 1, False, 0, 2))
        [res] = await txn_produce(manager, make_batch(1, pid=9, seq=0, txn=True))
        assert res.error == ErrorCode.INVALID_PRODUCER_EPOCH  # the marker moved the PID to epoch 1
        manager.hosted.verifier = FakeVerifier(before=lambda: p.write_marker(9, 1, False, 0, 1))
        [res] = await txn_produce(manager, make_batch(1, pid=9, epoch=1, seq=0, txn=True))
        assert res.error == ErrorCode.INVALID_TXN_STATE and not p.producers.ongoing
    asyncio.run(main())


def test_the_previous_transactions_marker_during_verification_leaves_the_append_verified(manager):
    """Transaction version 2: the previous transaction's marker (at the epoch its EndTxn
    bumped to, the batch's own) arriving while the batch's add waited at the coordinator
    ends an earlier transaction: the batch is appended after one verification."""
    async def main():
        p = manager.hosted.replicas[TP]
        manager.hosted.verifier = FakeVerifier(before=lambda: p.write_marker(9, 1, True, 0, 2))
        [res] = await txn_produce(manager, make_batch(1, pid=9, epoch=1, seq=0, txn=True))
        assert res.error == ErrorCode.NONE and list(p.producers.ongoing.values()) == [9]
        assert len(manager.hosted.verifier.calls) == 1
    asyncio.run(main())


# ------------------------------------------------------------ wake by partition and offset; limits

async def _settle(p: Purgatory, n: int) -> None:
    for _ in range(200):
        if len(p) >= n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{len(p)} parked, expected {n}")


def test_notify_wakes_only_the_watches_whose_offset_a_position_passes(now):
    async def main():
        p = Purgatory(now.now_s, timers=False)
        at3 = asyncio.ensure_future(p.wait([Watch(TP, HIGH_WATERMARK, 3)], now.now_s() + 10))
        at7 = asyncio.ensure_future(p.wait([Watch(TP, HIGH_WATERMARK, 7)], now.now_s() + 10))
        follower = asyncio.ensure_future(p.wait([Watch(TP, LOG_END, 3)], now.now_s() + 10))
        committed = asyncio.ensure_future(p.wait([Watch(TP, LAST_STABLE, 0)], now.now_s() + 10))
        elsewhere = asyncio.ensure_future(p.wait([Watch(("s", 0), HIGH_WATERMARK, 0)], now.now_s() + 10))
        await _settle(p, 5)
        p.notify(TP, {HIGH_WATERMARK: 3, LOG_END: 3, LAST_STABLE: 0})  # nothing passed
        await asyncio.sleep(0)
        assert not any(f.done() for f in (at3, at7, follower, committed, elsewhere))
        p.notify(TP, {HIGH_WATERMARK: 4, LOG_END: 3, LAST_STABLE: 0})
        assert await at3 is True
        assert not any(f.done() for f in (at7, follower, committed, elsewhere))
        p.notify(TP, {LOG_END: 9})
        assert await follower is True and not at7.done() and not committed.done()
        p.notify(TP)  # an ISR or leadership change: everything on the partition
        assert await at7 is True and await committed is True
        assert not elsewhere.done() and len(p) == 1
        now.advance(10_000)
        assert p.expire_due() == 1 and await elsewhere is False
        assert len(p) == 0 and not p._partitions
    asyncio.run(main())


def test_gone_waiters_do_not_pile_up_on_a_quiet_partition(now):
    async def main():
        p = Purgatory(now.now_s, timers=False)
        for round_ in range(20):
            waits = [asyncio.ensure_future(p.wait([Watch(TP, HIGH_WATERMARK, 5)], now.now_s() + 1)) for _ in range(50)]
            await _settle(p, 50)
            now.advance(1000)
            assert p.expire_due() == 50
            assert not any(await asyncio.gather(*waits))
            assert not p._partitions, round_  # every heap entry of a gone waiter dropped
        keep = asyncio.ensure_future(p.wait([Watch(TP, HIGH_WATERMARK, 5)], now.now_s() + 100))
        for _ in range(10):
            waits = [asyncio.ensure_future(p.wait([Watch(TP, HIGH_WATERMARK, 5)], now.now_s() + 1)) for _ in range(50)]
            await _settle(p, 51)
            now.advance(1000)
            p.expire_due()
            await asyncio.gather(*waits)
        assert sum(len(h) for h in p._partitions[TP].heaps.values()) <= 2 * 1 + 32 + 1
        p.notify(TP, {HIGH_WATERMARK: 6})
        assert await keep is True
    asyncio.run(main())


def test_parked_waits_per_owner_are_bounded(now):
    async def main():
        p = Purgatory(now.now_s, timers=False, max_parked_per_owner=2)
        first = [asyncio.ensure_future(p.wait([TP], now.now_s() + 10, owner="User:mallory")) for _ in range(2)]
        await _settle(p, 2)
        assert await p.wait([TP], now.now_s() + 10, owner="User:mallory") is False  # answered at once
        assert len(p) == 2 and p.parked("User:mallory") == 2
        other = asyncio.ensure_future(p.wait([TP], now.now_s() + 10, owner="User:alice"))
        unowned = asyncio.ensure_future(p.wait([TP], now.now_s() + 10))
        await _settle(p, 4)
        p.notify(TP)
        assert await asyncio.gather(*first, other, unowned) == [True] * 4
        assert p.parked("User:mallory") == 0
        again = asyncio.ensure_future(p.wait([TP], now.now_s() + 10, owner="User:mallory"))
        await _settle(p, 1)
        p.notify(TP)
        assert await again is True
    asyncio.run(main())


def test_a_consumer_fetch_is_not_woken_by_appends_below_its_offset(manager, now):
    """Kafka's DelayedFetch completes when the fetch can make progress; here an append
    that leaves the high watermark where it was (the follower has not fetched it) reads
    nothing again for the parked consumer, and the high watermark passing its offset
    wakes it once."""
    async def main():
        reads = []
        read_once = manager._read_once
        manager._read_once = lambda *a: reads.append(a) or read_once(*a)
        waiting = asyncio.ensure_future(manager.fetch_messages([FetchEntry("r", 0, 0)], max_wait_ms=5000))
        await parked(manager)
        assert len(reads) == 1
        for _ in range(3):
            await append_records(manager, 1, [ProduceEntry("r", 0, make_batch(1, pid=-1))])
        assert len(reads) == 1 and not waiting.done()  # the HW is still 0: not woken
        await follower_fetch(manager, 3)  # the follower has the batches: the HW moves to 3
        [res] = await waiting
        assert res.error == ErrorCode.NONE and res.records and res.high_watermark == 3
        assert len(reads) - 1 == 2  # the consumer's second read (plus the follower's own)
    asyncio.run(main())


def test_a_consumer_fetch_waits_at_most_fetch_max_wait_ms_and_per_owner_bound(manager, now):
    async def main():
        manager.hosted.fetch_max_wait_ms = 1000
        manager.hosted.purgatory.max_parked_per_owner = 1
        waiting = asyncio.ensure_future(manager.fetch_messages(
            [FetchEntry("r", 0, 0)], max_wait_ms=600000, owner="User:mallory"))
        await parked(manager)
        # The owner's second fetch is answered at once (empty), not parked.
        [second] = await manager.fetch_messages([FetchEntry("r", 0, 0)], max_wait_ms=600000, owner="User:mallory")
        assert second.error == ErrorCode.NONE and not second.records and len(manager.hosted.purgatory) == 1
        now.advance(999)
        assert manager.hosted.purgatory.expire_due() == 0
        now.advance(1)  # 600,000 ms asked, 1,000 ms granted
        assert manager.hosted.purgatory.expire_due() == 1
        [res] = await waiting
        assert res.error == ErrorCode.NONE and not res.records
    asyncio.run(main())


def test_a_fetch_short_of_min_bytes_waits_for_data_beyond_what_it_read(manager, now):
    """A consumer that read what was committed and wants more bytes is not woken by
    appends the high watermark has not passed yet (the follower has not fetched them),
    nor by a high-watermark move that brings fewer bytes than it waits for (min_bytes)."""
    async def main():
        await append_records(manager, 1, [ProduceEntry("r", 0, make_batch(1, pid=-1))])
        await follower_fetch(manager, 1)  # the HW moves to 1: one batch readable
        reads = []
        read_once = manager._read_once
        manager._read_once = lambda *a: reads.append(a) or read_once(*a)
        waiting = asyncio.ensure_future(manager.fetch_messages([FetchEntry("r", 0, 0)], max_wait_ms=5000,
                                                               min_bytes=1 << 20))
        await parked(manager)
        await append_records(manager, 1, [ProduceEntry("r", 0, make_batch(1, pid=-1))])
        assert len(reads) == 1 and not waiting.done()  # the HW is still 1: not woken
        await follower_fetch(manager, 2)  # the HW moves to 2: one small batch, far short of 1 MB
        for _ in range(200):
            await asyncio.sleep(0)
        await parked(manager)
        assert len(reads) == 2 and not waiting.done()  # the follower's read only: not woken
        now.advance(5000)
        manager.hosted.purgatory.expire_due()
        [res] = await waiting
        assert res.error == ErrorCode.NONE and res.records
    asyncio.run(main())


# ------------------------------------------------------------ who an append, a marker or a HW move wakes

@pytest.fixture
def two(tmp_path, store, clock, now):
    """Leader "me" of r-0 and r-1, in-sync alone (an append moves the high watermark
    at once), and of f-0 with followers x and y in sync."""
    cluster = FakeCluster({
        "r": TopicInfo("r", {0: ["me"], 1: ["me"]}, {}, False,
                       {0: PartitionState("me", 3, ("me",), version=0), 1: PartitionState("me", 3, ("me",), version=0)}),
        "f": TopicInfo("f", {0: ["me", "x", "y"]}, {}, False, {0: PartitionState("me", 3, ("me", "x", "y"), version=0)}),
    })
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, cluster, store, clock, monotonic_s=now.now_s))
    m.hosted.purgatory = Purgatory(now.now_s, timers=False)
    m.hosted.refresh()
    yield m
    m.hosted.close()


def count_reads(m: ReplicaManager) -> list[tuple]:
    """The partitions each `_read_once` of `m` reads, one tuple per call, in order."""
    reads: list[tuple] = []
    read_once = m._read_once
    m._read_once = lambda entries, *a: reads.append(tuple((e.topic, e.partition) for e in entries)) or \
        read_once(entries, *a)
    return reads


def consumer_fetch(m: ReplicaManager, tp, offset: int, isolation_level: int = 0):
    return asyncio.ensure_future(m.fetch_messages([FetchEntry(*tp, offset)], max_wait_ms=5000,
                                                  isolation_level=isolation_level))


async def append(m: ReplicaManager, tp, batch: bytes) -> None:
    [res] = await append_records(m, 1, [ProduceEntry(*tp, batch)])
    assert res.error == ErrorCode.NONE


async def settled(m: ReplicaManager) -> None:
    """Let every woken fetch run to its next park or its answer."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_an_append_wakes_no_fetch_of_another_partition(two):
    async def main():
        reads = count_reads(two)
        on_a, on_b = consumer_fetch(two, ("r", 0), 0), consumer_fetch(two, ("r", 1), 0)
        await parked(two, 2)
        await append(two, ("r", 0), make_batch(1))
        [res] = await on_a
        assert res.error == ErrorCode.NONE and res.records
        await settled(two)
        assert reads.count((("r", 1),)) == 1 and not on_b.done()  # read once, when it parked
        assert len(two.hosted.purgatory) == 1
        await append(two, ("r", 1), make_batch(1))
        [res] = await on_b
        assert res.error == ErrorCode.NONE and res.records
        assert two.fetch_wakeups == {("consumer", "completed"): 2}
    asyncio.run(main())


def test_a_read_committed_fetch_waits_for_the_last_stable_offset(two):
    """An open transaction's batch moves the high watermark but not the LSO: the
    read_uncommitted fetch wakes, the read_committed one is not even read again; the
    COMMIT marker moves the LSO and wakes it."""
    async def main():
        tp = ("r", 0)
        reads = count_reads(two)
        committed = consumer_fetch(two, tp, 0, isolation_level=1)
        uncommitted = consumer_fetch(two, tp, 0)
        await parked(two, 2)
        assert len(reads) == 2
        await append(two, tp, make_batch(2, pid=7, seq=0, txn=True))
        p = two.hosted.replicas[tp]
        assert (p.high_watermark, p.last_stable_offset) == (2, 0)
        [res] = await uncommitted
        assert res.records and res.high_watermark == 2
        await append(two, tp, make_batch(1))  # the HW moves again, the LSO stays behind the transaction
        await settled(two)
        assert len(reads) == 3 and not committed.done()  # only the read_uncommitted fetch's second read
        [[marker]] = await two.write_markers([MarkerEntry(7, 0, True, 0, (tp,))])
        assert marker.error == ErrorCode.NONE and p.last_stable_offset == 4
        [res] = await committed
        assert res.error == ErrorCode.NONE and res.last_stable_offset == 4
        assert [h.base_offset for _, h in records.iter_batches(res.records)] == [0, 2, 3]
        assert len(reads) == 4 and two.fetch_wakeups == {("consumer", "completed"): 2}
    asyncio.run(main())


def test_the_reads_an_append_causes_are_the_fetches_it_satisfies(two):
    """Forty fetches parked over two partitions and two isolation levels: an append
    behind an open transaction on r-0 reads again only the ten read_uncommitted fetches
    of r-0 (a purgatory keyed by partition alone would read twenty, an unkeyed one forty)."""
    async def main():
        a, b = ("r", 0), ("r", 1)
        await append(two, a, make_batch(1, pid=7, seq=0, txn=True))  # open: the LSO of r-0 stays at 0
        await append(two, b, make_batch(1))
        fetches = [consumer_fetch(two, a, 1) for _ in range(10)]
        blocked = [consumer_fetch(two, a, 0, isolation_level=1) for _ in range(10)]
        elsewhere = [consumer_fetch(two, b, 1) for _ in range(10)]
        elsewhere += [consumer_fetch(two, b, 1, isolation_level=1) for _ in range(10)]
        await parked(two, 40)
        reads = count_reads(two)
        await append(two, a, make_batch(1))
        done = await asyncio.gather(*fetches)
        await settled(two)
        assert len(reads) == 10 and all(r[0].records for r in done)
        assert not any(f.done() for f in blocked + elsewhere) and len(two.hosted.purgatory) == 30
        assert two.fetch_wakeups == {("consumer", "completed"): 10}
        for f in blocked + elsewhere:
            f.cancel()
        await asyncio.gather(*blocked, *elsewhere, return_exceptions=True)
    asyncio.run(main())


def test_a_high_watermark_move_does_not_wake_the_other_followers(two, now):
    """Follower y's fetch moves the high watermark: the consumer parked for it wakes,
    follower x's parked fetch is not read again (it would find nothing past its offset
    and park again); x wakes for the next append."""
    async def main():
        tp = ("f", 0)
        await append(two, tp, make_batch(1))
        for follower in ("x", "y"):
            [res] = await two.fetch_messages([FetchEntry(*tp, 0, 1 << 20, 3)], replica_id=follower)
            assert res.records
        consumer = consumer_fetch(two, tp, 0)
        x = asyncio.ensure_future(two.fetch_messages([FetchEntry(*tp, 1, 1 << 20, 3)], max_wait_ms=500,
                                                     replica_id="x"))
        await parked(two, 2)
        reads = count_reads(two)
        [y] = await two.fetch_messages([FetchEntry(*tp, 1, 1 << 20, 3)], replica_id="y")
        assert y.hw_changed and two.hosted.replicas[tp].high_watermark == 1
        [res] = await consumer
        assert res.records and res.high_watermark == 1
        await settled(two)
        assert len(reads) == 2 and not x.done()  # y's read and the consumer's, not x's
        await append(two, tp, make_batch(1))
        [res] = await x
        assert res.records and res.high_watermark == 1
        assert two.fetch_wakeups == {("consumer", "completed"): 1, ("follower", "completed"): 1}
    asyncio.run(main())


def test_fetch_wakeups_are_counted_by_outcome_and_exported(manager, now):
    """A fetch short of min_bytes is not woken by an append of fewer bytes; answered at
    its deadline it is counted expired; exactly_fetch_wakeups_total has every series."""
    from services.partition_leader.metrics import PartitionCollector

    async def main():
        manager.hosted.replicas[TP].set_isr(("me",), 1)
        waiting = asyncio.ensure_future(manager.fetch_messages([FetchEntry(*TP, 0)], max_wait_ms=1000,
                                                               min_bytes=1 << 20))
        await parked(manager)
        await append_records(manager, 1, [ProduceEntry(*TP, make_batch(1))])
        await settled(manager)
        await parked(manager)
        now.advance(1000)
        assert manager.hosted.purgatory.expire_due() == 1
        [res] = await waiting
        assert res.records
        assert manager.fetch_wakeups == {("consumer", "expired"): 1}
        [family] = [f for f in PartitionCollector(registry=None).families([manager])
                    if f.name == "exactly_fetch_wakeups"]
        samples = {(s.labels["fetcher_type"], s.labels["outcome"]): s.value for s in family.samples
                   if s.name == "exactly_fetch_wakeups_total"}
        assert samples == {(f, o): 1 if (f, o) in manager.fetch_wakeups else 0
                           for f in ("consumer", "follower") for o in ("completed", "parked_again", "expired")}
    asyncio.run(main())


@pytest.mark.parametrize("event", ["leadership moved", "log dir failed", "partition closed"])
def test_every_parked_fetch_of_a_partition_wakes_with_its_error(two, event):
    """A leadership change, a failed log directory or a closed replica wakes every
    fetch parked on the partition, consumers' at any offset and isolation level and
    followers', and each is answered with the error; the other partitions' stay
    (all of them stop on a failed log directory)."""
    expected = {"leadership moved": ErrorCode.NOT_LEADER_OR_FOLLOWER, "log dir failed": ErrorCode.KAFKA_STORAGE_ERROR,
                "partition closed": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}[event]

    async def main():
        tp = ("f", 0)
        await append(two, tp, make_batch(1, pid=7, seq=0, txn=True))  # open transaction: the LSO stays at 0
        for follower in ("x", "y"):
            await two.fetch_messages([FetchEntry(*tp, 1, 1 << 20, 3)], replica_id=follower)  # HW 1
        fetches = [consumer_fetch(two, tp, 1), consumer_fetch(two, tp, 0, isolation_level=1),
                   asyncio.ensure_future(two.fetch_messages([FetchEntry(*tp, 1, 1 << 20, 3)], max_wait_ms=500,
                                                            replica_id="x"))]
        other = consumer_fetch(two, ("r", 0), 0)
        await parked(two, 4)
        if event == "leadership moved":
            two.hosted.replicas[tp].become_follower("x", 4, ("me", "x", "y"))
            two.hosted.purgatory.notify(tp)  # as the service does for every partition refresh() changed
        elif event == "log dir failed":
            two.hosted.fail_log_dir(OSError(5, "Input/output error"))
        else:
            del two.hosted.cluster._topics["f"]
            _, closed = two.hosted.refresh()
            assert tp in closed
            for changed in closed:
                two.hosted.purgatory.notify(changed)
        answers = await asyncio.gather(*fetches)
        assert [res.error for [res] in answers] == [expected] * 3
        if event == "log dir failed":  # every partition of the directory stops serving
            [res] = await other
            assert res.error == ErrorCode.KAFKA_STORAGE_ERROR and len(two.hosted.purgatory) == 0
        else:
            await settled(two)
            assert not other.done() and len(two.hosted.purgatory) == 1
            other.cancel()
            await asyncio.gather(other, return_exceptions=True)
    asyncio.run(main())


# ------------------------------------------------------------ min_bytes: woken by bytes, answered from one read

def test_a_fetch_waits_for_its_min_bytes_not_for_every_append(two):
    """A consumer at the end of r-0 asking min_bytes of three batches is not woken (nor
    re-reads) by the first two appends; the third wakes it and it reads once."""
    async def main():
        size = len(make_batch(1))
        reads = count_reads(two)
        waiting = asyncio.ensure_future(two.fetch_messages([FetchEntry("r", 0, 0)], max_wait_ms=5000,
                                                            min_bytes=3 * size))
        await parked(two)
        for _ in range(2):
            await append(two, ("r", 0), make_batch(1))
            await settled(two)
        assert reads == [(("r", 0),)] and not waiting.done()
        await append(two, ("r", 0), make_batch(1))
        [res] = await waiting
        assert len(res.records) == 3 * size and reads == [(("r", 0),)] * 2
        assert two.fetch_wakeups == {("consumer", "completed"): 1}
    asyncio.run(main())


def test_a_fetch_of_two_partitions_wakes_for_its_share_and_waits_again_without_reading(two):
    """min_bytes of two batches over r-0 and r-1: the first batch (on r-0) is that
    partition's share, so it wakes the fetch, which sees one batch in all and parks
    again without reading (parked_again); the second (on r-1) completes it."""
    async def main():
        size = len(make_batch(1))
        reads = count_reads(two)
        waiting = asyncio.ensure_future(two.fetch_messages([FetchEntry("r", 0, 0), FetchEntry("r", 1, 0)],
                                                            max_wait_ms=5000, min_bytes=2 * size))
        await parked(two)
        await append(two, ("r", 0), make_batch(1))
        await settled(two)
        await parked(two)
        assert len(reads) == 1 and two.fetch_wakeups == {("consumer", "parked_again"): 1}
        await append(two, ("r", 1), make_batch(1))
        results = await waiting
        assert [len(r.records) for r in results] == [size, size] and len(reads) == 2
    asyncio.run(main())


def test_fetches_woken_at_one_offset_are_answered_from_one_read(two):
    """100 consumers parked at the end of r-0 (min_bytes 1) are all answered by one
    append, from one read of the log."""
    async def main():
        fetches = [consumer_fetch(two, ("r", 0), 0) for _ in range(100)]
        await parked(two, 100)
        before = two.consumer_reads
        await append(two, ("r", 0), make_batch(1))
        answers = await asyncio.gather(*fetches)
        assert {bytes(res.records) for [res] in answers} == {bytes(answers[0][0].records)} and answers[0][0].records
        assert two.consumer_reads - before == 1
    asyncio.run(main())


def test_a_topic_created_again_is_not_answered_from_the_deleted_ones_reads(two):
    """A topic deleted and created again under its name, whose log grows to the same
    offsets and sizes (the same inputs copied the same way), is read from its own log:
    a read_committed fetch does not get the deleted log's records or aborted
    transactions from the recent reads. Before, the key named the partition by its
    topic and number only, and a consumer of the new topic dropped a committed
    transaction of the producer id an aborted one of the old topic had."""
    tp = ("r", 0)

    async def incarnation(committed: bool, key: bytes) -> list:
        await append(two, tp, make_batch(3, pid=7, seq=0, txn=True, key=key))
        [[res]] = await two.write_markers([MarkerEntry(7, 0, committed, 0, (tp,))])
        assert res.error == ErrorCode.NONE
        [answer] = await two.fetch_messages([FetchEntry(*tp, 0)], isolation_level=1)
        assert answer.error == ErrorCode.NONE and answer.last_stable_offset == 4
        return answer

    def recreate() -> None:
        info = two.hosted.cluster._topics.pop("r")
        assert tp in two.hosted.refresh()[1]
        two.hosted.cluster._topics["r"] = info
        assert tp in two.hosted.refresh()[0]

    async def main():
        old = await incarnation(False, b"a")
        assert old.aborted == ((7, 0),)
        recreate()
        new = await incarnation(True, b"b")
        assert new.aborted == () and bytes(new.records) != bytes(old.records)
        assert [r.key for r in records.decode_records(new.records)] == [b"b"] * 3
    asyncio.run(main())
