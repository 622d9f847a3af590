"""The group coordinator (services/group_coordinator/coordinator.py) over an
in-memory __consumer_offsets log: routing, JoinGroup waits, offsets through the
log, transactional offsets and markers (KIP-98 design doc "Consumer
Coordinator"), KIP-447 generation fencing, replay after a restart."""
from __future__ import annotations

import asyncio
import itertools
import zlib

import pytest
from waiting import wait_for_async

from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from services.group_coordinator.coordinator import GroupCoordinator
from services.common.settings import GroupCoordinatorSchema
from services.group_coordinator.group import GroupState
from services.group_coordinator.offsets import FetchedOffset, OffsetAndMetadata

from exactly.testing import MockTime
from .gc_fakes import FakeLog, group_settings

N = 4
TP0 = TopicPartition("orders", 0)
TP1 = TopicPartition("orders", 1)
PID = 7000
SESSION = 6000


def partition_for(group_id: str) -> int:
    return zlib.crc32(group_id.encode()) % N


def run(coro, timeout=10):
    return asyncio.run(asyncio.wait_for(coro, timeout))


class Env:
    def __init__(self, log: FakeLog | None = None, clock: MockTime | None = None,
                 counts: dict | None = None, config: GroupCoordinatorSchema | None = None):
        self.log = log or FakeLog()
        self.clock = clock or MockTime()
        self.counts = counts if counts is not None else {"orders": 4, "payments": 2}
        ids = itertools.count(1)
        self.coord = GroupCoordinator(
            self.log, partition_for, lambda: dict(self.counts),
            config or group_settings({"group.coordinator.tail.max.wait.ms": 5000}),
            clock=self.clock, wall_clock=lambda: 1_700_000_000_000,
            new_member_id=lambda _i: f"member-{next(ids)}")

    async def up(self, partitions=range(N)):
        for p in partitions:
            await self.coord.on_elected(p, 0)
        assert await self.coord.wait_loaded(timeout_s=5)
        return self

    async def join(self, group, member_id="", topics=("orders",), rebalance_timeout_ms=10_000):
        return await self.coord.join_group(group, member_id, topics, SESSION, rebalance_timeout_ms)

    async def until(self, predicate, timeout=5.0):
        await wait_for_async(predicate, timeout, "the coordinator to reach the condition")


def om(offset: int, metadata: str = "") -> OffsetAndMetadata:
    return OffsetAndMetadata(offset, metadata)


# ---------------------------------------------------------------- routing

def test_routing_errors():
    async def body():
        env = Env()
        assert (await env.join("g")).error == ErrorCode.NOT_COORDINATOR
        await env.up(partitions=[p for p in range(N) if p != partition_for("g")])
        assert (await env.join("g")).error == ErrorCode.NOT_COORDINATOR
        assert (await env.join("")).error == ErrorCode.INVALID_GROUP_ID
        assert await env.coord.heartbeat("g", 1, "m") == ErrorCode.NOT_COORDINATOR
        assert (await env.coord.fetch_offsets("g", None, False))[0] == ErrorCode.NOT_COORDINATOR
        env.coord.partition_for = lambda g: -1
        assert (await env.join("g")).error == ErrorCode.COORDINATOR_NOT_AVAILABLE
        await env.coord.stop()
    run(body())


def test_load_in_progress_until_replayed():
    class SlowLog(FakeLog):
        gate: asyncio.Event

        async def fetch(self, *a, **kw):
            await self.gate.wait()
            return await super().fetch(*a, **kw)

    async def body():
        log = SlowLog()
        log.gate = asyncio.Event()
        env = Env(log)
        await env.coord.on_elected(partition_for("g"), 3)
        assert (await env.join("g")).error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert (await env.coord.commit_offsets("g", -1, "", {TP0: om(1)})) == \
            {TP0: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}
        log.gate.set()
        assert await env.coord.wait_loaded(timeout_s=5)
        assert (await env.join("g")).error == ErrorCode.NONE
        await env.coord.stop()
    run(body())


# ---------------------------------------------------------------- membership

def test_join_sync_heartbeat_and_rebalance_with_two_members():
    async def body():
        env = await Env().up()
        a = await env.join("g")
        assert (a.error, a.generation_id, a.leader, a.members) == (ErrorCode.NONE, 1, a.member_id, (a.member_id,))
        assert await env.coord.sync_group("g", 1, a.member_id) == (ErrorCode.NONE, {"orders": [0, 1, 2, 3]})

        join_b = asyncio.create_task(env.join("g", topics=("orders", "payments")))
        await env.until(lambda: env.coord.group("g").is_(GroupState.PREPARING_REBALANCE))
        assert not join_b.done()
        assert await env.coord.heartbeat("g", 1, a.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
        a2 = await env.join("g", a.member_id)
        b = await join_b
        assert a2.generation_id == b.generation_id == 2
        assert set(b.members) == {a.member_id, b.member_id} and b.leader == a.member_id
        assert await env.coord.sync_group("g", 2, a.member_id) == (ErrorCode.NONE, {"orders": [0, 1]})
        assert await env.coord.sync_group("g", 2, b.member_id) == \
            (ErrorCode.NONE, {"orders": [2, 3], "payments": [0, 1]})
        assert await env.coord.sync_group("g", 1, a.member_id) == (ErrorCode.ILLEGAL_GENERATION, {})
        assert await env.coord.heartbeat("g", 2, b.member_id) == ErrorCode.NONE
        assert await env.coord.heartbeat("g", 2, "ghost") == ErrorCode.UNKNOWN_MEMBER_ID
        assert await env.coord.heartbeat("nogroup", 2, "ghost") == ErrorCode.UNKNOWN_MEMBER_ID
        assert (await env.join("g", "ghost")).error == ErrorCode.UNKNOWN_MEMBER_ID
        await env.coord.stop()
    run(body())


def test_leave_rebalances_the_others_and_last_leave_empties_the_group():
    async def body():
        env = await Env().up()
        a = await env.join("g")
        join_b = asyncio.create_task(env.join("g"))
        await env.until(lambda: env.coord.group("g").is_(GroupState.PREPARING_REBALANCE))
        await env.join("g", a.member_id)
        b = await join_b
        assert await env.coord.leave_group("g", a.member_id) == ErrorCode.NONE
        assert await env.coord.leave_group("g", a.member_id) == ErrorCode.UNKNOWN_MEMBER_ID
        assert await env.coord.heartbeat("g", 2, b.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
        b3 = await env.join("g", b.member_id)
        assert (b3.generation_id, b3.members) == (3, (b.member_id,))
        assert await env.coord.leave_group("g", b.member_id) == ErrorCode.NONE
        g = env.coord.group("g")
        assert g.is_(GroupState.EMPTY) and g.generation == 4
        await env.coord.stop()
    run(body())


def test_session_expiry_with_a_manual_clock():
    async def body():
        env = await Env().up()
        a = await env.join("g")
        join_b = asyncio.create_task(env.join("g"))
        await env.until(lambda: env.coord.group("g").is_(GroupState.PREPARING_REBALANCE))
        await env.join("g", a.member_id)
        b = await join_b
        for _ in range(4):
            env.clock.advance(SESSION // 2)
            assert await env.coord.heartbeat("g", 2, a.member_id) == ErrorCode.NONE
            env.coord.tick()
            if b.member_id not in env.coord.group("g").members:
                break
        assert list(env.coord.group("g").members) == [a.member_id]
        assert await env.coord.heartbeat("g", 2, a.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
        assert await env.coord.heartbeat("g", 2, b.member_id) == ErrorCode.UNKNOWN_MEMBER_ID
        a3 = await env.join("g", a.member_id)
        assert (a3.generation_id, a3.members) == (3, (a.member_id,))
        await env.coord.stop()
    run(body())


def test_rebalance_timeout_completes_without_the_silent_member():
    async def body():
        env = await Env().up()
        a = await env.join("g", rebalance_timeout_ms=4000)
        join_b = asyncio.create_task(env.join("g", rebalance_timeout_ms=4000))
        await env.until(lambda: env.coord.group("g").is_(GroupState.PREPARING_REBALANCE))
        env.clock.advance(3999)
        env.coord.tick()
        for _ in range(20):  # let every task the tick woke run
            await asyncio.sleep(0)
        assert not join_b.done()
        env.clock.advance(1)
        env.coord.tick()
        b = await join_b
        assert (b.error, b.generation_id, b.members, b.leader) == (ErrorCode.NONE, 2, (b.member_id,), b.member_id)
        assert (await env.coord.sync_group("g", 1, a.member_id))[0] == ErrorCode.UNKNOWN_MEMBER_ID
        await env.coord.stop()
    run(body())


def test_partition_count_change_triggers_a_rebalance():
    async def body():
        env = await Env().up()
        a = await env.join("g", topics=("orders", "later"))
        assert (await env.coord.sync_group("g", 1, a.member_id))[1] == {"orders": [0, 1, 2, 3]}
        env.counts["later"] = 2
        env.coord.tick()
        assert await env.coord.heartbeat("g", 1, a.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
        a2 = await env.join("g", a.member_id, topics=("orders", "later"))
        assert a2.generation_id == 2
        assert (await env.coord.sync_group("g", 2, a.member_id))[1] == \
            {"later": [0, 1], "orders": [0, 1, 2, 3]}
        await env.coord.stop()
    run(body())


def test_failed_generation_store_answers_joins_with_the_error_then_recovers():
    async def body():
        env = await Env().up()
        env.log.produce_error = ErrorCode.NOT_ENOUGH_REPLICAS
        a = await env.join("g")
        assert a.error == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert env.coord.group("g").is_(GroupState.PREPARING_REBALANCE)
        env.log.produce_error = None
        a2 = await env.join("g", a.member_id)
        assert (a2.error, a2.generation_id) == (ErrorCode.NONE, 2)
        await env.coord.stop()
    run(body())


def test_resign_answers_waiting_joins_with_not_coordinator():
    async def body():
        env = await Env().up()
        a = await env.join("g")
        join_b = asyncio.create_task(env.join("g"))
        await env.until(lambda: env.coord.group("g").is_(GroupState.PREPARING_REBALANCE))
        await env.coord.on_resigned(partition_for("g"))
        assert (await join_b).error == ErrorCode.NOT_COORDINATOR
        assert await env.coord.heartbeat("g", 1, a.member_id) == ErrorCode.NOT_COORDINATOR
        await env.coord.stop()
    run(body())


# ---------------------------------------------------------------- offsets

def test_offset_commit_and_fetch():
    async def body():
        env = await Env().up()
        assert await env.coord.commit_offsets("simple", -1, "", {TP0: om(10, "x"), TP1: om(11)}) == \
            {TP0: ErrorCode.NONE, TP1: ErrorCode.NONE}
        assert await env.coord.fetch_offsets("simple", [TP0, TP1, TopicPartition("other", 0)], True) == (
            ErrorCode.NONE, {TP0: FetchedOffset(10, "x", ErrorCode.NONE), TP1: FetchedOffset(11, "", ErrorCode.NONE),
                             TopicPartition("other", 0): FetchedOffset(-1, "", ErrorCode.NONE)})
        assert (await env.coord.fetch_offsets("simple", None, False))[1].keys() == {TP0, TP1}
        assert await env.coord.commit_offsets("simple", 5, "m", {TP0: om(1)}) == {TP0: ErrorCode.ILLEGAL_GENERATION}
        assert await env.coord.commit_offsets("simple", -1, "", {TP0: om(1, "x" * 5000)}) == \
            {TP0: ErrorCode.OFFSET_METADATA_TOO_LARGE}

        a = await env.join("g")
        assert await env.coord.commit_offsets("g", 1, a.member_id, {TP0: om(3)}) == {TP0: ErrorCode.NONE}
        assert await env.coord.commit_offsets("g", 0, a.member_id, {TP0: om(4)}) == \
            {TP0: ErrorCode.ILLEGAL_GENERATION}
        assert await env.coord.commit_offsets("g", -1, "", {TP0: om(4)}) == {TP0: ErrorCode.UNKNOWN_MEMBER_ID}
        assert (await env.coord.fetch_offsets("g", [TP0], False))[1][TP0].offset == 3
        await env.coord.stop()
    run(body())


def test_commit_errors_of_the_log_are_mapped():
    async def body():
        env = await Env().up()
        env.log.produce_error = ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert await env.coord.commit_offsets("g", -1, "", {TP0: om(1)}) == {TP0: ErrorCode.NOT_COORDINATOR}
        env.log.produce_error = ErrorCode.MESSAGE_TOO_LARGE
        assert await env.coord.commit_offsets("g", -1, "", {TP0: om(1)}) == \
            {TP0: ErrorCode.INVALID_COMMIT_OFFSET_SIZE}
        await env.coord.stop()
    run(body())


def test_txn_offsets_invisible_until_commit_marker():
    async def body():
        env = await Env().up()
        await env.coord.commit_offsets("g", -1, "", {TP0: om(1)})
        res = await env.coord.txn_commit_offsets("tx", "g", PID, 0, -1, "", {TP0: om(50), TP1: om(60)})
        assert res == {TP0: ErrorCode.NONE, TP1: ErrorCode.NONE}
        assert await env.coord.fetch_offsets("g", [TP0, TP1], False) == (
            ErrorCode.NONE, {TP0: FetchedOffset(1, "", ErrorCode.NONE), TP1: FetchedOffset(-1, "", ErrorCode.NONE)})
        assert await env.coord.fetch_offsets("g", [TP0, TP1], True) == (
            ErrorCode.UNSTABLE_OFFSET_COMMIT,
            {TP0: FetchedOffset(-1, "", ErrorCode.UNSTABLE_OFFSET_COMMIT),
             TP1: FetchedOffset(-1, "", ErrorCode.UNSTABLE_OFFSET_COMMIT)})
        env.log.write_marker(partition_for("g"), PID, committed=True)

        async def stable():
            return await env.coord.fetch_offsets("g", [TP0, TP1], True)
        await env.until(lambda: not env.coord.partition_state(partition_for("g")).offsets.has_pending("g", TP0))
        assert await stable() == (ErrorCode.NONE, {TP0: FetchedOffset(50, "", ErrorCode.NONE),
                                                  TP1: FetchedOffset(60, "", ErrorCode.NONE)})
        await env.coord.stop()
    run(body())


def test_txn_offsets_discarded_on_abort_marker():
    async def body():
        env = await Env().up()
        await env.coord.commit_offsets("g", -1, "", {TP0: om(1)})
        await env.coord.txn_commit_offsets("tx", "g", PID, 0, -1, "", {TP0: om(50)})
        env.log.write_marker(partition_for("g"), PID, committed=False)
        await env.until(lambda: not env.coord.partition_state(partition_for("g")).offsets.has_pending("g", TP0))
        assert await env.coord.fetch_offsets("g", [TP0], True) == (ErrorCode.NONE,
                                                                   {TP0: FetchedOffset(1, "", ErrorCode.NONE)})
        await env.coord.stop()
    run(body())


def test_txn_offset_commit_fencing_kip_447():
    async def body():
        env = await Env().up()
        a = await env.join("g")
        join_b = asyncio.create_task(env.join("g"))
        await env.until(lambda: env.coord.group("g").is_(GroupState.PREPARING_REBALANCE))
        await env.join("g", a.member_id)
        await join_b
        commit = env.coord.txn_commit_offsets
        assert await commit("tx", "g", PID, 0, 1, a.member_id, {TP0: om(5)}) == {TP0: ErrorCode.ILLEGAL_GENERATION}
        assert await commit("tx", "g", PID, 0, 2, "ghost", {TP0: om(5)}) == {TP0: ErrorCode.UNKNOWN_MEMBER_ID}
        assert await commit("tx", "g", PID, 0, 2, a.member_id, {TP0: om(5)}) == {TP0: ErrorCode.NONE}
        assert await commit("tx", "g", PID, 0, -1, "", {TP0: om(6)}) == {TP0: ErrorCode.NONE}
        assert await commit("tx", "unknown-group", PID, 0, -1, "", {TP0: om(6)}) == {TP0: ErrorCode.NONE}
        assert await commit("tx", "unknown-group2", PID, 0, 3, "", {TP0: om(6)}) == \
            {TP0: ErrorCode.ILLEGAL_GENERATION}
        assert await commit("tx", "g", -1, 0, -1, "", {TP0: om(6)}) == {TP0: ErrorCode.INVALID_PRODUCER_ID_MAPPING}
        # The partition leader fences an older producer epoch.
        assert await commit("tx", "g", PID, 1, -1, "", {TP0: om(7)}) == {TP0: ErrorCode.NONE}
        assert await commit("tx", "g", PID, 0, -1, "", {TP0: om(8)}) == {TP0: ErrorCode.INVALID_PRODUCER_EPOCH}
        await env.coord.stop()
    run(body())


# ---------------------------------------------------------------- restart

def test_restart_replays_offsets_groups_and_pending_transactions():
    async def body():
        log = FakeLog()
        first = await Env(log).up()
        a = await first.join("g")
        join_b = asyncio.create_task(first.join("g"))
        await first.until(lambda: first.coord.group("g").is_(GroupState.PREPARING_REBALANCE))
        await first.join("g", a.member_id)
        b = await join_b
        await first.coord.commit_offsets("g", 2, a.member_id, {TP0: om(10)})
        await first.coord.txn_commit_offsets("tx1", "g", PID, 0, 2, a.member_id, {TP1: om(20)})
        log.write_marker(partition_for("g"), PID, committed=True)
        await first.coord.txn_commit_offsets("tx2", "g", PID + 1, 0, 2, a.member_id, {TP0: om(30)})
        await first.until(lambda: not first.coord.partition_state(partition_for("g")).offsets.has_pending("g", TP1))
        before_offsets = first.coord.partition_state(partition_for("g")).offsets.state()
        before_group = first.coord.group("g").snapshot()
        await first.coord.stop()

        second = await Env(log).up()
        assert second.coord.partition_state(partition_for("g")).offsets.state() == before_offsets
        assert second.coord.group("g").snapshot() == before_group
        assert await second.coord.fetch_offsets("g", [TP0, TP1], False) == (
            ErrorCode.NONE, {TP0: FetchedOffset(10, "", ErrorCode.NONE), TP1: FetchedOffset(20, "", ErrorCode.NONE)})
        assert (await second.coord.fetch_offsets("g", [TP0], True))[0] == ErrorCode.UNSTABLE_OFFSET_COMMIT
        # Members survive the failover; the generation keeps rising.
        assert await second.coord.heartbeat("g", 2, a.member_id) == ErrorCode.NONE
        assert await second.coord.sync_group("g", 2, b.member_id) == (ErrorCode.NONE, {"orders": [2, 3]})
        assert await second.coord.txn_commit_offsets("tx", "g", PID, 0, 1, a.member_id, {TP0: om(1)}) == \
            {TP0: ErrorCode.ILLEGAL_GENERATION}
        log.write_marker(partition_for("g"), PID + 1, committed=True)
        await second.until(lambda: not second.coord.partition_state(partition_for("g")).offsets.has_pending("g", TP0))
        assert (await second.coord.fetch_offsets("g", [TP0], True))[1][TP0].offset == 30
        assert await second.coord.leave_group("g", a.member_id) == ErrorCode.NONE
        b3 = await second.join("g", b.member_id)
        assert b3.generation_id == 3
        await second.coord.stop()

        third = await Env(log).up()
        assert third.coord.group("g").generation == 3
        join_c = asyncio.create_task(third.join("g"))
        await third.until(lambda: third.coord.group("g").is_(GroupState.PREPARING_REBALANCE))
        assert await third.coord.heartbeat("g", 3, b.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
        assert (await third.join("g", b.member_id)).generation_id == 4
        assert (await join_c).generation_id == 4
        await third.coord.stop()
    run(body())


def test_config_from_kafka_keys():
    props = {"group.min.session.timeout.ms": "100", "group.initial.rebalance.delay.ms": "3000",
             "offset.metadata.max.bytes": "10", "group.max.size": "5"}
    cfg = group_settings(props)
    assert (cfg.group_min_session_timeout_ms, cfg.group_max_session_timeout_ms, cfg.group_initial_rebalance_delay_ms,
            cfg.group_max_size) == (100, 1_800_000, 3000, 5)
    assert cfg.offset_metadata_max_bytes == 10 and cfg.offsets_commit_timeout_ms == 5000


@pytest.mark.parametrize("session_timeout_ms", [999, 1_800_001])
def test_session_timeout_bounds(session_timeout_ms):
    async def body():
        env = await Env().up()
        resp = await env.coord.join_group("g", "", ["orders"], session_timeout_ms, 0)
        assert resp.error == ErrorCode.INVALID_SESSION_TIMEOUT
        await env.coord.stop()
    run(body())


class FakeVerifier:
    """The transaction coordinator's answer to every verification, and the calls."""

    def __init__(self, answer):
        self.answer, self.calls = answer, []

    async def verify(self, transactional_id, producer_id, producer_epoch, topic, partition, deadline, group_id=""):
        self.calls.append((transactional_id, producer_id, producer_epoch, topic, partition))
        return self.answer


def test_a_phantom_txn_offset_commit_is_refused():
    """KIP-890 part 1: a TxnOffsetCommit whose transaction does not hold the group's
    __consumer_offsets partition (no AddOffsetsToTxn, or a delayed request after the
    transaction ended) writes nothing, so require_stable never sees a phantom."""
    async def body():
        env = await Env().up()
        env.coord.verifier = FakeVerifier(ErrorCode.INVALID_TXN_STATE)
        res = await env.coord.txn_commit_offsets("tx", "g", PID, 0, -1, "", {TP0: om(50)})
        assert res == {TP0: ErrorCode.INVALID_TXN_STATE}
        assert env.coord.verifier.calls == [("tx", PID, 0, "__consumer_offsets", partition_for("g"))]
        assert not env.coord.partition_state(partition_for("g")).offsets.has_pending("g", TP0)
        assert await env.coord.fetch_offsets("g", [TP0], True) == (
            ErrorCode.NONE, {TP0: FetchedOffset(-1, "", ErrorCode.NONE)})
        assert (await env.coord.txn_commit_offsets("", "g", PID, 0, -1, "", {TP0: om(50)})) == \
            {TP0: ErrorCode.INVALID_TXN_STATE}  # no transactional.id: nothing to verify against
        env.coord.verifier = FakeVerifier(ErrorCode.NONE)
        assert await env.coord.txn_commit_offsets("tx", "g", PID, 0, -1, "", {TP0: om(50)}) == \
            {TP0: ErrorCode.NONE}
        await env.coord.stop()
    run(body())
