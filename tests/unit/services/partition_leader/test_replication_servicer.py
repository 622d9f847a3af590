"""The PartitionLeader servicer in-process (127.0.0.1:0) for replication: Fetch with
replica_id, acks=all completing on the high watermark (Kafka's delayed produce),
NOT_ENOUGH_REPLICAS, OffsetForLeaderEpoch, and a leader whose leadership cannot be
confirmed answering NOT_LEADER_OR_FOLLOWER."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from waiting import wait_for_async

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.common.cluster.state import PartitionState, TopicInfo
from services.partition_leader.purgatory import Purgatory
from services.partition_leader.replica_manager import ReplicaManager
from services.partition_leader.servicer import PartitionLeaderServicer

from .conftest import make_batch
from .test_partition_leader_servicer import produce_req
from .test_replica_manager import FakeCluster
from services.partition_leader.replicas import HostedReplicas


def rf2(isr=("me", "x")) -> FakeCluster:
    return FakeCluster({"r": TopicInfo("r", {0: ["me", "x"]}, {"min.insync.replicas": "2"}, False,
                                       {0: PartitionState("me", 3, tuple(isr), version=0)})})


@pytest.fixture
def manager(tmp_path, store, clock):
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, rf2(), store, clock))
    m.hosted.refresh()
    yield m
    m.hosted.close()


class FakeLeases:
    def __init__(self, answer: bool):
        self.answer, self.calls = answer, 0

    async def ensure(self, p, deadline, vouched=None) -> bool:
        self.calls += 1
        return self.answer


def run(manager, scenario, leases=None):
    async def main():
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        manager.hosted.leases = leases
        pbg.add_PartitionLeaderServicer_to_server(PartitionLeaderServicer(manager), server)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                return await scenario(pbg.PartitionLeaderStub(ch))
        finally:
            await server.stop(None)
    return asyncio.run(main())


def replica_fetch(offset, epoch=3, max_wait_ms=0):
    return pb.FetchRequest(replica_id="x", max_wait_ms=max_wait_ms, min_bytes=1, topics=[pb.FetchTopic(
        topic="r", partitions=[pb.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20,
                                                 current_leader_epoch=epoch)])])


def first(resp):
    return resp.topics[0].partitions[0]


def test_acks_all_answers_once_the_follower_has_the_batch(manager):
    async def scenario(stub):
        produce = asyncio.ensure_future(stub.Produce(produce_req(("r", 0, make_batch(3))), timeout=10))
        await wait_for_async(lambda: len(manager.hosted.purgatory) == 1, 5, "the produce to wait in the purgatory")
        assert not produce.done()  # appended, waiting for the high watermark
        part = (await stub.Fetch(replica_fetch(0), timeout=5)).responses[0].partitions[0]
        assert part.error_code == ErrorCode.NONE and part.records and part.high_watermark == 0
        assert not produce.done() and len(manager.hosted.purgatory) == 1
        # The next fetch reports the follower's log end: the high watermark passes the batch.
        part = (await stub.Fetch(replica_fetch(3), timeout=5)).responses[0].partitions[0]
        assert part.high_watermark == 3 and part.records == b""
        out = first(await produce)
        assert (out.error_code, out.base_offset) == (ErrorCode.NONE, 0)
        # acks=1 answers after the local append.
        assert first(await stub.Produce(produce_req(("r", 0, make_batch(1)), acks=1), timeout=5)).base_offset == 3
    run(manager, scenario)


def test_acks_all_times_out_without_the_follower(tmp_path, store, clock, now):
    """The produce waits in the purgatory for the follower until its timeout_ms passed
    on the manager's clock (moved by the test), then answers REQUEST_TIMED_OUT."""
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, rf2(), store, clock, monotonic_s=now.now_s))
    m.hosted.purgatory = Purgatory(now.now_s, timers=False)
    m.hosted.refresh()

    async def scenario(stub):
        req = produce_req(("r", 0, make_batch(1)))
        req.timeout_ms = 300
        pending = asyncio.ensure_future(stub.Produce(req, timeout=5))
        await wait_for_async(lambda: len(m.hosted.purgatory) == 1, 5, "the produce to wait for the follower")
        now.advance(299)
        assert m.hosted.purgatory.expire_due() == 0 and not pending.done()
        now.advance(1)
        assert m.hosted.purgatory.expire_due() == 1
        out = first(await pending)
        assert out.error_code == ErrorCode.REQUEST_TIMED_OUT
        assert m.hosted.replicas[("r", 0)].log_end_offset == 1  # appended, not replicated
    run(m, scenario)
    m.hosted.close()


def test_not_enough_replicas_before_appending(tmp_path, store, clock):
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, rf2(isr=("me",)), store, clock))
    m.hosted.refresh()

    async def scenario(stub):
        out = first(await stub.Produce(produce_req(("r", 0, make_batch(2))), timeout=5))
        assert out.error_code == ErrorCode.NOT_ENOUGH_REPLICAS
        assert m.hosted.replicas[("r", 0)].log_end_offset == 0
        markers = await stub.WriteTxnMarkers(pb.WriteTxnMarkersRequest(markers=[pb.WritableTxnMarker(
            producer_id=5, producer_epoch=0, committed=True, coordinator_epoch=0,
            topics=[pb.TopicPartitions(topic="r", partitions=[0])])]), timeout=5)
        assert markers.markers[0].topics[0].partitions[0].error_code == ErrorCode.NOT_ENOUGH_REPLICAS
    run(m, scenario)
    m.hosted.close()


def test_replica_fetch_errors_and_offset_for_leader_epoch(manager):
    async def scenario(stub):
        await stub.Produce(produce_req(("r", 0, make_batch(2)), acks=1), timeout=5)
        part = (await stub.Fetch(replica_fetch(0, epoch=2), timeout=5)).responses[0].partitions[0]
        assert part.error_code == ErrorCode.FENCED_LEADER_EPOCH
        part = (await stub.Fetch(replica_fetch(9), timeout=5)).responses[0].partitions[0]
        assert part.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
        resp = await stub.OffsetForLeaderEpoch(pb.OffsetForLeaderEpochRequest(replica_id="x", topics=[
            pb.OffsetForLeaderTopic(topic="r", partitions=[
                pb.OffsetForLeaderPartition(partition=0, current_leader_epoch=3, leader_epoch=3),
                pb.OffsetForLeaderPartition(partition=0, current_leader_epoch=4, leader_epoch=3),
                pb.OffsetForLeaderPartition(partition=1, current_leader_epoch=3, leader_epoch=3)])]), timeout=5)
        got = [(p.error_code, p.leader_epoch, p.end_offset) for p in resp.topics[0].partitions]
        assert got == [(ErrorCode.NONE, 3, 2), (ErrorCode.UNKNOWN_LEADER_EPOCH, -1, -1),
                       (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)]
        # A consumer fetch cannot read what is not replicated yet.
        cons = await stub.Fetch(pb.FetchRequest(max_wait_ms=0, topics=[pb.FetchTopic(
            topic="r", partitions=[pb.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20,
                                                     current_leader_epoch=-1)])]), timeout=5)
        part = cons.responses[0].partitions[0]
        assert part.error_code == ErrorCode.NONE and part.records == b"" and part.high_watermark == 0
    run(manager, scenario)


def test_an_unconfirmed_leader_does_not_acknowledge(manager):
    manager.hosted.lease_ms = 1000  # leases are kept, and none is valid
    manager.hosted.invalidate_leases()
    leases = FakeLeases(False)

    async def scenario(stub):
        out = first(await stub.Produce(produce_req(("r", 0, make_batch(1)), acks=1), timeout=5))
        assert out.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert manager.hosted.replicas[("r", 0)].log_end_offset == 0  # refused before appending
        # acks=0 needs no confirmation.
        assert first(await stub.Produce(produce_req(("r", 0, make_batch(1)), acks=0), timeout=5)).error_code == 0
    run(manager, scenario, leases)
    assert leases.calls == 1
