"""Waiting for a condition of a real cluster, for the tests that run one
(tests/integration, tests/system).

Those tests drive real processes over gRPC and ZooKeeper: an election, a load, a
marker or a scrape happens in another process, and the test can only look again
until it did. `wait_for` is the one way they do so. (Unit tests never poll: they
drive an injected clock or await an event.)

pytest puts `tests/` on sys.path (rootdir conftest, prepend import mode), so every
test package imports it as `from waiting import wait_for`.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

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


__all__ = ["wait_for"]
