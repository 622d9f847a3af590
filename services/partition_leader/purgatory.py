"""Where partition-leader requests wait: Kafka's delayed-operation purgatory.

A request that cannot be answered at once parks here until something happens on one
of its partitions or its deadline passes:

- a Produce with acks=all (and a WriteTxnMarkers) waits for the high watermark to
  pass its batch (Kafka's DelayedProduce);
- a Fetch with fewer than `min_bytes` available waits for an append, a marker or a
  high-watermark move (Kafka's DelayedFetch);
- both wake when the ISR or the leadership of the partition changes, and re-check.

`ReplicaManager.append_records`, `write_markers` and `fetch_messages` hold the
waiting logic; this module only parks and wakes. `notify(tp)` completes every waiter
on `tp`. Deadlines are absolute times of the injected clock (seconds, the clock of
`ReplicaManager.monotonic_s`, by default `time.monotonic`, which is also the event
loop's clock). With `timers=True` (the service) each waiter schedules its own expiry
on the event loop; unit tests that move a manual clock pass `timers=False` and call
`expire_due()` after moving it.

Not thread-safe: the event loop of the partition leader owns it.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable, Iterable

from exactly_wire.types import TopicPartition


class Purgatory:
    """Waiters keyed by partition, completed by `notify` or by their deadline.

    clock: () -> seconds (monotonic); timers: schedule each deadline on the running
    event loop (False: only `expire_due()` expires waiters)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, timers: bool = True):
        self.clock = clock
        self.timers = timers
        self._waiters: dict[TopicPartition, set[asyncio.Future]] = {}
        self._deadlines: dict[asyncio.Future, float] = {}

    def __len__(self) -> int:
        """Number of parked requests."""
        return len(self._deadlines)

    def notify(self, tp: TopicPartition) -> None:
        """Something happened on `tp` (append, marker, high-watermark, ISR or
        leadership change): wake every request waiting on it."""
        for fut in self._waiters.pop(tuple(tp), ()):
            if not fut.done():
                fut.set_result(True)

    def expire_due(self) -> int:
        """Complete (with False) every waiter whose deadline passed; returns how many."""
        now = self.clock()
        due = [fut for fut, deadline in self._deadlines.items() if deadline <= now and not fut.done()]
        for fut in due:
            fut.set_result(False)
        return len(due)

    async def wait(self, tps: Iterable[TopicPartition], deadline: float) -> bool:
        """Park until one of `tps` is notified (True) or `deadline` (clock seconds)
        passes (False). Returns False at once when the deadline already passed."""
        remaining = deadline - self.clock()
        if remaining <= 0:
            return False
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        keys = [tuple(tp) for tp in tps]
        for tp in keys:
            self._waiters.setdefault(tp, set()).add(fut)
        self._deadlines[fut] = deadline
        timer = loop.call_later(remaining, _expire, fut) if self.timers else None
        try:
            return await fut
        finally:
            if timer is not None:
                timer.cancel()
            del self._deadlines[fut]
            for tp in keys:
                waiters = self._waiters.get(tp)
                if waiters is not None:
                    waiters.discard(fut)
                    if not waiters:
                        del self._waiters[tp]


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(False)
