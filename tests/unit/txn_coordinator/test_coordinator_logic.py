"""Transaction coordinator request handling over in-memory fakes (design doc
"Transaction Coordinator Request Handling", "Coordinator-side Transaction
Expiration", "Coordinator TransactionalId Expiration", "Transaction Coordinator
Startup")."""
from __future__ import annotations

import asyncio

import pytest
from txn_coordinator_fakes import FakeLog, GroupCommitLog, Harness, run, txn_settings, replayed

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from services.txn_coordinator import txn_log
from services.common.settings import TxnCoordinatorSchema
from services.common.protocol import (MARKER_DEADLINE_MARGIN_MS, marker_coordinator_wait_ms,
                                       marker_leader_deadline_s)
from services.txn_coordinator.state import MAX_PRODUCER_EPOCH, GroupAssignment, TxnState, TxnTransitMetadata

S = TxnState
E = ErrorCode


# ---------------------------------------------------------------- InitProducerId

def test_init_without_transactional_id_gives_fresh_pids():
    async def scenario():
        h = Harness()
        a = await h.coord.init_producer_id(None, 0)
        b = await h.coord.init_producer_id("", 0)
        assert (a.error, a.producer_epoch, b.error, b.producer_epoch) == (E.NONE, 0, E.NONE, 0)
        assert a.producer_id != b.producer_id
        assert h.log.batches == {}  # nothing is logged for an idempotent producer

    run(scenario())


@pytest.mark.parametrize("timeout_ms", [0, -1, 900_001])
def test_init_rejects_invalid_transaction_timeout(timeout_ms):
    async def scenario():
        h = Harness()
        await h.elect()
        r = await h.coord.init_producer_id("t", timeout_ms)
        assert r.error == E.INVALID_TRANSACTION_TIMEOUT

    run(scenario())


def test_init_max_timeout_is_configurable():
    async def scenario():
        h = Harness(txn_settings({"transaction.max.timeout.ms": 1000}))
        await h.elect()
        assert (await h.coord.init_producer_id("t", 1001)).error == E.INVALID_TRANSACTION_TIMEOUT
        assert (await h.coord.init_producer_id("t", 1000)).error == E.NONE

    run(scenario())


def test_config_keys():
    props = {"transaction.max.timeout.ms": "5000", "transactional.id.expiration.ms": "60000",
             "transaction.abort.timed.out.transaction.cleanup.interval.ms": "100",
             "transaction.remove.expired.transaction.cleanup.interval.ms": "200",
             "exactly.test.pause.after.prepare.ms": "3000"}
    c = txn_settings(props)
    assert (c.max_timeout_ms, c.transactional_id_expiration_ms, c.abort_timed_out_interval_ms,
            c.remove_expired_interval_ms, c.test_pause_after_prepare_ms) == (5000, 60000, 100, 200, 3000)
    assert TxnCoordinatorSchema().max_timeout_ms == 900_000
    assert txn_settings({"max.transaction.timeout.ms": "7000"}).max_timeout_ms == 7000


def test_init_logs_mapping_and_bumps_epoch():
    async def scenario():
        h = Harness()
        await h.elect()
        a = await h.coord.init_producer_id("t", 60000)
        b = await h.coord.init_producer_id("t", 60000)
        assert (a.error, a.producer_epoch, b.error, b.producer_epoch) == (E.NONE, 0, E.NONE, 1)
        assert a.producer_id == b.producer_id
        entries = h.log.entries()
        assert [(e.transactional_id, e.transit.state, e.transit.producer_epoch) for e in entries] == \
            [("t", S.EMPTY, 0), ("t", S.EMPTY, 1)]
        assert entries[0].transit.txn_timeout_ms == 60000

    run(scenario())


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


def test_pending_transition_answers_concurrent_transactions():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        h.log.append_gate = asyncio.Event()
        first = asyncio.create_task(h.coord.end_txn("t", pid, epoch, True))
        await asyncio.sleep(0)
        assert h.md("t").pending_state is S.PREPARE_COMMIT
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.CONCURRENT_TRANSACTIONS
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 1)])
        assert set(res.values()) == {E.CONCURRENT_TRANSACTIONS}
        assert (await h.coord.init_producer_id("t", 60000)).error == E.CONCURRENT_TRANSACTIONS
        h.log.append_gate.set()
        assert (await first) == (E.NONE, pid, epoch + 1)

    run(scenario())


# ---------------------------------------------------------------- a whole transaction

@pytest.mark.parametrize("committed", [True, False])
def test_commit_or_abort_writes_prepare_markers_complete(committed):
    async def scenario():
        h = Harness()
        await h.elect(0, coordinator_epoch=3)
        pid, epoch = await h.begin("t", [("orders", 0), ("orders", 1)])
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("payments", 1), ("orders", 0)])
        assert set(res.values()) == {E.NONE}
        assert (await h.coord.end_txn("t", pid, epoch, committed)).error == E.NONE
        prepare = S.PREPARE_COMMIT if committed else S.PREPARE_ABORT
        assert h.log.states("t")[-1] is prepare  # appended before answering
        await h.settle()
        complete = S.COMPLETE_COMMIT if committed else S.COMPLETE_ABORT
        assert h.log.states("t") == [S.EMPTY, S.ONGOING, S.ONGOING, prepare, complete]
        prepared = h.log.entries()[3].transit
        assert prepared.partitions == {("orders", 0), ("orders", 1), ("payments", 1)}
        written = h.markers.written_for(pid)
        assert {tp for _, tp in written} == {("orders", 0), ("orders", 1), ("payments", 1)}
        # KIP-890 part 2: the transaction ends under the next epoch, markers included.
        assert prepared.producer_epoch == epoch + 1 and prepared.last_producer_epoch == epoch
        assert all(m.committed is committed and m.producer_epoch == epoch + 1 and m.coordinator_epoch == 3
                   for m, _ in written)
        md = h.md("t")
        assert md.state is complete and not md.partitions and md.producer_epoch == epoch + 1

    run(scenario())


def test_end_txn_waits_for_completion_when_configured():
    async def scenario():
        h = Harness(txn_settings({"exactly.txn.end.completion.wait.ms": 5000}))
        await h.elect()
        pid, epoch = await h.begin("t")
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        assert h.md("t").state is S.COMPLETE_COMMIT  # next AddPartitions will not see CONCURRENT_TRANSACTIONS

    run(scenario())


def test_add_partitions_again_is_answered_without_append():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", [("orders", 0)])
        n = len(h.log.entries())
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 0)])
        assert res == {("orders", 0): E.NONE} and len(h.log.entries()) == n

    run(scenario())


def test_add_unknown_partition():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", [("orders", 0)])
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 1), ("nope", 0), ("orders", 99)])
        assert set(res.values()) == {E.UNKNOWN_TOPIC_OR_PARTITION}
        assert h.md("t").partitions == {("orders", 0)}

    run(scenario())


def test_add_offsets_adds_the_groups_consumer_offsets_partition():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", [("orders", 0)])
        assert await h.coord.add_offsets_to_txn("t", pid, epoch, "my-group") == E.NONE
        offsets_tp = ("__consumer_offsets", h.topology.offsets_partition_for("my-group"))
        assert h.md("t").partitions == {("orders", 0), offsets_tp}
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        await h.settle()
        assert offsets_tp in {tp for m, tp in h.markers.written_for(pid) if m.committed}
        assert await h.coord.add_offsets_to_txn("t", pid, epoch, "") == E.INVALID_REQUEST

    run(scenario())


def test_add_offsets_starts_a_transaction():
    async def scenario():
        h = Harness()
        await h.elect()
        r = await h.coord.init_producer_id("t", 60000)
        assert await h.coord.add_offsets_to_txn("t", r.producer_id, r.producer_epoch, "g") == E.NONE
        assert h.md("t").state is S.ONGOING

    run(scenario())


# ---------------------------------------------------------------- EndTxn retries and errors

def test_end_txn_retry_semantics():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        assert (await h.coord.end_txn("t", pid, epoch, True)) == (E.NONE, pid, epoch + 1)
        await h.settle()
        # A retry carries the epoch from before the bump: recognised, answered with the new one.
        assert (await h.coord.end_txn("t", pid, epoch, True)) == (E.NONE, pid, epoch + 1)
        assert (await h.coord.end_txn("t", pid, epoch, False)).error == E.INVALID_TXN_STATE
        # The old epoch cannot start a transaction any more.
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 2)])
        assert set(res.values()) == {E.PRODUCER_FENCED}
        epoch += 1
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 2)])
        assert set(res.values()) == {E.NONE}
        assert (await h.coord.end_txn("t", pid, epoch, False)) == (E.NONE, pid, epoch + 1)
        await h.settle()
        assert (await h.coord.end_txn("t", pid, epoch, False)).error == E.NONE
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.INVALID_TXN_STATE

    run(scenario())


def test_end_txn_retry_while_the_complete_record_is_appended_is_told_to_retry():
    """A retry of a committed EndTxn (the epoch from before the bump) that arrives while
    the CompleteCommit record is being appended is answered CONCURRENT_TRANSACTIONS,
    not PRODUCER_FENCED: it is the same producer (or, after KIP-939 recovery, another
    process holding the same PID and epoch), and once the record is written the retry
    is answered NONE. An abort with that epoch meanwhile is INVALID_TXN_STATE, as
    before and after."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        h.markers.gate = asyncio.Event()
        assert (await h.coord.end_txn("t", pid, epoch, True)) == (E.NONE, pid, epoch + 1)
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.CONCURRENT_TRANSACTIONS  # markers
        await h.markers.held.wait()
        h.log.append_gate = asyncio.Event()
        h.markers.gate.set()
        for _ in range(1000):  # until the completion's CompleteCommit append waits at the gate
            if h.md("t").pending_transition_in_progress:
                break
            await asyncio.sleep(0)
        assert h.md("t").pending_transition_in_progress and h.md("t").state is S.PREPARE_COMMIT
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.CONCURRENT_TRANSACTIONS
        assert (await h.coord.end_txn("t", pid, epoch, False)).error == E.INVALID_TXN_STATE
        h.log.append_gate.set()
        await h.settle()
        assert h.md("t").state is S.COMPLETE_COMMIT
        assert (await h.coord.end_txn("t", pid, epoch, True)) == (E.NONE, pid, epoch + 1)

    run(scenario())


def test_next_transaction_waits_for_the_previous_ones_markers():
    """EndTxn answers after the Prepare record; the producer's next AddPartitionsToTxn
    waits in the coordinator until the markers are written, then starts the next
    transaction (no CONCURRENT_TRANSACTIONS round trips) with one Ongoing record that
    also completes the previous one (the handover)."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        h.markers.gate = asyncio.Event()
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        assert h.md("t").state is S.PREPARE_COMMIT  # answered before the markers
        nxt = asyncio.create_task(h.coord.add_partitions_to_txn("t", pid, epoch + 1, [("orders", 1)]))
        # The completion (spawned first) reaches the gate, then the add runs up to its
        # wait for that completion, before this coroutine resumes.
        await h.markers.held.wait()
        assert not nxt.done() and h.markers.written_for(pid) == []
        h.markers.gate.set()
        assert set((await nxt).values()) == {E.NONE}
        # Prepare, then straight to the next transaction, whose record was appended only
        # after every marker of the previous one was written.
        assert h.log.states("t")[-2:] == [S.PREPARE_COMMIT, S.ONGOING]
        assert [tp for _, tp in h.markers.written_for(pid)] == [("orders", 0)]
        assert h.md("t").partitions == {("orders", 1)} and h.md("t").state is S.ONGOING

    run(scenario())


def test_end_txn_while_completing():
    async def scenario():
        h = Harness(txn_settings({"exactly.txn.previous.completion.wait.ms": 0}))
        await h.elect()
        pid, epoch = await h.begin("t")
        h.markers.gate = asyncio.Event()
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        assert h.md("t").state is S.PREPARE_COMMIT
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.CONCURRENT_TRANSACTIONS
        assert (await h.coord.end_txn("t", pid, epoch, False)).error == E.INVALID_TXN_STATE
        res = await h.coord.add_partitions_to_txn("t", pid, epoch + 1, [("orders", 1)])
        assert set(res.values()) == {E.CONCURRENT_TRANSACTIONS}
        h.markers.gate.set()
        await h.settle()
        assert h.md("t").state is S.COMPLETE_COMMIT

    run(scenario())


@pytest.mark.parametrize("committed", [True, False])
def test_end_txn_without_transaction_is_invalid_txn_state(committed):
    async def scenario():
        h = Harness()
        await h.elect()
        r = await h.coord.init_producer_id("t", 60000)
        assert (await h.coord.end_txn("t", r.producer_id, r.producer_epoch, committed)).error == E.INVALID_TXN_STATE
        assert h.md("t").state is S.EMPTY

    run(scenario())


def test_producer_id_mapping_and_fencing_errors():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        assert (await h.coord.end_txn("unknown", pid, epoch, True)).error == E.INVALID_PRODUCER_ID_MAPPING
        assert (await h.coord.end_txn("t", pid + 1, epoch, True)).error == E.INVALID_PRODUCER_ID_MAPPING
        assert await h.coord.add_offsets_to_txn("t", pid + 1, epoch, "g") == E.INVALID_PRODUCER_ID_MAPPING
        assert (await h.coord.end_txn("t", pid, epoch - 1, True)).error == E.PRODUCER_FENCED
        res = await h.coord.add_partitions_to_txn("t", pid, epoch - 1, [("orders", 1)])
        assert set(res.values()) == {E.PRODUCER_FENCED}

    run(scenario())


# ---------------------------------------------------------------- fencing by a new producer instance

def test_init_with_ongoing_transaction_aborts_it_with_bumped_epoch():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", [("orders", 0), ("payments", 0)])
        h.markers.gate = asyncio.Event()
        r = await h.coord.init_producer_id("t", 60000)
        assert r.error == E.CONCURRENT_TRANSACTIONS
        assert h.log.states("t")[-1] is S.PREPARE_ABORT
        assert h.log.entries()[-1].transit.producer_epoch == epoch + 1
        # The zombie is fenced at once.
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.PRODUCER_FENCED
        assert (await h.coord.init_producer_id("t", 60000)).error == E.CONCURRENT_TRANSACTIONS
        h.markers.gate.set()
        await h.settle()
        aborts = h.markers.written_for(pid)
        assert {tp for _, tp in aborts} == {("orders", 0), ("payments", 0)}
        assert all(not m.committed and m.producer_epoch == epoch + 1 for m, _ in aborts)
        r = await h.coord.init_producer_id("t", 60000)
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, pid, epoch + 2)
        assert h.log.states("t")[-3:] == [S.PREPARE_ABORT, S.COMPLETE_ABORT, S.EMPTY]

    run(scenario())


def test_epoch_exhaustion_rotates_producer_id():
    async def scenario():
        log = FakeLog()
        log.write(0, txn_log.encode_batch("t", TxnTransitMetadata(
            5, -1, MAX_PRODUCER_EPOCH - 2, -1, 60000, S.COMPLETE_COMMIT, frozenset(), 10, 20), 20))
        h = Harness(log=log, first_pid=100)
        await h.elect()
        r = await h.coord.init_producer_id("t", 60000)
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, 5, MAX_PRODUCER_EPOCH - 1)
        r = await h.coord.init_producer_id("t", 60000)
        assert r.error == E.NONE and r.producer_id >= 100 and r.producer_epoch == 0
        md = h.md("t")
        assert (md.last_producer_id, md.producer_id) == (5, r.producer_id)

    run(scenario())


def test_fence_at_exhausted_epoch_then_rotation():
    async def scenario():
        log = FakeLog()
        log.write(0, txn_log.encode_batch("t", TxnTransitMetadata(
            5, -1, MAX_PRODUCER_EPOCH - 1, -1, 60000, S.ONGOING, frozenset({("orders", 0)}), 10, 20), 20))
        h = Harness(log=log, first_pid=100)
        await h.elect()
        assert (await h.coord.init_producer_id("t", 60000)).error == E.CONCURRENT_TRANSACTIONS
        await h.settle()
        assert h.md("t").producer_epoch == MAX_PRODUCER_EPOCH
        r = await h.coord.init_producer_id("t", 60000)
        assert (r.error, r.producer_epoch) == (E.NONE, 0) and r.producer_id >= 100

    run(scenario())


def test_kip360_expected_producer_id_and_epoch():
    async def scenario():
        h = Harness()
        await h.elect()
        r = await h.coord.init_producer_id("t", 60000)
        other = await h.coord.init_producer_id("t", 60000, expected=(r.producer_id + 50, 0))
        assert other.error == E.PRODUCER_FENCED
        bumped = await h.coord.init_producer_id("t", 60000, expected=(r.producer_id, r.producer_epoch))
        assert (bumped.error, bumped.producer_epoch) == (E.NONE, r.producer_epoch + 1)
        retry = await h.coord.init_producer_id("t", 60000, expected=(r.producer_id, r.producer_epoch))
        assert (retry.error, retry.producer_epoch) == (E.NONE, r.producer_epoch + 1)

    run(scenario())


# ---------------------------------------------------------------- markers

def test_markers_retried_until_written():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", [("orders", 0), ("orders", 1)])
        h.markers.fail[("orders", 1)] = [E.NOT_LEADER_OR_FOLLOWER, E.NETWORK_EXCEPTION, E.LEADER_NOT_AVAILABLE]
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        await h.settle()
        assert h.md("t").state is S.COMPLETE_COMMIT
        assert {tp for _, tp in h.markers.written_for(pid)} == {("orders", 0), ("orders", 1)}
        # orders-0 is written once, orders-1 retried alone
        assert sum(("orders", 0) in m.partitions for m in h.markers.attempts) == 1
        assert sum(("orders", 1) in m.partitions for m in h.markers.attempts) == 4

    run(scenario())


def test_marker_for_deleted_topic_is_dropped():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", [("orders", 0), ("payments", 0)])
        del h.topology.topics["payments"]
        h.markers.errors[("payments", 0)] = E.UNKNOWN_TOPIC_OR_PARTITION
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        await h.settle()
        assert h.md("t").state is S.COMPLETE_COMMIT
        assert {tp for _, tp in h.markers.written_for(pid)} == {("orders", 0)}

    run(scenario())


def test_unknown_partition_of_existing_topic_is_retried():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", [("orders", 0)])
        h.markers.fail[("orders", 0)] = [E.UNKNOWN_TOPIC_OR_PARTITION] * 3
        assert (await h.coord.end_txn("t", pid, epoch, False)).error == E.NONE
        await h.settle()
        assert h.md("t").state is S.COMPLETE_ABORT
        assert len(h.markers.written_for(pid)) == 1

    run(scenario())


def test_completion_append_is_retried():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        h.log.append_errors = [E.REQUEST_TIMED_OUT, E.NOT_ENOUGH_REPLICAS]
        await h.settle()
        assert h.log.states("t")[-1] is S.COMPLETE_COMMIT

    run(scenario())


def test_resigned_partition_stops_completion():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        h.markers.errors[("orders", 0)] = E.NOT_LEADER_OR_FOLLOWER
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        for _ in range(5):
            await asyncio.sleep(0)
        await h.coord.on_resigned(0)
        await h.settle()
        assert h.log.states("t")[-1] is S.PREPARE_COMMIT
        assert (await h.coord.init_producer_id("t", 60000)).error == E.NOT_COORDINATOR

    run(scenario())


# ---------------------------------------------------------------- timeouts and expiration

def test_timed_out_transaction_is_aborted_with_epoch_bump():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", timeout_ms=1000)
        h.clock.advance(1000)
        assert await h.coord.scans.abort_timed_out_transactions() == 0  # not yet (strictly older)
        h.clock.advance(1)
        assert await h.coord.scans.abort_timed_out_transactions() == 1
        await h.settle()
        md = h.md("t")
        assert (md.state, md.producer_epoch) == (S.COMPLETE_ABORT, epoch + 1)
        assert [m.producer_epoch for m, _ in h.markers.written_for(pid)] == [epoch + 1]
        # The zombie producer is fenced...
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.PRODUCER_FENCED
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 1)])
        assert set(res.values()) == {E.PRODUCER_FENCED}
        # ... and a new instance continues with a newer epoch.
        r = await h.coord.init_producer_id("t", 1000)
        assert (r.error, r.producer_epoch) == (E.NONE, epoch + 2)

    run(scenario())


def test_timeout_counts_from_first_partition_not_last_update():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", timeout_ms=1000)
        h.clock.advance(900)
        await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 2)])
        h.clock.advance(200)
        assert await h.coord.scans.abort_timed_out_transactions() == 1

    run(scenario())


def test_expired_transactional_id_gets_tombstone():
    async def scenario():
        h = Harness(txn_settings({"transactional.id.expiration.ms": 10_000}))
        await h.elect()
        await h.coord.init_producer_id("idle", 60000)
        pid, epoch = await h.begin("busy", timeout_ms=60000)
        h.clock.advance(10_000)
        assert await h.coord.scans.expire_transactional_ids() == 1
        assert h.md("idle") is None and h.md("busy") is not None
        assert h.log.states("idle")[-1] is None
        [d] = h.coord.describe_transactions(["idle"])
        assert d.error == E.TRANSACTIONAL_ID_NOT_FOUND
        assert "idle" not in replayed(h.log.entries()).txns
        r = await h.coord.init_producer_id("idle", 60000)  # comes back with a new PID
        assert r.error == E.NONE and r.producer_epoch == 0

    run(scenario())


def test_failed_tombstone_keeps_the_id():
    async def scenario():
        h = Harness(txn_settings({"transactional.id.expiration.ms": 10}))
        await h.elect()
        await h.coord.init_producer_id("idle", 60000)
        h.clock.advance(10)
        h.log.append_errors = [E.NOT_ENOUGH_REPLICAS]
        assert await h.coord.scans.expire_transactional_ids() == 0
        assert h.md("idle").pending_state is None
        assert await h.coord.scans.expire_transactional_ids() == 1

    run(scenario())


# ---------------------------------------------------------------- recovery

def _write(log, tid, state, pid=42, epoch=3, partitions=frozenset({("orders", 0), ("payments", 1)}), start=100,
           timeout_ms=60000, partition=0, last_update=200):
    log.write(partition, txn_log.encode_batch(tid, TxnTransitMetadata(
        pid, -1, epoch, -1, timeout_ms, state, partitions if state in (S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT)
        else frozenset(), start, last_update), last_update))


@pytest.mark.parametrize("prepared,committed", [(S.PREPARE_COMMIT, True), (S.PREPARE_ABORT, False)])
def test_recovery_rolls_prepared_transaction_forward(prepared, committed):
    async def scenario():
        log = FakeLog()
        _write(log, "t", S.EMPTY)
        _write(log, "t", S.ONGOING)
        _write(log, "t", prepared)
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
        _write(log, "a", S.EMPTY, pid=1, epoch=0)
        _write(log, "b", S.EMPTY, pid=2, epoch=0)
        _write(log, "a", S.ONGOING, pid=1, epoch=0)
        _write(log, "a", S.PREPARE_COMMIT, pid=1, epoch=0)
        _write(log, "a", S.COMPLETE_COMMIT, pid=1, epoch=0)
        _write(log, "c", S.EMPTY, pid=3, epoch=5)
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
        _write(log, "t", S.ONGOING, start=h.clock() - 61_000, last_update=h.clock() - 61_000)
        await h.elect()
        assert await h.coord.scans.abort_timed_out_transactions() == 1
        await h.settle()
        assert h.md("t").state is S.COMPLETE_ABORT and h.md("t").producer_epoch == 4

    run(scenario())


def test_load_retries_fetch_errors_and_reads_in_chunks():
    async def scenario():
        log = FakeLog()
        for i in range(50):
            _write(log, f"t{i}", S.EMPTY, pid=i, epoch=0)
        h = Harness(log=log, config=txn_settings({"transaction.state.log.load.buffer.size": 300}))
        log.fetch_errors = [E.NOT_LEADER_OR_FOLLOWER, E.NETWORK_EXCEPTION]
        await h.elect()
        assert len(h.coord.list_transactions()[1]) == 50

    run(scenario())


def test_corrupt_log_disables_partition():
    async def scenario():
        log = FakeLog()
        _write(log, "t", S.EMPTY, epoch=5)
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


def test_pause_after_prepare_delays_markers_of_client_commits_only():
    async def scenario():
        slept = []

        async def recording_sleep(s):
            slept.append(s)
            await asyncio.sleep(0)
        h = Harness(txn_settings({"exactly.test.pause.after.prepare.ms": 5000}), sleep=recording_sleep)
        await h.elect()
        pid, epoch = await h.begin("t")
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        await h.settle()
        assert 5.0 in slept and h.md("t").state is S.COMPLETE_COMMIT

    run(scenario())


# ---------------------------------------------------------------- admin

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


# ---------------------------------------------------------------- KIP-447 draft

def test_group_aware_init_rejects_stale_generation():
    async def scenario():
        h = Harness()
        await h.elect()
        g5 = GroupAssignment("g", 5, frozenset({("in", 0)}))
        assert (await h.coord.init_producer_id("p1", 60000, group=g5)).error == E.NONE
        g4 = GroupAssignment("g", 4, frozenset({("in", 1)}))
        assert (await h.coord.init_producer_id("p2", 60000, group=g4)).error == E.ILLEGAL_GENERATION
        assert h.md("p1").group == g5 and h.md("p2") is None
        assert replayed(h.log.entries()).groups == {"g": {"p1": g5}}

    run(scenario())


def test_group_aware_init_fences_overlapping_ongoing_transaction_and_waits_for_it():
    """KIP-447 draft: the new owner's init aborts the old owner's open transaction on
    the partitions it now gets, with an epoch bump that fences the old owner, and
    answers PENDING_TRANSACTION (retriable) until that transaction is complete."""
    async def scenario():
        h = Harness()
        await h.elect()
        g1 = GroupAssignment("g", 1, frozenset({("in", 0), ("in", 1)}))
        r1 = await h.coord.init_producer_id("p1", 60000, group=g1)
        assert await h.coord.add_partitions_to_txn("p1", r1.producer_id, r1.producer_epoch, [("orders", 0)],
                                                   group_id="g", generation_id=1) == {("orders", 0): E.NONE}
        h.markers.gate = asyncio.Event()  # the abort's markers wait
        g2 = GroupAssignment("g", 2, frozenset({("in", 1)}))
        assert (await h.coord.init_producer_id("p2", 60000, group=g2)).error == E.PENDING_TRANSACTION
        await asyncio.sleep(0)
        assert (await h.coord.init_producer_id("p2", 60000, group=g2)).error == E.PENDING_TRANSACTION
        h.markers.gate.set()
        await h.settle()
        assert (h.md("p1").state, h.md("p1").producer_epoch) == (S.COMPLETE_ABORT, r1.producer_epoch + 1)
        r2 = await h.coord.init_producer_id("p2", 60000, group=g2)
        assert r2.error == E.NONE
        # The old owner is fenced: its epoch is gone, and its generation is outdated.
        assert await h.coord.add_partitions_to_txn("p1", r1.producer_id, r1.producer_epoch, [("orders", 1)],
                                                   group_id="g", generation_id=1) == {("orders", 1): E.PRODUCER_FENCED}

    run(scenario())


def test_group_aware_init_leaves_non_overlapping_transactions_alone():
    async def scenario():
        h = Harness()
        await h.elect()
        r1 = await h.coord.init_producer_id("p1", 60000, group=GroupAssignment("g", 1, frozenset({("in", 0)})))
        await h.coord.add_partitions_to_txn("p1", r1.producer_id, r1.producer_epoch, [("orders", 0)],
                                            group_id="g", generation_id=1)
        g2 = GroupAssignment("g", 2, frozenset({("in", 1)}))
        assert (await h.coord.init_producer_id("p2", 60000, group=g2)).error == E.NONE
        assert h.md("p1").state is S.ONGOING

    run(scenario())


def test_every_transactional_rpc_refuses_an_older_generation():
    """KIP-447 draft: "Once the coordinator observes a generation bump for a group, it
    will refuse to handle requests from the previous generation" — on AddPartitionsToTxn,
    AddOffsetsToTxn, EndTxn and PrepareTxn, as on InitProducerId; a producer must
    carry the generation it initialised with."""
    async def scenario():
        h = Harness()
        await h.elect()
        r1 = await h.coord.init_producer_id("p1", 60000, group=GroupAssignment("g", 1, frozenset({("in", 0)})))
        pid, epoch = r1.producer_id, r1.producer_epoch
        assert await h.coord.add_partitions_to_txn("p1", pid, epoch, [("orders", 0)], group_id="g",
                                                   generation_id=1) == {("orders", 0): E.NONE}
        assert (await h.coord.init_producer_id("p2", 60000, group=GroupAssignment("g", 2, frozenset({("in", 1)})))
                ).error == E.NONE
        zombie = dict(group_id="g", generation_id=1)
        assert await h.coord.add_partitions_to_txn("p1", pid, epoch, [("orders", 1)], **zombie) == \
            {("orders", 1): E.ILLEGAL_GENERATION}
        assert await h.coord.add_offsets_to_txn("p1", pid, epoch, "g", "g", 1) == E.ILLEGAL_GENERATION
        assert (await h.coord.end_txn("p1", pid, epoch, True, **zombie)).error == E.ILLEGAL_GENERATION
        assert await h.coord.prepare_txn("p1", pid, epoch, **zombie) == E.ILLEGAL_GENERATION
        # Claiming the new generation without initialising with it is refused too.
        assert (await h.coord.end_txn("p1", pid, epoch, True, "g", 2)).error == E.ILLEGAL_GENERATION
        # The only way on: InitProducerId with the new generation (aborts p1's transaction).
        g2 = GroupAssignment("g", 2, frozenset({("in", 0)}))
        assert (await h.coord.init_producer_id("p1", 60000, group=g2)).error == E.CONCURRENT_TRANSACTIONS
        await h.settle()
        r = await h.coord.init_producer_id("p1", 60000, group=g2)
        assert r.error == E.NONE
        assert await h.coord.add_partitions_to_txn("p1", r.producer_id, r.producer_epoch, [("orders", 1)],
                                                   group_id="g", generation_id=2) == {("orders", 1): E.NONE}
        assert (await h.coord.end_txn("p1", r.producer_id, r.producer_epoch, True, "g", 2)).error == E.NONE

    run(scenario())


def test_group_assignments_are_replayed_on_failover():
    async def scenario():
        h = Harness(txn_partitions=4)
        group_partition = h.topology.txn_partition_for("g")
        await h.elect(group_partition)
        g3 = GroupAssignment("g", 3, frozenset({("in", 0)}))
        assert (await h.coord.init_producer_id("p1", 60000, group=g3)).error == E.NONE
        assert h.md("p1", group_partition).group == g3
        await h.coord.on_resigned(group_partition)
        await h.elect(group_partition, coordinator_epoch=2)
        part = h.coord.partitions.get(group_partition)
        assert part.groups == {"g": {"p1": g3}} and part.generation("g") == 3
        assert h.md("p1", group_partition).group == g3
        stale = GroupAssignment("g", 2, frozenset({("in", 1)}))
        assert (await h.coord.init_producer_id("p2", 60000, group=stale)).error == E.ILLEGAL_GENERATION

    run(scenario())


def test_group_aware_producers_live_on_the_partition_of_their_group():
    async def scenario():
        h = Harness(txn_partitions=8)
        tid = next(t for t in (f"p{i}" for i in range(100))
                   if h.topology.txn_partition_for(t) != h.topology.txn_partition_for("g"))
        await h.elect(h.topology.txn_partition_for("g"))
        assert (await h.coord.init_producer_id(tid, 60000)).error == E.NOT_COORDINATOR
        group = GroupAssignment("g", 1, frozenset({("in", 0)}))
        assert (await h.coord.init_producer_id(tid, 60000, group=group)).error == E.NONE
        assert (await h.coord.init_producer_id("bad\0id", 60000)).error == E.INVALID_REQUEST
        assert (await h.coord.init_producer_id(tid, 60000, group=GroupAssignment("", 1))).error == \
            E.INVALID_GROUP_ID

    run(scenario())


def test_expired_group_aware_id_leaves_a_group_tombstone():
    async def scenario():
        h = Harness(txn_settings({"transactional.id.expiration.ms": 1000}))
        await h.elect()
        assert (await h.coord.init_producer_id("p1", 60000, group=GroupAssignment("g", 1, frozenset()))).error \
            == E.NONE
        h.clock.advance(2000)
        assert await h.coord.scans.expire_transactional_ids() == 1
        assert replayed(h.log.entries()).groups == {}
        assert h.coord.partitions.get(0).groups == {}

    run(scenario())


# ---------------------------------------------------------------- clock steps

def test_wall_clock_stepping_back_does_not_wedge_the_transactional_id():
    """The coordinator's wall clock steps back 5 s in the middle of a transaction (an NTP
    step, or a failover to a host whose clock is behind): the commit completes, the id
    takes new transactions at once, and a reload of the log gives the same state."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        h.clock.advance(-5000)
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        await h.settle()
        md = h.md("t")
        assert (md.state, md.pending_state) == (S.COMPLETE_COMMIT, None)
        h.clock.advance(-5000)
        res = await h.coord.add_partitions_to_txn("t", pid, md.producer_epoch, [("orders", 1)])
        assert res == {("orders", 1): E.NONE}
        assert (await h.coord.end_txn("t", pid, md.producer_epoch, False)).error == E.NONE
        await h.settle()
        assert (h.md("t").state, h.md("t").pending_state) == (S.COMPLETE_ABORT, None)
        await h.coord.on_resigned(0)
        await h.elect(coordinator_epoch=2)
        assert h.md("t").state is S.COMPLETE_ABORT

    run(scenario())


# ---------------------------------------------------------------- ambiguous appends

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


# ---------------------------------------------------------------- requests cancelled mid-append

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


def test_a_group_aware_init_cancelled_while_its_group_record_waits_in_the_group_commit():
    """KIP-447 draft: the group assignment record of a cancelled InitProducerId goes
    out all the same, and the cache takes the assignment from the append's result,
    so a stale generation is refused here as a new owner would refuse it."""
    async def scenario():
        h = Harness(log=GroupCommitLog())
        await h.elect()
        g5 = GroupAssignment("g", 5, frozenset({("in", 0)}))
        h.log.request_gate = asyncio.Event()
        request = asyncio.create_task(h.coord.init_producer_id("p1", 60000, group=g5))
        await h.log.requested.wait()
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        h.log.request_gate.set()
        await h.log.answered.wait()
        await h.settle()
        assert h.coord.partitions.get(0).groups == replayed(h.log.entries()).groups == {"g": {"p1": g5}}
        g4 = GroupAssignment("g", 4, frozenset({("in", 1)}))
        assert (await h.coord.init_producer_id("p2", 60000, group=g4)).error == E.ILLEGAL_GENERATION

    run(scenario())


# ---------------------------------------------------------------- KIP-890 part 2

def test_a_marker_refused_for_a_newer_epoch_is_never_skipped_silently(caplog):
    from services.txn_coordinator import metrics
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", [("orders", 0), ("orders", 1)])
        h.markers.errors[("orders", 1)] = E.INVALID_PRODUCER_EPOCH
        before = metrics.MARKERS_REJECTED.labels("INVALID_PRODUCER_EPOCH")._value.get()
        with caplog.at_level("ERROR", logger="services.txn_coordinator.coordinator"):
            assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
            await h.settle()
        assert h.md("t").state is S.COMPLETE_COMMIT
        assert metrics.MARKERS_REJECTED.labels("INVALID_PRODUCER_EPOCH")._value.get() == before + 1
        [rec] = [r for r in caplog.records if "refused on orders-1" in r.getMessage()]
        assert rec.levelname == "ERROR" and f"PID {pid} epoch {epoch + 1}" in rec.getMessage()

    run(scenario())


class _HeldSleep:
    """The coordinator's sleep: backoffs (up to exactly.txn.retry.backoff.max.ms)
    only yield; a longer sleep sets `parked` and waits for `resume`, then moves the
    clock on by the time asked for."""

    def __init__(self):
        self.clock = None
        self.parked = asyncio.Event()
        self.resume = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        if seconds <= TxnCoordinatorSchema().txn_retry_backoff_max_ms / 1000:
            await asyncio.sleep(0)
            return
        self.parked.set()
        await self.resume.wait()
        self.clock.advance(int(seconds * 1000))


async def _held_harness() -> tuple["Harness", "_HeldSleep", int, int]:
    """An elected Harness whose coordinator sleeps on a `_HeldSleep`, with transaction
    "t" begun: (harness, sleep, producer id, epoch)."""
    sleep = _HeldSleep()
    h = Harness(txn_settings({"exactly.txn.previous.completion.wait.ms": 0}), sleep=sleep)
    sleep.clock = h.clock
    await h.elect()
    pid, epoch = await h.begin("t")
    return h, sleep, pid, epoch


@pytest.mark.parametrize("unanswered", [E.REQUEST_TIMED_OUT, E.NETWORK_EXCEPTION], ids=["timed_out", "stream_broke"])
def test_a_version_1_transaction_outlives_its_unanswered_marker_requests(unanswered):
    """Transaction version 1 (a Kafka client's EndTxn below v5): the markers keep the
    producer's epoch, so the next transaction has the same PID and epoch. A marker
    request that got no answer (timed out at the coordinator, or its tunnel stream
    broke) may still append its marker at the leader until the leader's deadline;
    landing after the next transaction's first batch it would end that transaction.
    So the transaction completes, and the next one may start, only once the leader's
    deadline for that request, and a margin, have passed after the retry wrote the
    marker (the request arrived at the leader at the latest then)."""
    async def scenario():
        h, sleep, pid, epoch = await _held_harness()
        h.markers.fail[("orders", 0)] = [unanswered]  # no answer to the first request; the retry writes it
        ended_at = h.clock.now
        end = await h.coord.end_txn("t", pid, epoch, True, transaction_version=1)
        assert (end.error, end.producer_epoch) == (E.NONE, epoch)
        completion = h.coord.partitions.get(0).completions["t"].task
        parked = asyncio.create_task(sleep.parked.wait())
        await asyncio.wait({parked, completion}, return_when=asyncio.FIRST_COMPLETED)
        assert not completion.done()  # still waiting for the unanswered request to die at the leader
        assert [m.producer_epoch for m, _ in h.markers.written_for(pid)] == [epoch]
        assert h.md("t").state is S.PREPARE_COMMIT
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 0)])
        assert set(res.values()) == {E.CONCURRENT_TRANSACTIONS}  # the next transaction waits
        sleep.resume.set()
        await h.settle()
        complete = h.log.entries()[-1].transit
        assert complete.state is S.COMPLETE_COMMIT
        # The retry wrote the marker at ended_at (the clock moves only in the held sleep).
        leader_deadline_ms = marker_leader_deadline_s(ended_at / 1000) * 1000
        assert complete.txn_last_update_timestamp - leader_deadline_ms >= MARKER_DEADLINE_MARGIN_MS
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 0)])
        assert set(res.values()) == {E.NONE}

    run(scenario())


def test_unanswered_marker_requests_hold_no_version_2_transaction():
    """With an epoch bump per transaction (version 2) the leader refuses a late
    duplicate marker by its epoch: the completion does not wait."""
    async def scenario():
        h, sleep, pid, epoch = await _held_harness()
        h.markers.fail[("orders", 0)] = [E.REQUEST_TIMED_OUT]
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        await h.settle()
        assert h.md("t").state is S.COMPLETE_COMMIT and not sleep.parked.is_set()

    run(scenario())


def test_the_coordinator_outwaits_the_leaders_marker_deadline_by_the_margin():
    """services/common/protocol.py: for a request that arrived at its leader at the
    latest when the retry wrote the marker, the leader's deadline (counted from the
    arrival) ends MARKER_DEADLINE_MARGIN_MS before the coordinator's wait does."""
    written_at_ms = 1_700_000_000_000
    leader_deadline_ms = marker_leader_deadline_s(written_at_ms / 1000) * 1000
    coordinator_until_ms = written_at_ms + marker_coordinator_wait_ms()
    assert coordinator_until_ms - leader_deadline_ms == MARKER_DEADLINE_MARGIN_MS > 0


def test_no_transaction_starts_at_an_exhausted_epoch():
    """Each transaction ends under the next epoch, so none may start at the last ones:
    the producer rotates its PID with InitProducerId (KIP-360) first."""
    async def scenario():
        h = Harness()
        await h.elect()
        r = await h.coord.init_producer_id("t", 60000)
        h.md("t").producer_epoch = MAX_PRODUCER_EPOCH - 1
        res = await h.coord.add_partitions_to_txn("t", r.producer_id, MAX_PRODUCER_EPOCH - 1, [("orders", 0)])
        assert set(res.values()) == {E.INVALID_PRODUCER_EPOCH}
        assert await h.coord.prepare_txn("t", r.producer_id, MAX_PRODUCER_EPOCH - 1) == E.INVALID_PRODUCER_EPOCH
        rotated = await h.coord.init_producer_id("t", 60000, expected=(r.producer_id, MAX_PRODUCER_EPOCH - 1))
        assert rotated.error == E.NONE and rotated.producer_id != r.producer_id and rotated.producer_epoch == 0
        res = await h.coord.add_partitions_to_txn("t", rotated.producer_id, 0, [("orders", 0)])
        assert set(res.values()) == {E.NONE}

    run(scenario())


# ---------------------------------------------------------------- KIP-890 part 1: verification

def test_verify_only_answers_without_appending():
    async def scenario():
        h = Harness()
        await h.elect()
        r = await h.coord.init_producer_id("t", 60000)
        pid, epoch = r.producer_id, r.producer_epoch
        verify = lambda tps, e=epoch, p=pid, tid="t": h.coord.add_partitions_to_txn(tid, p, e, tps, verify_only=True)
        assert await verify([("orders", 0)]) == {("orders", 0): E.INVALID_TXN_STATE}  # Empty
        await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 0)])
        appended = len(h.log.entries())
        assert await verify([("orders", 0), ("orders", 1)]) == {("orders", 0): E.NONE,
                                                               ("orders", 1): E.INVALID_TXN_STATE}
        assert await verify([("orders", 0)], e=epoch + 1) == {("orders", 0): E.PRODUCER_FENCED}
        assert await verify([("orders", 0)], p=pid + 1) == {("orders", 0): E.INVALID_PRODUCER_ID_MAPPING}
        assert await verify([("orders", 0)], tid="nobody") == {("orders", 0): E.INVALID_PRODUCER_ID_MAPPING}
        assert len(h.log.entries()) == appended  # nothing was appended
        h.markers.gate = asyncio.Event()
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        assert await verify([("orders", 0)]) == {("orders", 0): E.PRODUCER_FENCED}  # ended under epoch + 1
        assert await verify([("orders", 0)], e=epoch + 1) == {("orders", 0): E.INVALID_TXN_STATE}  # completing
        # While an epoch fence is pending (its bump not yet written): retriable, then fenced.
        h2 = Harness()
        await h2.elect()
        pid2, epoch2 = await h2.begin("z", [("orders", 0)])
        h2.log.append_gate = asyncio.Event()
        fencing = asyncio.create_task(h2.coord.init_producer_id("z", 60000))
        await asyncio.sleep(0)
        assert h2.md("z").pending_state is not None and h2.md("z").producer_epoch == epoch2
        assert await h2.coord.add_partitions_to_txn("z", pid2, epoch2, [("orders", 0)], verify_only=True) == \
            {("orders", 0): E.CONCURRENT_TRANSACTIONS}
        h2.log.append_gate.set()
        await h2.settle()
        await fencing
        assert await h2.coord.add_partitions_to_txn("z", pid2, epoch2, [("orders", 0)], verify_only=True) == \
            {("orders", 0): E.PRODUCER_FENCED}
        h.markers.gate.set()
        await h.settle()

    run(scenario())


# ---------------------------------------------------------------- Kafka clients: transaction version 1

def test_end_txn_of_transaction_version_1_keeps_the_epoch_and_marks_with_it():
    """Kafka clients with EndTxn below v5: no end-of-transaction bump; the markers
    carry the transaction's own epoch and say so (transaction_version 1)."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        assert (await h.coord.end_txn("t", pid, epoch, True, transaction_version=1)) == (E.NONE, pid, epoch)
        await h.settle()
        marker = h.markers.written_for(pid)[-1][0]
        assert (marker.producer_epoch, marker.transaction_version, marker.committed) == (epoch, 1, True)
        # A retry of the same EndTxn is answered again; the next transaction runs at the same epoch.
        assert (await h.coord.end_txn("t", pid, epoch, True, transaction_version=1)).error == E.NONE
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 1)])
        assert set(res.values()) == {E.NONE}
        # The transaction version is in the log: a new coordinator that loads the
        # Prepare record writes the markers the same way.
        assert (await h.coord.end_txn("t", pid, epoch, False, transaction_version=1)).error == E.NONE
        prepare = [e.transit for e in h.log.entries() if e.transit is not None]
        assert any(t.state is S.PREPARE_ABORT and t.transaction_version == 1 and t.producer_epoch == epoch
                   for t in prepare)

    run(scenario())


def test_transaction_version_round_trips_through_the_log_and_defaults_to_2():
    transit = TxnTransitMetadata(5, -1, 3, 2, 60000, S.PREPARE_COMMIT, frozenset({("orders", 0)}), 10, 20,
                                 transaction_version=1)
    assert txn_log.decode_value(txn_log.encode_value(transit)).transaction_version == 1
    older = txn_log.encode_value(TxnTransitMetadata(5, -1, 3, 2, 60000, S.EMPTY, frozenset(), -1, 20))
    assert txn_log.decode_value(older).transaction_version == 2


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


def _journal(h) -> list[tuple]:
    """Record marker writes and log appends of `h` in the order they happen."""
    journal: list[tuple] = []
    write, append = h.markers.write, h.log.append

    async def journaled_write(marker):
        out = await write(marker)
        journal.extend(("marker", tp) for tp, code in sorted(out.items()) if code == E.NONE)
        return out

    async def journaled_append(partition, batch):
        code = await append(partition, batch)
        if code == E.NONE:
            entry = txn_log.decode_fetched(h.log.batches[partition][-1])[0][-1]
            journal.append(("append", entry.transit.state if entry.transit else None))
        return code

    h.markers.write, h.log.append = journaled_write, journaled_append
    return journal


async def _commit_then_add(h, pid: int, epoch: int, add_epoch: int, partition: tuple, transaction_version: int = 2):
    """Commit the ongoing transaction of "t" with its markers held at the gate, then
    send the next transaction's add of `partition` under `add_epoch`; returns the add's
    task once the completion waits at the gate (the add waits for that completion)."""
    h.markers.held.clear()
    h.markers.gate = asyncio.Event()
    assert (await h.coord.end_txn("t", pid, epoch, True, transaction_version=transaction_version)).error == E.NONE
    add = asyncio.create_task(h.coord.add_partitions_to_txn("t", pid, add_epoch, [partition]))
    await h.markers.held.wait()
    return add


def test_the_handover_appends_the_next_transaction_only_after_every_marker():
    """Back-to-back transactions: the next one's first add waits; its Ongoing record,
    which also completes the previous transaction, follows every marker of it."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", partitions=(("orders", 0), ("orders", 1)))
        journal = _journal(h)
        nxt = await _commit_then_add(h, pid, epoch, epoch + 1, ("orders", 2))
        h.markers.gate.set()
        assert set((await nxt).values()) == {E.NONE}
        await h.settle()
        assert journal == [("append", S.PREPARE_COMMIT), ("marker", ("orders", 0)), ("marker", ("orders", 1)),
                           ("append", S.ONGOING)]
        assert S.COMPLETE_COMMIT not in h.log.states("t")
        # A new owner loads the next transaction, not the previous one.
        await h.coord.on_resigned(0)
        await h.elect(0, 2)
        md = h.md("t")
        assert (md.state, md.producer_epoch, md.partitions) == (S.ONGOING, epoch + 1, {("orders", 2)})
        assert (await h.coord.end_txn("t", pid, epoch + 1, False)).error == E.NONE
        await h.settle()
        assert h.md("t").state is S.COMPLETE_ABORT

    run(scenario())


def test_a_failed_handover_completes_the_previous_transaction_after_all():
    """The add that was to start the next transaction fails to append: the previous
    transaction gets its Complete record anyway, and the add is answered the error."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        nxt = await _commit_then_add(h, pid, epoch, epoch + 1, ("orders", 1))
        h.log.append_errors.append(E.NOT_ENOUGH_REPLICAS)  # the Ongoing record of the handover
        h.markers.gate.set()
        assert set((await nxt).values()) == {E.COORDINATOR_NOT_AVAILABLE}
        await h.settle()
        assert h.log.states("t")[-2:] == [S.PREPARE_COMMIT, S.COMPLETE_COMMIT]
        assert h.md("t").state is S.COMPLETE_COMMIT
        # The producer's retry starts the next transaction the ordinary way.
        assert set((await h.coord.add_partitions_to_txn("t", pid, epoch + 1, [("orders", 1)])).values()) == {E.NONE}

    run(scenario())


def test_a_fenced_waiter_does_not_strand_the_previous_transaction():
    """An add with a stale epoch waiting for the completion is refused; the completion
    it held back still writes its Complete record."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        zombie = await _commit_then_add(h, pid, epoch, epoch, ("orders", 1))
        h.markers.gate.set()
        assert set((await zombie).values()) == {E.PRODUCER_FENCED}
        await h.settle()
        assert h.md("t").state is S.COMPLETE_COMMIT

    run(scenario())


def test_without_the_epoch_bump_the_next_handover_waits_for_its_own_markers():
    """Transaction version 1 keeps the epoch across transactions: the markers written
    for one transaction must not let the one after next start early."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        second = await _commit_then_add(h, pid, epoch, epoch, ("orders", 1), transaction_version=1)
        h.markers.gate.set()
        assert set((await second).values()) == {E.NONE}
        # The second transaction's markers are held back now.
        third = await _commit_then_add(h, pid, epoch, epoch, ("orders", 2), transaction_version=1)
        for _ in range(5):
            await asyncio.sleep(0)
        assert not third.done() and h.md("t").state is S.PREPARE_COMMIT
        h.markers.gate.set()
        assert set((await third).values()) == {E.NONE}
        assert [tp for _, tp in h.markers.written_for(pid)] == [("orders", 0), ("orders", 1)]
        assert h.md("t").partitions == {("orders", 2)}

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
