"""The PartitionLeader servicer in-process on grpc.aio (127.0.0.1:0) over a fake
cluster view: message adaptation, per-partition errors, long-poll Fetch."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from waiting import wait_for_async

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.partition_leader.purgatory import Purgatory
from services.partition_leader.replica_manager import ReplicaManager
from services.partition_leader.servicer import PartitionLeaderServicer

from .conftest import make_batch
from .test_replica_manager import FakeCluster, topic
from services.partition_leader.replicas import HostedReplicas


@pytest.fixture
def manager(tmp_path, store, clock):
    cluster = FakeCluster({"a": topic("a", ["me", "me", "other"])})
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, cluster, store, clock, monotonic_ms=clock))
    m.hosted.refresh()
    yield m
    m.hosted.close()


def run(manager, scenario):
    """Start a server for `manager`, run `await scenario(stub)`, stop the server."""
    async def main():
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        pbg.add_PartitionLeaderServicer_to_server(PartitionLeaderServicer(manager), server)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                return await scenario(pbg.PartitionLeaderStub(ch))
        finally:
            await server.stop(None)
    return asyncio.run(main())


def produce_req(*parts, acks=-1):
    """parts: (topic, partition, batch bytes)."""
    topics = {}
    for t, p, batch in parts:
        topics.setdefault(t, []).append(pb.PartitionProduceData(partition=p, records=batch))
    return pb.ProduceRequest(acks=acks, timeout_ms=1000,
                             topics=[pb.TopicProduceData(name=t, partitions=ps) for t, ps in topics.items()])


def fetch_req(topic_, partition, offset, max_wait_ms=0, isolation_level=0, min_bytes=1, max_bytes=0):
    return pb.FetchRequest(max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
                           isolation_level=isolation_level,
                           topics=[pb.FetchTopic(topic=topic_, partitions=[pb.FetchPartition(
                               partition=partition, fetch_offset=offset, partition_max_bytes=1 << 20,
                               current_leader_epoch=-1)])])


def results(resp):
    return {(t.name, p.partition): (p.error_code, p.base_offset) for t in resp.topics for p in t.partitions}


def test_produce_reports_per_partition_outcomes(manager):
    async def scenario(stub):
        bad = bytearray(make_batch(1))
        bad[-1] ^= 1
        resp = await stub.Produce(produce_req(("a", 0, make_batch(2)), ("a", 1, bytes(bad)),
                                              ("a", 2, make_batch(1)), ("a", 9, make_batch(1)),
                                              ("zz", 0, make_batch(1))))
        assert results(resp) == {("a", 0): (ErrorCode.NONE, 0), ("a", 1): (ErrorCode.CORRUPT_MESSAGE, -1),
                                 ("a", 2): (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1),
                                 ("a", 9): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1),
                                 ("zz", 0): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)}
        resp = await stub.Produce(produce_req(("a", 0, make_batch(1)), acks=2))
        assert results(resp)[("a", 0)][0] == ErrorCode.INVALID_REQUIRED_ACKS
        ctrl = records.encode_control_batch(True, 1, 0, 0, 0)
        assert results(await stub.Produce(produce_req(("a", 0, ctrl))))[("a", 0)][0] == ErrorCode.INVALID_REQUEST
        dup1 = await stub.Produce(produce_req(("a", 0, make_batch(2, pid=3, seq=0))))
        dup2 = await stub.Produce(produce_req(("a", 0, make_batch(2, pid=3, seq=0))))
        assert results(dup1)[("a", 0)] == (ErrorCode.NONE, 2)
        assert results(dup2)[("a", 0)] == (ErrorCode.DUPLICATE_SEQUENCE_NUMBER, 2)
    run(manager, scenario)


def test_fetch_returns_raw_batches_and_offsets(manager):
    async def scenario(stub):
        batch = make_batch(3)
        await stub.Produce(produce_req(("a", 0, batch)))
        resp = await stub.Fetch(fetch_req("a", 0, 0))
        part = resp.responses[0].partitions[0]
        assert (part.error_code, part.high_watermark, part.last_stable_offset, part.log_start_offset) == (0, 3, 3, 0)
        assert part.records[16:] == batch[16:]
        oor = (await stub.Fetch(fetch_req("a", 0, 4))).responses[0].partitions[0]
        assert oor.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
        other = (await stub.Fetch(fetch_req("a", 2, 0))).responses[0].partitions[0]
        assert other.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    run(manager, scenario)


def test_fetch_long_polls_until_an_append(tmp_path, store, clock, now):
    """A Fetch with nothing to read waits in the purgatory: an append answers it with
    the records before its max_wait_ms; without one it is answered empty once
    max_wait_ms passed on the manager's clock (moved by the test), not before."""
    cluster = FakeCluster({"a": topic("a", ["me", "me", "other"])})
    manager = ReplicaManager(HostedReplicas("me", tmp_path, {}, cluster, store, clock, monotonic_ms=clock, monotonic_s=now.now_s))
    manager.hosted.purgatory = Purgatory(now.now_s, timers=False)
    manager.hosted.refresh()

    async def scenario(stub):
        waiting = asyncio.ensure_future(stub.Fetch(fetch_req("a", 0, 0, max_wait_ms=5000), timeout=10))
        await wait_for_async(lambda: len(manager.hosted.purgatory) == 1, 5, "the fetch to wait in the purgatory")
        assert not waiting.done()
        now.advance(4900)
        assert manager.hosted.purgatory.expire_due() == 0
        await stub.Produce(produce_req(("a", 0, make_batch(1))), timeout=10)
        resp = await asyncio.wait_for(waiting, 10)  # answered by the append, within its max_wait_ms
        assert len(resp.responses[0].partitions[0].records) == len(make_batch(1))
        empty = asyncio.ensure_future(stub.Fetch(fetch_req("a", 0, 1, max_wait_ms=300), timeout=10))
        await wait_for_async(lambda: len(manager.hosted.purgatory) == 1, 5, "the second fetch to wait in the purgatory")
        now.advance(299)
        assert manager.hosted.purgatory.expire_due() == 0 and not empty.done()
        now.advance(1)
        assert manager.hosted.purgatory.expire_due() == 1
        assert (await empty).responses[0].partitions[0].records == b""
    run(manager, scenario)
    manager.hosted.close()


def test_read_committed_fetch_waits_for_the_marker(manager):
    async def scenario(stub):
        await stub.Produce(produce_req(("a", 1, make_batch(2, pid=9, seq=0, txn=True))))
        waiting = asyncio.ensure_future(stub.Fetch(fetch_req("a", 1, 0, max_wait_ms=5000, isolation_level=1)))
        await wait_for_async(lambda: len(manager.hosted.purgatory) == 1, 5, "the fetch to wait in the purgatory")
        assert not waiting.done()
        markers = pb.WriteTxnMarkersRequest(markers=[pb.WritableTxnMarker(
            producer_id=9, producer_epoch=0, committed=False, coordinator_epoch=1,
            topics=[pb.TopicPartitions(topic="a", partitions=[1, 2, 7])])])
        mresp = await stub.WriteTxnMarkers(markers)
        codes = {p.partition: p.error_code for p in mresp.markers[0].topics[0].partitions}
        assert mresp.markers[0].producer_id == 9
        assert codes == {1: ErrorCode.NONE, 2: ErrorCode.NOT_LEADER_OR_FOLLOWER,
                         7: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        # A transaction version 1 marker (0 here, as a Kafka client's): where a notice of the
        # producer's next transaction verifies it, for the partition that took the marker only.
        assert [(t.topic, [(q.partition, q.offset) for q in t.partitions])
                for t in mresp.markers[0].verifiable_from] == [("a", [(1, 3)])]
        part = (await waiting).responses[0].partitions[0]
        assert part.last_stable_offset == 3
        assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == [(9, 0)]
        assert [h.base_offset for _, h in records.iter_batches(part.records)] == [0, 2]
        stale = pb.WriteTxnMarkersRequest(markers=[pb.WritableTxnMarker(
            producer_id=9, producer_epoch=0, committed=True, coordinator_epoch=0,
            topics=[pb.TopicPartitions(topic="a", partitions=[1])])])
        resp = await stub.WriteTxnMarkers(stale)
        assert resp.markers[0].topics[0].partitions[0].error_code == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    run(manager, scenario)


def test_fetch_respects_the_response_byte_budget(manager):
    async def scenario(stub):
        for p in (0, 1):
            await stub.Produce(produce_req(("a", p, make_batch(1, value_size=1000))))
        req = pb.FetchRequest(max_wait_ms=0, max_bytes=500, topics=[pb.FetchTopic(topic="a", partitions=[
            pb.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),
            pb.FetchPartition(partition=1, fetch_offset=0, partition_max_bytes=1 << 20)])])
        parts = (await stub.Fetch(req)).responses[0].partitions
        # The first batch is returned although larger than the budget; then nothing.
        assert len(parts[0].records) > 500 and parts[1].records == b""
        assert parts[1].error_code == ErrorCode.NONE and parts[1].high_watermark == 1
    run(manager, scenario)


def test_list_offsets(manager):
    async def scenario(stub):
        await stub.Produce(produce_req(("a", 0, make_batch(2))))
        await stub.Produce(produce_req(("a", 0, make_batch(2, pid=5, seq=0, txn=True))))
        req = pb.ListOffsetsRequest(isolation_level=0, topics=[pb.ListOffsetsTopic(name="a", partitions=[
            pb.ListOffsetsPartition(partition=0, timestamp=t) for t in (-2, -1, -3)] + [
            pb.ListOffsetsPartition(partition=2, timestamp=-1)])])
        parts = (await stub.ListOffsets(req)).topics[0].partitions
        assert [(p.error_code, p.offset) for p in parts] == [(0, 0), (0, 4), (0, 2),
                                                             (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)]
        req.isolation_level = 1
        parts = (await stub.ListOffsets(req)).topics[0].partitions
        assert parts[1].offset == 2
    run(manager, scenario)


def test_clients_cannot_produce_to_internal_topics(tmp_path, store, clock):
    """A forged PrepareCommit record in __transaction_state would be rolled forward by
    the next coordinator: a client Produce to an internal topic is refused, only
    CoordinatorProduce writes there, and CoordinatorProduce writes nothing else."""
    cluster = FakeCluster({"a": topic("a", ["me"]), "__transaction_state": topic("__transaction_state", ["me"],
                                                                              internal=True)})
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, cluster, store, clock, monotonic_ms=clock))
    m.hosted.refresh()
    forged = make_batch(1, pid=77, seq=-1)

    async def scenario(stub):
        refused = await stub.Produce(produce_req(("__transaction_state", 0, forged)))
        part = refused.topics[0].partitions[0]
        assert (part.error_code, part.base_offset) == (ErrorCode.INVALID_TOPIC_EXCEPTION, -1)
        assert "internal topic" in part.error_message
        assert m.hosted.replicas[("__transaction_state", 0)].log_end_offset == 0
        user = await stub.CoordinatorProduce(produce_req(("a", 0, make_batch(1))))
        assert user.topics[0].partitions[0].error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
        assert m.hosted.replicas[("a", 0)].log_end_offset == 0
        ok = await stub.CoordinatorProduce(produce_req(("__transaction_state", 0, forged)))
        assert results(ok)[("__transaction_state", 0)] == (ErrorCode.NONE, 0)
        assert results(await stub.Produce(produce_req(("a", 0, make_batch(1)))))[("a", 0)] == (ErrorCode.NONE, 0)
    run(m, scenario)
    m.hosted.close()


def test_describe_producers(manager):
    """KIP-664 DescribeProducers: the producer state per led partition; errors for a
    partition led elsewhere or unknown."""
    async def scenario(stub):
        await stub.Produce(produce_req(("a", 0, make_batch(2, pid=5, epoch=1, seq=0)),
                                       ("a", 0, make_batch(1, pid=6, epoch=0, seq=0, txn=True))))
        resp = await stub.DescribeProducers(pb.DescribeProducersRequest(topics=[
            pb.TopicPartitions(topic="a", partitions=[0, 1, 2, 9])]))
        return {p.partition: p for p in resp.topics[0].partitions}

    parts = run(manager, scenario)
    states = {s.producer_id: s for s in parts[0].active_producers}
    assert (states[5].producer_epoch, states[5].last_sequence, states[5].current_txn_start_offset) == (1, 1, -1)
    assert (states[6].current_txn_start_offset, states[6].coordinator_epoch) == (2, -1)
    assert states[6].last_timestamp > 0
    assert parts[1].error_code == ErrorCode.NONE and list(parts[1].active_producers) == []
    assert parts[2].error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert parts[9].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
