"""Kafka APIs of a group coordinator: JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch, TxnOffsetCommit, DescribeGroups,
DeleteGroups, OffsetDelete — adapters over the gRPC servicer (servicer.py), so the group rules are
written once (docs/design.md, "Kafka protocol").

Exactly assigns partitions on the coordinator (range). Kafka's classic consumer
protocol assigns on the client: the adapter reads the topics of the member's
`ConsumerProtocolSubscription`, joins with them, answers the protocol name the member
offered first, and gives the leader the members with their subscriptions (as they
joined through this process) so its assignor has input; the assignments the leader
sends in SyncGroup are not used: every member receives the coordinator's assignment,
encoded as a `ConsumerProtocolAssignment`. Only protocol type "consumer" is served
(INCONSISTENT_GROUP_PROTOCOL otherwise). The `user_data` the leader put in a member's
assignment reaches that member with the coordinator's partitions (assignors such as
faust's carry their own state there; docs/design.md, "Kafka protocol", Groups).

Static membership (KIP-345) is the coordinator's (group.py): `group_instance_id` of
JoinGroup v5+, SyncGroup v3+, Heartbeat v3+, OffsetCommit v7+ and of each member of
LeaveGroup v3+ is passed on, and the answers are Kafka's (FENCED_INSTANCE_ID for a
member id the instance no longer has, UNKNOWN_MEMBER_ID, ...). A LeaveGroup v3+
member with an empty member id and a group_instance_id removes that instance's
current member (Kafka's RemoveMembersFromConsumerGroup); errors of the group as a
whole (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS)
are answered at the top level of the response, as Kafka does.
"""
from __future__ import annotations

import asyncio
import io
import struct
from dataclasses import dataclass, field as dataclass_field
from typing import Any, Awaitable, Callable

from kio.schema.consumer_protocol_assignment.v0.data import ConsumerProtocolAssignment
from kio.schema.consumer_protocol_assignment.v0.data import TopicPartition as AssignedPartition
from kio.schema.consumer_protocol_subscription.v0.data import ConsumerProtocolSubscription as SubscriptionV0
from kio.serial import entity_reader, entity_writer

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb

from services.common.kafka.codec import field
from services.common.kafka.listener import Handler, RequestContext

OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 9, 11, 12, 13, 14
DESCRIBE_GROUPS, TXN_OFFSET_COMMIT, DELETE_GROUPS, OFFSET_DELETE = 15, 28, 42, 47
CONSUMER = "consumer"
_VERSION = struct.Struct(">h")
_GROUP_ERRORS = (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                 ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)


def subscribed_topics(metadata: bytes) -> list[str]:
    """The topics of a ConsumerProtocolSubscription (any version: the topics come
    first after the version). Raises ValueError when it does not parse."""
    if len(metadata) < 2:
        raise ValueError("subscription metadata too short")
    try:
        sub, _ = entity_reader(SubscriptionV0)(metadata, 2)
    except Exception as exc:  # noqa: BLE001 - kio raises assorted errors on malformed input
        raise ValueError(f"unreadable subscription: {exc!r}") from None
    return list(sub.topics)


def encode_subscription(topics: list[str]) -> bytes:
    out = io.BytesIO()
    out.write(_VERSION.pack(0))
    entity_writer(SubscriptionV0)(out, SubscriptionV0(topics=tuple(topics)))
    return out.getvalue()


# How long a follower's SyncGroup waits for its leader's SyncGroup (which carries the
# members' user_data) before it is answered without user_data; Kafka waits as long as the
# rebalance lasts, the client's request timeout (30 s and more) bounds it on the client.
USER_DATA_WAIT_S = 10.0


def encode_assignment(assignment: list[tuple[str, list[int]]], user_data: bytes | None = None) -> bytes:
    """A ConsumerProtocolAssignment v0 of (topic, partitions) pairs and `user_data`
    (null when None)."""
    out = io.BytesIO()
    out.write(_VERSION.pack(0))
    entity_writer(ConsumerProtocolAssignment)(out, ConsumerProtocolAssignment(
        assigned_partitions=tuple(AssignedPartition(topic=t, partitions=tuple(ps)) for t, ps in assignment),
        user_data=user_data))
    return out.getvalue()


def assignment_user_data(assignment: bytes) -> bytes | None:
    """The `user_data` of a ConsumerProtocolAssignment (any version: v1-v3 read as v0);
    None when it has none or does not parse."""
    if len(assignment) < 2:
        return None
    try:
        value, _ = entity_reader(ConsumerProtocolAssignment)(assignment, 2)
    except Exception:  # noqa: BLE001 - kio raises assorted errors on malformed input
        return None
    return None if value.user_data is None else bytes(value.user_data)


@dataclass
class _LeaderUserData:
    """The user_data a generation's leader gave each member in its SyncGroup."""
    generation: int
    leader: str
    by_member: dict[str, bytes | None] = dataclass_field(default_factory=dict)
    sent: asyncio.Event = dataclass_field(default_factory=asyncio.Event)


class GroupCoordinatorApis:
    """The group coordinator's Kafka APIs over `servicer` (the gRPC servicer).
    `wait_for`: asyncio.wait_for's signature (awaitable, timeout in seconds), the
    bounded wait of a follower's SyncGroup for its leader's (tests pass one whose
    timeout passes at once)."""

    def __init__(self, servicer: Any, wait_for: Callable[[Awaitable, float], Awaitable] = asyncio.wait_for):
        self.servicer = servicer
        self._wait_for = wait_for
        # (group, member id) -> (protocol name, subscription metadata, group instance id)
        # of its last JoinGroup here.
        self._joined: dict[tuple[str, str], tuple[str, bytes, str]] = {}
        # group -> the user_data of its latest generation's leader.
        self._user_data: dict[str, _LeaderUserData] = {}

    def handlers(self) -> dict[int, Handler]:
        """API key -> handler; the versions are in services.common.kafka.surface."""
        return {JOIN_GROUP: self.join_group, SYNC_GROUP: self.sync_group, HEARTBEAT: self.heartbeat,
                LEAVE_GROUP: self.leave_group, OFFSET_COMMIT: self.offset_commit, OFFSET_FETCH: self.offset_fetch,
                TXN_OFFSET_COMMIT: self.txn_offset_commit,
                DESCRIBE_GROUPS: self.describe_groups, DELETE_GROUPS: self.delete_groups,
                OFFSET_DELETE: self.offset_delete}

    async def join_group(self, req: Any, version: int, ctx: RequestContext) -> dict:
        fail = {"throttle_time": 0, "generation_id": -1, "protocol_type": CONSUMER, "protocol_name": None,
                "leader": "", "member_id": field(req, "member_id", ""), "members": []}
        if req.protocol_type != CONSUMER or not req.protocols:
            return {**fail, "error_code": ErrorCode.INCONSISTENT_GROUP_PROTOCOL}
        protocol = req.protocols[0]
        try:
            topics = subscribed_topics(bytes(protocol.metadata))
        except ValueError:
            return {**fail, "error_code": ErrorCode.INCONSISTENT_GROUP_PROTOCOL}
        session_ms = field(req, "session_timeout", 10000)
        instance = field(req, "group_instance_id") or ""
        resp = await self.servicer.JoinGroup(pb.JoinGroupRequest(
            group_id=req.group_id, session_timeout_ms=session_ms,
            rebalance_timeout_ms=field(req, "rebalance_timeout", session_ms), member_id=req.member_id,
            group_instance_id=instance, protocol_type=CONSUMER, topics=topics), None)
        if resp.error_code != ErrorCode.NONE:
            return {**fail, "error_code": resp.error_code, "member_id": resp.member_id or req.member_id}
        self._joined[(req.group_id, resp.member_id)] = (protocol.name, bytes(protocol.metadata), instance)
        known = self._user_data.get(req.group_id)
        if known is None or known.generation != resp.generation_id:
            self._user_data[req.group_id] = _LeaderUserData(resp.generation_id, resp.leader)
        members = []
        if resp.leader == resp.member_id:
            current = set(resp.members)  # forget members that left or expired
            for key in [k for k in self._joined if k[0] == req.group_id and k[1] not in current]:
                del self._joined[key]
            for m in resp.members:
                _name, metadata, member_instance = self._joined.get((req.group_id, m),
                                                                    ("", encode_subscription([]), ""))
                members.append({"member_id": m, "group_instance_id": member_instance or None,
                                "metadata": metadata})
        return {"throttle_time": 0, "error_code": 0, "generation_id": resp.generation_id,
                "protocol_type": CONSUMER, "protocol_name": protocol.name, "leader": resp.leader,
                "member_id": resp.member_id, "members": members}

    async def sync_group(self, req: Any, version: int, ctx: RequestContext) -> dict:
        resp = await self.servicer.SyncGroup(pb.SyncGroupRequest(
            group_id=req.group_id, generation_id=req.generation_id, member_id=req.member_id,
            group_instance_id=field(req, "group_instance_id") or ""), None)
        name = self._joined.get((req.group_id, req.member_id), (field(req, "protocol_name"), b"", ""))[0]
        user_data = await self._leader_user_data(req) if resp.error_code == 0 else None
        return {"throttle_time": 0, "error_code": resp.error_code, "protocol_type": CONSUMER,
                "protocol_name": name,
                "assignment": encode_assignment([(t.topic, list(t.partitions)) for t in resp.assignment], user_data)
                if resp.error_code == 0 else b""}

    async def _leader_user_data(self, req: Any) -> bytes | None:
        """The user_data the generation's leader gave `req.member_id`: recorded from the
        leader's own SyncGroup (its `assignments`); a follower's SyncGroup waits up to
        USER_DATA_WAIT_S for the leader's when the leader joined through this process.
        None when there is none."""
        known = self._user_data.get(req.group_id)
        if known is None or known.generation != req.generation_id:
            return None
        assignments = field(req, "assignments", None) or ()
        if assignments:
            known.by_member = {a.member_id: assignment_user_data(bytes(a.assignment)) for a in assignments}
            known.sent.set()
        elif req.member_id != known.leader and (req.group_id, known.leader) in self._joined:
            try:
                await self._wait_for(known.sent.wait(), USER_DATA_WAIT_S)
            except asyncio.TimeoutError:
                return None
        return known.by_member.get(req.member_id)

    async def heartbeat(self, req: Any, version: int, ctx: RequestContext) -> dict:
        resp = await self.servicer.Heartbeat(pb.HeartbeatRequest(
            group_id=req.group_id, generation_id=req.generation_id, member_id=req.member_id,
            group_instance_id=field(req, "group_instance_id") or ""), None)
        return {"throttle_time": 0, "error_code": resp.error_code}

    async def leave_group(self, req: Any, version: int, ctx: RequestContext) -> dict:
        members = field(req, "members", None)
        if members is None:
            members_in = [(req.member_id, "")]
        else:
            members_in = [(m.member_id, m.group_instance_id or "") for m in members]
        out, first = [], 0
        for member_id, instance in members_in:
            resp = await self.servicer.LeaveGroup(pb.LeaveGroupRequest(
                group_id=req.group_id, member_id=member_id, group_instance_id=instance), None)
            self._joined.pop((req.group_id, member_id), None)
            if not any(k[0] == req.group_id for k in self._joined):
                self._user_data.pop(req.group_id, None)
            first = first or resp.error_code
            out.append({"member_id": member_id, "group_instance_id": instance or None, "error_code": resp.error_code})
        if members is not None:  # v3+: member errors per member, the group's at the top
            first = next((m["error_code"] for m in out if m["error_code"] in _GROUP_ERRORS), 0)
        return {"throttle_time": 0, "error_code": first, "members": out}

    @staticmethod
    def _commit_topics(topics) -> list[pb.OffsetCommitTopic]:
        return [pb.OffsetCommitTopic(name=t.name, partitions=[
            pb.OffsetCommitPartition(partition=p.partition_index, committed_offset=p.committed_offset,
                                     committed_leader_epoch=field(p, "committed_leader_epoch", -1),
                                     metadata=field(p, "committed_metadata") or "") for p in t.partitions])
            for t in topics]

    @staticmethod
    def _commit_result(results) -> list[dict]:
        return [{"name": t.topic, "partitions": [{"partition_index": p.partition, "error_code": p.error_code}
                                                 for p in t.partitions]} for t in results]

    async def offset_commit(self, req: Any, version: int, ctx: RequestContext) -> dict:
        generation = field(req, "generation_id_or_member_epoch", None)
        if generation is None:
            generation = field(req, "generation_id", -1)
        resp = await self.servicer.OffsetCommit(pb.OffsetCommitRequest(
            group_id=req.group_id, generation_id=generation, member_id=field(req, "member_id", ""),
            group_instance_id=field(req, "group_instance_id") or "", topics=self._commit_topics(req.topics)), None)
        return {"throttle_time": 0, "topics": self._commit_result(resp.topics)}

    async def offset_fetch(self, req: Any, version: int, ctx: RequestContext) -> dict:
        topics = field(req, "topics", None)
        resp = await self.servicer.OffsetFetch(pb.OffsetFetchRequest(
            group_id=req.group_id, require_stable=field(req, "require_stable", False),
            topics=[pb.TopicPartitions(topic=t.name, partitions=list(t.partition_indexes)) for t in topics or ()]),
            None)
        return {"throttle_time": 0, "error_code": resp.error_code, "topics": [
            {"name": t.name, "partitions": [
                {"partition_index": p.partition, "committed_offset": p.committed_offset, "committed_leader_epoch": -1,
                 "metadata": p.metadata, "error_code": p.error_code} for p in t.partitions]} for t in resp.topics]}

    async def txn_offset_commit(self, req: Any, version: int, ctx: RequestContext) -> dict:
        resp = await self.servicer.TxnOffsetCommit(pb.TxnOffsetCommitRequest(
            transactional_id=req.transactional_id, group_id=req.group_id, producer_id=req.producer_id,
            producer_epoch=req.producer_epoch, generation_id=field(req, "generation_id", -1),
            member_id=field(req, "member_id", "") or "", group_instance_id=field(req, "group_instance_id") or "",
            topics=self._commit_topics(req.topics)), None)
        return {"throttle_time": 0, "topics": self._commit_result(resp.topics)}

    async def describe_groups(self, req: Any, version: int, ctx: RequestContext) -> dict:
        resp = await self.servicer.DescribeGroups(pb.DescribeGroupsRequest(groups=list(req.groups)), None)
        return {"throttle_time": 0, "groups": [
            {"error_code": g.error_code, "group_id": g.group_id, "group_state": g.group_state,
             "protocol_type": g.protocol_type, "protocol_data": g.protocol_name, "authorized_operations": -2147483648,
             "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id or None,
                          "client_id": "", "client_host": "",
                          "member_metadata": encode_subscription(list(m.subscription)),
                          "member_assignment": encode_assignment([(t.topic, list(t.partitions))
                                                                  for t in m.assignment])}
                         for m in g.members]} for g in resp.groups]}

    async def delete_groups(self, req: Any, version: int, ctx: RequestContext) -> dict:
        resp = await self.servicer.DeleteGroups(pb.DeleteGroupsRequest(groups_names=list(req.groups_names)), None)
        return {"throttle_time": 0, "results": [{"group_id": r.group_id, "error_code": r.error_code}
                                                for r in resp.results]}

    async def offset_delete(self, req: Any, version: int, ctx: RequestContext) -> dict:
        """OffsetDelete v0 (KIP-496) over the servicer's: the group's error at the top
        (GROUP_ID_NOT_FOUND, NOT_COORDINATOR, GROUP_AUTHORIZATION_FAILED, ...), each
        partition's (NONE, GROUP_SUBSCRIBED_TO_TOPIC, TOPIC_AUTHORIZATION_FAILED)."""
        resp = await self.servicer.OffsetDelete(pb.OffsetDeleteRequest(group_id=req.group_id, topics=[
            pb.TopicPartitions(topic=t.name, partitions=[p.partition_index for p in t.partitions])
            for t in req.topics]), None)
        codes = {(t.topic, p.partition): p.error_code for t in resp.topics for p in t.partitions}
        return {"throttle_time": 0, "error_code": resp.error_code, "topics": [
            {"name": t.name, "partitions": [{"partition_index": p.partition_index,
                                             "error_code": codes.get((t.name, p.partition_index), 0)}
                                            for p in t.partitions]} for t in req.topics]}
