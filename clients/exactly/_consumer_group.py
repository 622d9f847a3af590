"""Consumer group membership and offset storage through the group coordinator.

`GroupMembership` follows Kafka's consumer protocol with eager rebalancing:
FindCoordinator (key type 0) -> JoinGroup with the subscribed topics ->
SyncGroup, which returns this member's share of the range assignment the
coordinator computed -> Heartbeat from a background thread every
`heartbeat.interval.ms`. A heartbeat answered REBALANCE_IN_PROGRESS,
ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID marks the member for rejoining; the
Consumer rejoins on its next `poll` (revoking, then assigning). NOT_COORDINATOR,
COORDINATOR_NOT_AVAILABLE and transport failures drop the cached coordinator so
the next request finds it again.

Join and sync are sent as futures and advanced by `advance()`, so `poll(timeout)`
keeps its timeout while a rebalance waits for other members.

Lost partitions: when the coordinator says this member's generation is over
without a rebalance it took part in (UNKNOWN_MEMBER_ID after a session expiry,
ILLEGAL_GENERATION, FENCED_INSTANCE_ID) or the member left after
`max.poll.interval.ms`, `take_lost()` tells the Consumer to call `on_lost`
instead of `on_revoke` and to commit nothing (Kafka's onPartitionsLost).

Static membership (KIP-345): with `group.instance.id` every request carries the
instance id; a restarted instance rejoins with no member id and gets its old
assignment back without a rebalance. FENCED_INSTANCE_ID (another process joined
with the same instance id) is fatal: `advance()` raises it from then on. A static
member never sends LeaveGroup (closing, or after max.poll.interval.ms), so its
partitions wait `session.timeout.ms` for it, as in Kafka.

Offsets: `commit_sync` / `commit_async` (OffsetCommit with this member's
generation and member id, or -1 / "" outside group management) and
`fetch_committed` (OffsetFetch; with `require_stable`, UNSTABLE_OFFSET_COMMIT is
retried with backoff: KIP-447, docs/design.md, "Transactions").
"""
from __future__ import annotations

import concurrent.futures
import enum
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, TypeVar

import tenacity

from exactly import errors
from exactly._client import (CANCELLED, COORDINATOR_ERRORS, COORDINATOR_GROUP, CoreBase, Rpc, bounded_s,
                             call_deadline, stop_before_deadline)
from exactly_wire.clock import Clock, monotonic_ms
from exactly_wire.error_codes import ErrorCode
from exactly.types import OffsetAndMetadata, TopicPartition
from exactly_wire.v1 import exactly_pb2 as pb

if TYPE_CHECKING:
    from exactly._client import ClientCore

log = logging.getLogger(__name__)

T = TypeVar("T")

# Answers that mean "the coordinator moved or is unreachable: find it again".
_FIND_AGAIN = COORDINATOR_ERRORS
# Answers after which a coordinator request is simply sent again (after backoff).
_RETRY_CODES = frozenset(COORDINATOR_ERRORS | {ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                               ErrorCode.NETWORK_EXCEPTION,
                                               ErrorCode.REQUEST_TIMED_OUT})
# OffsetFetch retries these too: UNSTABLE_OFFSET_COMMIT while a transactional offset
# commit is pending under require_stable (KIP-447).
FETCH_COMMITTED_RETRY_CODES = frozenset(_RETRY_CODES | {ErrorCode.UNSTABLE_OFFSET_COMMIT})
# Answers that mean this member's generation is over.
REJOIN_CODES = frozenset({ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION,
                          ErrorCode.UNKNOWN_MEMBER_ID})


def _code(value: int) -> ErrorCode:
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


class MemberState(enum.Enum):
    UNJOINED = "unjoined"
    JOINING = "joining"    # JoinGroup in flight (or waiting to be sent)
    SYNCING = "syncing"    # SyncGroup in flight
    STABLE = "stable"      # assignment received, heartbeating


def offset_commit_rpc(core: CoreBase, address: str) -> Callable[..., Any]:
    """OffsetCommit of the group coordinator at `address` (an `exactly._client.Rpc`)."""
    return core.group_stub(address).OffsetCommit


def offset_fetch_rpc(core: CoreBase, address: str) -> Callable[..., Any]:
    """OffsetFetch of the group coordinator at `address` (an `exactly._client.Rpc`)."""
    return core.group_stub(address).OffsetFetch


def group_offsets_request(offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> list[pb.OffsetCommitTopic]:
    """Group `{tp: OffsetAndMetadata}` by topic as OffsetCommitTopic messages."""
    by_topic: dict[str, list[pb.OffsetCommitPartition]] = {}
    for tp, om in sorted(offsets.items()):
        by_topic.setdefault(tp.topic, []).append(pb.OffsetCommitPartition(
            partition=tp.partition, committed_offset=om.offset, committed_leader_epoch=-1,
            metadata=om.metadata or ""))
    return [pb.OffsetCommitTopic(name=t, partitions=ps) for t, ps in by_topic.items()]


def topic_partitions_request(partitions: Iterable[TopicPartition]) -> list[pb.TopicPartitions]:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(set(partitions)):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return [pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]


def first_error(results: Iterable[pb.TopicResult]) -> tuple[int, str]:
    """(first non-zero per-partition error code, 'topic-partition'), or (0, '')."""
    for tr in results:
        for pr in tr.partitions:
            if pr.error_code:
                return pr.error_code, f"{tr.topic}-{pr.partition}"
    return 0, ""


def parse_offset_fetch(resp: pb.OffsetFetchResponse, wanted: Iterable[TopicPartition]
                       ) -> dict[TopicPartition, OffsetAndMetadata | None]:
    """Committed offsets from an OffsetFetchResponse: `{tp: OffsetAndMetadata}`, or
    None where the group has no committed offset (-1). Raises the error of the
    response or of the first failed partition (UnstableOffsetCommitError while a
    transactional offset commit is pending under require_stable)."""
    errors.check(resp.error_code, "OffsetFetch")
    out: dict[TopicPartition, OffsetAndMetadata | None] = {tp: None for tp in wanted}
    for t in resp.topics:
        for p in t.partitions:
            tp = TopicPartition(t.name, p.partition)
            if p.error_code:
                raise errors.for_code(p.error_code, f"OffsetFetch {tp.topic}-{tp.partition}")
            if tp in out:
                out[tp] = OffsetAndMetadata(p.committed_offset, p.metadata) if p.committed_offset >= 0 else None
    return out


class GroupMembership:
    """One consumer's membership in `group_id`. Thread-safe: the heartbeat thread
    and the polling thread share its state under a lock.

    Times: `session_timeout_ms`, `rebalance_timeout_ms` (how long the coordinator
    waits for members to rejoin; Kafka's `max.poll.interval.ms`),
    `heartbeat_interval_ms`, `backoff_ms`/`backoff_max_ms`; `clock`: monotonic ms
    (`exactly_wire.clock`).
    """

    def __init__(self, core: "ClientCore", group_id: str, *, session_timeout_ms: int = 10000,
                 rebalance_timeout_ms: int = 300000, heartbeat_interval_ms: int = 3000,
                 group_instance_id: str | None = None, backoff_ms: float = 100,
                 backoff_max_ms: float = 1000, clock: Clock = monotonic_ms):
        self._core = core
        self.group_id = group_id
        self.group_instance_id = group_instance_id
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self._backoff_ms = backoff_ms
        self._backoff_max_ms = backoff_max_ms
        self._clock = clock
        self._lock = threading.RLock()
        self.state = MemberState.UNJOINED
        self.generation_id = -1
        self.member_id = ""
        self._rejoin_needed = True
        self._topics: tuple[str, ...] = ()
        self._pending: concurrent.futures.Future | None = None
        self._backoff_until = 0
        self._failures = 0
        self._last_poll = clock()
        self._hb_thread: threading.Thread | None = None
        self._hb_stop = threading.Event()
        self._hb_wake = threading.Event()
        self._fatal: errors.ExactlyError | None = None
        self._fenced: errors.ExactlyError | None = None  # FENCED_INSTANCE_ID: permanent
        self._lost = False
        # Why the coordinator was last unusable (None once a join succeeded): what a
        # poll() waiting to join reports (exactly._waiting).
        self.last_problem: object = None

    # ------------------------------------------------------------ coordinator

    def coordinator(self, timeout_s: float | None = None) -> str:
        """Coordinator address; raises a retriable error when it cannot be found in time."""
        return self._core.find_coordinator(self.group_id, COORDINATOR_GROUP, timeout_s)

    def coordinator_dead(self, why: object = None) -> None:
        log.debug("group %s: coordinator unusable (%s); finding it again", self.group_id, why)
        self.last_problem = why
        self._core.invalidate_coordinator(self.group_id, COORDINATOR_GROUP)

    # ------------------------------------------------------------ membership

    def generation(self) -> tuple[int, str]:
        """(generation id, member id) as last assigned by the coordinator."""
        with self._lock:
            return self.generation_id, self.member_id

    def stable_generation(self) -> tuple[int, str] | None:
        with self._lock:
            if self.state is MemberState.STABLE:
                return self.generation_id, self.member_id
            return None

    def needs_join(self) -> bool:
        with self._lock:
            return self._rejoin_needed or self.state is not MemberState.STABLE

    def join_in_progress(self) -> bool:
        with self._lock:
            return self.state in (MemberState.JOINING, MemberState.SYNCING)

    def request_rejoin(self, reason: object = None, reset_member: bool = False,
                       reset_generation: bool = False) -> None:
        """Rejoin on the next poll. `reset_member` forgets the member id and the
        generation, `reset_generation` the generation only; either means the
        partitions owned are lost (`take_lost`)."""
        with self._lock:
            if reason is not None:
                log.info("group %s: rejoining (%s)", self.group_id, reason)
            self._rejoin_needed = True
            if reset_member:
                self.member_id = ""
            if reset_member or reset_generation:
                self.generation_id = -1
                self._lost = True

    def take_lost(self) -> bool:
        """True once after the generation ended without this member rejoining in
        time (see the module docstring): the owned partitions are lost."""
        with self._lock:
            lost, self._lost = self._lost, False
            return lost

    @property
    def fenced(self) -> errors.ExactlyError | None:
        """The FENCED_INSTANCE_ID error once another instance took this static
        member's place, else None."""
        return self._fenced

    def start_join(self, topics: Iterable[str]) -> None:
        """Begin (or restart) a rebalance with subscription `topics`."""
        with self._lock:
            self._topics = tuple(topics)
            self._rejoin_needed = False
            self._lost = False
            self.state = MemberState.JOINING
            if self._pending is not None:
                self._pending.cancel()
            self._pending = None

    def polled(self) -> None:
        """The application called poll (checked against the rebalance timeout)."""
        self._last_poll = self._clock()

    def _backoff(self) -> None:
        self._failures += 1
        self._backoff_until = self._clock() + min(self._backoff_max_ms,
                                                  self._backoff_ms * 2 ** (self._failures - 1))

    def _send_join(self) -> bool:
        try:
            addr = self.coordinator(timeout_s=self._backoff_max_ms / 1000)
        except errors.ExactlyError as exc:
            log.debug("group %s: no coordinator yet: %r", self.group_id, exc)
            self.last_problem = exc
            self._backoff()
            return False
        req = pb.JoinGroupRequest(group_id=self.group_id, session_timeout_ms=self.session_timeout_ms,
                                  rebalance_timeout_ms=self.rebalance_timeout_ms,
                                  member_id=self.member_id, group_instance_id=self.group_instance_id or "",
                                  protocol_type="consumer", topics=list(self._topics))
        timeout_s = self.rebalance_timeout_ms / 1000.0 + 5.0
        self._pending = self._core.call_future(self._core.group_stub(addr).JoinGroup, req, timeout_s)
        return True

    def _send_sync(self) -> None:
        try:
            addr = self.coordinator(timeout_s=self._backoff_max_ms / 1000)
        except errors.ExactlyError as exc:
            self.state = MemberState.JOINING
            self._backoff()
            log.debug("group %s: no coordinator for SyncGroup: %r", self.group_id, exc)
            return
        req = pb.SyncGroupRequest(group_id=self.group_id, generation_id=self.generation_id,
                                  member_id=self.member_id, group_instance_id=self.group_instance_id or "")
        timeout_s = self.rebalance_timeout_ms / 1000.0 + 5.0
        self._pending = self._core.call_future(self._core.group_stub(addr).SyncGroup, req, timeout_s)

    def pending(self) -> concurrent.futures.Future | None:
        with self._lock:
            return self._pending

    def advance(self) -> list[TopicPartition] | None:
        """Move the rebalance forward without blocking. Returns this member's new
        assignment when SyncGroup completes, else None. Raises the error of a
        fatal JoinGroup/SyncGroup answer (e.g. INVALID_SESSION_TIMEOUT,
        GROUP_AUTHORIZATION_FAILED, FENCED_INSTANCE_ID)."""
        with self._lock:
            if self._fenced is not None:
                raise self._fenced
            if self._fatal is not None:
                exc, self._fatal = self._fatal, None
                raise exc
            for _ in range(4):  # a few immediate steps (e.g. MEMBER_ID_REQUIRED -> join again)
                if self.state is MemberState.JOINING:
                    if self._pending is None:
                        if self._clock() < self._backoff_until or not self._send_join():
                            return None
                    if not self._pending.done():
                        return None
                    fut, self._pending = self._pending, None
                    self._on_join(fut)
                elif self.state is MemberState.SYNCING:
                    if self._pending is None:
                        self._send_sync()
                        if self._pending is None:
                            return None
                    if not self._pending.done():
                        return None
                    fut, self._pending = self._pending, None
                    assignment = self._on_sync(fut)
                    if assignment is not None:
                        return assignment
                else:
                    return None
            return None

    def _on_join(self, fut: concurrent.futures.Future) -> None:
        try:
            resp = fut.result()
        except (errors.ExactlyError, *CANCELLED) as exc:
            self.coordinator_dead(exc)
            self._backoff()
            return
        code = resp.error_code
        if code == ErrorCode.NONE:
            self.generation_id = resp.generation_id
            self.member_id = resp.member_id
            self._failures = 0
            self.last_problem = None
            log.info("group %s: joined generation %d as %s", self.group_id, self.generation_id, self.member_id)
            self.state = MemberState.SYNCING
            self._send_sync()
        elif code == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = resp.member_id
        elif code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = ""
            self._backoff()
        elif code in (ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION):
            self._backoff()
        elif code in _RETRY_CODES:
            if code in _FIND_AGAIN:
                self.coordinator_dead(ErrorCode(code).name)
            self._backoff()
        else:
            self.state = MemberState.UNJOINED
            self._rejoin_needed = True
            self._backoff()
            exc = errors.for_code(code, resp.error_message or f"JoinGroup {self.group_id}")
            if code == ErrorCode.FENCED_INSTANCE_ID:
                self._fence(exc)
            raise exc

    def _on_sync(self, fut: concurrent.futures.Future) -> list[TopicPartition] | None:
        try:
            resp = fut.result()
        except (errors.ExactlyError, *CANCELLED) as exc:
            self.coordinator_dead(exc)
            self.state = MemberState.JOINING
            self._backoff()
            return None
        code = resp.error_code
        if code == ErrorCode.NONE:
            self.state = MemberState.STABLE
            self._failures = 0
            return [TopicPartition(t.topic, p) for t in resp.assignment for p in t.partitions]
        self.state = MemberState.JOINING
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id, self.generation_id = "", -1
        elif code == ErrorCode.ILLEGAL_GENERATION:
            self.generation_id = -1
        elif code == ErrorCode.REBALANCE_IN_PROGRESS:
            # The generation is still being persisted, or a new rebalance began:
            # rejoining answers at once in the first case and waits in the second.
            self._backoff()
        elif code in _RETRY_CODES:
            if code in _FIND_AGAIN:
                self.coordinator_dead(ErrorCode(code).name)
            self._backoff()
        else:
            self.state = MemberState.UNJOINED
            self._rejoin_needed = True
            self._backoff()
            exc = errors.for_code(code, resp.error_message or f"SyncGroup {self.group_id}")
            if code == ErrorCode.FENCED_INSTANCE_ID:
                self._fence(exc)
            raise exc
        return None

    def _fence(self, exc: errors.ExactlyError) -> None:
        """Another instance took this static member's place (FENCED_INSTANCE_ID):
        the partitions are lost and the membership is over for good (fatal, as in
        Kafka)."""
        log.error("group %s: static member %s fenced by a newer instance", self.group_id,
                  self.group_instance_id)
        self._fenced = exc
        self.request_rejoin(exc.code.name, reset_generation=True)

    # ------------------------------------------------------------ heartbeats

    def start_heartbeat(self) -> None:
        if self._hb_thread is None:
            self._hb_thread = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                               name=f"exactly-heartbeat-{self.group_id}")
            self._hb_thread.start()

    def _heartbeat_loop(self) -> None:
        interval = self.heartbeat_interval_ms / 1000.0
        while not self._hb_stop.is_set():
            self._hb_wake.wait(interval)
            self._hb_wake.clear()
            if self._hb_stop.is_set():
                return
            try:
                self.heartbeat_once()
            except Exception:  # noqa: BLE001 - the thread must survive anything
                log.exception("group %s: heartbeat failed", self.group_id)

    def heartbeat_request(self) -> pb.HeartbeatRequest | None:
        """The Heartbeat to send now, or None when the member is not stable."""
        with self._lock:
            # Keep heartbeating while a rejoin is pending (until poll sends the
            # JoinGroup) so the session does not expire meanwhile.
            if self.state is not MemberState.STABLE or not self.member_id:
                return None
            return pb.HeartbeatRequest(group_id=self.group_id, generation_id=self.generation_id,
                                       member_id=self.member_id, group_instance_id=self.group_instance_id or "")

    def poll_interval_exceeded(self) -> bool:
        """True (and logged) when poll() was not called for max.poll.interval.ms: the
        member must leave the group."""
        now = self._clock()
        if now - self._last_poll <= self.rebalance_timeout_ms:
            return False
        log.warning("group %s: poll() not called for %d ms (> max.poll.interval.ms); leaving the group",
                    self.group_id, now - self._last_poll)
        return True

    @property
    def heartbeat_timeout_s(self) -> float:
        return min(self._core.request_timeout_s, self.session_timeout_ms / 1000.0)

    def heartbeat_once(self) -> ErrorCode | None:
        """Send one Heartbeat if the member is stable; apply the answer. Returns the
        answer's code (None when nothing was sent or the transport failed)."""
        req = self.heartbeat_request()
        if req is None:
            return None
        if self.poll_interval_exceeded():
            self.leave()
            return None
        try:
            addr = self.coordinator(timeout_s=self._backoff_max_ms / 1000)
            resp = self._core.call(self._core.group_stub(addr).Heartbeat, req, timeout_s=self.heartbeat_timeout_s)
        except errors.ExactlyError as exc:
            self.coordinator_dead(exc)
            return None
        return self.on_heartbeat(req, resp.error_code)

    def on_heartbeat(self, req: pb.HeartbeatRequest, error_code: int) -> ErrorCode:
        """Apply the answer to heartbeat `req`: rejoin, find the coordinator again,
        or keep a fatal error for the next poll. Returns the answer's code."""
        gen, member = req.generation_id, req.member_id
        code = _code(error_code)
        with self._lock:
            if (gen, member) != (self.generation_id, self.member_id) or self.state is not MemberState.STABLE:
                return code
            if code == ErrorCode.NONE:
                pass
            elif code == ErrorCode.UNKNOWN_MEMBER_ID:
                self.request_rejoin(code.name, reset_member=True)
            elif code == ErrorCode.ILLEGAL_GENERATION:
                self.request_rejoin(code.name, reset_generation=True)
            elif code == ErrorCode.FENCED_INSTANCE_ID:
                self._fence(errors.for_code(code, f"Heartbeat {self.group_id}"))
            elif code in REJOIN_CODES:
                self.request_rejoin(code.name)
            elif code in _FIND_AGAIN:
                self.coordinator_dead(code.name)
            elif code not in _RETRY_CODES:
                self._fatal = errors.for_code(code, f"Heartbeat {self.group_id}")
                self.request_rejoin(code.name)
        return code

    # ------------------------------------------------------------ leaving

    def forget_membership(self) -> pb.LeaveGroupRequest | None:
        """Forget the membership (cancelling a join in progress; its partitions count
        as lost); returns the LeaveGroup to send, None when there was no member id or
        the member is static (KIP-345: the coordinator keeps its place for
        session.timeout.ms)."""
        with self._lock:
            member = self.member_id
            if self._pending is not None:
                self._pending.cancel()
                self._pending = None
            if self.state is MemberState.STABLE and member:
                self._lost = True
            self.state = MemberState.UNJOINED
            self._rejoin_needed = True
            self.member_id, self.generation_id = "", -1
        if not member or self.group_instance_id:
            return None
        return pb.LeaveGroupRequest(group_id=self.group_id, member_id=member)

    def leave(self) -> None:
        """Forget the membership and send LeaveGroup, best effort (none for a static
        member)."""
        req = self.forget_membership()
        if req is None:
            return
        try:
            addr = self.coordinator(timeout_s=self._backoff_max_ms / 1000)
            resp = self._core.call(self._core.group_stub(addr).LeaveGroup, req)
            if resp.error_code:
                log.debug("group %s: LeaveGroup answered %s", self.group_id, resp.error_code)
        except errors.ExactlyError as exc:
            log.debug("group %s: LeaveGroup failed: %r", self.group_id, exc)

    def stop_heartbeat(self) -> None:
        """Make the heartbeat thread end (without waiting for it)."""
        self._hb_stop.set()
        self._hb_wake.set()

    def close(self) -> None:
        """Stop heartbeating and leave the group (a static member only stops)."""
        self.stop_heartbeat()
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=5)
        self.leave()

    # ------------------------------------------------------------ offsets

    def _retrying(self, timeout_s: float, retry_codes: frozenset) -> Callable[..., Any]:
        """A callable running its function under tenacity with `_retry_policy`, every
        try bounded by the loop's deadline (`exactly._client.call_deadline`)."""
        timeout = bounded_s(timeout_s)

        def _run(fn: Callable[..., T], *args: Any) -> T:
            with call_deadline(timeout, self._core.clock):
                return tenacity.Retrying(sleep=self._core.clock.sleep,
                                         **self._retry_policy(timeout, retry_codes))(fn, *args)
        return _run

    def _retry_policy(self, timeout_s: float, retry_codes: frozenset) -> dict:
        """tenacity arguments of the offset requests: retry `retry_codes` with
        backoff_ms doubling up to backoff_max_ms (with jitter) for `timeout_s`."""
        def _retriable(exc: BaseException) -> bool:
            return isinstance(exc, errors.ExactlyError) and exc.code in retry_codes

        return dict(
            retry=tenacity.retry_if_exception(_retriable),
            wait=tenacity.wait_exponential_jitter(multiplier=self._backoff_ms / 1000,
                                                  max=self._backoff_max_ms / 1000,
                                                  jitter=self._backoff_ms / 1000 / 5),
            stop=stop_before_deadline(self._core.clock, timeout_s),
            reraise=True)

    def _commit_request(self, offsets: Mapping[TopicPartition, OffsetAndMetadata],
                        managed: bool) -> pb.OffsetCommitRequest:
        gen, member = self.generation() if managed else (-1, "")
        return pb.OffsetCommitRequest(group_id=self.group_id, generation_id=gen, member_id=member,
                                      topics=group_offsets_request(offsets),
                                      group_instance_id=(self.group_instance_id or "") if managed else "")

    def _commit_outcome(self, resp: pb.OffsetCommitResponse) -> None:
        code, where = first_error(resp.topics)
        if not code:
            return
        if code in _FIND_AGAIN:
            self.coordinator_dead(ErrorCode(code).name)
        elif code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.request_rejoin("commit: UNKNOWN_MEMBER_ID", reset_member=True)
        elif code == ErrorCode.ILLEGAL_GENERATION:
            self.request_rejoin("commit: ILLEGAL_GENERATION", reset_generation=True)
        elif code == ErrorCode.FENCED_INSTANCE_ID:
            self._fence(errors.for_code(code, f"OffsetCommit {self.group_id}"))
        elif code in REJOIN_CODES:
            self.request_rejoin(f"commit: {ErrorCode(code).name}")
        raise errors.for_code(code, f"OffsetCommit {self.group_id} {where}")

    def commit_sync(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], managed: bool,
                    timeout_s: float) -> None:
        """OffsetCommit `offsets`, retrying coordinator moves and network errors for
        up to `timeout_s` seconds. `managed`: send this member's generation and
        member id (subscribe), else -1 / "" (assign). Raises the coordinator's
        error, e.g. RebalanceInProgressError / IllegalGenerationError /
        UnknownMemberIdError when the generation is over (the member then rejoins
        on the next poll)."""
        if not offsets:
            return
        self._retrying(timeout_s, _RETRY_CODES)(self._request, offset_commit_rpc,
                                                lambda: self._commit_request(offsets, managed), timeout_s,
                                                self._commit_outcome)

    def _request(self, rpc: Rpc, request: Callable[[], Any], timeout_s: float,
                 outcome: Callable[[Any], T]) -> T:
        """One try of an offset request: `outcome(answer)` of the coordinator to
        `request()` sent by `rpc`; a failure meaning the coordinator moved drops it first."""
        addr = self.coordinator(timeout_s)
        try:
            resp = self._core.call(rpc(self._core, addr), request())
        except errors.ExactlyError as exc:
            self.request_failed(exc)
            raise
        return outcome(resp)

    def request_failed(self, exc: errors.ExactlyError) -> None:
        """A coordinator request failed: find the coordinator again if it moved."""
        if exc.code in _FIND_AGAIN:
            self.coordinator_dead(exc)

    def offset_fetch_outcome(self, resp: pb.OffsetFetchResponse, wanted: list[TopicPartition]
                             ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """`parse_offset_fetch`, dropping the coordinator when the answer says it moved."""
        try:
            return parse_offset_fetch(resp, wanted)
        except errors.ExactlyError as exc:
            self.request_failed(exc)
            raise

    def commit_async(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], managed: bool,
                     callback: Callable[[errors.ExactlyError | None], None] | None = None
                     ) -> concurrent.futures.Future | None:
        """Send OffsetCommit without waiting. `callback(error or None)` runs once
        it completed, on a gRPC thread or the client's background thread (a
        cancelled commit reports a KafkaTimeoutError). Never blocks: when the
        coordinator is not known, the lookup and the commit run on the client's
        background thread. Returns the request's future (None when not sent)."""
        if not offsets:
            if callback is not None:
                callback(None)
            return None
        request = self._commit_request(offsets, managed)
        addr = self._core.cached_coordinator(self.group_id, COORDINATOR_GROUP)
        try:
            if addr is not None:
                fut = self._core.call_future(self._core.group_stub(addr).OffsetCommit, request)
            else:
                fut = self._core.submit(self._commit_after_lookup, request)
        except errors.ExactlyError as exc:  # the client is closed
            if callback is not None:
                callback(exc)
            return None

        def _done(f: concurrent.futures.Future) -> None:
            err: errors.ExactlyError | None = None
            try:
                self._commit_outcome(f.result())
            except errors.ExactlyError as exc:
                if exc.code in _FIND_AGAIN:
                    self.coordinator_dead(exc)
                err = exc
                log.info("group %s: async offset commit failed: %r", self.group_id, exc)
            except CANCELLED:
                err = errors.KafkaTimeoutError("offset commit cancelled")
            if callback is not None:
                callback(err)

        fut.add_done_callback(_done)
        return fut

    def _commit_after_lookup(self, request: pb.OffsetCommitRequest) -> pb.OffsetCommitResponse:
        """Find the coordinator, then OffsetCommit `request` (on the background thread)."""
        addr = self.coordinator()
        return self._core.call(self._core.group_stub(addr).OffsetCommit, request)

    def offset_fetch_request(self, partitions: Iterable[TopicPartition],
                             require_stable: bool) -> pb.OffsetFetchRequest:
        return pb.OffsetFetchRequest(group_id=self.group_id, topics=topic_partitions_request(partitions),
                                     require_stable=require_stable)

    def fetch_committed_async(self, partitions: list[TopicPartition],
                              require_stable: bool) -> concurrent.futures.Future | None:
        """Send OffsetFetch without waiting; None when the coordinator is unknown."""
        try:
            addr = self.coordinator(timeout_s=self._backoff_max_ms / 1000)
        except errors.ExactlyError as exc:
            log.debug("group %s: OffsetFetch deferred, no coordinator: %r", self.group_id, exc)
            return None
        return self._core.call_future(self._core.group_stub(addr).OffsetFetch,
                                      self.offset_fetch_request(partitions, require_stable))

    def fetch_committed(self, partitions: Iterable[TopicPartition], require_stable: bool,
                        timeout_s: float) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """Committed offsets of `partitions`; retries UNSTABLE_OFFSET_COMMIT,
        coordinator moves and network errors for up to `timeout_s` seconds."""
        wanted = sorted(set(partitions))
        if not wanted:
            return {}
        return self._retrying(timeout_s, FETCH_COMMITTED_RETRY_CODES)(
            self._request, offset_fetch_rpc, lambda: self.offset_fetch_request(wanted, require_stable), timeout_s,
            lambda resp: self.offset_fetch_outcome(resp, wanted))
