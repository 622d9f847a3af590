"""Byte positions of a replica's recent offsets, so that a parked consumer Fetch waits
for the bytes it asked for (`min_bytes`, Kafka's fetch.min.bytes) instead of being woken
by every append (docs/design.md, "Tunnel and fetch limits").

`ByteMarks` counts the bytes appended to a replica since it was opened here and keeps,
for each batch appended above the last stable offset, where it ends (offset) and how
many bytes the log held then. The byte position of an offset is the bytes appended
before the first batch that ends after it; the bytes between two positions of the
partition (the high watermark before and after an append, say) are what a fetch
between them reads. Marks below the last stable offset are forgotten as it moves
(`forget_below`), so a partition keeps only its unstable tail, at most `capacity`
marks: below the oldest kept mark a position is unknown (None) and the caller waits
by offset instead. Kafka computes the same from its LogOffsetMetadata (segment
position of an offset).
"""
from __future__ import annotations

from bisect import bisect_right

DEFAULT_CAPACITY = 4096


class ByteMarks:
    """`log_end_offset`: where the log ends when the marks start (byte position 0)."""

    __slots__ = ("total", "_ends", "_bytes", "_head", "capacity")

    def __init__(self, log_end_offset: int, capacity: int = DEFAULT_CAPACITY):
        self.capacity = capacity
        self.total = 0  # bytes appended since the marks started
        # Parallel lists from index _head on: end offset of a batch, bytes appended up to its end.
        self._ends: list[int] = [log_end_offset]
        self._bytes: list[int] = [0]
        self._head = 0

    def appended(self, end_offset: int, size: int) -> None:
        """A batch of `size` bytes was appended, ending before `end_offset`."""
        self.total += size
        self._ends.append(end_offset)
        self._bytes.append(self.total)
        if len(self._ends) - self._head > self.capacity:
            self._head += 1
            self._compact()

    def at(self, offset: int) -> int | None:
        """The byte position of `offset`: bytes appended before the batch holding it
        (or up to the log end); None below the oldest mark kept."""
        i = bisect_right(self._ends, offset, self._head) - 1
        if i < self._head:
            return None
        return self._bytes[i]

    def forget_below(self, offset: int) -> None:
        """Drop the marks no position at or above `offset` needs (the last stable
        offset: fetches never wait below it)."""
        i = bisect_right(self._ends, offset, self._head) - 1
        if i > self._head:
            self._head = i
            self._compact()

    def reset(self, log_end_offset: int) -> None:
        """Start again at `log_end_offset` (the log was truncated or replaced)."""
        self.total = 0
        self._ends, self._bytes, self._head = [log_end_offset], [0], 0

    def __len__(self) -> int:
        return len(self._ends) - self._head

    def _compact(self) -> None:
        if self._head > 64 and self._head * 2 > len(self._ends):
            del self._ends[:self._head], self._bytes[:self._head]
            self._head = 0
