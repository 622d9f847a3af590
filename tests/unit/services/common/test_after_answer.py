"""services.common.after_answer: work deferred until a call's answer is written runs once,
after it, in the context it was deferred in; outside a marked call, at once."""
from __future__ import annotations

import asyncio
import contextvars
import logging

from services.common.after_answer import AfterAnswer, after_answer, answering

_WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


def test_outside_a_marked_call_the_work_runs_at_once():
    ran = []
    after_answer(lambda: ran.append(1))
    assert ran == [1]


def test_in_a_marked_call_the_work_waits_for_run_and_runs_once_in_order():
    async def call(ran: list) -> AfterAnswer:
        deferred = answering()
        after_answer(lambda: ran.append("first"))
        after_answer(lambda: ran.append("second"))
        assert ran == []
        return deferred

    ran: list[str] = []
    deferred = asyncio.run(call(ran))
    assert ran == []
    deferred.run()
    assert ran == ["first", "second"]
    deferred.run()
    assert ran == ["first", "second"]
    deferred.defer(lambda: ran.append("late"))  # after the answer: at once
    assert ran == ["first", "second", "late"]


def test_the_mark_is_the_tasks_own():
    async def main():
        ran = []

        async def marked():
            holder = answering()
            after_answer(lambda: ran.append("marked"))
            return holder

        holder = await asyncio.create_task(marked())
        after_answer(lambda: ran.append("unmarked"))  # this task was never marked
        assert ran == ["unmarked"]
        holder.run()
        assert ran == ["unmarked", "marked"]
    asyncio.run(main())


def test_deferred_work_runs_in_the_context_it_was_deferred_in_and_a_failure_spares_the_rest(caplog):
    seen = []
    deferred = AfterAnswer()

    def defer_as(who: str, fn) -> None:
        token = _WHO.set(who)
        try:
            deferred.defer(fn)
        finally:
            _WHO.reset(token)

    defer_as("producer-a", lambda: seen.append(_WHO.get()))
    defer_as("producer-b", lambda: 1 / 0)
    defer_as("producer-c", lambda: seen.append(_WHO.get()))
    with caplog.at_level(logging.ERROR, logger="services.common.after_answer"):
        deferred.run()
    assert seen == ["producer-a", "producer-c"]
    assert "work deferred until an answer was written failed" in caplog.text
    assert _WHO.get() == "nobody"
