"""Consumer group membership: Kafka's GroupMetadata state machine and the
join / sync / heartbeat / leave handling of its GroupCoordinator, as pure code.

No I/O and no clock of its own: every operation takes `now_ms` (a monotonic
clock in milliseconds, injected by the caller) so tests drive time by hand.
Expected outcomes are ErrorCode values; an illegal state transition is a bug and
raises IllegalGroupTransitionError.

Differences from Apache Kafka, decided for Exactly (docs/design.md, "Transactions" and "Decisions"):
- The coordinator computes the assignment itself (Kafka's RangeAssignor over the
  members' subscribed topics, `range_assign`); there is no client-side leader
  assignment, so SyncGroup carries no assignment from the leader.
- A first JoinGroup with an empty member id gets a generated member id and joins
  at once (no MEMBER_ID_REQUIRED round trip).
- CompletingRebalance lasts while the new generation's group metadata record is
  being appended to `CONSUMER_OFFSETS_TOPIC`; `store_completed()` moves the group to
  Stable (or back to PreparingRebalance when the append failed).

Static membership (KIP-345): a member that joins with a `group_instance_id` is
mapped from that id to its member id. When the same instance id joins again with
no member id (the process restarted) the old member id is replaced by a new one
that inherits the old member's assignment: in a Stable group with an unchanged
subscription there is no rebalance (the generation stays; the coordinator
persists the group with the new member id before answering), otherwise the
group rebalances as Kafka's GroupCoordinator does. A request carrying the
instance id with a member id that is no longer the instance's gets
FENCED_INSTANCE_ID. Static members expire by session timeout like the others.
"""
from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from services.common.settings import GroupCoordinatorSchema

PROTOCOL_TYPE = "consumer"
PROTOCOL_NAME = "range"
UNKNOWN_GENERATION = -1

Assignment = dict[str, list[int]]  # topic -> sorted partitions


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


# Kafka's GroupState.validPreviousStates, checked in one place (`_transition_to`).
VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY}),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.DEAD: frozenset(GroupState),
}


class IllegalGroupTransitionError(RuntimeError):
    """A group state transition not allowed by VALID_PREVIOUS (a bug)."""


@dataclass(slots=True)
class MemberMetadata:
    """One member. Times in ms of the injected monotonic clock."""

    member_id: str
    group_instance_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    topics: tuple[str, ...]
    last_heartbeat_ms: int
    assignment: Assignment = field(default_factory=dict)
    awaiting_join: bool = False


@dataclass(frozen=True, slots=True)
class JoinResponse:
    """The answer to one JoinGroup (fields of JoinGroupResponse)."""

    error: ErrorCode
    member_id: str
    generation_id: int = UNKNOWN_GENERATION
    protocol_name: str = ""
    leader: str = ""
    members: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class JoinOutcome:
    """Result of `GroupMetadata.join`: `response` is None when the member must
    wait for the rebalance to complete (see `poll_rebalance`), or, with
    `store_then_answer`, until the group (a static member replaced without a
    rebalance) is persisted. `replaced`: the member id a static member's new id
    replaced (a JoinGroup it has waiting gets FENCED_INSTANCE_ID), else ""."""

    member_id: str
    response: JoinResponse | None
    replaced: str = ""
    store_then_answer: bool = False


@dataclass(frozen=True, slots=True)
class MemberSnapshot:
    member_id: str
    group_instance_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    topics: tuple[str, ...]
    assignment: tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class GroupSnapshot:
    """What a group metadata record persists: enough to serve the group after a
    coordinator failover, and to keep generations rising across restarts."""

    group_id: str
    protocol_type: str
    generation: int
    protocol_name: str
    leader: str
    members: tuple[MemberSnapshot, ...]
    topic_partition_counts: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class CompletedRebalance:
    """A rebalance that `poll_rebalance` completed: the new generation (state
    CompletingRebalance, or Empty when no member is left), the members removed
    because they did not rejoin in time, and the snapshot to persist."""

    generation: int
    removed: tuple[str, ...]
    snapshot: GroupSnapshot

    def join_response(self, member_id: str) -> JoinResponse:
        """The JoinGroup answer for `member_id` in this generation."""
        members = tuple(m.member_id for m in self.snapshot.members)
        if member_id not in members:
            return JoinResponse(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
        return JoinResponse(ErrorCode.NONE, member_id, self.generation,
                            self.snapshot.protocol_name, self.snapshot.leader, members)


def default_member_id(group_instance_id: str = "") -> str:
    """Kafka-style member id: `<client or instance id>-<uuid4>`."""
    return f"{group_instance_id or 'consumer'}-{uuid.uuid4()}"


def range_assign(subscriptions: Mapping[str, Iterable[str]],
                 partition_counts: Mapping[str, int],
                 instance_ids: Mapping[str, str] | None = None) -> dict[str, Assignment]:
    """Kafka's RangeAssignor. For each topic, its subscribers are sorted (static
    members by group instance id first, then the others by member id) and the
    partitions 0..n-1 are split in contiguous ranges; the first n % c members get
    one partition more.

    subscriptions: member id -> subscribed topics; partition_counts: topic ->
    number of partitions (topics missing or with 0 partitions are skipped).
    Returns member id -> {topic: [partitions]} with every member present and
    topics with no partition for that member left out.
    """
    instance_ids = instance_ids or {}
    per_topic: dict[str, list[str]] = {}
    for member_id, topics in subscriptions.items():
        for topic in set(topics):
            per_topic.setdefault(topic, []).append(member_id)
    result: dict[str, Assignment] = {m: {} for m in subscriptions}
    for topic in sorted(per_topic):
        n = partition_counts.get(topic) or 0
        if n <= 0:
            continue
        consumers = sorted(per_topic[topic], key=lambda m: (0, instance_ids[m], m)
                           if instance_ids.get(m) else (1, m, m))
        per_consumer, extra = divmod(n, len(consumers))
        for i, member_id in enumerate(consumers):
            start = per_consumer * i + min(i, extra)
            length = per_consumer + (1 if i < extra else 0)
            if length:
                result[member_id][topic] = list(range(start, start + length))
    return result


class GroupMetadata:
    """State of one consumer group (Kafka GroupMetadata + GroupCoordinator join
    logic). All `now_ms` arguments: injected monotonic clock, ms.

    Transitions (VALID_PREVIOUS): Empty -> PreparingRebalance (first join);
    Stable / CompletingRebalance -> PreparingRebalance (member joins with a new
    subscription, leaves, expires, or subscribed partition counts change);
    PreparingRebalance -> CompletingRebalance (all known members rejoined or
    the rebalance timeout passed: new generation, range assignment computed) or
    -> Empty (no member left: new generation too); CompletingRebalance -> Stable
    (metadata record appended); any -> Dead (partition emigrated).
    """

    def __init__(self, group_id: str, now_ms: int, config: GroupCoordinatorSchema | None = None,
                 new_member_id: Callable[[str], str] = default_member_id):
        self.group_id = group_id
        self.config = config or GroupCoordinatorSchema()
        self._new_member_id = new_member_id
        self.state = GroupState.EMPTY
        self.state_timestamp_ms = now_ms
        self.generation = 0
        self.protocol_type = ""
        self.protocol_name = ""
        self.leader = ""
        self.members: dict[str, MemberMetadata] = {}
        # Partition counts of subscribed topics at the last assignment.
        self.topic_partition_counts: dict[str, int] = {}
        self.rebalance_started_ms = now_ms
        self.join_not_before_ms = now_ms
        # group instance id -> member id of the static members (KIP-345)
        self.static_members: dict[str, str] = {}

    # ------------------------------------------------------------ state machine

    def _transition_to(self, target: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS[target]:
            raise IllegalGroupTransitionError(
                f"group {self.group_id!r}: {self.state.value} -> {target.value} is not allowed")
        self.state = target
        self.state_timestamp_ms = now_ms

    def is_(self, state: GroupState) -> bool:
        return self.state is state

    def _rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def rebalance_deadline_ms(self) -> int:
        """When a PreparingRebalance completes even if members did not rejoin."""
        return self.rebalance_started_ms + self._rebalance_timeout_ms()

    def prepare_rebalance(self, now_ms: int) -> None:
        """Start a rebalance (no-op when one is already being prepared). Members
        must rejoin within the largest rebalance timeout of the group."""
        if self.state is GroupState.PREPARING_REBALANCE:
            return
        if self.state is GroupState.COMPLETING_REBALANCE:
            for m in self.members.values():
                m.assignment = {}
        initial = self.state is GroupState.EMPTY
        self._transition_to(GroupState.PREPARING_REBALANCE, now_ms)
        self.rebalance_started_ms = now_ms
        self.join_not_before_ms = now_ms + (self.config.group_initial_rebalance_delay_ms if initial else 0)

    # ------------------------------------------------------------ JoinGroup

    def join(self, member_id: str, topics: Iterable[str], session_timeout_ms: int,
             rebalance_timeout_ms: int, now_ms: int, protocol_type: str = PROTOCOL_TYPE,
             group_instance_id: str = "") -> JoinOutcome:
        """Handle a JoinGroup. `member_id` "" means a new member (an id is
        generated); rebalance_timeout_ms <= 0 means "same as the session timeout".

        Returns a JoinOutcome whose response is set at once for errors
        (INVALID_SESSION_TIMEOUT, INCONSISTENT_GROUP_PROTOCOL, UNKNOWN_MEMBER_ID,
        FENCED_INSTANCE_ID for a replaced static member, GROUP_MAX_SIZE_REACHED,
        COORDINATOR_NOT_AVAILABLE for a Dead group) and for a known member
        rejoining a Stable / CompletingRebalance group with an unchanged
        subscription (current generation); otherwise the member waits for
        `poll_rebalance` to complete the rebalance, or (`store_then_answer`, a
        restarted static member of a Stable group, KIP-345) for the caller to
        persist the group and answer `current_join_response`.
        """
        protocol_type = protocol_type or PROTOCOL_TYPE
        topics = tuple(sorted(set(topics)))

        def fail(code: ErrorCode) -> JoinOutcome:
            return JoinOutcome(member_id, JoinResponse(code, member_id))

        if self.state is GroupState.DEAD:
            return fail(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if not (self.config.group_min_session_timeout_ms <= session_timeout_ms
                <= self.config.group_max_session_timeout_ms):
            return fail(ErrorCode.INVALID_SESSION_TIMEOUT)
        if rebalance_timeout_ms <= 0:
            rebalance_timeout_ms = session_timeout_ms
        if self.state is not GroupState.EMPTY and self.protocol_type \
                and protocol_type != self.protocol_type:
            return fail(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)

        if group_instance_id:
            current = self.static_members.get(group_instance_id)
            if member_id and current is not None and current != member_id:
                return fail(ErrorCode.FENCED_INSTANCE_ID)
            if not member_id and current is not None:
                return self._rejoin_static(group_instance_id, current, topics, session_timeout_ms,
                                           rebalance_timeout_ms, now_ms)

        if not member_id:
            if len(self.members) >= self.config.group_max_size:
                return fail(ErrorCode.GROUP_MAX_SIZE_REACHED)
            member_id = self._new_member_id(group_instance_id)
            self.members[member_id] = MemberMetadata(
                member_id, group_instance_id, session_timeout_ms, rebalance_timeout_ms,
                topics, now_ms, awaiting_join=True)
            if group_instance_id:
                self.static_members[group_instance_id] = member_id
            self.protocol_type = protocol_type
            if self.state is GroupState.PREPARING_REBALANCE:
                if now_ms < self.join_not_before_ms:
                    # Kafka's InitialDelayedJoin: each new member extends the
                    # delay, bounded by the rebalance timeout.
                    self.join_not_before_ms = min(now_ms + self.config.group_initial_rebalance_delay_ms,
                                                  self.rebalance_deadline_ms())
            else:
                self.prepare_rebalance(now_ms)
            return JoinOutcome(member_id, None)

        member = self.members.get(member_id)
        if member is None:
            return fail(ErrorCode.UNKNOWN_MEMBER_ID)
        changed = member.topics != topics
        member.topics = topics
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.last_heartbeat_ms = now_ms
        if not changed and self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            return JoinOutcome(member_id, self.current_join_response(member_id))
        member.awaiting_join = True
        self.prepare_rebalance(now_ms)
        return JoinOutcome(member_id, None)

    def _rejoin_static(self, group_instance_id: str, old_member_id: str, topics: tuple[str, ...],
                       session_timeout_ms: int, rebalance_timeout_ms: int, now_ms: int) -> JoinOutcome:
        """A known static member joins with no member id (it restarted): a new
        member id replaces the old one and keeps its assignment (Kafka's
        updateStaticMemberAndRebalance). Stable with the same subscription: no
        rebalance, the caller persists the group and then answers the current
        generation. Otherwise the member waits for a rebalance."""
        new_member_id = self._new_member_id(group_instance_id)
        member = self.replace_static_member(group_instance_id, old_member_id, new_member_id)
        changed = member.topics != topics
        member.topics = topics
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.last_heartbeat_ms = now_ms
        if self.state is GroupState.STABLE and not changed:
            return JoinOutcome(new_member_id, None, old_member_id, store_then_answer=True)
        member.awaiting_join = True
        self.prepare_rebalance(now_ms)
        return JoinOutcome(new_member_id, None, old_member_id)

    def replace_static_member(self, group_instance_id: str, old_member_id: str,
                              new_member_id: str) -> MemberMetadata:
        """Move static member `old_member_id` (of `group_instance_id`) to
        `new_member_id`, keeping its assignment, subscription and place as leader;
        also used to undo a replacement whose store failed. Returns the member."""
        member = self.members.pop(old_member_id)
        member.member_id = new_member_id
        self.members[new_member_id] = member
        self.static_members[group_instance_id] = new_member_id
        if self.leader == old_member_id:
            self.leader = new_member_id
        return member

    def is_static_member_fenced(self, member_id: str, group_instance_id: str) -> bool:
        """True when `group_instance_id` belongs to a static member whose member id
        is not `member_id` (FENCED_INSTANCE_ID, KIP-345)."""
        if not group_instance_id:
            return False
        current = self.static_members.get(group_instance_id)
        return current is not None and current != member_id

    def current_join_response(self, member_id: str) -> JoinResponse:
        """JoinGroup answer describing the current generation."""
        return JoinResponse(ErrorCode.NONE, member_id, self.generation, self.protocol_name,
                            self.leader, tuple(self.members))

    def poll_rebalance(self, now_ms: int,
                       partition_counts: Mapping[str, int]) -> CompletedRebalance | None:
        """Complete a PreparingRebalance when every known member has rejoined, or
        when the rebalance timeout has passed (members that did not rejoin are
        removed), and never before the initial rebalance delay. The generation is
        bumped; with members left the range assignment of their subscriptions
        (partition_counts: topic -> partitions) is computed and the group goes to
        CompletingRebalance, otherwise to Empty. Returns None when not complete.
        """
        if self.state is not GroupState.PREPARING_REBALANCE or now_ms < self.join_not_before_ms:
            return None
        if not all(m.awaiting_join for m in self.members.values()) \
                and now_ms < self.rebalance_deadline_ms():
            return None
        removed = tuple(m for m, meta in self.members.items() if not meta.awaiting_join)
        for member_id in removed:
            iid = self.members.pop(member_id).group_instance_id
            if iid and self.static_members.get(iid) == member_id:
                del self.static_members[iid]
        self.generation += 1
        if not self.members:
            self.protocol_name = ""
            self.leader = ""
            self.topic_partition_counts = {}
            self._transition_to(GroupState.EMPTY, now_ms)
        else:
            self.protocol_name = PROTOCOL_NAME
            if self.leader not in self.members:
                self.leader = next(iter(self.members))
            self._assign(partition_counts)
            for m in self.members.values():
                m.awaiting_join = False
                m.last_heartbeat_ms = now_ms
            self._transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        return CompletedRebalance(self.generation, removed, self.snapshot())

    def _assign(self, partition_counts: Mapping[str, int]) -> None:
        subscribed = {t for m in self.members.values() for t in m.topics}
        self.topic_partition_counts = {t: partition_counts[t] for t in sorted(subscribed)
                                       if partition_counts.get(t)}
        assignment = range_assign({m.member_id: m.topics for m in self.members.values()},
                                  self.topic_partition_counts,
                                  {m.member_id: m.group_instance_id for m in self.members.values()})
        for member_id, member in self.members.items():
            member.assignment = assignment[member_id]

    def store_completed(self, generation: int, error: ErrorCode, now_ms: int) -> None:
        """The group metadata record of `generation` was appended (error NONE:
        the group becomes Stable) or the append failed (the group goes back to
        PreparingRebalance and every member must rejoin). Stale generations and
        groups that moved on are left alone."""
        if self.state is not GroupState.COMPLETING_REBALANCE or generation != self.generation:
            return
        if error == ErrorCode.NONE:
            self._transition_to(GroupState.STABLE, now_ms)
        else:
            for m in self.members.values():
                m.awaiting_join = False
            self.prepare_rebalance(now_ms)

    def partition_counts_changed(self, partition_counts: Mapping[str, int]) -> bool:
        """True when the partition counts of the subscribed topics differ from
        the ones the current assignment was computed from."""
        subscribed = {t for m in self.members.values() for t in m.topics}
        current = {t: partition_counts[t] for t in subscribed if partition_counts.get(t)}
        return current != self.topic_partition_counts

    # ------------------------------------------------------------ SyncGroup / Heartbeat / Leave

    def _check_member(self, member_id: str, generation_id: int, group_instance_id: str = "") -> ErrorCode:
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if self.is_static_member_fenced(member_id, group_instance_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != self.generation:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    def sync(self, member_id: str, generation_id: int, now_ms: int,
             group_instance_id: str = "") -> tuple[ErrorCode, Assignment]:
        """SyncGroup: the member's assignment of the current generation.
        Errors: FENCED_INSTANCE_ID, UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
        REBALANCE_IN_PROGRESS (PreparingRebalance, or CompletingRebalance while
        the generation is being persisted), COORDINATOR_NOT_AVAILABLE (Dead)."""
        code = self._check_member(member_id, generation_id, group_instance_id)
        if code != ErrorCode.NONE:
            return code, {}
        if self.state is not GroupState.STABLE:
            return ErrorCode.REBALANCE_IN_PROGRESS, {}
        member = self.members[member_id]
        member.last_heartbeat_ms = now_ms
        return ErrorCode.NONE, {t: list(p) for t, p in member.assignment.items()}

    def heartbeat(self, member_id: str, generation_id: int, now_ms: int,
                  group_instance_id: str = "") -> ErrorCode:
        """Heartbeat: refreshes the member's session. Errors: FENCED_INSTANCE_ID,
        UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS (the member
        must rejoin), COORDINATOR_NOT_AVAILABLE (Dead)."""
        code = self._check_member(member_id, generation_id, group_instance_id)
        if code != ErrorCode.NONE:
            return code
        self.members[member_id].last_heartbeat_ms = now_ms
        if self.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leaving_member_id(self, member_id: str, group_instance_id: str = "") -> str:
        """The member a LeaveGroup names: `member_id`, or with no member id ("",
        Kafka's UNKNOWN_MEMBER_ID) the current member of static instance
        `group_instance_id` ("" when it has none) — how KIP-345's RemoveMembers
        (LeaveGroup v3+, members named by group.instance.id only) addresses them."""
        if not member_id and group_instance_id:
            return self.static_members.get(group_instance_id, "")
        return member_id

    def leave(self, member_id: str, now_ms: int, group_instance_id: str = "") -> ErrorCode:
        """LeaveGroup: removes the member and triggers a rebalance. A static member
        may be named by `group_instance_id` alone (member_id "", see
        `leaving_member_id`). Errors: FENCED_INSTANCE_ID (member_id is not the
        instance's current one), UNKNOWN_MEMBER_ID, COORDINATOR_NOT_AVAILABLE (Dead)."""
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        member_id = self.leaving_member_id(member_id, group_instance_id)
        if self.is_static_member_fenced(member_id, group_instance_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._remove_member(member_id, now_ms)
        return ErrorCode.NONE

    def _remove_member(self, member_id: str, now_ms: int) -> None:
        member = self.members.pop(member_id)
        if member.group_instance_id and self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        if self.leader == member_id:
            self.leader = ""
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self.prepare_rebalance(now_ms)

    def expire_members(self, now_ms: int) -> list[str]:
        """Remove members whose session timed out (no heartbeat, join, sync or
        commit for session_timeout_ms); members waiting in a JoinGroup do not
        expire. Triggers a rebalance when any was removed. Returns their ids."""
        if self.state in (GroupState.EMPTY, GroupState.DEAD):
            return []
        expired = [m.member_id for m in self.members.values()
                   if not m.awaiting_join and now_ms - m.last_heartbeat_ms >= m.session_timeout_ms]
        for member_id in expired:
            self._remove_member(member_id, now_ms)
        return expired

    def mark_dead(self, now_ms: int) -> None:
        """The coordinator no longer owns the group's partition."""
        self._transition_to(GroupState.DEAD, now_ms)

    # ------------------------------------------------------------ persistence

    def snapshot(self) -> GroupSnapshot:
        """The group metadata record of the current generation."""
        return GroupSnapshot(
            self.group_id, self.protocol_type, self.generation, self.protocol_name, self.leader,
            tuple(MemberSnapshot(m.member_id, m.group_instance_id, m.session_timeout_ms,
                                 m.rebalance_timeout_ms, m.topics,
                                 tuple((t, tuple(p)) for t, p in sorted(m.assignment.items())))
                  for m in self.members.values()),
            tuple(sorted(self.topic_partition_counts.items())))

    @classmethod
    def from_snapshot(cls, snap: GroupSnapshot, now_ms: int, config: GroupCoordinatorSchema | None = None,
                      new_member_id: Callable[[str], str] = default_member_id) -> "GroupMetadata":
        """Rebuild a group from its last metadata record (coordinator load):
        Stable with the recorded members (sessions restart at now_ms) or Empty."""
        group = cls(snap.group_id, now_ms, config, new_member_id)
        group.protocol_type = snap.protocol_type
        group.generation = snap.generation
        group.protocol_name = snap.protocol_name
        group.leader = snap.leader
        group.topic_partition_counts = dict(snap.topic_partition_counts)
        for m in snap.members:
            group.members[m.member_id] = MemberMetadata(
                m.member_id, m.group_instance_id, m.session_timeout_ms, m.rebalance_timeout_ms,
                tuple(m.topics), now_ms, {t: list(p) for t, p in m.assignment})
            if m.group_instance_id:
                group.static_members[m.group_instance_id] = m.member_id
        if group.members:
            group.state = GroupState.STABLE
        return group


def validate_offset_commit(group: GroupMetadata | None, member_id: str, generation_id: int,
                           transactional: bool, group_instance_id: str = "") -> ErrorCode:
    """May an OffsetCommit (transactional=False) or TxnOffsetCommit
    (transactional=True) be written for this group? `group` None: unknown group.

    OffsetCommit (Kafka GroupCoordinator.handleCommitOffsets): generation -1 is
    a simple commit (assign() mode), allowed when the group is unknown or Empty;
    otherwise REBALANCE_IN_PROGRESS while CompletingRebalance, UNKNOWN_MEMBER_ID,
    ILLEGAL_GENERATION. An unknown group with a generation >= 0: ILLEGAL_GENERATION.

    TxnOffsetCommit (KIP-447 as adopted): generation -1 skips the generation
    check; any other generation must be the group's current one (an unknown
    group counts as generation 0) -> ILLEGAL_GENERATION; then a non-empty
    member_id must be a member -> UNKNOWN_MEMBER_ID. The producer's PID and epoch
    are checked by the partition leader when the batch is appended.

    A Dead group answers COORDINATOR_NOT_AVAILABLE; a member id that is no longer
    the one of `group_instance_id` (a replaced static member) FENCED_INSTANCE_ID.
    """
    if group is not None and group.is_(GroupState.DEAD):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if group is not None and group.is_static_member_fenced(member_id, group_instance_id):
        return ErrorCode.FENCED_INSTANCE_ID
    generation = group.generation if group is not None else 0
    members = group.members if group is not None else {}
    if transactional:
        if generation_id != UNKNOWN_GENERATION and generation_id != generation:
            return ErrorCode.ILLEGAL_GENERATION
        if member_id and member_id not in members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return ErrorCode.NONE
    if group is None:
        return ErrorCode.NONE if generation_id < 0 else ErrorCode.ILLEGAL_GENERATION
    if generation_id < 0 and group.is_(GroupState.EMPTY):
        return ErrorCode.NONE
    if group.is_(GroupState.COMPLETING_REBALANCE):
        return ErrorCode.REBALANCE_IN_PROGRESS
    if member_id not in members:
        return ErrorCode.UNKNOWN_MEMBER_ID
    if generation_id != generation:
        return ErrorCode.ILLEGAL_GENERATION
    return ErrorCode.NONE


def concurrent_commits(group: GroupMetadata | None, member_id: str, generation_id: int, transactional_id: str,
                       partitions: Iterable[TopicPartition],
                       committers: Mapping[TopicPartition, tuple[str, int]]) -> set[TopicPartition]:
    """KIP-447 draft, CONCURRENT_PRODUCER_COMMIT ("a topic partition which is owned by
    another producer in this generation"): the partitions of a TxnOffsetCommit that
    another producer owns in the group's current generation, to be refused. `group`
    None: no membership (generation 0, as for `validate_offset_commit`). A partition is
    refused when
    - the commit is of the group's current generation and the partition is assigned
      in it to another member than `member_id`; or
    - `committers` (partition -> (transactional.id, generation) of the last
      transactional commit of the group's offsets for it, the draft's "Compatibility
      fencing" map) names another producer that committed in the group's current
      generation while this request carries no generation (-1) or another one: a
      stale per-partition producer of a group mixing per-partition transactional.ids
      and group-aware producers.

    Ownership is of one generation: a committer of an earlier generation owns nothing
    once the group moved on (its zombie gets ILLEGAL_GENERATION from
    `validate_offset_commit` instead), and one recorded without a generation (-1)
    owns nothing either. The caller forgets the committers of a deleted group or of
    deleted offsets."""
    refused: set[TopicPartition] = set()
    wanted = [TopicPartition(*tp) for tp in partitions]
    current = group.generation if group is not None else 0
    if group is not None and generation_id >= 0 and generation_id == current and member_id in group.members:
        owner = {TopicPartition(t, p): m.member_id for m in group.members.values()
                 for t, ps in m.assignment.items() for p in ps}
        refused.update(tp for tp in wanted if owner.get(tp, member_id) != member_id)
    for tp in wanted:
        last = committers.get(tp)
        if last is not None and last[0] != transactional_id and last[1] == current \
                and generation_id != current:
            refused.add(tp)
    return refused
