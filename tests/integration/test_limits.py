"""Limits on real processes (docs/design.md, "Input validation and limits"): the
big-number CreateTopics of the security issue are refused quickly, before anything
is allocated (no partition leader's memory grows, every service keeps serving), and
oversized requests and batches get their specific answers."""
from __future__ import annotations

import time

import grpc
import pytest

from exactly import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg

pytestmark = pytest.mark.integration


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _leaders(cluster) -> list:
    return [s for s in cluster.services.values() if s.role == "partition_leader"]


def test_huge_partition_counts_are_refused_quickly_and_nothing_balloons(make_cluster):
    cluster = make_cluster(partition_leaders=2, props={"max.partitions": "1000"})
    leaders = _leaders(cluster)
    rss_before = {s.name: _rss_kib(s.pid) for s in leaders}
    with grpc.insecure_channel(leaders[0].address) as ch:
        stub = pbg.ClusterStub(ch)
        for count in (999_999, (1 << 31) - 1, 0, -1):
            started = time.monotonic()
            resp = stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
                name=f"big-{count & 0xFFFF}", num_partitions=count, replication_factor=1)]), timeout=10)
            assert time.monotonic() - started < 2, "answered at once, before allocating anything"
            assert resp.topics[0].error_code == ErrorCode.INVALID_PARTITIONS, resp
        resp = stub.CreatePartitions(pb.CreatePartitionsRequest(topics=[
            pb.CreatePartitionsTopic(name="grown", count=(1 << 31) - 1)]), timeout=10)
        assert resp.results[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION  # not created yet
        # Within the per-topic limit but beyond the cluster's max.partitions (1000).
        resp = stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
            name="many", num_partitions=1001, replication_factor=1)]), timeout=10)
        assert resp.topics[0].error_code == ErrorCode.POLICY_VIOLATION, resp
        resp = stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
            name="wide", num_partitions=1, replication_factor=(1 << 31) - 1)]), timeout=10)
        assert resp.topics[0].error_code == ErrorCode.INVALID_REPLICATION_FACTOR
        for bad in ("a/b", "x" * 250, "..", "", "__mine"):
            resp = stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
                name=bad, num_partitions=1, replication_factor=1)]), timeout=10)
            assert resp.topics[0].error_code == ErrorCode.INVALID_TOPIC_EXCEPTION, bad
        resp = stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
            name="cfg", num_partitions=1, replication_factor=1, configs={"segment.bytes": "0"})]), timeout=10)
        assert resp.topics[0].error_code == ErrorCode.INVALID_CONFIG

    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic("grown", 2)], timeout=30)
        with pytest.raises(Exception) as exc:
            admin.create_partitions({"grown": 999_999})
        assert getattr(exc.value, "code", None) == ErrorCode.INVALID_PARTITIONS
        admin.create_topics([NewTopic("a.b", 1)], timeout=30)
        with pytest.raises(Exception) as exc:
            admin.create_topics([NewTopic("a_b", 1)], timeout=30)
        assert getattr(exc.value, "code", None) == ErrorCode.INVALID_TOPIC_EXCEPTION
        assert "a_b" not in admin.list_topics()

    for s in leaders:
        grown = _rss_kib(s.pid) - rss_before[s.name]
        assert grown < 100 * 1024, f"{s.name} grew by {grown} KiB"
    # Every service keeps serving: a round trip through the SDK.
    with Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 0}) as p:
        p.send("grown", value=b"still-serving", partition=1).result(30)
    c = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "enable.auto.commit": False})
    try:
        c.assign([TopicPartition("grown", 1)])
        c.seek_to_beginning([TopicPartition("grown", 1)])
        got = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = c.poll(0.5)
        assert [r.value for r in got] == [b"still-serving"]
    finally:
        c.close()


def test_oversized_requests_and_batches(make_cluster):
    cluster = make_cluster(partition_leaders=1, props={"socket.request.max.bytes": str(2 << 20),
                                                       "message.max.bytes": "100000"})
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        # The topic's own limit from its creation: the leader knows it with the partition
        # (a later change reaches the leader through a ZooKeeper watch, a moment after).
        admin.create_topics([NewTopic("sized", 1, config={"max.message.bytes": "50000"})], timeout=30)
    leader = _leaders(cluster)[0]

    def produce(stub, batch: bytes) -> int:
        resp = stub.Produce(pb.ProduceRequest(acks=1, timeout_ms=5000, topics=[pb.TopicProduceData(
            name="sized", partitions=[pb.PartitionProduceData(partition=0, records=batch)])]), timeout=10)
        return resp.topics[0].partitions[0].error_code

    with grpc.insecure_channel(leader.address) as ch:
        stub = pbg.PartitionLeaderStub(ch)
        assert produce(stub, records.encode_batch([(None, b"x" * 1000, (), 1)])) == ErrorCode.NONE
        # Above the topic's max.message.bytes (50000), below the broker's (100000).
        assert produce(stub, records.encode_batch([(None, b"x" * 60000, (), 1)])) == ErrorCode.MESSAGE_TOO_LARGE
        with pytest.raises(grpc.RpcError) as exc:
            produce(stub, records.encode_batch([(None, b"x" * (3 << 20), (), 1)]))
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.RpcError) as exc:  # not a protobuf encoding at all
            ch.unary_unary("/exactly.v1.PartitionLeader/Produce")(b"\x0a\xff\xff\xff\xff\x0f", timeout=10)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        resp = stub.ListOffsets(pb.ListOffsetsRequest(topics=[pb.ListOffsetsTopic(
            name="sized", partitions=[pb.ListOffsetsPartition(partition=0, timestamp=-1)])]), timeout=10)
        assert resp.topics[0].partitions[0].offset == 1, "only the first batch was appended"
