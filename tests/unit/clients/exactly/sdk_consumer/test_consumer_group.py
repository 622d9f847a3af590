"""Group membership state machine (join -> sync -> stable -> rejoin), heartbeat
answers, and offset commit / fetch retries, against exactly.testing.MockCluster's group
coordinator and the answers it is told to give."""
from __future__ import annotations


import pytest

from exactly import errors
from exactly._client import ClientCore
from exactly._consumer_group import GroupMembership, MemberState, parse_offset_fetch
from exactly.config import ConsumerSchema
from exactly.testing import MockTime
from exactly_wire.config import parse
from exactly_wire.error_codes import ErrorCode
from exactly.types import OffsetAndMetadata, TopicPartition
from exactly_wire.v1 import exactly_pb2 as pb

A = TopicPartition("t", 0)
B = TopicPartition("t", 1)


def core_of(cluster) -> ClientCore:
    return ClientCore(parse(ConsumerSchema, {"bootstrap.servers": cluster.bootstrap_servers, "retry.backoff.ms": 1,
                                             "retry.backoff.max.ms": 5}), transport=cluster)


@pytest.fixture
def env(cluster):
    """(the cluster, a member of group "g" on it)."""
    core = core_of(cluster)
    yield cluster, GroupMembership(core, "g", backoff_ms=0, backoff_max_ms=1000)
    core.close()


def join(member: GroupMembership, topics=("t",)):
    member.start_join(topics)
    for _ in range(10):
        got = member.advance()
        if got is not None:
            return got
    raise AssertionError(f"no assignment, state {member.state}")


def test_join_sync_stable(env):
    cluster, member = env
    assert member.needs_join()
    assert join(member) == [A, B]
    assert member.state is MemberState.STABLE and not member.needs_join()
    assert member.generation() == (1, member.member_id) and member.member_id
    req = cluster.requests_of("JoinGroup")[0]
    assert list(req.topics) == ["t"] and req.protocol_type == "consumer" and req.session_timeout_ms == 10000


def test_member_id_required_then_join_with_it(env):
    cluster, member = env
    cluster.fail_next("JoinGroup", ErrorCode.MEMBER_ID_REQUIRED)  # KIP-394: the answer names the member id
    join(member)
    reqs = cluster.requests_of("JoinGroup")
    assert [r.member_id for r in reqs] == ["", member.member_id] and member.member_id
    assert member.generation() == (1, member.member_id)


def test_join_waits_for_a_pending_answer(env):
    cluster, member = env
    held = cluster.hold_next("JoinGroup")
    member.start_join(["t"])
    assert member.advance() is None and member.state is MemberState.JOINING
    assert member.advance() is None  # still waiting, nothing resent
    assert held.arrived.is_set() and len(cluster.requests_of("JoinGroup")) == 1
    held.release()
    assert member.advance() == [A, B]
    assert member.state is MemberState.STABLE


@pytest.mark.parametrize("code", [ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE])
def test_join_not_coordinator_finds_coordinator_again(env, code):
    cluster, member = env
    cluster.fail_next("JoinGroup", code)
    join(member)
    assert len(cluster.requests_of("FindCoordinator")) == 2  # the coordinator was looked up again
    assert len(cluster.requests_of("JoinGroup")) == 2


def test_fatal_join_error_raises(cluster):
    core = core_of(cluster)
    member = GroupMembership(core, "g", session_timeout_ms=1, backoff_ms=0, backoff_max_ms=1000)
    member.start_join(["t"])  # below the coordinator's group.min.session.timeout.ms
    with pytest.raises(errors.InvalidSessionTimeoutError):
        member.advance()
    assert member.needs_join()


def test_sync_rebalance_in_progress_rejoins(env):
    cluster, member = env
    member.start_join(["t"])
    cluster.fail_next("SyncGroup", ErrorCode.REBALANCE_IN_PROGRESS)
    got = None
    for _ in range(10):
        got = member.advance()
        if got is not None:
            break
    assert got == [A, B] and len(cluster.requests_of("JoinGroup")) == 2


@pytest.mark.parametrize("code,reset", [(ErrorCode.REBALANCE_IN_PROGRESS, False),
                                        (ErrorCode.ILLEGAL_GENERATION, False),
                                        (ErrorCode.UNKNOWN_MEMBER_ID, True)])
def test_heartbeat_answers_mark_rejoin(env, code, reset):
    cluster, member = env
    join(member)
    joined = member.member_id
    assert member.heartbeat_once() == ErrorCode.NONE and not member.needs_join()
    cluster.fail_next("Heartbeat", code)
    assert member.heartbeat_once() == code
    assert member.needs_join()
    assert (member.member_id == "") is reset
    req = cluster.requests_of("Heartbeat")[-1]
    assert (req.group_id, req.generation_id, req.member_id) == ("g", 1, joined)


def test_heartbeat_not_coordinator_invalidates(env):
    cluster, member = env
    join(member)
    cluster.fail_next("Heartbeat", ErrorCode.NOT_COORDINATOR)
    member.heartbeat_once()
    assert not member.needs_join()
    finds = len(cluster.requests_of("FindCoordinator"))
    assert member.heartbeat_once() == ErrorCode.NONE
    assert len(cluster.requests_of("FindCoordinator")) == finds + 1  # it was dropped, and found again


def test_heartbeat_leaves_the_group_after_max_poll_interval_on_the_injected_clock(cluster):
    core = core_of(cluster)
    clock = MockTime(1_000)
    member = GroupMembership(core, "g", rebalance_timeout_ms=300, backoff_ms=0, backoff_max_ms=1000,
                             clock=clock)
    join(member)
    member.polled()
    clock.advance(300)  # ms; not more than max.poll.interval.ms yet
    assert member.heartbeat_once() == ErrorCode.NONE and member.state is MemberState.STABLE
    clock.advance(1)
    assert member.heartbeat_once() is None
    assert member.state is MemberState.UNJOINED and member.member_id == ""
    assert len(cluster.requests_of("LeaveGroup")) == 1


def test_heartbeat_only_when_stable(env):
    cluster, member = env
    assert member.heartbeat_once() is None
    assert cluster.requests_of("Heartbeat") == []


def test_leave_sends_leave_group_and_resets(env):
    cluster, member = env
    join(member)
    joined = member.member_id
    member.leave()
    assert cluster.requests_of("LeaveGroup")[0].member_id == joined
    assert member.generation() == (-1, "") and member.needs_join()


def test_commit_sync_with_generation_and_retry_on_not_coordinator(env):
    cluster, member = env
    join(member)
    finds = len(cluster.requests_of("FindCoordinator"))
    cluster.fail_next("OffsetCommit", ErrorCode.NOT_COORDINATOR)
    member.commit_sync({A: OffsetAndMetadata(5, "md")}, managed=True, timeout_s=5)
    assert cluster.committed_offsets("g") == {A: 5}
    reqs = cluster.requests_of("OffsetCommit")
    assert len(reqs) == 2 and (reqs[-1].generation_id, reqs[-1].member_id) == (1, member.member_id)
    assert reqs[-1].topics[0].partitions[0].metadata == "md"
    assert len(cluster.requests_of("FindCoordinator")) == finds + 1


def test_commit_outside_group_management_uses_minus_one(env):
    cluster, member = env
    member.commit_sync({A: OffsetAndMetadata(3)}, managed=False, timeout_s=5)
    req = cluster.requests_of("OffsetCommit")[0]
    assert (req.generation_id, req.member_id) == (-1, "")


@pytest.mark.parametrize("code,exc", [(ErrorCode.ILLEGAL_GENERATION, errors.IllegalGenerationError),
                                      (ErrorCode.REBALANCE_IN_PROGRESS, errors.RebalanceInProgressError),
                                      (ErrorCode.UNKNOWN_MEMBER_ID, errors.UnknownMemberIdError)])
def test_commit_with_stale_generation_raises_and_rejoins(env, code, exc):
    cluster, member = env
    join(member)
    cluster.fail_next("OffsetCommit", code)
    with pytest.raises(exc):
        member.commit_sync({A: OffsetAndMetadata(1)}, managed=True, timeout_s=5)
    assert len(cluster.requests_of("OffsetCommit")) == 1
    assert member.needs_join()


def test_fetch_committed_retries_unstable_offset_commit(env):
    cluster, member = env
    member.commit_sync({A: OffsetAndMetadata(11)}, managed=False, timeout_s=5)
    cluster.fail_next("OffsetFetch", ErrorCode.UNSTABLE_OFFSET_COMMIT)
    got = member.fetch_committed([A, B], require_stable=True, timeout_s=5)
    assert got == {A: OffsetAndMetadata(11, ""), B: None}
    reqs = cluster.requests_of("OffsetFetch")
    assert len(reqs) == 2 and all(r.require_stable for r in reqs)


def test_parse_offset_fetch_errors():
    resp = pb.OffsetFetchResponse(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    with pytest.raises(errors.CoordinatorLoadInProgressError):
        parse_offset_fetch(resp, [A])
    resp = pb.OffsetFetchResponse(topics=[pb.OffsetFetchTopic(name="t", partitions=[
        pb.OffsetFetchPartition(partition=0, committed_offset=-1, error_code=ErrorCode.UNSTABLE_OFFSET_COMMIT)])])
    with pytest.raises(errors.UnstableOffsetCommitError):
        parse_offset_fetch(resp, [A])
