"""The partition leader as a real process (real ZooKeeper), driven over gRPC with raw
record batches: produce validation, idempotence (design doc "Client-Broker request
handling"), markers and the LSO, and crash recovery (SIGKILL / SIGTERM + restart)
with producer-state snapshots and log replay ("PID Snapshots")."""
from __future__ import annotations

import re
import time
import uuid

import grpc
import pytest

from exactly_wire.clock import wall_clock_ms
from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg

pytestmark = pytest.mark.integration

PID = 7001


@pytest.fixture
def leader(make_cluster):
    """One partition leader (every partition is led by it), short snapshot interval.
    There is no transaction coordinator: these tests write transactional batches by
    hand to check the leader's own log and producer state, so transaction
    verification (KIP-890) is off; tests/integration/test_txn_coordinator.py covers it."""
    c = make_cluster(partition_leaders=1, txn_coordinators=0, group_coordinators=0,
                     props={"producer.snapshot.interval.ms": "200", "segment.bytes": "4096",
                            "transaction.partition.verification.enable": "false"})
    return c


def stub_for(cluster) -> tuple[pbg.PartitionLeaderStub, pbg.ClusterStub, grpc.Channel]:
    ch = grpc.insecure_channel(cluster.services["pl-0"].address)
    return pbg.PartitionLeaderStub(ch), pbg.ClusterStub(ch), ch


def create_topic(cluster, partitions: int = 1) -> str:
    name = f"pl-{uuid.uuid4().hex[:8]}"
    _, admin, ch = stub_for(cluster)
    with ch:
        resp = admin.CreateTopics(pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=1)]), timeout=30)
    assert resp.topics[0].error_code == ErrorCode.NONE, resp.topics[0].error_message
    return name


def batch(n: int = 3, *, pid: int = -1, epoch: int = 0, seq: int = -1, txn: bool = False, tag: str = "") -> bytes:
    now = wall_clock_ms()
    return records.encode_batch([(f"k{i}".encode(), f"{tag}v{i}".encode(), (), now) for i in range(n)],
                                producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=txn)


def produce(stub, topic: str, data: bytes, partition: int = 0, wait_s: float = 30.0) -> pb.PartitionProduceResponse:
    """Produce one batch; retries while the new topic is not yet known to the leader."""
    deadline = time.monotonic() + wait_s
    while True:
        resp = stub.Produce(pb.ProduceRequest(acks=-1, timeout_ms=5000, topics=[pb.TopicProduceData(
            name=topic, partitions=[pb.PartitionProduceData(partition=partition, records=data)])]), timeout=30)
        part = resp.topics[0].partitions[0]
        if part.error_code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION or time.monotonic() > deadline:
            return part
        time.sleep(0.1)


def fetch(stub, topic: str, offset: int = 0, isolation_level: int = 0, partition: int = 0
          ) -> pb.FetchPartitionResponse:
    resp = stub.Fetch(pb.FetchRequest(max_wait_ms=0, isolation_level=isolation_level, topics=[pb.FetchTopic(
        topic=topic, partitions=[pb.FetchPartition(partition=partition, fetch_offset=offset,
                                                   partition_max_bytes=1 << 24, current_leader_epoch=-1)])]),
        timeout=30)
    return resp.responses[0].partitions[0]


def fetch_all(stub, topic: str, isolation_level: int = 0) -> list[records.Record]:
    out, offset = [], 0
    while True:
        part = fetch(stub, topic, offset, isolation_level)
        assert part.error_code == ErrorCode.NONE
        if not part.records:
            return out
        for pos, h in records.iter_batches(part.records):
            if not h.is_control:
                out += [r for r in records.decode_records(part.records, pos, h) if r.offset >= offset]
            offset = h.last_offset + 1


def markers(stub, topic: str, pid: int, epoch: int, committed: bool, coordinator_epoch: int = 0) -> int:
    resp = stub.WriteTxnMarkers(pb.WriteTxnMarkersRequest(markers=[pb.WritableTxnMarker(
        producer_id=pid, producer_epoch=epoch, committed=committed, coordinator_epoch=coordinator_epoch,
        topics=[pb.TopicPartitions(topic=topic, partitions=[0])])]), timeout=30)
    return resp.markers[0].topics[0].partitions[0].error_code


def test_corrupt_batch_is_rejected_and_the_leader_keeps_serving(leader):
    topic = create_topic(leader)
    stub, _, ch = stub_for(leader)
    with ch:
        assert produce(stub, topic, batch(2, tag="a")).error_code == ErrorCode.NONE
        bad = bytearray(batch(2, tag="b"))
        bad[-2] ^= 0x40
        assert produce(stub, topic, bytes(bad)).error_code == ErrorCode.CORRUPT_MESSAGE
        part = fetch(stub, topic)
        assert part.high_watermark == 2
        assert [r.value for r in fetch_all(stub, topic)] == [b"av0", b"av1"]
        res = produce(stub, topic, batch(1, tag="c"))
        assert (res.error_code, res.base_offset) == (ErrorCode.NONE, 2)


def test_control_batches_and_unknown_partitions_are_rejected(leader):
    topic = create_topic(leader, partitions=2)
    stub, _, ch = stub_for(leader)
    with ch:
        assert produce(stub, topic, batch(1)).error_code == ErrorCode.NONE
        ctrl = records.encode_control_batch(True, PID, 0, 0, wall_clock_ms())
        assert produce(stub, topic, ctrl).error_code == ErrorCode.INVALID_REQUEST
        assert fetch(stub, topic).high_watermark == 1
        assert produce(stub, topic, batch(1), partition=5, wait_s=0).error_code == \
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert produce(stub, "no-such-topic", batch(1), wait_s=0).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert fetch(stub, "no-such-topic").error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_retries_are_deduplicated_and_gaps_refused(leader):
    topic = create_topic(leader)
    stub, _, ch = stub_for(leader)
    with ch:
        first = produce(stub, topic, batch(3, pid=PID, seq=0, tag="x"))
        second = produce(stub, topic, batch(3, pid=PID, seq=3, tag="y"))
        assert (first.base_offset, second.base_offset) == (0, 3)
        retry = produce(stub, topic, batch(3, pid=PID, seq=0, tag="x"))
        assert (retry.error_code, retry.base_offset) == (ErrorCode.DUPLICATE_SEQUENCE_NUMBER, 0)
        gap = produce(stub, topic, batch(1, pid=PID, seq=7))
        assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert fetch(stub, topic).high_watermark == 6
        assert [r.value for r in fetch_all(stub, topic)] == [b"xv0", b"xv1", b"xv2", b"yv0", b"yv1", b"yv2"]


def test_sigkill_loses_no_acknowledged_record_and_keeps_dedup_state(leader):
    topic = create_topic(leader)
    stub, _, ch = stub_for(leader)
    acked = []
    with ch:
        seq = 0
        for i in range(20):
            res = produce(stub, topic, batch(5, pid=PID, seq=seq, tag=f"{i}-"))
            assert res.error_code == ErrorCode.NONE
            acked.append((seq, res.base_offset))
            seq += 5
        time.sleep(1.0)  # a periodic snapshot covers the first part ...
        for i in range(20, 40):  # ... the rest is replayed from the log
            res = produce(stub, topic, batch(5, pid=PID, seq=seq, tag=f"{i}-"))
            assert res.error_code == ErrorCode.NONE
            acked.append((seq, res.base_offset))
            seq += 5
        txn = produce(stub, topic, batch(2, pid=PID + 1, seq=0, txn=True, tag="t"))
        assert txn.error_code == ErrorCode.NONE
    leader.kill("pl-0")
    leader.restart("pl-0")
    stub, _, ch = stub_for(leader)
    with ch:
        values = [r.value for r in fetch_all(stub, topic)]
        assert values == [f"{i}-v{j}".encode() for i in range(40) for j in range(5)] + [b"tv0", b"tv1"]
        # Retries of any of the last five batches are still recognised.
        for last_seq, offset in acked[-5:]:
            retry = produce(stub, topic, batch(5, pid=PID, seq=last_seq, tag="again"))
            assert (retry.error_code, retry.base_offset) == (ErrorCode.DUPLICATE_SEQUENCE_NUMBER, offset)
        assert produce(stub, topic, batch(1, pid=PID, seq=seq + 1)).error_code == \
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert produce(stub, topic, batch(1, pid=PID, seq=seq)).error_code == ErrorCode.NONE
        # The open transaction survived: it holds the LSO until its marker.
        part = fetch(stub, topic, isolation_level=1)
        assert part.last_stable_offset == txn.base_offset
        assert markers(stub, topic, PID + 1, 0, committed=False) == ErrorCode.NONE
        part = fetch(stub, topic, offset=txn.base_offset, isolation_level=1)
        assert part.last_stable_offset == part.high_watermark
        assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == [(PID + 1, txn.base_offset)]
    # The restart loaded a periodic snapshot and replayed the log after it.
    opened = re.findall(rf"leading {topic}-0: log end (\d+), .*\(snapshot at (\w+)\)",
                        (leader.dir / "logs" / "pl-0.log").read_text())
    log_end, snapshot_at = opened[-1]
    assert log_end == "202" and snapshot_at != "None" and 0 < int(snapshot_at) < 202


def test_clean_stop_and_restart_keeps_state(leader):
    topic = create_topic(leader)
    stub, _, ch = stub_for(leader)
    with ch:
        assert produce(stub, topic, batch(2, pid=PID, seq=0, txn=True)).error_code == ErrorCode.NONE
        assert markers(stub, topic, PID, 0, committed=True, coordinator_epoch=3) == ErrorCode.NONE
        assert produce(stub, topic, batch(2, pid=PID, seq=2)).error_code == ErrorCode.NONE
    leader.stop("pl-0")
    leader.restart("pl-0")
    stub, _, ch = stub_for(leader)
    with ch:
        assert produce(stub, topic, batch(2, pid=PID, seq=2)).error_code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
        # The coordinator epoch stored with the PID still fences an older coordinator.
        assert markers(stub, topic, PID, 0, committed=True, coordinator_epoch=2) == \
            ErrorCode.TRANSACTION_COORDINATOR_FENCED
        assert fetch(stub, topic).high_watermark == 5
        assert len(fetch_all(stub, topic, isolation_level=1)) == 4
