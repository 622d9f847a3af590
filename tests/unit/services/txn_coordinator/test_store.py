"""The store of transaction metadata (store.TxnStore): lookup, append and apply, ambiguous
appends, requests cancelled mid-append, ListTransactions / DescribeTransactions."""
from __future__ import annotations

import asyncio

import pytest

from txn_coordinator_fakes import GroupCommitLog, Harness, run
from exactly_wire.error_codes import ErrorCode
from services.txn_coordinator.state import TxnState

S = TxnState
E = ErrorCode


def test_not_coordinator_for_unowned_partition():
    async def scenario():
        h = Harness(txn_partitions=2)
        await h.elect(0)
        tid = next(t for t in (f"t{i}" for i in range(100)) if h.topology.txn_partition_for(t) == 1)
        assert (await h.coord.init_producer_id(tid, 60000)).error == E.NOT_COORDINATOR
        assert ((await h.coord.end_txn(tid, 1, 0, True)).error) == E.NOT_COORDINATOR
        res = await h.coord.add_partitions_to_txn(tid, 1, 0, [("orders", 0)])
        assert set(res.values()) == {E.NOT_COORDINATOR}

    run(scenario())


def test_coordinator_not_available_without_transaction_topic():
    async def scenario():
        h = Harness(txn_partitions=0)
        assert (await h.coord.init_producer_id("t", 60000)).error == E.COORDINATOR_NOT_AVAILABLE

    run(scenario())


def test_load_in_progress_while_loading():
    async def scenario():
        h = Harness()
        h.log.fetch_gate = asyncio.Event()
        await h.coord.on_elected(0, 1)
        await asyncio.sleep(0)
        assert (await h.coord.init_producer_id("t", 60000)).error == E.COORDINATOR_LOAD_IN_PROGRESS
        assert h.coord.list_transactions()[0] == E.COORDINATOR_LOAD_IN_PROGRESS
        h.log.fetch_gate.set()
        await h.coord.wait_loaded(0)
        assert (await h.coord.init_producer_id("t", 60000)).error == E.NONE

    run(scenario())


def test_failed_append_leaves_state_unchanged():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        h.log.append_errors = [E.NOT_ENOUGH_REPLICAS]
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.COORDINATOR_NOT_AVAILABLE
        md = h.md("t")
        assert md.state is S.ONGOING and md.pending_state is None
        h.log.append_errors = [E.MESSAGE_TOO_LARGE]
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.UNKNOWN_SERVER_ERROR
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE

    run(scenario())


def test_list_and_describe_transactions():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("a", [("orders", 0), ("orders", 1)])
        await h.coord.init_producer_id("b", 30000)
        err, listing = h.coord.list_transactions(["Ongoing"])
        assert err == E.NONE and [s.transactional_id for s in listing] == ["a"]
        err, listing = h.coord.list_transactions([], [pid])
        assert [s.transactional_id for s in listing] == ["a"]
        assert h.coord.list_transactions(["Bogus"]) == (E.NONE, [])
        assert len(h.coord.list_transactions()[1]) == 2
        da, db, dn = h.coord.describe_transactions(["a", "b", "nope"])
        assert (da.error, da.summary.state, da.summary.partitions, da.summary.producer_epoch) == \
            (E.NONE, S.ONGOING, [("orders", 0), ("orders", 1)], epoch)
        assert da.summary.txn_start_timestamp == h.clock()
        assert (db.error, db.summary.state, db.summary.txn_timeout_ms) == (E.NONE, S.EMPTY, 30000)
        assert dn.error == E.TRANSACTIONAL_ID_NOT_FOUND

    run(scenario())


def test_an_ambiguous_append_that_landed_is_learned_from_the_log():
    """A timeout abort appends PrepareAbort at epoch e+1 and the leader answers
    NOT_ENOUGH_REPLICAS_AFTER_APPEND although the record is in the log. The coordinator
    neither cancels nor completes it blindly: it reloads the partition, finds the
    abort, finishes it, and the live producer's commit at epoch e is fenced; the
    partition stays loadable."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", timeout_ms=1000)
        h.clock.advance(1001)
        h.log.errors_after_write.append(E.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
        await h.coord.scans.abort_timed_out_transactions()
        await h.coord.wait_loaded(0)
        await h.settle()
        md = h.md("t")
        assert (md.state, md.producer_epoch, md.pending_state) == (S.COMPLETE_ABORT, epoch + 1, None)
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.PRODUCER_FENCED
        assert [m.committed for m, _ in h.markers.written_for(pid)] == [False]
        await h.coord.on_resigned(0)
        await h.elect(coordinator_epoch=2)
        assert h.coord.owned_partitions() == {0: True}
        assert h.md("t").state is S.COMPLETE_ABORT

    run(scenario())


def test_an_ambiguous_append_that_did_not_land_leaves_the_transaction_as_it_was():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        h.log.append_errors.append(E.REQUEST_TIMED_OUT)  # answered before anything was written
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.COORDINATOR_LOAD_IN_PROGRESS
        await h.coord.wait_loaded(0)
        md = h.md("t")
        assert (md.state, md.producer_epoch, md.pending_state) == (S.ONGOING, epoch, None)
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE  # the client's retry
        await h.settle()
        assert h.md("t").state is S.COMPLETE_COMMIT

    run(scenario())


def test_an_ambiguous_append_in_the_background_reloads_without_losing_the_partition():
    """The Complete record's append (in the completion task) is ambiguous: the task that
    hit it is cancelled by the reload it starts, and the reloaded partition serves."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        h.log.errors_after_write.extend([E.NONE, E.REQUEST_TIMED_OUT])  # PrepareCommit fine, Complete ambiguous
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        await h.settle()
        await h.coord.wait_loaded(0)
        await h.settle()
        assert h.coord.owned_partitions() == {0: True}
        md = h.md("t")
        assert (md.state, md.pending_state) == (S.COMPLETE_COMMIT, None)

    run(scenario())


def _assert_cache_agrees_with_log(h: Harness, tid: str) -> None:
    md = h.md(tid)
    last = [e.transit for e in h.log.entries() if e.transactional_id == tid][-1]
    assert md.pending_state is None
    assert (md.state, md.producer_id, md.producer_epoch, md.partitions) == \
        (last.state, last.producer_id, last.producer_epoch, last.partitions)


@pytest.mark.parametrize("request_kind", ["end_txn", "init_fence", "add"])
def test_a_request_cancelled_while_its_record_waits_in_the_group_commit(request_kind):
    """A request is cancelled (client deadline, disconnect, broken tunnel stream) while
    its __transaction_state record waits in the partition leader's group-commit
    queue. The record still goes out, so the coordinator applies the transition from
    the append's own result: the cache agrees with the log, an EndTxn's or a fence's
    markers are written under the bumped epoch, and the stale epoch is fenced."""
    async def scenario():
        h = Harness(log=GroupCommitLog())
        await h.elect()
        if request_kind == "add":
            r = await h.coord.init_producer_id("t", 60000)
            pid, epoch = r.producer_id, r.producer_epoch
            call = h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 0)])
        else:
            pid, epoch = await h.begin("t")
            call = (h.coord.end_txn("t", pid, epoch, True) if request_kind == "end_txn"
                    else h.coord.init_producer_id("t", 60000))
        h.log.request_gate = asyncio.Event()
        request = asyncio.create_task(call)
        await h.log.requested.wait()  # its record is in the request held at the leader
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        h.log.request_gate.set()
        await h.log.answered.wait()  # the record is in the log
        await h.settle()
        _assert_cache_agrees_with_log(h, "t")
        epochs = [e.transit.producer_epoch for e in h.log.entries() if e.transactional_id == "t"]
        assert epochs == sorted(epochs)
        if request_kind == "add":
            assert h.md("t").state is S.ONGOING and h.md("t").partitions == {("orders", 0)}
            return
        committed = request_kind == "end_txn"
        assert h.md("t").state is (S.COMPLETE_COMMIT if committed else S.COMPLETE_ABORT)
        assert [(m.committed, m.producer_epoch) for m, _ in h.markers.written_for(pid)] == [(committed, epoch + 1)]
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 1)])
        assert set(res.values()) == {E.PRODUCER_FENCED}
        _assert_cache_agrees_with_log(h, "t")

    run(scenario())


def test_recently_active_counts_producers_committing_at_once():
    """The group-commit linger's signal: transactional ids with an append in the window."""
    async def scenario():
        h = Harness()
        await h.elect()
        assert h.coord.recently_active() == 0
        await h.begin("t1")
        assert h.coord.recently_active() == 1
        await h.begin("t2")
        assert h.coord.recently_active() == 2
        assert h.coord.recently_active(window_s=0.0) == 0

    run(scenario())


def test_per_partition_gauge_series_come_back_after_a_partition_left():
    """The gauge keeps each partition's series for the frequent sets; a partition this
    coordinator resigned loses its series, and owning it again brings it back."""
    from prometheus_client import REGISTRY
    from services.txn_coordinator.metrics import _PerPartitionGauge

    gauge = _PerPartitionGauge("exactly_test_per_partition_ids", "test series")
    gauge.set(3, 5)
    gauge.set(3, 7)
    assert REGISTRY.get_sample_value("exactly_test_per_partition_ids", {"partition": "3"}) == 7
    gauge.remove_partition(3)
    assert REGISTRY.get_sample_value("exactly_test_per_partition_ids", {"partition": "3"}) is None
    gauge.set(3, 2)
    assert REGISTRY.get_sample_value("exactly_test_per_partition_ids", {"partition": "3"}) == 2
