"""The group coordinator: owns partitions of __consumer_offsets, materialises
them from the log, and answers the GroupCoordinator RPCs as domain calls.

No gRPC here (the servicer adapts messages); I/O goes through an injected log
client with the shape of services.common.rpc.ClusterClient (`produce`, `fetch`).

State is single-writer and ordered: for each owned partition one tailer task
fetches the partition (read_uncommitted, long poll) from the last applied
offset and applies every batch (state.OffsetsPartitionState). Writes are appended with
`produce` and answered once the tailer has applied them, so an answer never
runs ahead of the log. On election the partition is replayed from offset 0 to
the high watermark before it serves (COORDINATOR_LOAD_IN_PROGRESS meanwhile);
groups of partitions this process does not own get NOT_COORDINATOR.

Seeds: KIP-98 design document, "Consumer Coordinator" (TxnOffsetCommit appends
pending offsets that the COMMIT marker makes visible; startup replays them the
same way); KIP-447 (generation fencing of TxnOffsetCommit, require_stable).
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping, NamedTuple, Protocol

from exactly_wire import records
from exactly_wire.clock import Clock, monotonic_ms, wall_clock_ms
from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from services.common.owned import NotOwner, OwnedPartition, PartitionOwner, code_name
from services.common.settings import GroupCoordinatorSchema, settings_from_lookup
from services.common.verification import Verifier

from . import log_format, metrics
from .group import (Assignment, CompletedRebalance, concurrent_commits, GroupConfig, GroupMetadata, GroupState,
                    JoinResponse, default_member_id, validate_offset_commit)
from .offsets import FetchedOffset, OffsetAndMetadata
from .state import OffsetsPartitionState

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
READ_UNCOMMITTED = 0


class LogClient(Protocol):
    """What the coordinator needs from services.common.rpc.ClusterClient."""

    async def produce(self, topic: str, partition: int, batch: bytes, acks: int = -1,
                      timeout_ms: int = 30000, transactional_id: str = "",
                      consumer_group_id: str = "") -> tuple[int, int]: ...

    async def fetch(self, topic: str, partition: int, offset: int, max_wait_ms: int = 0,
                    isolation_level: int = 0, max_bytes: int = 1 << 20) -> Any: ...


class GroupListing(NamedTuple):
    """One group of ListGroups."""

    group_id: str
    protocol_type: str
    state: str  # Kafka's state name


class MemberDescription(NamedTuple):
    member_id: str
    group_instance_id: str
    subscription: tuple[str, ...]
    assignment: dict[str, tuple[int, ...]]


class GroupDescription(NamedTuple):
    """DescribeGroups answer for one group (state "Dead": unknown group)."""

    group_id: str
    error: ErrorCode
    state: str = GroupState.DEAD.value
    protocol_type: str = ""
    protocol_name: str = ""
    generation: int = -1
    leader: str = ""
    members: tuple[MemberDescription, ...] = ()


@dataclass(frozen=True, slots=True)
class CoordinatorStats:
    """Counts over the owned partitions (for metrics)."""

    groups_by_state: dict[str, int]
    members: int
    pending_txn_offsets: int


_DEFAULTS = GroupCoordinatorSchema()  # the schema's defaults, as attributes


@dataclass(frozen=True, slots=True)
class GroupCoordinatorConfig:
    """Settings (Kafka keys in parentheses; defaults and docs in
    services.common.settings.GroupCoordinatorSchema).

    group: membership limits (group.min.session.timeout.ms,
    group.max.session.timeout.ms, group.initial.rebalance.delay.ms,
    group.max.size). offset_metadata_max_bytes (offset.metadata.max.bytes).
    commit_timeout_ms (offsets.commit.timeout.ms): how long a write waits
    for the append and for the tailer to apply it. load_buffer_size
    (offsets.load.buffer.size, bytes per fetch while loading). tail_max_wait_ms
    (group.coordinator.tail.max.wait.ms): long-poll wait of the tailer's fetches.
    tick_ms (group.coordinator.tick.ms): period of session-expiry and rebalance
    timeout checks.
    """

    group: GroupConfig = field(default_factory=lambda: GroupCoordinatorConfig.group_config(_DEFAULTS))
    offset_metadata_max_bytes: int = _DEFAULTS.offset_metadata_max_bytes
    commit_timeout_ms: int = _DEFAULTS.offsets_commit_timeout_ms
    load_buffer_size: int = _DEFAULTS.offsets_load_buffer_size
    tail_max_wait_ms: int = _DEFAULTS.tail_max_wait_ms
    tick_ms: int = _DEFAULTS.tick_ms

    @staticmethod
    def group_config(s: GroupCoordinatorSchema) -> GroupConfig:
        """The membership limits of the parsed settings `s`."""
        return GroupConfig(min_session_timeout_ms=s.group_min_session_timeout_ms,
                           max_session_timeout_ms=s.group_max_session_timeout_ms,
                           initial_rebalance_delay_ms=s.group_initial_rebalance_delay_ms,
                           max_size=s.group_max_size)

    @classmethod
    def from_settings(cls, s: GroupCoordinatorSchema) -> "GroupCoordinatorConfig":
        """From the process's parsed settings (services.common.settings.GroupCoordinatorSchema)."""
        return cls(group=cls.group_config(s), offset_metadata_max_bytes=s.offset_metadata_max_bytes,
                   commit_timeout_ms=s.offsets_commit_timeout_ms, load_buffer_size=s.offsets_load_buffer_size,
                   tail_max_wait_ms=s.tail_max_wait_ms, tick_ms=s.tick_ms)

    @classmethod
    def from_props(cls, get_int: Callable[[str, int], int]) -> "GroupCoordinatorConfig":
        """`from_settings` of the settings a `get_int(key, default)` lookup gives
        (services.common.settings.settings_from_lookup). Raises ConfigurationError."""
        return cls.from_settings(settings_from_lookup(GroupCoordinatorSchema, get_int))


# Kafka GroupMetadataManager.storeOffsets: append errors as the committer sees them.
_OFFSET_APPEND_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.LEADER_NOT_AVAILABLE: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NETWORK_EXCEPTION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.INVALID_FETCH_SIZE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
}

# Kafka GroupMetadataManager.storeGroup: append errors as joining members see them.
_GROUP_APPEND_ERRORS = {
    **_OFFSET_APPEND_ERRORS,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.REBALANCE_IN_PROGRESS,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.INVALID_FETCH_SIZE: ErrorCode.UNKNOWN_SERVER_ERROR,
}


def _as_code(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


class _OwnedPartition(OwnedPartition):
    """Runtime state of one owned __consumer_offsets partition: its materialised
    state, the waiters of the tailer and of rebalances, the writes in flight."""

    def __init__(self, partition: int, coordinator_epoch: int, state: OffsetsPartitionState,
                 producer_id: int = -1, producer_epoch: int = -1, retired_producer_id: int = -1):
        super().__init__(partition, coordinator_epoch, producer_id, producer_epoch, retired_producer_id)
        self.state = state
        self.kick = asyncio.Event()
        self._seq = itertools.count()
        self._applied_waiters: list[tuple[int, int, asyncio.Future]] = []
        # group id -> member id -> future of a JoinGroup waiting for the rebalance
        self.join_waiters: dict[str, dict[str, asyncio.Future]] = {}
        # group id -> set once the group metadata record of the latest rebalance is stored
        self.stored: dict[str, asyncio.Event] = {}
        self.store_locks: dict[str, asyncio.Lock] = {}
        # (group, partition) -> offset commit writes in flight (require_stable sees them)
        self.inflight: Counter[tuple[str, TopicPartition]] = Counter()
        # group id -> partition -> (transactional.id, generation) of the last
        # transactional offset commit (KIP-447 draft compatibility fencing; in memory:
        # after a failover the generation and assignment checks still hold).
        self.committers: dict[str, dict[TopicPartition, tuple[str, int]]] = {}

    @property
    def writer(self) -> tuple[int, int]:
        """(producer id, producer epoch) of our plain batches (log_format.NO_WRITER: none)."""
        return (self.producer_id, self.producer_epoch) if self.producer_id >= 0 else log_format.NO_WRITER

    def wait_applied(self, last_offset: int) -> asyncio.Future:
        """Future resolved True once the tailer applied `last_offset`, False if the
        partition is resigned first."""
        fut = asyncio.get_running_loop().create_future()
        if self.closed:
            fut.set_result(False)
        elif self.state.next_offset > last_offset:
            fut.set_result(True)
        else:
            heapq.heappush(self._applied_waiters, (last_offset, next(self._seq), fut))
        return fut

    def notify_applied(self) -> None:
        while self._applied_waiters and self._applied_waiters[0][0] < self.state.next_offset:
            _, _, fut = heapq.heappop(self._applied_waiters)
            if not fut.done():
                fut.set_result(True)

    def close(self) -> None:
        """Stop the partition: pending `wait_applied` futures resolve False."""
        super().close()
        for _, _, fut in self._applied_waiters:
            if not fut.done():
                fut.set_result(False)
        self._applied_waiters.clear()


class GroupCoordinator(PartitionOwner[_OwnedPartition]):
    """Consumer groups and offsets of the owned __consumer_offsets partitions.

    client: LogClient; partition_for(group_id) -> partition of __consumer_offsets
    (-1 when the topic does not exist yet); partition_counts() -> {topic:
    number of partitions} for the range assignment; clock: monotonic ms
    (sessions, rebalance timeouts); wall_clock: wall-clock ms (commit and fence
    timestamps); new_member_id(client_id) -> member id. Call `start()` on the event
    loop, then `on_elected` / `on_resigned` from CoordinatorOwnership.
    on_fenced(partition, coordinator_epoch) is called on the loop when a newer owner
    of the partition exists (services.common.owned.PartitionOwner,
    CoordinatorOwnership.fenced); sleep: async (seconds) -> None, backoff of retries.
    """

    topic = OFFSETS_TOPIC

    def __init__(self, client: LogClient, partition_for: Callable[[str], int],
                 partition_counts: Callable[[], Mapping[str, int]],
                 config: GroupCoordinatorConfig | None = None,
                 clock: Clock = monotonic_ms,
                 wall_clock: Clock = wall_clock_ms,
                 new_member_id: Callable[[str], str] = default_member_id,
                 on_fenced: Callable[[int, int], None] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        super().__init__(clock, wall_clock, sleep=sleep, on_fenced=on_fenced)
        self.client = client
        # Transaction verification of TxnOffsetCommit (KIP-890 part 1, see
        # services.common.verification); None: not verified (tests, tools).
        self.verifier: Verifier | None = None
        self.partition_for = partition_for
        self.partition_counts = partition_counts
        self.config = config or GroupCoordinatorConfig()
        self.new_member_id = new_member_id
        self._wake = asyncio.Event()
        self._ticker: asyncio.Task | None = None
        metrics.GROUPS.track(self)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the timer task (session expiry, rebalance completion)."""
        if self._ticker is None:
            self._ticker = self._spawn(None, self._tick_loop(), "group-coordinator-ticker")

    async def stop(self) -> None:
        """Resign every partition and stop background tasks."""
        await super().stop()
        self._ticker = None

    def _new_partition(self, partition: int, coordinator_epoch: int, producer_id: int, producer_epoch: int,
                       retired_producer_id: int) -> _OwnedPartition:
        return _OwnedPartition(partition, coordinator_epoch,
                               OffsetsPartitionState(partition, self.config.group, self.new_member_id),
                               producer_id, producer_epoch, retired_producer_id)

    def _dropped(self, owned: _OwnedPartition) -> None:
        """The partition is no longer ours: its groups are dead, waiting JoinGroups
        get NOT_COORDINATOR."""
        now = self._clock()
        for group in owned.state.groups.values():
            group.mark_dead(now)
        for waiters in owned.join_waiters.values():
            for member_id, fut in waiters.items():
                if not fut.done():
                    fut.set_result(JoinResponse(ErrorCode.NOT_COORDINATOR, member_id))
        owned.join_waiters.clear()
        for ev in owned.stored.values():
            ev.set()

    # ------------------------------------------------------------ the log

    async def _load(self, owned: _OwnedPartition) -> None:
        """Fence the previous owner, replay the partition from offset 0 to the high
        watermark, mark it loaded, then keep applying new batches (long poll)."""
        p = owned.partition
        started = time.monotonic()
        try:
            await self._fence_previous_owner(owned)
        except NotOwner:
            return
        while True:
            resp = await self._fetch(owned, max_wait_ms=0)
            if not self._handle_fetch(owned, resp, loading=True):
                await self._sleep(0.1)
                continue
            if owned.state.next_offset >= resp.high_watermark:
                break
            if not resp.records:
                await self._sleep(0.01)
        owned.finish_loading()
        log.info("loaded %s-%d (coordinator epoch %d): %d groups, up to offset %d in %.3f s",
                 OFFSETS_TOPIC, p, owned.coordinator_epoch, len(owned.state.groups),
                 owned.state.next_offset, time.monotonic() - started)
        self._wake.set()
        while True:
            owned.kick.clear()
            fetch = asyncio.ensure_future(self._fetch(owned, self.config.tail_max_wait_ms))
            kicked = asyncio.ensure_future(owned.kick.wait())
            try:
                done, _ = await asyncio.wait({fetch, kicked}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                fetch.cancel()
                raise
            finally:
                kicked.cancel()
            if fetch not in done:
                # A write of ours was appended: fetch again now rather than wait
                # for the long poll to notice.
                fetch.cancel()
                await asyncio.gather(fetch, return_exceptions=True)
                continue
            if not self._handle_fetch(owned, fetch.result(), loading=False):
                await self._sleep(0.1)

    async def _append_fence(self, owned: _OwnedPartition, batch: bytes) -> int:
        code, _ = await self.client.produce(OFFSETS_TOPIC, owned.partition, batch, acks=-1,
                                            timeout_ms=self.config.commit_timeout_ms)
        return code

    async def _fetch(self, owned: _OwnedPartition, max_wait_ms: int) -> Any | None:
        try:
            return await self.client.fetch(OFFSETS_TOPIC, owned.partition, owned.state.next_offset,
                                           max_wait_ms=max_wait_ms, isolation_level=READ_UNCOMMITTED,
                                           max_bytes=self.config.load_buffer_size)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - keep tailing; the leader may be restarting
            log.exception("%s-%d: fetch failed", OFFSETS_TOPIC, owned.partition)
            return None

    def _handle_fetch(self, owned: _OwnedPartition, resp: Any | None, loading: bool) -> bool:
        """Apply a fetch response; False when it carried an error (retry later)."""
        if resp is None:
            return False
        code = resp.error_code
        if code == ErrorCode.OFFSET_OUT_OF_RANGE and resp.log_start_offset > owned.state.next_offset:
            log.warning("%s-%d: offset %d below the log start %d; continuing from there",
                        OFFSETS_TOPIC, owned.partition, owned.state.next_offset, resp.log_start_offset)
            owned.state.next_offset = resp.log_start_offset
            return True
        if code != ErrorCode.NONE:
            log.debug("%s-%d: fetch error %s", OFFSETS_TOPIC, owned.partition, code_name(code))
            return False
        if resp.records:
            owned.state.apply_all(resp.records, self._clock(), loading)
            owned.notify_applied()
        return True

    async def _append(self, owned: _OwnedPartition, batch: bytes, transactional_id: str = "",
                      consumer_group_id: str = "") -> ErrorCode:
        """Append `batch` to the owned partition and wait until the tailer applied
        it (a transactional batch names its producer's transactional.id, and group
        for a group-aware producer, for the leader's verification). Returns the
        partition leader's error code, NOT_COORDINATOR if the partition was resigned
        meanwhile, REQUEST_TIMED_OUT after commit_timeout_ms."""
        if not self._owns(owned):
            return ErrorCode.NOT_COORDINATOR
        code, base_offset = await self.client.produce(OFFSETS_TOPIC, owned.partition, batch, acks=-1,
                                                      timeout_ms=self.config.commit_timeout_ms,
                                                      transactional_id=transactional_id,
                                                      consumer_group_id=consumer_group_id)
        if code != ErrorCode.NONE:
            if records.parse_header(batch).producer_id == owned.producer_id and self._is_fenced(owned, code):
                return ErrorCode.NOT_COORDINATOR
            return _as_code(code)
        last_offset = base_offset + records.parse_header(batch).last_offset_delta
        owned.kick.set()
        try:
            applied = await asyncio.wait_for(owned.wait_applied(last_offset),
                                             self.config.commit_timeout_ms / 1000)
        except asyncio.TimeoutError:
            return ErrorCode.NOT_COORDINATOR if owned.closed else ErrorCode.REQUEST_TIMED_OUT
        return ErrorCode.NONE if applied else ErrorCode.NOT_COORDINATOR

    def _owner_of(self, group_id: str) -> tuple[ErrorCode, _OwnedPartition | None]:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID, None
        partition = self.partition_for(group_id)
        if partition < 0:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, None
        owned = self._parts.get(partition)
        if owned is None or owned.closed:
            return ErrorCode.NOT_COORDINATOR, None
        if owned.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, None
        return ErrorCode.NONE, owned

    # ------------------------------------------------------------ timers and rebalances

    async def _tick_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.config.tick_ms / 1000)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a bug in one group must not stop all timers
                log.exception("group coordinator tick failed")

    def tick(self) -> None:
        """Expire sessions, notice partition count changes of subscribed topics
        and complete rebalances whose members rejoined or whose time is up."""
        now = self._clock()
        counts = self.partition_counts()
        for owned in list(self._parts.values()):
            if owned.loading or owned.closed:
                continue
            for group in list(owned.state.groups.values()):
                for member_id in group.expire_members(now):
                    log.info("group %s: member %s session expired", group.group_id, member_id)
                    self._answer_removed(owned, group.group_id, member_id)
                if group.is_(GroupState.STABLE) and group.partition_counts_changed(counts):
                    log.info("group %s: subscribed topics changed partitions; rebalancing", group.group_id)
                    group.prepare_rebalance(now)
                self._try_complete(owned, group, counts)

    def _answer_removed(self, owned: _OwnedPartition, group_id: str, member_id: str) -> None:
        fut = owned.join_waiters.get(group_id, {}).pop(member_id, None)
        if fut is not None and not fut.done():
            fut.set_result(JoinResponse(ErrorCode.UNKNOWN_MEMBER_ID, member_id))

    def _try_complete(self, owned: _OwnedPartition, group: GroupMetadata,
                      counts: Mapping[str, int] | None = None) -> None:
        if not group.is_(GroupState.PREPARING_REBALANCE):
            return
        completed = group.poll_rebalance(self._clock(),
                                         counts if counts is not None else self.partition_counts())
        if completed is None:
            return
        metrics.REBALANCES.inc()
        log.info("group %s: generation %d with %d members%s", group.group_id, completed.generation,
                 len(completed.snapshot.members),
                 f" (removed {', '.join(completed.removed)})" if completed.removed else "")
        waiters = owned.join_waiters.pop(group.group_id, {})
        stored = asyncio.Event()
        owned.stored[group.group_id] = stored
        self._spawn(None, self._store_generation(owned, group, completed, waiters, stored),
                    f"store-{group.group_id}-{completed.generation}")

    async def _store_generation(self, owned: _OwnedPartition, group: GroupMetadata,
                                completed: CompletedRebalance, waiters: dict[str, asyncio.Future],
                                stored: asyncio.Event) -> None:
        """Append the new generation's group metadata record, then answer the
        JoinGroups that waited for it (generation-ordered per group)."""
        lock = owned.store_locks.setdefault(group.group_id, asyncio.Lock())
        try:
            async with lock:
                raw = await self._append(owned, log_format.group_batch(completed.snapshot,
                                                                       self._wall_clock(), owned.writer))
            code = _GROUP_APPEND_ERRORS.get(raw, raw)
            if code != ErrorCode.NONE:
                log.warning("group %s: storing generation %d failed: %s", group.group_id,
                            completed.generation, code.name)
            group.store_completed(completed.generation, code, self._clock())
            for member_id, fut in waiters.items():
                if not fut.done():
                    fut.set_result(completed.join_response(member_id) if code == ErrorCode.NONE
                                   else JoinResponse(code, member_id))
        finally:
            stored.set()
            self._wake.set()

    # ------------------------------------------------------------ membership RPCs

    async def join_group(self, group_id: str, member_id: str, topics: Iterable[str],
                         session_timeout_ms: int, rebalance_timeout_ms: int,
                         protocol_type: str = "consumer", group_instance_id: str = "") -> JoinResponse:
        """JoinGroup (see group.GroupMetadata.join). Waits until the rebalance
        completes when the member has to (all known members rejoined, or the
        rebalance timeout passed) and the new generation is stored. Errors besides
        the group's: INVALID_GROUP_ID, NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
        COORDINATOR_NOT_AVAILABLE, UNKNOWN_MEMBER_ID (member id given for an
        unknown group), and append errors of the generation record."""
        code, owned = self._owner_of(group_id)
        if code != ErrorCode.NONE:
            return JoinResponse(code, member_id)
        now = self._clock()
        group = owned.state.groups.get(group_id)
        if group is None:
            if member_id:
                return JoinResponse(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
            group = GroupMetadata(group_id, now, self.config.group, self.new_member_id)
            owned.state.groups[group_id] = group
        outcome = group.join(member_id, topics, session_timeout_ms, rebalance_timeout_ms, now,
                             protocol_type, group_instance_id)
        if outcome.response is not None:
            return outcome.response
        if outcome.replaced:
            fenced = owned.join_waiters.get(group_id, {}).pop(outcome.replaced, None)
            if fenced is not None and not fenced.done():
                fenced.set_result(JoinResponse(ErrorCode.FENCED_INSTANCE_ID, outcome.replaced))
        if outcome.store_then_answer:
            return await self._store_static_member(owned, group, group_instance_id, outcome.replaced,
                                                   outcome.member_id)
        waiters = owned.join_waiters.setdefault(group_id, {})
        fut = asyncio.get_running_loop().create_future()
        previous = waiters.get(outcome.member_id)
        if previous is not None and not previous.done():
            previous.set_result(JoinResponse(ErrorCode.REBALANCE_IN_PROGRESS, outcome.member_id))
        waiters[outcome.member_id] = fut
        self._try_complete(owned, group)
        try:
            return await fut
        finally:
            if owned.join_waiters.get(group_id, {}).get(outcome.member_id) is fut:
                del owned.join_waiters[group_id][outcome.member_id]

    async def _store_static_member(self, owned: _OwnedPartition, group: GroupMetadata, group_instance_id: str,
                                   old_member_id: str, new_member_id: str) -> JoinResponse:
        """A restarted static member replaced `old_member_id` in a Stable group
        without a rebalance (KIP-345): persist the group with its new member id
        (same generation, so a coordinator failover keeps the replacement), then
        answer the current generation. A failed append undoes the replacement and
        returns the append error (Kafka's GroupCoordinator does the same)."""
        lock = owned.store_locks.setdefault(group.group_id, asyncio.Lock())
        async with lock:
            raw = await self._append(owned, log_format.group_batch(group.snapshot(), self._wall_clock(),
                                                                   owned.writer))
        code = _GROUP_APPEND_ERRORS.get(raw, raw)
        if code != ErrorCode.NONE:
            log.warning("group %s: storing static member %s failed: %s", group.group_id, group_instance_id,
                        code.name)
            if group.static_members.get(group_instance_id) == new_member_id and new_member_id in group.members:
                group.replace_static_member(group_instance_id, new_member_id, old_member_id)
            return JoinResponse(code, new_member_id)
        if new_member_id not in group.members:
            return JoinResponse(ErrorCode.UNKNOWN_MEMBER_ID, new_member_id)
        log.info("group %s: static member %s rejoined as %s in generation %d without a rebalance",
                 group.group_id, group_instance_id, new_member_id, group.generation)
        return group.current_join_response(new_member_id)

    async def sync_group(self, group_id: str, generation_id: int,
                         member_id: str, group_instance_id: str = "") -> tuple[ErrorCode, Assignment]:
        """SyncGroup: (error, {topic: [partitions]}) of the member in the current
        generation (group.GroupMetadata.sync). A SyncGroup that arrives while its
        generation is being stored waits for the store."""
        code, owned = self._owner_of(group_id)
        if code != ErrorCode.NONE:
            return code, {}
        group = owned.state.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID, {}
        if group.is_(GroupState.COMPLETING_REBALANCE) and generation_id == group.generation:
            stored = owned.stored.get(group_id)
            if stored is not None:
                try:
                    await asyncio.wait_for(stored.wait(), self.config.commit_timeout_ms / 1000)
                except asyncio.TimeoutError:
                    pass
        return group.sync(member_id, generation_id, self._clock(), group_instance_id)

    async def heartbeat(self, group_id: str, generation_id: int, member_id: str,
                        group_instance_id: str = "") -> ErrorCode:
        """Heartbeat (group.GroupMetadata.heartbeat); REBALANCE_IN_PROGRESS means
        rejoin, FENCED_INSTANCE_ID that a newer instance replaced this static member."""
        code, owned = self._owner_of(group_id)
        if code != ErrorCode.NONE:
            return code
        group = owned.state.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return group.heartbeat(member_id, generation_id, self._clock(), group_instance_id)

    async def leave_group(self, group_id: str, member_id: str, group_instance_id: str = "") -> ErrorCode:
        """LeaveGroup: remove the member, rebalance the others (FENCED_INSTANCE_ID
        for a replaced static member). member_id "" with a `group_instance_id`
        names that instance's current member (KIP-345 RemoveMembers)."""
        code, owned = self._owner_of(group_id)
        if code != ErrorCode.NONE:
            return code
        group = owned.state.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        member_id = group.leaving_member_id(member_id, group_instance_id)
        code = group.leave(member_id, self._clock(), group_instance_id)
        if code == ErrorCode.NONE:
            self._answer_removed(owned, group_id, member_id)
            self._try_complete(owned, group)
        return code

    # ------------------------------------------------------------ offsets

    async def commit_offsets(self, group_id: str, generation_id: int, member_id: str,
                             offsets: Mapping[TopicPartition, OffsetAndMetadata],
                             group_instance_id: str = "") -> dict[TopicPartition, ErrorCode]:
        """OffsetCommit (generation -1: simple commit; see
        group.validate_offset_commit). Per partition: NONE once the record is
        applied, OFFSET_METADATA_TOO_LARGE, the group check's error, or the
        append error (COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
        INVALID_COMMIT_OFFSET_SIZE, REQUEST_TIMED_OUT, ...)."""
        code, owned = self._owner_of(group_id)
        if code == ErrorCode.NONE:
            group = owned.state.groups.get(group_id)
            code = validate_offset_commit(group, member_id, generation_id, transactional=False,
                                          group_instance_id=group_instance_id)
            if code == ErrorCode.NONE and group is not None and member_id in group.members:
                group.members[member_id].last_heartbeat_ms = self._clock()
        if code != ErrorCode.NONE:
            return {TopicPartition(*tp): code for tp in offsets}
        return await self._write_offsets(owned, group_id, offsets)

    async def txn_commit_offsets(self, transactional_id: str, group_id: str, producer_id: int,
                                 producer_epoch: int, generation_id: int, member_id: str,
                                 offsets: Mapping[TopicPartition, OffsetAndMetadata],
                                 group_instance_id: str = "", group_aware_producer: bool = False
                                 ) -> dict[TopicPartition, ErrorCode]:
        """TxnOffsetCommit: append the offsets in a transactional batch of
        (producer_id, producer_epoch); they stay pending until that PID's COMMIT
        marker (ABORT discards them). KIP-447 fencing: ILLEGAL_GENERATION for a
        generation other than -1 that is not the group's, UNKNOWN_MEMBER_ID for
        an unknown member id. The partition leader checks the producer epoch
        (INVALID_PRODUCER_EPOCH / PRODUCER_FENCED come back per partition).
        INVALID_PRODUCER_ID_MAPPING when producer_id < 0. With a verifier, the
        transaction coordinator must first confirm that the group's
        `__consumer_offsets` partition is in the producer's ongoing transaction
        (AddOffsetsToTxn put it there; KIP-890 part 1): otherwise INVALID_TXN_STATE
        (INVALID_PRODUCER_EPOCH for another epoch) and nothing is written, so no
        phantom pending offset can block require_stable or be committed by a later
        marker; group_aware_producer: the producer's transaction lives with the
        transaction coordinator of `group_id` (KIP-447 draft), which is asked then.
        CONCURRENT_PRODUCER_COMMIT (KIP-447 draft) for each partition another producer
        owns (group.concurrent_commits); the other partitions are still written."""
        code, owned = self._owner_of(group_id)
        if code == ErrorCode.NONE:
            code = validate_offset_commit(owned.state.groups.get(group_id), member_id, generation_id,
                                          transactional=True, group_instance_id=group_instance_id)
        if code == ErrorCode.NONE and producer_id < 0:
            code = ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if code == ErrorCode.NONE and self.verifier is not None:
            if not transactional_id:
                code = ErrorCode.INVALID_TXN_STATE
            else:
                code = await self.verifier.verify(transactional_id, producer_id, producer_epoch, OFFSETS_TOPIC,
                                                  owned.partition,
                                                  time.monotonic() + self.config.commit_timeout_ms / 1000,
                                                  group_id if group_aware_producer else "")
        if code != ErrorCode.NONE:
            return {TopicPartition(*tp): code for tp in offsets}
        committers = owned.committers.setdefault(group_id, {})
        refused = concurrent_commits(owned.state.groups.get(group_id), member_id, generation_id, transactional_id,
                                     offsets, committers)
        results = {tp: ErrorCode.CONCURRENT_PRODUCER_COMMIT for tp in refused}
        allowed = {TopicPartition(*tp): om for tp, om in offsets.items() if TopicPartition(*tp) not in refused}
        if refused:
            log.info("TxnOffsetCommit of %r for group %r (generation %d): %s owned by another producer; "
                     "CONCURRENT_PRODUCER_COMMIT", transactional_id, group_id, generation_id, sorted(refused))
        if allowed:
            written = await self._write_offsets(owned, group_id, allowed, producer_id, producer_epoch,
                                                transactional_id, group_id if group_aware_producer else "")
            for tp, c in written.items():
                if c == ErrorCode.NONE:
                    committers[tp] = (transactional_id, generation_id)
            results.update(written)
        return results

    async def _write_offsets(self, owned: _OwnedPartition, group_id: str,
                             offsets: Mapping[TopicPartition, OffsetAndMetadata],
                             producer_id: int = records.NO_PRODUCER_ID,
                             producer_epoch: int = records.NO_PRODUCER_EPOCH, transactional_id: str = "",
                             consumer_group_id: str = "") -> dict[TopicPartition, ErrorCode]:
        results: dict[TopicPartition, ErrorCode] = {}
        valid: dict[TopicPartition, OffsetAndMetadata] = {}
        now = self._wall_clock()
        for tp, value in offsets.items():
            tp = TopicPartition(*tp)
            if len(value.metadata.encode()) > self.config.offset_metadata_max_bytes:
                results[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                valid[tp] = OffsetAndMetadata(value.offset, value.metadata, value.leader_epoch, now)
        if not valid:
            return results
        batch = log_format.offsets_batch(group_id, valid, now, producer_id, producer_epoch, owned.writer)
        keys = [(group_id, tp) for tp in valid]
        owned.inflight.update(keys)
        try:
            raw = await self._append(owned, batch, transactional_id, consumer_group_id)
        finally:
            owned.inflight.subtract(keys)
            for k in keys:
                if owned.inflight[k] <= 0:
                    del owned.inflight[k]
        code = _OFFSET_APPEND_ERRORS.get(raw, raw)
        for tp in valid:
            results[tp] = code
        return results

    async def fetch_offsets(self, group_id: str, partitions: Iterable[TopicPartition] | None,
                            require_stable: bool) -> tuple[ErrorCode, dict[TopicPartition, FetchedOffset]]:
        """OffsetFetch: (top-level error, {partition: FetchedOffset}). partitions
        None: all committed. With require_stable, partitions with a pending
        transactional offset (or an offset write in flight) answer offset -1 and
        UNSTABLE_OFFSET_COMMIT, and the top-level error is UNSTABLE_OFFSET_COMMIT
        too when any partition is unstable (the whole fetch is retriable, as
        Kafka's consumer treats it). Top-level errors: INVALID_GROUP_ID,
        NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE."""
        code, owned = self._owner_of(group_id)
        if code != ErrorCode.NONE:
            return code, {}
        parts = None if partitions is None else [TopicPartition(*tp) for tp in partitions]
        result = owned.state.offsets.fetch(group_id, parts, require_stable)
        top = ErrorCode.NONE
        if require_stable:
            for tp in result:
                if owned.inflight.get((group_id, tp), 0) > 0:
                    result[tp] = FetchedOffset(-1, "", ErrorCode.UNSTABLE_OFFSET_COMMIT)
            if any(f.error == ErrorCode.UNSTABLE_OFFSET_COMMIT for f in result.values()):
                top = ErrorCode.UNSTABLE_OFFSET_COMMIT
        return top, result

    # ------------------------------------------------------------ administration

    def _owned_groups(self, owned: _OwnedPartition) -> dict[str, tuple[str, str]]:
        """group id -> (state name, protocol type) of one owned partition; a group
        with committed offsets but no membership (assign() users) is Empty."""
        out = {gid: (g.state.value, g.protocol_type) for gid, g in owned.state.groups.items()
               if g.state is not GroupState.DEAD}
        for gid in owned.state.offsets.groups():
            out.setdefault(gid, (GroupState.EMPTY.value, ""))
        return out

    def list_groups(self, states: Iterable[str] = ()) -> tuple[ErrorCode, list[GroupListing]]:
        """ListGroups over the owned partitions, optionally only groups in `states`
        (Kafka state names: "Empty", "Stable", ...). COORDINATOR_LOAD_IN_PROGRESS
        while a partition loads."""
        wanted = {s.lower() for s in states}
        if any(owned.loading for owned in self._parts.values()):
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, []
        out = []
        for owned in list(self._parts.values()):
            if owned.closed:
                continue
            for gid, (state, protocol_type) in self._owned_groups(owned).items():
                if not wanted or state.lower() in wanted:
                    out.append(GroupListing(gid, protocol_type, state))
        return ErrorCode.NONE, sorted(out)

    def describe_group(self, group_id: str) -> GroupDescription:
        """DescribeGroups for one group: its state, generation, protocol and members
        (id, instance id, subscription, assignment). An unknown group is "Dead" with
        error NONE (Kafka's answer); errors: INVALID_GROUP_ID, NOT_COORDINATOR,
        COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE."""
        code, owned = self._owner_of(group_id)
        if code != ErrorCode.NONE:
            return GroupDescription(group_id, code)
        group = owned.state.groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            state = GroupState.EMPTY if group_id in owned.state.offsets.groups() else GroupState.DEAD
            return GroupDescription(group_id, ErrorCode.NONE, state.value)
        members = tuple(MemberDescription(m.member_id, m.group_instance_id, tuple(m.topics),
                                          {t: tuple(ps) for t, ps in sorted(m.assignment.items())})
                        for m in sorted(group.members.values(), key=lambda m: m.member_id))
        return GroupDescription(group_id, ErrorCode.NONE, group.state.value, group.protocol_type,
                                group.protocol_name, group.generation, group.leader, members)

    async def delete_groups(self, group_ids: Iterable[str]) -> dict[str, ErrorCode]:
        """DeleteGroups (Kafka's GroupCoordinator.handleDeleteGroups): a group with no
        members gets tombstones for its committed offsets and its metadata in one
        batch and is forgotten. Per group: NONE, GROUP_ID_NOT_FOUND (no membership and
        no offsets), NON_EMPTY_GROUP (members left), INVALID_GROUP_ID,
        NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, or the append's error.
        Pending transactional offsets stay until their marker."""
        out: dict[str, ErrorCode] = {}
        for group_id in group_ids:
            out[group_id] = await self._delete_group(group_id)
        return out

    async def _delete_group(self, group_id: str) -> ErrorCode:
        code, owned = self._owner_of(group_id)
        if code != ErrorCode.NONE:
            return code
        stored = owned.stored.get(group_id)
        if stored is not None:
            # A completed rebalance (e.g. the last member left) is still being stored:
            # its record must not land after the tombstones.
            try:
                await asyncio.wait_for(stored.wait(), self.config.commit_timeout_ms / 1000)
            except asyncio.TimeoutError:
                return ErrorCode.REBALANCE_IN_PROGRESS
        lock = owned.store_locks.setdefault(group_id, asyncio.Lock())
        async with lock:
            group = owned.state.groups.get(group_id)
            if group is not None and group.state is GroupState.DEAD:
                group = None
            partitions = owned.state.offsets.committed_partitions(group_id)
            if group is None and not partitions:
                return ErrorCode.GROUP_ID_NOT_FOUND
            if group is not None and not group.is_(GroupState.EMPTY):
                return ErrorCode.NON_EMPTY_GROUP
            raw = await self._append(owned, log_format.tombstones_batch(group_id, partitions, self._wall_clock(),
                                                                        owned.writer))
            code = _OFFSET_APPEND_ERRORS.get(raw, raw)
            if code != ErrorCode.NONE:
                return code
            current = owned.state.groups.get(group_id)
            if current is group and group is not None and group.is_(GroupState.EMPTY):
                del owned.state.groups[group_id]
                group.mark_dead(self._clock())
            log.info("group %s deleted (%d committed offsets)", group_id, len(partitions))
            return ErrorCode.NONE

    async def delete_offsets(self, group_id: str, partitions: Iterable[TopicPartition]
                             ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """OffsetDelete (KIP-496, Kafka's GroupCoordinator.handleDeleteOffsets): the
        committed offsets of `partitions` get tombstones in one batch. A group with
        members keeps the offsets of the topics they subscribe to (those partitions
        answer GROUP_SUBSCRIBED_TO_TOPIC); a partition without a committed offset
        answers NONE. Returns (group error, {partition: error}); group errors:
        GROUP_ID_NOT_FOUND (no membership and no offsets), INVALID_GROUP_ID,
        NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE."""
        code, owned = self._owner_of(group_id)
        if code != ErrorCode.NONE:
            return code, {}
        lock = owned.store_locks.setdefault(group_id, asyncio.Lock())
        async with lock:
            group = owned.state.groups.get(group_id)
            if group is not None and group.state is GroupState.DEAD:
                group = None
            committed = set(owned.state.offsets.committed_partitions(group_id))
            if group is None and not committed:
                return ErrorCode.GROUP_ID_NOT_FOUND, {}
            subscribed = set() if group is None or group.is_(GroupState.EMPTY) else {
                t for m in group.members.values() for t in m.topics}
            results: dict[TopicPartition, ErrorCode] = {}
            doomed = []
            for tp in map(lambda x: TopicPartition(*x), partitions):
                results[tp] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC if tp.topic in subscribed else ErrorCode.NONE
                if tp.topic not in subscribed and tp in committed:
                    doomed.append(tp)
            if doomed:
                raw = await self._append(owned, log_format.tombstones_batch(group_id, doomed, self._wall_clock(),
                                                                            owned.writer, group_too=False))
                code = _OFFSET_APPEND_ERRORS.get(raw, raw)
                for tp in doomed:
                    results[tp] = code
            log.info("group %s: %d committed offsets deleted", group_id, len(doomed))
            return ErrorCode.NONE, results

    # ------------------------------------------------------------ introspection

    def group(self, group_id: str) -> GroupMetadata | None:
        """The in-memory group (None when unknown or not owned), for tests and tools."""
        partition = self.partition_for(group_id)
        owned = self._parts.get(partition)
        return owned.state.groups.get(group_id) if owned else None

    def stats(self) -> CoordinatorStats:
        by_state: dict[str, int] = {}
        members = pending = 0
        for owned in list(self._parts.values()):
            for group in list(owned.state.groups.values()):
                by_state[group.state.value] = by_state.get(group.state.value, 0) + 1
                members += len(group.members)
            pending += owned.state.offsets.pending_count()
        return CoordinatorStats(by_state, members, pending)

    def partition_state(self, partition: int) -> OffsetsPartitionState | None:
        owned = self._parts.get(partition)
        return owned.state if owned else None
