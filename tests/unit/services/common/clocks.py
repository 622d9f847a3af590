"""A manual monotonic clock for the unit tests of services.common: seconds that move
only when the code under test sleeps on it."""
from __future__ import annotations

import asyncio


class SleepClock:
    """`clock()`: seconds; `await clock.sleep(s)` moves the clock s ahead and returns
    after one turn of the event loop, so a wait on it takes no real time."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)
        await asyncio.sleep(0)
