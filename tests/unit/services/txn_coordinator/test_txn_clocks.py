"""The transaction coordinator's durations count on its monotonic clock; its wall
clock, stepped forwards or backwards (an NTP step, a host with a wrong clock), only
stamps what goes into the transaction log (docs/design.md, "Clocks")."""
from __future__ import annotations

import pytest
from txn_coordinator_fakes import FakeLog, Harness, run, txn_settings

from exactly_wire.error_codes import ErrorCode
from services.common.protocol import marker_coordinator_wait_ms
from services.txn_coordinator.ports import TxnMarker
from services.txn_coordinator import txn_log
from services.txn_coordinator.state import TxnState, TxnTransitMetadata

S = TxnState
TEN_MINUTES_MS = 600_000


@pytest.mark.parametrize("step_ms", [TEN_MINUTES_MS, -TEN_MINUTES_MS])
def test_wall_clock_step_neither_expires_nor_holds_a_transaction(step_ms):
    async def scenario():
        h = Harness(split_clocks=True)
        await h.elect()
        await h.begin("t", timeout_ms=60_000)
        h.wall.advance(step_ms)
        assert await h.coord.scans.abort_timed_out_transactions() == 0  # forwards: not early
        h.clock.advance(60_000)
        assert await h.coord.scans.abort_timed_out_transactions() == 0
        h.clock.advance(1)
        assert await h.coord.scans.abort_timed_out_transactions() == 1  # backwards: not late
        await h.settle()
        assert h.md("t").state is S.COMPLETE_ABORT

    run(scenario())


def test_next_transaction_restarts_the_timeout_whatever_the_wall_clock():
    async def scenario():
        h = Harness(split_clocks=True)
        await h.elect()
        pid, epoch = await h.begin("t", timeout_ms=1000)
        ended = await h.coord.end_txn("t", pid, epoch, True)
        assert ended.error == ErrorCode.NONE
        pid, epoch = ended.producer_id, ended.producer_epoch
        await h.settle()
        h.clock.advance(5000)
        h.wall.advance(-TEN_MINUTES_MS)  # the next transaction starts "before" the last one
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 1)])
        assert set(res.values()) == {ErrorCode.NONE}
        h.clock.advance(1000)
        assert await h.coord.scans.abort_timed_out_transactions() == 0
        h.clock.advance(1)
        assert await h.coord.scans.abort_timed_out_transactions() == 1

    run(scenario())


@pytest.mark.parametrize("ahead_ms", [3_600_001, 10 * 86_400_000], ids=["an-hour", "ten-days"])
def test_a_new_owner_whose_clock_is_ahead_does_not_abort_a_prepared_transaction(ahead_ms):
    """A coordinator takes over a `__transaction_state` partition with its wall clock
    far ahead of the previous owner's (an hour: the former transaction.prepared.max.ms
    default): the prepared transaction it loads looks that old, and it must not abort
    it -- the database may have committed it. The application's recovery still
    decides it."""
    async def scenario():
        log = FakeLog()
        first = Harness(log=log, split_clocks=True)
        await first.elect(0, 1)
        pid, epoch = await first.begin("t", timeout_ms=60_000)
        assert await first.coord.prepare_txn("t", pid, epoch) == ErrorCode.NONE
        second = Harness(log=log, split_clocks=True)
        second.wall.set_ms(first.wall() + ahead_ms)
        await second.elect(0, 2)
        for _ in range(3):
            assert await second.coord.scans.abort_timed_out_transactions() == 0
            second.clock.advance(ahead_ms)
        await second.settle()
        assert second.md("t").is_prepared and second.markers.written == []
        assert second.coord.oldest_prepared_age_ms() == 4 * ahead_ms  # what the alert sees: its age at the load on
        kept = await second.coord.init_producer_id("t", 60_000, keep_prepared_txn=True)
        assert (kept.ongoing_txn_producer_id, kept.ongoing_txn_producer_epoch) == (pid, epoch)
        assert (await second.coord.end_txn("t", pid, kept.producer_epoch, True)).error == ErrorCode.NONE
        await second.settle()
        assert second.md("t").state is S.COMPLETE_COMMIT
        assert {m.committed for m, _ in second.markers.written_for(pid)} == {True}

    run(scenario())


def test_forward_step_expires_no_transactional_id_in_use():
    async def scenario():
        h = Harness(txn_settings({"transactional.id.expiration.ms": 60_000}),
                    split_clocks=True)
        await h.elect()
        await h.coord.init_producer_id("idle", 60_000)
        h.wall.advance(TEN_MINUTES_MS)
        assert await h.coord.scans.expire_transactional_ids() == 0
        assert h.md("idle") is not None
        h.clock.advance(60_000)  # idle that long for real: expires
        assert await h.coord.scans.expire_transactional_ids() == 1
        assert h.md("idle") is None

    run(scenario())


def test_marker_deadline_is_not_lengthened_by_a_backward_step():
    """_outlive_unanswered_markers waits marker_coordinator_wait_ms() of the monotonic
    clock, not until the wall clock has caught up again."""
    slept_ms = []

    async def scenario():
        async def sleep(seconds: float) -> None:
            if not slept_ms:
                h.wall.advance(-TEN_MINUTES_MS)
            slept_ms.append(seconds * 1000)
            h.clock.advance(int(seconds * 1000))
            h.wall.advance(int(seconds * 1000))

        h = Harness(split_clocks=True, sleep=sleep)
        await h.elect()
        pid, epoch = await h.begin("t")
        part = h.coord.partitions.get(0)
        marker = TxnMarker(pid, epoch, True, 1, frozenset({("orders", 0)}), transaction_version=1)
        await h.coord.completions._outlive_unanswered_markers(part, h.md("t"), marker)

    run(scenario())
    assert sum(slept_ms) == pytest.approx(marker_coordinator_wait_ms(), abs=2)


def test_owner_whose_clock_is_behind_does_not_hold_a_loaded_transaction():
    """The previous owner's wall clock was 10 minutes ahead of the new owner's: the
    transaction's start is in the new owner's future. It still ends after its
    timeout (from the load), not 10 minutes later."""
    async def scenario():
        log = FakeLog()
        h = Harness(log=log, split_clocks=True)
        start = h.wall() + TEN_MINUTES_MS
        log.write(0, txn_log.encode_batch("t", TxnTransitMetadata(
            42, -1, 3, -1, 60_000, S.ONGOING, frozenset({("orders", 0)}), start, start), start))
        await h.elect()
        h.clock.advance(60_000)
        h.wall.advance(60_000)
        assert await h.coord.scans.abort_timed_out_transactions() == 0
        h.clock.advance(1)
        h.wall.advance(1)
        assert await h.coord.scans.abort_timed_out_transactions() == 1

    run(scenario())
