"""InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn of the transaction coordinator
(requests.TxnRequests) over in-memory fakes (design doc "Transaction Coordinator Request
Handling"; KIP-360, KIP-890)."""
from __future__ import annotations

import asyncio

import pytest

from txn_coordinator_fakes import FakeLog, Harness, run, txn_settings
from exactly_wire.error_codes import ErrorCode
from services.txn_coordinator import txn_log
from services.common.settings import TxnCoordinatorSchema
from services.txn_coordinator.state import MAX_PRODUCER_EPOCH, TxnState, TxnTransitMetadata

S = TxnState
E = ErrorCode


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


def test_an_add_of_a_transaction_version_1_producer_tells_the_leaders_once_appended():
    """After its first EndTxn below v5 the producer is a transaction version 1 one: each
    AddPartitionsToTxn appended tells the leaders of its data partitions (not the internal
    topics', not a version 2 producer's, not an add refused), with the producer's PID and
    epoch and the coordinator epoch of its partition."""
    async def scenario():
        h = Harness()
        await h.elect(coordinator_epoch=4)
        pid, epoch = await h.begin("t")
        assert h.markers.added == []  # a new producer is taken for a version 2 one
        assert (await h.coord.end_txn("t", pid, epoch, True, transaction_version=1)).error == E.NONE
        await h.settle()
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 1), ("payments", 0)])
        assert set(res.values()) == {E.NONE}
        assert h.markers.added == [("t", pid, epoch, 4, frozenset({("orders", 1), ("payments", 0)}))]
        # Refused (another epoch): nothing told.
        res = await h.coord.add_partitions_to_txn("t", pid, epoch + 1, [("orders", 2)])
        assert set(res.values()) == {E.PRODUCER_FENCED} and len(h.markers.added) == 1
        # A version 2 producer (its last EndTxn v5): its leaders add its partitions themselves.
        pid2, epoch2 = await h.begin("u")
        end = await h.coord.end_txn("u", pid2, epoch2, True)
        await h.settle()
        assert set((await h.coord.add_partitions_to_txn("u", pid2, end.producer_epoch,
                                                         [("orders", 0)])).values()) == {E.NONE}
        assert len(h.markers.added) == 1

    run(scenario())
