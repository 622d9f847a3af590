"""pytest plugin (`make unit-waits`): fail the run when a test waited on real time.

Recorded per test, while its body runs: asyncio event-loop timers of 20 ms or more
that fired, `time.sleep` and `asyncio.sleep` of 20 ms or more, and timed waits of
the test's own thread (`threading.Event.wait`, `threading.Condition.wait`) of 20 ms or
more that ran out. Each is judged by the time asked for, not by how late a loaded
machine let the thread run again (a 2 ms wait of a manual clock's grace that returned
after 200 ms on two busy cores is not a wait on real time). The unit tests run their timeouts, throttles, lingers and
backoffs on injected clocks and wait on events (docs/design.md, "Waits in unit
tests", "The SDK's clock"); this plugin shows that none is left. At the end it
prints each test that waited and makes the run fail.
"""
from __future__ import annotations

import asyncio
import asyncio.base_events
import threading
import time

import pytest

MIN_S = 0.02
_waits: dict[str, list[tuple[str, float]]] = {}
_current: dict[str, str | None] = {"test": None}


def _note(kind: str, seconds: float) -> None:
    test = _current["test"]
    if test is not None:
        _waits.setdefault(test, []).append((kind, round(seconds, 3)))


_real_sleep = time.sleep
_real_asleep = asyncio.sleep
_real_event_wait = threading.Event.wait
_real_cond_wait = threading.Condition.wait
_real_call_at = asyncio.base_events.BaseEventLoop.call_at


def _sleep(seconds):
    if seconds >= MIN_S:
        _note("time.sleep", seconds)
    return _real_sleep(seconds)


async def _asleep(delay, result=None):
    if delay >= MIN_S:
        _note("asyncio.sleep", delay)
    return await _real_asleep(delay, result)


def _ran_out(real, kind: str):
    """`real` (Event.wait or Condition.wait) noting a wait of the test's thread, of
    `MIN_S` or more, that ran out."""
    def wait(self, timeout=None):
        done = real(self, timeout)
        if not done and timeout is not None and timeout >= MIN_S and \
                threading.current_thread() is threading.main_thread():
            _note(kind, timeout)
        return done
    return wait


def _call_at(self, when, callback, *args, context=None):
    delay = when - self.time()
    test = _current["test"]
    if delay >= MIN_S and test is not None:
        def fired(*a):
            if _current["test"] == test:
                _note(f"event-loop timer fired ({getattr(callback, '__qualname__', callback)})", delay)
            return callback(*a)
        return _real_call_at(self, when, fired, *args, context=context)
    return _real_call_at(self, when, callback, *args, context=context)


def pytest_configure(config):
    time.sleep = _sleep
    asyncio.sleep = _asleep
    threading.Event.wait = _ran_out(_real_event_wait, "Event.wait ran out")
    threading.Condition.wait = _ran_out(_real_cond_wait, "Condition.wait ran out")
    asyncio.base_events.BaseEventLoop.call_at = _call_at


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _current["test"] = item.nodeid
    try:
        yield
    finally:
        _current["test"] = None


def pytest_terminal_summary(terminalreporter):
    if not _waits:
        terminalreporter.write_line(f"real waits: none of {MIN_S * 1000:.0f} ms or more")
        return
    for test, waits in sorted(_waits.items()):
        terminalreporter.write_line(f"real waits: {test}: {waits}")


def pytest_sessionfinish(session, exitstatus):
    if _waits and session.exitstatus == 0:
        session.exitstatus = 1
