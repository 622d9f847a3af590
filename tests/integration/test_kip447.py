"""KIP-447 draft on real processes (2 transaction coordinators, 2 group coordinators):
group-aware InitProducerId, generation fencing on every transactional RPC,
CONCURRENT_PRODUCER_COMMIT, PENDING_TRANSACTION, and the group assignment across a
transaction-coordinator failover."""
from __future__ import annotations

import pytest

from clusters import REPLICATED_TXN_LOG, committed
from exactly import Consumer, ConsumerGroupMetadata, Producer, TopicPartition, errors
from exactly._client import COORDINATOR_TRANSACTION_GROUP
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb

from waiting import wait_for
from .test_producer import _name, create_topic, producer, read_all

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster2(make_cluster):
    return make_cluster(txn_coordinators=2, group_coordinators=2, props=REPLICATED_TXN_LOG)


def member(cluster, group: str, topic: str) -> Consumer:
    c = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    c.subscribe([topic])
    return c


def settle(*consumers: Consumer) -> int:
    """Poll every member until all hold a non-empty assignment of one generation."""
    def stable():
        for c in consumers:
            c.poll(0.1)
        gens = {c.group_metadata().generation_id for c in consumers}
        return len(gens) == 1 and all(c.assignment() for c in consumers) and gens.pop()
    return wait_for(stable, 60, "the group to settle")


def txn_stub(p: Producer, group: str):
    core = p._core
    return core.txn_stub(core.find_coordinator(group, COORDINATOR_TRANSACTION_GROUP))


def group_init(stub, tid: str, group: str, generation: int, partitions) -> pb.InitProducerIdResponse:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return stub.InitProducerId(pb.InitProducerIdRequest(
        transactional_id=tid, transaction_timeout_ms=60000, consumer_group_id=group, generation_id=generation,
        assigned_partitions=[pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]), timeout=30)


def test_a_zombie_of_an_older_generation_is_refused_on_every_transactional_rpc(cluster2):
    src, dst = create_topic(cluster2, 2), create_topic(cluster2, 2)
    group = _name("g")
    c1 = member(cluster2, group, src)
    p1 = producer(cluster2, **{"transactional.id": _name("tx")})
    p2 = producer(cluster2, **{"transactional.id": _name("tx")})
    c2 = None
    try:
        gen1 = settle(c1)
        p1.init_transactions_for_group(sorted(c1.assignment()), c1.group_metadata())
        pid, epoch = p1._txn.producer_id, p1._txn.producer_epoch
        c2 = member(cluster2, group, src)
        gen2 = settle(c1, c2)
        assert gen2 > gen1
        p2.init_transactions_for_group(sorted(c2.assignment()), group, gen2)
        stub = txn_stub(p1, group)
        zombie = dict(transactional_id=p1._transactional_id, producer_id=pid, producer_epoch=epoch,
                      consumer_group_id=group, generation_id=gen1)
        add = stub.AddPartitionsToTxn(pb.AddPartitionsToTxnRequest(
            topics=[pb.TopicPartitions(topic=dst, partitions=[0])], **zombie), timeout=30)
        assert add.results[0].partitions[0].error_code == ErrorCode.ILLEGAL_GENERATION
        offsets = stub.AddOffsetsToTxn(pb.AddOffsetsToTxnRequest(group_id=group, **zombie), timeout=30)
        assert offsets.error_code == ErrorCode.ILLEGAL_GENERATION
        end = stub.EndTxn(pb.EndTxnRequest(committed=True, **zombie), timeout=30)
        assert end.error_code == ErrorCode.ILLEGAL_GENERATION
        prepare = stub.PrepareTxn(pb.PrepareTxnRequest(**zombie), timeout=30)
        assert prepare.error_code == ErrorCode.ILLEGAL_GENERATION
        init = group_init(stub, p1._transactional_id, group, gen1, c1.assignment())
        assert init.error_code == ErrorCode.ILLEGAL_GENERATION
        # Through the SDK: the zombie's transaction cannot commit.
        p1.begin_transaction()
        p1.send(dst, b"zombie", partition=0)
        with pytest.raises(errors.IllegalGenerationError):
            p1.commit_transaction(30)
        p1.abort_transaction(30)
        # Initialised with the current generation, it goes on.
        p1.init_transactions_for_group(sorted(c1.assignment()), c1.group_metadata())
        with p1.transaction():
            p1.send(dst, b"after-init", partition=0)
    finally:
        for c in (c1, c2):
            if c is not None:
                c.close()
        p1.close()
        p2.close()
    assert [r.value for r in read_all(cluster2, dst, 2, "read_committed", expected=1)] == [b"after-init"]


def test_offsets_of_another_members_partition_get_concurrent_producer_commit(cluster2):
    src, dst = create_topic(cluster2, 2), create_topic(cluster2, 1)
    group = _name("g")
    ca, cb = member(cluster2, group, src), member(cluster2, group, src)
    pa = producer(cluster2, **{"transactional.id": _name("tx")})
    try:
        settle(ca, cb)
        mine, theirs = sorted(ca.assignment()), sorted(cb.assignment())
        assert mine and theirs
        pa.init_transactions_for_group(mine, ca.group_metadata())
        pa.begin_transaction()
        pa.send(dst, b"a")
        with pytest.raises(errors.ConcurrentProducerCommitError) as info:
            pa.send_offsets_to_transaction({theirs[0]: 1}, ca.group_metadata())
        assert info.value.txn_requires_abort
        pa.abort_transaction(30)
        with pa.transaction():  # its own partitions are fine
            pa.send(dst, b"b")
            pa.send_offsets_to_transaction({mine[0]: 1}, ca.group_metadata())
        # EndTxn answers once the commit is decided; `committed` waits until it is stable.
        assert committed(cluster2, group, [mine[0]]) == {mine[0]: 1}
    finally:
        ca.close()
        cb.close()
        pa.close()


def test_a_new_owners_init_waits_for_the_old_owners_open_transaction(cluster2):
    src, dst = create_topic(cluster2, 2), create_topic(cluster2, 1)
    group = _name("g")
    ca = member(cluster2, group, src)
    pa = producer(cluster2, **{"transactional.id": _name("tx")})
    pb_ = producer(cluster2, **{"transactional.id": _name("tx")})
    cb = None
    try:
        settle(ca)
        pa.init_transactions_for_group(sorted(ca.assignment()), ca.group_metadata())  # both partitions
        pa.begin_transaction()
        pa.send(dst, b"old-owner")
        pa.flush(30)  # in the log, transaction open: the LSO is pinned
        cb = member(cluster2, group, src)
        gen2 = settle(ca, cb)
        moved = sorted(cb.assignment())
        raw = group_init(txn_stub(pb_, group), pb_._transactional_id, group, gen2, moved)
        assert raw.error_code == ErrorCode.PENDING_TRANSACTION  # the old owner's transaction is open
        pb_.init_transactions_for_group(moved, group, gen2)  # returns once it is complete
        with pytest.raises(errors.ProducerFencedError):
            pa.commit_transaction(30)
        with pb_.transaction():
            pb_.send(dst, b"new-owner")
    finally:
        for c in (ca, cb):
            if c is not None:
                c.close()
        pa.close()
        pb_.close()
    assert [r.value for r in read_all(cluster2, dst, 1, "read_committed", expected=1)] == [b"new-owner"]
    assert sorted(r.value for r in read_all(cluster2, dst, 1, "read_uncommitted", expected=2)) == \
        [b"new-owner", b"old-owner"]


def test_the_group_assignment_survives_a_transaction_coordinator_failover(cluster2):
    group, tid = _name("g"), _name("tx")
    p = producer(cluster2, **{"transactional.id": tid})
    try:
        stub = txn_stub(p, group)
        parts = [TopicPartition("in", 0)]
        assert wait_for(lambda: group_init(stub, tid, group, 5, parts).error_code == ErrorCode.NONE, 30,
                        "the group-aware init")
        owner_addr = p._core.find_coordinator(group, COORDINATOR_TRANSACTION_GROUP)
        owner = next(s.name for s in cluster2.services.values() if s.address == owner_addr)
        cluster2.kill(owner)

        def moved():
            p._core.invalidate_coordinator(group, COORDINATOR_TRANSACTION_GROUP)
            try:
                addr = p._core.find_coordinator(group, COORDINATOR_TRANSACTION_GROUP, 2)
            except errors.ExactlyError:
                return None
            return addr if addr != owner_addr else None
        new_addr = wait_for(moved, 60, "another transaction coordinator to own the group's partition")
        stub = p._core.txn_stub(new_addr)

        def answer(generation: int, who: str) -> tuple[int] | None:
            # Retried as a client retries: the new owner may still be loading, or load the
            # partition again when an append of its own meets the move of the log's
            # leadership to it (an outcome unknown: it reloads from the log).
            code = group_init(stub, who, group, generation, parts).error_code
            return None if code in (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.NOT_COORDINATOR) else (code,)
        assert wait_for(lambda: answer(4, _name("tx")), 60, "an answer after the failover") == \
            (ErrorCode.ILLEGAL_GENERATION,)  # generation 5 was replayed from the log
        assert wait_for(lambda: answer(5, tid), 60, "the group-aware init after the failover") == (ErrorCode.NONE,)
    finally:
        p.close()


def test_a_mixed_group_refuses_the_stale_per_partition_producer(cluster2):
    """The draft's "Compatibility" section: in a group where a producer with a
    transactional.id per input partition (no generation) and a group-aware producer
    meet, the group coordinator remembers who committed each partition's offsets
    last and answers CONCURRENT_PRODUCER_COMMIT to the stale one."""
    src, dst = create_topic(cluster2, 1), create_topic(cluster2, 1)
    group = _name("g")
    tp = TopicPartition(src, 0)
    legacy = producer(cluster2, **{"transactional.id": _name("app-0")})
    c = member(cluster2, group, src)
    aware = producer(cluster2, **{"transactional.id": _name("tx")})
    try:
        legacy.init_transactions(30)
        with legacy.transaction():  # an old-style producer commits without a generation
            legacy.send(dst, b"legacy-1")
            legacy.send_offsets_to_transaction({tp: 1}, ConsumerGroupMetadata(group))
        settle(c)
        aware.init_transactions_for_group([tp], c.group_metadata())
        with aware.transaction():
            aware.send(dst, b"aware-2")
            aware.send_offsets_to_transaction({tp: 2}, c.group_metadata())
        legacy.begin_transaction()
        legacy.send(dst, b"legacy-stale")
        with pytest.raises(errors.ConcurrentProducerCommitError):
            legacy.send_offsets_to_transaction({tp: 3}, ConsumerGroupMetadata(group))
        legacy.abort_transaction(30)
        # EndTxn answers before the markers; `committed` waits for the aware commit.
        assert committed(cluster2, group, [tp]) == {tp: 2}
    finally:
        c.close()
        legacy.close()
        aware.close()
    assert sorted(r.value for r in read_all(cluster2, dst, 1, "read_committed", expected=2)) == \
        [b"aware-2", b"legacy-1"]
