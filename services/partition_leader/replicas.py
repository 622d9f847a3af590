"""The partition replicas hosted by this process, as leaders or followers: their
lifecycle (docs/design.md, "Partition leader modules").

`HostedReplicas.refresh()` compares the cluster's assignment (topics whose replica
list names this node) and the partition states in ZooKeeper ({leader, leader_epoch,
isr}, kept fresh by watches) with the open replicas: newly assigned ones are opened
(log recovery + producer-state load), no longer assigned ones are closed (snapshot,
flush) and their files kept, and each replica becomes leader or follower of the
state's epoch (`Partition.become_leader` / `become_follower`). A state with an older
leader epoch than the replica already applied is ignored. A leader adopts a newer ISR
of its own epoch (written by itself or by the controller).

Two maps: `replicas` holds every open replica (DescribeLogDirs lists them), `serving`
the ones that serve requests, replica fetches, leases, ISR changes and periodic work.
They are the same while the log directory is online; `fail_log_dir` (KIP-112) empties
`serving` at once, so request and periodic code look replicas up in `serving` and
need no check of their own.

`get()` resolves a client request's (topic, partition) to a replica this process
leads, or an error code; followers answer NOT_LEADER_OR_FOLLOWER.
`follower_targets()` tells the replica fetchers whom to follow; `isr_updates()` which
leaders want a different ISR.

Leadership lease: with `lease_ms` set, a leader acknowledges writes only while its
leadership was confirmed in ZooKeeper less than `lease_ms` ago (`lease_valid`), so a
leader that wakes from a pause longer than its session cannot acknowledge anything
before learning it was replaced. The service renews leases; without `lease_ms`
(tests, tools) leadership needs no confirmation. While the ZooKeeper connection is
SUSPENDED (`zookeeper_suspended`), acks=all writes and markers go on without a lease:
they wait for the high watermark instead (`isr_vouches`; docs/design.md, "ZooKeeper faults").

Pure domain code: the cluster is anything with `topics()` (TopicInfo with
`partitions` and `states`). Not thread-safe: the service calls it from its event
loop only.
"""
from __future__ import annotations

import logging
import math
import shutil
import time
from pathlib import Path
from typing import Awaitable, Callable, Iterator, Mapping, Protocol, TypeVar

from exactly_wire.clock import monotonic_ms as _monotonic_ms
from exactly_wire.clock import wall_clock_ms
from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition

from services.common.security import pid_binding
from services.common.settings import PartitionLeaderSchema, role_settings
from services.common.cluster.verification import Verifier

from .partition import Partition, PartitionConfig
from .purgatory import (HIGH_WATERMARK, HIGH_WATERMARK_BYTES, LAST_STABLE, LAST_STABLE_BYTES, LOG_END,
                        LOG_END_BYTES, Purgatory)
from .snapshot_store import SnapshotStore

log = logging.getLogger(__name__)


T = TypeVar("T")


class ClusterView(Protocol):
    def topics(self) -> Mapping[str, object]: ...

    def topic(self, name: str) -> object | None: ...


class Leases(Protocol):
    """Confirms a leader's leadership (see lease.LeaseKeeper)."""

    def ensure(self, p: Partition, deadline: float, vouched: Callable[[], bool] | None = None) -> Awaitable[bool]: ...


def guarded(what: str, fn: Callable[..., T], *args,
            on_io_error: Callable[[OSError], None] | None = None) -> tuple[T | None, ErrorCode]:
    """Run a domain call; an exception (a bug, corruption, an I/O failure) becomes an
    error code for this partition instead of failing the whole request:
    (result, NONE), (None, KAFKA_STORAGE_ERROR) for OSError (then `on_io_error(exc)`,
    e.g. `HostedReplicas.fail_log_dir`), else (None, UNKNOWN_SERVER_ERROR); logged
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
    """The partition state fields the manager reads (services.common.cluster.state.PartitionState)."""

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
    """The positions of `p` that parked watches wait on (purgatory.Watch): the offsets
    of its log end, high watermark and last stable offset, and their byte positions
    (byte_marks.ByteMarks; marks below the last stable offset are forgotten here)."""
    hw, lso = p.high_watermark, p.last_stable_offset
    marks = p.byte_marks
    marks.forget_below(lso)
    out = {LOG_END: p.log_end_offset, HIGH_WATERMARK: hw, LAST_STABLE: lso, LOG_END_BYTES: marks.total}
    for bound, offset in ((HIGH_WATERMARK_BYTES, hw), (LAST_STABLE_BYTES, lso)):
        at = marks.at(offset)
        if at is not None:
            out[bound] = at
    return out


class HostedReplicas:
    """Open replicas by (topic, partition).

    node_id: this process; data_dir: its data directory (logs under `logs/`,
    snapshots in `store`); props: the process's parsed settings (PartitionLeaderSchema;
    a mapping of Kafka keys is parsed, raising ConfigurationError; see
    `PartitionConfig.from_settings`), topic configs from the cluster override them;
    clock_ms: wall clock (ms, for timestamps), monotonic_s: clock of the leadership leases (s), monotonic_ms: clock
    of the other durations (followers' lag for the ISR, snapshot interval; ms);
    hosts_topic(topic) -> bool: the topics whose replicas this process hosts when assigned
    here (a partition leader: every topic; a process hosting one internal topic: that topic).
    Replicas of other topics are not opened here, and their directories are not counted
    as orphaned.
    """

    def __init__(self, node_id: str, data_dir: Path, props: PartitionLeaderSchema | Mapping[str, str],
                 cluster: ClusterView,
                 store: SnapshotStore, clock_ms: Callable[[], int] = wall_clock_ms,
                 monotonic_s: Callable[[], float] = time.monotonic,
                 monotonic_ms: Callable[[], int] = _monotonic_ms,
                 hosts_topic: Callable[[str], bool] = lambda topic: True):
        self.node_id = node_id
        self.hosts_topic = hosts_topic
        self.data_dir = data_dir
        self._settings = role_settings(PartitionLeaderSchema, props)
        # The settings as Kafka keys, for callers holding a mapping; `settings` follows changes to it.
        self.props: dict[str, object] = self._settings.model_dump(by_alias=True, exclude_unset=True)
        self._settings_of = dict(self.props)
        self.cluster = cluster
        self.store = store
        # The clocks: wall (ms), leases (s), other durations (ms).
        self.clock_ms, self.monotonic_s, self.monotonic_ms = clock_ms, monotonic_s, monotonic_ms
        self.max_lag_ms = self.settings.replica_lag_time_max_ms
        self.lease_ms: int | None = None
        self.replicas: dict[TopicPartition, Partition] = {}  # every open replica
        self.serving: dict[TopicPartition, Partition] = {}  # those serving (none once the log dir failed)
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
        # SUSPENDED): leaders keep acknowledging acks=all writes (see `leader_for_write`).
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
        # A transaction version 1 producer's first batch on a partition verified: "asked"
        # (a call to its coordinator) or "noted" (its TxnPartitionsAdded).
        self.on_verified: Callable[[str], None] = lambda how: None
        # KIP-112 (docs/design.md, "Disk faults"): set by fail_log_dir on the first I/O
        # error on the log directory; on_log_dir_failure(exc) then tells the controller.
        self.log_dir_offline = False
        self.on_log_dir_failure: Callable[[OSError], None] = lambda exc: None

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
        Every replica here leaves `serving` at once: leases are voided (nothing more is
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
        stopped, self.serving = self.serving, {}
        for tp, p in stopped.items():
            p.lease_until = 0.0
            self.purgatory.notify(tp, None)
        self.on_log_dir_failure(exc)

    def guarded(self, what: str, fn: Callable[..., T], *args) -> tuple[T | None, ErrorCode]:
        """`guarded` (the module's function) with an I/O error taking the log directory
        offline (`fail_log_dir`)."""
        return guarded(what, fn, *args, on_io_error=self.fail_log_dir)

    @property
    def partitions(self) -> dict[TopicPartition, Partition]:
        """The replicas this process leads (none while the log directory is offline)."""
        return {tp: p for tp, p in self.serving.items() if p.is_leader}

    def __iter__(self) -> Iterator[Partition]:
        """Every serving replica (leaders and followers)."""
        return iter(list(self.serving.values()))

    def is_internal(self, topic: str) -> bool:
        """Whether `topic` is an internal topic (`TRANSACTION_STATE_TOPIC`,
        `CONSUMER_OFFSETS_TOPIC`: marked internal, or named with a leading "__")."""
        info = self.cluster.topic(topic)
        return topic.startswith("__") or bool(getattr(info, "internal", False))

    # ------------------------------------------------------------ assignment and roles
    def _open(self, topic_info, partition: int) -> Partition:
        name = topic_info.name
        config = PartitionConfig.from_settings(self.settings, getattr(topic_info, "configs", {}))
        p = Partition.open(name, partition, self.data_dir, config, self.store,
                           internal=bool(getattr(topic_info, "internal", False)) or name.startswith("__"),
                           leader_epoch=-1, clock_ms=self.clock_ms, local_id=self.node_id, single_replica=False,
                           monotonic_ms=self.monotonic_ms)
        p.config_source = dict(getattr(topic_info, "configs", {}))
        self.replicas[(name, partition)] = self.serving[(name, partition)] = p
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
            moved = version > p.replication.zk_version and p.set_isr(tuple(st.isr), version)
            # Then replicas added or removed within the epoch (after the ISR: a removed
            # replica stops counting once it is out of both).
            if tuple(replicas) != p.replicas:
                p.reassign(tuple(replicas))
                log.info("%s-%d: replicas now %s", p.topic, p.partition, ",".join(replicas))
                return True
            return moved
        if p.is_leader or p.leader_id != st.leader or p.leader_epoch != st.leader_epoch:
            was_leader = p.is_leader
            p.become_follower(st.leader, st.leader_epoch, replicas)
            log.info("%s %s-%d: following %s in epoch %d", "resigned," if was_leader else "now",
                     p.topic, p.partition, st.leader or "no leader (offline)", st.leader_epoch)
            return True
        if tuple(replicas) != p.replicas:
            p.reassign(tuple(replicas))
        return False

    def refresh(self) -> tuple[list[TopicPartition], list[TopicPartition]]:
        """Open newly assigned replicas, close the ones no longer assigned here, and
        apply the partition states (leader / follower, epoch, ISR). Returns (opened,
        closed); `changed` then holds the replicas whose role, epoch or high watermark
        changed (waiters on them must look again). An I/O error (OSError) opening,
        closing or deleting a replica takes the log directory offline (`fail_log_dir`),
        which ends the refresh."""
        self.changed = set()
        if self.log_dir_offline:
            return [], []
        topics = self.cluster.topics()
        wanted: dict[TopicPartition, tuple[object, tuple[str, ...]]] = {}
        for info in topics.values():
            if not self.hosts_topic(info.name):
                continue
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
                except OSError as exc:
                    log.exception("cannot open %s-%d", *tp)
                    self.fail_log_dir(exc)
                    return opened, closed
                opened.append(tp)
            if p.config_source != dict(getattr(info, "configs", {})):
                self._reconfigure(p, info)
            p.removing = tuple(getattr(info, "removing", {}).get(tp[1], ()))
            if self._apply_state(p, replicas, _state(info, tp[1])):
                self.changed.add(tp)
        for tp in sorted(set(self.replicas) - set(wanted)):
            if self.log_dir_offline:
                break
            if tp[0] in topics:
                # No longer assigned here: a replica that left a coordinator-led internal
                # partition (the controller removes it once the first replica leads).
                self._drop(tp, "delete", "deleted %s-%d (no longer one of its replicas)")
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
        self._drop(tp, "delete", "deleted %s-%d (topic deleted)")

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
                    self.hosts_topic(topic) and (topic, int(partition)) not in self.replicas:
                out.append(((topic, int(partition)), d))
        return out

    def unassigned_logs(self) -> list[tuple[TopicPartition, Path]]:
        """Partition directories under `<data dir>/logs` of hosted topics the cluster view
        knows whose partition does not list this process among its replicas (it was
        removed from them while this process was down: a replica leaving a
        coordinator-led internal partition), as ((topic, partition), path). The caller
        confirms with ZooKeeper before deleting them."""
        topics = self.cluster.topics()
        out = []
        logs = self.data_dir / "logs"
        for d in sorted(logs.iterdir()) if logs.is_dir() else ():
            topic, _, partition = d.name.rpartition("-")
            info = topics.get(topic)
            if not (d.is_dir() and info is not None and partition.isdigit() and self.hosts_topic(topic)):
                continue
            tp = (topic, int(partition))
            if tp[1] in info.partitions and self.node_id not in info.partitions[tp[1]] and tp not in self.replicas:
                out.append((tp, d))
        return out

    def delete_orphaned(self, tp: TopicPartition, path: Path,
                        why: str = "topic deleted while this process was down") -> None:
        """Delete the directory and snapshots of a replica of a deleted topic that was
        never opened here. Raises OSError."""
        for off in self.store.offsets(*tp):
            self.store.delete(tp[0], tp[1], off)
        shutil.rmtree(path, ignore_errors=True)
        log.info("deleted %s-%d (%s)", *tp, why)

    def close_partition(self, tp: TopicPartition) -> None:
        """Close the replica of `tp` (flush, final snapshot) and forget it; its files stay."""
        self._drop(tp, "close", "closed %s-%d")

    def _drop(self, tp: TopicPartition, how: str, done: str) -> None:
        """Forget the replica of `tp` after calling its method `how` ("close",
        "delete"; an OSError takes the log directory offline), then log `done` % tp.
        With the log directory offline the replica is only forgotten."""
        self.serving.pop(tp, None)
        p = self.replicas.pop(tp, None)
        if p is None or self.log_dir_offline:
            return
        try:
            getattr(p, how)()
        except OSError as exc:
            log.exception("%s of %s-%d failed", how, *tp)
            self.fail_log_dir(exc)
            return
        log.info(done, *tp)

    def follower_targets(self) -> dict[TopicPartition, tuple[str, int]]:
        """(leader node id, leader epoch) of each followed replica that has a leader
        (none while the log directory is offline)."""
        return {tp: (p.leader_id, p.leader_epoch) for tp, p in self.serving.items()
                if not p.is_leader and p.leader_id is not None}

    # ------------------------------------------------------------ request lookups and leases
    def get(self, topic: str, partition: int) -> tuple[Partition | None, ErrorCode]:
        """The replica this process leads, for a client request, or (None, error):
        UNKNOWN_TOPIC_OR_PARTITION (no such topic or partition), NOT_LEADER_OR_FOLLOWER
        (led elsewhere, or no leader), KAFKA_STORAGE_ERROR (led here but its files
        cannot be opened, or the log directory is offline). A partition just assigned
        here but not yet opened by `refresh` is opened on demand."""
        return self._lookup(topic, partition, open_on_demand=True)

    def leader_replica(self, topic: str, partition: int) -> tuple[Partition | None, ErrorCode]:
        """As `get`, without opening on demand: for replica fetches and
        OffsetForLeaderEpoch, which only a replica already leading here answers."""
        return self._lookup(topic, partition, open_on_demand=False)

    def _lookup(self, topic: str, partition: int, open_on_demand: bool) -> tuple[Partition | None, ErrorCode]:
        p = self.serving.get((topic, partition))
        if p is not None:
            return (p, ErrorCode.NONE) if p.is_leader else (None, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        info = self.cluster.topic(topic)
        if info is None or partition not in info.partitions:
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if self.log_dir_offline:  # the one check on the request path: nothing serves any more
            return None, ErrorCode.KAFKA_STORAGE_ERROR
        if not open_on_demand:
            return None, ErrorCode.NOT_LEADER_OR_FOLLOWER
        replicas = tuple(info.partitions[partition])
        st = _state(info, partition)
        if st.leader != self.node_id or self.node_id not in replicas or not self.hosts_topic(topic):
            return None, ErrorCode.NOT_LEADER_OR_FOLLOWER
        try:
            p = self._open(info, partition)
        except OSError as exc:
            log.exception("cannot open %s-%d", topic, partition)
            self.fail_log_dir(exc)
            return None, ErrorCode.KAFKA_STORAGE_ERROR
        self._apply_state(p, replicas, st)
        return p, ErrorCode.NONE

    def serves(self, p: Partition) -> bool:
        """Whether `p` is still the replica serving its partition here (not closed,
        replaced, or stopped by a log-directory failure)."""
        return self.serving.get((p.topic, p.partition)) is p

    async def confirmed(self, p: Partition, deadline: float, hw_gated: bool = False) -> bool:
        """Whether leader `p` may append or acknowledge: its lease is valid, or the
        lease keeper confirms it before `deadline` (monotonic s). `hw_gated` (an
        acks=all write or a marker): also once the ISR vouches (`isr_vouches`), at once
        or while it waits -- before the append (`leader_for_write`) and at the
        acknowledgement, so that a write appended under its lease and acknowledged after
        the connection was found SUSPENDED is answered as the writes after it are, not
        NOT_LEADER_OR_FOLLOWER at its deadline after them (an idempotent producer would
        send it again as a duplicate older than the leader's last 5 batches)."""
        if self.may_go_on(p, hw_gated):
            return True
        return await self.leases.ensure(p, deadline,
                                        vouched=(lambda leader=p: self.isr_vouches(leader, True)) if hw_gated else None)

    def may_go_on(self, p: Partition, hw_gated: bool = False) -> bool:
        """Whether leader `p` may append or acknowledge now, without waiting: no leases
        are kept, its lease is valid, or (`hw_gated`) the ISR vouches (`isr_vouches`)."""
        return self.leases is None or self.lease_valid(p) or self.isr_vouches(p, hw_gated)

    def isr_vouches(self, p: Partition, hw_gated: bool) -> bool:
        """Whether leader `p` may go on without a lease: ZooKeeper is unreachable (the
        connection SUSPENDED) and the write waits for the high watermark with the ISR
        at `min.insync.replicas` or more. Such a write is acknowledged only once every
        ISR member has it, and every leader the controller can elect comes from the
        ISR, so no leader change can lose it (Kafka's acks=all guarantee); no
        election can happen while ZooKeeper is down for all (docs/design.md,
        "ZooKeeper faults")."""
        return hw_gated and self.zookeeper_suspended and p.is_leader and p.enough_replicas()

    async def leader_for_write(self, topic: str, partition: int, deadline: float,
                               confirm: bool, hw_gated: bool = False) -> tuple[Partition | None, ErrorCode]:
        """`get()`, first confirming leadership (when `confirm` and the lease is not
        valid) so that a deposed or paused leader appends nothing; `hw_gated` (an
        acks=all write or a marker) skips the confirmation while ZooKeeper is
        unreachable (`isr_vouches`), also when the connection is found SUSPENDED
        while the write waits for its lease. deadline: monotonic s. Errors: those of `get`,
        NOT_LEADER_OR_FOLLOWER when leadership is not confirmed by `deadline`."""
        p, err = self.get(topic, partition)
        if p is not None and confirm and not self.may_go_on(p, hw_gated):
            if not await self.confirmed(p, deadline, hw_gated):
                return None, ErrorCode.NOT_LEADER_OR_FOLLOWER
            p, err = self.get(topic, partition)
        return p, err

    # ------------------------------------------------------------ ISR and leases
    def desired_isr(self, tp: TopicPartition, now_ms: int | None = None) -> tuple[str, ...] | None:
        """The ISR the leader of `tp` should store: without followers lagging more than
        `replica.lag.time.max.ms`, with live followers that caught up; None when it is the
        current one (or `tp` is not led here). now_ms: monotonic."""
        p = self.serving.get(tp)
        if p is None or not p.is_leader:
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
        return [tp for tp, p in self.serving.items() if p.is_leader and self.desired_isr(tp, now_ms) is not None]

    def lease_valid(self, p: Partition) -> bool:
        """Whether leader `p` may acknowledge writes now (see the module docstring)."""
        return p.is_leader and p.lease_until > self.monotonic_s() and self.serves(p)

    def invalidate_leases(self) -> None:
        """ZooKeeper connection suspended or session lost: no leader acknowledges
        anything until its leadership is confirmed again. The writes waiting for a
        leader's high watermark wake, so that their wait is bounded from now
        (ProducePipeline._await_high_watermark)."""
        if self.lease_ms is None:
            return
        for p in self.replicas.values():
            p.lease_until = 0.0
            if p.is_leader:
                self.purgatory.notify((p.topic, p.partition))

    # ------------------------------------------------------------ periodic work
    def maybe_snapshot_all(self, now_ms: int | None = None) -> int:
        """Periodic producer-state snapshots of the serving replicas; returns how many
        were written. (The high-watermark checkpoints: `high_watermarks_to_checkpoint`.)"""
        return sum(p.maybe_snapshot(now_ms) for p in list(self.serving.values()))

    def high_watermarks_to_checkpoint(self) -> list[tuple[Partition, int]]:
        """(replica, high watermark) of every serving replica whose high watermark moved
        since its last checkpoint, read now (for `Partition.checkpoint_high_watermark(hw)`
        in a worker thread)."""
        return [(p, hw) for p in list(self.serving.values()) if (hw := p.high_watermark_unchecked) is not None]

    def expire_producers(self, now_ms: int | None = None) -> int:
        """PID expiration on every serving replica; returns how many PIDs were dropped."""
        return sum(len(p.expire_producers(now_ms)) for p in list(self.serving.values()))

    def close(self) -> None:
        """Close every serving replica (flush, final snapshot). Clean shutdown. With the
        log directory offline nothing is written: the next start recovers the logs."""
        for tp in list(self.serving):
            self.close_partition(tp)
