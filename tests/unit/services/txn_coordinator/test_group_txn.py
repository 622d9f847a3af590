"""The KIP-447 draft of the transaction coordinator (group_txn.GroupTxn): generations,
fencing of the group's other producers, group assignment records."""
from __future__ import annotations

import asyncio

import pytest

from txn_coordinator_fakes import GroupCommitLog, Harness, run, txn_settings, replayed
from exactly_wire.error_codes import ErrorCode
from services.txn_coordinator.state import GroupAssignment, TxnState

S = TxnState
E = ErrorCode


def test_group_aware_init_rejects_stale_generation():
    async def scenario():
        h = Harness()
        await h.elect()
        g5 = GroupAssignment("g", 5, frozenset({("in", 0)}))
        assert (await h.coord.init_producer_id("p1", 60000, group=g5)).error == E.NONE
        g4 = GroupAssignment("g", 4, frozenset({("in", 1)}))
        assert (await h.coord.init_producer_id("p2", 60000, group=g4)).error == E.ILLEGAL_GENERATION
        assert h.md("p1").group == g5 and h.md("p2") is None
        assert replayed(h.log.entries()).groups == {"g": {"p1": g5}}

    run(scenario())


def test_group_aware_init_fences_overlapping_ongoing_transaction_and_waits_for_it():
    """KIP-447 draft: the new owner's init aborts the old owner's open transaction on
    the partitions it now gets, with an epoch bump that fences the old owner, and
    answers PENDING_TRANSACTION (retriable) until that transaction is complete."""
    async def scenario():
        h = Harness()
        await h.elect()
        g1 = GroupAssignment("g", 1, frozenset({("in", 0), ("in", 1)}))
        r1 = await h.coord.init_producer_id("p1", 60000, group=g1)
        assert await h.coord.add_partitions_to_txn("p1", r1.producer_id, r1.producer_epoch, [("orders", 0)],
                                                   group_id="g", generation_id=1) == {("orders", 0): E.NONE}
        h.markers.gate = asyncio.Event()  # the abort's markers wait
        g2 = GroupAssignment("g", 2, frozenset({("in", 1)}))
        assert (await h.coord.init_producer_id("p2", 60000, group=g2)).error == E.PENDING_TRANSACTION
        await asyncio.sleep(0)
        assert (await h.coord.init_producer_id("p2", 60000, group=g2)).error == E.PENDING_TRANSACTION
        h.markers.gate.set()
        await h.settle()
        assert (h.md("p1").state, h.md("p1").producer_epoch) == (S.COMPLETE_ABORT, r1.producer_epoch + 1)
        r2 = await h.coord.init_producer_id("p2", 60000, group=g2)
        assert r2.error == E.NONE
        # The old owner is fenced: its epoch is gone, and its generation is outdated.
        assert await h.coord.add_partitions_to_txn("p1", r1.producer_id, r1.producer_epoch, [("orders", 1)],
                                                   group_id="g", generation_id=1) == {("orders", 1): E.PRODUCER_FENCED}

    run(scenario())


def test_group_aware_init_leaves_non_overlapping_transactions_alone():
    async def scenario():
        h = Harness()
        await h.elect()
        r1 = await h.coord.init_producer_id("p1", 60000, group=GroupAssignment("g", 1, frozenset({("in", 0)})))
        await h.coord.add_partitions_to_txn("p1", r1.producer_id, r1.producer_epoch, [("orders", 0)],
                                            group_id="g", generation_id=1)
        g2 = GroupAssignment("g", 2, frozenset({("in", 1)}))
        assert (await h.coord.init_producer_id("p2", 60000, group=g2)).error == E.NONE
        assert h.md("p1").state is S.ONGOING

    run(scenario())


def test_every_transactional_rpc_refuses_an_older_generation():
    """KIP-447 draft: "Once the coordinator observes a generation bump for a group, it
    will refuse to handle requests from the previous generation" — on AddPartitionsToTxn,
    AddOffsetsToTxn, EndTxn and PrepareTxn, as on InitProducerId; a producer must
    carry the generation it initialised with."""
    async def scenario():
        h = Harness()
        await h.elect()
        r1 = await h.coord.init_producer_id("p1", 60000, group=GroupAssignment("g", 1, frozenset({("in", 0)})))
        pid, epoch = r1.producer_id, r1.producer_epoch
        assert await h.coord.add_partitions_to_txn("p1", pid, epoch, [("orders", 0)], group_id="g",
                                                   generation_id=1) == {("orders", 0): E.NONE}
        assert (await h.coord.init_producer_id("p2", 60000, group=GroupAssignment("g", 2, frozenset({("in", 1)})))
                ).error == E.NONE
        zombie = dict(group_id="g", generation_id=1)
        assert await h.coord.add_partitions_to_txn("p1", pid, epoch, [("orders", 1)], **zombie) == \
            {("orders", 1): E.ILLEGAL_GENERATION}
        assert await h.coord.add_offsets_to_txn("p1", pid, epoch, "g", "g", 1) == E.ILLEGAL_GENERATION
        assert (await h.coord.end_txn("p1", pid, epoch, True, **zombie)).error == E.ILLEGAL_GENERATION
        assert await h.coord.prepare_txn("p1", pid, epoch, **zombie) == E.ILLEGAL_GENERATION
        # Claiming the new generation without initialising with it is refused too.
        assert (await h.coord.end_txn("p1", pid, epoch, True, "g", 2)).error == E.ILLEGAL_GENERATION
        # The only way on: InitProducerId with the new generation (aborts p1's transaction).
        g2 = GroupAssignment("g", 2, frozenset({("in", 0)}))
        assert (await h.coord.init_producer_id("p1", 60000, group=g2)).error == E.CONCURRENT_TRANSACTIONS
        await h.settle()
        r = await h.coord.init_producer_id("p1", 60000, group=g2)
        assert r.error == E.NONE
        assert await h.coord.add_partitions_to_txn("p1", r.producer_id, r.producer_epoch, [("orders", 1)],
                                                   group_id="g", generation_id=2) == {("orders", 1): E.NONE}
        assert (await h.coord.end_txn("p1", r.producer_id, r.producer_epoch, True, "g", 2)).error == E.NONE

    run(scenario())


def test_group_assignments_are_replayed_on_failover():
    async def scenario():
        h = Harness(txn_partitions=4)
        group_partition = h.topology.txn_partition_for("g")
        await h.elect(group_partition)
        g3 = GroupAssignment("g", 3, frozenset({("in", 0)}))
        assert (await h.coord.init_producer_id("p1", 60000, group=g3)).error == E.NONE
        assert h.md("p1", group_partition).group == g3
        await h.coord.on_resigned(group_partition)
        await h.elect(group_partition, coordinator_epoch=2)
        part = h.coord.partitions.get(group_partition)
        assert part.groups == {"g": {"p1": g3}} and part.generation("g") == 3
        assert h.md("p1", group_partition).group == g3
        stale = GroupAssignment("g", 2, frozenset({("in", 1)}))
        assert (await h.coord.init_producer_id("p2", 60000, group=stale)).error == E.ILLEGAL_GENERATION

    run(scenario())


def test_group_aware_producers_live_on_the_partition_of_their_group():
    async def scenario():
        h = Harness(txn_partitions=8)
        tid = next(t for t in (f"p{i}" for i in range(100))
                   if h.topology.txn_partition_for(t) != h.topology.txn_partition_for("g"))
        await h.elect(h.topology.txn_partition_for("g"))
        assert (await h.coord.init_producer_id(tid, 60000)).error == E.NOT_COORDINATOR
        group = GroupAssignment("g", 1, frozenset({("in", 0)}))
        assert (await h.coord.init_producer_id(tid, 60000, group=group)).error == E.NONE
        assert (await h.coord.init_producer_id("bad\0id", 60000)).error == E.INVALID_REQUEST
        assert (await h.coord.init_producer_id(tid, 60000, group=GroupAssignment("", 1))).error == \
            E.INVALID_GROUP_ID

    run(scenario())


def test_expired_group_aware_id_leaves_a_group_tombstone():
    async def scenario():
        h = Harness(txn_settings({"transactional.id.expiration.ms": 1000}))
        await h.elect()
        assert (await h.coord.init_producer_id("p1", 60000, group=GroupAssignment("g", 1, frozenset()))).error \
            == E.NONE
        h.clock.advance(2000)
        assert await h.coord.scans.expire_transactional_ids() == 1
        assert replayed(h.log.entries()).groups == {}
        assert h.coord.partitions.get(0).groups == {}

    run(scenario())


def test_a_group_aware_init_cancelled_while_its_group_record_waits_in_the_group_commit():
    """KIP-447 draft: the group assignment record of a cancelled InitProducerId goes
    out all the same, and the cache takes the assignment from the append's result,
    so a stale generation is refused here as a new owner would refuse it."""
    async def scenario():
        h = Harness(log=GroupCommitLog())
        await h.elect()
        g5 = GroupAssignment("g", 5, frozenset({("in", 0)}))
        h.log.request_gate = asyncio.Event()
        request = asyncio.create_task(h.coord.init_producer_id("p1", 60000, group=g5))
        await h.log.requested.wait()
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        h.log.request_gate.set()
        await h.log.answered.wait()
        await h.settle()
        assert h.coord.partitions.get(0).groups == replayed(h.log.entries()).groups == {"g": {"p1": g5}}
        g4 = GroupAssignment("g", 4, frozenset({("in", 1)}))
        assert (await h.coord.init_producer_id("p2", 60000, group=g4)).error == E.ILLEGAL_GENERATION

    run(scenario())
