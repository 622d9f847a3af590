"""Retention and DeleteRecords on real processes, replication factor 3
(docs/design.md, "Retention and compaction").

Old records (timestamps an hour back) fill the first segments, then a committed
transaction, an aborted one and an idempotent producer's batch follow. With
`retention.ms` of ten minutes the cleaner of every replica deletes the old segments:
the bytes on disk drop on all three replicas, the log start offset advances on each
and survives a SIGKILL and restart, a read_committed consumer from the earliest
offset starts at the log start offset and still skips the aborted records, a retried
idempotent batch is still recognized as a duplicate, and a consumer positioned below
the log start offset resets as `auto.offset.reset` says (or gets OffsetOutOfRangeError
with "none"). DeleteRecords then moves the log start offset explicitly.
"""
from __future__ import annotations

import uuid

import pytest

from exactly import AdminClient, Consumer, NewTopic, Producer, TopicPartition, errors
from exactly_wire import records
from exactly_wire.clock import wall_clock_ms
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg

from waiting import wait_for

import grpc

pytestmark = pytest.mark.integration

PROPS = {
    "zookeeper.session.timeout.ms": "4000",
    "min.insync.replicas": "2",
    "transaction.state.log.replication.factor": "3",
    "offsets.topic.replication.factor": "3",
    "log.retention.check.interval.ms": "200",
}
HOUR_MS = 3_600_000


def replica_dirs(cluster, topic: str, partition: int = 0) -> dict[str, object]:
    return {name: svc_dir / "logs" / f"{topic}-{partition}"
            for name, svc_dir in ((n, cluster.dir / n) for n, s in cluster.services.items()
                                  if s.role == "partition_leader")}


def disk_bytes(path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.log"))


def log_start_on_disk(path) -> int:
    """The replica's log start offset as it persisted it (checkpoint file, else the
    first segment's base offset)."""
    first = min(int(f.stem) for f in path.glob("*.log") if f.stem.isdigit())
    cp = path / "log-start-offset"
    return max(first, int(cp.read_text()) if cp.exists() else 0)


def consumer(cluster, **conf) -> Consumer:
    base = {"bootstrap.servers": cluster.bootstrap_servers, "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False, "fetch.max.wait.ms": 100}
    base.update(conf)
    return Consumer(base)


def idempotent_pid(cluster) -> tuple[int, int]:
    """A producer id and epoch for an idempotent producer, from InitProducerId."""
    txn = next(s for s in cluster.services.values() if s.role == "txn_coordinator")
    with grpc.insecure_channel(txn.address) as ch:
        resp = pbg.TransactionCoordinatorStub(ch).InitProducerId(
            pb.InitProducerIdRequest(transactional_id="", transaction_timeout_ms=60000), timeout=30)
    assert resp.error_code == 0
    return resp.producer_id, resp.producer_epoch


def raw_produce(cluster, topic: str, batch: bytes):
    """Produce one batch to the leader of partition 0 with the raw stub."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    try:
        leader = admin.describe_topics([topic])[topic].partitions[0].leader
    finally:
        admin.close()
    with grpc.insecure_channel(leader) as ch:
        resp = pbg.PartitionLeaderStub(ch).Produce(pb.ProduceRequest(acks=-1, timeout_ms=10000, topics=[
            pb.TopicProduceData(name=topic, partitions=[pb.PartitionProduceData(partition=0, records=batch)])]),
            timeout=30)
    return resp.topics[0].partitions[0]


def test_retention_on_every_replica(make_cluster):
    cluster = make_cluster(partition_leaders=3, props=PROPS)
    topic = f"ret-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    # No retention while the data goes in: the bytes are measured on every replica first.
    admin.create_topics([NewTopic(topic, 1, 3, {"segment.bytes": "4096", "retention.ms": "-1"})], timeout=60)
    tp = TopicPartition(topic, 0)
    old = wall_clock_ms() - HOUR_MS

    # An idempotent producer's batch among the old records (its dedup state must survive).
    pid, epoch = idempotent_pid(cluster)
    dup_batch = records.encode_batch([(b"dup", b"once", (), old)], producer_id=pid, producer_epoch=epoch,
                                     base_sequence=0)
    first = raw_produce(cluster, topic, dup_batch)
    assert first.error_code == 0
    dup_offset = first.base_offset

    with Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 5}) as p:
        for i in range(400):
            p.send(topic, value=b"old-%05d" % i + b"." * 100, partition=0, timestamp_ms=old)
        p.flush()

    txp = Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": f"ret-{topic}",
                    "linger.ms": 5})
    txp.init_transactions()
    txp.begin_transaction()
    for i in range(50):
        txp.send(topic, value=b"aborted-%03d" % i, partition=0)
    txp.flush()
    txp.abort_transaction()
    txp.begin_transaction()
    for i in range(50):
        txp.send(topic, value=b"committed-%03d" % i, partition=0)
    txp.commit_transaction()
    txp.close()

    dirs = replica_dirs(cluster, topic)
    # Followers store the leader's batches byte for byte: wait until they hold all of them.
    wait_for(lambda: len({disk_bytes(d) for d in dirs.values()}) == 1, 30, "every replica caught up")
    before = {n: disk_bytes(d) for n, d in dirs.items()}
    assert all(b > 40_000 for b in before.values()), before
    assert all(log_start_on_disk(d) == 0 for d in dirs.values())
    admin.incremental_alter_configs({topic: {"retention.ms": str(10 * 60_000)}})
    # The cleaner of every replica deletes the old segments; the leader's log start moves.
    # The log start offset is checkpointed before the segment files go (as Kafka's), so
    # both are waited for.
    wait_for(lambda: all(log_start_on_disk(d) > 400 for d in dirs.values()), 30,
             "the log start offset advancing on every replica")
    after = {}
    wait_for(lambda: after.update({n: disk_bytes(d) for n, d in dirs.items()}) or
             all(after[n] < before[n] / 2 for n in dirs), 30, "the old segments deleted on every replica")
    c = consumer(cluster, **{"auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    c.assign([tp])
    low, high = c.get_watermark_offsets(tp, timeout=10)
    assert low > 400 and low == log_start_on_disk(next(iter(dirs.values())))
    assert c.beginning_offsets([tp])[tp] == low
    got = []
    wait_for(lambda: got.extend(c.poll(0.5)) or c.position(tp) >= high, 30, "reading to the end")
    c.close()
    assert got[0].offset >= low
    values = [r.value for r in got]
    assert [v for v in values if v.startswith(b"committed")] == [b"committed-%03d" % i for i in range(50)]
    assert not any(v.startswith(b"aborted") for v in values)
    assert len(values) == len(set(values))

    # A consumer below the log start offset resets as configured.
    for reset, expect in (("earliest", low), ("latest", high)):
        c = consumer(cluster, **{"auto.offset.reset": reset})
        c.assign([tp])
        c.seek(tp, 0)
        seen = []
        wait_for(lambda: seen.extend(c.poll(0.3)) or c.position(tp) >= expect, 30, f"reset to {reset}")
        assert all(r.offset >= low for r in seen)
        if reset == "latest":
            assert seen == []
        c.close()
    c = consumer(cluster, **{"auto.offset.reset": "none"})
    c.assign([tp])
    c.seek(tp, 0)
    with pytest.raises(errors.OffsetOutOfRangeError):
        wait_for(lambda: c.poll(0.3) and False, 15, "OffsetOutOfRangeError")
    c.close()

    # Restarts (SIGKILL): every replica keeps its log start offset, dedup still works.
    for name in dirs:
        cluster.kill(name)
        cluster.restart(name)
    wait_for(lambda: all(log_start_on_disk(d) >= low for d in dirs.values()), 30, "log start after restarts")
    def retried():
        try:
            r = raw_produce(cluster, topic, dup_batch)
        except (grpc.RpcError, errors.ExactlyError):
            return None
        return r if r.error_code not in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE,
                                         ErrorCode.NOT_ENOUGH_REPLICAS) else None
    again = wait_for(retried, 60, "a leader answering the retried batch")
    assert again.error_code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER and again.base_offset == dup_offset

    # DeleteRecords moves the log start offset explicitly, on every replica.
    hw = admin.delete_records({tp: -1})[tp]
    assert hw >= high
    wait_for(lambda: all(log_start_on_disk(d) >= hw for d in dirs.values()), 30, "DeleteRecords on every replica")
    with pytest.raises(errors.OffsetOutOfRangeError):
        admin.delete_records({tp: hw + 1000})
    with pytest.raises(errors.InvalidTopicException):
        admin.delete_records({TopicPartition("__consumer_offsets", 0): 1})
    admin.close()
