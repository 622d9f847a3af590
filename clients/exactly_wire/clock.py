"""The two clocks of Exactly, in integer milliseconds; one definition each.

- `wall_clock_ms()`: milliseconds since the Unix epoch. For what is stored or sent:
  record timestamps, transaction start and last-update timestamps in the transaction
  log, producer-state timestamps (they survive restarts and move between hosts, so
  they may step backwards; code comparing them tolerates that).
- `monotonic_ms()`: a clock that never steps backwards, with an arbitrary origin.
  For timers inside one process: linger, backoff, session and rebalance timeouts,
  request deadlines, leases.

Domain objects take a clock as an argument (`clock: Callable[[], int] = monotonic_ms`
or `wall_clock_ms`) so unit tests drive time by hand.

`MonotonicClock` is the monotonic clock of an SDK client as one object: now (ms when
called, so it is a `Clock`; seconds from `now_s`), `sleep`, and timed waits on an
event, a condition or futures. A client and everything it owns (accumulator, sender,
transaction flows, fetcher, group membership, call deadlines and retry backoff) read
time and block through the client core's one clock object; `SYSTEM_CLOCK`, the real
one, is the default, and unit tests substitute a fake whose time moves when the code
sleeps or waits.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Callable, Iterable, Union

Clock = Callable[[], int]


def wall_clock_ms() -> int:
    """Milliseconds since the Unix epoch (time.time_ns, truncated)."""
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    """Milliseconds of a monotonic clock with an arbitrary origin (time.monotonic_ns)."""
    return time.monotonic_ns() // 1_000_000


Waitable = Union[threading.Event, threading.Condition]


class MonotonicClock:
    """The process's monotonic clock: `clock()` -> ms (int), `now_s()` -> seconds
    (float), `sleep(seconds)`, and timed waits. Subclasses (test fakes) replace all of
    them together, so a deadline computed from `now_s()` and a `wait` that ends at it
    agree."""

    def __call__(self) -> int:
        """Milliseconds, as `monotonic_ms()`."""
        return monotonic_ms()

    def now_s(self) -> float:
        """Seconds (time.monotonic()); deadlines of blocking calls are in these."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for `seconds` (negative: not at all)."""
        time.sleep(max(seconds, 0.0))

    async def sleep_async(self, seconds: float) -> None:
        """`asyncio.sleep(seconds)`: the event loop's sleep, for asyncio clients."""
        await asyncio.sleep(max(seconds, 0.0))

    def wait(self, waitable: Waitable, timeout_s: float | None) -> bool:
        """`waitable.wait(timeout_s)`: a threading.Event (returns whether it is set) or a
        threading.Condition whose lock the caller holds (returns False on timeout).
        `timeout_s` in seconds, None: no limit."""
        return waitable.wait(timeout_s)

    def wait_futures(self, futures: Iterable[concurrent.futures.Future], timeout_s: float | None,
                     return_when: str = concurrent.futures.FIRST_COMPLETED
                     ) -> tuple[set[concurrent.futures.Future], set[concurrent.futures.Future]]:
        """`concurrent.futures.wait(futures, timeout_s, return_when)`: (done, not done)."""
        return concurrent.futures.wait(futures, timeout=timeout_s, return_when=return_when)


SYSTEM_CLOCK = MonotonicClock()


__all__ = ["Clock", "MonotonicClock", "SYSTEM_CLOCK", "Waitable", "wall_clock_ms", "monotonic_ms"]
