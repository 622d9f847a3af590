"""Where partition-leader requests wait: Kafka's delayed-operation purgatory.

A request that cannot be answered at once parks here until something happens on one
of its partitions or its deadline passes:

- a Produce with acks=all (and a WriteTxnMarkers) waits for the high watermark to
  pass its batch (Kafka's DelayedProduce);
- a Fetch with fewer than `min_bytes` available waits for an append, a marker or a
  high-watermark move (Kafka's DelayedFetch);
- both wake when the ISR or the leadership of the partition changes, and re-check.

`ReplicaManager.append_records`, `write_markers` and `fetch_messages` hold the
waiting logic; this module only parks and wakes.

Waiters are woken by partition and offset, not all at once (docs/design.md, "Tunnel
and fetch limits"): a waiter watches a partition either for any event (a plain
`TopicPartition`) or for one of its positions passing an offset (`Watch`: a
consumer at offset X for the high watermark, or the last stable offset under
read_committed, to pass X; a follower for the log end offset; a delayed produce for
the high watermark to pass its batch). `notify(tp, positions)` after an append, a
marker or a high-watermark move wakes only the watches whose offset the new
positions pass (a heap per partition and position, so the cost is the woken
waiters', not the parked ones'); `notify(tp)` without positions (ISR or leadership
change, DeleteRecords) wakes every waiter on `tp`. `wait(..., owner=...)` counts
the parked waits of an owner (a principal or a connection) and parks no more than
`max_parked_per_owner` of them: beyond that it returns False at once, as at the
deadline, and the Fetch is answered with what there is. Deadlines are absolute times of the injected clock (seconds, the clock of
`ReplicaManager.monotonic_s`, by default `time.monotonic`, which is also the event
loop's clock). With `timers=True` (the service) each waiter schedules its own expiry
on the event loop; unit tests that move a manual clock pass `timers=False` and call
`expire_due()` after moving it.

Not thread-safe: the event loop of the partition leader owns it.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Callable, Hashable, Iterable, Mapping, NamedTuple

from exactly_wire.types import TopicPartition

# The positions of a partition a Watch may wait on: offsets ...
LOG_END = "log_end"
HIGH_WATERMARK = "high_watermark"
LAST_STABLE = "last_stable"
# ... and byte positions (byte_marks.ByteMarks: bytes appended to the replica up to the
# offset), for a consumer fetch waiting for min_bytes: it watches the byte position
# passing the one where it parked plus what it still needs, minus one.
LOG_END_BYTES = "log_end_bytes"
HIGH_WATERMARK_BYTES = "high_watermark_bytes"
LAST_STABLE_BYTES = "last_stable_bytes"
BYTES_OF = {LOG_END: LOG_END_BYTES, HIGH_WATERMARK: HIGH_WATERMARK_BYTES, LAST_STABLE: LAST_STABLE_BYTES}


class Watch(NamedTuple):
    """Wake when position `bound` (LOG_END, HIGH_WATERMARK, LAST_STABLE, or one of
    their *_BYTES byte positions) of partition `tp` is above `offset` (or at any
    `notify(tp)` without positions)."""
    tp: TopicPartition
    bound: str
    offset: int


class _Partition:
    """The waiters of one partition: those woken by any event, and a heap per
    position of (offset, sequence, future)."""

    __slots__ = ("any", "heaps", "members")

    def __init__(self) -> None:
        self.any: set[asyncio.Future] = set()
        self.heaps: dict[str, list[tuple[int, int, asyncio.Future]]] = {}
        self.members: set[asyncio.Future] = set()  # the waiting futures with a heap entry here

    def empty(self) -> bool:
        return not self.any and not self.members


class Purgatory:
    """Waiters keyed by partition (and offset), completed by `notify` or by their
    deadline.

    clock: () -> seconds (monotonic); timers: schedule each deadline on the running
    event loop (False: only `expire_due()` expires waiters); max_parked_per_owner:
    parked waits per owner (0: no limit)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, timers: bool = True,
                 max_parked_per_owner: int = 0):
        self.clock = clock
        self.timers = timers
        self.max_parked_per_owner = max_parked_per_owner
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._deadlines: dict[asyncio.Future, float] = {}
        self._owners: dict[Hashable, int] = {}
        self._sequence = itertools.count()

    def __len__(self) -> int:
        """Number of parked requests."""
        return len(self._deadlines)

    def parked(self, owner: Hashable) -> int:
        """Parked waits of `owner`."""
        return self._owners.get(owner, 0)

    def notify(self, tp: TopicPartition, positions: Mapping[str, int] | None = None) -> None:
        """Something happened on `tp`. Without `positions` (ISR or leadership change,
        DeleteRecords) every waiter on it wakes; with them ({LOG_END: offset, ...}
        after an append, a marker or a high-watermark move) the waiters for any event
        wake, and each Watch whose position is now above its offset."""
        part = self._partitions.get(tuple(tp))
        if part is None:
            return
        woken = list(part.any)
        part.any.clear()
        if positions is None:
            for heap in part.heaps.values():
                woken.extend(fut for _, _, fut in heap)
            part.heaps.clear()
        else:
            for bound, position in positions.items():
                heap = part.heaps.get(bound)
                while heap and heap[0][0] < position:
                    woken.append(heapq.heappop(heap)[2])
        for fut in woken:
            if not fut.done():
                fut.set_result(True)

    def expire_due(self) -> int:
        """Complete (with False) every waiter whose deadline passed; returns how many."""
        now = self.clock()
        due = [fut for fut, deadline in self._deadlines.items() if deadline <= now and not fut.done()]
        for fut in due:
            fut.set_result(False)
        return len(due)

    async def wait(self, watches: Iterable[TopicPartition | Watch], deadline: float,
                   owner: Hashable | None = None) -> bool:
        """Park until one of `watches` (a partition: any event on it; a Watch: its
        position passing its offset) is notified (True) or `deadline` (clock seconds)
        passes (False). Returns False at once when the deadline already passed, or
        when `owner` already has `max_parked_per_owner` parked waits."""
        remaining = deadline - self.clock()
        if remaining <= 0:
            return False
        if owner is not None and self.max_parked_per_owner and \
                self._owners.get(owner, 0) >= self.max_parked_per_owner:
            return False
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        keys = []
        for w in watches:
            tp = tuple(w.tp) if isinstance(w, Watch) else tuple(w)
            part = self._partitions.get(tp)
            if part is None:
                part = self._partitions[tp] = _Partition()
            if isinstance(w, Watch):
                heapq.heappush(part.heaps.setdefault(w.bound, []), (w.offset, next(self._sequence), fut))
                part.members.add(fut)
            else:
                part.any.add(fut)
            keys.append(tp)
        self._deadlines[fut] = deadline
        if owner is not None:
            self._owners[owner] = self._owners.get(owner, 0) + 1
        timer = loop.call_later(remaining, _expire, fut) if self.timers else None
        try:
            return await fut
        finally:
            if timer is not None:
                timer.cancel()
            del self._deadlines[fut]
            if owner is not None:
                left = self._owners[owner] - 1
                if left:
                    self._owners[owner] = left
                else:
                    del self._owners[owner]
            for tp in keys:
                self._forget(tp, fut)

    def _forget(self, tp: TopicPartition, fut: asyncio.Future) -> None:
        """Drop gone waiter `fut` from `tp`: at once from the any-event set; from the
        heaps lazily, rebuilding them once most of their entries are gone waiters
        (amortized O(log n) a waiter)."""
        part = self._partitions.get(tp)
        if part is None:
            return
        part.any.discard(fut)
        part.members.discard(fut)
        if not part.members:
            part.heaps.clear()
        elif sum(len(h) for h in part.heaps.values()) > 2 * len(part.members) + 32:
            for bound, heap in list(part.heaps.items()):
                live = [e for e in heap if e[2] in part.members]
                heapq.heapify(live)
                if live:
                    part.heaps[bound] = live
                else:
                    del part.heaps[bound]
        if part.empty():
            del self._partitions[tp]


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(False)
