"""`Completion`, the completion of one transactional.id's prepared transaction: its
task and the next adds waiting for it (the handover), the markers-written fact it
records on the metadata, and when it leaves its partition's registry."""
from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from services.txn_coordinator.completion import Completion
from services.txn_coordinator.state import Guard, GuardNotHeldError, TransactionMetadata, TxnState

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


def test_markers_done_records_the_fact_on_the_metadata_only_while_a_next_add_waits():
    async def scenario():
        registry: dict[str, Completion] = {}
        md = _prepared()
        prepared = md.snapshot()
        c = Completion.of(registry, "t")
        assert not c.markers_done(md, prepared) and not md.markers_written  # nobody waits: append Complete
        with c.next_add_waiting():
            assert c.waiting == 1
            assert c.markers_done(md, prepared) and md.markers_written
        assert registry == {}  # nothing runs, nobody waits: the fact lives on the metadata
        transit = md.prepare_next_transaction(frozenset({("b", 0)}), NOW + 1)
        assert transit.state is S.ONGOING and md._pending_guard is Guard.MARKERS_WRITTEN
        md.complete_transition(transit)
        assert md.state is S.ONGOING and not md.markers_written  # forgotten by the transition

    asyncio.run(scenario())


def test_markers_done_records_nothing_for_another_transaction():
    md = _prepared(S.PREPARE_ABORT)
    c = Completion("t", {})
    c.waiting = 1
    earlier = replace(md.snapshot(), producer_epoch=3)  # an earlier epoch's markers
    assert not c.markers_done(md, earlier) and not md.markers_written
    with pytest.raises(GuardNotHeldError):
        md.prepare_next_transaction(frozenset({("b", 0)}), NOW)
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
