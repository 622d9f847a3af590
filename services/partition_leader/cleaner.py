"""The log cleaner: retention and compaction of the replicas of one process
(docs/design.md, "Retention and compaction").

Every `log.retention.check.interval.ms` the cleaner visits each replica, leader or
follower alike (every replica cleans its own log, as in Kafka):

1. Retention (`Partition.delete_old_segments`): whole closed segments below the log
   start offset (DeleteRecords, or the leader's log start offset a follower
   adopted) are deleted; with "delete" in `cleanup.policy` also those past
   `retention.ms` or beyond `retention.bytes`, but never at or above the high
   watermark or the LSO.
2. Compaction, with "compact" in `cleanup.policy`, when a segment was closed since
   the last pass or `delete.retention.ms` went by: the closed segments below the
   first uncleanable offset (`Partition.cleanable_segments`) are rewritten in a
   worker thread (`compact_segments`) so that

   - the latest record of each key survives (an offset map built over the whole
     cleanable range; records of aborted transactions never count), records
     without a key are kept;
   - records of aborted transactions disappear;
   - tombstones (a null value) and transaction markers disappear once their batch
     is older than `delete.retention.ms`, a COMMIT marker only when no record of
     its transaction survives (a coordinator replaying `CONSUMER_OFFSETS_TOPIC` needs
     the marker of every transactional offset commit it still reads);
   - a batch keeps its base offset, last offset delta, producer id, epoch and base
     sequence (offsets only get gaps; the producer state replays the same);
     unchanged batches are copied byte for byte, filtered ones re-encoded with
     their codec.

   Consecutive segments are merged while the result stays below `segment.bytes`;
   the swap (`Log.replace_segments`) is crash-safe. The worker reads the segment
   files through its own file handles, and the result is installed only if the log
   still starts with the same segments.

An I/O error (OSError) of a replica the process still serves takes the log directory
offline (`on_io_error`, the replica manager's `fail_log_dir`; docs/design.md, "Disk
faults") and ends the pass: nothing more touches the files. One of a replica closed or
deleted meanwhile (its files gone under the worker) is only logged, as a corrupt segment
or a log that changed under the compaction (CorruptRecordError, ValueError) is.

Metrics (prometheus-client, label topic): exactly_log_cleaner_deleted_bytes_total,
exactly_log_cleaner_compacted_bytes_total (bytes saved by compaction),
exactly_log_cleaner_runs_total, exactly_log_cleaner_errors_total and
exactly_log_cleaner_last_run_timestamp_seconds.
"""
from __future__ import annotations

import asyncio
import logging
import os
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from prometheus_client import Counter, Gauge

from exactly_wire import records
from exactly_wire.clock import monotonic_ms as _monotonic_ms
from exactly_wire.clock import wall_clock_ms
from exactly_wire.records import HEADER_SIZE, BatchHeader, CorruptRecordError

from .log import AbortedTxn, Segment
from .partition import Partition

log = logging.getLogger(__name__)

DELETED_BYTES = Counter("exactly_log_cleaner_deleted_bytes", "Bytes of segments deleted by retention "
                        "or DeleteRecords", ["topic"])
COMPACTED_BYTES = Counter("exactly_log_cleaner_compacted_bytes", "Bytes saved by compaction", ["topic"])
RUNS = Counter("exactly_log_cleaner_runs", "Passes of the log cleaner over this process's replicas")
ERRORS = Counter("exactly_log_cleaner_errors", "Replicas the log cleaner failed on (logged)", ["topic"])
LAST_RUN = Gauge("exactly_log_cleaner_last_run_timestamp_seconds", "When the log cleaner last finished a pass")


def scan_file(path: Path) -> Iterator[tuple[BatchHeader, bytes]]:
    """(header, whole batch bytes) of each batch of a segment file, read through a
    file handle of its own; stops at a partial batch. Raises CorruptRecordError for
    a malformed header, OSError on I/O failure."""
    with open(path, "rb") as f:
        while True:
            head = f.read(HEADER_SIZE)
            if len(head) < HEADER_SIZE:
                return
            h = records.parse_header(head)
            body = f.read(h.size - HEADER_SIZE)
            if len(body) < h.size - HEADER_SIZE:
                return
            yield h, head + body


class AbortedRanges:
    """Whether a transactional batch belongs to an aborted transaction, from the
    aborted-transaction index entries (pid, first offset, last offset)."""

    def __init__(self, entries: Iterable[AbortedTxn]):
        by_pid: dict[int, list[tuple[int, int]]] = {}
        for e in entries:
            by_pid.setdefault(e.producer_id, []).append((e.first_offset, e.last_offset))
        self._firsts = {pid: [r[0] for r in sorted(rs)] for pid, rs in by_pid.items()}
        self._ranges = {pid: sorted(rs) for pid, rs in by_pid.items()}

    def __call__(self, producer_id: int, offset: int) -> bool:
        firsts = self._firsts.get(producer_id)
        if not firsts:
            return False
        i = bisect_right(firsts, offset) - 1
        return i >= 0 and self._ranges[producer_id][i][1] >= offset


def build_offset_map(paths: Sequence[Path], aborted: Callable[[int, int], bool]) -> dict[bytes, int]:
    """Key -> offset of its latest record in the segment files `paths` (in offset
    order), ignoring control batches and records of aborted transactions."""
    latest: dict[bytes, int] = {}
    for path in paths:
        for h, batch in scan_file(path):
            if h.is_control or (h.is_transactional and aborted(h.producer_id, h.base_offset)):
                continue
            for r in records.decode_records(batch, 0, h):
                if r.key is not None:
                    latest[r.key] = r.offset
    return latest


@dataclass
class GroupResult:
    """Outcome of cleaning one group of segments into `path`: bytes read and
    written, batches and records dropped."""

    path: Path
    bytes_in: int = 0
    bytes_out: int = 0
    batches_dropped: int = 0
    records_dropped: int = 0

    @property
    def changed(self) -> bool:
        return self.batches_dropped > 0 or self.records_dropped > 0


def _filter_batch(h: BatchHeader, batch: bytes, latest: dict[bytes, int], horizon_ms: int
                  ) -> tuple[bytes | None, int]:
    """The batch with only the records to keep (None: none), and how many went."""
    recs = records.decode_records(batch, 0, h)
    tombstones_expire = h.max_timestamp < horizon_ms
    keep = [r for r in recs
            if r.key is None or (latest.get(r.key, r.offset) == r.offset and
                                 not (r.value is None and tombstones_expire))]
    dropped = len(recs) - len(keep)
    if not keep:
        return None, dropped
    if dropped == 0:
        return batch, 0
    blob = b"".join(records.encode_record(r.offset - h.base_offset, r.timestamp - h.base_timestamp,
                                          r.key, r.value, r.headers) for r in keep)
    out = records.build_batch(blob, len(keep), h.base_timestamp, h.max_timestamp, h.last_offset_delta,
                              base_offset=h.base_offset, producer_id=h.producer_id,
                              producer_epoch=h.producer_epoch, base_sequence=h.base_sequence,
                              transactional=h.is_transactional, compression=h.compression,
                              partition_leader_epoch=h.partition_leader_epoch)
    if h.attributes & records.TIMESTAMP_TYPE_BIT:
        buf = bytearray(out)  # keep LogAppendTime: attributes are covered by the CRC
        attr_pos = 21
        buf[attr_pos:attr_pos + 2] = (h.attributes & 0xFFFF).to_bytes(2, "big")
        crc = records.compute_crc(buf, 0, len(buf))
        buf[17:21] = crc.to_bytes(4, "big")
        out = bytes(buf)
    return out, dropped


def compact_segments(groups: Sequence[Sequence[Path]], outputs: Sequence[Path], aborted: Callable[[int, int], bool],
                     now_ms: int, delete_retention_ms: int, fsync: bool = True) -> list[GroupResult]:
    """Compact the segment files of `groups` (consecutive, in offset order, from the
    log's first segment) into `outputs` (one file per group), as the module says.
    Pure file work, safe in a worker thread. Raises OSError, CorruptRecordError."""
    latest = build_offset_map([p for g in groups for p in g], aborted)
    horizon = now_ms - delete_retention_ms
    kept_in_txn: dict[int, bool] = {}  # pid -> a record of its current transaction survives
    results = []
    for paths, out_path in zip(groups, outputs):
        res = GroupResult(out_path)
        with open(out_path, "wb") as out:
            for path in paths:
                for h, batch in scan_file(path):
                    res.bytes_in += len(batch)
                    keep: bytes | None
                    if h.is_control:
                        survivors = kept_in_txn.pop(h.producer_id, False)
                        keep = batch if survivors or h.max_timestamp >= horizon else None
                        if keep is None:
                            res.records_dropped += h.record_count
                    elif h.is_transactional and aborted(h.producer_id, h.base_offset):
                        keep = None
                        res.records_dropped += h.record_count
                    else:
                        keep, dropped = _filter_batch(h, batch, latest, horizon)
                        res.records_dropped += dropped
                        if keep is not None and h.is_transactional:
                            kept_in_txn[h.producer_id] = True
                    if keep is None:
                        res.batches_dropped += 1
                        continue
                    out.write(keep)
                    res.bytes_out += len(keep)
            out.flush()
            if fsync:
                os.fsync(out.fileno())
        results.append(res)
    return results


def group_by_size(segments: Sequence[Segment], max_bytes: int) -> list[list[Segment]]:
    """Consecutive runs of `segments` whose sizes add up to at most `max_bytes` (a
    segment larger than that alone), spanning less than 2**31 offsets each."""
    groups: list[list[Segment]] = []
    size = 0
    for seg in segments:
        if groups and size + seg.size <= max_bytes and seg.next_offset - groups[-1][0].base_offset < 2 ** 31 - 1:
            groups[-1].append(seg)
            size += seg.size
        else:
            groups.append([seg])
            size = seg.size
    return groups


class LogCleaner:
    """Retention and compaction of the replicas of `replicas()` (Partition objects,
    owned by the event loop thread). Settings: `log.retention.check.interval.ms`
    (default 300000), `log.cleaner.enable` (true; false turns compaction off, not
    retention)."""

    def __init__(self, replicas: Callable[[], Iterable[Partition]], is_open: Callable[[Partition], bool],
                 compaction: bool = True, clock_ms: Callable[[], int] = wall_clock_ms,
                 monotonic_ms: Callable[[], int] = _monotonic_ms,
                 on_io_error: Callable[[OSError], None] | None = None):
        self.replicas = replicas
        self.is_open = is_open
        self.on_io_error = on_io_error  # the log directory failed (see the module docstring)
        self.compaction = compaction
        self.clock_ms = clock_ms
        self.monotonic_ms = monotonic_ms  # the interval between two passes (`_due`)
        # partition -> (end offset of the range cleaned last, when: monotonic ms)
        self._cleaned: dict[tuple[str, int], tuple[int, int]] = {}

    async def run_once(self) -> tuple[int, int]:
        """One pass over every replica. Returns (bytes deleted, bytes saved by
        compaction). Failures are logged per replica and counted; the pass goes on,
        except after an I/O error of a replica still served here, which takes the log
        directory offline (`on_io_error`) and ends it."""
        deleted = saved = 0
        for p in list(self.replicas()):
            try:
                freed = p.delete_old_segments()
                if freed:
                    DELETED_BYTES.labels(p.topic).inc(freed)
                    deleted += freed
                if self.compaction and p.config.compact:
                    gained = await self.compact(p)
                    saved += gained
            except (OSError, CorruptRecordError, ValueError) as exc:
                ERRORS.labels(p.topic).inc()
                if isinstance(exc, OSError) and self.on_io_error is not None and self.is_open(p):
                    log.exception("%s-%d: log cleaner failed with an I/O error", p.topic, p.partition)
                    self.on_io_error(exc)
                    break
                log.warning("%s-%d: log cleaner failed: %s", p.topic, p.partition, exc)
        RUNS.inc()
        LAST_RUN.set(self.clock_ms() / 1000)
        return deleted, saved

    def _due(self, p: Partition, end: int) -> bool:
        last = self._cleaned.get((p.topic, p.partition))
        return last is None or end > last[0] or self.monotonic_ms() - last[1] >= p.config.delete_retention_ms

    async def compact(self, p: Partition, force: bool = False) -> int:
        """Compact the cleanable segments of `p` when due (a new closed segment, or
        `delete.retention.ms` since the last pass) or `force`. Returns the bytes saved."""
        segs = p.cleanable_segments()
        if not segs:
            return 0
        end = segs[-1].next_offset
        if not force and not self._due(p, end):
            return 0
        groups = group_by_size(segs, p.config.log.segment_bytes)
        aborted = AbortedRanges(p.log.collect_aborted(segs[0].base_offset, end))
        outputs = [p.log.cleaned_path(g[0].base_offset) for g in groups]
        now = p.retention_now_ms()  # the tombstones' horizon (wall clock)
        try:
            results = await asyncio.to_thread(compact_segments, [[s.log_path for s in g] for g in groups],
                                              outputs, aborted, now, p.config.delete_retention_ms)
        except BaseException:
            for path in outputs:
                path.unlink(missing_ok=True)
            raise
        saved = 0
        for g, res in zip(groups, results):
            if not self.is_open(p) or not (res.changed or len(g) > 1):
                res.path.unlink(missing_ok=True)
                continue
            try:
                saved += p.install_cleaned(g, res.path)
            except ValueError:
                log.info("%s-%d: log changed during compaction; cleaning again later", p.topic, p.partition)
                continue
        self._cleaned[(p.topic, p.partition)] = (end, self.monotonic_ms())
        if saved:
            COMPACTED_BYTES.labels(p.topic).inc(saved)
            log.info("%s-%d: compacted offsets [%d, %d): %d bytes saved", p.topic, p.partition,
                     segs[0].base_offset, end, saved)
        return saved
