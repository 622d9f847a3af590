"""The GroupCoordinator servicer in-process on grpc.aio (127.0.0.1:0) over the
in-memory log: messages in and out, proto3 defaults, metrics."""
from __future__ import annotations

import asyncio
import zlib

import grpc
from waiting import wait_for_async
from prometheus_client import generate_latest

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.common.metrics import RpcMetricsInterceptor
from services.group_coordinator.coordinator import GroupCoordinator
from services.group_coordinator.servicer import GroupCoordinatorServicer

from .gc_fakes import FakeLog, group_settings

N = 4


def _commit_topics(offsets: dict[tuple[str, int], int]):
    by_topic: dict[str, list] = {}
    for (t, p), o in offsets.items():
        by_topic.setdefault(t, []).append(pb.OffsetCommitPartition(partition=p, committed_offset=o,
                                                                   committed_leader_epoch=-1))
    return [pb.OffsetCommitTopic(name=t, partitions=ps) for t, ps in by_topic.items()]


def test_servicer_round_trip():
    async def body():
        log = FakeLog()
        coord = GroupCoordinator(log, lambda g: zlib.crc32(g.encode()) % N, lambda: {"orders": 3},
                                 group_settings({"group.coordinator.tail.max.wait.ms": 5000}))
        await coord.start()
        for p in range(N):
            await coord.on_elected(p, 0)
        assert await coord.wait_loaded(timeout_s=5)
        server = grpc.aio.server(interceptors=[RpcMetricsInterceptor()])
        pbg.add_GroupCoordinatorServicer_to_server(GroupCoordinatorServicer(coord), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = pbg.GroupCoordinatorStub(ch)
                join = await stub.JoinGroup(pb.JoinGroupRequest(
                    group_id="g", session_timeout_ms=6000, rebalance_timeout_ms=10000,
                    protocol_type="consumer", topics=["orders"]))
                assert (join.error_code, join.generation_id, join.protocol_name) == (0, 1, "range")
                assert join.leader == join.member_id and list(join.members) == [join.member_id]
                sync = await stub.SyncGroup(pb.SyncGroupRequest(group_id="g", generation_id=1,
                                                                member_id=join.member_id))
                assert sync.error_code == 0
                assert [(t.topic, list(t.partitions)) for t in sync.assignment] == [("orders", [0, 1, 2])]
                bad = await stub.SyncGroup(pb.SyncGroupRequest(group_id="g", generation_id=0,
                                                               member_id=join.member_id))
                assert (bad.error_code, bad.error_message) == (ErrorCode.ILLEGAL_GENERATION, "ILLEGAL_GENERATION")
                hb = await stub.Heartbeat(pb.HeartbeatRequest(group_id="g", generation_id=1,
                                                              member_id=join.member_id))
                assert hb.error_code == 0

                commit = await stub.OffsetCommit(pb.OffsetCommitRequest(
                    group_id="g", generation_id=1, member_id=join.member_id,
                    topics=_commit_topics({("orders", 0): 5, ("orders", 1): 6})))
                assert [(t.topic, [(p.partition, p.error_code) for p in t.partitions]) for t in commit.topics] == \
                    [("orders", [(0, 0), (1, 0)])]
                # generation_id left unset (0) with no member id is the -1 of Kafka.
                txn = await stub.TxnOffsetCommit(pb.TxnOffsetCommitRequest(
                    transactional_id="tx", group_id="g", producer_id=42, producer_epoch=0,
                    topics=_commit_topics({("orders", 2): 9})))
                assert txn.topics[0].partitions[0].error_code == 0
                stale = await stub.TxnOffsetCommit(pb.TxnOffsetCommitRequest(
                    transactional_id="tx", group_id="g", producer_id=42, producer_epoch=0, generation_id=7,
                    member_id=join.member_id, topics=_commit_topics({("orders", 2): 9})))
                assert stale.topics[0].partitions[0].error_code == ErrorCode.ILLEGAL_GENERATION

                fetch = await stub.OffsetFetch(pb.OffsetFetchRequest(
                    group_id="g", require_stable=True,
                    topics=[pb.TopicPartitions(topic="orders", partitions=[0, 1, 2])]))
                assert fetch.error_code == ErrorCode.UNSTABLE_OFFSET_COMMIT
                assert [(p.partition, p.committed_offset, p.error_code) for p in fetch.topics[0].partitions] == \
                    [(0, 5, 0), (1, 6, 0), (2, -1, ErrorCode.UNSTABLE_OFFSET_COMMIT)]
                log.write_marker(zlib.crc32(b"g") % N, 42, committed=True)

                async def stable():
                    resp = await stub.OffsetFetch(pb.OffsetFetchRequest(group_id="g", require_stable=True))
                    return resp if resp.error_code == 0 else None
                fetch = await wait_for_async(stable, 5, "the committed offsets to become stable")
                assert [(p.partition, p.committed_offset) for p in fetch.topics[0].partitions] == \
                    [(0, 5), (1, 6), (2, 9)]

                other = await stub.OffsetFetch(pb.OffsetFetchRequest(
                    group_id="", topics=[pb.TopicPartitions(topic="orders", partitions=[0])]))
                assert other.error_code == ErrorCode.INVALID_GROUP_ID
                assert other.topics[0].partitions[0].error_code == ErrorCode.INVALID_GROUP_ID

                leave = await stub.LeaveGroup(pb.LeaveGroupRequest(group_id="g", member_id=join.member_id))
                assert leave.error_code == 0
        finally:
            await server.stop(None)
            await coord.stop()
        text = generate_latest().decode()
        assert 'exactly_rpc_request_duration_seconds_count{method="JoinGroup",service="GroupCoordinator"}' in text
        assert 'exactly_rpc_errors_total{error_code="ILLEGAL_GENERATION",method="SyncGroup"' in text
        assert "exactly_group_rebalances_total" in text
    asyncio.run(asyncio.wait_for(body(), 20))
