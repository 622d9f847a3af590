"""KIP-447 draft ownership across a consumer group's life, on real processes
(2 transaction coordinators, 2 group coordinators): a group used by group-aware
producers, emptied and deleted (DeleteGroups), then created again by new members;
the group's generation moving on through rebalances; coordinator failovers in
between. CONCURRENT_PRODUCER_COMMIT is "owned by another producer in this
generation": ownership recorded for a generation the group has left, or for a
group that was deleted, never refuses a commit, while a zombie of an older
generation is still refused."""
from __future__ import annotations

from typing import NamedTuple

import pytest

from clusters import REPLICATED_TXN_LOG, committed
from exactly import AdminClient, ConsumerGroupMetadata, Producer, TopicPartition, errors
from exactly._client import COORDINATOR_GROUP, COORDINATOR_TRANSACTION_GROUP

from waiting import wait_for
from .test_kip447 import member, settle
from .test_producer import _name, create_topic, producer, read_all

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster2(make_cluster):
    return make_cluster(txn_coordinators=2, group_coordinators=2, props=REPLICATED_TXN_LOG)


class UsedGroup(NamedTuple):
    """A group after `use_then_delete`: its old group-aware producer (still open, a
    zombie once the group is gone) and that producer's group metadata."""

    aware: Producer
    old: ConsumerGroupMetadata


def delete_group(cluster, group: str) -> None:
    """DeleteGroups once the group is Empty (its last member's leave is stored)."""
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        def deleted():
            try:
                admin.delete_groups([group])
            except (errors.NonEmptyGroupError, errors.RebalanceInProgressError):
                return False
            return True
        wait_for(deleted, 60, f"group {group} to be deleted")


def use_then_delete(cluster, group: str, src: str, dst: str) -> UsedGroup:
    """The group's generation is raised to 3 by two members joining and one leaving;
    a group-aware producer of generation 3 commits both partitions of `src` (offset
    1) with a record of `dst`; the last member leaves and the group is deleted."""
    c1 = member(cluster, group, src)
    aware = producer(cluster, **{"transactional.id": _name("aware")})
    try:
        settle(c1)
        c2 = member(cluster, group, src)
        try:
            settle(c1, c2)
        finally:
            c2.close()
        wait_for(lambda: c1.poll(0.1) or len(c1.assignment()) == 2, 60, "the remaining member to own both")
        gm = c1.group_metadata()
        assert gm.generation_id >= 3
        aware.init_transactions_for_group(sorted(c1.assignment()), gm)
        with aware.transaction():
            aware.send(dst, b"old-group", partition=0)
            aware.send_offsets_to_transaction({TopicPartition(src, 0): 1, TopicPartition(src, 1): 1}, gm)
    finally:
        c1.close()
    delete_group(cluster, group)
    return UsedGroup(aware, gm)


def kill_owner(cluster, group: str, key_type: int) -> None:
    """SIGKILL the coordinator of `group` (`key_type`) and wait until another owns it."""
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        core = admin._core
        addr = core.find_coordinator(group, key_type)
        cluster.kill(next(s.name for s in cluster.services.values() if s.address == addr))

        def moved():
            core.invalidate_coordinator(group, key_type)
            try:
                return core.find_coordinator(group, key_type, 2) != addr
            except errors.ExactlyError:
                return False
        wait_for(moved, 60, "another coordinator to own the group's partition")


def recreated_group_commits(cluster, group: str, src: str, dst: str, used: UsedGroup) -> None:
    """New members create the group again (generation 1): a classic transactional
    producer commits with the member's metadata and without a generation, and the old
    group's producer, a zombie, is refused."""
    tp0, tp1 = TopicPartition(src, 0), TopicPartition(src, 1)
    c = member(cluster, group, src)
    classic = producer(cluster, **{"transactional.id": _name("classic")})
    try:
        gm = ConsumerGroupMetadata(group, settle(c), c.group_metadata().member_id)
        assert gm.generation_id < used.old.generation_id  # the new group's generations start again
        classic.init_transactions(30)
        with classic.transaction():
            classic.send(dst, b"classic-with-generation", partition=0)
            classic.send_offsets_to_transaction({tp0: 2}, gm)
        with classic.transaction():
            classic.send(dst, b"classic-without-generation", partition=0)
            classic.send_offsets_to_transaction({tp1: 2}, ConsumerGroupMetadata(group))
        assert committed(cluster, group, [tp0, tp1]) == {tp0: 2, tp1: 2}
        # The deleted group's producer is a zombie: its generation is not the group's.
        used.aware.begin_transaction()
        used.aware.send(dst, b"zombie", partition=0)
        with pytest.raises((errors.IllegalGenerationError, errors.UnknownMemberIdError)):
            used.aware.send_offsets_to_transaction({tp0: 9}, used.old)
        used.aware.abort_transaction(30)
        assert committed(cluster, group, [tp0, tp1]) == {tp0: 2, tp1: 2}
    finally:
        c.close()
        classic.close()
        used.aware.close()
    assert sorted(r.value for r in read_all(cluster, dst, 1, "read_committed", expected=3)) == \
        [b"classic-with-generation", b"classic-without-generation", b"old-group"]


def test_a_deleted_groups_producers_do_not_block_the_group_created_again(cluster2):
    src, dst = create_topic(cluster2, 2), create_topic(cluster2, 1)
    group = _name("billing")
    used = use_then_delete(cluster2, group, src, dst)
    recreated_group_commits(cluster2, group, src, dst, used)


@pytest.mark.parametrize("key_type", [COORDINATOR_GROUP, COORDINATOR_TRANSACTION_GROUP],
                         ids=["group-coordinator", "transaction-coordinator"])
def test_the_same_after_a_coordinator_failover_between_deletion_and_creation(cluster2, key_type):
    src, dst = create_topic(cluster2, 2), create_topic(cluster2, 1)
    group = _name("billing")
    used = use_then_delete(cluster2, group, src, dst)
    kill_owner(cluster2, group, key_type)
    recreated_group_commits(cluster2, group, src, dst, used)


def test_a_producer_of_a_past_generation_blocks_nobody_once_the_generation_moved_on(cluster2):
    """A group-aware producer committed in generation g; the group rebalances to g+1.
    Its zombie is refused; a classic producer without a generation is refused while
    g is current (the draft's "Compatibility" fencing) and commits once it is not."""
    src, dst = create_topic(cluster2, 1), create_topic(cluster2, 1)
    group = _name("billing")
    tp = TopicPartition(src, 0)
    c1 = member(cluster2, group, src)
    aware = producer(cluster2, **{"transactional.id": _name("aware")})
    legacy = producer(cluster2, **{"transactional.id": _name("legacy")})
    c2 = None
    try:
        gen = settle(c1)
        old = c1.group_metadata()
        aware.init_transactions_for_group([tp], old)
        with aware.transaction():
            aware.send(dst, b"aware", partition=0)
            aware.send_offsets_to_transaction({tp: 1}, old)
        legacy.init_transactions(30)
        legacy.begin_transaction()
        legacy.send(dst, b"refused", partition=0)
        with pytest.raises(errors.ConcurrentProducerCommitError):
            legacy.send_offsets_to_transaction({tp: 5}, ConsumerGroupMetadata(group))
        legacy.abort_transaction(30)
        # The generation moves on: a second member joins (the one partition goes to one of them).
        c2 = member(cluster2, group, src)

        def moved_on():
            for c in (c1, c2):
                c.poll(0.1)
            gens = {c.group_metadata().generation_id for c in (c1, c2)}
            return len(gens) == 1 and gens.pop() > gen
        wait_for(moved_on, 60, "the group's next generation")
        aware.begin_transaction()
        aware.send(dst, b"zombie", partition=0)
        with pytest.raises(errors.IllegalGenerationError):
            aware.send_offsets_to_transaction({tp: 9}, old)
        aware.abort_transaction(30)
        with legacy.transaction():
            legacy.send(dst, b"legacy", partition=0)
            legacy.send_offsets_to_transaction({tp: 2}, ConsumerGroupMetadata(group))
        assert committed(cluster2, group, [tp]) == {tp: 2}
    finally:
        for c in (c1, c2):
            if c is not None:
                c.close()
        aware.close()
        legacy.close()
    assert sorted(r.value for r in read_all(cluster2, dst, 1, "read_committed", expected=2)) == \
        [b"aware", b"legacy"]
