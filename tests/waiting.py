"""Waiting for a condition of a real cluster, for the tests that run one
(tests/integration, tests/system).

Those tests drive real processes over gRPC and ZooKeeper: an election, a load, a
marker or a scrape happens in another process, and the test can only look again
until it did. `wait_for` is the one way they do so. Unit tests drive an injected
clock or await an event; where an in-process asyncio component finishes its work on
its own tasks (a tailer applying a record, a health watcher), they await the
condition with `wait_for_async`, the same helper for one event loop. Nobody sleeps a
fixed time and then asserts.

pytest puts `tests/` on sys.path (rootdir conftest, prepend import mode), so every
test package imports it as `from waiting import wait_for`.
"""
from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float, what: str | Callable[[], str],
             interval_s: float = 0.1) -> T:
    """Call `predicate()` every `interval_s` seconds until it returns a truthy value,
    and return that value.

    timeout_s: seconds after the first call at which to give up; the predicate is
    called once more at or after that moment before failing.
    what: what is awaited, for the failure message ("the LSO to reach 10"); a
    callable is called only on failure, so the message can show the last state seen.
    Raises AssertionError ("timed out after N s waiting for <what>") on timeout;
    exceptions of the predicate propagate.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            description = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {description}")
        time.sleep(interval_s)


async def wait_for_async(predicate: Callable[[], T | Awaitable[T]], timeout_s: float,
                         what: str | Callable[[], str], interval_s: float = 0.005) -> T:
    """`wait_for` inside a running event loop: evaluate `predicate()` (a plain or an
    async callable) until it returns a truthy value, yielding to the loop for
    `interval_s` seconds in between, so the tasks being waited for run. Returns the
    value; raises AssertionError on timeout (`timeout_s`, seconds of loop time)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            description = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {description}")
        await asyncio.sleep(interval_s)


__all__ = ["wait_for", "wait_for_async"]
