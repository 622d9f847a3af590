"""Per-partition producer state: idempotence, fencing and ongoing transactions.

For every PID that wrote to the partition we keep a `ProducerStateEntry` (design doc
"PID-Sequence Management"; Kafka's `ProducerStateManager`): producer epoch, the
metadata of its last 5 batches (so up to 5 in-flight batches deduplicate on retry,
Kafka >= 1.0), coordinator epoch, last timestamp and the first offset of its
ongoing transaction (-1 = none).

Appends follow prepare -> persist -> complete (docs/design.md, "Code conventions"): `check_append` /
`check_marker` validate without mutating; the partition writes the log; then
`on_append` / `complete_marker` update the state. `replay_batch` rebuilds the state
from the log (recovery, no validation: the log is the source of truth).

Ongoing transactions live in `ongoing` (first offset -> PID). A transaction starts
at the current log end, so inserting in append order keeps the dict sorted by first
offset; the LSO is its first key (docs/design.md, "Last stable offset and read_committed"). Snapshots (`encode_snapshot` /
`decode_snapshot`) are versioned and CRC32C-checked (docs/design.md, "Code conventions").

Not thread-safe: one owner (the partition) calls it.
"""
from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple

import crc32c

from exactly_wire.clock import wall_clock_ms
from exactly_wire.error_codes import ErrorCode
from exactly_wire.records import NO_PRODUCER_EPOCH, NO_SEQUENCE, BatchHeader

NUM_BATCHES_TO_RETAIN = 5
INT32_MAX = 0x7FFFFFFF
# TxnPartitionsAdded notices a partition keeps (one per PID, dropped by its marker): a
# bound for producers that never write the partition they added.
MAX_ADDED_NOTICES = 10_000

# Version 2 adds the completed transactions whose marker may not be replicated yet
# (`unreplicated`); version 1 snapshots still load (with none).
SNAPSHOT_VERSION = 2
_READABLE_VERSIONS = (1, 2)
_SNAP_HEADER = struct.Struct(">hI")  # version, crc32c of the body
_SNAP_COUNT = struct.Struct(">i")
_SNAP_ENTRY = struct.Struct(">qhiqqb")  # pid, epoch, coordinator epoch, txn first offset, last ts, #batches
_SNAP_BATCH = struct.Struct(">iiqiq")  # first seq, last seq, last offset, offset delta, timestamp
_SNAP_UNREPLICATED = struct.Struct(">qq")  # txn first offset, marker offset


class SnapshotError(ValueError):
    """A producer-state snapshot is unreadable: unknown version, bad CRC or truncated."""


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """Whether `next_seq` directly follows `last_seq` (sequences wrap at Int32 max)."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """What is kept of one appended batch: sequences, offsets (absolute), timestamp (ms)."""

    first_seq: int
    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


@dataclass(slots=True)
class ProducerStateEntry:
    """State of one PID on one partition (docs/design.md, "Idempotence and fencing").

    producer_epoch -1 = none yet; coordinator_epoch -1 = no marker seen;
    current_txn_first_offset -1 = no ongoing transaction; last_timestamp in ms.
    """

    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1
    last_timestamp: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def first_seq(self) -> int:
        return self.batches[0].first_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The cached batch with exactly these sequences under the current epoch."""
        if epoch != self.producer_epoch:
            return None
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None

    def maybe_update_epoch(self, epoch: int) -> bool:
        """Move to `epoch`; a new epoch forgets the batches (sequences restart at 0)."""
        if epoch == self.producer_epoch:
            return False
        self.batches.clear()
        self.producer_epoch = epoch
        return True

    def add_batch(self, epoch: int, first_seq: int, last_seq: int, last_offset: int,
                  offset_delta: int, timestamp: int) -> None:
        self.maybe_update_epoch(epoch)
        if first_seq != NO_SEQUENCE:
            self.batches.append(BatchMetadata(first_seq, last_seq, last_offset, offset_delta, timestamp))
        self.last_timestamp = timestamp


class AppendCheck(NamedTuple):
    """Outcome of `check_append`: error NONE means append; DUPLICATE_SEQUENCE_NUMBER
    comes with the original batch in `duplicate`."""

    error: ErrorCode
    message: str = ""
    duplicate: BatchMetadata | None = None


OK = AppendCheck(ErrorCode.NONE)


class CompletedTxn(NamedTuple):
    """A transaction ended by a marker: first data offset (the marker offset if the
    PID had no ongoing transaction here) and the marker's offset."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool



class VerificationGuard:
    """A transaction verification in flight for one PID on one partition (KIP-890
    part 1; Kafka's VerificationGuard): an append verified under it is refused once a
    marker that may end the verified transaction was applied. `producer_epoch`: the
    lowest epoch of the batches verified under it.

    Which markers end it (`ended_by`): under transaction version 2 every transaction
    ends under the epoch after its own (KIP-890 part 2: EndTxn, the coordinator's
    timeout abort and a fencing InitProducerId all bump it, and the markers carry the
    bumped epoch), so a marker at epoch m ends a transaction that ran at m - 1. A
    transaction version 2 marker at or below the guard's epoch therefore ends an
    earlier transaction -- typically the previous one, whose marker reaches the
    leader while the next transaction's implicit add waited at the coordinator for
    exactly that marker -- and the guard stands. Every other marker (transaction
    version 1, whose markers carry the transaction's own epoch, or a marker above the
    guard's epoch) drops it."""

    __slots__ = ("producer_epoch",)

    def __init__(self, producer_epoch: int):
        self.producer_epoch = producer_epoch

    def ended_by(self, marker_epoch: int, transaction_version: int) -> bool:
        """Whether a marker at `marker_epoch` of `transaction_version` may end the
        transaction this guard verifies (see the class docstring)."""
        return not (transaction_version >= 2 and marker_epoch <= self.producer_epoch)


class ProducerStateManager:
    """All producer state of one partition.

    internal: the topic is internal (name starts with "__"): batches with a PID but
        no sequence (base sequence -1) are accepted, without sequence checks, and PIDs
        never expire: the only PIDs there are the coordinators' writer PIDs, whose
        epoch fences deposed owners however long the partition stays quiet.
    expiration_ms: `producer.id.expiration.ms`, idle time after which a PID without
        an ongoing transaction is forgotten (user topics).
    clock_ms: wall clock in ms (injectable for tests).
    """

    def __init__(self, *, internal: bool = False, expiration_ms: int = 86400000,
                 clock_ms: Callable[[], int] = wall_clock_ms):
        self.internal = internal
        self.expiration_ms = expiration_ms
        self.clock_ms = clock_ms
        self.producers: dict[int, ProducerStateEntry] = {}
        self.ongoing: dict[int, int] = {}  # txn first offset -> pid, ascending
        # Completed transactions whose marker may not be replicated yet: txn first
        # offset -> marker offset (Kafka's unreplicatedTxns); see first_unstable_offset_at.
        self.unreplicated: dict[int, int] = {}
        # PID -> guard of a transaction verification in flight (KIP-890 part 1): a
        # marker that may end the verified transaction drops it (complete_marker), so
        # an append verified before that marker fails.
        self.verification_guards: dict[int, VerificationGuard] = {}
        # PID -> offset of its last marker applied here; complete for the markers at or
        # above markers_known_from (see marker_since).
        self.last_markers: dict[int, int] = {}
        # PID -> (transactional.id, producer epoch, offset) of its coordinator's
        # TxnPartitionsAdded: its ongoing transaction holds this partition, as said when
        # the log ended at that offset or later (`added_verifies`); dropped by the PID's
        # next marker, at most MAX_ADDED_NOTICES (the oldest go first).
        self.added: dict[int, tuple[str, int, int]] = {}
        self.markers_known_from = 0
        self.map_end_offset = 0  # state reflects every batch below this offset

    # ------------------------------------------------------------ queries
    def entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self.producers.get(producer_id)

    @property
    def first_unstable_offset(self) -> int | None:
        """Smallest first offset of the ongoing transactions, or None."""
        return next(iter(self.ongoing), None)

    def first_unstable_offset_at(self, high_watermark: int) -> int | None:
        """Smallest first offset of a transaction whose outcome a read_committed reader
        must not see yet, or None: an ongoing one, or a completed one whose marker is
        not below `high_watermark` (replicated to the ISR) yet, since a leader change
        could still lose that marker (Kafka's `firstUnstableOffset` over ongoing and
        unreplicated transactions; docs/design.md, "Last stable offset and
        read_committed"). Forgets completed transactions whose marker is below it."""
        if self.unreplicated:
            self.unreplicated = {f: m for f, m in self.unreplicated.items() if m >= high_watermark}
        first = next(iter(self.ongoing), None)
        if self.unreplicated:
            oldest = min(self.unreplicated)
            first = oldest if first is None else min(first, oldest)
        return first

    def lso_excluding(self, producer_id: int, default: int) -> int:
        """LSO once `producer_id`'s transaction completes: the first offset of the
        earliest other ongoing transaction, else `default` (the offset after the
        marker). Computed before completing, for the aborted-index entry (Kafka's
        `lastStableOffset(completedTxn)`; docs/design.md, "Last stable offset and read_committed")."""
        for first, pid in self.ongoing.items():
            if pid != producer_id:
                return first
        return default

    def txn_first_offset(self, producer_id: int, marker_offset: int) -> int:
        """First offset of the transaction a marker of `producer_id` at `marker_offset`
        completes: that of its ongoing transaction here, else the marker's own offset
        (as `complete_marker` answers). No mutation: the aborted-index entry of an ABORT
        marker is written with the marker, before the state is updated."""
        entry = self.producers.get(producer_id)
        first = -1 if entry is None else entry.current_txn_first_offset
        return first if first >= 0 else marker_offset

    # ------------------------------------------------------------ verification
    def needs_verification(self, h: BatchHeader, include_internal: bool = False) -> bool:
        """Whether a client batch would start a transaction of its PID here (the PID has
        none ongoing, or one under another epoch), so its transaction coordinator must
        confirm it first (KIP-890 part 1). On internal topics only with
        `include_internal` (a coordinator's transactional offset commit, which must
        not open a transaction no transaction coordinator knows of)."""
        if (self.internal and not include_internal) or not h.is_transactional or h.producer_id < 0:
            return False
        entry = self.producers.get(h.producer_id)
        return entry is None or entry.current_txn_first_offset < 0 or entry.producer_epoch != h.producer_epoch

    def verification_guard(self, producer_id: int, producer_epoch: int) -> "VerificationGuard":
        """The guard of a verification about to start for a batch of `producer_id` at
        `producer_epoch` (the current one if one is in flight, its epoch lowered to
        `producer_epoch` if that is lower). Pass it to `check_append`; a marker that
        may end the transaction being verified invalidates it (`complete_marker`)."""
        guard = self.verification_guards.get(producer_id)
        if guard is None:
            guard = self.verification_guards[producer_id] = VerificationGuard(producer_epoch)
        elif producer_epoch < guard.producer_epoch:
            guard.producer_epoch = producer_epoch
        return guard

    def note_added(self, transactional_id: str, producer_id: int, producer_epoch: int, from_offset: int) -> None:
        """The transaction coordinator of `transactional_id` appended this partition to
        the ongoing transaction of `producer_id` at `producer_epoch`
        (PartitionLeader/TxnPartitionsAdded), and the leader's log ended at
        `from_offset` or later when the coordinator learned of it (the offset after the
        PID's last marker, from this leader's WriteTxnMarkers answer). The caller checks
        that `from_offset` is a position of this log (at most its end, in the leader
        epoch it was given in)."""
        added = self.added
        added.pop(producer_id, None)
        added[producer_id] = (transactional_id, producer_epoch, from_offset)
        if len(added) > MAX_ADDED_NOTICES:
            del added[next(iter(added))]

    def latest_marker_before(self, producer_id: int, offset: int) -> bool:
        """Whether the PID's latest marker known here is at `offset` - 1 (within what the
        state knows of markers): a TxnPartitionsAdded position given after that marker."""
        return offset - 1 >= self.markers_known_from and self.last_markers.get(producer_id) == offset - 1

    def added_verifies(self, transactional_id: str, producer_id: int, producer_epoch: int) -> bool:
        """Whether a TxnPartitionsAdded stands as the KIP-890 verification of a batch of
        `producer_id` at `producer_epoch` under `transactional_id`: noted for that id and
        epoch, and no marker of the PID appended here at or above its offset since
        (`marker_since`), so the transaction it spoke of has not ended here. This is the
        asked verification's guarantee (its guard is dropped by any marker after the
        question), with the question asked before the offset: the coordinator answered
        it when it appended the add."""
        noted = self.added.get(producer_id)
        return (noted is not None and noted[0] == transactional_id and noted[1] == producer_epoch
                and not self.marker_since(producer_id, noted[2]))

    def marker_since(self, producer_id: int, offset: int) -> bool:
        """Whether a marker of `producer_id` may have been appended at or above log
        offset `offset`: one was applied there, or the state does not know (it was
        loaded from a snapshot, or rebuilt, above `offset`). False means a verification
        made when the log ended at `offset` or later still holds here (a coordinator's
        transactional offset commit verified by the group coordinator; Kafka's
        verificationGuards)."""
        return offset < self.markers_known_from or self.last_markers.get(producer_id, -1) >= offset

    # ------------------------------------------------------------ data batches
    def check_append(self, h: BatchHeader, verification_guard: object | None = None) -> AppendCheck:
        """Validate a client batch with a PID (design doc "Client-Broker request
        handling", produce steps 2a-2b, plus Kafka >= 1.0 rules). No mutation.

        Errors: INVALID_PRODUCER_EPOCH (epoch older than the current one);
        DUPLICATE_SEQUENCE_NUMBER (same sequences as one of the last 5 batches of the
        current epoch; `duplicate` holds its offsets); OUT_OF_ORDER_SEQUENCE_NUMBER
        (gap, old sequence outside the cache, or a new epoch not starting at 0);
        UNKNOWN_PRODUCER_ID (unknown PID starting above 0); INVALID_REQUEST (no
        sequence on a non-internal topic); INVALID_TXN_STATE (non-transactional
        batch while the PID has an ongoing transaction, or, with `verification_guard`
        from a verification, the guard no longer current: a marker arrived meanwhile)."""
        pid, epoch, first_seq = h.producer_id, h.producer_epoch, h.base_sequence
        entry = self.producers.get(pid)
        if first_seq == NO_SEQUENCE:
            if not self.internal:
                return AppendCheck(ErrorCode.INVALID_REQUEST,
                                   f"batch of producer {pid} has no sequence number")
        elif entry is not None:
            dup = entry.find_duplicate(epoch, first_seq, h.last_sequence)
            if dup is not None:
                return AppendCheck(ErrorCode.DUPLICATE_SEQUENCE_NUMBER,
                                   f"duplicate of the batch at offset {dup.first_offset}", dup)
        if entry is not None and epoch < entry.producer_epoch:
            return AppendCheck(ErrorCode.INVALID_PRODUCER_EPOCH,
                               f"producer {pid} epoch {epoch} is older than {entry.producer_epoch}")
        if first_seq != NO_SEQUENCE:
            err = self._check_sequence(entry, epoch, first_seq)
            if err is not OK:
                return err
        if entry is not None and entry.current_txn_first_offset >= 0 and not h.is_transactional:
            return AppendCheck(ErrorCode.INVALID_TXN_STATE,
                               f"producer {pid} has an ongoing transaction; expected a transactional batch")
        if verification_guard is not None and self.needs_verification(h) and \
                self.verification_guards.get(pid) is not verification_guard:
            return AppendCheck(ErrorCode.INVALID_TXN_STATE,
                               f"the transaction of producer {pid} ended while its batch was being verified")
        return OK

    @staticmethod
    def _check_sequence(entry: ProducerStateEntry | None, epoch: int, first_seq: int) -> AppendCheck:
        if entry is None or entry.producer_epoch == NO_PRODUCER_EPOCH:
            if first_seq != 0:
                return AppendCheck(ErrorCode.UNKNOWN_PRODUCER_ID,
                                   f"no state for this producer; sequence {first_seq} must be 0")
            return OK
        if epoch != entry.producer_epoch:
            if first_seq != 0:
                return AppendCheck(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                   f"new epoch {epoch} must start at sequence 0, got {first_seq}")
            return OK
        last = entry.last_seq
        if not in_sequence(last, first_seq):
            return AppendCheck(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                               f"sequence {first_seq} does not follow {last} (epoch {epoch})")
        return OK

    def on_append(self, h: BatchHeader) -> None:
        """Record an appended data batch (`h` carries its assigned offsets): batch
        metadata, epoch, and the start of a transaction for the PID."""
        entry = self.producers.get(h.producer_id)
        if entry is None:
            entry = self.producers[h.producer_id] = ProducerStateEntry(h.producer_id)
        entry.add_batch(h.producer_epoch, h.base_sequence, h.last_sequence, h.last_offset,
                        h.last_offset_delta, h.max_timestamp)
        if h.is_transactional and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = h.base_offset
            self._add_ongoing(h.base_offset, h.producer_id)
            self.verification_guards.pop(h.producer_id, None)
        self.map_end_offset = h.last_offset + 1

    def _add_ongoing(self, first_offset: int, pid: int) -> None:
        if self.ongoing and first_offset < next(reversed(self.ongoing)):
            # Out of order only while loading; keep the dict sorted by first offset.
            self.ongoing[first_offset] = pid
            self.ongoing = dict(sorted(self.ongoing.items()))
        else:
            self.ongoing[first_offset] = pid

    # ------------------------------------------------------------ markers
    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                     transaction_version: int = 1) -> AppendCheck:
        """Validate a WriteTxnMarkers request for this partition (design doc
        "Coordinator-Broker request handling", step 1). No mutation.

        Errors: TRANSACTION_COORDINATOR_FENCED (coordinator epoch older than the one
        stored for the PID); INVALID_PRODUCER_EPOCH (producer epoch older than the
        current one; with transaction_version 2, also not above the epoch of the PID's
        ongoing transaction here: such markers end a transaction under the next epoch,
        KIP-890 part 2). An unknown PID, or one without an ongoing transaction, is fine:
        the coordinator's retries must succeed."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return OK
        if coordinator_epoch < entry.coordinator_epoch:
            return AppendCheck(ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                               f"coordinator epoch {coordinator_epoch} is older than {entry.coordinator_epoch}")
        if producer_epoch < entry.producer_epoch:
            return AppendCheck(ErrorCode.INVALID_PRODUCER_EPOCH,
                               f"marker epoch {producer_epoch} is older than {entry.producer_epoch}")
        if transaction_version >= 2 and entry.current_txn_first_offset >= 0 and producer_epoch <= entry.producer_epoch:
            # Every transaction ends under the next epoch (KIP-890 part 2): a marker at
            # the epoch of the ongoing transaction's data is a late duplicate of the
            # previous transaction's marker, and must not end this one.
            return AppendCheck(ErrorCode.INVALID_PRODUCER_EPOCH,
                               f"marker epoch {producer_epoch} does not end the transaction of producer "
                               f"{producer_id} at epoch {entry.producer_epoch} (a stale marker)")
        return OK

    def complete_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                        marker_offset: int, timestamp: int, committed: bool,
                        transaction_version: int = 1) -> CompletedTxn:
        """Apply a written marker: bump the epoch if newer, store the coordinator epoch,
        end the ongoing transaction, and drop the PID's verification guard unless the
        marker cannot end the transaction being verified (VerificationGuard.ended_by).
        Returns the completed transaction. `transaction_version`: the marker's
        (WriteTxnMarkers); 1 where it is not known (a marker read back from the log)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerStateEntry(producer_id)
        entry.maybe_update_epoch(producer_epoch)
        guard = self.verification_guards.get(producer_id)
        if guard is not None and guard.ended_by(producer_epoch, transaction_version):
            del self.verification_guards[producer_id]
        self.added.pop(producer_id, None)
        self.last_markers[producer_id] = marker_offset
        first = entry.current_txn_first_offset
        if first >= 0:
            self.ongoing.pop(first, None)
        else:
            first = marker_offset
        self.unreplicated[first] = marker_offset
        entry.current_txn_first_offset = -1
        entry.coordinator_epoch = coordinator_epoch
        entry.last_timestamp = timestamp
        self.map_end_offset = marker_offset + 1
        return CompletedTxn(producer_id, first, marker_offset, not committed)

    # ------------------------------------------------------------ recovery
    def replay_batch(self, h: BatchHeader, control: tuple[bool, int] | None = None) -> CompletedTxn | None:
        """Apply a batch read back from the log, without validation. `control` is
        (committed, coordinator epoch) for a control batch. Returns the completed
        transaction for a marker."""
        if h.producer_id < 0:
            self.map_end_offset = h.last_offset + 1
            return None
        if h.is_control:
            if control is None:
                raise ValueError("a control batch needs its marker type")
            committed, coordinator_epoch = control
            return self.complete_marker(h.producer_id, h.producer_epoch, coordinator_epoch,
                                        h.base_offset, h.max_timestamp, committed)
        self.on_append(h)
        return None

    # ------------------------------------------------------------ expiration
    def expire(self, now_ms: int | None = None) -> list[int]:
        """Forget PIDs idle for at least `expiration_ms` with no ongoing transaction
        (design doc "PID Expiration"); never on an internal topic, where a PID's epoch
        is a coordinator's fence. Returns the expired PIDs."""
        if self.internal:
            return []
        now = self.clock_ms() if now_ms is None else now_ms
        gone = [pid for pid, e in self.producers.items()
                if e.current_txn_first_offset < 0 and now - e.last_timestamp >= self.expiration_ms]
        for pid in gone:
            del self.producers[pid]
            self.added.pop(pid, None)
        return gone

    # ------------------------------------------------------------ snapshots
    def encode_snapshot(self) -> bytes:
        """The state as a snapshot value: version int16 (2), crc32c uint32 of the body,
        body = count int32 + entries (pid, epoch, coordinator epoch, txn first offset,
        last timestamp, batches (first seq, last seq, last offset, offset delta, ts)),
        then count int32 + the unreplicated transactions (txn first offset, marker
        offset), so a restart keeps the LSO below a marker the ISR may not have
        (docs/design.md, "Last stable offset and read_committed")."""
        parts = [_SNAP_COUNT.pack(len(self.producers))]
        for e in self.producers.values():
            parts.append(_SNAP_ENTRY.pack(e.producer_id, e.producer_epoch, e.coordinator_epoch,
                                          e.current_txn_first_offset, e.last_timestamp, len(e.batches)))
            for b in e.batches:
                parts.append(_SNAP_BATCH.pack(b.first_seq, b.last_seq, b.last_offset, b.offset_delta, b.timestamp))
        parts.append(_SNAP_COUNT.pack(len(self.unreplicated)))
        for first, marker in sorted(self.unreplicated.items()):
            parts.append(_SNAP_UNREPLICATED.pack(first, marker))
        body = b"".join(parts)
        return _SNAP_HEADER.pack(SNAPSHOT_VERSION, crc32c.crc32c(body)) + body

    def load_snapshot(self, data: bytes, offset: int) -> None:
        """Replace the state with a snapshot taken at log offset `offset`. Raises
        SnapshotError (state unchanged) when it is unreadable."""
        entries, unreplicated = _decode(data)
        self.producers = {e.producer_id: e for e in entries}
        self.ongoing = dict(sorted((e.current_txn_first_offset, e.producer_id)
                                   for e in entries if e.current_txn_first_offset >= 0))
        self.unreplicated = {first: marker for first, marker in unreplicated if marker < offset}
        self.last_markers, self.markers_known_from = {}, offset
        self.map_end_offset = offset

    def reset(self, offset: int = 0) -> None:
        """Forget everything (before a full log scan from `offset`)."""
        self.producers = {}
        self.ongoing = {}
        self.unreplicated = {}
        self.last_markers, self.markers_known_from = {}, offset
        self.map_end_offset = offset


def decode_snapshot(data: bytes) -> list[ProducerStateEntry]:
    """Parse and verify a snapshot value (see `encode_snapshot`): its producer
    entries. Raises SnapshotError."""
    return _decode(data)[0]


def _decode(data: bytes) -> tuple[list[ProducerStateEntry], list[tuple[int, int]]]:
    """(entries, unreplicated (txn first offset, marker offset) pairs) of a snapshot
    value of a readable version. Raises SnapshotError."""
    if len(data) < _SNAP_HEADER.size + _SNAP_COUNT.size:
        raise SnapshotError("snapshot truncated")
    version, crc = _SNAP_HEADER.unpack_from(data)
    if version not in _READABLE_VERSIONS:
        raise SnapshotError(f"unknown snapshot version {version}")
    body = memoryview(data)[_SNAP_HEADER.size:]
    if crc32c.crc32c(body) != crc:
        raise SnapshotError("snapshot CRC32C mismatch")
    unreplicated: list[tuple[int, int]] = []
    try:
        (count,), pos = _SNAP_COUNT.unpack_from(body), _SNAP_COUNT.size
        out = []
        for _ in range(count):
            pid, epoch, coord, txn_first, ts, n = _SNAP_ENTRY.unpack_from(body, pos)
            pos += _SNAP_ENTRY.size
            entry = ProducerStateEntry(pid, epoch, coordinator_epoch=coord,
                                       current_txn_first_offset=txn_first, last_timestamp=ts)
            for _b in range(n):
                entry.batches.append(BatchMetadata(*_SNAP_BATCH.unpack_from(body, pos)))
                pos += _SNAP_BATCH.size
            out.append(entry)
        if version >= 2:
            (count,), pos = _SNAP_COUNT.unpack_from(body, pos), pos + _SNAP_COUNT.size
            for _ in range(count):
                unreplicated.append(_SNAP_UNREPLICATED.unpack_from(body, pos))
                pos += _SNAP_UNREPLICATED.size
    except struct.error as exc:
        raise SnapshotError(f"snapshot truncated: {exc}") from exc
    if pos != len(body):
        raise SnapshotError("trailing bytes after the snapshot entries")
    return out, unreplicated


def entries_equal(a: Iterable[ProducerStateEntry], b: Iterable[ProducerStateEntry]) -> bool:
    """Whether two collections of entries hold the same state (order-insensitive)."""
    def key(e: ProducerStateEntry):
        return (e.producer_id, e.producer_epoch, tuple(e.batches), e.coordinator_epoch,
                e.current_txn_first_offset, e.last_timestamp)
    return sorted(map(key, a)) == sorted(map(key, b))
