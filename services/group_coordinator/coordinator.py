"""The group coordinator: owns partitions of `CONSUMER_OFFSETS_TOPIC`, materialises
them from the log, and answers the GroupCoordinator RPCs as domain calls.

No gRPC here (the servicer adapts messages); I/O goes through an injected log
client with the shape of services.common.transport.rpc.ClusterClient (`produce`, `fetch`).

State is single-writer and ordered: for each owned partition one tailer task
fetches the partition (read_uncommitted, long poll) from the last applied
offset and applies every batch (state.OffsetsPartitionState). Writes are appended with
`produce` and answered once the tailer has applied them, so an answer never
runs ahead of the log. On election the partition is replayed from offset 0 to
the high watermark before it serves (COORDINATOR_LOAD_IN_PROGRESS meanwhile);
groups of partitions this process does not own get NOT_COORDINATOR.

Each owned partition has two parts: its log (offsets_log.OffsetsLog: append,
replay and tail, waits until an offset is applied, offset writes) and its
membership (membership.GroupMembership: join / sync / heartbeat / leave and the
rebalance timing). This class keeps the wiring: loading and ownership
(services.common.cluster.owned.PartitionOwner), routing each request to the partition of
its group, the offset requests and the group administration.

Seeds: KIP-98 design document, "Consumer Coordinator" (TxnOffsetCommit appends
pending offsets that the COMMIT marker makes visible; startup replays them the
same way); KIP-447 (generation fencing of TxnOffsetCommit, require_stable).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable, Mapping, NamedTuple

from exactly_wire.clock import Clock, monotonic_ms, wall_clock_ms
from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from services.common.cluster.owned import OwnedPartition, OwnedPartitions
from services.common.settings import GroupCoordinatorSchema
from services.common.cluster.verification import Verifier
from services.common.protocol import CONSUMER_OFFSETS_TOPIC

from . import metrics
from .group import (Assignment, concurrent_commits, GroupMetadata, GroupState, JoinResponse,
                    default_member_id, validate_offset_commit)
from .membership import GroupMembership
from .offsets import FetchedOffset, OffsetAndMetadata
from .offsets_log import LogClient, OffsetsLog
from .state import OffsetsPartitionState

log = logging.getLogger(__name__)


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


class _OwnedPartition(OwnedPartition):
    """One owned `CONSUMER_OFFSETS_TOPIC` partition: its log (OffsetsLog, which holds the
    materialised state) and its membership (GroupMembership)."""

    log: OffsetsLog
    members: GroupMembership

    @property
    def state(self) -> OffsetsPartitionState:
        """The partition's materialised groups and offsets."""
        return self.log.state

    def wait_applied(self, last_offset: int) -> asyncio.Future:
        """Future resolved True once the tailer applied `last_offset`, False if the
        partition is resigned first (OffsetsLog.wait_applied)."""
        return self.log.wait_applied(last_offset)

    def close(self) -> None:
        """Stop the partition: pending `wait_applied` futures resolve False."""
        super().close()
        self.log.close()


class GroupCoordinator:
    """Consumer groups and offsets of the owned `CONSUMER_OFFSETS_TOPIC` partitions.

    client: LogClient; partition_for(group_id) -> partition of `CONSUMER_OFFSETS_TOPIC`
    (-1 when the topic does not exist yet); partition_counts() -> {topic:
    number of partitions} for the range assignment; clock: monotonic ms
    (sessions, rebalance timeouts); wall_clock: wall-clock ms (commit and fence
    timestamps); new_member_id(client_id) -> member id. Call `start()` on the event
    loop, then `on_elected` / `on_resigned` from CoordinatorOwnership.
    on_fenced(partition, coordinator_epoch) is called on the loop when a newer owner
    of the partition exists (CoordinatorOwnership.fenced); sleep: async (seconds) ->
    None, backoff of retries. The owned partitions and their lifecycle are
    `partitions` (services.common.cluster.owned.OwnedPartitions), built here with
    this coordinator's partition state, load and fence append.
    """

    def __init__(self, client: LogClient, partition_for: Callable[[str], int],
                 partition_counts: Callable[[], Mapping[str, int]],
                 config: GroupCoordinatorSchema | None = None,
                 clock: Clock = monotonic_ms,
                 wall_clock: Clock = wall_clock_ms,
                 new_member_id: Callable[[str], str] = default_member_id,
                 on_fenced: Callable[[int, int], None] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self.partitions: OwnedPartitions[_OwnedPartition] = OwnedPartitions(
            CONSUMER_OFFSETS_TOPIC, self._new_partition, self._load, self._append_fence, dropped=self._dropped,
            wall_clock=wall_clock, sleep=sleep, on_fenced=on_fenced)
        self.client = client
        # Transaction verification of TxnOffsetCommit (KIP-890 part 1, see
        # services.common.cluster.verification); None: not verified (tests, tools).
        self.verifier: Verifier | None = None
        self.partition_for = partition_for
        self.partition_counts = partition_counts
        self.config = config or GroupCoordinatorSchema()
        self.new_member_id = new_member_id
        self._wake = asyncio.Event()
        self._ticker: asyncio.Task | None = None
        metrics.GROUPS.track(self)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the timer task (session expiry, rebalance completion)."""
        if self._ticker is None:
            self._ticker = self.partitions.spawn(None, self._tick_loop(), "group-coordinator-ticker")

    async def stop(self) -> None:
        """Resign every partition and stop background tasks."""
        await self.partitions.stop()
        self._ticker = None

    async def on_elected(self, partition: int, coordinator_epoch: int, producer_id: int = -1,
                         producer_epoch: int = -1, retired_producer_id: int = -1) -> None:
        """This process now owns `partition` (CoordinatorOwnership's callback;
        OwnedPartitions.on_elected): fence the previous owner, replay, serve."""
        await self.partitions.on_elected(partition, coordinator_epoch, producer_id, producer_epoch,
                                         retired_producer_id)

    async def on_resigned(self, partition: int) -> None:
        """Another coordinator owns `partition` now (OwnedPartitions.on_resigned)."""
        await self.partitions.on_resigned(partition)

    def owned_partitions(self) -> dict[int, bool]:
        """partition -> True when it serves (OwnedPartitions.owned_partitions)."""
        return self.partitions.owned_partitions()

    async def wait_loaded(self, partition: int | None = None, *, timeout_s: float | None = None) -> bool:
        """OwnedPartitions.wait_loaded (tests and readiness)."""
        return await self.partitions.wait_loaded(partition, timeout_s=timeout_s)

    def _new_partition(self, partition: int, coordinator_epoch: int, producer_id: int, producer_epoch: int,
                       retired_producer_id: int) -> _OwnedPartition:
        owned = _OwnedPartition(partition, coordinator_epoch, producer_id, producer_epoch, retired_producer_id)
        cfg = self.config
        state = OffsetsPartitionState(partition, cfg, self.new_member_id)
        owned.log = OffsetsLog(self.client, state, producer_id=producer_id, producer_epoch=producer_epoch,
                               owns=lambda: self.partitions.owns(owned),
                               fenced=lambda code: self.partitions.is_fenced(owned, code),
                               config=cfg, clock=self._clock, wall_clock=self._wall_clock, sleep=self._sleep)
        owned.members = GroupMembership(state.groups, owned.log, config=cfg,
                                        partition_counts=self.partition_counts, clock=self._clock,
                                        wall_clock=self._wall_clock, new_member_id=self.new_member_id,
                                        spawn=lambda coro, name: self.partitions.spawn(None, coro, name),
                                        wake=self._wake.set)
        return owned

    def _dropped(self, owned: _OwnedPartition) -> None:
        """The partition is no longer ours: its groups are dead, waiting JoinGroups
        get NOT_COORDINATOR."""
        owned.members.close(self._clock())

    # ------------------------------------------------------------ the log

    async def _load(self, owned: _OwnedPartition) -> None:
        """The main task of a newly owned partition, once the previous owner is
        fenced (OwnedPartitions): replay the partition from offset 0 to the high
        watermark, mark it loaded, then keep applying new batches (long poll)."""
        p = owned.partition
        started = time.monotonic()
        await owned.log.replay()
        owned.finish_loading()
        log.info("loaded %s-%d (coordinator epoch %d): %d groups, up to offset %d in %.3f s",
                 CONSUMER_OFFSETS_TOPIC, p, owned.coordinator_epoch, len(owned.state.groups),
                 owned.state.next_offset, time.monotonic() - started)
        self._wake.set()
        await owned.log.tail()

    async def _append_fence(self, owned: _OwnedPartition, batch: bytes) -> int:
        return await owned.log.append_fence(batch)

    def _owner_of(self, group_id: str) -> tuple[ErrorCode, _OwnedPartition | None]:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID, None
        partition = self.partition_for(group_id)
        if partition < 0:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, None
        owned = self.partitions.get(partition)
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
        and complete rebalances whose members rejoined or whose time is up
        (GroupMembership.tick of every serving partition)."""
        counts = self.partition_counts()
        for owned in self.partitions.values():
            if owned.loading or owned.closed:
                continue
            owned.members.tick(counts)

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
        return await owned.members.join(group_id, member_id, topics, session_timeout_ms, rebalance_timeout_ms,
                                        protocol_type, group_instance_id)

    async def sync_group(self, group_id: str, generation_id: int,
                         member_id: str, group_instance_id: str = "") -> tuple[ErrorCode, Assignment]:
        """SyncGroup: (error, {topic: [partitions]}) of the member in the current
        generation (group.GroupMetadata.sync). A SyncGroup that arrives while its
        generation is being stored waits for the store."""
        code, owned = self._owner_of(group_id)
        if code != ErrorCode.NONE:
            return code, {}
        return await owned.members.sync(group_id, generation_id, member_id, group_instance_id)

    async def heartbeat(self, group_id: str, generation_id: int, member_id: str,
                        group_instance_id: str = "") -> ErrorCode:
        """Heartbeat (group.GroupMetadata.heartbeat); REBALANCE_IN_PROGRESS means
        rejoin, FENCED_INSTANCE_ID that a newer instance replaced this static member."""
        code, owned = self._owner_of(group_id)
        if code != ErrorCode.NONE:
            return code
        return owned.members.heartbeat(group_id, generation_id, member_id, group_instance_id)

    async def leave_group(self, group_id: str, member_id: str, group_instance_id: str = "") -> ErrorCode:
        """LeaveGroup: remove the member, rebalance the others (FENCED_INSTANCE_ID
        for a replaced static member). member_id "" with a `group_instance_id`
        names that instance's current member (KIP-345 RemoveMembers)."""
        code, owned = self._owner_of(group_id)
        if code != ErrorCode.NONE:
            return code
        return owned.members.leave(group_id, member_id, group_instance_id)

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
            code = validate_offset_commit(owned.state.groups.get(group_id), member_id, generation_id,
                                          transactional=False, group_instance_id=group_instance_id)
            if code == ErrorCode.NONE:
                owned.members.touch(group_id, member_id)
        if code != ErrorCode.NONE:
            return {TopicPartition(*tp): code for tp in offsets}
        return await owned.log.write_offsets(group_id, offsets)

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
        `CONSUMER_OFFSETS_TOPIC` partition is in the producer's ongoing transaction
        (AddOffsetsToTxn put it there; KIP-890 part 1): otherwise INVALID_TXN_STATE
        (INVALID_PRODUCER_EPOCH for another epoch) and nothing is written, so no
        phantom pending offset can block require_stable or be committed by a later
        marker. That verification is passed to the partition leader with the offset up
        to which this coordinator had applied the partition before asking (Kafka's
        verificationGuards), so the leader does not ask again unless a marker of the
        producer was appended since; group_aware_producer: the producer's transaction lives with the
        transaction coordinator of `group_id` (KIP-447 draft), which is asked then.
        CONCURRENT_PRODUCER_COMMIT (KIP-447 draft) for each partition another producer
        owns in the group's current generation (group.concurrent_commits); the other
        partitions are still written."""
        code, owned = self._owner_of(group_id)
        if code == ErrorCode.NONE:
            code = validate_offset_commit(owned.state.groups.get(group_id), member_id, generation_id,
                                          transactional=True, group_instance_id=group_instance_id)
        if code == ErrorCode.NONE and producer_id < 0:
            code = ErrorCode.INVALID_PRODUCER_ID_MAPPING
        verified_from = None
        if code == ErrorCode.NONE and self.verifier is not None:
            verified_from = owned.state.next_offset  # applied below it; read before asking
            if not transactional_id:
                code = ErrorCode.INVALID_TXN_STATE
            else:
                code = await self.verifier.verify(transactional_id, producer_id, producer_epoch, CONSUMER_OFFSETS_TOPIC,
                                                  owned.partition,
                                                  time.monotonic() + self.config.offsets_commit_timeout_ms / 1000,
                                                  group_id if group_aware_producer else "")
        if code != ErrorCode.NONE:
            return {TopicPartition(*tp): code for tp in offsets}
        committers = owned.log.committers.setdefault(group_id, {})
        refused = concurrent_commits(owned.state.groups.get(group_id), member_id, generation_id, transactional_id,
                                     offsets, committers)
        results = {tp: ErrorCode.CONCURRENT_PRODUCER_COMMIT for tp in refused}
        allowed = {TopicPartition(*tp): om for tp, om in offsets.items() if TopicPartition(*tp) not in refused}
        if refused:
            log.info("TxnOffsetCommit of %r for group %r (generation %d): %s owned by another producer; "
                     "CONCURRENT_PRODUCER_COMMIT", transactional_id, group_id, generation_id, sorted(refused))
        if allowed:
            written = await owned.log.write_offsets(group_id, allowed, producer_id, producer_epoch,
                                                    transactional_id, group_id if group_aware_producer else "",
                                                    verified_from)
            for tp, c in written.items():
                if c == ErrorCode.NONE:
                    committers[tp] = (transactional_id, generation_id)
            results.update(written)
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
                if owned.log.in_flight(group_id, tp):
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
        if any(owned.loading for owned in self.partitions.values()):
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, []
        out = []
        for owned in self.partitions.values():
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
        Pending transactional offsets stay until their marker. A deleted group's last
        transactional committers own nothing any more (KIP-447 draft,
        CONCURRENT_PRODUCER_COMMIT): a group created again under the id starts without."""
        out: dict[str, ErrorCode] = {}
        for group_id in group_ids:
            out[group_id] = await self._delete_group(group_id)
        return out

    async def _delete_group(self, group_id: str) -> ErrorCode:
        code, owned = self._owner_of(group_id)
        if code != ErrorCode.NONE:
            return code
        # A completed rebalance (e.g. the last member left) may still be being
        # stored: its record must not land after the tombstones.
        if not await owned.members.wait_stored(group_id):
            return ErrorCode.REBALANCE_IN_PROGRESS
        async with owned.log.store_lock(group_id):
            group = owned.state.groups.get(group_id)
            if group is not None and group.state is GroupState.DEAD:
                group = None
            partitions = owned.state.offsets.committed_partitions(group_id)
            if group is None and not partitions:
                return ErrorCode.GROUP_ID_NOT_FOUND
            if group is not None and not group.is_(GroupState.EMPTY):
                return ErrorCode.NON_EMPTY_GROUP
            code = await owned.log.append_tombstones(group_id, partitions)
            if code != ErrorCode.NONE:
                return code
            # The deleted group's producers own nothing in a group created again
            # (a TxnOffsetCommit in flight still holds the dict it records into).
            owned.log.committers.pop(group_id, None)
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
        answers NONE; a deleted offset's last transactional committer owns it no more
        (KIP-447 draft). Returns (group error, {partition: error}); group errors:
        GROUP_ID_NOT_FOUND (no membership and no offsets), INVALID_GROUP_ID,
        NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE."""
        code, owned = self._owner_of(group_id)
        if code != ErrorCode.NONE:
            return code, {}
        async with owned.log.store_lock(group_id):
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
                code = await owned.log.append_tombstones(group_id, doomed, group_too=False)
                committers = owned.log.committers.get(group_id, {})
                for tp in doomed:
                    results[tp] = code
                    if code == ErrorCode.NONE:
                        committers.pop(tp, None)
            log.info("group %s: %d committed offsets deleted", group_id, len(doomed))
            return ErrorCode.NONE, results

    # ------------------------------------------------------------ introspection

    def group(self, group_id: str) -> GroupMetadata | None:
        """The in-memory group (None when unknown or not owned), for tests and tools."""
        partition = self.partition_for(group_id)
        owned = self.partitions.get(partition)
        return owned.state.groups.get(group_id) if owned else None

    def stats(self) -> CoordinatorStats:
        by_state: dict[str, int] = {}
        members = pending = 0
        for owned in self.partitions.values():
            for group in list(owned.state.groups.values()):
                by_state[group.state.value] = by_state.get(group.state.value, 0) + 1
                members += len(group.members)
            pending += owned.state.offsets.pending_count()
        return CoordinatorStats(by_state, members, pending)

    def partition_state(self, partition: int) -> OffsetsPartitionState | None:
        owned = self.partitions.get(partition)
        return owned.state if owned else None
