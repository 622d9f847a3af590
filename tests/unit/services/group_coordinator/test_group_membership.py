"""Consumer group membership (services/group_coordinator/group.py): join, sync,
heartbeat, leave, session expiry, generations, range assignment. Pure; time is a
number the tests move by hand."""
from __future__ import annotations

import itertools
from collections import namedtuple

import pytest

from exactly_wire.error_codes import ErrorCode
from services.common.settings import GroupCoordinatorSchema
from services.group_coordinator.group import (
    GroupMetadata, GroupState, IllegalGroupTransitionError, range_assign,
    validate_offset_commit)

from .gc_fakes import group_settings

T0 = 1_000_000
SESSION = 10_000
REBALANCE = 30_000
COUNTS = {"orders": 6, "payments": 3}


def make_group(config: GroupCoordinatorSchema | None = None) -> GroupMetadata:
    ids = (f"m{i}" for i in itertools.count(1))
    return GroupMetadata("g", T0, config, new_member_id=lambda _instance: next(ids))


def join_new(group: GroupMetadata, topics=("orders",), now=T0, **kw) -> str:
    outcome = group.join("", topics, SESSION, REBALANCE, now, **kw)
    assert outcome.response is None, outcome.response
    return outcome.member_id


def stabilise(group: GroupMetadata, now=T0, counts=COUNTS):
    done = group.poll_rebalance(now, counts)
    assert done is not None
    group.store_completed(done.generation, ErrorCode.NONE, now)
    return done


def test_first_join_gets_member_id_and_generation_one():
    g = make_group()
    m = join_new(g)
    assert m == "m1"
    assert g.state is GroupState.PREPARING_REBALANCE
    done = g.poll_rebalance(T0, COUNTS)
    assert done.generation == 1
    assert g.state is GroupState.COMPLETING_REBALANCE
    resp = done.join_response(m)
    assert (resp.error, resp.generation_id, resp.leader, resp.protocol_name, resp.members) == \
        (ErrorCode.NONE, 1, "m1", "range", ("m1",))
    g.store_completed(1, ErrorCode.NONE, T0)
    assert g.state is GroupState.STABLE
    assert g.sync(m, 1, T0) == (ErrorCode.NONE, {"orders": [0, 1, 2, 3, 4, 5]})


def test_join_errors():
    g = make_group()
    assert g.join("", ["t"], 500, 0, T0).response.error == ErrorCode.INVALID_SESSION_TIMEOUT
    assert g.join("", ["t"], 1_800_001, 0, T0).response.error == ErrorCode.INVALID_SESSION_TIMEOUT
    assert g.join("nobody", ["t"], SESSION, 0, T0).response.error == ErrorCode.UNKNOWN_MEMBER_ID
    join_new(g)
    stabilise(g)
    other = g.join("", ["t"], SESSION, 0, T0, protocol_type="connect")
    assert other.response.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL


def test_group_max_size():
    g = make_group(group_settings({"group.max.size": 1}))
    join_new(g)
    assert g.join("", ["orders"], SESSION, 0, T0).response.error == ErrorCode.GROUP_MAX_SIZE_REACHED


def test_new_member_triggers_rebalance_and_waits_for_known_members():
    g = make_group()
    a = join_new(g)
    stabilise(g)
    b = join_new(g, now=T0 + 100)
    assert g.state is GroupState.PREPARING_REBALANCE
    assert g.heartbeat(a, 1, T0 + 200) == ErrorCode.REBALANCE_IN_PROGRESS
    assert g.sync(a, 1, T0 + 200) == (ErrorCode.REBALANCE_IN_PROGRESS, {})
    assert g.poll_rebalance(T0 + 300, COUNTS) is None  # a has not rejoined
    assert g.join(a, ["orders"], SESSION, REBALANCE, T0 + 400).response is None
    done = g.poll_rebalance(T0 + 400, COUNTS)
    assert done.generation == 2 and done.removed == ()
    assert done.join_response(a).leader == a  # the leader stays the leader
    g.store_completed(2, ErrorCode.NONE, T0 + 400)
    assert g.sync(a, 2, T0 + 500) == (ErrorCode.NONE, {"orders": [0, 1, 2]})
    assert g.sync(b, 2, T0 + 500) == (ErrorCode.NONE, {"orders": [3, 4, 5]})
    assert g.sync(a, 1, T0 + 500) == (ErrorCode.ILLEGAL_GENERATION, {})


def test_rebalance_timeout_removes_members_that_did_not_rejoin():
    g = make_group()
    a = join_new(g)
    stabilise(g)
    b = join_new(g, now=T0 + 1)
    assert g.poll_rebalance(T0 + REBALANCE, COUNTS) is None
    done = g.poll_rebalance(T0 + 1 + REBALANCE, COUNTS)
    assert done.removed == (a,)
    assert done.generation == 2 and done.join_response(b).leader == b
    assert done.join_response(a).error == ErrorCode.UNKNOWN_MEMBER_ID


def test_known_member_rejoin_with_same_subscription_gets_current_generation():
    g = make_group()
    a = join_new(g)
    stabilise(g)
    outcome = g.join(a, ["orders"], SESSION, REBALANCE, T0 + 5)
    assert outcome.response.error == ErrorCode.NONE
    assert outcome.response.generation_id == 1
    assert g.state is GroupState.STABLE


def test_rejoin_with_new_subscription_rebalances():
    g = make_group()
    a = join_new(g)
    stabilise(g)
    assert g.join(a, ["orders", "payments"], SESSION, REBALANCE, T0 + 5).response is None
    done = g.poll_rebalance(T0 + 5, COUNTS)
    assert done.generation == 2
    g.store_completed(2, ErrorCode.NONE, T0 + 5)
    assert g.sync(a, 2, T0 + 6)[1] == {"orders": [0, 1, 2, 3, 4, 5], "payments": [0, 1, 2]}


def test_sync_while_the_generation_is_being_stored():
    g = make_group()
    a = join_new(g)
    g.poll_rebalance(T0, COUNTS)
    assert g.sync(a, 1, T0) == (ErrorCode.REBALANCE_IN_PROGRESS, {})
    assert g.heartbeat(a, 1, T0) == ErrorCode.NONE


@pytest.mark.parametrize("member,generation,expected", [
    ("m1", 1, ErrorCode.NONE),
    ("m1", 0, ErrorCode.ILLEGAL_GENERATION),
    ("m1", 7, ErrorCode.ILLEGAL_GENERATION),
    ("ghost", 1, ErrorCode.UNKNOWN_MEMBER_ID),
])
def test_heartbeat_and_sync_errors(member, generation, expected):
    g = make_group()
    join_new(g)
    stabilise(g)
    assert g.heartbeat(member, generation, T0) == expected
    assert g.sync(member, generation, T0)[0] == expected


def test_session_expiry_removes_member_and_rebalances():
    g = make_group()
    a = join_new(g)
    b = join_new(g)
    stabilise(g)
    for t in range(T0 + 3000, T0 + SESSION, 3000):
        assert g.heartbeat(a, 1, t) == ErrorCode.NONE
        assert g.expire_members(t) == []
    assert g.expire_members(T0 + SESSION - 1) == []
    assert g.expire_members(T0 + SESSION) == [b]
    assert list(g.members) == [a]
    assert g.state is GroupState.PREPARING_REBALANCE
    assert g.heartbeat(a, 1, T0 + 30_001) == ErrorCode.REBALANCE_IN_PROGRESS
    g.join(a, ["orders"], SESSION, REBALANCE, T0 + 30_002)
    done = g.poll_rebalance(T0 + 30_002, COUNTS)
    assert done.generation == 2 and done.snapshot.members[0].member_id == a


def test_members_waiting_in_join_do_not_expire():
    g = make_group()
    a = join_new(g)
    b = join_new(g)
    stabilise(g)
    assert g.join(b, ["payments"], SESSION, 10 * SESSION, T0 + 1).response is None
    assert g.expire_members(T0 + 5 * SESSION) == [a]
    assert list(g.members) == [b]


def test_last_member_expiring_empties_the_group_with_a_new_generation():
    g = make_group()
    join_new(g)
    stabilise(g)
    assert g.expire_members(T0 + SESSION) == ["m1"]
    done = g.poll_rebalance(T0 + SESSION, COUNTS)
    assert done.generation == 2 and done.snapshot.members == ()
    assert g.state is GroupState.EMPTY
    assert g.heartbeat("m1", 2, T0 + SESSION) == ErrorCode.UNKNOWN_MEMBER_ID


def test_leave_group():
    g = make_group()
    a = join_new(g)
    b = join_new(g)
    stabilise(g)
    assert g.leave("ghost", T0) == ErrorCode.UNKNOWN_MEMBER_ID
    assert g.leave(a, T0) == ErrorCode.NONE
    assert g.state is GroupState.PREPARING_REBALANCE
    g.join(b, ["orders"], SESSION, REBALANCE, T0)
    assert g.poll_rebalance(T0, COUNTS).generation == 2
    g.store_completed(2, ErrorCode.NONE, T0)
    assert g.leave(b, T0) == ErrorCode.NONE
    assert g.poll_rebalance(T0, COUNTS).generation == 3
    assert g.state is GroupState.EMPTY


def test_generations_keep_rising_and_failed_store_rebalances_again():
    g = make_group()
    a = join_new(g)
    done = g.poll_rebalance(T0, COUNTS)
    g.store_completed(done.generation, ErrorCode.COORDINATOR_NOT_AVAILABLE, T0)
    assert g.state is GroupState.PREPARING_REBALANCE
    assert g.sync(a, 1, T0)[0] == ErrorCode.REBALANCE_IN_PROGRESS
    g.join(a, ["orders"], SESSION, REBALANCE, T0 + 1)
    assert g.poll_rebalance(T0 + 1, COUNTS).generation == 2
    g.store_completed(1, ErrorCode.NONE, T0 + 1)  # stale: ignored
    assert g.state is GroupState.COMPLETING_REBALANCE
    g.store_completed(2, ErrorCode.NONE, T0 + 1)
    assert g.state is GroupState.STABLE


def test_initial_rebalance_delay_waits_for_more_members():
    g = make_group(group_settings({"group.initial.rebalance.delay.ms": 3000}))
    join_new(g)
    assert g.poll_rebalance(T0 + 2000, COUNTS) is None
    join_new(g, now=T0 + 2000)  # extends the delay to T0 + 5000
    assert g.poll_rebalance(T0 + 4000, COUNTS) is None
    done = g.poll_rebalance(T0 + 5000, COUNTS)
    assert len(done.snapshot.members) == 2


def test_topic_partition_changes_are_noticed():
    g = make_group()
    join_new(g, topics=("orders", "later"))
    stabilise(g)
    assert not g.partition_counts_changed(COUNTS)
    assert g.partition_counts_changed({**COUNTS, "later": 2})
    assert g.partition_counts_changed({"orders": 7})


def test_snapshot_round_trip_restores_a_stable_group():
    g = make_group()
    a = join_new(g)
    join_new(g, topics=("orders", "payments"), group_instance_id="static-1")
    stabilise(g)
    restored = GroupMetadata.from_snapshot(g.snapshot(), T0 + 99)
    assert restored.snapshot() == g.snapshot()
    assert restored.state is GroupState.STABLE
    assert restored.members[a].last_heartbeat_ms == T0 + 99
    assert restored.sync(a, 1, T0 + 100) == g.sync(a, 1, T0 + 100)


def test_invalid_transition_is_a_bug():
    g = make_group()
    with pytest.raises(IllegalGroupTransitionError):
        g._transition_to(GroupState.STABLE, T0)  # Empty -> Stable skips a rebalance


# ---------------------------------------------------------------- offset commit checks

def _stable_group() -> GroupMetadata:
    g = make_group()
    join_new(g)
    stabilise(g)
    return g


def _preparing_group() -> GroupMetadata:
    g = _stable_group()
    g.prepare_rebalance(T0)
    return g


def _completing_group() -> GroupMetadata:
    g = _preparing_group()
    g.join("m1", ["orders"], SESSION, REBALANCE, T0)
    g.poll_rebalance(T0, COUNTS)
    return g


def _empty_group() -> GroupMetadata:
    g = _stable_group()
    g.leave("m1", T0)
    g.poll_rebalance(T0, COUNTS)
    return g


@pytest.mark.parametrize("make,member,generation,transactional,expected", [
    (lambda: None, "", -1, False, ErrorCode.NONE),
    (lambda: None, "", 3, False, ErrorCode.ILLEGAL_GENERATION),
    (lambda: None, "", -1, True, ErrorCode.NONE),
    (lambda: None, "", 3, True, ErrorCode.ILLEGAL_GENERATION),
    (lambda: None, "m9", -1, True, ErrorCode.UNKNOWN_MEMBER_ID),
    (_empty_group, "", -1, False, ErrorCode.NONE),
    (_empty_group, "", -1, True, ErrorCode.NONE),
    (_empty_group, "m1", 1, True, ErrorCode.ILLEGAL_GENERATION),
    (_stable_group, "m1", 1, False, ErrorCode.NONE),
    (_stable_group, "m1", 0, False, ErrorCode.ILLEGAL_GENERATION),
    (_stable_group, "", -1, False, ErrorCode.UNKNOWN_MEMBER_ID),
    (_stable_group, "ghost", 1, False, ErrorCode.UNKNOWN_MEMBER_ID),
    (_stable_group, "m1", 1, True, ErrorCode.NONE),
    (_stable_group, "", -1, True, ErrorCode.NONE),
    (_stable_group, "m1", 0, True, ErrorCode.ILLEGAL_GENERATION),
    (_stable_group, "ghost", 1, True, ErrorCode.UNKNOWN_MEMBER_ID),
    (_preparing_group, "m1", 1, False, ErrorCode.NONE),
    (_completing_group, "m1", 2, False, ErrorCode.REBALANCE_IN_PROGRESS),
    (_completing_group, "m1", 1, True, ErrorCode.ILLEGAL_GENERATION),
])
def test_validate_offset_commit(make, member, generation, transactional, expected):
    assert validate_offset_commit(make(), member, generation, transactional) == expected


# ---------------------------------------------------------------- range assignment

@pytest.mark.parametrize("subscriptions,counts,expected", [
    ({"c0": ["t0", "t1"], "c1": ["t0", "t1"]}, {"t0": 3, "t1": 3},
     {"c0": {"t0": [0, 1], "t1": [0, 1]}, "c1": {"t0": [2], "t1": [2]}}),
    ({"b": ["t"], "a": ["t"], "c": ["t"]}, {"t": 7},
     {"a": {"t": [0, 1, 2]}, "b": {"t": [3, 4]}, "c": {"t": [5, 6]}}),
    ({"a": ["t"], "b": ["t"], "c": ["t"]}, {"t": 2},
     {"a": {"t": [0]}, "b": {"t": [1]}, "c": {}}),
    ({"a": ["t", "u"], "b": ["u"]}, {"t": 2, "u": 4},
     {"a": {"t": [0, 1], "u": [0, 1]}, "b": {"u": [2, 3]}}),
    ({"a": ["missing"]}, {}, {"a": {}}),
    ({}, {"t": 3}, {}),
])
def test_range_assign(subscriptions, counts, expected):
    assert range_assign(subscriptions, counts) == expected


def test_range_assign_orders_static_members_first_by_instance_id():
    got = range_assign({"a": ["t"], "b": ["t"], "z": ["t"]}, {"t": 3}, {"z": "inst-0", "b": "inst-1"})
    assert got == {"z": {"t": [0]}, "b": {"t": [1]}, "a": {"t": [2]}}


_Member = namedtuple("_Member", "member_id group_instance_id metadata")
_Meta = namedtuple("_Meta", "topics")


class _Cluster:
    def __init__(self, counts):
        self.counts = counts

    def partitions_for_topic(self, topic):
        n = self.counts.get(topic)
        return set(range(n)) if n else None


@pytest.mark.parametrize("n_members,counts", [
    (1, {"a": 1}), (2, {"a": 5, "b": 2}), (3, {"a": 10, "b": 1, "c": 3}), (5, {"a": 3}), (4, {"x": 16, "y": 9}),
])
def test_range_assign_matches_kafka_python(n_members, counts):
    """Cross-check with kafka-python's RangePartitionAssignor (Kafka's RangeAssignor)."""
    from kafka.coordinator.assignors.range import RangePartitionAssignor

    topics = sorted(counts)
    subs = {f"consumer-{i}": topics[: 1 + i % len(topics)] for i in range(n_members)}
    ours = range_assign(subs, counts)
    members = [_Member(m, None, _Meta(t)) for m, t in subs.items()]
    theirs = RangePartitionAssignor.assign(_Cluster(counts), members)
    for member_id, assignment in theirs.items():
        expected = {t: list(p) for t, p in assignment.assignment if p}
        assert ours[member_id] == expected
