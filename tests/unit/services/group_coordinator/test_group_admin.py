"""ListGroups, DescribeGroups and DeleteGroups in the group coordinator: states,
offset-only groups, NON_EMPTY_GROUP, tombstones that a reload honours, and the
KIP-447 draft ownership that deletion ends."""
from __future__ import annotations

from exactly_wire.error_codes import ErrorCode
from services.group_coordinator.offsets import OffsetAndMetadata

from .test_group_coordinator_service import PID, TP0, TP1, Env, om, partition_for, run


async def _member_with_offsets(group: str, offsets: dict):
    """A started Env whose group `group` has one member (returned) that committed
    `offsets` ({partition: offset})."""
    env = await Env().up()
    a = await env.join(group)
    assert await env.coord.commit_offsets(group, a.generation_id, a.member_id,
                                          {tp: OffsetAndMetadata(o) for tp, o in offsets.items()}) == \
        {tp: ErrorCode.NONE for tp in offsets}
    return env, a


def test_list_describe_delete():
    async def body():
        env, a = await _member_with_offsets("g", {TP0: 5, TP1: 7})
        assert await env.coord.commit_offsets("simple", -1, "", {TP0: OffsetAndMetadata(1)}) == {TP0: ErrorCode.NONE}
        code, groups = env.coord.list_groups()
        assert code == ErrorCode.NONE
        assert [(g.group_id, g.state, g.protocol_type) for g in groups] == [
            ("g", env.coord.group("g").state.value, "consumer"), ("simple", "Empty", "")]
        assert groups[0].state in ("CompletingRebalance", "Stable")
        assert [g.group_id for g in env.coord.list_groups(["empty"])[1]] == ["simple"]
        d = env.coord.describe_group("g")
        assert d.error == ErrorCode.NONE and d.generation == a.generation_id and d.protocol_name == "range"
        assert [(m.member_id, m.subscription) for m in d.members] == [(a.member_id, ("orders",))]
        assert env.coord.describe_group("simple").state == "Empty"
        assert env.coord.describe_group("ghost").state == "Dead"
        assert env.coord.describe_group("").error == ErrorCode.INVALID_GROUP_ID

        assert await env.coord.delete_groups(["g", "ghost"]) == {"g": ErrorCode.NON_EMPTY_GROUP,
                                                                  "ghost": ErrorCode.GROUP_ID_NOT_FOUND}
        assert await env.coord.leave_group("g", a.member_id) == ErrorCode.NONE
        assert await env.coord.delete_groups(["g", "simple"]) == {"g": ErrorCode.NONE, "simple": ErrorCode.NONE}
        assert env.coord.list_groups()[1] == []
        assert env.coord.describe_group("g").state == "Dead"
        assert (await env.coord.fetch_offsets("g", None, False)) == (ErrorCode.NONE, {})
        await env.coord.stop()

        # A new owner replays the tombstones: nothing of either group comes back.
        again = await Env(log=env.log).up()
        assert again.coord.list_groups() == (ErrorCode.NONE, [])
        assert (await again.coord.fetch_offsets("simple", None, False)) == (ErrorCode.NONE, {})
        # The name can be used again.
        b = await again.join("g")
        assert b.error == ErrorCode.NONE
        await again.coord.stop()
    run(body())


def test_offset_delete():
    """OffsetDelete (KIP-496): a subscribed topic's offsets stay while the group has
    members (GROUP_SUBSCRIBED_TO_TOPIC); an unsubscribed one's go, and a new owner's
    replay keeps them gone; an unknown group is GROUP_ID_NOT_FOUND."""
    other = type(TP0)("audit", 0)

    async def body():
        env, a = await _member_with_offsets("g", {TP0: 5, other: 9})
        assert await env.coord.delete_offsets("g", [TP0, other]) == (
            ErrorCode.NONE, {TP0: ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC, other: ErrorCode.NONE})
        _, fetched = await env.coord.fetch_offsets("g", None, False)
        assert set(fetched) == {TP0}
        assert await env.coord.delete_offsets("ghost", [TP0]) == (ErrorCode.GROUP_ID_NOT_FOUND, {})
        assert await env.coord.leave_group("g", a.member_id) == ErrorCode.NONE
        assert await env.coord.delete_offsets("g", [TP0]) == (ErrorCode.NONE, {TP0: ErrorCode.NONE})
        assert (await env.coord.fetch_offsets("g", None, False)) == (ErrorCode.NONE, {})
        await env.coord.stop()
        again = await Env(log=env.log).up()
        assert (await again.coord.fetch_offsets("g", None, False)) == (ErrorCode.NONE, {})
        await again.coord.stop()
    run(body())


def test_a_deleted_groups_committers_own_nothing_in_the_group_created_again():
    """KIP-447 draft, CONCURRENT_PRODUCER_COMMIT: a group-aware producer's ownership of a
    partition belongs to its generation of that group; DeleteGroups ends it, so the
    group created again (generation 1 again) takes commits of any producer, and a new
    owner that replays the log answers the same."""
    legacy = ("tx-legacy", "g", PID + 1, 0, -1, "")

    async def body():
        env = await Env().up()
        a = await env.join("g")
        assert a.generation_id == 1
        assert await env.coord.txn_commit_offsets("tx-aware", "g", PID, 0, 1, a.member_id, {TP0: om(5)}) == \
            {TP0: ErrorCode.NONE}
        env.log.write_marker(partition_for("g"), PID, committed=True)
        assert await env.coord.txn_commit_offsets(*legacy, {TP0: om(6)}) == {TP0: ErrorCode.CONCURRENT_PRODUCER_COMMIT}
        assert await env.coord.leave_group("g", a.member_id) == ErrorCode.NONE
        assert await env.coord.delete_groups(["g"]) == {"g": ErrorCode.NONE}
        b = await env.join("g")
        assert b.generation_id == 1  # the generation of the deleted group's owner, again
        assert await env.coord.txn_commit_offsets(*legacy, {TP0: om(7)}) == {TP0: ErrorCode.NONE}
        assert await env.coord.txn_commit_offsets("tx-classic", "g", PID + 2, 0, 1, b.member_id,
                                                  {TP0: om(8)}) == {TP0: ErrorCode.NONE}
        await env.coord.stop()
        again = await Env(log=env.log).up()
        assert await again.coord.txn_commit_offsets(*legacy, {TP0: om(9)}) == {TP0: ErrorCode.NONE}
        await again.coord.stop()
    run(body())


def test_deleted_offsets_are_owned_by_nobody():
    """OffsetDelete of a partition ends its committer's ownership (KIP-447 draft)."""
    audit = type(TP0)("audit", 0)

    async def body():
        env = await Env().up()
        a = await env.join("g")
        assert await env.coord.txn_commit_offsets("tx-aware", "g", PID, 0, a.generation_id, a.member_id,
                                                  {audit: om(5), TP0: om(5)}) == {audit: ErrorCode.NONE,
                                                                                  TP0: ErrorCode.NONE}
        env.log.write_marker(partition_for("g"), PID, committed=True)
        await env.until(lambda: not env.coord.partition_state(partition_for("g")).offsets.has_pending("g", audit))
        legacy = ("tx-legacy", "g", PID + 1, 0, -1, "")
        assert await env.coord.txn_commit_offsets(*legacy, {audit: om(6), TP0: om(6)}) == {
            audit: ErrorCode.CONCURRENT_PRODUCER_COMMIT, TP0: ErrorCode.CONCURRENT_PRODUCER_COMMIT}
        assert await env.coord.delete_offsets("g", [audit, TP0]) == (
            ErrorCode.NONE, {audit: ErrorCode.NONE, TP0: ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC})
        assert await env.coord.txn_commit_offsets(*legacy, {audit: om(7), TP0: om(7)}) == {
            audit: ErrorCode.NONE, TP0: ErrorCode.CONCURRENT_PRODUCER_COMMIT}
        await env.coord.stop()
    run(body())
