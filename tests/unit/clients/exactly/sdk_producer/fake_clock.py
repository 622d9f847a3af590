"""A virtual monotonic clock for the SDK's unit tests (exactly_wire.clock.MonotonicClock).

The thread that made the clock (the test's thread, which calls the SDK's blocking
methods) drives it: its `sleep(s)` moves time s at once (after a real pause of at most
`poll_s`, so other threads still get to run), and its timed `wait`s that nothing wakes
within `grace_s` real seconds move time to their deadline. Other threads (the producer's
sender, gRPC callbacks) never move time: their timed waits end when woken, or when the
driver moved time past their deadline (looked at every `poll_s` real seconds). So a
1 s max.block.ms wait takes about `grace_s` of real time, and the test can still read
the virtual time at which it ended. A driver's wait that is to succeed on real work done
by other threads (a flush or commit waiting for real answers) needs a `grace_s` longer
than that work can take on a loaded machine: use such a clock only for calls that are to
time out, or a large `grace_s`. Virtual time also runs on with real time (it is the
real monotonic clock plus the jumps), so a loop that ends by a deadline in real time
ends by it here too; and every wait of the driver takes at least `step_s` of virtual time
(a loop that waits on answers that come at once, as those of in-process fakes, still
reaches its deadline in few rounds). `runs=False` stops the real-time part: time then
moves only by `advance` and by the driver's sleeps and waits. Another thread's timed wait
on a threading.Condition waits in `poll_s` slices, and a notify that lands just as a slice
times out is lost (threading.Condition drops it then): a test that wakes such a waiter
with a single notify gives the clock a long `poll_s`.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
from typing import Callable, Iterable

from exactly_wire.clock import MonotonicClock, Waitable


class FakeClock(MonotonicClock):
    """Virtual monotonic time (see the module docstring). `start_s`: the first reading;
    `grace_s`: real seconds a driver's wait waits for a wake-up before it jumps to its
    deadline; `poll_s`: the real pause of a driver's sleep and the slice other threads
    wait in; `step_s`: virtual time a driver's wait that was woken takes at least;
    `runs=False`: no real-time part. Thread-safe."""

    def __init__(self, start_s: float = 1000.0, grace_s: float = 0.01, poll_s: float = 0.001,
                 step_s: float = 0.001, runs: bool = True):
        self._cond = threading.Condition()
        self._real: Callable[[], float] = time.monotonic if runs else (lambda: 0.0)
        self._offset = float(start_s) - self._real()
        self._driver = threading.get_ident()
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.step_s = step_s
        # Deadlines (virtual seconds, None: none) of the timed waits of other threads in progress.
        self.waiting: dict[int, float | None] = {}

    # ------------------------------------------------------------ reading and moving time

    def now_s(self) -> float:
        with self._cond:
            return self._real() + self._offset

    def __call__(self) -> int:
        return math.floor(self.now_s() * 1000 + 1e-6)  # ms; 1000.005 s is 1000005 ms

    def advance(self, seconds: float) -> None:
        """Move time `seconds` forward (any thread)."""
        with self._cond:
            self._offset += max(seconds, 0.0)
            self._cond.notify_all()

    def _advance_to(self, t: float) -> None:
        with self._cond:
            ahead = t - (self._real() + self._offset)
            if ahead > 0:
                self._offset += ahead
                self._cond.notify_all()

    def _driving(self) -> bool:
        return threading.get_ident() == self._driver

    # ------------------------------------------------------------ what the SDK calls

    def sleep(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        if self._driving():
            time.sleep(min(seconds, self.poll_s))
            self.advance(seconds)
            return
        deadline = self.now_s() + seconds
        with self._cond:
            while self._real() + self._offset < deadline:
                self._cond.wait(self.poll_s)

    async def sleep_async(self, seconds: float) -> None:
        await asyncio.sleep(min(max(seconds, 0.0), self.poll_s))
        self.advance(seconds)

    def wait(self, waitable: Waitable, timeout_s: float | None) -> bool:
        if timeout_s is None:
            return self._untimed(waitable)
        deadline = self.now_s() + max(timeout_s, 0.0)
        if self._driving():
            if waitable.wait(min(self.grace_s, max(timeout_s, 0.0))):
                self.advance(min(self.step_s, max(timeout_s, 0.0)))
                return True
            self._advance_to(deadline)
            return isinstance(waitable, threading.Event) and waitable.is_set()
        self._enter(deadline)
        try:
            while self.now_s() < deadline:
                if waitable.wait(self.poll_s):
                    return True
            return isinstance(waitable, threading.Event) and waitable.is_set()
        finally:
            self._leave()

    def _untimed(self, waitable: Waitable) -> bool:
        if self._driving():
            return waitable.wait()
        self._enter(None)
        try:
            return waitable.wait()
        finally:
            self._leave()

    def wait_futures(self, futures: Iterable[concurrent.futures.Future], timeout_s: float | None,
                     return_when: str = concurrent.futures.FIRST_COMPLETED):
        futures = list(futures)
        if timeout_s is None:
            return concurrent.futures.wait(futures, None, return_when)
        deadline = self.now_s() + max(timeout_s, 0.0)
        if self._driving():
            done, pending = concurrent.futures.wait(futures, min(self.grace_s, max(timeout_s, 0.0)), return_when)
            if _satisfied(done, pending, return_when):
                self.advance(min(self.step_s, max(timeout_s, 0.0)))
                return done, pending
            self._advance_to(deadline)
            return concurrent.futures.wait(futures, 0, return_when)
        while True:
            done, pending = concurrent.futures.wait(futures, self.poll_s, return_when)
            if _satisfied(done, pending, return_when) or self.now_s() >= deadline:
                return done, pending

    # ------------------------------------------------------------ for the tests

    def _enter(self, deadline: float | None) -> None:
        with self._cond:
            self.waiting[threading.get_ident()] = deadline
            self._cond.notify_all()

    def _leave(self) -> None:
        with self._cond:
            self.waiting.pop(threading.get_ident(), None)
            self._cond.notify_all()

    def wait_for_waiter(self, predicate: Callable[[float | None], bool], timeout_s: float = 5.0) -> bool:
        """Wait (real time, at most `timeout_s`) until another thread is in a timed wait
        whose deadline (virtual seconds, None: none) satisfies `predicate`."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while not any(predicate(d) for d in self.waiting.values()):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True


def _satisfied(done: set, pending: set, return_when: str) -> bool:
    if not pending:
        return True
    return bool(done) and return_when == concurrent.futures.FIRST_COMPLETED


def on_clock(client_cls: type, clock: MonotonicClock) -> type:
    """`client_cls` (Producer, Consumer: a class with `_make_core`) with its client core, and so
    everything the client owns, on `clock`."""
    make_core = client_cls._make_core

    class OnClock(client_cls):
        def _make_core(self, settings, transport=None):
            core = make_core(self, settings, transport)
            core.clock = clock
            return core

    OnClock.__name__ = client_cls.__name__
    return OnClock
