"""KIP-939 recovery fences the previous instance: InitProducerId(keepPreparedTxn=true)
keeps a prepared transaction under its own (PID, epoch) -- for its markers and for
the comparison with the PreparedTxnState the database holds -- and moves the
client-facing epoch on, so every request of an earlier instance is PRODUCER_FENCED;
the completion bumps again, so a delayed EndTxn cannot reach the next transaction;
two instances recovering at once fence each other (docs/design.md, "Two-phase
commit with a database")."""
from __future__ import annotations

from txn_coordinator_fakes import FakeLog, Harness, run

from exactly_wire.error_codes import ErrorCode
from services.txn_coordinator import txn_log
from services.txn_coordinator.state import MAX_PRODUCER_EPOCH, TxnState, TxnTransitMetadata

S = TxnState
E = ErrorCode
PARTS = (("orders", 0), ("payments", 1))


async def _prepared(h: Harness, tid: str = "t") -> tuple[int, int]:
    """The old instance Z: begin, add two partitions, PrepareTxn; returns its (PID, epoch)."""
    pid, epoch = await h.begin(tid, partitions=PARTS)
    assert await h.coord.prepare_txn(tid, pid, epoch) == E.NONE
    return pid, epoch


def test_keep_prepared_bumps_the_client_epoch_and_fences_the_old_instance():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await _prepared(h)
        r = await h.coord.init_producer_id("t", 60000, keep_prepared_txn=True)
        # The new instance R talks with its own epoch; the prepared transaction keeps its pair.
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, pid, epoch + 1)
        assert (r.ongoing_txn_producer_id, r.ongoing_txn_producer_epoch) == (pid, epoch)
        md = h.md("t")
        assert md.is_prepared and md.prepared_producer == (pid, epoch)
        last = h.log.entries()[-1].transit  # the bump is in the log, with both pairs
        assert (last.producer_id, last.producer_epoch, last.ongoing_txn_producer_id,
                last.ongoing_txn_producer_epoch) == (pid, epoch + 1, pid, epoch)
        # Every request of Z is fenced, its EndTxn of the prepared transaction first.
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.PRODUCER_FENCED
        assert await h.coord.prepare_txn("t", pid, epoch) == E.PRODUCER_FENCED
        assert set((await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 2)])).values()) == \
            {E.PRODUCER_FENCED}
        assert h.md("t").is_prepared
        # R completes it under its epoch; the markers end the transaction's data at epoch e.
        end = await h.coord.end_txn("t", pid, epoch + 1, True)
        assert (end.error, end.producer_id, end.producer_epoch) == (E.NONE, pid, epoch + 2)
        await h.settle()
        md = h.md("t")
        assert (md.state, md.producer_epoch, md.ongoing_txn_producer_id) == (S.COMPLETE_COMMIT, epoch + 2, -1)
        written = h.markers.written_for(pid)
        assert {tp for _, tp in written} == set(PARTS)
        assert {(m.producer_epoch, m.committed) for m, _ in written} == {(epoch + 2, True)}
        # Z after the completion: fenced, not taken for a retry; R's own retry is one.
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.PRODUCER_FENCED
        assert (await h.coord.end_txn("t", pid, epoch, False)).error == E.PRODUCER_FENCED
        retry = await h.coord.end_txn("t", pid, epoch + 1, True)
        assert (retry.error, retry.producer_epoch) == (E.NONE, epoch + 2)
        # Z's next transaction is refused; R's goes on at its epoch.
        assert set((await h.coord.add_partitions_to_txn("t", pid, epoch + 1, [("orders", 0)])).values()) == \
            {E.PRODUCER_FENCED}
        assert set((await h.coord.add_partitions_to_txn("t", pid, epoch + 2, [("orders", 0)])).values()) == {E.NONE}

    run(scenario())


def test_a_delayed_end_txn_of_the_new_instance_cannot_reach_its_next_transaction():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await _prepared(h)
        r = await h.coord.init_producer_id("t", 60000, keep_prepared_txn=True)
        end = await h.coord.end_txn("t", pid, r.producer_epoch, True)
        await h.settle()
        assert set((await h.coord.add_partitions_to_txn("t", pid, end.producer_epoch, [("orders", 1)])).values()) \
            == {E.NONE}
        # The first EndTxn, delayed in the network, arrives during the next transaction.
        late = await h.coord.end_txn("t", pid, r.producer_epoch, True)
        assert late.error == E.PRODUCER_FENCED
        md = h.md("t")
        assert (md.state, md.partitions, md.producer_epoch) == (S.ONGOING, {("orders", 1)}, end.producer_epoch)

    run(scenario())


def test_a_version_1_end_txn_after_keep_leaves_the_old_instance_fenced():
    """A Kafka client's EndTxn (below v5: transaction version 1, no bump) completes
    the kept transaction under the client-facing epoch; the old instance's EndTxn at
    the epoch before is still fenced, never taken for a retry."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await _prepared(h)
        r = await h.coord.init_producer_id("t", 60000, keep_prepared_txn=True)
        end = await h.coord.end_txn("t", pid, r.producer_epoch, True, transaction_version=1)
        assert (end.error, end.producer_epoch) == (E.NONE, epoch + 1)
        await h.settle()
        assert {(m.producer_epoch, m.committed) for m, _ in h.markers.written_for(pid)} == {(epoch + 1, True)}
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.PRODUCER_FENCED
        assert (await h.coord.end_txn("t", pid, epoch, True, transaction_version=1)).error == E.PRODUCER_FENCED
        assert (await h.coord.end_txn("t", pid, epoch + 1, True, transaction_version=1)).error == E.NONE

    run(scenario())


def test_two_instances_recovering_at_once_fence_each_other():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await _prepared(h)
        first = await h.coord.init_producer_id("t", 60000, keep_prepared_txn=True)
        second = await h.coord.init_producer_id("t", 60000, keep_prepared_txn=True)
        assert (first.producer_epoch, second.producer_epoch) == (epoch + 1, epoch + 2)
        assert (second.ongoing_txn_producer_id, second.ongoing_txn_producer_epoch) == (pid, epoch)
        # The earlier of the two is fenced, whatever it decides.
        assert (await h.coord.end_txn("t", pid, first.producer_epoch, False)).error == E.PRODUCER_FENCED
        assert (await h.coord.end_txn("t", pid, second.producer_epoch, True)).error == E.NONE
        await h.settle()
        assert (await h.coord.end_txn("t", pid, first.producer_epoch, True)).error == E.PRODUCER_FENCED
        assert h.md("t").state is S.COMPLETE_COMMIT
        assert {m.committed for m, _ in h.markers.written_for(pid)} == {True}

    run(scenario())


def test_plain_init_after_keep_aborts_the_kept_transaction_with_its_markers_past_its_data():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await _prepared(h)
        kept = await h.coord.init_producer_id("t", 60000, keep_prepared_txn=True)
        assert (await h.coord.init_producer_id("t", 60000)).error == E.CONCURRENT_TRANSACTIONS
        await h.settle()
        again = await h.coord.init_producer_id("t", 60000)
        assert (again.error, again.producer_epoch, again.kept_prepared) == (E.NONE, kept.producer_epoch + 2, False)
        assert {(m.committed, m.producer_epoch > epoch) for m, _ in h.markers.written_for(pid)} == {(False, True)}
        assert (await h.coord.end_txn("t", pid, kept.producer_epoch, True)).error == E.PRODUCER_FENCED

    run(scenario())


def test_keep_and_completion_survive_a_reload_of_the_log():
    async def scenario():
        log = FakeLog()
        h = Harness(log=log)
        await h.elect(0, 1)
        pid, epoch = await _prepared(h)
        r = await h.coord.init_producer_id("t", 60000, keep_prepared_txn=True)
        h2 = Harness(log=log)  # failover: another coordinator loads both pairs
        await h2.elect(0, 2)
        md = h2.md("t")
        assert (md.producer_epoch, md.prepared_producer) == (r.producer_epoch, (pid, epoch))
        assert (await h2.coord.end_txn("t", pid, epoch, True)).error == E.PRODUCER_FENCED
        assert (await h2.coord.end_txn("t", pid, r.producer_epoch, True)).error == E.NONE
        await h2.settle()
        # The Prepare record carries the kept pair too: the roll-forward after another
        # failover writes the same markers.
        prepare = [e.transit for e in log.entries() if e.transit and e.transit.state is S.PREPARE_COMMIT][-1]
        assert (prepare.ongoing_txn_producer_id, prepare.ongoing_txn_producer_epoch) == (pid, epoch)
        assert {(m.producer_epoch, m.coordinator_epoch) for m, _ in h2.markers.written_for(pid)} == \
            {(epoch + 2, 2)}
        complete = log.entries()[-1].transit
        assert (complete.state, complete.ongoing_txn_producer_id) == (S.COMPLETE_COMMIT, -1)

    run(scenario())


def test_keep_at_an_exhausted_client_epoch_rotates_the_client_producer_id():
    async def scenario():
        log = FakeLog()
        pid, epoch = 7, MAX_PRODUCER_EPOCH - 2  # the last epoch a transaction may start at
        # A prepared transaction at that epoch, already kept once (client epoch MAX - 1).
        kept_once = TxnTransitMetadata(pid, -1, epoch + 1, -1, 60000, S.ONGOING, frozenset(PARTS), 1000, 1000,
                                       prepared_timestamp=1000, ongoing_txn_producer_id=pid,
                                       ongoing_txn_producer_epoch=epoch)
        log.write(0, txn_log.encode_batch("t", kept_once, 1000))
        h = Harness(log=log, first_pid=100)
        await h.elect()
        r = await h.coord.init_producer_id("t", 60000, keep_prepared_txn=True)
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, 100, 0)
        assert (r.ongoing_txn_producer_id, r.ongoing_txn_producer_epoch) == (pid, epoch)
        assert (await h.coord.end_txn("t", pid, epoch + 1, True)).error == E.INVALID_PRODUCER_ID_MAPPING
        end = await h.coord.end_txn("t", 100, 0, True)
        assert (end.error, end.producer_id, end.producer_epoch) == (E.NONE, 100, 1)
        await h.settle()
        # The markers end the transaction of the old PID, past its data's epoch.
        assert {(m.producer_epoch, m.committed) for m, _ in h.markers.written_for(pid)} == {(epoch + 1, True)}
        assert h.markers.written_for(100) == []
        md = h.md("t")
        assert (md.state, md.producer_id, md.producer_epoch, md.last_producer_id) == (S.COMPLETE_COMMIT, 100, 1, pid)

    run(scenario())


def test_records_written_before_the_kept_pair_existed_load_unchanged():
    # An Ongoing prepared record and a PrepareCommit batch as commit 5f0f6d9 wrote them.
    value = bytes.fromhex("10a71f18ffffffffffffffffff01200c280b30e0d4033801420b0a066f7264657273120100420d0a08"
                          "7061796d656e747312010148f4d395ffbc315080d095ffbc317090d395ffbc317802")
    t = txn_log.decode_value(value)
    assert (t.producer_id, t.producer_epoch, t.state, t.prepared_timestamp) == (4007, 12, S.ONGOING, 1700000000400)
    assert (t.ongoing_txn_producer_id, t.ongoing_txn_producer_epoch) == (-1, -1)
    assert t.marker_producer() == (4007, 12)
    assert txn_log.encode_value(t) == value  # a record without a kept transaction is written as before
    batch = bytes.fromhex("00000000000000000000006effffffff02d7e7e91f0000000000000000018bcfe56a580000018bcfe56a58"
                          "00000000000003840003ffffffff000000017800000002746a10a71f18ffffffffffffffffff01200d280c"
                          "30e0d4033802420b0a066f726465727312010048d8d495ffbc315080d095ffbc31780200")
    [entry], _ = txn_log.decode_fetched(batch)
    assert (entry.transactional_id, entry.transit.state, entry.transit.marker_producer()) == \
        ("t", S.PREPARE_COMMIT, (4007, 13))


def test_log_value_round_trip_of_the_kept_pair():
    t = TxnTransitMetadata(9, 7, 0, -1, 60000, S.ONGOING, frozenset(PARTS), 100, 200, prepared_timestamp=150,
                           ongoing_txn_producer_id=7, ongoing_txn_producer_epoch=32765)
    assert txn_log.decode_value(txn_log.encode_value(t)) == t
