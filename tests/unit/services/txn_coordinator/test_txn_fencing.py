"""Hand-off of a `__transaction_state` partition between two coordinators over one
in-memory log that fences writers like a partition leader does (an older producer
epoch of a PID -> INVALID_PRODUCER_EPOCH): the new owner's fence record, its replay
of everything the old owner got in, and the old owner's writes refused afterwards
(services.common.cluster.ownership; design doc "Transaction Coordinator Startup")."""
from __future__ import annotations

from txn_coordinator_fakes import FakeLog, Harness, run

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from services.common.cluster.ownership import fence_batch
from services.txn_coordinator import txn_log
from services.txn_coordinator.state import TxnState

E = ErrorCode
WRITER = 900  # writer PID of partition 0


class FencingLog(FakeLog):
    """Rejects a batch whose PID was already written with a higher epoch."""

    def __init__(self):
        super().__init__()
        self.epochs: dict[tuple[int, int], int] = {}

    async def append(self, partition: int, batch: bytes) -> int:
        h = records.parse_header(batch)
        if h.producer_id >= 0:
            key = (partition, h.producer_id)
            if h.producer_epoch < self.epochs.get(key, -1):
                return E.INVALID_PRODUCER_EPOCH
            self.epochs[key] = h.producer_epoch
        return await super().append(partition, batch)


class Owner(Harness):
    """A coordinator on the shared log that records its fencing callbacks."""

    def __init__(self, log: FencingLog, first_pid: int):
        self.fenced: list[tuple[int, int]] = []
        super().__init__(log=log, first_pid=first_pid, on_fenced=lambda p, e: self.fenced.append((p, e)))

    async def take(self, coordinator_epoch: int, writer_epoch: int) -> None:
        await self.coord.on_elected(0, coordinator_epoch, producer_id=WRITER, producer_epoch=writer_epoch)
        await self.coord.wait_loaded(0)


def test_new_owner_fences_then_replays_and_old_owner_is_refused():
    async def scenario():
        log = FencingLog()
        old, new = Owner(log, 0), Owner(log, 5000)
        await old.take(coordinator_epoch=0, writer_epoch=0)
        pid, epoch = await old.begin("t")
        # Every record of the owner carries its writer identity; the first is the fence.
        first = records.parse_header(log.batches[0][0])
        assert (first.producer_id, first.producer_epoch, first.base_sequence) == (WRITER, 0, records.NO_SEQUENCE)
        assert all(records.parse_header(b).producer_id == WRITER for b in log.batches[0])

        await new.take(coordinator_epoch=1, writer_epoch=1)
        assert new.md("t").state is TxnState.ONGOING  # replayed what the old owner wrote
        assert (new.md("t").producer_id, new.md("t").producer_epoch) == (pid, epoch)

        # The deposed owner still has the partition in its cache: its next write is refused,
        # it stops serving and reports it; nothing of it reaches the log.
        before = len(log.batches[0])
        assert (await old.coord.end_txn("t", pid, epoch, True)).error == E.NOT_COORDINATOR
        assert old.fenced == [(0, 0)]
        assert old.coord.owned_partitions() == {}
        assert (await old.coord.init_producer_id("t", 60000)).error == E.NOT_COORDINATOR
        assert len(log.batches[0]) == before

        # The new owner's state is intact and moves on.
        assert (await new.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        await new.settle()
        assert new.md("t").state is TxnState.COMPLETE_COMMIT
        assert [m.coordinator_epoch for m, _ in new.markers.written_for(pid)] == [1]
        assert new.fenced == []

    run(scenario())


def test_prepared_commit_of_the_old_owner_is_rolled_forward_by_the_new_one():
    async def scenario():
        log = FencingLog()
        old, new = Owner(log, 0), Owner(log, 5000)
        await old.take(0, 0)
        pid, epoch = await old.begin("t", partitions=(("orders", 0), ("payments", 1)))
        old.markers.errors = {("orders", 0): E.NOT_LEADER_OR_FOLLOWER}  # markers cannot finish
        assert (await old.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        assert old.md("t").state is TxnState.PREPARE_COMMIT

        await new.take(1, 1)
        await new.settle()
        assert new.md("t").state is TxnState.COMPLETE_COMMIT
        assert {tp for _, tp in new.markers.written_for(pid)} == {("orders", 0), ("payments", 1)}
        assert all(m.committed and m.coordinator_epoch == 1 for m, _ in new.markers.written_for(pid))
        # The old owner's completion stops at its next write; the retried EndTxn at the
        # new owner answers NONE (same result).
        await old.coord.on_resigned(0)
        assert (await new.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        assert (await new.coord.end_txn("t", pid, epoch, False)).error == E.INVALID_TXN_STATE

    run(scenario())


def test_owner_fenced_while_loading_gives_up_the_partition():
    async def scenario():
        log = FencingLog()
        newer = Owner(log, 0)
        await newer.take(2, 5)
        stale = Owner(log, 5000)
        await stale.coord.on_elected(0, 1, producer_id=WRITER, producer_epoch=4)
        await stale.settle()
        assert stale.fenced == [(0, 1)]
        assert stale.coord.owned_partitions() == {}
        assert (await newer.coord.init_producer_id("t", 60000)).error == E.NONE

    run(scenario())


def test_fence_records_are_skipped_when_reading_the_log():
    batch = bytearray(fence_batch(WRITER, 3, 1_700_000_000_000))
    entries, next_offset = txn_log.decode_fetched(bytes(batch))
    assert (entries, next_offset) == ([], 1)


def test_new_owner_resumes_the_timeout_of_an_ongoing_transaction():
    async def scenario():
        log = FencingLog()
        old, new = Owner(log, 0), Owner(log, 5000)
        await old.take(0, 0)
        pid, epoch = await old.begin("t", timeout_ms=1000)
        await old.coord.on_resigned(0)  # the old owner dies with the transaction open
        new.clock.set_ms(old.clock() + 500)
        await new.take(1, 1)
        assert await new.coord.scans.abort_timed_out_transactions() == 0  # not yet: 500 of 1000 ms
        new.clock.advance(600)
        assert await new.coord.scans.abort_timed_out_transactions() == 1
        await new.settle()
        md = new.md("t")
        assert (md.state, md.producer_id, md.producer_epoch) == (TxnState.COMPLETE_ABORT, pid, epoch + 1)
        [(marker, tp)] = new.markers.written_for(pid)
        assert (marker.committed, marker.producer_epoch, marker.coordinator_epoch, tp) == \
            (False, epoch + 1, 1, ("orders", 0))

    run(scenario())


def test_rotated_writer_pid_closes_the_retired_one():
    async def scenario():
        log = FencingLog()
        old, new = Owner(log, 0), Owner(log, 5000)
        await old.take(0, 32766)  # the last writer epoch of PID WRITER
        pid, epoch = await old.begin("t")
        await new.coord.on_elected(0, 1, producer_id=WRITER + 1, producer_epoch=0, retired_producer_id=WRITER)
        await new.coord.wait_loaded(0)
        assert new.md("t").state is TxnState.ONGOING
        assert (await old.coord.end_txn("t", pid, epoch, True)).error == E.NOT_COORDINATOR
        assert old.fenced == [(0, 0)]
        assert (await new.coord.end_txn("t", pid, epoch, True)).error == E.NONE

    run(scenario())


def test_marker_rejected_for_an_older_coordinator_epoch_deposes_the_owner():
    async def scenario():
        h = Owner(FencingLog(), 0)
        await h.take(3, 3)
        pid, epoch = await h.begin("t")
        h.markers.errors = {("orders", 0): E.TRANSACTION_COORDINATOR_FENCED}
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE  # PrepareCommit written
        await h.settle()
        assert h.fenced == [(0, 3)]
        assert h.coord.owned_partitions() == {}
        assert (await h.coord.init_producer_id("t", 60000)).error == E.NOT_COORDINATOR

    run(scenario())


def test_a_deposed_owner_does_not_confirm_a_commit_from_its_stale_cache():
    """The old owner committed the producer's previous transaction (CompleteCommit
    under the bumped epoch in its cache); the new owner took over and holds the
    producer's next transaction open under that same epoch. The producer's EndTxn
    reaching the old owner must not be answered from the cache (that answer was NONE:
    the producer took an open transaction for committed, and its next abort aborted it
    with the new owner): the barrier is refused, the old owner resigns, and the
    producer commits with the new owner."""
    async def scenario():
        log = FencingLog()
        old, new = Owner(log, 0), Owner(log, 5000)
        await old.take(0, 0)
        pid, epoch = await old.begin("t")
        ended = await old.coord.end_txn("t", pid, epoch, True)
        assert ended.error == E.NONE
        await old.settle()
        assert (old.md("t").state, old.md("t").producer_epoch) == (TxnState.COMPLETE_COMMIT, epoch + 1)

        await new.take(coordinator_epoch=1, writer_epoch=1)
        added = await new.coord.add_partitions_to_txn("t", pid, epoch + 1, [("orders", 0)])
        assert set(added.values()) == {E.NONE}

        before = len(log.batches[0])
        assert (await old.coord.end_txn("t", pid, epoch + 1, True)).error == E.NOT_COORDINATOR
        assert old.fenced == [(0, 0)]
        assert len(log.batches[0]) == before  # the refused barrier left nothing
        assert new.md("t").state is TxnState.ONGOING

        committed = await new.coord.end_txn("t", pid, epoch + 1, True)
        assert (committed.error, committed.producer_epoch) == (E.NONE, epoch + 2)
        await new.settle()
        assert new.md("t").state is TxnState.COMPLETE_COMMIT

    run(scenario())


def test_a_version_1_retry_is_answered_only_by_the_current_owner():
    """A Kafka client without the epoch bump retries EndTxn under its current epoch;
    the owner answers the retry from its cache after the barrier, a deposed one
    answers NOT_COORDINATOR. Without a transaction, the current owner answers
    INVALID_TXN_STATE."""
    async def scenario():
        log = FencingLog()
        old, new = Owner(log, 0), Owner(log, 5000)
        await old.take(0, 0)
        pid, epoch = await old.begin("t")
        assert (await old.coord.end_txn("t", pid, epoch, True, transaction_version=1)).error == E.NONE
        await old.settle()
        retry = await old.coord.end_txn("t", pid, epoch, True, transaction_version=1)
        assert (retry.error, retry.producer_epoch) == (E.NONE, epoch)
        assert (await old.coord.end_txn("t", pid, epoch, False, transaction_version=1)).error == \
            E.INVALID_TXN_STATE
        assert old.fenced == []

        await new.take(coordinator_epoch=1, writer_epoch=1)
        added = await new.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 0)])
        assert set(added.values()) == {E.NONE}
        assert (await old.coord.end_txn("t", pid, epoch, True, transaction_version=1)).error == \
            E.NOT_COORDINATOR
        assert old.fenced == [(0, 0)]
        assert new.md("t").state is TxnState.ONGOING

    run(scenario())
