"""Coroutines started at once: Python 3.12's eager tasks, for the write paths.

A job handed to `asyncio.create_task` or `asyncio.gather` does its first step only on
the next turn of the event loop, and whoever awaits it resumes one turn after it ended
(two, through `asyncio.shield` or a gather). On a busy loop a turn is a whole round of
every other connection's work, so a commit whose appends and markers each cross a few
of them waits for those rounds, not for its own work (docs/design.md, "Turns of the
loop"). Most of those jobs never wait at all: a coordinator's append to the log it
leads, a marker on a partition led here with one replica in sync, answer as soon as
they ran.

`start(coro)` runs `coro` at once, in a task of its own as far as asyncio can tell (the
current task and the context variables are the task's during that first step, as an
eager task's are: `asyncio.timeout`, `current_task` and context variables behave as in
a task created the usual way), up to its first suspension; the task runs the rest. Its
`outcome` is the coroutine's result or exception, set the moment the coroutine ends,
done at once when it ended in that first step; cancelling `outcome` (e.g. its awaiter
was cancelled) does not touch the task, as `asyncio.shield` promises. `gather(coros)`
is `asyncio.gather` of `start`s: the results in order, the first exception raised
(once every job ended), and cancelling the caller cancels the jobs that still run.

Python 3.12 has this as `asyncio.eager_task_factory`; the project runs on 3.11, whose
asyncio offers the same pieces (`asyncio.tasks._enter_task` / `_leave_task`, the
functions a task's own step uses to become the current task).
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
from asyncio import tasks as _tasks
from typing import Any, Callable, Coroutine, Iterable

log = logging.getLogger(__name__)

__all__ = ["Started", "gather", "start"]


class Started:
    """A coroutine started by `start`: `outcome`, a future of its result or exception
    (done at once when it ended without suspending), and `task`, the asyncio.Task that
    runs the rest (it ends with the coroutine's result; cancelling it cancels the
    coroutine). The coroutine has ended once `outcome` is done; its task ends up to a
    turn later, so "does it still run" is `not outcome.done()`, not `task.done()`."""

    __slots__ = ("outcome", "task", "_coro", "_yielded", "_ended", "_result", "_error")

    def __init__(self, coro: Coroutine, outcome: asyncio.Future):
        self._coro = coro
        self.outcome = outcome
        self.task: asyncio.Task | None = None
        self._yielded: Any = None
        self._ended = False
        self._result: Any = None
        self._error: BaseException | None = None

    def _step(self, value: Any = None, exc: BaseException | None = None) -> bool:
        """One step of the coroutine, as Task.__step does it; True when it ended (the
        outcome is then set, unless cancelled meanwhile)."""
        try:
            self._yielded = self._coro.throw(exc) if exc is not None else self._coro.send(value)
        except StopIteration as stop:
            self._end(stop.value, None)
            return True
        except (KeyboardInterrupt, SystemExit) as error:
            self._end(None, error)
            raise  # as a task's step does: these stop the loop
        except BaseException as error:  # noqa: BLE001 - the coroutine's own outcome, handed on
            self._end(None, error)
            return True
        return False

    def _end(self, result: Any, error: BaseException | None) -> None:
        self._ended = True
        self._yielded = None
        self._result, self._error = result, error
        outcome = self.outcome
        if outcome.done():  # cancelled by its awaiter: nobody wants it
            return
        if error is None:
            outcome.set_result(result)
        elif isinstance(error, asyncio.CancelledError):
            outcome.cancel()
        else:
            outcome.set_exception(error)
            outcome.exception()  # retrieved: an awaiter that went away leaves no "never retrieved" log

    async def _rest(self) -> Any:
        """The task's body: the coroutine from its first suspension to its end."""
        first = True
        while not self._ended:
            yielded, first_turn, first = self._yielded, first, False
            try:
                if yielded is None:  # a bare yield (asyncio.sleep(0)): one turn
                    if not first_turn:  # the task's first step is already a turn later
                        await asyncio.sleep(0)
                elif getattr(yielded, "_asyncio_future_blocking", None) is not None:
                    yielded._asyncio_future_blocking = False
                    await yielded
                else:
                    raise RuntimeError(f"a coroutine started eagerly yielded {yielded!r}, not a future")
            except BaseException as exc:  # noqa: BLE001 - into the coroutine, as a task would
                self._step(exc=exc)
            else:
                self._step()
        return self.value()

    def value(self) -> Any:
        """The ended coroutine's result; raises its exception (CancelledError when it
        was cancelled), whatever became of `outcome`."""
        if self._error is not None:
            raise self._error
        return self._result

    def _task_done(self, task: asyncio.Task) -> None:
        if not self._ended:
            # Cancelled before its first turn: the coroutine, suspended in its first
            # step, learns it as it would have in a task of its own (what it waits on
            # is cancelled, then it gets CancelledError).
            waited = self._yielded
            if waited is not None and hasattr(waited, "cancel"):
                waited.cancel()
            try:
                if not self._step(exc=asyncio.CancelledError()):
                    self._coro.close()
                    self._end(None, asyncio.CancelledError())
            except RuntimeError:
                log.exception("a coroutine started eagerly ignored its cancellation")
        if not task.cancelled():
            task.exception()  # retrieved: the outcome carries it to whoever awaits


def start(coro: Coroutine, name: str | None = None,
          spawn: Callable[[Coroutine, str | None, contextvars.Context], asyncio.Task] | None = None) -> Started:
    """Run `coro` now up to its first suspension, as the first step of a new task
    (module docstring), and the rest in that task. `spawn(coro, name, context)` makes
    the task (default: the running loop's create_task). Returns the `Started`: await
    its `outcome` for the result (one turn of the loop after the coroutine ended, none
    when it ended at once); cancel its `task` to cancel the coroutine. Must be called
    with a running loop."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    started = Started(coro, loop.create_future())
    rest = started._rest()
    task = spawn(rest, name, context) if spawn is not None else loop.create_task(rest, name=name, context=context)
    started.task = task
    caller = _tasks.current_task(loop)
    if caller is not None:
        _tasks._leave_task(loop, caller)
    _tasks._enter_task(loop, task)
    try:
        context.run(started._step)
    finally:
        _tasks._leave_task(loop, task)
        if caller is not None:
            _tasks._enter_task(loop, caller)
    task.add_done_callback(started._task_done)
    return started


async def gather(coros: Iterable[Coroutine]) -> list[Any]:
    """asyncio.gather(*coros) with each coroutine `start`ed: their results in order.
    Raises the first exception (in the order of the coroutines) once every one ended;
    cancelling the caller cancels the ones still running."""
    started = [start(c) for c in coros]
    me = asyncio.current_task()
    for s in started:
        if s.outcome.done():
            continue
        try:
            await s.outcome  # one turn after it ended
        except asyncio.CancelledError:
            if me is not None and me.cancelling():  # the caller's, not the job's own
                for other in started:
                    if not other.task.done():
                        other.task.cancel()
                raise
        except Exception:  # noqa: BLE001 - raised below, in the coroutines' order
            pass
    return [s.value() for s in started]
