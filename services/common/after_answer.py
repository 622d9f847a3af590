"""Work a request starts that need not go before its answer
(docs/design/transaction-path-cost.md, "Turns of the loop").

A transaction coordinator's EndTxn appends the Prepare record, answers the producer
and starts the markers (docs/design/decisions.md, "Transactions": the answer once the
Prepare record is in the log, as Kafka's coordinator answers, where the KIP-98 design
document's "Transaction Coordinator Request Handling" answers after the markers). The
markers need not go first: the producer waits for the answer, not for them. On a link,
a reply is written two turns of the event loop after its handler returned (the reply
queue, then the stream's writer), and the completion's task, started as the Prepare
record was applied, ran its first step before that and held the answer: a lone SDK
producer's EndTxn took 1.42-1.72 ms p50, 1.06-1.16 ms with the answer first.

A transport that writes an answer in a later turn than its handler returns in marks
each call: `answering()` in the task that runs the handler, and `AfterAnswer.run()` as
the answer goes to the writer, in the turn that writes it, or once the call ended
without one (cancelled, its stream gone). `after_answer(fn)` defers `fn` until then,
in the context it was deferred in; outside such a call it runs `fn` at once: a direct
gRPC call, the Kafka port (it writes the answer in the turn its handler returns in), a
unit test. `fn` should only start work (a task): the tasks it starts run after the
write, and nothing waits for the peer to read the answer.
"""
from __future__ import annotations

import contextvars
import logging
from typing import Callable

log = logging.getLogger(__name__)


class AfterAnswer:
    """The work deferred until one call's answer is written; `run()` runs it once
    (later `defer` calls run at once)."""

    __slots__ = ("_deferred", "_ran")

    def __init__(self) -> None:
        self._deferred: list[tuple[contextvars.Context, Callable[[], None]]] = []
        self._ran = False

    def defer(self, fn: Callable[[], None]) -> None:
        """Run `fn` (no arguments) when `run()` is called, in the current context;
        at once when it was."""
        if self._ran:
            fn()
        else:
            self._deferred.append((contextvars.copy_context(), fn))

    def run(self) -> None:
        """Run the deferred work, in the order it was deferred; one that raises is
        logged and the rest run. Idempotent."""
        self._ran = True
        deferred, self._deferred = self._deferred, []
        for context, fn in deferred:
            try:
                context.run(fn)
            except Exception:  # noqa: BLE001 - the answer is gone; the rest must run
                log.exception("work deferred until an answer was written failed")


_CURRENT: contextvars.ContextVar[AfterAnswer | None] = contextvars.ContextVar("after_answer", default=None)


def answering() -> AfterAnswer:
    """Mark the call the current task handles: `after_answer` defers until the
    returned AfterAnswer's `run()`, which the transport must call on every path (the
    answer written, the call failed or cancelled). Call it in a task of the call's own
    (the mark is the task's context)."""
    holder = AfterAnswer()
    _CURRENT.set(holder)
    return holder


def after_answer(fn: Callable[[], None]) -> None:
    """Run `fn` (no arguments) as the answer of the call being handled goes to its
    writer, or at once outside a marked call (module docstring)."""
    holder = _CURRENT.get()
    if holder is None:
        fn()
    else:
        holder.defer(fn)
