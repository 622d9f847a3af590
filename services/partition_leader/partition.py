"""One partition replica hosted by this process: log + producer state + LSO, as
leader or follower.

As leader: Produce (`append`), transaction markers (`write_marker`), Fetch (`fetch`)
and ListOffsets (`list_offset`) as the design doc's "Client-Broker request handling",
"Coordinator-Broker request handling", "Last Stable Offset Tracking" and "Aborted
Transaction Index" sections describe them; replica fetches (`fetch_for_follower`)
advance the followers' log end offsets, the in-sync replica set (ISR) and the high
watermark (`replication.LeaderReplication`); OffsetForLeaderEpoch
(`end_offset_for_epoch`) answers from the leader-epoch cache (KIP-101).
As follower: `append_as_follower` copies the leader's batches byte for byte (offsets
and partition leader epochs kept) and rebuilds the same producer state, aborted
transaction index and epoch cache from them; `truncate_to` cuts a divergent tail
(never below the high watermark) and rebuilds the producer state.

Expected outcomes are ErrorCode values in the results; exceptions mean bugs,
corruption or I/O failure (docs/design.md, "Code conventions").

High watermark = min log end offset over the ISR (a single replica: the log end);
consumers read below it (below the LSO in read_committed, itself bounded by it). It is
checkpointed to `high-watermark` in the partition directory (a lower bound: used to
never truncate below it after a restart). `leader_epoch` is stamped into every batch
appended as leader and checked against Fetch's `current_leader_epoch`.

Producer-state snapshots go to the shared `SnapshotStore` at most every
`producer.snapshot.interval.ms` when the log end moved, and on `close()`; opening
loads the newest valid snapshot not beyond the log end and replays the log after
it, falling back to older snapshots and finally to a full log scan.
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Mapping, NamedTuple

from exactly_wire.clock import monotonic_ms as _monotonic_ms
from exactly_wire.clock import wall_clock_ms
from exactly_wire import compression, records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.config import keys
from exactly_wire.records import CorruptRecordError

from services.common.transport import limits

from services.common import topic_config
from services.common.settings import PartitionLeaderSchema, role_settings
from services.common.topic_config import COMPACT, DEFAULTS, DELETE

from .byte_marks import ByteMarks
from .leader_epoch import UNDEFINED_EPOCH, UNDEFINED_OFFSET, EpochEndOffset, LeaderEpochCache
from .log import AbortedTxn, Log, LogConfig
from .producer_state import ProducerStateEntry, ProducerStateManager, SnapshotError
from .replication import LeaderReplication
from .snapshot_store import SnapshotStore

log = logging.getLogger(__name__)

READ_UNCOMMITTED = 0
READ_COMMITTED = 1

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
LAST_STABLE_OFFSET_TIMESTAMP = -3  # the design doc's sentinel ("ListOffsetRequest")
# The record with the largest timestamp: Kafka's MAX_TIMESTAMP (KIP-734), which is -3 on
# the Kafka port (services/partition_leader/kafka_api.py maps it), -4 here since -3 is the LSO.
MAX_TIMESTAMP = -4

ACKS_ALL = -1
HIGH_WATERMARK_FILE = "high-watermark"
LOCAL_REPLICA = "local"  # replica id of a partition opened outside a cluster (tests, tools)



@dataclass(frozen=True)
class PartitionConfig:
    """Settings of one partition (keys in `from_settings`).

    snapshot_interval_ms: `producer.snapshot.interval.ms`, minimum ms between
        periodic producer-state snapshots; snapshots_retained:
        `producer.snapshot.retained`, how many snapshots to keep (>= 1);
    producer_id_expiration_ms: `producer.id.expiration.ms`;
    min_insync_replicas: `min.insync.replicas`, the ISR size acks=all (and markers)
        need; capped at the replication factor, so a topic with fewer replicas than
        a cluster-wide setting stays writable.
    cleanup_policy: `cleanup.policy`, a subset of {"delete", "compact"};
    retention_ms / retention_bytes: `retention.ms` / `retention.bytes` (-1: no
        limit), applied by the cleaner when "delete" is in the policy;
    delete_retention_ms: `delete.retention.ms`, how long a compacted topic keeps
        tombstones and transaction markers whose data is gone.
    max_message_bytes: `max.message.bytes` (broker `message.max.bytes`), the
        largest record batch a Produce may append (bytes).
    docs/design.md, "Retention and compaction".
    """

    log: LogConfig = field(default_factory=LogConfig)
    snapshot_interval_ms: int = DEFAULTS.producer_snapshot_interval_ms
    snapshots_retained: int = DEFAULTS.producer_snapshot_retained
    producer_id_expiration_ms: int = DEFAULTS.producer_id_expiration_ms
    min_insync_replicas: int = DEFAULTS.min_insync_replicas
    cleanup_policy: frozenset[str] = frozenset({DEFAULTS.cleanup_policy})
    retention_ms: int = DEFAULTS.retention_ms
    retention_bytes: int = DEFAULTS.retention_bytes
    delete_retention_ms: int = DEFAULTS.delete_retention_ms
    max_message_bytes: int = DEFAULTS.max_message_bytes

    @property
    def compact(self) -> bool:
        return COMPACT in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return DELETE in self.cleanup_policy

    @classmethod
    def from_settings(cls, settings: PartitionLeaderSchema | Mapping[str, str],
                      topic_configs: Mapping[str, str] | None = None) -> "PartitionConfig":
        """Resolve each topic config (services.common.topic_config): the topic's value,
        else the process setting of the same name, else its broker-level synonym
        (e.g. `log.segment.bytes`), else the schema's default. `settings`: the
        partition leader's parsed settings (a mapping of Kafka keys is parsed first,
        raising ConfigurationError). Raises ValueError naming a malformed topic value."""
        settings = role_settings(PartitionLeaderSchema, settings)
        topic_configs = topic_configs or {}
        process_keys = set(keys(PartitionLeaderSchema))

        def get(spec: topic_config.TopicConfigDef):
            if spec.key in topic_configs:
                return topic_configs[spec.key]
            for name in (spec.key, spec.broker_key):
                if name in process_keys and settings.get(name) is not None:
                    return settings.get(name)
            return spec.default

        values: dict[str, int] = {}
        policy = DEFAULTS.cleanup_policy
        for spec in topic_config.SCHEMA:
            raw = get(spec)
            if spec.kind == topic_config.LIST:
                policy = raw  # cleanup.policy, the one list
                continue
            try:
                values[spec.key.replace(".", "_")] = int(raw)
            except ValueError:
                raise ValueError(f"setting {spec.key}={raw!r} is not an integer") from None
        policies = frozenset(x.strip() for x in str(policy).split(",") if x.strip())
        if not policies or not policies <= {DELETE, COMPACT}:
            raise ValueError(f"setting cleanup.policy={policy!r}: allowed values are delete, compact, "
                             "compact,delete")
        v = SimpleNamespace(**values)
        return cls(LogConfig(segment_bytes=v.segment_bytes, index_interval_bytes=v.index_interval_bytes,
                             flush_messages=max(v.flush_messages, 1), segment_ms=max(v.segment_ms, 1)),
                   snapshot_interval_ms=v.producer_snapshot_interval_ms,
                   snapshots_retained=max(v.producer_snapshot_retained, 1),
                   producer_id_expiration_ms=v.producer_id_expiration_ms,
                   min_insync_replicas=max(v.min_insync_replicas, 1),
                   cleanup_policy=policies, retention_ms=v.retention_ms,
                   retention_bytes=v.retention_bytes, delete_retention_ms=v.delete_retention_ms,
                   max_message_bytes=v.max_message_bytes)


class AppendResult(NamedTuple):
    """Produce outcome: base_offset / last_offset are the assigned offsets (or, for
    DUPLICATE_SEQUENCE_NUMBER, the offsets the original batch got); -1 on error.
    acks=all is satisfied once the high watermark passes last_offset."""

    error: ErrorCode
    base_offset: int = -1
    log_start_offset: int = -1
    message: str = ""
    last_offset: int = -1


class MarkerResult(NamedTuple):
    """WriteTxnMarkers outcome for this partition; offset of the marker or -1, and the
    leader epoch it was written in (-1 when not written)."""

    error: ErrorCode
    offset: int = -1
    message: str = ""
    leader_epoch: int = -1


class ReplicaFetchResult(NamedTuple):
    """Answer to a follower's fetch: the leader's high watermark and log end offset,
    raw batches from the fetch offset up to the log end; hw_changed says whether
    this fetch advanced the leader's high watermark."""

    error: ErrorCode
    high_watermark: int = -1
    log_end_offset: int = -1
    log_start_offset: int = -1
    records: bytes = b""
    hw_changed: bool = False
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
    """A partition replica hosted here. Build with `Partition.open(...)`.

    With `single_replica` (the default) it starts as the leader of a single-replica
    partition (ISR = {local_id}); otherwise it starts with no role and the replica
    manager calls `become_leader` / `become_follower` with the partition state from
    ZooKeeper. `lease_until` (time.monotonic() seconds) is when the leader's last
    confirmation of its leadership expires; `math.inf` when no lease is kept.
    """

    def __init__(self, topic: str, partition: int, plog: Log, producers: ProducerStateManager,
                 store: SnapshotStore | None, config: PartitionConfig, *, leader_epoch: int = 0,
                 clock_ms: Callable[[], int] = wall_clock_ms, local_id: str = LOCAL_REPLICA,
                 epochs: LeaderEpochCache | None = None, single_replica: bool = True,
                 monotonic_ms: Callable[[], int] = _monotonic_ms):
        self.topic = topic
        self.partition = partition
        self.log = plog
        self.producers = producers
        self.store = store
        self.config = config
        self.leader_epoch = leader_epoch
        self.clock_ms = clock_ms
        # Durations (followers' lag, the snapshot interval, retention's guard) count on
        # this clock, never on clock_ms (docs/design.md, "Clocks").
        self.monotonic_ms = monotonic_ms
        self._opened_at = (clock_ms(), monotonic_ms())  # (wall, monotonic) ms, see retention_now_ms
        self.local_id = local_id
        self.epochs = epochs if epochs is not None else LeaderEpochCache()
        self.leader_id: str | None = local_id if single_replica else None
        self.replicas: tuple[str, ...] = (local_id,)
        # Replicas leaving the partition (a coordinator-led internal partition's move,
        # metadata.version 3): not counted in the replication factor.
        self.removing: tuple[str, ...] = ()
        self.replication: LeaderReplication | None = LeaderReplication(
            local_id, (local_id,), (local_id,), epoch_start_offset=plog.log_end_offset, now_ms=monotonic_ms()) \
            if single_replica else None
        self.lease_until = math.inf if single_replica else 0.0
        self.high_watermark = plog.log_end_offset
        # Byte positions of the offsets above the LSO, for fetches waiting for min_bytes.
        self.byte_marks = ByteMarks(plog.log_end_offset)
        self._checkpointed_hw = -1
        self._hw_file_lock = threading.Lock()  # the periodic checkpoint runs in a worker thread
        self._last_snapshot_offset = -1
        self._last_snapshot_ms = monotonic_ms()
        self.snapshot_loaded_from: int | None = None  # offset of the snapshot used by open()
        self.config_source: dict[str, str] = {}  # the topic configs `config` was built from

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def open(cls, topic: str, partition: int, data_dir: Path, config: PartitionConfig | None = None,
             store: SnapshotStore | None = None, *, internal: bool | None = None, leader_epoch: int = 0,
             clock_ms: Callable[[], int] = wall_clock_ms, local_id: str = LOCAL_REPLICA,
             single_replica: bool = True, monotonic_ms: Callable[[], int] = _monotonic_ms) -> "Partition":
        """Open (or create) `<data_dir>/logs/<topic>-<partition>/`, recover the log,
        load the leader-epoch cache (rebuilt from the batches when missing) and the
        high-watermark checkpoint, and rebuild the producer state (snapshot + replay).
        `internal` defaults to the topic name starting with "__"; `single_replica`
        see the class. Raises OSError on I/O failure."""
        config = config or PartitionConfig()
        directory = data_dir / "logs" / f"{topic}-{partition}"
        fresh = not directory.exists()
        plog = Log.open(directory, config.log, clock_ms)
        producers = ProducerStateManager(internal=topic.startswith("__") if internal is None else internal,
                                         expiration_ms=config.producer_id_expiration_ms, clock_ms=clock_ms)
        epochs = LeaderEpochCache.load(directory)
        if epochs is None:
            epochs = _rebuild_epochs(plog)
        elif epochs.truncate_from_end(plog.log_end_offset):
            log.warning("%s-%d: leader epochs past the recovered log end dropped", topic, partition)
        self = cls(topic, partition, plog, producers, store, config, leader_epoch=leader_epoch,
                   clock_ms=clock_ms, local_id=local_id, epochs=epochs, single_replica=single_replica,
                   monotonic_ms=monotonic_ms)
        self.high_watermark = 0 if fresh else self._read_hw_checkpoint()
        self._load_producer_state(trusted_to=plog.flushed_at_open)
        self.maybe_advance_high_watermark()
        self.checkpoint_high_watermark()
        return self

    def close(self) -> None:
        """Flush the log and write a final producer-state snapshot and high-watermark
        checkpoint (clean shutdown)."""
        self.log.flush()
        self.take_snapshot(sync=True)
        self.checkpoint_high_watermark()
        self.log.close()

    def reconfigure(self, config: PartitionConfig) -> None:
        """Apply changed topic configs (IncrementalAlterConfigs): later rolls, flushes,
        snapshots and acks=all checks use them; existing segments stay as they are."""
        self.config = config
        self.log.config = config.log

    def delete(self) -> None:
        """Remove this replica for good (its topic was deleted, or it left the
        partition's replicas): close the log, delete the partition directory and every
        producer-state snapshot of the partition. Raises OSError."""
        self.log.close()
        if self.store is not None:
            for off in self.store.offsets(self.topic, self.partition):
                self.store.delete(self.topic, self.partition, off)
        shutil.rmtree(self.log.dir, ignore_errors=True)

    def _read_hw_checkpoint(self) -> int:
        try:
            value = int((self.log.dir / HIGH_WATERMARK_FILE).read_text().strip())
        except FileNotFoundError:
            # A log written before high watermarks were checkpointed: single replica.
            return self.log.log_end_offset
        except ValueError:
            log.warning("%s-%d: unreadable high-watermark checkpoint; using the log start",
                        self.topic, self.partition)
            return self.log.log_start_offset
        return max(min(value, self.log.log_end_offset), self.log.log_start_offset)

    @property
    def high_watermark_unchecked(self) -> int | None:
        """The high watermark when it moved since the last checkpoint, else None."""
        hw = self.high_watermark
        return None if hw == self._checkpointed_hw else hw

    def checkpoint_high_watermark(self, hw: int | None = None) -> bool:
        """Write the high watermark (default: the current one; `hw`: a value read
        earlier on the event loop, when this runs in a worker thread so the fsync
        does not stall the loop) to `high-watermark` (atomic replace) when it moved
        since the last write. Returns whether written. Raises OSError."""
        hw = self.high_watermark if hw is None else hw
        with self._hw_file_lock:
            if hw == self._checkpointed_hw:
                return False
            tmp = self.log.dir / (HIGH_WATERMARK_FILE + ".tmp")
            with open(tmp, "w") as f:
                f.write(f"{hw}\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.log.dir / HIGH_WATERMARK_FILE)
            self._checkpointed_hw = hw
        return True

    # ------------------------------------------------------------ offsets
    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        """Smallest first offset of the ongoing transactions and of the completed ones
        whose marker the high watermark has not passed yet, else the high watermark;
        never above the high watermark (design doc "Last Stable Offset Tracking";
        Kafka's first unstable offset)."""
        first = self.producers.first_unstable_offset_at(self.high_watermark)
        if first is None:
            return self.high_watermark
        # An open transaction whose first batches DeleteRecords removed: the LSO never
        # points below what a reader can fetch (Kafka does the same).
        return min(max(first, self.log_start_offset), self.high_watermark)

    # ------------------------------------------------------------ roles
    @property
    def is_leader(self) -> bool:
        return self.replication is not None

    @property
    def isr(self) -> tuple[str, ...]:
        """In-sync replicas as this leader applies them (empty on a follower)."""
        return self.replication.isr if self.replication is not None else ()

    @property
    def min_insync_replicas(self) -> int:
        """`min.insync.replicas`, capped at the replication factor (the replicas that
        are not leaving)."""
        staying = sum(1 for r in self.replicas if r not in self.removing)
        return max(min(self.config.min_insync_replicas, staying), 1)

    def become_leader(self, leader_epoch: int, replicas: tuple[str, ...], isr: tuple[str, ...],
                      zk_version: int = -1) -> None:
        """Lead `leader_epoch` (from ZooKeeper's partition state): record the epoch's
        start offset (our log end) in the epoch cache, start tracking the followers
        (ISR followers count as caught up now) and recompute the high watermark."""
        self.leader_epoch = leader_epoch
        self.leader_id = self.local_id
        self.replicas = tuple(replicas) or (self.local_id,)
        self.epochs.assign(leader_epoch, self.log_end_offset)
        self.replication = LeaderReplication(self.local_id, self.replicas, isr, zk_version=zk_version,
                                             epoch_start_offset=self.log_end_offset, now_ms=self.monotonic_ms())
        self.maybe_advance_high_watermark()

    def reassign(self, replicas: tuple[str, ...]) -> None:
        """The assignment changed within this leader epoch (replicas added or removed:
        a coordinator-led internal partition, metadata.version 3): a leader tracks the
        new followers from now on."""
        self.replicas = tuple(replicas) or (self.local_id,)
        if self.replication is not None:
            self.replication.set_replicas(self.replicas)

    def become_follower(self, leader_id: str | None, leader_epoch: int, replicas: tuple[str, ...]) -> None:
        """Follow `leader_id` (None: the partition has no leader) in `leader_epoch`:
        stop leading; the replica fetcher truncates, then fetches."""
        self.leader_epoch = leader_epoch
        self.leader_id = leader_id
        self.replicas = tuple(replicas) or (self.local_id,)
        self.replication = None
        self.lease_until = 0.0

    def enough_replicas(self) -> bool:
        """Whether the ISR has at least `min.insync.replicas` members."""
        return self.replication is not None and len(self.replication.isr) >= self.min_insync_replicas

    def maybe_advance_high_watermark(self) -> bool:
        """Leader: move the high watermark to the min log end offset over the ISR (never
        back). Returns whether it moved."""
        if self.replication is None:
            return False
        hw = self.replication.high_watermark(self.log.log_end_offset)
        if hw > self.high_watermark:
            self.high_watermark = hw
            return True
        return False

    def set_isr(self, isr: tuple[str, ...], zk_version: int) -> bool:
        """Leader: apply an ISR stored in ZooKeeper at `zk_version`; returns whether the
        high watermark moved."""
        if self.replication is None:
            return False
        self.replication.set_isr(isr, zk_version)
        return self.maybe_advance_high_watermark()

    def isr_shrink_candidate(self, max_lag_ms: int, now_ms: int | None = None) -> tuple[str, ...] | None:
        """Leader: the ISR without followers not caught up for `replica.lag.time.max.ms`,
        or None when nobody lags (Kafka's `Partition.maybeShrinkIsr`). now_ms: monotonic."""
        if self.replication is None:
            return None
        now = self.monotonic_ms() if now_ms is None else now_ms
        return self.replication.shrink_candidate(now, max_lag_ms)

    def isr_expand_candidate(self, replica: str, max_lag_ms: int,
                             now_ms: int | None = None) -> tuple[str, ...] | None:
        """Leader: the ISR with `replica` added when it caught up (within
        `replica.lag.time.max.ms`), else None. now_ms: monotonic."""
        if self.replication is None:
            return None
        now = self.monotonic_ms() if now_ms is None else now_ms
        return self.replication.expand_candidate(replica, self.high_watermark, now, max_lag_ms)

    def _check_epoch(self, current_leader_epoch: int) -> ErrorCode:
        if current_leader_epoch >= 0 and current_leader_epoch != self.leader_epoch:
            return (ErrorCode.FENCED_LEADER_EPOCH if current_leader_epoch < self.leader_epoch
                    else ErrorCode.UNKNOWN_LEADER_EPOCH)
        return ErrorCode.NONE

    # ------------------------------------------------------------ produce
    def append(self, batch: ValidatedBatch, required_acks: int = 1,
               verification_guard: object | None = None) -> AppendResult:
        """Append one client record batch v2 (Produce) as leader: `batch` passed the
        write path's gates already (its shape by `ValidatedBatch.check`, its size
        against `max.message.bytes`: produce.ProducePipeline), so nothing here looks at
        its bytes again.

        PID / epoch / sequence rules (`ProducerStateManager.check_append`; a batch
        without a producer id has none, whatever its epoch and sequence fields hold,
        as in Kafka's LogValidator). With required_acks -1 (all), NOT_ENOUGH_REPLICAS
        when the ISR is smaller than `min.insync.replicas`, before anything is
        appended. A retried batch equal to one of the PID's last 5 gets
        DUPLICATE_SEQUENCE_NUMBER with the original offsets and is not appended
        again. Offsets are assigned by rewriting the base offset in place; the batch
        gets this leader's epoch. NOT_LEADER_OR_FOLLOWER on a follower.
        verification_guard: the guard of the transaction verification done for this
        batch (produce.ProducePipeline; INVALID_TXN_STATE when a marker made it stale)."""
        if self.replication is None:
            return AppendResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, message="this replica is a follower")
        buf, h = batch.data, batch.header  # never copied: the log writes a rewritten header, then these bytes
        if required_acks == ACKS_ALL and not self.enough_replicas():
            return AppendResult(ErrorCode.NOT_ENOUGH_REPLICAS, -1, self.log_start_offset,
                                f"{len(self.isr)} in-sync replicas, min.insync.replicas is "
                                f"{self.min_insync_replicas}")
        if h.producer_id >= 0:
            check = self.producers.check_append(h, verification_guard)
            if check.error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
                dup = check.duplicate
                return AppendResult(check.error, dup.first_offset, self.log_start_offset, check.message,
                                    dup.last_offset)
            if check.error != ErrorCode.NONE:
                return AppendResult(check.error, -1, self.log_start_offset, check.message)
        self._note_epoch(self.leader_epoch, self.log_end_offset)
        info = self.log.append(buf, h, self.leader_epoch)
        self.byte_marks.appended(info.last_offset + 1, h.size)
        if h.producer_id >= 0:
            self.producers.on_append(h._replace(base_offset=info.base_offset))
        else:
            self.producers.map_end_offset = info.last_offset + 1
        self.maybe_advance_high_watermark()
        return AppendResult(ErrorCode.NONE, info.base_offset, self.log_start_offset, last_offset=info.last_offset)

    def _note_epoch(self, epoch: int, start_offset: int) -> None:
        if epoch > self.epochs.latest_epoch:
            self.epochs.assign(epoch, start_offset)

    # ------------------------------------------------------------ markers
    def write_marker(self, producer_id: int, producer_epoch: int, committed: bool,
                     coordinator_epoch: int, transaction_version: int = 1) -> MarkerResult:
        """Write a COMMIT or ABORT marker for `producer_id` (WriteTxnMarkers; design doc
        "Coordinator-Broker request handling"). The caller waits for the high
        watermark to pass the marker (markers are written with acks=all).

        TRANSACTION_COORDINATOR_FENCED for a coordinator epoch older than the PID's,
        INVALID_PRODUCER_EPOCH for an older producer epoch, NOT_ENOUGH_REPLICAS when
        the ISR is below `min.insync.replicas`, NOT_LEADER_OR_FOLLOWER on a follower.
        A marker for a PID without an ongoing transaction here is still written
        (coordinator retries succeed). On ABORT, the aborted-index entry gets the LSO
        computed before the transaction completes (docs/design.md, "Last stable offset and read_committed")
        and is written with the marker, so the flush that covers the marker covers it."""
        if self.replication is None:
            return MarkerResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, message="this replica is a follower")
        # Coordinator epoch -1: a KIP-664 abort of a producer that never had a marker here.
        if producer_id < 0 or coordinator_epoch < -1 or transaction_version not in (0, 1, 2):
            return MarkerResult(ErrorCode.INVALID_REQUEST, message=(
                f"marker for producer id {producer_id}, coordinator epoch {coordinator_epoch}, transaction "
                f"version {transaction_version}"))
        bad_epoch = limits.validate_producer_epoch(producer_epoch)
        if bad_epoch is not None:
            return MarkerResult(bad_epoch[0], message=bad_epoch[1])
        check = self.producers.check_marker(producer_id, producer_epoch, coordinator_epoch, transaction_version)
        if check.error != ErrorCode.NONE:
            return MarkerResult(check.error, message=check.message)
        if not self.enough_replicas():
            return MarkerResult(ErrorCode.NOT_ENOUGH_REPLICAS,
                                message=f"{len(self.isr)} in-sync replicas, min.insync.replicas is "
                                        f"{self.min_insync_replicas}")
        now = self.clock_ms()
        batch = bytearray(records.encode_control_batch(committed, producer_id, producer_epoch,
                                                       coordinator_epoch, now))
        h = records.parse_header(batch)
        marker_offset = self.log.log_end_offset
        aborted = None if committed else self._aborted_entry(producer_id, marker_offset)
        self._note_epoch(self.leader_epoch, marker_offset)
        info = self.log.append(batch, h, self.leader_epoch, aborted=aborted)
        self.byte_marks.appended(info.last_offset + 1, h.size)
        self.producers.complete_marker(producer_id, producer_epoch, coordinator_epoch, info.base_offset, now,
                                       committed, transaction_version)
        self.maybe_advance_high_watermark()
        return MarkerResult(ErrorCode.NONE, info.base_offset, leader_epoch=self.leader_epoch)

    # ------------------------------------------------------------ fetch
    def fetch(self, offset: int, max_bytes: int, isolation_level: int = READ_UNCOMMITTED,
              current_leader_epoch: int = -1) -> FetchResult:
        """Read whole batches from `offset` for a consumer (design doc "Client-Broker
        request handling", fetch steps 1-5).

        isolation_level 0 reads below the high watermark, 1 below the LSO and also
        returns the aborted transactions intersecting the returned range. An offset
        between the bound and the log end answers no records (a new leader's high
        watermark may still be catching up). max_bytes bounds the bytes (one batch is
        returned even if larger); max_bytes <= 0 returns offsets only (a response
        whose byte budget is spent).
        Errors: OFFSET_OUT_OF_RANGE outside [log start, log end];
        FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH when current_leader_epoch (>= 0)
        is older / newer than ours."""
        hw, lso, start = self.high_watermark, self.last_stable_offset, self.log_start_offset
        err = self._check_epoch(current_leader_epoch)
        if err != ErrorCode.NONE:
            return FetchResult(err, hw, lso, start)
        if offset < start or offset > self.log_end_offset:
            return FetchResult(ErrorCode.OFFSET_OUT_OF_RANGE, hw, lso, start,
                               message=f"offset {offset} outside [{start}, {self.log_end_offset}]")
        committed = isolation_level == READ_COMMITTED
        bound = lso if committed else hw
        if max_bytes <= 0 or offset >= bound:
            return FetchResult(ErrorCode.NONE, hw, lso, start)
        res = self.log.read(offset, max_bytes, bound)
        aborted: tuple[tuple[int, int], ...] = ()
        if committed and res.records:
            aborted = tuple((t.producer_id, t.first_offset)
                            for t in self.log.collect_aborted(offset, res.next_offset))
        return FetchResult(ErrorCode.NONE, hw, lso, start, aborted, res.records)

    def fetch_for_follower(self, replica_id: str, offset: int, max_bytes: int, current_leader_epoch: int = -1,
                           now_ms: int | None = None) -> ReplicaFetchResult:
        """Serve a follower's fetch (Fetch with replica_id): record its log end offset
        (`offset`), advance the high watermark, and return whole batches from
        `offset` up to the log end (not bounded by the high watermark).

        Errors: NOT_LEADER_OR_FOLLOWER on a follower; FENCED_LEADER_EPOCH /
        UNKNOWN_LEADER_EPOCH when the follower's view of the epoch differs;
        REPLICA_NOT_AVAILABLE for a replica not assigned to the partition;
        OFFSET_OUT_OF_RANGE beyond our log end (the follower must truncate) or below
        the log start."""
        rep = self.replication
        if rep is None:
            return ReplicaFetchResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, message="this replica is a follower")
        hw, leo, start = self.high_watermark, self.log_end_offset, self.log_start_offset
        err = self._check_epoch(current_leader_epoch)
        if err != ErrorCode.NONE:
            return ReplicaFetchResult(err, hw, leo, start)
        if replica_id not in rep.followers:
            return ReplicaFetchResult(ErrorCode.REPLICA_NOT_AVAILABLE, hw, leo, start,
                                      message=f"{replica_id} is not a follower of {self.topic}-{self.partition}")
        if offset < start or offset > leo:
            return ReplicaFetchResult(ErrorCode.OFFSET_OUT_OF_RANGE, hw, leo, start,
                                      message=f"offset {offset} outside [{start}, {leo}]")
        rep.update_follower(replica_id, offset, leo, self.monotonic_ms() if now_ms is None else now_ms)
        moved = self.maybe_advance_high_watermark()
        data = b""
        if max_bytes > 0 and offset < leo:
            data = self.log.read(offset, max_bytes, leo).records
        return ReplicaFetchResult(ErrorCode.NONE, self.high_watermark, leo, start, data, moved)

    def end_offset_for_epoch(self, leader_epoch: int, current_leader_epoch: int = -1
                             ) -> tuple[ErrorCode, EpochEndOffset]:
        """OffsetForLeaderEpoch as leader (KIP-101): the largest epoch <= `leader_epoch`
        we know and where it ends (next epoch's start, or our log end).
        Errors: NOT_LEADER_OR_FOLLOWER on a follower; FENCED_LEADER_EPOCH /
        UNKNOWN_LEADER_EPOCH for a mismatching current_leader_epoch."""
        none = EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET)
        if self.replication is None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, none
        err = self._check_epoch(current_leader_epoch)
        if err != ErrorCode.NONE:
            return err, none
        return ErrorCode.NONE, self.epochs.end_offset_for(leader_epoch, self.log_end_offset)

    # ------------------------------------------------------------ follower
    def append_as_follower(self, data: bytes) -> int:
        """Append the batches of a replica fetch response, byte for byte (offsets and
        partition leader epochs kept), updating the epoch cache, producer state and
        aborted-transaction index as the leader did. Batches below our log end are
        skipped; a trailing partial batch is ignored. Returns the number of batches
        appended. Raises CorruptRecordError (bad CRC) or ValueError (a gap: the
        first new batch does not start at our log end); batches before it are kept."""
        view = memoryview(data)
        appended = 0
        for pos, h in records.iter_batches(view, verify=True):
            if h.last_offset < self.log.log_end_offset:
                continue
            batch = view[pos:pos + h.size]
            control, aborted = self._marker(h, lambda b=batch: bytes(b))
            self._note_epoch(h.partition_leader_epoch, h.base_offset)
            self.log.append_replicated(batch, h, aborted=aborted)
            self.byte_marks.appended(h.last_offset + 1, h.size)
            self.producers.replay_batch(h, control)
            appended += 1
        return appended

    def update_follower_high_watermark(self, leader_high_watermark: int) -> bool:
        """Follower: high watermark = min(leader's, our log end), never back. Returns
        whether it moved."""
        hw = min(leader_high_watermark, self.log_end_offset)
        if hw > self.high_watermark:
            self.high_watermark = hw
            self.producers.first_unstable_offset_at(hw)  # forget replicated markers
            return True
        return False

    def truncate_to(self, offset: int) -> int:
        """Follower: remove the log from `offset` (rounded down to a batch start), but
        never below the high watermark; then drop newer leader epochs and producer-state
        snapshots past the new end and rebuild the producer state (snapshot + replay)
        and aborted index. Returns the new log end offset. Raises OSError."""
        if offset < self.high_watermark:
            log.warning("%s-%d: not truncating to %d, below the high watermark %d",
                        self.topic, self.partition, offset, self.high_watermark)
            offset = self.high_watermark
        if offset >= self.log_end_offset:
            return self.log_end_offset
        for b in self.log.batches(offset):
            offset = min(offset, b.header.base_offset)
            break
        log.info("%s-%d: truncating from %d to %d", self.topic, self.partition, self.log_end_offset, offset)
        self.log.truncate_to(offset)
        self.byte_marks.reset(self.log.log_end_offset)
        self.epochs.truncate_from_end(offset)
        self._last_snapshot_offset = -1
        self._load_producer_state()
        self.high_watermark = min(self.high_watermark, self.log_end_offset)
        return self.log_end_offset

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Follower whose log ends below its leader's log start offset (retention or
        DeleteRecords removed what it still needs): drop the whole log and start
        empty at `offset`; producer state and epoch cache restart there (Kafka's
        truncateFullyAndStartAt). Raises OSError."""
        log.info("%s-%d: log end %d is below the leader's log start offset %d; starting empty there",
                 self.topic, self.partition, self.log_end_offset, offset)
        self.log.truncate_fully_and_start_at(offset)
        self.byte_marks.reset(self.log.log_end_offset)
        self.epochs.truncate_from_end(offset)
        self.producers.reset(offset)
        self._last_snapshot_offset = -1
        if self.store is not None:
            for off in self.store.offsets(self.topic, self.partition):
                self.store.delete(self.topic, self.partition, off)
        self.high_watermark = offset

    # ------------------------------------------------------------ retention and DeleteRecords
    def delete_records(self, offset: int) -> tuple[ErrorCode, int]:
        """DeleteRecords as leader: move the log start offset up to `offset` (-1: the
        high watermark); segments wholly below it are deleted by the cleaner's next
        pass, followers follow from the Fetch answers. Returns (error, log start
        offset). Errors: NOT_LEADER_OR_FOLLOWER on a follower; OFFSET_OUT_OF_RANGE
        for an offset above the high watermark or below -1. Raises OSError."""
        if self.replication is None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1
        target = self.high_watermark if offset == -1 else offset
        if target < 0 or target > self.high_watermark:
            return ErrorCode.OFFSET_OUT_OF_RANGE, self.log_start_offset
        self.log.maybe_increment_log_start_offset(target)
        return ErrorCode.NONE, self.log_start_offset

    def follow_log_start_offset(self, leader_log_start_offset: int) -> bool:
        """Follower: adopt the leader's log start offset (never past our own log end
        or high watermark). Returns whether ours moved."""
        bound = min(leader_log_start_offset, self.high_watermark, self.log_end_offset)
        return self.log.maybe_increment_log_start_offset(bound)

    def retention_bound(self) -> int:
        """Segments ending at or below this offset may be deleted by time or size
        retention: the high watermark, and the LSO, so the first batch of an open
        transaction (and with it the producer state it needs) is never removed."""
        return min(self.high_watermark, self.last_stable_offset)

    def retention_now_ms(self) -> int:
        """The wall-clock "now" (ms since the epoch) that time-based retention
        (`retention.ms`) and the compaction's tombstone horizon (`delete.retention.ms`)
        compare record timestamps with: the wall clock, but never ahead of the wall
        clock at open plus the monotonic time elapsed since. A wall clock stepped
        forwards while the process runs deletes no fresh data (it is kept up to the
        step longer instead); a clock stepped backwards keeps data longer, as in Kafka
        (docs/design.md, "Clocks")."""
        wall_open, mono_open = self._opened_at
        return min(self.clock_ms(), wall_open + self.monotonic_ms() - mono_open)

    def deletable_segments(self, now_ms: int | None = None) -> int:
        """How many of the oldest segments the cleaner may delete now (Kafka's
        deleteOldSegments): those wholly below the log start offset, and with
        "delete" in `cleanup.policy`, those past `retention.ms` (by their largest
        record timestamp) or while the log exceeds `retention.bytes`; in every case
        only closed segments ending at or below `retention_bound()` (the log start
        offset only below the high watermark). now_ms: wall clock, by default
        `retention_now_ms()`."""
        segs = self.log.segments
        now = self.retention_now_ms() if now_ms is None else now_ms
        bound = self.retention_bound()
        count = 0
        size = self.log.size_bytes
        for i in range(len(segs) - 1):
            end = segs[i + 1].base_offset
            if end <= self.log_start_offset and end <= self.high_watermark:
                count = i + 1
                size -= segs[i].size
                continue
            if not self.config.delete or end > bound:
                break
            expired = self.config.retention_ms >= 0 and \
                segs[i].time_index().max_timestamp < now - self.config.retention_ms
            too_big = self.config.retention_bytes >= 0 and size - segs[i].size >= self.config.retention_bytes
            if not (expired or too_big):
                break
            count = i + 1
            size -= segs[i].size
        return count

    def delete_old_segments(self, now_ms: int | None = None) -> int:
        """Delete the segments `deletable_segments` allows and advance the log start
        offset to the first remaining batch. A producer-state snapshot is written
        first, so the producers (and open transactions) whose batches go stay known
        after a restart. Returns the bytes freed. Raises OSError."""
        count = self.deletable_segments(now_ms)
        if count == 0:
            return 0
        self.take_snapshot(sync=True)
        freed = self.log.delete_segments(count)
        log.info("%s-%d: deleted %d segments (%d bytes); log start offset %d", self.topic, self.partition,
                 count, freed, self.log_start_offset)
        return freed

    def cleanable_segments(self) -> list:
        """Compaction: the closed segments, from the first, that end at or below the
        first uncleanable offset (min of the high watermark, the LSO and the active
        segment's base), so every transaction with data in them is complete."""
        segs = self.log.segments
        bound = min(self.high_watermark, self.last_stable_offset, segs[-1].base_offset)
        out = []
        for i in range(len(segs) - 1):
            if segs[i + 1].base_offset > bound:
                break
            out.append(segs[i])
        return out

    def install_cleaned(self, old: list, cleaned: Path) -> int:
        """Swap the cleaned file for the segments `old` (still the first ones of the
        log); a producer-state snapshot is taken first (the cleaned segments no
        longer hold every batch the producer state was built from). Returns the
        bytes saved. Raises ValueError when the log changed meanwhile (the cleaned
        file is then removed), OSError on I/O failure."""
        before = sum(seg.size for seg in old)
        self.take_snapshot(sync=True)
        try:
            new = self.log.replace_segments(old, cleaned)
        except ValueError:
            cleaned.unlink(missing_ok=True)
            raise
        return before - new.size

    # ------------------------------------------------------------ list offsets
    def list_offset(self, timestamp: int, isolation_level: int = READ_UNCOMMITTED) -> tuple[ErrorCode, int, int]:
        """ListOffsets: returns (error, offset, timestamp). timestamp -2: log start;
        -1: high watermark (the LSO for read_committed); -3: LSO; -4 (MAX_TIMESTAMP):
        the offset and timestamp (ms) of the record with the largest timestamp
        (`Log.max_timestamp_offset`), searched in the whole log and answered only when
        below the high watermark (the LSO for read_committed), else (NONE, -1, -1),
        as Kafka answers MAX_TIMESTAMP (KIP-734; `Partition.fetchOffsetForTimestamp`
        then `ReplicaManager`'s lastFetchableOffset check). A timestamp >= 0 (ms)
        answers the first offset whose record timestamp is >= it, with that record's
        timestamp, if it is below that bound, else (NONE, -1, -1) (Kafka's
        ListOffsets; the segments' time indexes skip what cannot match,
        `Log.offset_for_timestamp`). Other negative timestamps: INVALID_REQUEST."""
        bound = self.last_stable_offset if isolation_level == READ_COMMITTED else self.high_watermark
        if timestamp == EARLIEST_TIMESTAMP:
            return ErrorCode.NONE, self.log_start_offset, -1
        if timestamp == LATEST_TIMESTAMP:
            return ErrorCode.NONE, bound, -1
        if timestamp == LAST_STABLE_OFFSET_TIMESTAMP:
            return ErrorCode.NONE, self.last_stable_offset, -1
        if timestamp == MAX_TIMESTAMP:
            found = self.log.max_timestamp_offset()
            if found is None or found[0] >= bound:
                return ErrorCode.NONE, -1, -1
            return ErrorCode.NONE, found[0], found[1]
        if timestamp < 0:
            return ErrorCode.INVALID_REQUEST, -1, -1
        found = self.log.offset_for_timestamp(timestamp, bound)
        if found is None:
            return ErrorCode.NONE, -1, -1
        return ErrorCode.NONE, found[0], found[1]

    # ------------------------------------------------------------ producer state
    def active_producers(self) -> list[ProducerStateEntry]:
        """The producer-state entries of this partition, by PID (DescribeProducers,
        KIP-664): epoch, last sequence, last timestamp (ms), coordinator epoch of
        the last marker, first offset of the open transaction (-1: none)."""
        return [self.producers.producers[pid] for pid in sorted(self.producers.producers)]

    def expire_producers(self, now_ms: int | None = None) -> list[int]:
        """Drop PIDs idle longer than `producer.id.expiration.ms` (no ongoing txn)."""
        return self.producers.expire(now_ms)

    def maybe_snapshot(self, now_ms: int | None = None) -> bool:
        """Take a snapshot when `producer.snapshot.interval.ms` passed since the last
        one and the log end moved (now_ms: monotonic). Returns whether one was written."""
        now = self.monotonic_ms() if now_ms is None else now_ms
        if now - self._last_snapshot_ms < self.config.snapshot_interval_ms:
            return False
        return self.take_snapshot(now_ms=now)

    def take_snapshot(self, sync: bool = False, now_ms: int | None = None) -> bool:
        """Write the producer state keyed by the log end offset, unless one exists for
        that offset; keep the newest `producer.snapshot.retained`. Returns whether written.

        The log (with its aborted-transaction index) is flushed first, so a snapshot never
        covers data that a machine crash could still take away (Kafka's
        ProducerStateManager snapshots at flushed offsets only)."""
        self._last_snapshot_ms = self.monotonic_ms() if now_ms is None else now_ms
        offset = self.log.log_end_offset
        if self.store is None or offset == self._last_snapshot_offset:
            return False
        if self.log.recovery_point < offset:
            self.log.flush()
        self.store.put(self.topic, self.partition, offset, self.producers.encode_snapshot(), sync=sync)
        self._last_snapshot_offset = offset
        for old in self.store.offsets(self.topic, self.partition)[:-self.config.snapshots_retained]:
            self.store.delete(self.topic, self.partition, old)
        return True

    def _load_producer_state(self, trusted_to: int | None = None) -> None:
        """Load the newest usable snapshot and replay the log after it. `trusted_to`:
        after a crash, the offset up to which the log is known to be flushed; snapshots
        past it are dropped, so the replay covers every batch written since the last
        flush and restores what a machine crash lost with them (aborted-index entries
        of surviving ABORT markers; Kafka's LogLoader deletes snapshots after the
        recovery point the same way)."""
        start, end = self.log.log_start_offset, self.log.log_end_offset
        limit = end if trusted_to is None else min(end, trusted_to)
        offsets = self.store.offsets(self.topic, self.partition) if self.store else []
        loaded_from = None
        for off in reversed(offsets):
            if off > limit:
                # Taken past what is known to have survived (an unflushed or truncated
                # tail): unusable.
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
        an aborted-index entry missing for an ABORT marker (one a crash lost: it was
        not flushed yet, or the marker was replayed past a snapshot that was not)."""
        for b in self.log.batches(start_offset):
            h = b.header
            if h.base_offset < start_offset:
                continue
            control, aborted = self._marker(h, b.read)
            if aborted is not None and not self.log.has_aborted_entry(h.producer_id, h.base_offset):
                self.log.append_aborted(aborted)
            self.producers.replay_batch(h, control)

    def _marker(self, h: records.BatchHeader, read: Callable[[], bytes]
                ) -> tuple[tuple[bool, int] | None, AbortedTxn | None]:
        """For a batch about to be applied to the producer state: (committed,
        coordinator epoch) of a control batch (None for data; `read()` gives the
        batch's bytes), and for an ABORT marker its aborted-index entry."""
        if not h.is_control:
            return None, None
        ctype, coordinator_epoch = records.decode_control_record(records.decode_records(read(), 0, h)[0])
        committed = ctype == records.CONTROL_COMMIT
        return (committed, coordinator_epoch), None if committed else self._aborted_entry(h.producer_id,
                                                                                           h.base_offset)

    def _aborted_entry(self, producer_id: int, marker_offset: int) -> AbortedTxn:
        """The aborted-index entry of an ABORT marker of `producer_id` at
        `marker_offset`, before the marker is applied: its transaction's first offset
        and the LSO once it completes (docs/design.md, "Last stable offset and read_committed")."""
        return AbortedTxn(producer_id, self.producers.txn_first_offset(producer_id, marker_offset), marker_offset,
                          self.producers.lso_excluding(producer_id, marker_offset + 1))


@dataclass(frozen=True, slots=True)
class ValidatedBatch:
    """A client's record batch v2 that passed `check_batch_shape` (no state needed):
    its bytes (`data`, one whole batch) and the header parsed from them. The value the
    write path's gates and `Partition.append` take, so no check of the bytes is made
    twice."""

    data: bytes
    header: records.BatchHeader

    @classmethod
    def check(cls, buf: bytes) -> ValidatedBatch | AppendResult:
        """`buf` as a ValidatedBatch, or the refusal of `check_batch_shape`."""
        h, refused = check_batch_shape(buf)
        return refused if refused is not None else cls(buf, h)


def check_batch_shape(buf: bytes) -> tuple[records.BatchHeader | None, AppendResult | None]:
    """The checks of a client's record batch v2 that need no state (Kafka's
    LogValidator, without decoding records): (header, None) when it may be appended,
    else (None, refusal): CORRUPT_MESSAGE for a bad CRC32C, framing, record count or
    record, INVALID_REQUEST for more than one batch, a control batch, an unknown
    compression codec or a transactional batch without a producer id, INVALID_RECORD
    for a producer epoch outside [0, 32767] with a producer id. Run before anything
    else looks at the batch (docs/design.md, "Partition leader modules")."""
    try:
        h = records.verify_crc(buf)
    except CorruptRecordError as exc:
        return None, AppendResult(ErrorCode.CORRUPT_MESSAGE, message=str(exc))
    if h.size != len(buf):
        return None, AppendResult(ErrorCode.INVALID_REQUEST,
                                  message=f"expected one record batch, got {len(buf) - h.size} extra bytes")
    if h.record_count < 1 or h.record_count != h.last_offset_delta + 1:
        return None, AppendResult(ErrorCode.CORRUPT_MESSAGE,
                                  message=f"record count {h.record_count} does not match last offset delta "
                                          f"{h.last_offset_delta}")
    if h.is_control:
        return None, AppendResult(ErrorCode.INVALID_REQUEST,
                                  message="control batches are written only through WriteTxnMarkers")
    if h.compression not in compression.CODECS:
        return None, AppendResult(ErrorCode.INVALID_REQUEST, message=f"unsupported compression {h.compression}")
    bad = records.validate_records(buf, h)
    if bad is not None:
        return None, AppendResult(ErrorCode.CORRUPT_MESSAGE, message=bad)
    # Kafka's LogValidator checks the sequence only of a batch with a producer id; without
    # one the epoch and sequence fields are ignored (aiokafka's plain producer sends 0).
    if h.producer_id >= 0 and not 0 <= h.producer_epoch <= limits.INT16_MAX:
        return None, AppendResult(ErrorCode.INVALID_RECORD, message=(
            f"producer id {h.producer_id} with epoch {h.producer_epoch} and base sequence {h.base_sequence}"))
    if h.producer_id < 0 and h.is_transactional:
        return None, AppendResult(ErrorCode.INVALID_REQUEST, message="transactional batch without a producer id")
    return h, None


def _rebuild_epochs(plog: Log) -> LeaderEpochCache:
    """The epoch cache from the partitionLeaderEpoch of the log's batches (headers only)."""
    cache = LeaderEpochCache(plog.dir)
    entries = []
    for b in plog.batches(plog.log_start_offset):
        epoch = b.header.partition_leader_epoch
        if epoch >= 0 and (not entries or epoch > entries[-1][0]):
            entries.append((epoch, b.header.base_offset))
    for epoch, start in entries:
        cache.assign(epoch, start)
    if not entries:
        cache.flush()
    return cache
