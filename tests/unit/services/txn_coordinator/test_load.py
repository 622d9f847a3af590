"""Loading an owned partition (load.TxnLoader, partition.TxnPartition.replay): replay, roll
forward, retries, a corrupt log (design doc "Transaction Coordinator Startup")."""
from __future__ import annotations

import pytest

from txn_coordinator_fakes import write_record, FakeLog, Harness, run, txn_settings
from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from services.txn_coordinator import txn_log
from services.txn_coordinator.state import TxnState

S = TxnState
E = ErrorCode


@pytest.mark.parametrize("prepared,committed", [(S.PREPARE_COMMIT, True), (S.PREPARE_ABORT, False)])
def test_recovery_rolls_prepared_transaction_forward(prepared, committed):
    async def scenario():
        log = FakeLog()
        write_record(log, "t", S.EMPTY)
        write_record(log, "t", S.ONGOING)
        write_record(log, "t", prepared)
        h = Harness(log=log)
        await h.elect(0, coordinator_epoch=9)
        await h.settle()
        written = h.markers.written_for(42)
        assert {tp for _, tp in written} == {("orders", 0), ("payments", 1)}
        assert all(m.committed is committed and m.coordinator_epoch == 9 and m.producer_epoch == 3
                   for m, _ in written)
        md = h.md("t")
        assert md.state is (S.COMPLETE_COMMIT if committed else S.COMPLETE_ABORT)
        # A retried EndTxn of the producer after failover succeeds.
        assert (await h.coord.end_txn("t", 42, 3, committed)).error == E.NONE

    run(scenario())


def test_recovery_rebuilds_cache_from_many_records():
    async def scenario():
        log = FakeLog()
        write_record(log, "a", S.EMPTY, pid=1, epoch=0)
        write_record(log, "b", S.EMPTY, pid=2, epoch=0)
        write_record(log, "a", S.ONGOING, pid=1, epoch=0)
        write_record(log, "a", S.PREPARE_COMMIT, pid=1, epoch=0)
        write_record(log, "a", S.COMPLETE_COMMIT, pid=1, epoch=0)
        write_record(log, "c", S.EMPTY, pid=3, epoch=5)
        log.write(0, txn_log.encode_batch("c", None, 300))
        h = Harness(log=log, txn_partitions=1)
        await h.elect()
        await h.settle()
        assert h.markers.attempts == []  # nothing to roll forward
        err, listing = h.coord.list_transactions()
        assert err == E.NONE
        assert [(s.transactional_id, s.producer_id, s.state) for s in listing] == \
            [("a", 1, S.COMPLETE_COMMIT), ("b", 2, S.EMPTY)]
        r = await h.coord.init_producer_id("a", 60000)
        assert (r.producer_id, r.producer_epoch) == (1, 1)

    run(scenario())


def test_recovered_ongoing_transaction_times_out():
    async def scenario():
        log = FakeLog()
        h = Harness(log=log)
        write_record(log, "t", S.ONGOING, start=h.clock() - 61_000, last_update=h.clock() - 61_000)
        await h.elect()
        assert await h.coord.scans.abort_timed_out_transactions() == 1
        await h.settle()
        assert h.md("t").state is S.COMPLETE_ABORT and h.md("t").producer_epoch == 4

    run(scenario())


def test_load_retries_fetch_errors_and_reads_in_chunks():
    async def scenario():
        log = FakeLog()
        for i in range(50):
            write_record(log, f"t{i}", S.EMPTY, pid=i, epoch=0)
        h = Harness(log=log, config=txn_settings({"transaction.state.log.load.buffer.size": 300}))
        log.fetch_errors = [E.NOT_LEADER_OR_FOLLOWER, E.NETWORK_EXCEPTION]
        await h.elect()
        assert len(h.coord.list_transactions()[1]) == 50

    run(scenario())


def test_corrupt_log_disables_partition():
    async def scenario():
        log = FakeLog()
        write_record(log, "t", S.EMPTY, epoch=5)
        log.write(0, records.encode_batch([(None, b"not a transaction log record", (), 300)]))
        h = Harness(log=log)
        await h.elect()
        assert (await h.coord.init_producer_id("t", 60000)).error == E.NOT_COORDINATOR
        assert h.coord.owned_partitions() == {0: False}

    run(scenario())


def test_reelection_reloads_what_was_written():
    async def scenario():
        h = Harness()
        await h.elect(0, 1)
        pid, epoch = await h.begin("t")
        await h.coord.on_resigned(0)
        await h.elect(0, 2)
        md = h.md("t")
        assert (md.state, md.producer_id, md.partitions) == (S.ONGOING, pid, {("orders", 0)})
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        await h.settle()
        assert [m.coordinator_epoch for m, _ in h.markers.written_for(pid)] == [2]

    run(scenario())
