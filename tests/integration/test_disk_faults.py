"""Disk faults on a partition leader's data directory (KIP-112 log-directory failure,
durability per setting), with real processes, real ZooKeeper and a real filesystem
between the service and its files: the FUSE filesystem of tests/faults/diskfs.py, or
a size-limited tmpfs for a full disk. docs/operating/failures.md, "Disk faults and durability";
docs/design.md, "Disk faults".

- EIO on writes to one leader's log directory (RF 3): that node answers
  KAFKA_STORAGE_ERROR, publishes its log directory offline, the controller moves its
  leaderships to in-sync replicas within the session timeout, exactly_log_dir_offline
  is 1 there and a real Prometheus fires ExactlyLogDirOffline for it (resolved after the
  repair and a restart), and the producer carries on without losing or duplicating anything.
- A full disk (tmpfs) under the leader (RF 3): appends are refused with
  KAFKA_STORAGE_ERROR, leadership moves, nothing acknowledged is lost; once the disk
  is larger again a restart recovers and the node rejoins the ISR.
- Page cache dropped (the filesystem's "crash") on the leader of three (RF 3,
  acks=all, min.insync.replicas 2): nothing acknowledged is lost.

- RF 1: a crash of the only node loses what was acknowledged since the last fsync by
  default; with flush.messages=1 (topic config) nothing acknowledged is lost.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
import uuid

import grpc
import pytest

from exactly import AdminClient, NewTopic, Producer, TopicPartition, errors
from exactly_wire import records
from exactly_wire.clock import wall_clock_ms
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from faults.diskfs import under_faults
from waiting import wait_for

from .test_prometheus import _start_prometheus
from .test_replication import PROPS, SESSION_MS, Sender, _error_of, producer, read_all

pytestmark = pytest.mark.integration




def create_topic(cluster, partitions: int = 1, rf: int = 3, configs: dict | None = None) -> str:
    """A new topic; waits (20 s at most) until `rf` partition leaders are registered
    (one may have just restarted)."""
    topic = f"disk-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})

    def create() -> bool:
        try:
            admin.create_topics([NewTopic(topic, partitions, replication_factor=rf, config=configs or {})],
                                timeout=60)
            return True
        except errors.InvalidReplicationFactorError:
            return False
    try:
        wait_for(create, 20, f"{rf} live partition leaders", interval_s=0.5)
    finally:
        admin.close()
    return topic


def states(cluster, topic: str, exclude: tuple[str, ...] = ()) -> dict[int, tuple[str | None, tuple[str, ...]]]:
    """partition -> (leader, ISR) as the live partition leaders not in `exclude` see it."""
    servers = ",".join(s.address for n, s in cluster.services.items()
                       if s.role == "partition_leader" and n not in exclude)
    admin = AdminClient({"bootstrap.servers": servers, "request.timeout.ms": 3000})
    try:
        return {n: (p.leader_id, tuple(p.isr)) for n, p in admin.describe_topics([topic])[topic].partitions.items()}
    finally:
        admin.close()


def read_values(cluster, topic: str, partition: int, expected: int, timeout_s: float = 30.0) -> list[bytes]:
    return [r.value for r in read_all(cluster, topic, expected, timeout_s, 1.0, partition)]


def _raw_produce(address: str, topic: str, value: bytes, pid: int, seq: int, acks: int = -1,
                 timeout_s: float = 30.0, partition: int = 0) -> grpc.Future:
    batch = records.encode_batch([(None, value, (), wall_clock_ms())], producer_id=pid, producer_epoch=0,
                                 base_sequence=seq)
    ch = grpc.insecure_channel(address)
    req = pb.ProduceRequest(acks=acks, timeout_ms=int(timeout_s * 1000), topics=[pb.TopicProduceData(
        name=topic, partitions=[pb.PartitionProduceData(partition=partition, records=batch)])])
    fut = pbg.PartitionLeaderStub(ch).Produce.future(req, timeout=timeout_s + 5)
    fut.add_done_callback(lambda f: ch.close())
    return fut


def scrape(cluster, name: str) -> str:
    return urllib.request.urlopen(f"http://{cluster.services[name].metrics_address}/metrics", timeout=10).read().decode()


def gauge(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture
def rf3(make_cluster):
    return make_cluster(partition_leaders=3, txn_coordinators=1, group_coordinators=0, props=PROPS)


def led_by(cluster, topic: str, node: str) -> int:
    """A partition of `topic` that `node` leads with all 3 replicas in sync."""
    return wait_for(lambda: [p for p, (leader, isr) in states(cluster, topic).items()
                             if leader == node and len(isr) == 3], 20,
                    lambda: f"{node} leading with ISR 3: {states(cluster, topic)}")[0]


def acknowledged_on(cluster, node: str, prefix: str, n: int):
    """A new topic (3 partitions, RF 3), a partition `node` leads with a full ISR, an
    idempotent acks=all producer and a sender that had `n` records acknowledged there:
    (topic, partition, producer, sender)."""
    topic = create_topic(cluster, partitions=3)
    part = led_by(cluster, topic, node)
    p = producer(cluster)
    sender = PartitionSender(p, topic, part, prefix)
    sender.send(n)
    p.flush(30)
    assert len(sender.acked) == n and not sender.failed
    return topic, part, p, sender


def _send_and_check(cluster, topic: str, partition: int, sender: Sender, p: Producer) -> None:
    sender.stop()
    p.flush(30)
    assert not sender.failed, sender.failed[:3]
    assert len(sender.acked) == sender.sent
    got = read_values(cluster, topic, partition, len(sender.acked))
    assert len(got) == len(set(got)), "duplicates"
    assert set(got) == sender.acked


class PartitionSender(Sender):
    def __init__(self, p: Producer, topic: str, partition: int, prefix: str):
        super().__init__(p, topic, prefix)
        self.partition = partition

    def send(self, n: int) -> None:
        for _ in range(n):
            value = f"{self.prefix}-{self.sent}".encode()
            self.sent += 1
            self.p.send(self.topic, value, partition=self.partition).add_done_callback(
                lambda f, v=value: self._done(v, f))


def test_eio_on_a_leaders_log_dir_moves_its_leadership_to_an_in_sync_replica(rf3, tmp_path):
    disk = under_faults(rf3, "pl-0")
    prometheus = _start_prometheus(rf3, tmp_path / "prometheus")
    try:
        prometheus.wait_ready()
        topic, part, p, sender = acknowledged_on(rf3, "pl-0", "a", 100)
        try:
            assert gauge(scrape(rf3, "pl-0"), "exactly_log_dir_offline") == 0
            sender.start()
            wait_for(lambda: len(sender.acked) >= 120, 20, "acknowledgements before the fault")
            failed_at = time.monotonic()
            disk.set(eio=["write", "fsync"], paths=["logs/"])
            # pl-0 answers KAFKA_STORAGE_ERROR (Kafka error 56) from the first failed write on.
            code = _error_of(_raw_produce(rf3.services["pl-0"].address, topic, b"x", 10 ** 6, 0, acks=1,
                                          timeout_s=10, partition=part))
            assert code in (ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.NOT_LEADER_OR_FOLLOWER), code
            new = wait_for(lambda: (lambda st: st if st[0] not in (None, "pl-0") and "pl-0" not in st[1] else None)(
                states(rf3, topic)[part]), SESSION_MS / 1000 + 5, "a new leader without pl-0 in the ISR")
            moved_after = time.monotonic() - failed_at
            acked = len(sender.acked)
            wait_for(lambda: len(sender.acked) >= acked + 50, 20, "acknowledgements from the new leader")
            _send_and_check(rf3, topic, part, sender, p)
        finally:
            sender.stop()
            p.close(10)
        assert moved_after < SESSION_MS / 1000 + 5 and new[0] in ("pl-1", "pl-2")
        # The process keeps serving (metadata, errors) and reports the offline directory.
        assert gauge(scrape(rf3, "pl-0"), "exactly_log_dir_offline") == 1
        firing = wait_for(lambda: prometheus.firing("ExactlyLogDirOffline"), 60, "ExactlyLogDirOffline to fire",
                          interval_s=0.5)
        assert [a["instance"] for a in firing] == [rf3.services["pl-0"].metrics_address], firing
        assert _error_of(_raw_produce(rf3.services["pl-0"].address, topic, b"y", 10 ** 6 + 1, 0,
                                      timeout_s=10, partition=part)) == ErrorCode.KAFKA_STORAGE_ERROR
        # Every partition left pl-0; none lost its leader.
        for leader, isr in states(rf3, topic).values():
            assert leader not in (None, "pl-0") and "pl-0" not in isr
        # Repaired disk: a restart recovers the log and pl-0 rejoins every ISR.
        rf3.kill("pl-0")
        disk.clear()
        rf3.restart("pl-0")
        wait_for(lambda: all("pl-0" in isr for _, isr in states(rf3, topic).values()), 30, "pl-0 back in the ISRs")
        assert gauge(scrape(rf3, "pl-0"), "exactly_log_dir_offline") == 0
        wait_for(lambda: not prometheus.firing("ExactlyLogDirOffline"), 60, "ExactlyLogDirOffline to resolve",
                 interval_s=0.5)
    finally:
        prometheus.stop()
        rf3.kill("pl-0")
        disk.close()


def test_full_disk_refuses_appends_and_loses_nothing_acknowledged(rf3):
    rf3.stop("pl-0")
    data = rf3.dir / "pl-0"
    used = sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
    saved = rf3.dir / "pl-0-saved"
    os.rename(data, saved)
    data.mkdir()
    size_kb = used // 1024 + 2048  # about 2 MB free
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k,mode=0700", "tmpfs", str(data)], check=True)
    try:
        for entry in saved.iterdir():
            (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, data / entry.name)
        rf3.restart("pl-0")
        topic = create_topic(rf3, partitions=3)
        part = led_by(rf3, topic, "pl-0")
        p = producer(rf3, **{"batch.size": 65536})
        sender = PartitionSender(p, topic, part, "v" * 20000)
        try:
            # ~4 MB into a disk with ~2 MB free: pl-0 fills up on the way.
            for _ in range(200):
                sender.send(1)
            p.flush(60)
            wait_for(lambda: gauge(scrape(rf3, "pl-0"), "exactly_log_dir_offline") == 1, 20,
                     "pl-0's log directory offline")
            leader, isr = wait_for(lambda: (lambda st: st if st[0] not in (None, "pl-0") else None)(
                states(rf3, topic)[part]), SESSION_MS / 1000 + 5, "a new leader")
            assert "pl-0" not in isr
            code = _error_of(_raw_produce(rf3.services["pl-0"].address, topic, b"x", 10 ** 6, 0,
                                          timeout_s=10, partition=part))
            assert code == ErrorCode.KAFKA_STORAGE_ERROR
            _send_and_check(rf3, topic, part, sender, p)
        finally:
            sender.stop()
            p.close(10)
        # A larger disk and a restart: pl-0 recovers and rejoins the ISR.
        rf3.kill("pl-0")
        subprocess.run(["mount", "-o", f"remount,size={size_kb + 65536}k", str(data)], check=True)
        rf3.restart("pl-0")
        wait_for(lambda: "pl-0" in states(rf3, topic)[part][1], 30, "pl-0 back in the ISR")
    finally:
        rf3.kill("pl-0")
        subprocess.run(["umount", "-l", str(data)], check=False)


def test_dropped_page_cache_on_the_leader_loses_nothing_committed(rf3):
    disk = under_faults(rf3, "pl-0")
    try:
        topic, part, p, sender = acknowledged_on(rf3, "pl-0", "c", 300)
        try:
            rf3.kill("pl-0")
            assert disk.crash() > 0  # the acknowledged records were in pl-0's page cache only
            rf3.restart("pl-0")
            sender.send(100)
            _send_and_check(rf3, topic, part, sender, p)
        finally:
            sender.stop()
            p.close(10)
        wait_for(lambda: "pl-0" in states(rf3, topic)[part][1], 30, "pl-0 back in the ISR")
    finally:
        rf3.kill("pl-0")
        disk.close()


def test_rf1_crash_loses_unflushed_records_unless_flush_messages_is_1(make_cluster):
    single = make_cluster(partition_leaders=1, txn_coordinators=1, group_coordinators=0,
                          props={"zookeeper.session.timeout.ms": str(SESSION_MS)})
    disk = under_faults(single, "pl-0")
    try:
        flushed = create_topic(single, rf=1, configs={"flush.messages": "1"})
        default = create_topic(single, rf=1)
        p = producer(single)
        try:
            for topic in (flushed, default):
                futures = [p.send(topic, f"r-{i}".encode(), partition=0) for i in range(50)]
                p.flush(30)
                assert all(f.exception() is None for f in futures)
        finally:
            p.close(10)
        single.kill("pl-0")
        disk.crash()
        single.restart("pl-0")
        assert sorted(read_values(single, flushed, 0, 50)) == sorted(f"r-{i}".encode() for i in range(50))
        # Without flush.messages the acknowledged records were only in the page cache.
        assert len(read_values(single, default, 0, 50, timeout_s=5)) < 50
    finally:
        single.kill("pl-0")
        disk.close()


# Crash cycles of the aborted-index test: CRASH_RUNS (2; 20 under make soak, EXACTLY_DISK_SOAK=1;
# or EXACTLY_CRASH_RUNS=n).
CRASH_RUNS = int(os.environ.get("EXACTLY_CRASH_RUNS") or (20 if os.environ.get("EXACTLY_DISK_SOAK") else 2))
# Values of about 600 bytes, three to a transaction: every transaction's batch is larger than
# segment.bytes (1024), so it starts a segment of its own and the segments before it can go.
_PAD = "x" * 600


def _committed_names(cluster, topic: str, expected: int) -> list[str]:
    """The read_committed values of partition 0 without their padding, sorted."""
    return sorted(r.value.decode().removesuffix("-" + _PAD)
                  for r in read_all(cluster, topic, expected, timeout_s=30, settle_s=1.0))


def test_aborted_transactions_at_the_log_end_stay_aborted_through_crashes(make_cluster):
    """flush.messages=1, a transaction aborted at the log end, then a producer-state snapshot
    synced with nothing appended after the marker (the one segment deletion of DeleteRecords
    takes it), then a crash that drops everything not fsynced: read_committed reads the same
    before and after, in each of CRASH_RUNS crash cycles."""
    single = make_cluster(partition_leaders=1, txn_coordinators=1, group_coordinators=0,
                          props={"zookeeper.session.timeout.ms": str(SESSION_MS), "flush.messages": "1",
                                 "log.retention.check.interval.ms": "100"})
    disk = under_faults(single, "pl-0")
    admin = AdminClient({"bootstrap.servers": single.bootstrap_servers})
    try:
        for run in range(CRASH_RUNS):
            # Periodic snapshots off for the topic: the one taken is the synced one before the
            # segment deletion, right after the ABORT marker.
            topic = create_topic(single, rf=1, configs={"segment.bytes": "1024",
                                                         "producer.snapshot.interval.ms": "3600000"})
            tp = TopicPartition(topic, 0)
            p = Producer({"bootstrap.servers": single.bootstrap_servers, "transactional.id": f"crash-{topic}",
                          "linger.ms": 50, "request.timeout.ms": 10000})
            try:
                p.init_transactions(30)
                ends = []
                for name, commit in (("old", True), ("kept", True), ("aborted", False)):
                    p.begin_transaction()
                    for i in range(3):
                        p.send(topic, f"{name}-{run}-{i}-{_PAD}".encode(), partition=0)
                    p.flush(30)  # in the log before the marker, also when aborting
                    p.commit_transaction(30) if commit else p.abort_transaction(30)
                    # Each transaction: 3 records and its marker.
                    end = (ends[-1] if ends else 0) + 4
                    wait_for(lambda e=end: admin.list_offsets([tp])[tp] == (e, e), 20,
                             lambda e=end: f"high watermark and LSO at {e}: {admin.list_offsets([tp])[tp]}")
                    ends.append(end)
            finally:
                p.close(10)
            # DeleteRecords below "kept": the cleaner deletes the segments of "old" and, first,
            # takes a synced producer-state snapshot at the log end, just past the ABORT marker.
            assert admin.delete_records({tp: ends[0]})[tp] == ends[0]
            part_dir = single.dir / "pl-0-backing" / "logs" / f"{topic}-0"
            wait_for(lambda: not (part_dir / f"{0:020d}.log").exists(), 20, "the first segment deleted")
            before = _committed_names(single, topic, 3)
            assert before == [f"kept-{run}-{i}" for i in range(3)]
            single.kill("pl-0")
            assert disk.crash() > 0
            single.restart("pl-0")
            after = _committed_names(single, topic, 3)
            assert after == before, f"run {run} of {CRASH_RUNS}: read_committed after the crash"
    finally:
        admin.close()
        single.kill("pl-0")
        disk.close()


def labelled(text: str, name: str, topic: str) -> float:
    """The value of series `name{topic="<topic>"}` in a scrape, 0 when absent."""
    prefix = f'{name}{{topic="{topic}"}} '
    return next((float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix)), 0.0)


@pytest.fixture
def single_on_faults(make_cluster):
    """A one-node cluster (log cleaner every 200 ms) with pl-0's data directory on the
    fault filesystem: (cluster, DiskFaults)."""
    single = make_cluster(partition_leaders=1, txn_coordinators=1, group_coordinators=0,
                          props={"zookeeper.session.timeout.ms": str(SESSION_MS),
                                 "log.retention.check.interval.ms": "200"})
    disk = under_faults(single, "pl-0")
    yield single, disk
    single.kill("pl-0")
    disk.close()


def test_an_io_error_of_the_log_cleaner_takes_the_log_directory_offline(single_on_faults):
    single, disk = single_on_faults
    # Segments of one batch each (segment.bytes 1024), fsynced as written (flush.messages 1):
    # nothing but the cleaner has anything left to write to the partition's directory.
    topic = create_topic(single, rf=1, configs={"segment.bytes": "1024", "flush.messages": "1"})
    p = producer(single)
    try:
        two_hours_ago = wall_clock_ms() - 2 * 3600_000
        for _ in range(6):  # one batch each
            p.send(topic, b"v" * 600, partition=0, timestamp_ms=two_hours_ago).result(30)
    finally:
        p.close(10)
    hw_file = single.dir / "pl-0-backing" / "logs" / f"{topic}-0" / "high-watermark"
    wait_for(lambda: hw_file.exists() and hw_file.read_text().strip() == "6", 20, "the high watermark checkpointed")
    disk.set(eio=["write", "fsync"], paths=[f"logs/{topic}-0/"])
    assert gauge(scrape(single, "pl-0"), "exactly_log_dir_offline") == 0
    admin = AdminClient({"bootstrap.servers": single.bootstrap_servers})
    try:
        # The records are two hours old: the next cleaner pass deletes their segments and fails.
        admin.incremental_alter_configs({topic: {"retention.ms": "3600000"}})
    finally:
        admin.close()
    text = wait_for(lambda: (lambda t: t if labelled(t, "exactly_log_cleaner_errors_total", topic) else None)(
        scrape(single, "pl-0")), 20, "the log cleaner's I/O error")
    assert gauge(text, "exactly_log_dir_offline") == 1
    assert _error_of(_raw_produce(single.services["pl-0"].address, topic, b"x", 10 ** 6, 0,
                                  timeout_s=10)) == ErrorCode.KAFKA_STORAGE_ERROR


def test_an_io_error_opening_a_replica_takes_the_log_directory_offline(single_on_faults):
    single, disk = single_on_faults
    topic = f"disk-{uuid.uuid4().hex[:8]}"
    # The new replica's directory cannot be created: the cluster-change refresh opening it
    # fails (nothing else asks for the partition here).
    disk.set(eio=["create", "write", "fsync"], paths=[f"logs/{topic}-"])
    with grpc.insecure_channel(single.services["pl-0"].address) as ch:
        resp = pbg.ClusterStub(ch).CreateTopics(pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
            name=topic, num_partitions=1, replication_factor=1)]), timeout=10)
    assert resp.topics[0].error_code == ErrorCode.NONE, resp
    wait_for(lambda: gauge(scrape(single, "pl-0"), "exactly_log_dir_offline") == 1, 15,
             "the log directory offline")
