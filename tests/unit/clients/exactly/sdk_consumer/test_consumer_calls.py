"""The Consumer's calls beyond poll: unsubscribe, pause / resume / paused,
get_watermark_offsets, beginning / end offsets, offsets_for_times, asynchronous
commits with callbacks, pattern subscriptions, on_lost and static membership in
GroupMembership. Pure parts directly, the rest against exactly.testing.MockCluster."""
from __future__ import annotations

import re

import pytest

from exactly import errors
from exactly._consumer_group import GroupMembership, MemberState
from exactly._consumer_state import SubscriptionState, matching_topics
from exactly._fetcher import list_offsets_request, parse_list_offsets
from exactly.consumer import OFFSET_INVALID, Consumer, _pattern_of
from exactly.types import OffsetAndMetadata, OffsetAndTimestamp, TopicPartition
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb

from .test_consumer_group import core_of, join
from .test_consumer_poll import poll_all

A = TopicPartition("t", 0)
B = TopicPartition("t", 1)


@pytest.fixture
def consumer_defaults() -> dict:
    """Consumers here start at the earliest offset unless told otherwise."""
    return {"auto_offset_reset": "earliest"}


# ---------------------------------------------------------------- pure parts

def test_pattern_subscriptions_match_from_the_start_and_skip_internal_topics():
    p = re.compile("^orders-.*")
    assert matching_topics(p, ["orders-eu", "orders-us", "x-orders-1", "__consumer_offsets"]) == \
        ("orders-eu", "orders-us")
    assert matching_topics(re.compile("^_.*"), ["__transaction_state", "_private"]) == ("_private",)
    assert _pattern_of("^a.*").pattern == "^a.*"
    assert _pattern_of(["^a"]).pattern == "^a"
    assert _pattern_of(p) is p
    assert _pattern_of(["a", "b"]) is None and _pattern_of("a") is None
    with pytest.raises(ValueError):
        _pattern_of(["^a", "b"])
    with pytest.raises(ValueError):
        _pattern_of("^(")


def test_subscription_state_pattern_pause_and_unsubscribe():
    subs = SubscriptionState()
    subs.subscribe_pattern(re.compile("^t"))
    assert subs.subscription == ()
    assert subs.update_pattern_topics(["t", "u", "t2"]) and subs.subscription == ("t", "t2")
    assert not subs.update_pattern_topics(["t2", "t"])
    subs.assign_from_group([A, B])
    subs.state(A).seek(5)
    subs.state(B).seek(7)
    subs.pause([A])
    assert subs.paused() == {A}
    assert subs.fetchable(0) == [B]
    assert subs.positions() == {A: 5, B: 7}  # paused partitions are still committed
    with pytest.raises(errors.IllegalStateError):
        subs.pause([A, TopicPartition("x", 0)])
    subs.resume([A])
    assert subs.paused() == set() and subs.fetchable(0) == [A, B]
    subs.unsubscribe()
    assert (subs.subscription, subs.pattern, subs.assignment) == (None, None, {})
    subs.assign_from_user([A])  # allowed again


def test_list_offsets_request_and_answer():
    req = list_offsets_request({B: -1, A: 1000}, 1)
    assert req.isolation_level == 1
    assert [(t.name, [(p.partition, p.timestamp) for p in t.partitions]) for t in req.topics] == \
        [("t", [(0, 1000), (1, -1)])]
    resp = pb.ListOffsetsResponse(topics=[pb.ListOffsetsTopicResponse(name="t", partitions=[
        pb.ListOffsetsPartitionResponse(partition=0, offset=4, timestamp=1001),
        pb.ListOffsetsPartitionResponse(partition=1, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER),
        pb.ListOffsetsPartitionResponse(partition=2, offset=9)])])
    found, failed = parse_list_offsets(resp, [A, B])
    assert found == {A: (4, 1001)}
    assert isinstance(failed[B], errors.NotLeaderOrFollowerError)


# ---------------------------------------------------------------- GroupMembership

@pytest.fixture
def env(cluster):
    """(the cluster, a static member "i-1" of group "g" on it)."""
    core = core_of(cluster)
    yield cluster, GroupMembership(core, "g", group_instance_id="i-1", backoff_ms=0, backoff_max_ms=1000)
    core.close()


def test_static_member_requests_carry_the_instance_id_and_close_sends_no_leave_group(env):
    cluster, member = env
    join(member)
    member.heartbeat_once()
    member.commit_sync({A: OffsetAndMetadata(1)}, managed=True, timeout_s=5)
    for rpc in ("JoinGroup", "SyncGroup", "Heartbeat", "OffsetCommit"):
        assert cluster.requests_of(rpc)[-1].group_instance_id == "i-1", rpc
    member.close()
    assert cluster.requests_of("LeaveGroup") == []
    assert member.state is MemberState.UNJOINED


@pytest.mark.parametrize("code", [ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION])
def test_a_generation_ended_by_the_coordinator_means_lost_partitions(env, code):
    cluster, member = env
    join(member)
    assert not member.take_lost()
    cluster.fail_next("Heartbeat", code)
    member.heartbeat_once()
    assert member.needs_join() and member.generation()[0] == -1
    assert member.take_lost() and not member.take_lost()


def test_a_rebalance_is_not_a_loss(env):
    cluster, member = env
    join(member)
    cluster.fail_next("Heartbeat", ErrorCode.REBALANCE_IN_PROGRESS)
    member.heartbeat_once()
    assert member.needs_join() and not member.take_lost()


def test_fenced_instance_id_is_fatal_and_permanent(env):
    cluster, member = env
    join(member)
    cluster.fail_next("Heartbeat", ErrorCode.FENCED_INSTANCE_ID)
    member.heartbeat_once()
    assert member.take_lost()
    for _ in range(2):
        with pytest.raises(errors.FencedInstanceIdError):
            member.advance()


# ---------------------------------------------------------------- the Consumer

def test_pause_keeps_the_position_and_resume_continues(make, logs):
    logs.plain("t", 0, b"a0", b"a1")
    logs.plain("t", 1, b"b0", b"b1")
    c = make()
    c.assign([A, B])
    c.pause([A])
    assert c.paused() == {A}
    got = poll_all(c)
    assert [r.value for r in got] == [b"b0", b"b1"]
    assert c.position(A) == 0 and c.assignment() == {A, B}
    c.resume([A])
    assert [r.value for r in poll_all(c)] == [b"a0", b"a1"]
    with pytest.raises(errors.IllegalStateError):
        c.pause([TopicPartition("other", 0)])


def test_offsets_of_the_log(make, logs):
    logs.plain("t", 0, b"a", b"b", b"c", timestamps=[1000, 2000, 3000])
    logs.begin("open")
    logs.in_txn("open", "t", 0, b"open")  # an open transaction at offset 3
    c = make(isolation_level="read_committed")
    assert c.beginning_offsets([A]) == {A: 0}
    assert c.end_offsets([A]) == {A: 3}          # the LSO
    assert c.get_watermark_offsets(A) == (0, 4)  # the high watermark
    assert c.get_watermark_offsets(A, cached=True) == (OFFSET_INVALID, OFFSET_INVALID)
    c.assign([A])
    poll_all(c, 3)
    assert c.get_watermark_offsets(A, cached=True) == (0, 4)
    assert c.offsets_for_times({A: 1500}) == {A: OffsetAndTimestamp(1, 2000)}
    assert c.offsets_for_times({A: 2 ** 50}) == {A: None}
    with pytest.raises(ValueError):
        c.offsets_for_times({A: -1})
    u = make()
    assert u.end_offsets([A]) == {A: 4}


def test_offsets_of_the_log_time_out_without_a_leader(cluster, make, logs):
    logs.plain("t", 0, b"a")
    cluster.take_down("leader-0")
    c = make()
    with pytest.raises(errors.KafkaTimeoutError):
        c.end_offsets([A], timeout=1)


def test_async_commit_callbacks_run_on_the_next_poll_in_order(cluster, make, logs):
    logs.plain("t", 0, b"a", b"b")
    c = make(group_id="g")
    c.subscribe(["t"])
    assert len(poll_all(c)) == 2
    seen = []
    c.commit(asynchronous=True, callback=lambda err, offsets: seen.append((err, offsets)))
    cluster.fail_next("OffsetCommit", ErrorCode.ILLEGAL_GENERATION)
    c.commit({A: 1}, asynchronous=True, callback=lambda err, offsets: seen.append((err, offsets)))
    assert seen == []  # not from the thread that answered
    c.poll(0)
    assert seen[0] == (None, {A: OffsetAndMetadata(2), B: OffsetAndMetadata(0)})
    assert isinstance(seen[1][0], errors.IllegalGenerationError) and seen[1][1] == {A: OffsetAndMetadata(1)}
    assert cluster.committed_offsets("g") == {A: 2, B: 0}
    sync = []
    c.commit({A: 2}, callback=lambda err, offsets: sync.append(err))
    assert sync == [None]


def test_unsubscribe_revokes_leaves_and_allows_assign(cluster, make, logs):
    logs.plain("t", 0, b"a")
    events = []
    c = make(group_id="g", enable_auto_commit=True)
    c.subscribe(["t"], on_revoke=lambda tps: events.append(("revoke", tps)))
    assert len(poll_all(c)) == 1
    member = c.group_metadata().member_id
    c.unsubscribe()
    assert events == [("revoke", [A, B])]
    assert cluster.committed_offsets("g") == {A: 1, B: 0}
    assert cluster.requests_of("LeaveGroup")[-1].member_id == member
    assert c.assignment() == set()
    with pytest.raises(errors.IllegalStateError):
        c.poll(0)
    c.assign([A])
    assert c.position(A) == 1


def test_lost_partitions_call_on_lost_and_commit_nothing(cluster, clock, make, logs):
    logs.plain("t", 0, b"a")
    events = []
    c = make(group_id="g", enable_auto_commit=True)
    c.subscribe(["t"], on_revoke=lambda tps: events.append(("revoke", tps)),
                on_lost=lambda tps: events.append(("lost", tps)),
                on_assign=lambda tps: events.append(("assign", tps)))
    assert len(poll_all(c)) == 1
    clock.advance(11_000)  # ms: past session.timeout.ms without a heartbeat: the coordinator drops the member
    assert c._group.heartbeat_once() == ErrorCode.UNKNOWN_MEMBER_ID
    c.poll(0.05)
    assert events == [("assign", [A, B]), ("lost", [A, B]), ("assign", [A, B])]
    assert cluster.committed_offsets("g") == {}
    assert cluster.requests_of("JoinGroup")[-1].member_id == ""


def test_pattern_subscription_rejoins_when_a_matching_topic_appears(cluster, make):
    cluster.create_topic("u")
    c = make(group_id="g", metadata_max_age_ms=100)  # looks for new matching topics every 100 ms
    c.subscribe("^t.*")
    poll_all(c, 3)
    assert list(cluster.requests_of("JoinGroup")[-1].topics) == ["t"]
    generation = c.group_metadata().generation_id
    cluster.create_topic("t2")
    cluster.create_topic("__consumer_offsets")  # internal: never subscribed to
    for _ in range(50):
        c.poll(0.05)
        if TopicPartition("t2", 0) in c.assignment():
            break
    assert [list(r.topics) for r in cluster.requests_of("JoinGroup")][-1] == ["t", "t2"]
    assert c.group_metadata().generation_id == generation + 1
