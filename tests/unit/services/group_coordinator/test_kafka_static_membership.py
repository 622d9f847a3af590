"""Static membership (KIP-345) through the Kafka adapter of the group coordinator
(services.group_coordinator.kafka_api): group_instance_id reaches the servicer on
JoinGroup v5+, SyncGroup, Heartbeat, LeaveGroup v3+ members and OffsetCommit; the
leader's JoinGroup answer names the members' instance ids; LeaveGroup v3+ answers
member errors per member and the group's at the top level."""
from __future__ import annotations

import asyncio

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb

from services.common.kafka import codec
from services.group_coordinator.kafka_api import (HEARTBEAT, JOIN_GROUP, LEAVE_GROUP, OFFSET_COMMIT, SYNC_GROUP,
                                                  GroupCoordinatorApis, encode_subscription)


class RecordingServicer:
    """Answers as a coordinator would for two static members "m-a" (leader, "a") and
    "m-b" ("b"); records every request."""

    def __init__(self, leave_error: ErrorCode = ErrorCode.NONE):
        self.calls: list = []
        self.leave_error = leave_error

    async def JoinGroup(self, req, ctx):
        self.calls.append(req)
        member = {"a": "m-a", "b": "m-b"}[req.group_instance_id]
        return pb.JoinGroupResponse(error_code=0, generation_id=3, protocol_name="range", leader="m-a",
                                    member_id=member, members=["m-a", "m-b"])

    async def SyncGroup(self, req, ctx):
        self.calls.append(req)
        return pb.SyncGroupResponse(error_code=ErrorCode.FENCED_INSTANCE_ID)

    async def Heartbeat(self, req, ctx):
        self.calls.append(req)
        return pb.HeartbeatResponse(error_code=ErrorCode.FENCED_INSTANCE_ID)

    async def LeaveGroup(self, req, ctx):
        self.calls.append(req)
        code = self.leave_error or (ErrorCode.NONE if req.group_instance_id == "a" else ErrorCode.UNKNOWN_MEMBER_ID)
        return pb.LeaveGroupResponse(error_code=code)

    async def OffsetCommit(self, req, ctx):
        self.calls.append(req)
        return pb.OffsetCommitResponse()


def request(key: int, version: int, fields: dict):
    return codec.build(codec.request_class(key, version), fields)


def handle(apis: GroupCoordinatorApis, key: int, version: int, fields: dict) -> dict:
    return asyncio.run(apis.handlers()[key](request(key, version, fields), version, None))


def join(instance: str) -> dict:
    return {"group_id": "g", "session_timeout": 30000, "rebalance_timeout": 30000, "member_id": "",
            "group_instance_id": instance, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": encode_subscription(["orders"])}]}


def test_instance_ids_reach_the_coordinator_and_the_leader_sees_them():
    servicer = RecordingServicer()
    apis = GroupCoordinatorApis(servicer)
    handle(apis, JOIN_GROUP, 5, join("b"))
    leader = handle(apis, JOIN_GROUP, 5, join("a"))
    assert [c.group_instance_id for c in servicer.calls] == ["b", "a"]
    assert [(m["member_id"], m["group_instance_id"]) for m in leader["members"]] == [("m-a", "a"), ("m-b", "b")]

    assert handle(apis, SYNC_GROUP, 3, {"group_id": "g", "generation_id": 3, "member_id": "old",
                                        "group_instance_id": "a", "assignments": []})["error_code"] == \
        ErrorCode.FENCED_INSTANCE_ID
    assert handle(apis, HEARTBEAT, 3, {"group_id": "g", "generation_id": 3, "member_id": "old",
                                       "group_instance_id": "a"})["error_code"] == ErrorCode.FENCED_INSTANCE_ID
    handle(apis, OFFSET_COMMIT, 7, {"group_id": "g", "generation_id": 3, "member_id": "m-a",
                                    "group_instance_id": "a", "topics": []})
    assert [c.group_instance_id for c in servicer.calls[2:]] == ["a", "a", "a"]


def test_leave_group_v3_names_members_by_instance_id():
    servicer = RecordingServicer()
    resp = handle(GroupCoordinatorApis(servicer), LEAVE_GROUP, 4, {"group_id": "g", "members": [
        {"member_id": "", "group_instance_id": "a"}, {"member_id": "", "group_instance_id": "z"}]})
    assert [(c.member_id, c.group_instance_id) for c in servicer.calls] == [("", "a"), ("", "z")]
    assert resp["error_code"] == 0
    assert [(m["group_instance_id"], m["error_code"]) for m in resp["members"]] == \
        [("a", ErrorCode.NONE), ("z", ErrorCode.UNKNOWN_MEMBER_ID)]


def test_leave_group_v3_answers_a_group_error_at_the_top():
    resp = handle(GroupCoordinatorApis(RecordingServicer(ErrorCode.NOT_COORDINATOR)), LEAVE_GROUP, 3,
                  {"group_id": "g", "members": [{"member_id": "", "group_instance_id": "a"}]})
    assert resp["error_code"] == ErrorCode.NOT_COORDINATOR
