"""`Completion`, the completion of one transactional.id's prepared transaction: its
task, the markers-written fact and the next adds waiting for it (the handover), and
when it leaves its partition's registry."""
from __future__ import annotations

import asyncio

from exactly_wire.error_codes import ErrorCode
from services.txn_coordinator.completion import Completion
from services.txn_coordinator.state import Guard, TransactionMetadata, TxnState

S = TxnState
NOW = 1_000_000


def _prepared(state: TxnState = S.PREPARE_COMMIT) -> TransactionMetadata:
    return TransactionMetadata("t", 7, producer_epoch=4, txn_timeout_ms=60000, state=state,
                               partitions=[("a", 0)], txn_start_timestamp=NOW, txn_last_update_timestamp=NOW)


def test_start_runs_one_task_and_the_registry_forgets_it_when_done():
    async def scenario():
        registry: dict[str, Completion] = {}
        gate = asyncio.Event()
        spawned = []

        def spawn() -> asyncio.Task:
            spawned.append(asyncio.create_task(gate.wait()))
            return spawned[-1]
        c = Completion.of(registry, "t")
        assert Completion.of(registry, "t") is c and registry == {"t": c}
        task = c.start(spawn)
        assert c.start(spawn) is task and len(spawned) == 1 and c.running and Completion.runs(registry, "t")
        gate.set()
        await task
        await asyncio.sleep(0)  # the done callback
        assert registry == {} and not c.running

    asyncio.run(scenario())


def test_markers_done_stops_for_the_handover_only_while_a_next_add_waits():
    async def scenario():
        registry: dict[str, Completion] = {}
        md = _prepared()
        prepared = md.snapshot()
        c = Completion.of(registry, "t")
        assert not c.markers_done(md, prepared)  # nobody waits: append the Complete record
        with c.next_add_waiting():
            assert c.waiting == 1
            assert c.markers_done(md, prepared) and c.markers_written == (7, 4)
        assert registry == {"t": c}  # the handover is due: kept
        transit = c.hand_over(md, frozenset({("b", 0)}), NOW + 1)
        assert transit.state is S.ONGOING and md._pending_guard is Guard.MARKERS_WRITTEN
        md.complete_transition(transit)
        c.handed_over()
        assert registry == {} and md.state is S.ONGOING

    asyncio.run(scenario())


def test_hand_over_refuses_until_the_markers_are_written():
    md = _prepared(S.PREPARE_ABORT)
    c = Completion("t", {})
    assert c.hand_over(md, frozenset({("b", 0)}), NOW) == ErrorCode.CONCURRENT_TRANSACTIONS
    c.markers_written = (7, 3)  # an earlier epoch's markers
    assert c.hand_over(md, frozenset({("b", 0)}), NOW) == ErrorCode.CONCURRENT_TRANSACTIONS
    assert md.pending_state is None


def test_resume_only_a_prepared_transaction_nobody_completes():
    md = _prepared()
    assert Completion.resume(None, md)
    c = Completion("t", {})
    assert Completion.resume(c, md)
    c.waiting = 1
    assert not Completion.resume(c, md)  # the waiting add takes over or resumes it
    c.waiting = 0
    assert not Completion.resume(c, _prepared(S.ONGOING))
