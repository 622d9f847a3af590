"""The partition replicas hosted by this process, as leaders or followers.

`ReplicaManager.refresh()` compares the cluster's assignment (topics whose replica
list names this node) and the partition states in ZooKeeper ({leader, leader_epoch,
isr}, kept fresh by watches) with the open replicas: newly assigned ones are opened
(log recovery + producer-state load), no longer assigned ones are closed (snapshot,
flush) and their files kept, and each replica becomes leader or follower of the
state's epoch (`Partition.become_leader` / `become_follower`). A state with an older
leader epoch than the replica already applied is ignored. A leader adopts a newer ISR
of its own epoch (written by itself or by the controller).

`get()` resolves a client request's (topic, partition) to a replica this process
leads, or an error code; followers answer NOT_LEADER_OR_FOLLOWER. Replica fetches
(`fetch_for_follower`) and OffsetForLeaderEpoch (`end_offset_for_epoch`) go to the
leader replica. `follower_targets()` tells the replica fetchers whom to follow;
`isr_updates()` which leaders want a different ISR.

Leadership lease: with `lease_ms` set, a leader acknowledges writes only while its
leadership was confirmed in ZooKeeper less than `lease_ms` ago (`lease_valid`), so a
leader that wakes from a pause longer than its session cannot acknowledge anything
before learning it was replaced. The service renews leases; without `lease_ms`
(tests, tools) leadership needs no confirmation. While the ZooKeeper connection is
SUSPENDED (`zookeeper_suspended`), acks=all writes and markers go on without a lease:
they wait for the high watermark instead (`_isr_vouches`; docs/design.md, "ZooKeeper faults").

Pure domain code: the cluster is anything with `topics()` (TopicInfo with
`partitions` and `states`). Not thread-safe: the service calls it from its event
loop only.
"""
from __future__ import annotations

import asyncio
import logging
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable, Hashable, Iterator, Mapping, NamedTuple, Protocol, Sequence, TypeVar

from exactly_wire import records
from exactly_wire.clock import monotonic_ms as _monotonic_ms
from exactly_wire.clock import wall_clock_ms
from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition

from services.common import pid_binding
from services.common.ownership import RETIRED_WRITER_EPOCH
from services.common.settings import PartitionLeaderSchema, role_settings
from services.common.verification import Verifier

from .leader_epoch import UNDEFINED_EPOCH, UNDEFINED_OFFSET, EpochEndOffset
from .partition import (ACKS_ALL, READ_COMMITTED, AppendResult, FetchResult, MarkerResult, Partition,
                        PartitionConfig, ReplicaFetchResult)
from .purgatory import HIGH_WATERMARK, LAST_STABLE, LOG_END, Purgatory, Watch
from .snapshot_store import SnapshotStore

log = logging.getLogger(__name__)

DEFAULT_FETCH_MAX_BYTES = 52428800  # Kafka's fetch.max.bytes
DEFAULT_PARTITION_MAX_BYTES = 1048576  # Kafka's max.partition.fetch.bytes
VALID_ACKS = (0, 1, -1)
DEFAULT_PRODUCE_TIMEOUT_MS = 30000
MARKER_TIMEOUT_MS = 25000  # below the coordinators' 30 s WriteTxnMarkers deadline

T = TypeVar("T")


class ClusterView(Protocol):
    def topics(self) -> Mapping[str, object]: ...


class Leases(Protocol):
    """Confirms a leader's leadership (see lease.LeaseKeeper)."""

    def ensure(self, p: Partition, deadline: float) -> Awaitable[bool]: ...


class ProduceEntry(NamedTuple):
    """One partition's data of a Produce: a single record batch v2, raw bytes."""

    topic: str
    partition: int
    records: bytes


class MarkerEntry(NamedTuple):
    """One transaction marker of a WriteTxnMarkers for `partitions` ((topic, partition) pairs)."""

    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int
    partitions: tuple[TopicPartition, ...]
    transaction_version: int = 1  # 2: ends the transaction under the next epoch (KIP-890 part 2)


class FetchEntry(NamedTuple):
    """One partition of a Fetch: where to read and at most how many bytes (0: Kafka's
    max.partition.fetch.bytes default); current_leader_epoch -1 skips the epoch check."""

    topic: str
    partition: int
    fetch_offset: int
    max_bytes: int = 0
    current_leader_epoch: int = -1


OFFSETS_TOPIC = "__consumer_offsets"


def _is_transactional(batch: bytes) -> bool:
    try:
        return records.parse_header(batch).is_transactional
    except records.CorruptRecordError:
        return False  # Partition.append answers CORRUPT_MESSAGE


def _backed(claim: tuple[int, int, int], producer_id: int, producer_epoch: int) -> bool:
    writer, epoch, retired = claim
    return (producer_id == writer and producer_epoch <= epoch) or \
        (producer_id == retired and producer_epoch == RETIRED_WRITER_EPOCH)


def guarded(what: str, fn: Callable[..., T], *args,
            on_io_error: Callable[[OSError], None] | None = None) -> tuple[T | None, ErrorCode]:
    """Run a domain call; an exception (a bug, corruption, an I/O failure) becomes an
    error code for this partition instead of failing the whole request:
    (result, NONE), (None, KAFKA_STORAGE_ERROR) for OSError (then `on_io_error(exc)`,
    e.g. `ReplicaManager.fail_log_dir`), else (None, UNKNOWN_SERVER_ERROR); logged
    with its traceback."""
    try:
        return fn(*args), ErrorCode.NONE
    except OSError as exc:
        log.exception("%s failed with an I/O error", what)
        if on_io_error is not None:
            on_io_error(exc)
        return None, ErrorCode.KAFKA_STORAGE_ERROR
    except Exception:  # noqa: BLE001 - reported as UNKNOWN_SERVER_ERROR, logged with its traceback
        log.exception("%s failed", what)
        return None, ErrorCode.UNKNOWN_SERVER_ERROR


class _State:
    """The partition state fields the manager reads (services.common.cluster.PartitionState)."""

    def __init__(self, leader: str | None, leader_epoch: int, isr: tuple[str, ...], version: int = -1):
        self.leader, self.leader_epoch, self.isr, self.version = leader, leader_epoch, isr, version


def _state(topic_info, partition: int):
    """ZooKeeper's state of a partition; a topic written without states is led by its
    first replica in epoch 0 with every replica in sync."""
    st = getattr(topic_info, "states", {}).get(partition)
    if st is not None:
        return st
    replicas = tuple(topic_info.partitions.get(partition, ()))
    return _State(replicas[0] if replicas else None, 0, replicas)


def positions(p: Partition) -> dict[str, int]:
    """The positions of `p` that parked watches wait on (purgatory.Watch)."""
    return {LOG_END: p.log_end_offset, HIGH_WATERMARK: p.high_watermark, LAST_STABLE: p.last_stable_offset}


class ReplicaManager:
    """Open replicas by (topic, partition).

    node_id: this process; data_dir: its data directory (logs under `logs/`,
    snapshots in `store`); props: the process's parsed settings (PartitionLeaderSchema;
    a mapping of Kafka keys is parsed, raising ConfigurationError; see
    `PartitionConfig.from_settings`), topic configs from the cluster override them;
    clock_ms: wall clock (ms, for timestamps), monotonic_s: clock of the leadership leases (s), monotonic_ms: clock
    of the other durations (followers' lag for the ISR, snapshot interval; ms).
    """

    def __init__(self, node_id: str, data_dir: Path, props: PartitionLeaderSchema | Mapping[str, str],
                 cluster: ClusterView,
                 store: SnapshotStore, clock_ms: Callable[[], int] = wall_clock_ms,
                 monotonic_s: Callable[[], float] = time.monotonic,
                 monotonic_ms: Callable[[], int] = _monotonic_ms):
        self.node_id = node_id
        self.data_dir = data_dir
        self._settings = role_settings(PartitionLeaderSchema, props)
        # The settings as Kafka keys, for callers holding a mapping; `settings` follows changes to it.
        self.props: dict[str, object] = self._settings.model_dump(by_alias=True, exclude_unset=True)
        self._settings_of = dict(self.props)
        self.cluster = cluster
        self.store = store
        self.clock_ms = clock_ms
        self.monotonic_s = monotonic_s
        self.monotonic_ms = monotonic_ms
        self.max_lag_ms = self.settings.replica_lag_time_max_ms
        self.lease_ms: int | None = None
        self.replicas: dict[TopicPartition, Partition] = {}
        self.changed: set[TopicPartition] = set()  # see refresh()
        self.on_isr_update: Callable[[TopicPartition], None] | None = None
        self.is_live: Callable[[str], bool] = lambda node_id: True  # registered in ZooKeeper
        # Requests waiting for events on a partition (see purgatory.py); the service
        # notifies it on appends, markers, high-watermark, ISR and leadership changes.
        self.purgatory = Purgatory(monotonic_s, max_parked_per_owner=self.settings.fetch_max_parked_per_principal)
        # The longest a consumer's Fetch may wait (`fetch.max.wait.ms`, ms).
        self.fetch_max_wait_ms = self.settings.fetch_max_wait_ms
        # Leadership confirmation before acknowledging writes; None: always confirmed.
        self.leases: Leases | None = None
        # The ZooKeeper connection is down while the session may still live (kazoo's
        # SUSPENDED): leaders keep acknowledging acks=all writes (see `_leader_for_write`).
        self.zookeeper_suspended = False
        # The transaction coordinators' port: verification (KIP-890 part 1) of client
        # batches that would start a transaction, when verify_transactions
        # (`transaction.partition.verification.enable`), and the implicit adds of
        # KIP-890 part 2 (always); None: neither (tests and tools).
        self.verifier: Verifier | None = None
        self.verify_transactions = True
        # With the authorizer on: producer id -> principal bindings (pid_binding.py).
        self.pid_bindings: pid_binding.ProducerIdBindings | None = None
        # Called with (topic, batch) for every client batch appended (metrics).
        self.on_appended: Callable[[str, bytes], None] = lambda topic, batch: None
        # KIP-112 (docs/design.md, "Disk faults"): set by fail_log_dir on the first I/O
        # error on the log directory; on_log_dir_failure(exc) then tells the controller.
        self.log_dir_offline = False
        self.on_log_dir_failure: Callable[[OSError], None] = lambda exc: None
        # (topic, partition, producer id) -> lock ordering that producer's appends there.
        self._producer_locks: dict[tuple[str, int, int], asyncio.Lock] = {}
        # Coordinator claims on internal partitions: (writer id, writer epoch, retired writer id).
        self._claims: dict[TopicPartition, tuple[int, int, int]] = {}

    @property
    def settings(self) -> PartitionLeaderSchema:
        """The process's parsed settings (PartitionLeaderSchema), parsed again only when
        `props` was changed since. Raises ConfigurationError for a wrong changed value."""
        if self.props != self._settings_of:
            self._settings = role_settings(PartitionLeaderSchema, self.props)
            self._settings_of = dict(self.props)
        return self._settings

    def fail_log_dir(self, exc: OSError) -> None:
        """KIP-112 (docs/design.md, "Disk faults"): an I/O error (EIO, ENOSPC, a failed
        fsync) on the log directory takes it offline for the life of this process.
        Every replica here stops at once: leases are voided (nothing more is
        acknowledged), client and replica requests answer KAFKA_STORAGE_ERROR, followers
        stop fetching, no snapshot, checkpoint, ISR change or cleaning touches the
        files; `on_log_dir_failure(exc)` then has the controller move leadership to the
        in-sync replicas. Idempotent. A restart (after the disk is repaired or freed)
        recovers the logs as after a crash."""
        if self.log_dir_offline:
            return
        self.log_dir_offline = True
        log.error("log directory %s is offline after an I/O error (%s): its %d replicas stop here",
                  self.data_dir / "logs", exc, len(self.replicas))
        for tp, p in self.replicas.items():
            p.lease_until = 0.0
            self.purgatory.notify(tp, None)
        self.on_log_dir_failure(exc)

    def _guarded(self, what: str, fn: Callable[..., T], *args) -> tuple[T | None, ErrorCode]:
        return guarded(what, fn, *args, on_io_error=self.fail_log_dir)

    @property
    def partitions(self) -> dict[TopicPartition, Partition]:
        """The replicas this process leads (none while the log directory is offline)."""
        if self.log_dir_offline:
            return {}
        return {tp: p for tp, p in self.replicas.items() if p.is_leader}

    def __iter__(self) -> Iterator[Partition]:
        """Every open replica (leaders and followers)."""
        return iter(list(self.replicas.values()))

    # ------------------------------------------------------------ assignment and roles
    def _open(self, topic_info, partition: int) -> Partition:
        name = topic_info.name
        config = PartitionConfig.from_settings(self.settings, getattr(topic_info, "configs", {}))
        p = Partition.open(name, partition, self.data_dir, config, self.store,
                           internal=bool(getattr(topic_info, "internal", False)) or name.startswith("__"),
                           leader_epoch=-1, clock_ms=self.clock_ms, local_id=self.node_id, single_replica=False,
                           monotonic_ms=self.monotonic_ms)
        p.config_source = dict(getattr(topic_info, "configs", {}))
        self.replicas[(name, partition)] = p
        log.info("opened %s-%d: log end %d, high watermark %d, %d producers (snapshot at %s)",
                 name, partition, p.log_end_offset, p.high_watermark, len(p.producers.producers),
                 p.snapshot_loaded_from)
        return p

    def _apply_state(self, p: Partition, replicas: tuple[str, ...], st) -> bool:
        """Make `p` leader or follower as `st` says; returns whether its role, epoch or
        high watermark changed."""
        if st.leader_epoch < p.leader_epoch:
            log.debug("%s-%d: ignoring a state of epoch %d, already at %d",
                      p.topic, p.partition, st.leader_epoch, p.leader_epoch)
            return False
        version = getattr(st, "version", -1)
        if st.leader == self.node_id:
            if not p.is_leader or p.leader_epoch != st.leader_epoch:
                p.become_leader(st.leader_epoch, replicas, tuple(st.isr), version)
                p.lease_until = math.inf if self.lease_ms is None else 0.0
                log.info("leading %s-%d: log end %d, high watermark %d, epoch %d, ISR %s, %d producers "
                         "(snapshot at %s)", p.topic, p.partition, p.log_end_offset, p.high_watermark,
                         st.leader_epoch, ",".join(p.isr), len(p.producers.producers), p.snapshot_loaded_from)
                return True
            # A newer ISR of our epoch (our own write, or the controller's): adopt it;
            # a smaller ISR may move the high watermark.
            return version > p.replication.zk_version and p.set_isr(tuple(st.isr), version)
        if p.is_leader or p.leader_id != st.leader or p.leader_epoch != st.leader_epoch:
            was_leader = p.is_leader
            p.become_follower(st.leader, st.leader_epoch, replicas)
            log.info("%s %s-%d: following %s in epoch %d", "resigned," if was_leader else "now",
                     p.topic, p.partition, st.leader or "no leader (offline)", st.leader_epoch)
            return True
        return False

    def refresh(self) -> tuple[list[TopicPartition], list[TopicPartition]]:
        """Open newly assigned replicas, close the ones no longer assigned here, and
        apply the partition states (leader / follower, epoch, ISR). Returns (opened,
        closed); `changed` then holds the replicas whose role, epoch or high watermark
        changed (waiters on them must look again). A
        replica that fails to open (OSError) is logged and retried at the next refresh."""
        self.changed = set()
        if self.log_dir_offline:
            return [], []
        topics = self.cluster.topics()
        wanted: dict[TopicPartition, tuple[object, tuple[str, ...]]] = {}
        for info in topics.values():
            for partition, replicas in info.partitions.items():
                if self.node_id in replicas:
                    wanted[(info.name, partition)] = (info, tuple(replicas))
        opened, closed = [], []
        self.changed = set()
        for tp in sorted(wanted):
            info, replicas = wanted[tp]
            p = self.replicas.get(tp)
            if p is None:
                try:
                    p = self._open(info, tp[1])
                except OSError:
                    log.exception("cannot open %s-%d", *tp)
                    continue
                opened.append(tp)
            if p.config_source != dict(getattr(info, "configs", {})):
                self._reconfigure(p, info)
            if self._apply_state(p, replicas, _state(info, tp[1])):
                self.changed.add(tp)
        for tp in sorted(set(self.replicas) - set(wanted)):
            if tp[0] in topics:
                self.close_partition(tp)
            else:
                self.delete_partition(tp)
            closed.append(tp)
            self.changed.add(tp)
        return opened, closed

    def _reconfigure(self, p: Partition, info) -> None:
        configs = dict(getattr(info, "configs", {}))
        try:
            p.reconfigure(PartitionConfig.from_settings(self.settings, configs))
        except ValueError:
            log.exception("%s-%d: topic configs %s not applied", p.topic, p.partition, configs)
        p.config_source = configs
        log.info("%s-%d: topic configs now %s", p.topic, p.partition, configs)

    def delete_partition(self, tp: TopicPartition) -> None:
        """The topic of `tp` was deleted (DeleteTopics): close the replica and remove
        its log directory and producer-state snapshots."""
        p = self.replicas.pop(tp, None)
        if p is None:
            return
        try:
            p.delete()
        except OSError:
            log.exception("deleting %s-%d failed", *tp)
        log.info("deleted %s-%d (topic deleted)", *tp)

    def orphaned_logs(self) -> list[tuple[TopicPartition, Path]]:
        """Partition directories under `<data dir>/logs` whose topic the cluster view
        does not know (deleted while this process was down), as ((topic, partition),
        path). The caller confirms with ZooKeeper before deleting them."""
        topics = self.cluster.topics()
        out = []
        logs = self.data_dir / "logs"
        for d in sorted(logs.iterdir()) if logs.is_dir() else ():
            topic, _, partition = d.name.rpartition("-")
            if d.is_dir() and topic and partition.isdigit() and topic not in topics and \
                    (topic, int(partition)) not in self.replicas:
                out.append(((topic, int(partition)), d))
        return out

    def delete_orphaned(self, tp: TopicPartition, path: Path) -> None:
        """Delete the directory and snapshots of a replica of a deleted topic that was
        never opened here. Raises OSError."""
        for off in self.store.offsets(*tp):
            self.store.delete(tp[0], tp[1], off)
        shutil.rmtree(path, ignore_errors=True)
        log.info("deleted %s-%d (topic deleted while this process was down)", *tp)

    def close_partition(self, tp: TopicPartition) -> None:
        p = self.replicas.pop(tp, None)
        if p is None:
            return
        try:
            p.close()
        except OSError:
            log.exception("closing %s-%d failed", *tp)
        log.info("closed %s-%d", *tp)

    def follower_targets(self) -> dict[TopicPartition, tuple[str, int]]:
        """(leader node id, leader epoch) of each followed replica that has a leader
        (none while the log directory is offline)."""
        if self.log_dir_offline:
            return {}
        return {tp: (p.leader_id, p.leader_epoch) for tp, p in self.replicas.items()
                if not p.is_leader and p.leader_id is not None}

    # ------------------------------------------------------------ requests
    def get(self, topic: str, partition: int) -> tuple[Partition | None, ErrorCode]:
        """The replica this process leads, for a client request, or (None, error):
        UNKNOWN_TOPIC_OR_PARTITION (no such topic or partition), NOT_LEADER_OR_FOLLOWER
        (led elsewhere, or no leader), KAFKA_STORAGE_ERROR (led here but its files
        cannot be opened, or the log directory is offline). A partition just assigned
        here but not yet opened by `refresh` is opened on demand."""
        if self.log_dir_offline:
            return self._offline(topic, partition)
        p = self.replicas.get((topic, partition))
        if p is not None:
            return (p, ErrorCode.NONE) if p.is_leader else (None, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        info = self.cluster.topics().get(topic)
        if info is None or partition not in info.partitions:
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        replicas = tuple(info.partitions[partition])
        st = _state(info, partition)
        if st.leader != self.node_id or self.node_id not in replicas:
            return None, ErrorCode.NOT_LEADER_OR_FOLLOWER
        try:
            p = self._open(info, partition)
        except OSError as exc:
            log.exception("cannot open %s-%d", topic, partition)
            self.fail_log_dir(exc)
            return None, ErrorCode.KAFKA_STORAGE_ERROR
        self._apply_state(p, replicas, st)
        return p, ErrorCode.NONE

    def _offline(self, topic: str, partition: int) -> tuple[None, ErrorCode]:
        info = self.cluster.topics().get(topic)
        if info is None or partition not in info.partitions:
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return None, ErrorCode.KAFKA_STORAGE_ERROR

    def _leader_replica(self, topic: str, partition: int) -> tuple[Partition | None, ErrorCode]:
        if self.log_dir_offline:
            return self._offline(topic, partition)
        p = self.replicas.get((topic, partition))
        if p is not None:
            return (p, ErrorCode.NONE) if p.is_leader else (None, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        info = self.cluster.topics().get(topic)
        if info is None or partition not in info.partitions:
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return None, ErrorCode.NOT_LEADER_OR_FOLLOWER

    def delete_records(self, topic: str, partition: int, offset: int) -> tuple[ErrorCode, int, str]:
        """DeleteRecords on a partition led here: (error, log start offset, message).
        Moves the log start offset (`Partition.delete_records`) and deletes the
        segments wholly below it right away. Errors: those of `get`;
        INVALID_TOPIC_EXCEPTION for an internal topic (compaction keeps them small);
        OFFSET_OUT_OF_RANGE above the high watermark."""
        if self.is_internal(topic):
            return ErrorCode.INVALID_TOPIC_EXCEPTION, -1, f"records of the internal topic {topic} cannot be deleted"
        p, err = self.get(topic, partition)
        if p is None:
            return err, -1, ""
        res, err = self._guarded(f"DeleteRecords on {topic}-{partition}", p.delete_records, offset)
        if res is None:
            return err, -1, ""
        code, low = res
        if code != ErrorCode.NONE:
            return code, low, (f"offset {offset} is above the high watermark {p.high_watermark}"
                               if code == ErrorCode.OFFSET_OUT_OF_RANGE else "")
        self._guarded(f"deleting segments of {topic}-{partition}", p.delete_old_segments)
        self.purgatory.notify((topic, partition))
        return ErrorCode.NONE, p.log_start_offset, ""

    def fetch_for_follower(self, topic: str, partition: int, replica_id: str, offset: int, max_bytes: int,
                           current_leader_epoch: int = -1) -> ReplicaFetchResult:
        """A follower's fetch (see `Partition.fetch_for_follower`); asks for an ISR
        update (`on_isr_update`) when the follower caught up outside the ISR.
        UNKNOWN_TOPIC_OR_PARTITION / NOT_LEADER_OR_FOLLOWER when not led here."""
        p, err = self._leader_replica(topic, partition)
        if p is None:
            return ReplicaFetchResult(err)
        res = p.fetch_for_follower(replica_id, offset, max_bytes, current_leader_epoch)
        if res.error == ErrorCode.NONE and self.on_isr_update is not None and \
                p.isr_expand_candidate(replica_id, self.max_lag_ms) is not None:
            self.on_isr_update((topic, partition))
        return res

    def end_offset_for_epoch(self, topic: str, partition: int, leader_epoch: int,
                             current_leader_epoch: int = -1) -> tuple[ErrorCode, EpochEndOffset]:
        """OffsetForLeaderEpoch (see `Partition.end_offset_for_epoch`)."""
        p, err = self._leader_replica(topic, partition)
        if p is None:
            return err, EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET)
        return p.end_offset_for_epoch(leader_epoch, current_leader_epoch)

    # ------------------------------------------------------------ delayed produce and fetch
    async def _confirmed(self, p: Partition, deadline: float) -> bool:
        """Whether leader `p` may acknowledge: its lease is valid, or the lease keeper
        confirms it before `deadline` (monotonic s)."""
        if self.leases is None or self.lease_valid(p):
            return True
        return await self.leases.ensure(p, deadline)

    def _isr_vouches(self, p: Partition, hw_gated: bool) -> bool:
        """Whether leader `p` may go on without a lease: ZooKeeper is unreachable (the
        connection SUSPENDED) and the write waits for the high watermark with the ISR
        at `min.insync.replicas` or more. Such a write is acknowledged only once every
        ISR member has it, and every leader the controller can elect comes from the
        ISR, so no leader change can lose it (Kafka's acks=all guarantee); no
        election can happen while ZooKeeper is down for all (docs/design.md,
        "ZooKeeper faults")."""
        return hw_gated and self.zookeeper_suspended and p.is_leader and p.enough_replicas()

    async def _leader_for_write(self, topic: str, partition: int, deadline: float,
                                confirm: bool, hw_gated: bool = False) -> tuple[Partition | None, ErrorCode]:
        """`get()`, first confirming leadership (when `confirm` and the lease is not
        valid) so that a deposed or paused leader appends nothing; `hw_gated` (an
        acks=all write or a marker) skips the confirmation while ZooKeeper is
        unreachable (`_isr_vouches`)."""
        p, err = self.get(topic, partition)
        if p is not None and confirm and self.leases is not None and not self.lease_valid(p) \
                and not self._isr_vouches(p, hw_gated):
            if not await self.leases.ensure(p, deadline):
                return None, ErrorCode.NOT_LEADER_OR_FOLLOWER
            p, err = self.get(topic, partition)
        return p, err

    async def _await_high_watermark(self, p: Partition, epoch: int, last_offset: int, deadline: float) -> ErrorCode:
        """Kafka's DelayedProduce: wait until the high watermark passes `last_offset`
        while `p` leads `epoch`. NONE, NOT_ENOUGH_REPLICAS_AFTER_APPEND (the ISR fell
        below min.insync.replicas meanwhile), NOT_LEADER_OR_FOLLOWER (leadership
        moved), REQUEST_TIMED_OUT (deadline)."""
        tp = (p.topic, p.partition)
        while True:
            if self.replicas.get(tp) is not p or not p.is_leader or p.leader_epoch != epoch:
                return ErrorCode.NOT_LEADER_OR_FOLLOWER
            if p.high_watermark > last_offset:
                return ErrorCode.NONE if len(p.isr) >= p.min_insync_replicas \
                    else ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
            if not await self.purgatory.wait((Watch(tp, HIGH_WATERMARK, last_offset),), deadline) \
                    and self.purgatory.clock() >= deadline:
                return ErrorCode.REQUEST_TIMED_OUT

    async def _complete(self, p: Partition, epoch: int, acks: int, last_offset: int, deadline: float) -> ErrorCode:
        """The acknowledgement of an append that succeeded locally: acks=all waits
        for the high watermark; acks 1 and all confirm leadership of `epoch` (acks=all
        not while ZooKeeper is unreachable, `_isr_vouches`)."""
        if acks == ACKS_ALL:
            err = await self._await_high_watermark(p, epoch, last_offset, deadline)
            if err != ErrorCode.NONE:
                return err
            if self._isr_vouches(p, True) and p.leader_epoch == epoch:
                return ErrorCode.NONE
        if acks != 0 and not (await self._confirmed(p, deadline) and p.leader_epoch == epoch):
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.NONE

    def is_internal(self, topic: str) -> bool:
        """Whether `topic` is an internal topic (`__transaction_state`,
        `__consumer_offsets`: marked internal, or named with a leading "__")."""
        info = self.cluster.topics().get(topic)
        return topic.startswith("__") or bool(getattr(info, "internal", False))

    async def append_records(self, acks: int, entries: Sequence[ProduceEntry],
                             timeout_ms: int = DEFAULT_PRODUCE_TIMEOUT_MS, *,
                             origin: str = "client", transactional_id: str = "",
                             consumer_group_id: str = "", principal: str | None = None,
                             add_partitions: bool = False) -> list[AppendResult]:
        """Produce (design doc "Client-Broker request handling", produce; Kafka's
        ReplicaManager.appendRecords): append each entry's batch to the partition led
        here and acknowledge it by `acks`: 0 at once, 1 after the local append, -1
        (all) once the high watermark passed it. Before appending and before
        acknowledging (acks != 0) the leader confirms its lease. timeout_ms (<= 0:
        30000) bounds the whole request. origin "client" (Produce) may not write
        internal topics, "coordinator" (CoordinatorProduce) writes only internal
        topics (Kafka's internal-topics-allowed appends): INVALID_TOPIC_EXCEPTION
        otherwise, so a client can never forge a coordinator's record. With a
        verifier, a client batch that would start its producer's transaction on a
        partition is appended only after the coordinator of `transactional_id`
        confirmed the partition is in that transaction (KIP-890 part 1;
        INVALID_TXN_STATE without transactional_id or when it is not,
        INVALID_PRODUCER_EPOCH for another epoch); `consumer_group_id` names a
        group-aware producer's group, whose coordinator holds its transaction (KIP-447
        draft). `add_partitions` (KIP-890 part 2, a producer of transaction version
        2 that sent no AddPartitionsToTxn): instead of verifying, the leader adds the
        partition to the producer's transaction at its coordinator (TxnVerifier.add),
        INVALID_PRODUCER_EPOCH when the coordinator holds another epoch (a late batch
        of an ended transaction); not for a group-aware producer, which adds its
        partitions itself. With `pid_bindings` set (authorizer on), a client's idempotent or
        transactional batch is appended only when its producer id is bound to
        `principal` (and, transactional, to `transactional_id`): otherwise
        TRANSACTIONAL_ID_AUTHORIZATION_FAILED or CLUSTER_AUTHORIZATION_FAILED before the
        producer state is touched (services/common/pid_binding.py; NOT_ENOUGH_REPLICAS
        while the binding cannot be checked). Returns one
        AppendResult per entry, in order: INVALID_REQUIRED_ACKS,
        INVALID_TOPIC_EXCEPTION, the errors of `get()` and `Partition.append`,
        and after a local append NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        NOT_LEADER_OR_FOLLOWER or REQUEST_TIMED_OUT (offsets kept)."""
        deadline = self.monotonic_s() + (timeout_ms if timeout_ms > 0 else DEFAULT_PRODUCE_TIMEOUT_MS) / 1000
        if origin not in ("client", "coordinator"):
            raise ValueError(f"unknown append origin {origin!r}")
        add = add_partitions and not consumer_group_id and origin == "client"
        jobs = [self._append_one(acks, e, deadline, origin == "coordinator", transactional_id, consumer_group_id,
                                 principal, add) for e in entries]
        if len(jobs) == 1:
            return [await jobs[0]]
        return list(await asyncio.gather(*jobs))

    async def _append_one(self, acks: int, e: ProduceEntry, deadline: float, internal_only: bool,
                          transactional_id: str = "", consumer_group_id: str = "",
                          principal: str | None = None, add: bool = False) -> AppendResult:
        """One entry of a Produce. The batches of one producer on one partition are
        appended in the order their requests arrived: a batch waiting for its
        transaction to be verified (KIP-890) holds back the producer's next ones, which
        would otherwise overtake it (a Kafka broker reads one request per connection at
        a time; gRPC runs a client's pipelined requests side by side)."""
        try:
            pid = records.parse_header(e.records).producer_id
        except records.CorruptRecordError:
            pid = -1
        if pid < 0:
            appended = await self._append_ordered(acks, e, deadline, internal_only, transactional_id,
                                                  consumer_group_id, add)
        elif (refused := await self._unbound(e, pid, internal_only, transactional_id, principal,
                                             deadline)) is not None:
            return refused
        else:
            key = (e.topic, e.partition, pid)
            lock = self._producer_locks.get(key)
            if lock is None:
                lock = self._producer_locks[key] = asyncio.Lock()
            try:
                async with lock:  # acquired in arrival order: an uncontended acquire does not yield
                    appended = await self._append_ordered(acks, e, deadline, internal_only, transactional_id,
                                                          consumer_group_id, add)
            finally:
                if not lock.locked() and not getattr(lock, "_waiters", None) and \
                        self._producer_locks.get(key) is lock:
                    del self._producer_locks[key]
        if isinstance(appended, AppendResult):
            return appended
        res, p, epoch = appended  # appended here: acknowledge by acks, outside the producer's order
        err = await self._complete(p, epoch, acks, res.last_offset, deadline)
        return res if err == ErrorCode.NONE else res._replace(error=err, message="")

    async def _append_ordered(self, acks: int, e: ProduceEntry, deadline: float, internal_only: bool,
                              transactional_id: str = "", consumer_group_id: str = "", add: bool = False
                              ) -> AppendResult | tuple[AppendResult, Partition, int]:
        """Checks, verification and the local append: an AppendResult when done (an
        error), or (result, partition, leader epoch) to acknowledge by acks."""
        if acks not in VALID_ACKS:
            return AppendResult(ErrorCode.INVALID_REQUIRED_ACKS)
        if self.is_internal(e.topic) != internal_only:
            why = (f"{e.topic} is an internal topic: only its coordinators write it" if not internal_only
                   else f"{e.topic} is not an internal topic")
            return AppendResult(ErrorCode.INVALID_TOPIC_EXCEPTION, message=why)
        p, err = await self._leader_for_write(e.topic, e.partition, deadline, confirm=acks != 0,
                                              hw_gated=acks == ACKS_ALL)
        if p is None:
            return AppendResult(err)
        guard = None
        if internal_only and e.topic != OFFSETS_TOPIC and _is_transactional(e.records):
            return AppendResult(ErrorCode.INVALID_RECORD, message=f"{e.topic} holds no transactional batches")
        if internal_only and not await self._writer_backed(e):
            return AppendResult(ErrorCode.INVALID_PRODUCER_EPOCH,
                                message=f"the writer id and epoch of this batch are not those of the coordinator "
                                        f"claim on {e.topic}-{e.partition}")
        # An implicit add (KIP-890 part 2) may wait at the coordinator while the
        # producer's previous transaction completes; that transaction's marker then
        # arrives here during the add and makes its guard stale. Adding again (at once
        # NONE when the partition is in the transaction; fenced when the transaction
        # was aborted and the epoch bumped meanwhile) settles which transaction the
        # batch belongs to.
        for _ in range(3 if add else 1):
            if self.verifier is not None and (add or self.verify_transactions):
                guard, refused = await self._verify(p, e, transactional_id, deadline, consumer_group_id,
                                                    internal_only, add)
                if refused is not None:
                    return refused
                p, err = self.get(e.topic, e.partition)  # leadership may have moved meanwhile
                if p is None:
                    return AppendResult(err)
            epoch = p.leader_epoch
            res, err = self._guarded(f"produce to {e.topic}-{e.partition}", p.append, e.records, acks, guard)
            if res is None:
                return AppendResult(err)
            if not (guard is not None and res.error == ErrorCode.INVALID_TXN_STATE and
                    p.producers.verification_guards.get(records.parse_header(e.records).producer_id) is not guard):
                break
        if res.error == ErrorCode.NONE:
            self.on_appended(e.topic, e.records)
            self.purgatory.notify((e.topic, e.partition), positions(p))
        if res.error in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
            return res, p, epoch
        return res

    async def _internal_marker_refused(self, m: MarkerEntry, topic: str, partition: int) -> MarkerResult | None:
        """`__transaction_state` holds no transactions, so no markers; on
        `__consumer_offsets` a marker may not name a coordinator's writer id (a marker
        bumps its producer's epoch, which would fence the owning coordinator)."""
        if topic != OFFSETS_TOPIC:
            return MarkerResult(ErrorCode.INVALID_REQUEST, message=f"{topic} holds no transactions")
        writer_claim = getattr(self.cluster, "writer_claim", None)
        if writer_claim is None:
            return None
        claim = self._claims.get((topic, partition))  # kept current by _writer_backed
        if claim is None:
            claim = self._claims[(topic, partition)] = await asyncio.to_thread(writer_claim, topic, partition)
        writer, _epoch, retired = claim
        if m.producer_id in (writer, retired):
            return MarkerResult(ErrorCode.INVALID_REQUEST,
                                message=f"producer id {m.producer_id} is the coordinator's writer id of {topic}-{partition}")
        return None

    async def _unbound(self, e: ProduceEntry, producer_id: int, internal_only: bool, transactional_id: str,
                       principal: str | None, deadline: float) -> AppendResult | None:
        """The refusal of a client's batch whose producer id is not bound to the caller
        (services/common/pid_binding.py; NOT_ENOUGH_REPLICAS when its binding could not
        be checked by `deadline`, monotonic seconds); None when it is, or when bindings
        are off."""
        if self.pid_bindings is None or internal_only:
            return None
        transactional = _is_transactional(e.records)
        code, why = await self.pid_bindings.check(producer_id, principal or "", transactional_id, transactional,
                                                  deadline)
        if code == ErrorCode.NONE:
            return None
        return AppendResult(code, message=why)

    async def _writer_backed(self, e: ProduceEntry) -> bool:
        """A coordinator's plain batch with a writer id must carry the writer id of the
        ZooKeeper claim on the partition, at most its writer epoch, or the retired
        writer id at the closing epoch (docs/design.md, "Coordinator ownership"): a
        forged batch cannot bump the writer epoch and fence the real owner. The claim
        is cached and read again when a batch goes past it (a new owner's fence)."""
        try:
            h = records.parse_header(e.records)
        except records.CorruptRecordError:
            return True  # refused by the partition with CORRUPT_MESSAGE
        if h.producer_id < 0 or h.is_transactional:
            return True  # no writer id; transactional offset commits are verified (KIP-890)
        key = (e.topic, e.partition)
        claim = self._claims.get(key)
        if claim is None or not _backed(claim, h.producer_id, h.producer_epoch):
            writer_claim = getattr(self.cluster, "writer_claim", None)
            if writer_claim is None:
                return True  # a cluster view without claims (tools, tests)
            claim = await asyncio.to_thread(writer_claim, e.topic, e.partition)
            self._claims[key] = claim
        return _backed(claim, h.producer_id, h.producer_epoch)

    async def _verify(self, p: Partition, e: ProduceEntry, transactional_id: str, deadline: float,
                      consumer_group_id: str = "", internal: bool = False, add: bool = False
                      ) -> tuple[object | None, AppendResult | None]:
        """(guard, None) when the batch may be appended (guard None: it starts no
        transaction), or (None, refusal). `internal`: a coordinator's append (a
        transactional offset commit to `__consumer_offsets` is verified like a
        client's batch, so a forged one cannot open a transaction that no
        transaction coordinator will ever end)."""
        try:
            h = records.parse_header(e.records)
        except records.CorruptRecordError:
            return None, None  # Partition.append answers CORRUPT_MESSAGE
        if not p.producers.needs_verification(h, include_internal=internal):
            return None, None
        if not transactional_id:
            return None, AppendResult(ErrorCode.INVALID_TXN_STATE, message=(
                f"transactional batch of producer {h.producer_id} without a transactional.id: "
                "no coordinator knows its transaction"))
        guard = p.producers.verification_guard(h.producer_id)
        if add:
            code = await self.verifier.add(transactional_id, h.producer_id, h.producer_epoch, e.topic, e.partition,
                                           deadline)
        else:
            code = await self.verifier.verify(transactional_id, h.producer_id, h.producer_epoch, e.topic,
                                              e.partition, deadline, consumer_group_id)
        if code != ErrorCode.NONE:
            what = "could not add" if add else "does not have"
            return None, AppendResult(code, message=(
                f"the coordinator of {transactional_id!r} {what} {e.topic}-{e.partition} in the ongoing "
                f"transaction of producer {h.producer_id} epoch {h.producer_epoch}"))
        return guard, None

    async def write_markers(self, markers: Sequence[MarkerEntry],
                            timeout_ms: int = MARKER_TIMEOUT_MS) -> list[list[MarkerResult]]:
        """WriteTxnMarkers (design doc "Coordinator-Broker request handling"): append
        each marker to each of its partitions led here (see `Partition.write_marker`)
        and acknowledge as acks=all. Markers of one partition are appended in request
        order (each append happens before its first wait). A marker that could not be
        appended within `timeout_ms` of the request's arrival (waiting for the
        leadership lease, or for ZooKeeper on `__consumer_offsets`) is not appended
        at all and answers REQUEST_TIMED_OUT: the coordinator may have given up on the
        request and written the marker again, and under transaction version 1 (no
        epoch bump) a marker applied that late could end the producer's next
        transaction. Returns, per marker, one MarkerResult per partition in order."""
        deadline = self.monotonic_s() + timeout_ms / 1000
        jobs = [self._marker_one(m, topic, partition, deadline) for m in markers for topic, partition in m.partitions]
        flat = list(await asyncio.gather(*jobs))
        out, i = [], 0
        for m in markers:
            out.append(flat[i:i + len(m.partitions)])
            i += len(m.partitions)
        return out

    async def _marker_one(self, m: MarkerEntry, topic: str, partition: int, deadline: float) -> MarkerResult:
        if self.is_internal(topic):
            refused = await self._internal_marker_refused(m, topic, partition)
            if refused is not None:
                return refused
        p, err = await self._leader_for_write(topic, partition, deadline, confirm=True, hw_gated=True)
        if p is None:
            return MarkerResult(err)
        if self.monotonic_s() >= deadline:
            return MarkerResult(ErrorCode.REQUEST_TIMED_OUT, message=(
                f"marker for producer {m.producer_id} epoch {m.producer_epoch} on {topic}-{partition} not "
                "appended: the request's deadline passed first"))
        epoch = p.leader_epoch
        res, err = self._guarded(f"marker on {topic}-{partition}", p.write_marker, m.producer_id, m.producer_epoch,
                           m.committed, m.coordinator_epoch, m.transaction_version)
        if res is None:
            return MarkerResult(err)
        if res.error == ErrorCode.NONE:
            self.purgatory.notify((topic, partition), positions(p))
            err = await self._complete(p, epoch, ACKS_ALL, res.offset, deadline)
            if err != ErrorCode.NONE:
                res = res._replace(error=err, message="")
        return res

    async def fetch_messages(self, entries: Sequence[FetchEntry], *, max_wait_ms: int = 0, min_bytes: int = 1,
                             max_bytes: int = 0, isolation_level: int = 0, replica_id: str = "",
                             owner: Hashable | None = None) -> list[FetchResult | ReplicaFetchResult]:
        """Fetch (design doc "Client-Broker request handling", fetch; Kafka's
        ReplicaManager.fetchMessages with DelayedFetch): read every entry once; when
        fewer than `min_bytes` (at least 1) bytes came back and no partition failed,
        wait up to `max_wait_ms` for an append, marker or high-watermark move on one
        of them and read again. max_bytes (0: 52428800) bounds the whole answer,
        each entry's max_bytes its partition. With `replica_id` the fetch is a
        follower's (`fetch_for_follower`, ReplicaFetchResult per entry); otherwise
        a consumer's at `isolation_level` (FetchResult per entry).

        A consumer's wait is cut to `fetch.max.wait.ms`, and parks only while
        `owner` (the principal, or the connection for User:ANONYMOUS; None: not
        counted) has fewer than `exactly.fetch.max.parked.per.principal` parked
        fetches; beyond that it is answered at once. The wait wakes when a position
        passes an entry's offset: the log end for a follower, the high watermark
        (read_uncommitted) or the last stable offset (read_committed) for a consumer
        (docs/design.md, "Tunnel and fetch limits")."""
        if not replica_id:
            max_wait_ms = min(max_wait_ms, self.fetch_max_wait_ms)
        deadline = self.monotonic_s() + max(max_wait_ms, 0) / 1000
        min_bytes = max(min_bytes, 1)
        bound = LOG_END if replica_id else LAST_STABLE if isolation_level == READ_COMMITTED else HIGH_WATERMARK
        while True:
            results, total, failed = self._read_once(entries, max_bytes, isolation_level, replica_id)
            if total >= min_bytes or failed or self.monotonic_s() >= deadline:
                return results
            # What was readable has been read: wait for the position to pass where it is now.
            watches = [Watch((e.topic, e.partition), bound, max(e.fetch_offset, self._position(e, bound)))
                       for e in entries]
            if not await self.purgatory.wait(watches, deadline, None if replica_id else owner):
                return self._read_once(entries, max_bytes, isolation_level, replica_id)[0]

    def _position(self, e: FetchEntry, bound: str) -> int:
        """Position `bound` (purgatory.LOG_END, ...) of the partition of `e` (-1: not here)."""
        p = self.replicas.get((e.topic, e.partition))
        return -1 if p is None else positions(p)[bound]

    def _read_once(self, entries: Sequence[FetchEntry], max_bytes: int, isolation_level: int,
                   replica_id: str) -> tuple[list, int, bool]:
        budget = max_bytes if max_bytes > 0 else DEFAULT_FETCH_MAX_BYTES
        total, failed = 0, False
        results: list = []
        for e in entries:
            limit = min(e.max_bytes if e.max_bytes > 0 else DEFAULT_PARTITION_MAX_BYTES, budget - total)
            if replica_id:
                res, err = self._guarded(f"replica fetch from {e.topic}-{e.partition}", self.fetch_for_follower,
                                   e.topic, e.partition, replica_id, e.fetch_offset, limit, e.current_leader_epoch)
                if res is None:
                    res = ReplicaFetchResult(err)
                if res.hw_changed:
                    leader = self.replicas.get((e.topic, e.partition))
                    # The followers learn the new high watermark from their next answer: wake
                    # them (LOG_END past every offset), and the consumers it lets read.
                    self.purgatory.notify((e.topic, e.partition), None if leader is None else
                                          {**positions(leader), LOG_END: sys.maxsize})
            else:
                p, err = self.get(e.topic, e.partition)
                res = None
                if p is not None:
                    res, err = self._guarded(f"fetch from {e.topic}-{e.partition}", p.fetch, e.fetch_offset, limit,
                                       isolation_level, e.current_leader_epoch)
                if res is None:
                    res = FetchResult(err)
                elif isolation_level != READ_COMMITTED and res.aborted:
                    res = res._replace(aborted=())
            results.append(res)
            if res.error != ErrorCode.NONE:
                failed = True
            else:
                total += len(res.records)
        return results, total, failed

    # ------------------------------------------------------------ ISR and leases
    def desired_isr(self, tp: TopicPartition, now_ms: int | None = None) -> tuple[str, ...] | None:
        """The ISR the leader of `tp` should store: without followers lagging more than
        `replica.lag.time.max.ms`, with live followers that caught up; None when it is the
        current one (or `tp` is not led here). now_ms: monotonic."""
        p = self.replicas.get(tp)
        if p is None or not p.is_leader or self.log_dir_offline:
            return None
        now = p.monotonic_ms() if now_ms is None else now_ms
        current = p.isr
        isr = set(p.isr_shrink_candidate(self.max_lag_ms, now) or current)
        for r in p.replication.followers:
            if r not in isr and self.is_live(r) and p.isr_expand_candidate(r, self.max_lag_ms, now) is not None:
                isr.add(r)
        ordered = tuple(r for r in p.replicas if r in isr)
        return None if set(ordered) == set(current) else ordered

    def isr_updates(self, now_ms: int | None = None) -> list[TopicPartition]:
        """Led partitions whose ISR should change (periodic check, every half
        `replica.lag.time.max.ms` as Kafka does)."""
        return [tp for tp, p in self.replicas.items() if p.is_leader and self.desired_isr(tp, now_ms) is not None]

    def lease_valid(self, p: Partition) -> bool:
        """Whether leader `p` may acknowledge writes now (see the module docstring)."""
        return p.is_leader and p.lease_until > self.monotonic_s() and not self.log_dir_offline

    def invalidate_leases(self) -> None:
        """ZooKeeper connection suspended or session lost: no leader acknowledges
        anything until its leadership is confirmed again."""
        if self.lease_ms is None:
            return
        for p in self.replicas.values():
            p.lease_until = 0.0

    # ------------------------------------------------------------ periodic work
    def maybe_snapshot_all(self, now_ms: int | None = None) -> int:
        """Periodic producer-state snapshots; returns how many were written. (The
        high-watermark checkpoints: `high_watermarks_to_checkpoint`.)"""
        if self.log_dir_offline:
            return 0
        return sum(p.maybe_snapshot(now_ms) for p in self)

    def high_watermarks_to_checkpoint(self) -> list[tuple[Partition, int]]:
        """(replica, high watermark) of every replica whose high watermark moved since
        its last checkpoint, read now (for `Partition.checkpoint_high_watermark(hw)` in
        a worker thread)."""
        if self.log_dir_offline:
            return []
        return [(p, hw) for p in self if (hw := p.high_watermark_unchecked) is not None]

    def expire_producers(self, now_ms: int | None = None) -> int:
        """PID expiration on every replica; returns how many PIDs were dropped."""
        if self.log_dir_offline:
            return 0
        return sum(len(p.expire_producers(now_ms)) for p in self)

    def close(self) -> None:
        """Close every replica (flush, final snapshot). Clean shutdown. With the log
        directory offline nothing is written: the next start recovers the logs."""
        if self.log_dir_offline:
            return
        for tp in list(self.replicas):
            self.close_partition(tp)
