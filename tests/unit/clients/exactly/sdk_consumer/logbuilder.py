"""Build partition logs of record batches v2 by hand, and serve Fetch ranges from
them the way a partition leader does (for the consumer's unit tests)."""
from __future__ import annotations

from dataclasses import dataclass, field

from exactly_wire import records


@dataclass
class Entry:
    base_offset: int
    last_offset: int
    data: bytes
    pid: int
    transactional: bool
    control: bool


@dataclass
class PartitionLog:
    """An in-memory log. `aborted` holds (pid, first_offset, last_offset) of each
    aborted transaction, as the leader's aborted-transaction index does."""

    entries: list[Entry] = field(default_factory=list)
    next_offset: int = 0
    aborted: list[tuple[int, int, int]] = field(default_factory=list)
    _open: dict[int, int] = field(default_factory=dict)  # pid -> first offset of its open txn

    def append(self, values: list[bytes], pid: int = -1, transactional: bool = False,
               ts: int = 1000) -> int:
        """Append a data batch; returns its base offset."""
        base = self.next_offset
        data = records.encode_batch([(None, v, (), ts + i) for i, v in enumerate(values)],
                                    base_offset=base, producer_id=pid,
                                    producer_epoch=0 if pid >= 0 else -1,
                                    base_sequence=0 if pid >= 0 else -1, transactional=transactional)
        if transactional:
            self._open.setdefault(pid, base)
        self.entries.append(Entry(base, base + len(values) - 1, data, pid, transactional, False))
        self.next_offset = base + len(values)
        return base

    def marker(self, pid: int, committed: bool) -> int:
        """Append a COMMIT/ABORT marker for `pid`; returns its offset."""
        off = self.next_offset
        data = records.encode_control_batch(committed, pid, 0, 0, 2000, base_offset=off)
        self.entries.append(Entry(off, off, data, pid, True, True))
        first = self._open.pop(pid, None)
        if not committed and first is not None:
            self.aborted.append((pid, first, off))
        self.next_offset = off + 1
        return off

    def lso(self) -> int:
        return min(self._open.values(), default=self.next_offset)

    def fetch(self, offset: int, max_batches: int = 1 << 30, bound: int | None = None,
              cut_bytes: int = 0) -> tuple[bytes, list[tuple[int, int]]]:
        """Bytes of whole batches from the one holding `offset` (at most
        `max_batches`, none at/after `bound`), minus `cut_bytes` at the end (a
        partial trailing batch), and the aborted transactions intersecting the
        range, as (pid, first_offset): Kafka's leader semantics."""
        chosen = [e for e in self.entries if e.last_offset >= offset
                  and (bound is None or e.base_offset < bound)][:max_batches]
        if not chosen:
            return b"", []
        last = chosen[-1].last_offset
        aborted = [(pid, first) for pid, first, end in self.aborted if end >= offset and first <= last]
        data = b"".join(e.data for e in chosen)
        return data[:len(data) - cut_bytes] if cut_bytes else data, aborted
