"""`MockTime`: a clock that moves only when told (Kafka's `MockTime`), for the tests of an
application and the project's own: `MockCluster(clock=...)`, a client's core, and the
services' domain objects, which take a clock as an argument.

Reading it: `time()` is milliseconds (an int, as every clock of the project,
`exactly_wire.clock.Clock`), `now_ms()` the exact milliseconds, `now_s()` seconds. Moving
it: `advance(ms)` (negative steps it back, as a wall clock may step) and `set_ms(ms)`.

Waiting on it, the thread that made it (the test's, which calls the SDK's blocking methods;
the "driver") moves time itself: its `sleep(s)` moves time s at once (after a real pause of at
most `poll_s`, so other threads still get to run), and its timed `wait`s that nothing wakes
within `grace_s` real seconds move time to their deadline. Other threads (a producer's sender,
the cluster's timer) never move time: their timed waits end when woken, or when the driver
moved time past their deadline (looked at every `poll_s` real seconds). So a 1 s max.block.ms
wait takes about `grace_s` of real time, and the test reads the time at which it ended. A
driver's wait that is to succeed on real work done by other threads needs a `grace_s` longer
than that work can take on a loaded machine. Every wait of the driver that was woken takes at
least `step_s` of time, so a loop waiting on answers that come at once reaches its deadline in
few rounds. `runs=True` lets time also run on with real time (a loop that ends by a deadline
in real time ends by it here too). Another thread's timed wait on a threading.Condition waits
in `poll_s` slices, and a notify that lands just as a slice times out is lost (threading.Condition
drops it then): a test that wakes such a waiter with a single notify gives the clock a long
`poll_s`.

In an event loop: `await sleep_async(s)` moves time s and yields once (the sleeper moves
time, as Kafka's MockTime.sleep); `await wait_async(s)` waits until the test moved time s on
(a service's background loop that must not move time by itself), `sleeping` being set while
such a wait is pending.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
from typing import Callable, Iterable

from exactly_wire.clock import MonotonicClock, Waitable


class MockTime(MonotonicClock):
    """A manual monotonic clock (see the module docstring). `start_ms`: the first reading;
    `grace_s`: real seconds a driver's wait waits for a wake-up before it jumps to its
    deadline; `poll_s`: the real pause of a driver's sleep and the slice other threads wait
    in; `step_s`: time a driver's wait that was woken takes at least; `runs`: time also runs
    with real time; `auto_tick_ms`: each reading moves time that much on after it (Kafka's
    MockTime autoTickMs: code that polls a clock without sleeping still sees time pass).
    Thread-safe."""

    def __init__(self, start_ms: float = 1_000_000.0, *, grace_s: float = 0.01, poll_s: float = 0.001,
                 step_s: float = 0.001, runs: bool = False, auto_tick_ms: float = 0.0):
        self._cond = threading.Condition()
        self._real_ms: Callable[[], float] = (lambda: time.monotonic() * 1000.0) if runs else (lambda: 0.0)
        self._offset_ms = float(start_ms) - self._real_ms()
        self._driver = threading.get_ident()
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.step_s = step_s
        self.auto_tick_ms = auto_tick_ms
        # Deadlines (seconds, None: none) of the timed waits of other threads in progress.
        self.waiting: dict[int, float | None] = {}
        self._timers: list[tuple[float, asyncio.Event]] = []  # (deadline ms, woken) of wait_async
        self.sleeping = asyncio.Event()  # set while a wait_async waits for the test to move time

    # ------------------------------------------------------------ reading and moving time

    def now_ms(self) -> float:
        """Milliseconds, exactly (then time moves `auto_tick_ms` on)."""
        with self._cond:
            now = self._real_ms() + self._offset_ms
            self._offset_ms += self.auto_tick_ms
            return now

    def _read_ms(self) -> float:
        with self._cond:
            return self._real_ms() + self._offset_ms

    def _read_s(self) -> float:
        return self._read_ms() / 1000.0

    def __call__(self) -> int:
        return math.floor(self.now_ms() + 1e-9)

    def now_s(self) -> float:
        return self.now_ms() / 1000.0

    def advance(self, ms: float) -> None:
        """Move time `ms` milliseconds on (any thread; negative: back)."""
        with self._cond:
            self._offset_ms += ms
            self._cond.notify_all()
        self._wake_timers()

    def set_ms(self, ms: float) -> None:
        """Make the time `ms` milliseconds (a wall clock set, forwards or backwards)."""
        self.advance(ms - self._read_ms())

    def _advance_to_s(self, deadline_s: float) -> None:
        with self._cond:
            ahead = deadline_s * 1000.0 - (self._real_ms() + self._offset_ms)
            if ahead > 0:
                self._offset_ms += ahead
                self._cond.notify_all()
        self._wake_timers()

    def _driving(self) -> bool:
        return threading.get_ident() == self._driver

    # ------------------------------------------------------------ blocking waits (MonotonicClock)

    def sleep(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        if self._driving():
            time.sleep(min(seconds, self.poll_s))
            self.advance(seconds * 1000.0)
            return
        deadline = self._read_s() + seconds
        with self._cond:
            while self._read_s() < deadline:
                self._cond.wait(self.poll_s)

    def wait(self, waitable: Waitable, timeout_s: float | None) -> bool:
        if timeout_s is None:
            return self._untimed(waitable)
        deadline = self._read_s() + max(timeout_s, 0.0)
        if self._driving():
            if waitable.wait(min(self.grace_s, max(timeout_s, 0.0))):
                self.advance(min(self.step_s, max(timeout_s, 0.0)) * 1000.0)
                return True
            self._advance_to_s(deadline)
            return isinstance(waitable, threading.Event) and waitable.is_set()
        self._enter(deadline)
        try:
            while self._read_s() < deadline:
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
        deadline = self._read_s() + max(timeout_s, 0.0)
        if self._driving():
            done, pending = concurrent.futures.wait(futures, min(self.grace_s, max(timeout_s, 0.0)), return_when)
            if _satisfied(done, pending, return_when):
                self.advance(min(self.step_s, max(timeout_s, 0.0)) * 1000.0)
                return done, pending
            self._advance_to_s(deadline)
            return concurrent.futures.wait(futures, 0, return_when)
        while True:
            done, pending = concurrent.futures.wait(futures, self.poll_s, return_when)
            if _satisfied(done, pending, return_when) or self._read_s() >= deadline:
                return done, pending

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
        whose deadline (seconds, None: none) satisfies `predicate`."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while not any(predicate(d) for d in self.waiting.values()):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    # ------------------------------------------------------------ in an event loop

    async def sleep_async(self, seconds: float) -> None:
        """Move time `seconds` on, then yield to the event loop once."""
        self.advance(max(seconds, 0.0) * 1000.0)
        await asyncio.sleep(0)

    async def wait_async(self, seconds: float) -> None:
        """Wait until the test moved time `seconds` on (this clock's time never moves by
        itself); `sleeping` is set meanwhile."""
        # rounded to a nanosecond: 0.1 s is 100 ms, not 100.00000000000001
        timer = (self._read_ms() + round(max(seconds, 0.0) * 1000.0, 6), asyncio.Event())
        if timer[0] <= self._read_ms():
            await asyncio.sleep(0)
            return
        self._timers.append(timer)
        self.sleeping.set()
        try:
            await timer[1].wait()
        finally:
            self._timers.remove(timer)
            if not self._timers:
                self.sleeping.clear()

    def _wake_timers(self) -> None:
        now = self._read_ms()
        for deadline, woken in list(self._timers):
            if deadline <= now:
                woken.set()


def _satisfied(done: set, pending: set, return_when: str) -> bool:
    if not pending:
        return True
    return bool(done) and return_when == concurrent.futures.FIRST_COMPLETED


__all__ = ["MockTime"]
