"""One partition replica led by this process: log + producer state + LSO.

Produce (`append`), transaction markers (`write_marker`), Fetch (`fetch`) and
ListOffsets (`list_offset`) as the design doc's "Client-Broker request handling",
"Coordinator-Broker request handling", "Last Stable Offset Tracking" and "Aborted
Transaction Index" sections describe them. Expected outcomes are ErrorCode values in
the results; exceptions mean bugs, corruption or I/O failure (STYLE.md 3).

The high watermark is kept apart from the log end offset: with a single replica it
follows the log end after every append (`_advance_high_watermark`), and replication
will move it on follower acknowledgement instead. `leader_epoch` is stamped into
every appended batch and checked against Fetch's `current_leader_epoch`.

Producer-state snapshots go to the shared `SnapshotStore` at most every
`producer.snapshot.interval.ms` when the log end moved, and on `close()`; opening
loads the newest valid snapshot not beyond the log end and replays the log after
it, falling back to older snapshots and finally to a full log scan.
"""
from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, NamedTuple

from exactly import records
from exactly.errors import ErrorCode
from exactly.records import CorruptRecordError

from .log import AbortedTxn, Log, LogConfig
from .producer_state import ProducerStateManager, SnapshotError
from .snapshot_store import SnapshotStore

log = logging.getLogger(__name__)

READ_UNCOMMITTED = 0
READ_COMMITTED = 1

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
LAST_STABLE_OFFSET_TIMESTAMP = -3  # the design doc's sentinel ("ListOffsetRequest")


def _now_ms() -> int:
    return int(time.time() * 1000)


# Setting name -> (Kafka broker-level alias, default). Topic configs override
# process settings; a process setting may use either name.
_SETTINGS = {
    "segment.bytes": ("log.segment.bytes", 1073741824),
    "index.interval.bytes": ("log.index.interval.bytes", 4096),
    "flush.messages": ("log.flush.interval.messages", sys.maxsize),
    "producer.snapshot.interval.ms": (None, 30000),
    "producer.snapshot.retained": (None, 3),
    "producer.id.expiration.ms": (None, 86400000),
}


@dataclass(frozen=True)
class PartitionConfig:
    """Settings of one partition (keys in `from_settings`).

    snapshot_interval_ms: `producer.snapshot.interval.ms`, minimum ms between
        periodic producer-state snapshots; snapshots_retained:
        `producer.snapshot.retained`, how many snapshots to keep (>= 1);
    producer_id_expiration_ms: `producer.id.expiration.ms`.
    """

    log: LogConfig = field(default_factory=LogConfig)
    snapshot_interval_ms: int = 30000
    snapshots_retained: int = 3
    producer_id_expiration_ms: int = 86400000

    @classmethod
    def from_settings(cls, props: Mapping[str, str], topic_configs: Mapping[str, str] | None = None
                      ) -> "PartitionConfig":
        """Resolve settings: topic config, else process setting (Kafka topic-level
        name, or broker-level alias such as `log.segment.bytes`), else default.
        Raises ValueError naming a malformed value."""
        topic_configs = topic_configs or {}

        def get(key: str) -> int:
            alias, default = _SETTINGS[key]
            for source, name in ((topic_configs, key), (props, key), (props, alias)):
                if name and name in source:
                    try:
                        return int(source[name])
                    except ValueError:
                        raise ValueError(f"setting {name}={source[name]!r} is not an integer") from None
            return default

        return cls(LogConfig(segment_bytes=get("segment.bytes"),
                             index_interval_bytes=get("index.interval.bytes"),
                             flush_messages=max(get("flush.messages"), 1)),
                   snapshot_interval_ms=get("producer.snapshot.interval.ms"),
                   snapshots_retained=max(get("producer.snapshot.retained"), 1),
                   producer_id_expiration_ms=get("producer.id.expiration.ms"))


class AppendResult(NamedTuple):
    """Produce outcome: base_offset is the assigned offset (or, for
    DUPLICATE_SEQUENCE_NUMBER, the offset the original batch got); -1 on error."""

    error: ErrorCode
    base_offset: int = -1
    log_start_offset: int = -1
    message: str = ""


class MarkerResult(NamedTuple):
    """WriteTxnMarkers outcome for this partition; offset of the marker or -1."""

    error: ErrorCode
    offset: int = -1
    message: str = ""


class FetchResult(NamedTuple):
    """Fetch outcome. records: whole batches (raw bytes); aborted: (pid, first offset)
    of the aborted transactions intersecting the returned range (read_committed only)."""

    error: ErrorCode
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted: tuple[tuple[int, int], ...] = ()
    records: bytes = b""
    message: str = ""


class Partition:
    """A led partition replica. Build with `Partition.open(...)`."""

    def __init__(self, topic: str, partition: int, plog: Log, producers: ProducerStateManager,
                 store: SnapshotStore | None, config: PartitionConfig, *, leader_epoch: int = 0,
                 clock_ms: Callable[[], int] = _now_ms):
        self.topic = topic
        self.partition = partition
        self.log = plog
        self.producers = producers
        self.store = store
        self.config = config
        self.leader_epoch = leader_epoch
        self.clock_ms = clock_ms
        self.high_watermark = plog.log_end_offset
        self._last_snapshot_offset = -1
        self._last_snapshot_ms = clock_ms()
        self.snapshot_loaded_from: int | None = None  # offset of the snapshot used by open()

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def open(cls, topic: str, partition: int, data_dir: Path, config: PartitionConfig | None = None,
             store: SnapshotStore | None = None, *, internal: bool | None = None, leader_epoch: int = 0,
             clock_ms: Callable[[], int] = _now_ms) -> "Partition":
        """Open (or create) `<data_dir>/logs/<topic>-<partition>/`, recover the log and
        rebuild the producer state (snapshot + replay). `internal` defaults to the
        topic name starting with "__". Raises OSError on I/O failure."""
        config = config or PartitionConfig()
        plog = Log.open(data_dir / "logs" / f"{topic}-{partition}", config.log)
        producers = ProducerStateManager(internal=topic.startswith("__") if internal is None else internal,
                                         expiration_ms=config.producer_id_expiration_ms, clock_ms=clock_ms)
        self = cls(topic, partition, plog, producers, store, config, leader_epoch=leader_epoch, clock_ms=clock_ms)
        self._load_producer_state()
        return self

    def close(self) -> None:
        """Flush the log and write a final producer-state snapshot (clean shutdown)."""
        self.log.flush()
        self.take_snapshot(sync=True)
        self.log.close()

    # ------------------------------------------------------------ offsets
    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        """Smallest first offset of the ongoing transactions, else the high watermark
        (design doc "Last Stable Offset Tracking")."""
        first = self.producers.first_unstable_offset
        return self.high_watermark if first is None else min(first, self.high_watermark)

    def _advance_high_watermark(self) -> None:
        # Single replica: everything appended is replicated. Replication will move
        # the high watermark on follower acknowledgement instead.
        self.high_watermark = self.log.log_end_offset

    # ------------------------------------------------------------ produce
    def append(self, batch: bytes) -> AppendResult:
        """Append one client record batch v2 (Produce).

        Validates without decoding records: CRC32C and framing (CORRUPT_MESSAGE, the
        log unchanged), exactly one batch and no control bit (INVALID_REQUEST), PID /
        epoch / sequence rules (`ProducerStateManager.check_append`). A retried batch
        equal to one of the PID's last 5 gets DUPLICATE_SEQUENCE_NUMBER with the
        original base offset and is not appended again. Offsets are assigned by
        rewriting the base offset in place."""
        buf = bytearray(batch)
        try:
            h = records.verify_crc(buf)
        except CorruptRecordError as exc:
            return AppendResult(ErrorCode.CORRUPT_MESSAGE, message=str(exc))
        if h.size != len(buf):
            return AppendResult(ErrorCode.INVALID_REQUEST,
                                message=f"expected one record batch, got {len(buf) - h.size} extra bytes")
        if h.record_count < 1 or h.record_count != h.last_offset_delta + 1:
            return AppendResult(ErrorCode.CORRUPT_MESSAGE,
                                message=f"record count {h.record_count} does not match last offset delta "
                                        f"{h.last_offset_delta}")
        if h.is_control:
            return AppendResult(ErrorCode.INVALID_REQUEST,
                                message="control batches are written only through WriteTxnMarkers")
        if h.compression not in (records.COMPRESSION_NONE, records.COMPRESSION_GZIP):
            return AppendResult(ErrorCode.INVALID_REQUEST, message=f"unsupported compression {h.compression}")
        if h.producer_id < 0:
            if h.is_transactional:
                return AppendResult(ErrorCode.INVALID_REQUEST, message="transactional batch without a producer id")
        else:
            check = self.producers.check_append(h)
            if check.error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
                return AppendResult(check.error, check.duplicate.first_offset, self.log_start_offset, check.message)
            if check.error != ErrorCode.NONE:
                return AppendResult(check.error, -1, self.log_start_offset, check.message)
        info = self.log.append(buf, h, self.leader_epoch)
        if h.producer_id >= 0:
            self.producers.on_append(h._replace(base_offset=info.base_offset))
        else:
            self.producers.map_end_offset = info.last_offset + 1
        self._advance_high_watermark()
        return AppendResult(ErrorCode.NONE, info.base_offset, self.log_start_offset)

    # ------------------------------------------------------------ markers
    def write_marker(self, producer_id: int, producer_epoch: int, committed: bool,
                     coordinator_epoch: int) -> MarkerResult:
        """Write a COMMIT or ABORT marker for `producer_id` (WriteTxnMarkers; design doc
        "Coordinator-Broker request handling").

        TRANSACTION_COORDINATOR_FENCED for a coordinator epoch older than the PID's,
        INVALID_PRODUCER_EPOCH for an older producer epoch. A marker for a PID without
        an ongoing transaction here is still written (coordinator retries succeed).
        On ABORT, the aborted-index entry gets the LSO computed before the
        transaction completes (STYLE.md 9)."""
        check = self.producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
        if check.error != ErrorCode.NONE:
            return MarkerResult(check.error, message=check.message)
        now = self.clock_ms()
        batch = bytearray(records.encode_control_batch(committed, producer_id, producer_epoch,
                                                       coordinator_epoch, now))
        h = records.parse_header(batch)
        marker_offset = self.log.log_end_offset
        lso = self.producers.lso_excluding(producer_id, marker_offset + 1)
        info = self.log.append(batch, h, self.leader_epoch)
        completed = self.producers.complete_marker(producer_id, producer_epoch, coordinator_epoch,
                                                   info.base_offset, now, committed)
        if completed.is_aborted:
            self.log.append_aborted(AbortedTxn(producer_id, completed.first_offset, info.base_offset, lso))
        self._advance_high_watermark()
        return MarkerResult(ErrorCode.NONE, info.base_offset)

    # ------------------------------------------------------------ fetch
    def fetch(self, offset: int, max_bytes: int, isolation_level: int = READ_UNCOMMITTED,
              current_leader_epoch: int = -1) -> FetchResult:
        """Read whole batches from `offset` (design doc "Client-Broker request
        handling", fetch steps 1-5).

        isolation_level 0 reads below the high watermark, 1 below the LSO and also
        returns the aborted transactions intersecting the returned range. max_bytes
        bounds the bytes (one batch is returned even if larger); max_bytes <= 0
        returns offsets only (a response whose byte budget is spent).
        Errors: OFFSET_OUT_OF_RANGE outside [log start, high watermark];
        FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH when current_leader_epoch (>= 0)
        is older / newer than ours."""
        hw, lso, start = self.high_watermark, self.last_stable_offset, self.log_start_offset
        if current_leader_epoch >= 0 and current_leader_epoch != self.leader_epoch:
            err = (ErrorCode.FENCED_LEADER_EPOCH if current_leader_epoch < self.leader_epoch
                   else ErrorCode.UNKNOWN_LEADER_EPOCH)
            return FetchResult(err, hw, lso, start)
        if offset < start or offset > hw:
            return FetchResult(ErrorCode.OFFSET_OUT_OF_RANGE, hw, lso, start,
                               message=f"offset {offset} outside [{start}, {hw}]")
        if max_bytes <= 0:
            return FetchResult(ErrorCode.NONE, hw, lso, start)
        committed = isolation_level == READ_COMMITTED
        res = self.log.read(offset, max_bytes, lso if committed else hw)
        aborted: tuple[tuple[int, int], ...] = ()
        if committed and res.records:
            aborted = tuple((t.producer_id, t.first_offset)
                            for t in self.log.collect_aborted(offset, res.next_offset))
        return FetchResult(ErrorCode.NONE, hw, lso, start, aborted, res.records)

    # ------------------------------------------------------------ list offsets
    def list_offset(self, timestamp: int, isolation_level: int = READ_UNCOMMITTED) -> tuple[ErrorCode, int, int]:
        """ListOffsets: returns (error, offset, timestamp). timestamp -2: log start;
        -1: high watermark (the LSO for read_committed); -3: LSO. A timestamp >= 0
        (ms) finds the first record at or after it below that bound (offset -1 when
        none); this scans batch headers, there is no time index."""
        bound = self.last_stable_offset if isolation_level == READ_COMMITTED else self.high_watermark
        if timestamp == EARLIEST_TIMESTAMP:
            return ErrorCode.NONE, self.log_start_offset, -1
        if timestamp == LATEST_TIMESTAMP:
            return ErrorCode.NONE, bound, -1
        if timestamp == LAST_STABLE_OFFSET_TIMESTAMP:
            return ErrorCode.NONE, self.last_stable_offset, -1
        if timestamp < 0:
            return ErrorCode.INVALID_REQUEST, -1, -1
        for b in self.log.batches(self.log_start_offset, bound):
            h = b.header
            if h.is_control or h.max_timestamp < timestamp or h.last_offset >= bound:
                continue
            for r in records.decode_records(b.read(), 0, h):
                if r.timestamp >= timestamp:
                    return ErrorCode.NONE, r.offset, r.timestamp
        return ErrorCode.NONE, -1, -1

    # ------------------------------------------------------------ producer state
    def expire_producers(self, now_ms: int | None = None) -> list[int]:
        """Drop PIDs idle longer than `producer.id.expiration.ms` (no ongoing txn)."""
        return self.producers.expire(now_ms)

    def maybe_snapshot(self, now_ms: int | None = None) -> bool:
        """Take a snapshot when `producer.snapshot.interval.ms` passed since the last
        one and the log end moved. Returns whether one was written."""
        now = self.clock_ms() if now_ms is None else now_ms
        if now - self._last_snapshot_ms < self.config.snapshot_interval_ms:
            return False
        return self.take_snapshot(now_ms=now)

    def take_snapshot(self, sync: bool = False, now_ms: int | None = None) -> bool:
        """Write the producer state keyed by the log end offset, unless one exists for
        that offset; keep the newest `producer.snapshot.retained`. Returns whether written."""
        self._last_snapshot_ms = self.clock_ms() if now_ms is None else now_ms
        offset = self.log.log_end_offset
        if self.store is None or offset == self._last_snapshot_offset:
            return False
        self.store.put(self.topic, self.partition, offset, self.producers.encode_snapshot(), sync=sync)
        self._last_snapshot_offset = offset
        for old in self.store.offsets(self.topic, self.partition)[:-self.config.snapshots_retained]:
            self.store.delete(self.topic, self.partition, old)
        return True

    def _load_producer_state(self) -> None:
        start, end = self.log.log_start_offset, self.log.log_end_offset
        offsets = self.store.offsets(self.topic, self.partition) if self.store else []
        loaded_from = None
        for off in reversed(offsets):
            if off > end:
                # Taken past what survived (an unflushed tail was lost): unusable.
                self.store.delete(self.topic, self.partition, off)
                continue
            if off < start:
                break
            try:
                self.producers.load_snapshot(self.store.get(self.topic, self.partition, off) or b"", off)
            except SnapshotError as exc:
                log.warning("%s-%d: snapshot at offset %d unusable (%s), trying an older one",
                            self.topic, self.partition, off, exc)
                continue
            loaded_from = off
            break
        if loaded_from is None:
            self.producers.reset(start)
            loaded_from = start
        self.snapshot_loaded_from = loaded_from if offsets else None
        self._replay(loaded_from)
        self.producers.expire()
        if loaded_from == end and loaded_from in offsets:
            self._last_snapshot_offset = end

    def _replay(self, start_offset: int) -> None:
        """Rebuild producer state from the batches at and after `start_offset`; restore
        an aborted-index entry missing for an ABORT marker (crash between the two)."""
        for b in self.log.batches(start_offset):
            h = b.header
            if h.base_offset < start_offset:
                continue
            control = None
            if h.is_control:
                ctype, coordinator_epoch = records.decode_control_record(records.decode_records(b.read(), 0, h)[0])
                control = (ctype == records.CONTROL_COMMIT, coordinator_epoch)
                lso = self.producers.lso_excluding(h.producer_id, h.base_offset + 1)
            completed = self.producers.replay_batch(h, control)
            if completed is not None and completed.is_aborted and \
                    not self.log.has_aborted_entry(h.producer_id, h.base_offset):
                self.log.append_aborted(AbortedTxn(h.producer_id, completed.first_offset, h.base_offset, lso))
