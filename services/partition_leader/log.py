"""The partition log: segment files of record batches v2, stored byte for byte.

Layout of one partition (`<data_dir>/logs/<topic>-<partition>/`), as Kafka's `Log`:

    00000000000000000000.log       record batches v2, appended as received
    00000000000000000000.index     sparse offset index: (relative offset int32, position int32)
    00000000000000000000.txnindex  aborted transactions, 34-byte `AbortedTxn` entries
    recovery-point                 "<offset> <segment base> <position>": flushed up to here
    log-start-offset               the log start offset, when above the first segment's base

Retention and compaction (docs/design.md, "Retention and compaction") change the
segment list only through `delete_segments` (a prefix, never the active segment),
`replace_segments` (cleaned segments swapped in) and `truncate_fully_and_start_at`.
A cleaned segment is written as `<base>.log.cleaned`, fsynced, renamed to
`<base>-<end>.swap` (the old segments of [base, end) are then deleted) and finally to
`<base>.log`; opening completes a `.swap` left by a crash and deletes `.cleaned`
files, so a crash at any step leaves a loadable log. Batches of a cleaned segment
keep their offsets: offsets may have gaps, never go back.

A segment is named by the offset of its first batch (%020d). The active (last)
segment rolls when the next batch would make it exceed `segment.bytes`. One index
entry is added when more than `index.interval.bytes` were appended since the
previous entry; it maps the batch's last offset (relative to the segment base) to
the batch's file position, as Kafka's OffsetIndex does.

Each segment also has a sparse time index (`TimeIndex`), kept in memory only: it
is built from the batch headers (`max_timestamp`) the first time a ListOffsets by
timestamp needs the segment, and extended on append from the header alone, so the
produce path never decodes records. `Log.offset_for_timestamp` uses it.

Durability (docs/design.md, "Replication"): appends do not fsync unless `flush.messages` records were
appended since the last flush; rolls and `close()` fsync. The recovery point records
how far the log is known to be flushed, and everything below it is on disk, the
aborted-transaction index included: an ABORT marker's entry is written with the marker,
before the flush decision (as Kafka's `UnifiedLog.append`), an entry added later for a
marker below the recovery point (restored by a replay) is fsynced at once, a rewritten
index replaces the old one atomically (temporary file, fsync, rename, directory fsync),
and a truncation first lowers the recovery point durably. Opening after a crash (SIGKILL, power loss)
scans from the recovery point, verifying every batch's CRC32C and offset continuity,
truncates a torn or corrupt tail and rebuilds index entries past the known-good
position. A missing or inconsistent index is rebuilt from its segment.

Not thread-safe: one owner (the partition leader's event loop) calls it.
"""
from __future__ import annotations

import bisect
import logging
import operator
import os
import struct
import sys
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from itertools import compress, count, islice, repeat
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

from exactly_wire import records
from exactly_wire.clock import wall_clock_ms
from exactly_wire.records import BatchHeader, CorruptRecordError
from services.common.topic_config import DEFAULTS

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TXN_INDEX_SUFFIX = ".txnindex"
RECOVERY_POINT_FILE = "recovery-point"
LOG_START_OFFSET_FILE = "log-start-offset"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
TMP_SUFFIX = ".tmp"

INDEX_ENTRY = struct.Struct(">ii")  # relative offset, file position
ABORTED_TXN = struct.Struct(">hqqqq")  # version, pid, first offset, last offset, LSO (34 bytes)
ABORTED_TXN_VERSION = 0
INT32_MAX = 0x7FFFFFFF

_SCAN_CHUNK = 256 * 1024
_POSITION_CACHE_SIZE = 64


@dataclass(frozen=True)
class LogConfig:
    """Per-log settings (Kafka topic-level names).

    segment_bytes (`segment.bytes`): roll the active segment past this size, bytes.
    index_interval_bytes (`index.interval.bytes`): bytes between offset index entries.
    flush_messages (`flush.messages`): fsync after this many appended records;
        the default (sys.maxsize) never fsyncs on append, only on roll and close.
    segment_ms (`segment.ms`): roll the active segment on append once its first
        batch is older than this, ms (so retention can delete it later).
    """

    segment_bytes: int = DEFAULTS.segment_bytes
    index_interval_bytes: int = DEFAULTS.index_interval_bytes
    flush_messages: int = DEFAULTS.flush_messages
    segment_ms: int = DEFAULTS.segment_ms


class AbortedTxn(NamedTuple):
    """One entry of the aborted transaction index (Kafka `AbortedTxn`, 34 bytes;
    design doc "Aborted Transaction Index"). Offsets are absolute.

    last_offset is the offset of the ABORT marker; last_stable_offset is the LSO
    when the entry was written: later entries start at or above it, which lets a
    fetch stop scanning (design doc "Client-Broker request handling", fetch step 4).
    """

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int
    version: int = ABORTED_TXN_VERSION

    def encode(self) -> bytes:
        return ABORTED_TXN.pack(self.version, self.producer_id, self.first_offset,
                                self.last_offset, self.last_stable_offset)

    @classmethod
    def decode(cls, buf: bytes, pos: int = 0) -> "AbortedTxn":
        version, pid, first, last, lso = ABORTED_TXN.unpack_from(buf, pos)
        return cls(pid, first, last, lso, version)


class ReadResult(NamedTuple):
    """Whole batches read from the log.

    records: raw batch bytes (possibly empty); first_offset: base offset of the
    first batch (may be below the requested offset: the batch containing it);
    next_offset: last offset of the last batch + 1 (the requested offset when empty).
    """

    records: bytes
    first_offset: int
    next_offset: int


class AppendInfo(NamedTuple):
    """Where an appended batch landed: first and last offset, segment base, byte position."""

    base_offset: int
    last_offset: int
    segment_base: int
    position: int


class LogBatch(NamedTuple):
    """A batch found while scanning the log (header carries its real offsets)."""

    header: BatchHeader
    segment: "Segment"
    position: int

    def read(self) -> bytes:
        """The batch's raw bytes."""
        return self.segment.read_at(self.position, self.header.size)


class TimeIndex:
    """Sparse in-memory time index of one segment, from batch headers only.

    Entry i is (`prefix_max[i]`, `positions[i]`): every batch before file position
    `positions[i]` has a max timestamp <= `prefix_max[i]` (ms). Entries are added
    at most every `interval_bytes` (index.interval.bytes); while the running
    maximum does not grow, the last entry's position moves forward instead, so a
    lookup starts as late as the index allows. `max_timestamp` is the largest
    batch max timestamp of the segment (-1 when empty). Control batches count
    too, which only makes lookups start earlier (never wrong).
    """

    __slots__ = ("prefix_max", "positions", "max_timestamp", "_interval", "_bytes_since")

    def __init__(self, interval_bytes: int):
        self.prefix_max: list[int] = []
        self.positions: list[int] = []
        self.max_timestamp = -1
        self._interval = interval_bytes
        self._bytes_since = 0

    def add(self, position: int, header: BatchHeader) -> None:
        """The batch with `header` starts at `position` (batches in file order)."""
        if position > 0 and self._bytes_since > self._interval:
            if self.prefix_max and self.prefix_max[-1] == self.max_timestamp:
                self.positions[-1] = position
            else:
                self.prefix_max.append(self.max_timestamp)
                self.positions.append(position)
            self._bytes_since = 0
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
        self._bytes_since += header.size

    def start_position(self, timestamp: int) -> int | None:
        """A file position before which no batch has a timestamp >= `timestamp`
        (ms); None when no batch of the segment has one."""
        if self.max_timestamp < timestamp:
            return None
        i = bisect.bisect_left(self.prefix_max, timestamp)
        return self.positions[i - 1] if i > 0 else 0


def _index_array(data: bytes = b"") -> array:
    """Offset-index entries or columns as native int32s; `data`: the .index file's
    big-endian bytes."""
    out = array("i", data)
    if data and sys.byteorder == "little":
        out.byteswap()
    return out


def _decode_index(data: bytes) -> tuple[array, array]:
    """(relative offsets, positions) of an .index file's bytes."""
    entries = _index_array(data)
    return entries[0::2], entries[1::2]


def _strictly_increasing(values: array) -> bool:
    """Whether every value is above the one before (a C loop)."""
    return all(map(operator.lt, values, islice(values, 1, None)))


def _fsync(fd: int | None) -> None:
    if fd is not None:
        os.fsync(fd)


# Base offset (8 bytes), batch length (4), partition leader epoch (4): the part of a
# batch header the leader rewrites on append, outside the CRC.
REWRITTEN_PREFIX = 16


def _write_all(fd: int, data: bytes | bytearray | memoryview | tuple, position: int) -> None:
    """Write `data` (one buffer, or a tuple of buffers written back to back) at
    `position`, looping over short writes."""
    views = [memoryview(d) for d in data] if isinstance(data, tuple) else [memoryview(data)]
    while views:
        n = os.pwritev(fd, views, position) if len(views) > 1 else os.pwrite(fd, views[0], position)
        position += n
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


class Segment:
    """One segment: its log file, sparse offset index and aborted transaction index.

    `size` is the log file size in bytes; `next_offset` the offset after its last
    batch (`base_offset` when empty). Index entries are mirrored in memory (int32
    arrays), decoded from the file on first use after an open (`load_index`).
    """

    def __init__(self, directory: Path, base_offset: int, config: LogConfig):
        self.base_offset = base_offset
        self.config = config
        stem = directory / f"{base_offset:020d}"
        self.log_path = stem.with_suffix(LOG_SUFFIX)
        self.index_path = stem.with_suffix(INDEX_SUFFIX)
        self.txn_index_path = stem.with_suffix(TXN_INDEX_SUFFIX)
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self.size = os.fstat(self._fd).st_size
            if self.size == 0:
                self.index_path.touch()  # an index file always exists, even without entries
        except OSError:
            os.close(self._fd)
            raise
        self.next_offset = base_offset
        self._index_offsets = _index_array()  # relative last offsets (int32, as in the file)
        self._index_positions = _index_array()
        # (bytes, last entry's position) of a checked .index file not read in full yet
        self._index_pending: tuple[int, int] | None = None
        self._index_fd: int | None = None
        self._bytes_since_index = 0
        self.aborted: list[AbortedTxn] = []
        self._txn_fd: int | None = None
        self._positions: OrderedDict[int, int] = OrderedDict()  # batch base offset -> position
        self._time_index: TimeIndex | None = None  # built on first use
        # When the first batch was appended (ms; `segment.ms` rolls from it): the
        # append time while running, the first batch's max timestamp after an open.
        self.first_append_ms: int | None = None

    # ------------------------------------------------------------ files
    def close(self) -> None:
        for name in ("_index_fd", "_txn_fd", "_fd"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

    def delete(self) -> None:
        self.close()
        for path in (self.log_path, self.index_path, self.txn_index_path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    def flush(self) -> None:
        """fsync the log file and both indexes."""
        _fsync(self._fd)
        _fsync(self._index_fd)
        _fsync(self._txn_fd)

    def seal(self) -> None:
        """The segment stops being active: flush and release the index writers."""
        self.flush()
        for name in ("_index_fd", "_txn_fd"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

    def _index_writer(self) -> int:
        if self._index_fd is None:
            self._index_fd = os.open(self.index_path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._index_fd

    def _txn_writer(self) -> int:
        if self._txn_fd is None:
            self._txn_fd = os.open(self.txn_index_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        return self._txn_fd

    def read_at(self, position: int, size: int) -> bytes:
        return os.pread(self._fd, size, position)

    # ------------------------------------------------------------ offset index
    def load_index(self, limit: int | None = None) -> bool:
        """Check the .index file and load it. Returns False (index left empty) when it
        is missing or fails the checks: whole entries, strictly increasing offsets
        and positions, positions inside the log file, last entry pointing at a batch
        whose last offset matches. With `limit`, entries at positions >= limit are
        dropped (the data there is about to be validated again).

        Only the file size and the first and last entries are checked here (16 bytes
        read) when the last entry lies below `limit` (a clean shutdown, or a segment
        before the recovery point): the entries are read, decoded and their order
        checked on first use (`_entries`), as
        Kafka's lazily loaded indexes, so opening a segment costs the same whatever
        its size. An index found out of order then is rebuilt from the segment."""
        self._index_offsets, self._index_positions = _index_array(), _index_array()
        self._index_pending = None
        try:
            with open(self.index_path, "rb") as f:
                length = os.fstat(f.fileno()).st_size
                if length % INDEX_ENTRY.size:
                    return False
                if not length:
                    self._bytes_since_index = self.size
                    return True
                last_rel, last_pos = INDEX_ENTRY.unpack(os.pread(f.fileno(), INDEX_ENTRY.size,
                                                                 length - INDEX_ENTRY.size))
                if limit is None or last_pos < limit:
                    first_rel, first_pos = INDEX_ENTRY.unpack(os.pread(f.fileno(), INDEX_ENTRY.size, 0))
                    if first_rel < 0 or first_pos < 0 or not self._indexes_its_batch(last_rel, last_pos):
                        return False
                    self._index_pending = (length, last_pos)
                    self._bytes_since_index = self.size - last_pos
                    return True
                data = f.read()
        except FileNotFoundError:
            return False
        offsets, positions = _decode_index(data)
        # Entries before the first one at or past `limit` (a C loop).
        keep = next(compress(count(), map(operator.ge, positions, repeat(limit))), len(positions))
        del offsets[keep:], positions[keep:]
        if offsets and (offsets[0] < 0 or positions[0] < 0 or not _strictly_increasing(offsets) or
                        not _strictly_increasing(positions) or
                        not self._indexes_its_batch(offsets[-1], positions[-1])):
            return False
        self._index_offsets, self._index_positions = offsets, positions
        self._bytes_since_index = self.size - (positions[-1] if positions else 0)
        return True

    def _indexes_its_batch(self, rel: int, position: int) -> bool:
        """Whether a whole batch whose last offset is base + `rel` starts at `position`."""
        if not 0 <= position < self.size or rel < 0:
            return False
        try:
            h = records.parse_header(self.read_at(position, records.HEADER_SIZE))
        except CorruptRecordError:
            return False
        return h.last_offset == self.base_offset + rel and position + h.size <= self.size

    def _entries(self) -> tuple[array, array]:
        """The offset index (relative offsets, positions), decoded on first use; an
        index out of order is rebuilt from the segment (headers only)."""
        if self._index_pending is not None:
            length, self._index_pending = self._index_pending[0], None
            try:
                with open(self.index_path, "rb") as f:
                    data = f.read(length)
            except FileNotFoundError:
                data = b""
            offsets, positions = _decode_index(data)
            if len(data) == length and _strictly_increasing(offsets) and _strictly_increasing(positions):
                self._index_offsets, self._index_positions = offsets, positions
            else:
                log.warning("%s: rebuilding an offset index out of order or gone", self.index_path)
                next_offset = self.next_offset
                self.rebuild_index()
                self.next_offset = max(self.next_offset, next_offset)
        return self._index_offsets, self._index_positions

    def last_index_position(self) -> int:
        """File position of the last offset-index entry (0 without entries)."""
        if self._index_pending is not None:
            return self._index_pending[1]
        return self._index_positions[-1] if self._index_positions else 0

    def _truncate_index(self, position: int) -> None:
        """Drop index entries for batches at or after `position`."""
        if self._index_pending is not None and self.last_index_position() < position:
            self._bytes_since_index = position - self.last_index_position()  # none to drop
            return
        offsets, positions = self._entries()
        keep = bisect.bisect_left(positions, position)
        del offsets[keep:]
        del positions[keep:]
        os.ftruncate(self._index_writer(), keep * INDEX_ENTRY.size)
        last = positions[-1] if positions else 0
        self._bytes_since_index = position - last

    def _maybe_index(self, header: BatchHeader, position: int) -> None:
        if self._bytes_since_index > self.config.index_interval_bytes:
            offsets, positions = self._entries()
            rel = header.last_offset - self.base_offset
            fd = self._index_writer()
            _write_all(fd, INDEX_ENTRY.pack(rel, position), len(offsets) * INDEX_ENTRY.size)
            offsets.append(rel)
            positions.append(position)
            self._bytes_since_index = 0
        self._bytes_since_index += header.size

    def lookup(self, offset: int) -> int:
        """A file position at or before the batch holding `offset` (sparse index lookup)."""
        cached = self._positions.get(offset)
        if cached is not None:
            return cached
        offsets, positions = self._entries()
        i = bisect.bisect_right(offsets, offset - self.base_offset) - 1
        return positions[i] if i >= 0 else 0

    def time_index(self) -> TimeIndex:
        """The segment's time index, built from its batch headers on first use."""
        if self._time_index is None:
            ti = TimeIndex(self.config.index_interval_bytes)
            for pos, h in self.scan(0):
                ti.add(pos, h)
            self._time_index = ti
        return self._time_index

    def index_entries(self) -> list[tuple[int, int]]:
        """(absolute offset, position) pairs of the offset index, for inspection."""
        return [(self.base_offset + o, p) for o, p in zip(*self._entries())]

    def _remember(self, base_offset: int, position: int) -> None:
        self._positions[base_offset] = position
        if len(self._positions) > _POSITION_CACHE_SIZE:
            self._positions.popitem(last=False)

    # ------------------------------------------------------------ scanning
    def scan(self, start: int = 0, verify: bool = False) -> Iterator[tuple[int, BatchHeader]]:
        """Yield (position, header) of the batches from file position `start`. Stops at
        a truncated tail; raises CorruptRecordError at a malformed header (or a CRC
        mismatch when `verify`)."""
        buf = b""
        buf_start = start
        pos = start
        end = self.size
        while pos < end:
            rel = pos - buf_start
            if len(buf) - rel < records.HEADER_SIZE:
                buf_start, buf = pos, self.read_at(pos, min(_SCAN_CHUNK, end - pos))
                rel = 0
                if len(buf) < records.HEADER_SIZE:
                    return
            h = records.parse_header(buf, rel)
            if pos + h.size > end:
                return
            if verify:
                if rel + h.size > len(buf):
                    buf_start, buf = pos, self.read_at(pos, max(h.size, min(_SCAN_CHUNK, end - pos)))
                    rel = 0
                records.verify_crc(buf, rel, h)
            yield pos, h
            pos += h.size

    def rebuild_index(self) -> None:
        """Recreate the .index file and `next_offset` from the segment's batches
        (headers only; the data is trusted)."""
        self._positions.clear()
        self._time_index = None
        self._truncate_index(0)
        self.next_offset = self.base_offset
        for pos, h in self.scan(0):
            self._maybe_index(h, pos)
            self.next_offset = h.last_offset + 1

    def load_tail(self) -> int:
        """Find `next_offset` by walking headers from the last index entry; returns the
        position after the last whole batch (a trailing partial batch is ignored)."""
        start = self.last_index_position()
        self.next_offset = self.base_offset
        end = start
        for pos, h in self.scan(start):
            self.next_offset = h.last_offset + 1
            end = pos + h.size
        self._remember(self.next_offset, end)  # a fetch from the log end needs no index lookup
        return end

    def recover(self, start: int, expected_offset: int) -> bool:
        """Validate batches from file position `start` (whose first batch must begin at
        or after `expected_offset`): CRC32C and increasing offsets. Truncates the file at the
        first bad or partial batch and re-indexes what is kept. Returns True when the
        whole segment was valid."""
        self._positions.clear()
        self._time_index = None
        self._truncate_index(start)
        self.next_offset = expected_offset
        valid_end = start
        clean = True
        try:
            for pos, h in self.scan(start, verify=True):
                # A cleaned (compacted) segment has offset gaps: offsets only never go back.
                if h.base_offset < self.next_offset or h.record_count < 0 or \
                        h.last_offset - self.base_offset > INT32_MAX:
                    raise CorruptRecordError(f"batch at position {pos} has offset {h.base_offset}, "
                                             f"expected at least {self.next_offset}")
                self._maybe_index(h, pos)
                self.next_offset = h.last_offset + 1
                valid_end = pos + h.size
        except CorruptRecordError as exc:
            log.warning("%s: corrupt batch at position %d: %s", self.log_path, valid_end, exc)
            clean = False
        if valid_end < self.size:
            log.warning("%s: truncating %d bytes after position %d", self.log_path,
                        self.size - valid_end, valid_end)
            os.ftruncate(self._fd, valid_end)
            self.size = valid_end
            clean = False
        self._remember(self.next_offset, valid_end)
        return clean

    # ------------------------------------------------------------ append / read
    def first_timestamp(self) -> int | None:
        """The time `segment.ms` counts from (see `first_append_ms`); None when empty."""
        if self.first_append_ms is None and self.size > 0:
            for _pos, h in self.scan(0):
                self.first_append_ms = h.max_timestamp
                break
        return self.first_append_ms

    def append(self, batch: bytes | bytearray | tuple, header: BatchHeader) -> int:
        """Write one batch (offsets already assigned; bytes, or a tuple of buffers that
        together make it) at the end; returns its position."""
        position = self.size
        _write_all(self._fd, batch, position)
        self.size += header.size
        self._maybe_index(header, position)
        if self._time_index is not None:
            self._time_index.add(position, header)
        self.next_offset = header.last_offset + 1
        self._remember(self.next_offset, self.size)
        return position

    def find(self, offset: int) -> tuple[int, BatchHeader] | None:
        """(position, header) of the first batch whose last offset >= `offset`, or None."""
        for pos, h in self.scan(self.lookup(offset)):
            if h.last_offset >= offset:
                return pos, h
        return None

    def read(self, offset: int, max_bytes: int, max_offset: int) -> ReadResult | None:
        """Whole batches from the one holding `offset`: only batches whose last offset is
        below `max_offset`, at most `max_bytes` bytes, but at least one batch (so a
        batch larger than max_bytes still makes progress). None when this segment
        holds no batch at or after `offset`."""
        found = self.find(offset)
        if found is None:
            return None
        start, first = found
        if first.last_offset >= max_offset:
            return ReadResult(b"", first.base_offset, offset)
        want = min(max(max_bytes, first.size), self.size - start)
        buf = self.read_at(start, want)
        end = 0
        next_offset = offset
        for rel, h in records.iter_batches(buf):
            if h.last_offset >= max_offset:
                break
            end = rel + h.size
            next_offset = h.last_offset + 1
        self._remember(next_offset, start + end)
        return ReadResult(buf[:end] if end < len(buf) else buf, first.base_offset, next_offset)

    def truncate_to(self, offset: int) -> None:
        """Remove batches at and after `offset` (must be a batch boundary or beyond the end)."""
        found = self.find(offset)
        if found is None:
            return
        pos, h = found
        if h.base_offset < offset:
            raise ValueError(f"offset {offset} is inside a batch starting at {h.base_offset}")
        os.ftruncate(self._fd, pos)
        self.size = pos
        self._positions.clear()
        self._time_index = None
        self._truncate_index(pos)
        self.next_offset = h.base_offset
        if pos == 0:
            self.first_append_ms = None
        self.truncate_aborted(offset)

    # ------------------------------------------------------------ aborted txn index
    def load_aborted(self) -> None:
        """Read the .txnindex file; a partial trailing entry (torn write) is cut off."""
        self.aborted = []
        try:
            data = self.txn_index_path.read_bytes()
        except FileNotFoundError:
            return
        whole = len(data) - len(data) % ABORTED_TXN.size
        for pos in range(0, whole, ABORTED_TXN.size):
            entry = AbortedTxn.decode(data, pos)
            if entry.version != ABORTED_TXN_VERSION:
                whole = pos
                break
            self.aborted.append(entry)
        if whole != len(data):
            log.warning("%s: dropping %d bytes of a partial entry", self.txn_index_path, len(data) - whole)
            os.truncate(self.txn_index_path, whole)

    def append_aborted(self, entry: AbortedTxn) -> None:
        """Append one entry (the file is created lazily, design doc "Aborted Transaction Index").
        Entries stay ordered by marker offset: an entry restored by recovery for an
        earlier marker than the last one present is inserted in order and the file
        rewritten."""
        if self.aborted and entry.last_offset < self.aborted[-1].last_offset:
            bisect.insort(self.aborted, entry, key=lambda e: e.last_offset)
            self._rewrite_aborted()
            return
        os.write(self._txn_writer(), entry.encode())
        self.aborted.append(entry)

    def sync_aborted(self) -> None:
        """fsync the aborted-transaction index (when open for appends)."""
        _fsync(self._txn_fd)

    def _rewrite_aborted(self) -> None:
        """Replace the .txnindex file by `aborted`, atomically and durably: a crash
        leaves the old file or the new one, never a torn one."""
        if self._txn_fd is not None:
            os.close(self._txn_fd)
            self._txn_fd = None
        _write_atomically(self.txn_index_path, b"".join(e.encode() for e in self.aborted))

    def truncate_aborted(self, offset: int) -> None:
        """Drop entries whose marker (last offset) is at or after `offset`."""
        keep = [e for e in self.aborted if e.last_offset < offset]
        if len(keep) == len(self.aborted):
            return
        self.aborted = keep
        self._rewrite_aborted()

    def collect_aborted(self, fetch_offset: int, upper_bound: int) -> tuple[list[AbortedTxn], bool]:
        """Entries intersecting [fetch_offset, upper_bound); True when no later entry
        (here or in later segments) can intersect (an entry's LSO >= upper_bound)."""
        out = []
        for e in self.aborted:
            if e.last_offset >= fetch_offset and e.first_offset < upper_bound:
                out.append(e)
            if e.last_stable_offset >= upper_bound:
                return out, True
        return out, False


class Log:
    """All segments of one partition. Offsets are assigned here on append.

    Use `Log.open(directory, config)`; `log_start_offset` is the first offset held,
    `log_end_offset` the offset the next batch will get.
    """

    def __init__(self, directory: Path, config: LogConfig, segments: list[Segment],
                 clock_ms: Callable[[], int] = wall_clock_ms):
        self.dir = directory
        self.config = config
        self.segments = segments
        self.clock_ms = clock_ms
        self._bases = [s.base_offset for s in segments]
        self._log_start_offset = segments[0].base_offset
        self._unflushed_records = 0
        self.recovered_bytes = 0  # bytes cut off by the last open (torn/corrupt tail)
        self.recovery_scanned = False  # the last open validated batches past the recovery point
        # Offset up to which the files were flushed before the last open (the recovery
        # point it found, or the log start without one); what was written past it may
        # have been lost in part by a machine crash, so state derived from it
        # (producer-state snapshots) is not trusted past it.
        self.flushed_at_open = segments[0].base_offset
        self._recovery_point = (segments[0].base_offset, segments[0].base_offset, 0)

    # ------------------------------------------------------------ open / close
    @classmethod
    def open(cls, directory: Path, config: LogConfig | None = None,
             clock_ms: Callable[[], int] = wall_clock_ms) -> "Log":
        """Open (creating if needed) the log in `directory` and recover it.

        An interrupted segment swap of the cleaner is completed first (`.swap`) or
        dropped (`.cleaned`). Segments before the recovery point are trusted (their
        index is only sanity-checked, and rebuilt if bad); batches after it are
        CRC-checked and a corrupt/torn tail is truncated (later segments deleted).
        The log start offset is read back from `log-start-offset`; a log that
        recovery left ending below it starts empty at it. `clock_ms`: wall clock
        (ms) for `segment.ms`. Raises OSError on I/O failure."""
        config = config or LogConfig()
        directory.mkdir(parents=True, exist_ok=True)
        _finish_swaps(directory)
        bases = sorted(int(p.stem) for p in directory.glob(f"*{LOG_SUFFIX}") if p.stem.isdigit())
        for stray in list(directory.glob(f"*{INDEX_SUFFIX}")) + list(directory.glob(f"*{TXN_INDEX_SUFFIX}")):
            if stray.stem.isdigit() and int(stray.stem) not in bases:
                stray.unlink()
        for stray in directory.glob(f"*{TMP_SUFFIX}"):  # an atomic replace a crash interrupted
            stray.unlink()
        if not bases:
            bases = [0]
        segments = [Segment(directory, b, config) for b in bases]
        self = cls(directory, config, segments, clock_ms)
        self._recover(cls._read_recovery_point(directory))
        stored = self._read_log_start_offset()
        self._log_start_offset = max(stored if stored is not None else 0, self.segments[0].base_offset)
        if self._log_start_offset > self.log_end_offset:
            log.warning("%s: log ends at %d, below its log start offset %d; starting empty there",
                        directory, self.log_end_offset, self._log_start_offset)
            self.truncate_fully_and_start_at(self._log_start_offset)
        return self

    def _read_log_start_offset(self) -> int | None:
        try:
            return int((self.dir / LOG_START_OFFSET_FILE).read_text().strip())
        except FileNotFoundError:
            return None
        except ValueError:
            log.warning("%s: unreadable log start offset checkpoint; using the first segment's base", self.dir)
            return None

    @staticmethod
    def _read_recovery_point(directory: Path) -> tuple[int, int, int] | None:
        try:
            offset, base, position = (int(x) for x in (directory / RECOVERY_POINT_FILE).read_text().split())
        except (FileNotFoundError, ValueError):
            return None
        return offset, base, position

    def _recover(self, point: tuple[int, int, int] | None) -> None:
        # First segment that must be validated, and the known-good position inside it.
        first_dirty, start_pos, start_offset = 0, 0, self.segments[0].base_offset
        if point is not None and point[1] in self._bases:
            offset, base, position = point
            first_dirty = self._bases.index(base)
            seg = self.segments[first_dirty]
            if 0 < position <= seg.size and seg.load_index(limit=position) and \
                    self._is_boundary(seg, position, offset):
                start_pos, start_offset = position, offset
        self.flushed_at_open = point[0] if point is not None else self.segments[0].base_offset
        for seg in self.segments[:first_dirty]:
            if not seg.load_index():
                log.warning("%s: rebuilding a missing or inconsistent offset index", seg.index_path)
                seg.rebuild_index()
            else:
                seg.load_tail()
            seg.load_aborted()
        for i in range(first_dirty, len(self.segments)):
            seg = self.segments[i]
            if i > first_dirty or start_pos == 0:
                start_pos, start_offset = 0, seg.base_offset
            seg.load_aborted()
            size_before = seg.size
            if start_pos < seg.size:
                self.recovery_scanned = True
            clean = seg.recover(start_pos, start_offset)
            self.recovered_bytes += size_before - seg.size
            seg.truncate_aborted(seg.next_offset)
            if not clean:
                for later in self.segments[i + 1:]:
                    log.warning("%s: deleting a segment after a corrupt one", later.log_path)
                    self.recovered_bytes += later.size
                    later.delete()
                del self.segments[i + 1:]
                break
        self._bases = [s.base_offset for s in self.segments]
        for seg in self.segments[:-1]:
            seg.seal()
        if self.recovery_scanned or point is None:
            self.flush()
        else:
            active = self.segments[-1]
            self._recovery_point = (active.next_offset, active.base_offset, active.size)

    @staticmethod
    def _is_boundary(seg: Segment, position: int, offset: int) -> bool:
        """Whether a batch starting at `offset` begins at `position`, or, at the end of
        the file, whether the last batch ends just before `offset`."""
        try:
            if position < seg.size:
                return records.parse_header(seg.read_at(position, records.HEADER_SIZE)).base_offset == offset
            start = seg.last_index_position()
            end, next_offset = start, seg.base_offset
            for pos, h in seg.scan(start):
                end, next_offset = pos + h.size, h.last_offset + 1
            return end == position and next_offset == offset
        except CorruptRecordError:
            return False

    def close(self) -> None:
        """Flush (fsync) everything, record the recovery point and close the files."""
        self.flush()
        for seg in self.segments:
            seg.close()

    def flush(self) -> None:
        """fsync segments written since the last flush and advance the recovery point."""
        _, flushed_base, _ = self._recovery_point
        for seg in self.segments:
            if seg.base_offset >= flushed_base:
                seg.flush()
        active = self.segments[-1]
        # A crash that loses the rename keeps the previous, lower, point: only more to scan.
        self._write_recovery_point((active.next_offset, active.base_offset, active.size), sync_dir=False)
        self._unflushed_records = 0

    def _write_recovery_point(self, point: tuple[int, int, int], sync_dir: bool = True) -> None:
        """Record (offset, segment base, position) as the recovery point (atomic,
        fsynced; `sync_dir`: the rename too)."""
        _write_atomically(self.dir / RECOVERY_POINT_FILE, "%d %d %d\n" % point, sync_dir)
        self._recovery_point = point

    # ------------------------------------------------------------ properties
    @property
    def log_start_offset(self) -> int:
        """First offset a reader may fetch: the first segment's base, or above it after
        DeleteRecords (Kafka's logStartOffset)."""
        return self._log_start_offset

    @property
    def size_bytes(self) -> int:
        """Bytes of all segment files (the log's size on disk, without indexes)."""
        return sum(seg.size for seg in self.segments)

    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        """Move the log start offset up to `offset` (never back, never past the log
        end) and persist it (`log-start-offset`, atomic replace, fsynced). Segments
        below it are deleted later by the cleaner (`delete_segments`). Returns
        whether it moved. Raises OSError."""
        offset = min(offset, self.log_end_offset)
        if offset <= self._log_start_offset:
            return False
        self._log_start_offset = offset
        self._write_log_start_offset()
        return True

    def _write_log_start_offset(self) -> None:
        _write_atomically(self.dir / LOG_START_OFFSET_FILE, f"{self._log_start_offset}\n")

    @property
    def log_end_offset(self) -> int:
        return self.segments[-1].next_offset

    @property
    def active_segment(self) -> Segment:
        return self.segments[-1]

    @property
    def recovery_point(self) -> int:
        """Offset up to which the log is known to be on disk (fsynced)."""
        return self._recovery_point[0]

    def segment_for(self, offset: int) -> int:
        """Index in `segments` of the segment that would hold `offset`."""
        return max(bisect.bisect_right(self._bases, offset) - 1, 0)

    # ------------------------------------------------------------ append
    def _roll(self) -> None:
        active = self.segments[-1]
        active.seal()
        new = Segment(self.dir, active.next_offset, self.config)
        self.segments.append(new)
        self._bases.append(new.base_offset)
        # The sealed segment is fsynced: the recovery point may move past it.
        self.flush()

    def _segment_for_append(self, header: BatchHeader) -> Segment:
        active = self.segments[-1]
        base = active.next_offset
        if active.size > 0 and (active.size + header.size > self.config.segment_bytes or
                                base + header.last_offset_delta - active.base_offset > INT32_MAX or
                                self._segment_expired(active)):
            self._roll()
            active = self.segments[-1]
        if active.first_append_ms is None:
            active.first_append_ms = self.clock_ms()
        return active

    def _segment_expired(self, active: Segment) -> bool:
        """`segment.ms` passed since the active segment's first batch."""
        first = active.first_timestamp()
        return first is not None and self.clock_ms() - first > self.config.segment_ms

    def append(self, batch: bytes | bytearray, header: BatchHeader, leader_epoch: int = -1,
               aborted: AbortedTxn | None = None) -> AppendInfo:
        """Append one validated batch with its base offset (and partition leader
        epoch, when >= 0) rewritten. Neither field is under the CRC, so only the
        first REWRITTEN_PREFIX bytes are copied and changed; the records are written
        from `batch` itself (one pwritev, no copy; `batch` is left as it was).
        `header` is the batch's parsed header; the batch must be exactly
        `header.size` bytes. `aborted`: the aborted-index entry of an ABORT marker
        batch (its last_offset the log end offset, where the marker lands), written
        with it before the flush decision. Rolls the segment first when needed.
        Returns where it landed. Raises ValueError for an entry of another offset
        (nothing written), OSError on I/O failure."""
        self._check_entry(aborted, self.log_end_offset)
        active = self._segment_for_append(header)
        base = active.next_offset
        prefix = bytearray(memoryview(batch)[:REWRITTEN_PREFIX])
        records.set_base_offset(prefix, base)
        if leader_epoch >= 0:
            records.set_partition_leader_epoch(prefix, leader_epoch)
        h = header._replace(base_offset=base)
        return self._write(active, (prefix, memoryview(batch)[REWRITTEN_PREFIX:]), h, aborted)

    def append_replicated(self, batch: bytes | bytearray | memoryview, header: BatchHeader,
                          aborted: AbortedTxn | None = None) -> AppendInfo:
        """Append a batch copied from the leader byte for byte: its offsets and
        partition leader epoch are kept, so its base offset must be at or after the
        log end offset (after it: the leader's log was compacted, offsets have
        gaps). `aborted`: as for `append`, its last_offset the batch's base offset.
        Raises ValueError otherwise (an overlap: the caller must truncate or fetch
        again) or for an entry of another offset, OSError on I/O failure."""
        self._check_entry(aborted, header.base_offset)
        if header.base_offset < self.log_end_offset:
            raise ValueError(f"replicated batch at offset {header.base_offset}, log ends at {self.log_end_offset}")
        if len(batch) != header.size:
            raise ValueError(f"replicated batch has {len(batch)} bytes, header says {header.size}")
        return self._write(self._segment_for_append(header), batch, header, aborted)

    @staticmethod
    def _check_entry(aborted: AbortedTxn | None, marker_offset: int) -> None:
        if aborted is not None and aborted.last_offset != marker_offset:
            raise ValueError(f"aborted-index entry for a marker at {aborted.last_offset}, "
                             f"the marker lands at {marker_offset}")

    def _write(self, active: Segment, batch, h: BatchHeader, aborted: AbortedTxn | None = None) -> AppendInfo:
        position = active.append(batch, h)
        if aborted is not None:
            # Before the flush decision: the flush that moves the recovery point past the
            # marker makes its entry durable too.
            active.append_aborted(aborted)
        self._unflushed_records += max(h.record_count, 1)
        if self._unflushed_records >= self.config.flush_messages:
            self.flush()
        return AppendInfo(h.base_offset, h.last_offset, active.base_offset, position)

    def append_aborted(self, entry: AbortedTxn) -> None:
        """Add an aborted-transaction index entry for a marker already in the log (a
        replay restoring one a crash lost) to the segment holding the marker. Below
        the recovery point it is fsynced at once: what the recovery point (and so a
        producer-state snapshot) covers is on disk. Raises OSError."""
        seg = self.segments[self.segment_for(entry.last_offset)]
        seg.append_aborted(entry)
        if entry.last_offset < self.recovery_point:
            seg.sync_aborted()

    def has_aborted_entry(self, producer_id: int, last_offset: int) -> bool:
        seg = self.segments[self.segment_for(last_offset)]
        return any(e.producer_id == producer_id and e.last_offset == last_offset for e in seg.aborted)

    # ------------------------------------------------------------ read
    def read(self, offset: int, max_bytes: int, max_offset: int) -> ReadResult:
        """Whole batches starting with the one that holds `offset`, each ending below
        `max_offset` (exclusive upper offset bound: high watermark or LSO), at most
        `max_bytes` bytes except that one batch is always returned if it fits under
        max_offset. Reads from a single segment, like Kafka. Empty when nothing
        qualifies."""
        i = self.segment_for(offset)
        while i < len(self.segments):
            res = self.segments[i].read(offset, max_bytes, max_offset)
            if res is not None:
                return res
            i += 1
        return ReadResult(b"", offset, offset)

    def batches(self, start_offset: int = 0, end_offset: int | None = None) -> Iterator[LogBatch]:
        """Batches whose last offset >= start_offset (and base offset < end_offset when
        given), in offset order; headers carry the real offsets."""
        for seg in self.segments[self.segment_for(start_offset):]:
            start = 0
            if seg.base_offset < start_offset:
                found = seg.find(start_offset)
                if found is None:
                    continue
                start = found[0]
            for pos, h in seg.scan(start):
                if end_offset is not None and h.base_offset >= end_offset:
                    return
                yield LogBatch(h, seg, pos)

    def offset_for_timestamp(self, timestamp: int, end_offset: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record, in offset order, whose timestamp
        is >= `timestamp` (ms), or None when there is none below `end_offset` (high
        watermark or LSO). Kafka's ListOffsets by timestamp: segments and positions
        are skipped with their time index (headers only); the one batch holding the
        answer is decoded. Control batches never answer. With LogAppendTime every
        record of a batch has the batch's max timestamp."""
        for seg in self.segments:
            start = seg.time_index().start_position(timestamp)
            if start is None:
                continue
            for pos, h in seg.scan(start):
                if h.base_offset >= end_offset:
                    return None
                if h.is_control or h.max_timestamp < timestamp:
                    continue
                if h.attributes & records.TIMESTAMP_TYPE_BIT:
                    return (h.base_offset, h.max_timestamp)
                for r in records.decode_records(seg.read_at(pos, h.size), 0, h):
                    if r.timestamp >= timestamp:
                        return (r.offset, r.timestamp) if r.offset < end_offset else None
        return None

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (ms) from the log
        start offset on, the first one in offset order when several have it; None when
        the log holds no record. Kafka's ListOffsets MAX_TIMESTAMP (KIP-734,
        `UnifiedLog.fetchOffsetByTimestamp`), except that control batches never answer
        (as in `offset_for_timestamp`). Segments are visited by their time index's max
        timestamp, largest first, and the scan stops at one that cannot hold a larger
        timestamp; only the batches that could hold a new answer are decoded. With
        LogAppendTime every record of a batch has the batch's max timestamp."""
        start = self._log_start_offset
        best: tuple[int, int] | None = None  # (timestamp, offset)

        def better(ts: int, offset: int) -> bool:
            return best is None or ts > best[0] or (ts == best[0] and offset < best[1])
        for seg in sorted(self.segments, key=lambda sg: -sg.time_index().max_timestamp):
            if best is not None and seg.time_index().max_timestamp < best[0]:
                break
            for pos, h in seg.scan(0):
                if h.is_control or h.last_offset < start or not better(h.max_timestamp, max(h.base_offset, start)):
                    continue
                if h.attributes & records.TIMESTAMP_TYPE_BIT:
                    best = (h.max_timestamp, max(h.base_offset, start))
                    continue
                for r in records.decode_records(seg.read_at(pos, h.size), 0, h):
                    if r.offset >= start and better(r.timestamp, r.offset):
                        best = (r.timestamp, r.offset)
        return None if best is None else (best[1], best[0])

    def collect_aborted(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """Aborted transactions intersecting [fetch_offset, upper_bound), scanning the
        txn indexes from the segment holding fetch_offset until an entry's LSO reaches
        upper_bound (design doc "Client-Broker request handling", fetch step 4)."""
        out: list[AbortedTxn] = []
        for seg in self.segments[self.segment_for(fetch_offset):]:
            found, complete = seg.collect_aborted(fetch_offset, upper_bound)
            out.extend(found)
            if complete:
                break
        return out

    # ------------------------------------------------------------ truncation
    def truncate_to(self, offset: int) -> None:
        """Remove everything at and after `offset` (a batch boundary), e.g. for a
        follower diverging from its leader. Keeps at least one (possibly empty) segment."""
        if offset >= self.log_end_offset:
            return
        if offset < self.recovery_point:
            # Durably first: a crash during the truncation then scans (and replays) from
            # below it instead of trusting files half truncated (an aborted-index entry
            # gone while its marker is still in the log).
            base = self.segments[self.segment_for(offset)].base_offset
            self._write_recovery_point((base, base, 0))
        while len(self.segments) > 1 and self.segments[-1].base_offset >= offset:
            self.segments.pop().delete()
            self._bases.pop()
        seg = self.segments[-1]
        if seg.base_offset >= offset:
            seg.truncate_to(seg.base_offset)
        else:
            seg.truncate_to(offset)
        self.flush()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and start empty at `offset` (log start and end), as
        Kafka's truncateFullyAndStartAt: a follower whose log ends below its
        leader's log start offset. Raises OSError."""
        for seg in self.segments:
            seg.delete()
        new = Segment(self.dir, offset, self.config)
        self.segments = [new]
        self._bases = [offset]
        self._log_start_offset = offset
        self._write_log_start_offset()
        self._recovery_point = (offset, offset, 0)
        self.flush()

    # ------------------------------------------------------------ retention and compaction
    def delete_segments(self, count: int) -> int:
        """Delete the oldest `count` segments (never the active one) and move the log
        start offset to the new first segment's base if it was below. Returns the
        bytes deleted. Raises OSError."""
        count = min(count, len(self.segments) - 1)
        if count <= 0:
            return 0
        gone = self.segments[:count]
        new_start = self.segments[count].base_offset
        if new_start > self._log_start_offset:
            self._log_start_offset = new_start
            self._write_log_start_offset()  # before the files go: a crash keeps a consistent start
        del self.segments[:count]
        del self._bases[:count]
        freed = 0
        for seg in gone:
            freed += seg.size
            seg.delete()
        _fsync_dir(self.dir)
        return freed

    def cleaned_path(self, base_offset: int) -> Path:
        """Where the cleaner writes the cleaned replacement of segments starting at
        `base_offset` (see `replace_segments`)."""
        return self.dir / f"{base_offset:020d}{LOG_SUFFIX}{CLEANED_SUFFIX}"

    def replace_segments(self, old: list[Segment], cleaned: Path) -> Segment:
        """Swap consecutive closed segments `old` for the cleaned file `cleaned`
        (written and fsynced by the cleaner: their kept batches, offsets unchanged,
        named by `cleaned_path(old[0].base_offset)`). Crash-safe: the file becomes
        `<base>-<end>.swap`, the old segments are deleted, then it becomes
        `<base>.log` (`Log.open` finishes an interrupted swap). Their aborted-txn
        index entries are dropped (the cleaner removed the aborted data). Returns the
        new segment. Raises ValueError when `old` is not a run of closed segments of
        this log, OSError on I/O failure."""
        first = self.segments.index(old[0]) if old and old[0] in self.segments else -1
        if first < 0 or self.segments[first:first + len(old)] != old or first + len(old) >= len(self.segments):
            raise ValueError("replace_segments needs consecutive closed segments of this log")
        base = old[0].base_offset
        end = self.segments[first + len(old)].base_offset
        swap = self.dir / f"{base:020d}-{end:020d}{SWAP_SUFFIX}"
        os.replace(cleaned, swap)
        _fsync_dir(self.dir)
        for seg in old:
            seg.delete()
        os.replace(swap, self.dir / f"{base:020d}{LOG_SUFFIX}")
        _fsync_dir(self.dir)
        new = Segment(self.dir, base, self.config)
        new.rebuild_index()
        new.seal()
        self.segments[first:first + len(old)] = [new]
        self._bases = [s.base_offset for s in self.segments]
        return new


def _write_atomically(path: Path, data: str | bytes, sync_dir: bool = True) -> None:
    """Replace `path` by `data`: written to `<path>.tmp`, fsynced, renamed over `path`,
    then (`sync_dir`) the directory fsynced, so the rename itself is durable; without
    it a crash may bring the old content back. Raises OSError."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    if sync_dir:
        _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _finish_swaps(directory: Path) -> None:
    """Complete or drop an interrupted segment swap (see `Log.replace_segments`):
    `.cleaned` files were never swapped in (deleted); a `<base>-<end>.swap` file
    replaces the segments of [base, end) that are still present."""
    for stray in directory.glob(f"*{CLEANED_SUFFIX}"):
        log.warning("%s: dropping an unfinished cleaned segment", stray)
        stray.unlink()
    for swap in sorted(directory.glob(f"*{SWAP_SUFFIX}")):
        try:
            base, end = (int(x) for x in swap.stem.split("-"))
        except ValueError:
            log.warning("%s: unexpected swap file name; ignored", swap)
            continue
        for path in directory.glob(f"*{LOG_SUFFIX}"):
            if path.stem.isdigit() and base <= int(path.stem) < end:
                for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TXN_INDEX_SUFFIX):
                    path.with_suffix(suffix).unlink(missing_ok=True)
        log.warning("%s: completing an interrupted segment swap", swap)
        os.replace(swap, directory / f"{base:020d}{LOG_SUFFIX}")
        (directory / f"{base:020d}{INDEX_SUFFIX}").unlink(missing_ok=True)  # rebuilt on open
    _fsync_dir(directory)
