"""The group coordinator's Kafka SyncGroup passes the user_data the leader put in each
member's ConsumerProtocolAssignment on to that member, with the coordinator's own
partitions (services.group_coordinator.kafka_api; assignors such as faust's keep
their state there)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from kio.schema.consumer_protocol_assignment.v0.data import ConsumerProtocolAssignment
from kio.serial import entity_reader

from exactly_wire.v1 import exactly_pb2 as pb
from services.group_coordinator import kafka_api
from services.group_coordinator.kafka_api import GroupCoordinatorApis, encode_assignment, encode_subscription

COORDINATOR_ASSIGNMENT = {"leader": [0, 1], "follower": [2]}


class Servicer:
    """JoinGroup puts every member in generation 3 led by `leader`; SyncGroup answers
    the coordinator's range assignment (COORDINATOR_ASSIGNMENT)."""

    def __init__(self, leader: str = "leader"):
        self.leader = leader

    async def JoinGroup(self, req, context):
        return pb.JoinGroupResponse(generation_id=3, member_id=req.member_id, leader=self.leader,
                                    members=["leader", "follower"])

    async def SyncGroup(self, req, context):
        return pb.SyncGroupResponse(assignment=[pb.TopicPartitions(topic="in", partitions=COORDINATOR_ASSIGNMENT[
            req.member_id])])


def join(member: str):
    return SimpleNamespace(group_id="g", member_id=member, protocol_type="consumer", session_timeout=10000,
                           rebalance_timeout=10000, group_instance_id=None,
                           protocols=[SimpleNamespace(name="faust", metadata=encode_subscription(["in"]))])


def sync(member: str, assignments: dict[str, bytes] | None = None):
    return SimpleNamespace(group_id="g", generation_id=3, member_id=member, group_instance_id=None,
                           protocol_name="faust", assignments=[
                               SimpleNamespace(member_id=m, assignment=a) for m, a in (assignments or {}).items()])


def decoded(answer: dict) -> tuple[list[tuple[str, list[int]]], bytes | None]:
    value, _ = entity_reader(ConsumerProtocolAssignment)(answer["assignment"], 2)
    return ([(t.topic, list(t.partitions)) for t in value.assigned_partitions],
            None if value.user_data is None else bytes(value.user_data))


def leader_assignments() -> dict[str, bytes]:
    # What the leader's own assignor decided (ignored) and its user_data (passed on).
    return {"leader": encode_assignment([("in", [0])], b"state-of-leader"),
            "follower": encode_assignment([("in", [1, 2])], b"state-of-follower")}


def test_each_member_gets_the_user_data_the_leader_gave_it_with_the_coordinators_partitions():
    async def run():
        apis = GroupCoordinatorApis(Servicer())
        for m in ("leader", "follower"):
            await apis.join_group(join(m), 5, None)
        leader = await apis.sync_group(sync("leader", leader_assignments()), 3, None)
        follower = await apis.sync_group(sync("follower"), 3, None)
        return decoded(leader), decoded(follower)
    leader, follower = asyncio.run(run())
    assert leader == ([("in", [0, 1])], b"state-of-leader")
    assert follower == ([("in", [2])], b"state-of-follower")


def test_a_follower_that_syncs_first_waits_for_the_leaders_sync():
    async def run():
        apis = GroupCoordinatorApis(Servicer())
        for m in ("leader", "follower"):
            await apis.join_group(join(m), 5, None)
        follower = asyncio.create_task(apis.sync_group(sync("follower"), 3, None))
        await asyncio.sleep(0)  # let it reach the wait
        assert not follower.done()
        await apis.sync_group(sync("leader", leader_assignments()), 3, None)
        return decoded(await asyncio.wait_for(follower, 5))
    assert asyncio.run(run()) == ([("in", [2])], b"state-of-follower")


class Elapsing:
    """A wait_for whose timeout passes before anything else happens; records the
    timeouts it was given (seconds)."""

    def __init__(self):
        self.timeouts: list[float] = []

    async def __call__(self, awaitable, timeout: float):
        self.timeouts.append(timeout)
        awaitable.close()
        raise asyncio.TimeoutError


def test_without_the_leaders_sync_the_follower_gets_its_partitions_without_user_data():
    elapsing = Elapsing()

    async def run():
        apis = GroupCoordinatorApis(Servicer(), wait_for=elapsing)
        for m in ("leader", "follower"):
            await apis.join_group(join(m), 5, None)
        return decoded(await asyncio.wait_for(apis.sync_group(sync("follower"), 3, None), 5))
    assert asyncio.run(run()) == ([("in", [2])], None)
    assert elapsing.timeouts == [kafka_api.USER_DATA_WAIT_S]  # it waited that long for the leader's


def test_a_leader_that_did_not_join_over_kafka_is_not_waited_for():
    """A leader that joined over gRPC (an exactly SDK member) never sends a Kafka
    SyncGroup: the follower is answered at once."""
    elapsing = Elapsing()

    async def run():
        apis = GroupCoordinatorApis(Servicer(leader="sdk-member"), wait_for=elapsing)
        await apis.join_group(join("follower"), 5, None)
        return decoded(await asyncio.wait_for(apis.sync_group(sync("follower"), 3, None), 5))
    assert asyncio.run(run()) == ([("in", [2])], None)
    assert elapsing.timeouts == []  # no wait at all


@pytest.mark.parametrize("garbage", [b"", b"\x00", b"\x00\x00\xff\xff\xff"])
def test_an_unreadable_leader_assignment_gives_no_user_data(garbage):
    assert kafka_api.assignment_user_data(garbage) is None
