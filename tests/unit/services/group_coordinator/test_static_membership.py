"""Static membership (KIP-345): group.instance.id -> member id, a restarted static
member takes its old assignment back without a rebalance, the replaced member id
is fenced (FENCED_INSTANCE_ID), and the replacement survives a coordinator
failover. Pure group logic first, then the coordinator over an in-memory log."""
from __future__ import annotations

import asyncio

from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from services.group_coordinator.group import GroupState, validate_offset_commit
from services.group_coordinator.offsets import OffsetAndMetadata

from .gc_fakes import FakeLog
from .test_group_coordinator_service import SESSION, Env, run
from .test_group_membership import COUNTS, REBALANCE, T0, make_group, stabilise

SESSION_MS = 10_000


def two_member_group():
    """Stable generation 1: static member "m1" (instance "a") and dynamic "m2"."""
    g = make_group()
    a = g.join("", ("orders",), SESSION_MS, REBALANCE, T0, group_instance_id="a").member_id
    b = g.join("", ("orders",), SESSION_MS, REBALANCE, T0).member_id
    stabilise(g)
    return g, a, b


def test_static_members_are_mapped_and_sorted_first_in_the_assignment():
    g, a, b = two_member_group()
    assert (a, b) == ("m1", "m2")
    assert g.static_members == {"a": "m1"}
    assert g.sync(a, 1, T0) == (ErrorCode.NONE, {"orders": [0, 1, 2]})
    assert g.sync(b, 1, T0) == (ErrorCode.NONE, {"orders": [3, 4, 5]})


def test_a_restarted_static_member_gets_its_assignment_back_without_a_rebalance():
    g, a, b = two_member_group()
    out = g.join("", ("orders",), SESSION_MS, REBALANCE, T0 + 100, group_instance_id="a")
    assert (out.member_id, out.replaced, out.store_then_answer, out.response) == ("m3", "m1", True, None)
    assert g.state is GroupState.STABLE and g.generation == 1
    assert g.static_members == {"a": "m3"} and set(g.members) == {"m2", "m3"}
    assert g.leader == "m3"  # the leader was the replaced member
    assert g.current_join_response("m3").generation_id == 1
    assert g.sync("m3", 1, T0 + 100, "a") == (ErrorCode.NONE, {"orders": [0, 1, 2]})
    # The other member sees nothing.
    assert g.heartbeat(b, 1, T0 + 100) == ErrorCode.NONE
    # The zombie with the old member id is fenced wherever it shows up.
    assert g.heartbeat("m1", 1, T0 + 100, "a") == ErrorCode.FENCED_INSTANCE_ID
    assert g.sync("m1", 1, T0 + 100, "a")[0] == ErrorCode.FENCED_INSTANCE_ID
    assert g.join("m1", ("orders",), SESSION_MS, REBALANCE, T0, group_instance_id="a").response.error == \
        ErrorCode.FENCED_INSTANCE_ID
    assert g.leave("m1", T0, "a") == ErrorCode.FENCED_INSTANCE_ID
    assert validate_offset_commit(g, "m1", 1, False, "a") == ErrorCode.FENCED_INSTANCE_ID
    assert validate_offset_commit(g, "m1", 1, True, "a") == ErrorCode.FENCED_INSTANCE_ID
    assert validate_offset_commit(g, "m3", 1, False, "a") == ErrorCode.NONE
    # Without its instance id the zombie is just unknown.
    assert g.heartbeat("m1", 1, T0 + 100) == ErrorCode.UNKNOWN_MEMBER_ID
    assert g.state is GroupState.STABLE and g.generation == 1


def test_a_restarted_static_member_with_a_new_subscription_rebalances():
    g, a, b = two_member_group()
    out = g.join("", ("orders", "payments"), SESSION_MS, REBALANCE, T0, group_instance_id="a")
    assert (out.replaced, out.store_then_answer) == ("m1", False)
    assert g.state is GroupState.PREPARING_REBALANCE
    g.join(b, ("orders",), SESSION_MS, REBALANCE, T0)
    done = stabilise(g)
    assert done.generation == 2 and done.removed == ()
    assert g.sync(out.member_id, 2, T0)[1] == {"orders": [0, 1, 2], "payments": [0, 1, 2]}


def test_a_static_member_rejoining_during_a_rebalance_waits_with_its_new_id():
    g, a, b = two_member_group()
    g.join(b, ("orders", "payments"), SESSION_MS, REBALANCE, T0)  # b changes its subscription
    assert g.state is GroupState.PREPARING_REBALANCE
    out = g.join("", ("orders",), SESSION_MS, REBALANCE, T0, group_instance_id="a")
    assert out.replaced == "m1" and not out.store_then_answer and out.response is None
    done = stabilise(g)
    assert set(m.member_id for m in done.snapshot.members) == {"m2", out.member_id}


def test_static_members_expire_by_session_timeout_and_their_instance_id_is_freed():
    g, a, b = two_member_group()
    assert g.heartbeat(b, 1, T0 + SESSION_MS - 1) == ErrorCode.NONE
    assert g.expire_members(T0 + SESSION_MS) == [a]
    assert g.static_members == {}
    assert g.state is GroupState.PREPARING_REBALANCE
    # The instance comes back later: a new member, no fencing of anything.
    out = g.join("", ("orders",), SESSION_MS, REBALANCE, T0 + SESSION_MS, group_instance_id="a")
    assert out.replaced == "" and g.static_members == {"a": out.member_id}


def test_snapshots_keep_the_instance_ids():
    g, a, b = two_member_group()
    g.join("", ("orders",), SESSION_MS, REBALANCE, T0, group_instance_id="a")
    snap = g.snapshot()
    again = type(g).from_snapshot(snap, T0)
    assert again.static_members == {"a": "m3"}
    assert again.heartbeat("m1", 1, T0, "a") == ErrorCode.FENCED_INSTANCE_ID
    assert again.sync("m3", 1, T0, "a") == (ErrorCode.NONE, {"orders": [0, 1, 2]})


# ---------------------------------------------------------------- the coordinator

async def static_join(env: Env, group: str, instance: str, member_id: str = ""):
    return await env.coord.join_group(group, member_id, ("orders",), SESSION, 10_000,
                                      group_instance_id=instance)


def test_coordinator_replaces_a_static_member_in_place_and_persists_it():
    async def body():
        log = FakeLog()
        env = await Env(log).up()
        a = await static_join(env, "g", "a")
        join_b = asyncio.create_task(env.join("g"))
        await env.until(lambda: env.coord.group("g").is_(GroupState.PREPARING_REBALANCE))
        a = await static_join(env, "g", "a", a.member_id)
        b = await join_b
        assert a.generation_id == b.generation_id == 2
        assert await env.coord.sync_group("g", 2, a.member_id, "a") == (ErrorCode.NONE, {"orders": [0, 1]})

        a2 = await static_join(env, "g", "a")  # the process restarted
        assert a2.error == ErrorCode.NONE and a2.generation_id == 2 and a2.member_id != a.member_id
        assert env.coord.group("g").is_(GroupState.STABLE)
        assert await env.coord.sync_group("g", 2, a2.member_id, "a") == (ErrorCode.NONE, {"orders": [0, 1]})
        assert await env.coord.heartbeat("g", 2, b.member_id) == ErrorCode.NONE
        assert await env.coord.heartbeat("g", 2, a.member_id, "a") == ErrorCode.FENCED_INSTANCE_ID
        tp = TopicPartition("orders", 0)
        assert await env.coord.commit_offsets("g", 2, a.member_id, {tp: OffsetAndMetadata(5)}, "a") == \
            {tp: ErrorCode.FENCED_INSTANCE_ID}
        assert await env.coord.commit_offsets("g", 2, a2.member_id, {tp: OffsetAndMetadata(5)}, "a") == \
            {tp: ErrorCode.NONE}
        await env.coord.stop()

        # Failover: the replacement was persisted with the same generation.
        second = await Env(log).up()
        g = second.coord.group("g")
        assert g.generation == 2 and g.static_members == {"a": a2.member_id}
        assert await second.coord.sync_group("g", 2, a2.member_id, "a") == (ErrorCode.NONE, {"orders": [0, 1]})
        assert await second.coord.heartbeat("g", 2, a.member_id, "a") == ErrorCode.FENCED_INSTANCE_ID
        await second.coord.stop()
    run(body())


def test_a_failed_store_undoes_the_replacement():
    async def body():
        env = await Env().up()
        a = await static_join(env, "g", "a")
        env.log.produce_error = ErrorCode.NOT_ENOUGH_REPLICAS
        a2 = await static_join(env, "g", "a")
        assert a2.error == ErrorCode.COORDINATOR_NOT_AVAILABLE
        env.log.produce_error = None
        g = env.coord.group("g")
        assert g.static_members == {"a": a.member_id} and set(g.members) == {a.member_id}
        assert await env.coord.heartbeat("g", 1, a.member_id, "a") == ErrorCode.NONE
        await env.coord.stop()
    run(body())


def test_a_waiting_join_of_the_replaced_member_is_answered_fenced():
    async def body():
        env = await Env().up()
        a = await static_join(env, "g", "a")
        join_c = asyncio.create_task(env.join("g"))
        await env.until(lambda: env.coord.group("g").is_(GroupState.PREPARING_REBALANCE))
        a = await static_join(env, "g", "a", a.member_id)
        c = await join_c
        assert a.generation_id == c.generation_id == 2
        join_b = asyncio.create_task(env.join("g"))  # a new member: rebalance; c is slow to rejoin
        await env.until(lambda: env.coord.group("g").is_(GroupState.PREPARING_REBALANCE))
        old = asyncio.create_task(static_join(env, "g", "a", a.member_id))
        await env.until(lambda: env.coord.group("g").members[a.member_id].awaiting_join)
        new = asyncio.create_task(static_join(env, "g", "a"))  # a restarted meanwhile
        assert (await old).error == ErrorCode.FENCED_INSTANCE_ID
        c3 = await env.join("g", c.member_id)
        r_new, r_b = await new, await join_b
        assert (r_new.error, r_b.error) == (ErrorCode.NONE, ErrorCode.NONE)
        assert r_new.generation_id == r_b.generation_id == c3.generation_id == 3
        assert set(r_b.members) == {r_new.member_id, r_b.member_id, c.member_id}
        await env.coord.stop()
    run(body())


def test_a_static_member_is_removed_by_its_instance_id_alone():
    """KIP-345 RemoveMembers: LeaveGroup with member id "" and the instance id removes
    the instance's current member; a stale member id with the instance id is fenced;
    an instance the group does not have is an unknown member."""
    g, a, b = two_member_group()
    assert g.leaving_member_id("", "a") == a and g.leaving_member_id("", "z") == ""
    assert g.leave("", T0, "z") == ErrorCode.UNKNOWN_MEMBER_ID
    assert g.leave("m9", T0, "a") == ErrorCode.FENCED_INSTANCE_ID
    assert g.state is GroupState.STABLE and set(g.members) == {a, b}
    assert g.leave("", T0, "a") == ErrorCode.NONE
    assert set(g.members) == {b} and g.static_members == {}
    assert g.state is GroupState.PREPARING_REBALANCE


def test_coordinator_removes_a_static_member_by_instance_id():
    async def body():
        env = await Env().up()
        a = await static_join(env, "g", "a")
        assert await env.coord.leave_group("g", "", "a") == ErrorCode.NONE
        assert a.member_id not in env.coord.group("g").members
        assert await env.coord.leave_group("g", "", "a") == ErrorCode.UNKNOWN_MEMBER_ID
        await env.coord.stop()
    run(body())
