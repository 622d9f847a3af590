"""GroupMembership (services/group_coordinator/membership.py) driven directly: a
fake of the log it stores group metadata records in (answers chosen by the test,
appends held on demand), a manual monotonic clock, and `tick` called by the test
instead of a timer task. Covers the rebalance and its stored generation, append
errors as members see them, SyncGroup waiting for the store, session and
rebalance timeouts, LeaveGroup, a static member's store-then-answer and closing."""
from __future__ import annotations

import asyncio
import itertools

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from services.group_coordinator import log_format
from services.common.settings import GroupCoordinatorSchema
from services.group_coordinator.group import GroupState
from services.group_coordinator.membership import GroupMembership

from exactly.testing import MockTime
from .gc_fakes import Deadlines, group_settings

SESSION = 6000
REBALANCE = 3000  # below the session timeout: the waiting member's session holds


class FakeGroupLog:
    """Stands in for OffsetsLog: keeps the appended group metadata snapshots;
    `codes` are the answers of the next appends (NONE once empty); while `hold`
    is clear, appends wait."""

    writer = log_format.NO_WRITER

    def __init__(self) -> None:
        self.snapshots: list = []
        self.codes: list[ErrorCode] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.appending = asyncio.Event()
        self.locks: dict[str, asyncio.Lock] = {}

    def store_lock(self, group_id: str) -> asyncio.Lock:
        return self.locks.setdefault(group_id, asyncio.Lock())

    async def append(self, batch: bytes, transactional_id: str = "", consumer_group_id: str = "") -> ErrorCode:
        self.appending.set()
        await self.hold.wait()
        [rec] = records.decode_records(batch, 0, records.parse_header(batch))
        key = log_format.decode_key(rec.key)
        self.snapshots.append(log_format.decode_group_value(key.group, rec.value))
        return self.codes.pop(0) if self.codes else ErrorCode.NONE


class Env:
    def __init__(self, config: GroupCoordinatorSchema | None = None, wait_for=asyncio.wait_for):
        self.clock = MockTime()
        self.log = FakeGroupLog()
        self.groups: dict = {}
        self.wakes = 0
        ids = itertools.count(1)
        self.members = GroupMembership(
            self.groups, self.log, config=config or GroupCoordinatorSchema(),
            partition_counts=lambda: {"orders": 4}, clock=self.clock, wall_clock=lambda: 1_700_000_000_000,
            new_member_id=lambda _i: f"member-{next(ids)}", wake=self._wake, wait_for=wait_for)

    def _wake(self) -> None:
        self.wakes += 1

    async def join(self, member_id="", group_instance_id=""):
        return await self.members.join("g", member_id, ("orders",), SESSION, REBALANCE,
                                       group_instance_id=group_instance_id)

    def joining(self, member_id="", group_instance_id=""):
        return asyncio.ensure_future(self.join(member_id, group_instance_id))

    async def second_member_joining(self) -> asyncio.Task:
        """member-1 alone in generation 1, then a second member's JoinGroup (it
        waits: the group rebalances and member-1 must rejoin)."""
        assert (await self.join()).generation_id == 1
        second = self.joining()
        await self.settle()
        assert not second.done()
        return second

    async def settle(self):
        for _ in range(20):
            await asyncio.sleep(0)


def run(coro, timeout=10):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_a_rebalance_is_answered_once_its_generation_is_stored():
    async def body():
        env = Env()
        env.log.hold.clear()
        join = env.joining()
        await env.log.appending.wait()
        assert not join.done()  # the generation record is not stored yet
        assert env.groups["g"].is_(GroupState.COMPLETING_REBALANCE)
        env.log.hold.set()
        r = await join
        assert (r.error, r.generation_id, r.members) == (ErrorCode.NONE, 1, ("member-1",))
        assert env.groups["g"].is_(GroupState.STABLE)
        [snap] = env.log.snapshots
        assert (snap.generation, [m.member_id for m in snap.members]) == (1, ["member-1"])
        assert env.wakes == 1  # the timer task is woken after the store
        assert await env.members.sync("g", 1, "member-1") == (ErrorCode.NONE, {"orders": [0, 1, 2, 3]})

    run(body())


def test_append_errors_of_the_generation_as_joining_members_see_them():
    async def body():
        env = Env()
        env.log.codes = [ErrorCode.NOT_ENOUGH_REPLICAS]
        r = await env.join()
        assert r.error == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert env.groups["g"].is_(GroupState.PREPARING_REBALANCE)  # back to rebalancing
        env.log.codes = [ErrorCode.REQUEST_TIMED_OUT]
        assert (await env.join("member-1")).error == ErrorCode.REBALANCE_IN_PROGRESS
        r = await env.join("member-1")
        assert (r.error, r.generation_id) == (ErrorCode.NONE, 3)
        assert [s.generation for s in env.log.snapshots] == [1, 2, 3]

    run(body())


def test_sync_waits_for_the_generation_being_stored_up_to_the_commit_timeout():
    async def body():
        deadlines = Deadlines()
        env = Env(wait_for=deadlines)
        env.log.hold.clear()
        join = env.joining()
        await env.log.appending.wait()
        sync = asyncio.ensure_future(env.members.sync("g", 1, "member-1"))
        await env.settle()
        assert not sync.done()
        env.log.hold.set()
        assert await sync == (ErrorCode.NONE, {"orders": [0, 1, 2, 3]})
        assert (await join).error == ErrorCode.NONE
        assert deadlines.seen == [5.0]

    run(body())


def test_sync_gives_up_waiting_at_the_deadline():
    async def body():
        env = Env(wait_for=Deadlines(expire=True))
        env.log.hold.clear()
        join = env.joining()
        await env.log.appending.wait()
        assert await env.members.sync("g", 1, "member-1") == (ErrorCode.REBALANCE_IN_PROGRESS, {})
        assert await env.members.wait_stored("g") is False
        env.log.hold.set()
        assert (await join).error == ErrorCode.NONE
        assert await env.members.sync("g", 1, "member-1") == (ErrorCode.NONE, {"orders": [0, 1, 2, 3]})

    run(body())


def test_a_member_that_does_not_rejoin_in_time_is_removed_by_the_tick():
    async def body():
        env = Env()
        second = await env.second_member_joining()
        assert env.members.heartbeat("g", 1, "member-1") == ErrorCode.REBALANCE_IN_PROGRESS
        env.clock.advance(REBALANCE - 1)
        env.members.tick()
        assert not second.done()
        env.clock.advance(1)
        env.members.tick()
        r = await second
        assert (r.error, r.generation_id, r.members) == (ErrorCode.NONE, 2, ("member-2",))
        assert env.members.heartbeat("g", 2, "member-1") == ErrorCode.UNKNOWN_MEMBER_ID
        assert env.members.heartbeat("g", 2, "member-2") == ErrorCode.NONE

    run(body())


def test_session_expiry_empties_the_group_and_stores_the_generation():
    async def body():
        env = Env()
        assert (await env.join()).generation_id == 1
        env.clock.advance(SESSION - 1)
        env.members.touch("g", "member-1")  # an offset commit counts as a heartbeat
        env.clock.advance(SESSION - 1)
        env.members.tick()
        assert env.groups["g"].is_(GroupState.STABLE)
        env.clock.advance(1)
        env.members.tick()
        assert env.groups["g"].is_(GroupState.EMPTY)
        await env.settle()
        assert [s.generation for s in env.log.snapshots] == [1, 2]
        assert env.log.snapshots[1].members == ()

    run(body())


def test_leave_rebalances_the_members_left():
    async def body():
        env = Env()
        second = await env.second_member_joining()
        rejoin = env.joining("member-1")
        await env.settle()
        # both rejoined: generation 2 with both
        assert (await second).generation_id == 2 and (await rejoin).generation_id == 2
        assert env.members.leave("g", "member-2") == ErrorCode.NONE
        assert env.members.leave("g", "member-2") == ErrorCode.UNKNOWN_MEMBER_ID
        assert env.members.leave("nope", "member-1") == ErrorCode.UNKNOWN_MEMBER_ID
        r = await env.join("member-1")
        assert (r.error, r.generation_id, r.members) == (ErrorCode.NONE, 3, ("member-1",))

    run(body())


def test_a_restarted_static_member_is_stored_then_answered_and_undone_on_failure():
    async def body():
        env = Env()
        assert (await env.join(group_instance_id="i1")).member_id == "member-1"
        env.log.codes = [ErrorCode.NOT_ENOUGH_REPLICAS]
        r = await env.join(group_instance_id="i1")  # restarted: no member id
        assert (r.error, r.member_id) == (ErrorCode.COORDINATOR_NOT_AVAILABLE, "member-2")
        assert env.groups["g"].static_members == {"i1": "member-1"}  # replacement undone
        r = await env.join(group_instance_id="i1")
        assert (r.error, r.member_id, r.generation_id) == (ErrorCode.NONE, "member-3", 1)  # no rebalance
        assert env.log.snapshots[-1].members[0].member_id == "member-3"
        assert env.members.heartbeat("g", 1, "member-1", "i1") == ErrorCode.FENCED_INSTANCE_ID

    run(body())


def test_close_answers_waiting_joins_not_coordinator_and_kills_the_groups():
    async def body():
        env = Env(config=group_settings({"group.initial.rebalance.delay.ms": 3000}))
        join = env.joining()
        await env.settle()
        assert not join.done()  # the initial rebalance delay holds it
        env.members.close(env.clock())
        assert (await join).error == ErrorCode.NOT_COORDINATOR
        assert env.groups["g"].is_(GroupState.DEAD)
        assert (await env.join()).error == ErrorCode.COORDINATOR_NOT_AVAILABLE

    run(body())
