"""Group membership state machine (join -> sync -> stable -> rejoin), heartbeat
answers, and offset commit / fetch retries, against an in-process coordinator."""
from __future__ import annotations

import concurrent.futures

import pytest

from exactly import errors
from exactly._consumer_group import GroupMembership, MemberState, parse_offset_fetch
from exactly_wire.error_codes import ErrorCode
from exactly.types import OffsetAndMetadata, TopicPartition
from exactly_wire.v1 import exactly_pb2 as pb

from .fakes import FakeCore, FakeGroupCoordinator

A = TopicPartition("t", 0)
B = TopicPartition("t", 1)


@pytest.fixture
def env():
    core = FakeCore()
    coord = FakeGroupCoordinator(core)
    member = GroupMembership(core, "g", backoff_ms=0, backoff_max_ms=0)
    return core, coord, member


def join(member: GroupMembership, topics=("t",)):
    member.start_join(topics)
    for _ in range(10):
        got = member.advance()
        if got is not None:
            return got
    raise AssertionError(f"no assignment, state {member.state}")


def test_join_sync_stable(env):
    core, coord, member = env
    coord.assignment = [("t", 0), ("t", 1)]
    assert member.needs_join()
    assert join(member) == [A, B]
    assert member.state is MemberState.STABLE and not member.needs_join()
    assert member.generation() == (1, "m1")
    req = core.calls_of("JoinGroup")[0]
    assert list(req.topics) == ["t"] and req.protocol_type == "consumer" and req.session_timeout_ms == 10000


def test_member_id_required_then_join_with_it(env):
    core, coord, member = env
    coord.join_codes = [ErrorCode.MEMBER_ID_REQUIRED]
    join(member)
    reqs = core.calls_of("JoinGroup")
    assert [r.member_id for r in reqs] == ["", "m1"]
    assert member.generation() == (1, "m1")


def test_join_waits_for_a_pending_answer(env):
    core, coord, member = env
    later: concurrent.futures.Future = concurrent.futures.Future()
    core.handlers[("coord:1", "JoinGroup")] = lambda req: later
    member.start_join(["t"])
    assert member.advance() is None and member.state is MemberState.JOINING
    assert member.advance() is None  # still waiting, nothing resent
    assert len(core.calls_of("JoinGroup")) == 1
    later.set_result(coord.joingroup(pb.JoinGroupRequest(group_id="g")))
    assert member.advance() == []
    assert member.state is MemberState.STABLE


@pytest.mark.parametrize("code", [ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE])
def test_join_not_coordinator_finds_coordinator_again(env, code):
    core, coord, member = env
    coord.join_codes = [code]
    join(member)
    assert core.invalidations >= 1
    assert len(core.calls_of("JoinGroup")) == 2


def test_fatal_join_error_raises(env):
    core, coord, member = env
    coord.join_codes = [ErrorCode.INVALID_SESSION_TIMEOUT]
    member.start_join(["t"])
    with pytest.raises(errors.InvalidSessionTimeoutError):
        member.advance()
    assert member.needs_join()


def test_sync_illegal_generation_rejoins(env):
    core, coord, member = env
    member.start_join(["t"])
    real_sync = core.handlers[("coord:1", "SyncGroup")]
    answers = [pb.SyncGroupResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS)]
    core.handlers[("coord:1", "SyncGroup")] = lambda req: answers.pop(0) if answers else real_sync(req)
    got = None
    for _ in range(10):
        got = member.advance()
        if got is not None:
            break
    assert got == [] and len(core.calls_of("JoinGroup")) == 2


@pytest.mark.parametrize("code,reset", [(ErrorCode.REBALANCE_IN_PROGRESS, False),
                                        (ErrorCode.ILLEGAL_GENERATION, False),
                                        (ErrorCode.UNKNOWN_MEMBER_ID, True)])
def test_heartbeat_answers_mark_rejoin(env, code, reset):
    core, coord, member = env
    join(member)
    assert member.heartbeat_once() == ErrorCode.NONE and not member.needs_join()
    coord.heartbeat_code = code
    assert member.heartbeat_once() == code
    assert member.needs_join()
    assert (member.member_id == "") is reset
    req = core.calls_of("Heartbeat")[-1]
    assert (req.group_id, req.generation_id, req.member_id) == ("g", 1, "m1")


def test_heartbeat_not_coordinator_invalidates(env):
    core, coord, member = env
    join(member)
    coord.heartbeat_code = ErrorCode.NOT_COORDINATOR
    member.heartbeat_once()
    assert core.invalidations == 1 and not member.needs_join()


def test_heartbeat_leaves_the_group_after_max_poll_interval_on_the_injected_clock():
    core = FakeCore()
    FakeGroupCoordinator(core)
    now = [1_000]
    member = GroupMembership(core, "g", rebalance_timeout_ms=300, backoff_ms=0, backoff_max_ms=0,
                             clock=lambda: now[0])
    join(member)
    member.polled()
    now[0] += 300  # ms; not more than max.poll.interval.ms yet
    assert member.heartbeat_once() == ErrorCode.NONE and member.state is MemberState.STABLE
    now[0] += 1
    assert member.heartbeat_once() is None
    assert member.state is MemberState.UNJOINED and member.member_id == ""
    assert len(core.calls_of("LeaveGroup")) == 1


def test_heartbeat_only_when_stable(env):
    core, coord, member = env
    assert member.heartbeat_once() is None
    assert core.calls_of("Heartbeat") == []


def test_leave_sends_leave_group_and_resets(env):
    core, coord, member = env
    join(member)
    member.leave()
    assert core.calls_of("LeaveGroup")[0].member_id == "m1"
    assert member.generation() == (-1, "") and member.needs_join()


def test_commit_sync_with_generation_and_retry_on_not_coordinator(env):
    core, coord, member = env
    join(member)
    coord.commit_codes = [ErrorCode.NOT_COORDINATOR]
    member.commit_sync({A: OffsetAndMetadata(5, "md")}, managed=True, timeout_s=5)
    assert coord.committed == {("t", 0): 5}
    reqs = core.calls_of("OffsetCommit")
    assert len(reqs) == 2 and (reqs[-1].generation_id, reqs[-1].member_id) == (1, "m1")
    assert reqs[-1].topics[0].partitions[0].metadata == "md"
    assert core.invalidations == 1


def test_commit_outside_group_management_uses_minus_one(env):
    core, coord, member = env
    member.commit_sync({A: OffsetAndMetadata(3)}, managed=False, timeout_s=5)
    req = core.calls_of("OffsetCommit")[0]
    assert (req.generation_id, req.member_id) == (-1, "")


@pytest.mark.parametrize("code,exc", [(ErrorCode.ILLEGAL_GENERATION, errors.IllegalGenerationError),
                                      (ErrorCode.REBALANCE_IN_PROGRESS, errors.RebalanceInProgressError),
                                      (ErrorCode.UNKNOWN_MEMBER_ID, errors.UnknownMemberIdError)])
def test_commit_with_stale_generation_raises_and_rejoins(env, code, exc):
    core, coord, member = env
    join(member)
    coord.commit_codes = [code]
    with pytest.raises(exc):
        member.commit_sync({A: OffsetAndMetadata(1)}, managed=True, timeout_s=5)
    assert len(core.calls_of("OffsetCommit")) == 1
    assert member.needs_join()


def test_fetch_committed_retries_unstable_offset_commit(env):
    core, coord, member = env
    coord.committed[("t", 0)] = 11
    coord.unstable = {("t", 0)}
    got = member.fetch_committed([A, B], require_stable=True, timeout_s=5)
    assert got == {A: OffsetAndMetadata(11, ""), B: None}
    reqs = core.calls_of("OffsetFetch")
    assert len(reqs) == 2 and all(r.require_stable for r in reqs)


def test_parse_offset_fetch_errors():
    resp = pb.OffsetFetchResponse(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    with pytest.raises(errors.CoordinatorLoadInProgressError):
        parse_offset_fetch(resp, [A])
    resp = pb.OffsetFetchResponse(topics=[pb.OffsetFetchTopic(name="t", partitions=[
        pb.OffsetFetchPartition(partition=0, committed_offset=-1, error_code=ErrorCode.UNSTABLE_OFFSET_COMMIT)])])
    with pytest.raises(errors.UnstableOffsetCommitError):
        parse_offset_fetch(resp, [A])
