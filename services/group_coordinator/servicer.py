"""exactly.v1.GroupCoordinator on grpc.aio: adapts protobuf messages to
GroupCoordinator (coordinator.py) calls and back. No logic of its own.

JoinGroup is answered asynchronously: the call stays open until the rebalance
completes (every known member rejoined, or the rebalance timeout passed), so
clients should give it a deadline above the rebalance timeout.
"""
from __future__ import annotations

from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.common.security import authz
from services.common.security.acl import Operation as Op, Resource, ResourceType
from services.common.security.auth import current_principal
from services.common.security.pid_binding import ProducerIdBindings

from .coordinator import GroupCoordinator
from .group import UNKNOWN_GENERATION
from .offsets import FetchedOffset, OffsetAndMetadata


def _name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


def _message(code: int) -> str:
    return "" if code == ErrorCode.NONE else _name(code)


def _topic_results(results: dict[TopicPartition, ErrorCode]) -> list[pb.TopicResult]:
    by_topic: dict[str, list[pb.PartitionResult]] = {}
    for tp, code in sorted(results.items()):
        by_topic.setdefault(tp.topic, []).append(pb.PartitionResult(
            partition=tp.partition, error_code=code, error_message=_message(code)))
    return [pb.TopicResult(topic=t, partitions=parts) for t, parts in by_topic.items()]


def _generation(generation_id: int, member_id: str) -> int:
    """proto3 has no field defaults: generation 0 with no member id is a request
    that did not set the field, i.e. Kafka's default -1 (no group metadata)."""
    return UNKNOWN_GENERATION if generation_id == 0 and not member_id else generation_id


def _offsets(topics) -> dict[TopicPartition, OffsetAndMetadata]:
    return {TopicPartition(t.name, p.partition): OffsetAndMetadata(p.committed_offset, p.metadata,
                                                                   p.committed_leader_epoch)
            for t in topics for p in t.partitions}


class GroupCoordinatorServicer(pbg.GroupCoordinatorServicer):
    """Thin adapter; every outcome travels as an error code in the response."""

    def __init__(self, coordinator: GroupCoordinator, bindings: ProducerIdBindings | None = None):
        """bindings: with the authorizer on, TxnOffsetCommit's producer id must be bound
        to the caller and the transactional.id (services/common/security/pid_binding.py)."""
        self.coordinator = coordinator
        self.bindings = bindings

    async def JoinGroup(self, request, context):
        r = await self.coordinator.join_group(
            request.group_id, request.member_id, list(request.topics), request.session_timeout_ms,
            request.rebalance_timeout_ms, request.protocol_type or "consumer", request.group_instance_id)
        return pb.JoinGroupResponse(error_code=r.error, error_message=_message(r.error),
                                    generation_id=r.generation_id, protocol_name=r.protocol_name,
                                    leader=r.leader, member_id=r.member_id, members=list(r.members))

    async def SyncGroup(self, request, context):
        code, assignment = await self.coordinator.sync_group(request.group_id, request.generation_id,
                                                             request.member_id, request.group_instance_id)
        return pb.SyncGroupResponse(
            error_code=code, error_message=_message(code),
            assignment=[pb.TopicPartitions(topic=t, partitions=p) for t, p in sorted(assignment.items())])

    async def Heartbeat(self, request, context):
        code = await self.coordinator.heartbeat(request.group_id, request.generation_id, request.member_id,
                                                request.group_instance_id)
        return pb.HeartbeatResponse(error_code=code)

    async def LeaveGroup(self, request, context):
        code = await self.coordinator.leave_group(request.group_id, request.member_id,
                                                  request.group_instance_id)
        return pb.LeaveGroupResponse(error_code=code)

    async def OffsetCommit(self, request, context):
        results = await self.coordinator.commit_offsets(
            request.group_id, _generation(request.generation_id, request.member_id), request.member_id,
            _offsets(request.topics), request.group_instance_id)
        return pb.OffsetCommitResponse(topics=_topic_results(results))

    async def OffsetFetch(self, request, context):
        partitions = [TopicPartition(t.topic, p) for t in request.topics for p in t.partitions] or None
        top, fetched = await self.coordinator.fetch_offsets(request.group_id, partitions,
                                                            request.require_stable)
        if not fetched and partitions and top != ErrorCode.NONE:
            # A group-level error also marks every requested partition, for
            # clients that only read the per-partition codes.
            fetched = {tp: FetchedOffset(-1, "", top) for tp in partitions}
        if partitions is None:  # all the group's partitions: only the topics the caller may Describe, as Kafka
            fetched = {tp: f for tp, f in fetched.items()
                       if authz.visible(Op.DESCRIBE, Resource(ResourceType.TOPIC, tp.topic))}
        by_topic: dict[str, list[pb.OffsetFetchPartition]] = {}
        for tp, f in sorted(fetched.items()):
            by_topic.setdefault(tp.topic, []).append(pb.OffsetFetchPartition(
                partition=tp.partition, committed_offset=f.offset, metadata=f.metadata, error_code=f.error))
        return pb.OffsetFetchResponse(error_code=top, topics=[
            pb.OffsetFetchTopic(name=t, partitions=parts) for t, parts in by_topic.items()])

    async def TxnOffsetCommit(self, request, context):
        if self.bindings is not None:
            code, why = await self.bindings.check(request.producer_id, current_principal.get(),
                                                  request.transactional_id, transactional=True)
            if code != ErrorCode.NONE:
                if code == ErrorCode.NOT_ENOUGH_REPLICAS:  # not checked: retriable for TxnOffsetCommit
                    code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
                return pb.TxnOffsetCommitResponse(topics=[pb.TopicResult(topic=t.name, partitions=[
                    pb.PartitionResult(partition=p.partition, error_code=code, error_message=why)
                    for p in t.partitions]) for t in request.topics])
        results = await self.coordinator.txn_commit_offsets(
            request.transactional_id, request.group_id, request.producer_id, request.producer_epoch,
            _generation(request.generation_id, request.member_id), request.member_id,
            _offsets(request.topics), request.group_instance_id, request.group_aware_producer)
        return pb.TxnOffsetCommitResponse(topics=_topic_results(results))

    async def ListGroups(self, request, context):
        code, groups = self.coordinator.list_groups(request.states_filter)
        return pb.ListGroupsResponse(error_code=code, groups=[
            pb.ListedGroup(group_id=g.group_id, protocol_type=g.protocol_type, group_state=g.state) for g in groups
            if authz.visible(Op.DESCRIBE, Resource(ResourceType.GROUP, g.group_id))])

    async def DescribeGroups(self, request, context):
        resp = pb.DescribeGroupsResponse()
        for group_id in request.groups:
            d = self.coordinator.describe_group(group_id)
            resp.groups.add(
                error_code=d.error, error_message=_message(d.error), group_id=d.group_id, group_state=d.state,
                protocol_type=d.protocol_type, protocol_name=d.protocol_name, generation_id=d.generation,
                leader=d.leader, members=[pb.DescribedGroupMember(
                    member_id=m.member_id, group_instance_id=m.group_instance_id, subscription=list(m.subscription),
                    assignment=[pb.TopicPartitions(topic=t, partitions=list(ps)) for t, ps in m.assignment.items()])
                    for m in d.members])
        return resp

    async def OffsetDelete(self, request, context):
        code, results = await self.coordinator.delete_offsets(
            request.group_id, [TopicPartition(t.topic, p) for t in request.topics for p in t.partitions])
        return pb.OffsetDeleteResponse(error_code=code, error_message=_message(code), topics=_topic_results(results))

    async def DeleteGroups(self, request, context):
        results = await self.coordinator.delete_groups(list(request.groups_names))
        return pb.DeleteGroupsResponse(results=[
            pb.DeletableGroupResult(group_id=g, error_code=code, error_message=_message(code))
            for g, code in results.items()])
