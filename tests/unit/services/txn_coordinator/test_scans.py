"""The scans (scans.TxnScans): transaction timeouts and transactional.id expiration (design
doc "Coordinator-side Transaction Expiration", "Coordinator TransactionalId Expiration")."""
from __future__ import annotations

from txn_coordinator_fakes import Harness, run, txn_settings, replayed
from exactly_wire.error_codes import ErrorCode
from services.txn_coordinator.state import TxnState

S = TxnState
E = ErrorCode


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
