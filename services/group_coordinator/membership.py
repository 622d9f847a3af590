"""Consumer group membership of one owned `CONSUMER_OFFSETS_TOPIC` partition: the
JoinGroup / SyncGroup / Heartbeat / LeaveGroup requests and the rebalance timing
(session expiry, rebalance completion, storing each new generation) over the
pure state machine of group.py (docs/design.md, "Consumer groups and offsets",
"Membership").

`GroupMembership` owns the JoinGroups waiting for their rebalance, the "stored"
event of each group's latest generation record, and the wake-up of the timer
task; it writes group metadata records through a `GroupLog` (offsets_log.OffsetsLog
in the coordinator). Time comes from the injected monotonic `clock`; waits have a
deadline through the injected `wait_for`.

Seeds: Kafka's GroupCoordinator (handleJoinGroup, handleSyncGroup,
handleHeartbeat, handleLeaveGroup, onCompleteJoin) and KIP-345 (static membership).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import KW_ONLY, dataclass, field
from typing import Callable, Coroutine, Iterable, Mapping, Protocol

from exactly_wire.clock import Clock
from exactly_wire.error_codes import ErrorCode
from services.common.settings import GroupCoordinatorSchema

from . import log_format, metrics
from .group import (Assignment, CompletedRebalance, GroupMetadata, GroupState, JoinResponse,
                    default_member_id)
from .offsets_log import GROUP_APPEND_ERRORS, WaitFor

log = logging.getLogger(__name__)


class GroupLog(Protocol):
    """What membership needs of the partition's log (offsets_log.OffsetsLog)."""

    @property
    def writer(self) -> tuple[int, int]: ...

    def store_lock(self, group_id: str) -> asyncio.Lock: ...

    async def append(self, batch: bytes, transactional_id: str = "", consumer_group_id: str = "") -> ErrorCode: ...


@dataclass(eq=False)
class GroupMembership:
    """Membership of the groups of one owned `CONSUMER_OFFSETS_TOPIC` partition.

    groups: group id -> GroupMetadata (the partition state's dict, shared with the
    tailer that rebuilds groups while loading); log: GroupLog; config: the
    parsed settings (services.common.settings.GroupCoordinatorSchema): the group.*
    limits, and offsets.commit.timeout.ms, how long a SyncGroup or a group deletion
    waits for a generation record being stored;
    partition_counts() -> {topic: partitions} for the range assignment; clock:
    monotonic ms (sessions, rebalance timeouts); wall_clock: wall-clock ms (record
    timestamps); new_member_id(client_id) -> member id; spawn(coro, name) runs a
    background task (the store of a generation); wake() wakes the timer task so it
    calls `tick` soon; wait_for: asyncio.wait_for's shape (injected in tests).
    """

    groups: dict[str, GroupMetadata]
    log: GroupLog
    _: KW_ONLY
    partition_counts: Callable[[], Mapping[str, int]]
    clock: Clock
    wall_clock: Clock
    config: GroupCoordinatorSchema = field(default_factory=GroupCoordinatorSchema)
    new_member_id: Callable[[str], str] = default_member_id
    spawn: Callable[[Coroutine, str], object] = lambda coro, name: asyncio.get_running_loop().create_task(
        coro, name=name)
    wake: Callable[[], None] = lambda: None
    wait_for: WaitFor = asyncio.wait_for

    def __post_init__(self) -> None:
        # group id -> member id -> future of a JoinGroup waiting for the rebalance
        self.join_waiters: dict[str, dict[str, asyncio.Future]] = {}
        # group id -> set once the group metadata record of the latest rebalance is stored
        self.stored: dict[str, asyncio.Event] = {}

    # ------------------------------------------------------------ lifecycle

    def close(self, now_ms: int) -> None:
        """The partition is no longer ours: its groups are dead, waiting JoinGroups
        get NOT_COORDINATOR, waits for a stored generation end."""
        for group in self.groups.values():
            group.mark_dead(now_ms)
        for waiters in self.join_waiters.values():
            for member_id, fut in waiters.items():
                if not fut.done():
                    fut.set_result(JoinResponse(ErrorCode.NOT_COORDINATOR, member_id))
        self.join_waiters.clear()
        for ev in self.stored.values():
            ev.set()

    async def wait_stored(self, group_id: str) -> bool:
        """Wait at most offsets.commit.timeout.ms until the record of `group_id`'s latest
        completed rebalance is stored (at once when none is being stored); False
        on timeout."""
        stored = self.stored.get(group_id)
        if stored is None:
            return True
        try:
            await self.wait_for(stored.wait(), self.config.offsets_commit_timeout_ms / 1000)
        except asyncio.TimeoutError:
            return False
        return True

    # ------------------------------------------------------------ timers and rebalances

    def tick(self, counts: Mapping[str, int] | None = None) -> None:
        """Expire sessions, notice partition count changes of subscribed topics
        (`counts`: {topic: partitions}, partition_counts() when None) and complete
        rebalances whose members rejoined or whose time is up."""
        now = self.clock()
        counts = counts if counts is not None else self.partition_counts()
        for group in list(self.groups.values()):
            for member_id in group.expire_members(now):
                log.info("group %s: member %s session expired", group.group_id, member_id)
                self._answer_removed(group.group_id, member_id)
            if group.is_(GroupState.STABLE) and group.partition_counts_changed(counts):
                log.info("group %s: subscribed topics changed partitions; rebalancing", group.group_id)
                group.prepare_rebalance(now)
            self._try_complete(group, counts)

    def _answer_removed(self, group_id: str, member_id: str) -> None:
        fut = self.join_waiters.get(group_id, {}).pop(member_id, None)
        if fut is not None and not fut.done():
            fut.set_result(JoinResponse(ErrorCode.UNKNOWN_MEMBER_ID, member_id))

    def _try_complete(self, group: GroupMetadata, counts: Mapping[str, int] | None = None) -> None:
        if not group.is_(GroupState.PREPARING_REBALANCE):
            return
        completed = group.poll_rebalance(self.clock(),
                                         counts if counts is not None else self.partition_counts())
        if completed is None:
            return
        metrics.REBALANCES.inc()
        log.info("group %s: generation %d with %d members%s", group.group_id, completed.generation,
                 len(completed.snapshot.members),
                 f" (removed {', '.join(completed.removed)})" if completed.removed else "")
        waiters = self.join_waiters.pop(group.group_id, {})
        stored = asyncio.Event()
        self.stored[group.group_id] = stored
        self.spawn(self._store_generation(group, completed, waiters, stored),
                    f"store-{group.group_id}-{completed.generation}")

    async def _store_generation(self, group: GroupMetadata, completed: CompletedRebalance,
                                waiters: dict[str, asyncio.Future], stored: asyncio.Event) -> None:
        """Append the new generation's group metadata record, then answer the
        JoinGroups that waited for it (generation-ordered per group)."""
        try:
            async with self.log.store_lock(group.group_id):
                raw = await self.log.append(log_format.group_batch(completed.snapshot, self.wall_clock(),
                                                                   self.log.writer))
            code = GROUP_APPEND_ERRORS.get(raw, raw)
            if code != ErrorCode.NONE:
                log.warning("group %s: storing generation %d failed: %s", group.group_id,
                            completed.generation, code.name)
            group.store_completed(completed.generation, code, self.clock())
            for member_id, fut in waiters.items():
                if not fut.done():
                    fut.set_result(completed.join_response(member_id) if code == ErrorCode.NONE
                                   else JoinResponse(code, member_id))
        finally:
            stored.set()
            self.wake()

    # ------------------------------------------------------------ membership requests

    async def join(self, group_id: str, member_id: str, topics: Iterable[str], session_timeout_ms: int,
                   rebalance_timeout_ms: int, protocol_type: str = "consumer",
                   group_instance_id: str = "") -> JoinResponse:
        """JoinGroup (see group.GroupMetadata.join) of a group of this partition.
        Waits until the rebalance completes when the member has to (all known
        members rejoined, or the rebalance timeout passed) and the new generation is
        stored. Errors besides the group's: UNKNOWN_MEMBER_ID (member id given for an
        unknown group), NOT_COORDINATOR (the partition was given up meanwhile), and
        append errors of the generation record."""
        now = self.clock()
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return JoinResponse(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
            group = GroupMetadata(group_id, now, self.config, self.new_member_id)
            self.groups[group_id] = group
        outcome = group.join(member_id, topics, session_timeout_ms, rebalance_timeout_ms, now,
                             protocol_type, group_instance_id)
        if outcome.response is not None:
            return outcome.response
        if outcome.replaced:
            fenced = self.join_waiters.get(group_id, {}).pop(outcome.replaced, None)
            if fenced is not None and not fenced.done():
                fenced.set_result(JoinResponse(ErrorCode.FENCED_INSTANCE_ID, outcome.replaced))
        if outcome.store_then_answer:
            return await self._store_static_member(group, group_instance_id, outcome.replaced,
                                                   outcome.member_id)
        waiters = self.join_waiters.setdefault(group_id, {})
        fut = asyncio.get_running_loop().create_future()
        previous = waiters.get(outcome.member_id)
        if previous is not None and not previous.done():
            previous.set_result(JoinResponse(ErrorCode.REBALANCE_IN_PROGRESS, outcome.member_id))
        waiters[outcome.member_id] = fut
        self._try_complete(group)
        try:
            return await fut
        finally:
            if self.join_waiters.get(group_id, {}).get(outcome.member_id) is fut:
                del self.join_waiters[group_id][outcome.member_id]

    async def _store_static_member(self, group: GroupMetadata, group_instance_id: str,
                                   old_member_id: str, new_member_id: str) -> JoinResponse:
        """A restarted static member replaced `old_member_id` in a Stable group
        without a rebalance (KIP-345): persist the group with its new member id
        (same generation, so a coordinator failover keeps the replacement), then
        answer the current generation. A failed append undoes the replacement and
        returns the append error (Kafka's GroupCoordinator does the same)."""
        async with self.log.store_lock(group.group_id):
            raw = await self.log.append(log_format.group_batch(group.snapshot(), self.wall_clock(),
                                                               self.log.writer))
        code = GROUP_APPEND_ERRORS.get(raw, raw)
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

    async def sync(self, group_id: str, generation_id: int, member_id: str,
                   group_instance_id: str = "") -> tuple[ErrorCode, Assignment]:
        """SyncGroup: (error, {topic: [partitions]}) of the member in the current
        generation (group.GroupMetadata.sync). A SyncGroup that arrives while its
        generation is being stored waits for the store (at most offsets.commit.timeout.ms)."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID, {}
        if group.is_(GroupState.COMPLETING_REBALANCE) and generation_id == group.generation:
            await self.wait_stored(group_id)
        return group.sync(member_id, generation_id, self.clock(), group_instance_id)

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str = "") -> ErrorCode:
        """Heartbeat (group.GroupMetadata.heartbeat); REBALANCE_IN_PROGRESS means
        rejoin, FENCED_INSTANCE_ID that a newer instance replaced this static member,
        UNKNOWN_MEMBER_ID for an unknown group."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return group.heartbeat(member_id, generation_id, self.clock(), group_instance_id)

    def leave(self, group_id: str, member_id: str, group_instance_id: str = "") -> ErrorCode:
        """LeaveGroup: remove the member, rebalance the others (FENCED_INSTANCE_ID
        for a replaced static member, UNKNOWN_MEMBER_ID for an unknown group or
        member). member_id "" with a `group_instance_id` names that instance's
        current member (KIP-345 RemoveMembers)."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        member_id = group.leaving_member_id(member_id, group_instance_id)
        code = group.leave(member_id, self.clock(), group_instance_id)
        if code == ErrorCode.NONE:
            self._answer_removed(group_id, member_id)
            self._try_complete(group)
        return code

    def touch(self, group_id: str, member_id: str) -> None:
        """An accepted OffsetCommit of `member_id` counts as a heartbeat."""
        group = self.groups.get(group_id)
        if group is not None and member_id in group.members:
            group.members[member_id].last_heartbeat_ms = self.clock()


__all__ = ["GroupLog", "GroupMembership"]
