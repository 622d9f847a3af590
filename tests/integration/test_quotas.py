"""Client quotas on real processes (docs/design.md, "Quotas"; KIP-13, KIP-219, KIP-546,
KIP-599): a secured dev cluster (TLS client certificates, authorizer=acl) with two users.
`exactly quotas` sets alice's producer byte rate; alice's producer, sending as fast as it
can, is held to the rate (within 10 %) and sees throttle_time_ms, on the gRPC port and on
the Kafka port (librdkafka's throttle callback); bob, on the same partition leader at the
same time, is not throttled. A consumer_byte_rate on a client id holds an SDK consumer with
that client.id. A partition quota (max_partitions) stops alice's topic creation at her
quota while bob's goes on; controller_mutation_rate throttles and refuses bob's bursts.
kafka-python alters and describes quotas on the Kafka port (keys 48, 49).
EXACTLY_QUOTA_MEASURE_S (default 8) sets how long each rate is measured."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import grpc
import pytest

from exactly import AclBinding, AdminClient, NewTopic, Producer, errors
from exactly_tools.certs import CertificateAuthority
from exactly_tools.devcluster import DevCluster
from exactly_wire import records
from exactly_wire.clock import wall_clock_ms
from exactly_wire.security import TransportSecurity, secure_channel
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from clusters import admin_client, certificate_conf, new_chroot
from waiting import wait_for

pytestmark = pytest.mark.integration

RATE = 200 * 1024  # alice's producer_byte_rate, bytes/s
WINDOWS = 3  # quota.window.num: a short burst allowance, so the test reaches the steady state fast
# Seconds each rate is measured over once past the first windows (longer: a closer figure).
MEASURE_S = float(os.environ.get("EXACTLY_QUOTA_MEASURE_S", "8"))
FAST = {"request.timeout.ms": 10000, "retry.backoff.ms": 50, "retry.backoff.max.ms": 200}


@pytest.fixture(scope="module")
def sec(zk, tmp_path_factory):
    c = DevCluster(tmp_path_factory.mktemp("quota-cluster"), props={"quota.window.num": str(WINDOWS)}, security=True)
    c.up(1, 1, 1, zookeeper=new_chroot(zk, "quotas"))
    ca = CertificateAuthority.load(c.dir / "certs")
    for name in ("alice", "bob"):
        ca.issue(name, client=True)
    yield c
    c.down()


def conf(sec, name: str, **extra) -> dict:
    return certificate_conf(sec, name, **FAST, **extra)


def cli(sec, tmp_path, *args) -> subprocess.CompletedProcess:
    """The installed `exactly` entry point with the admin's TLS settings."""
    props = tmp_path / "admin.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in sec.client_config.items()))
    exe = str(Path(sys.executable).parent / "exactly")
    res = subprocess.run([exe, *args, "--bootstrap-server", sec.bootstrap_servers, "--command-config", str(props)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res
    return res


def raw_produce(sec, who: str, topic: str, size: int) -> pb.ProduceResponse:
    """One Produce of a `size`-byte record straight to the partition leader."""
    leader = sec.services["pl-0"].address
    stub = pbg.PartitionLeaderStub(secure_channel(leader, TransportSecurity.from_conf(conf(sec, who)), []))
    batch = records.encode_batch([(None, b"x" * size, (), wall_clock_ms())])
    return stub.Produce(pb.ProduceRequest(acks=1, timeout_ms=10000, topics=[pb.TopicProduceData(
        name=topic, partitions=[pb.PartitionProduceData(partition=0, records=batch)])]), timeout=30)


@pytest.fixture(scope="module")
def topic(sec):
    name = f"q-{uuid.uuid4().hex[:6]}"
    with admin_client(sec) as a:
        a.create_topics([NewTopic(name, 1, 1)])
        a.create_acls([AclBinding(f"User:{who}", "Topic", name, "All") for who in ("alice", "bob")])
    def produced() -> bool:
        try:
            return raw_produce(sec, "bob", name, 10).topics[0].partitions[0].error_code == 0
        except grpc.RpcError as exc:  # PERMISSION_DENIED until the ACL watch fired
            if exc.code() != grpc.StatusCode.PERMISSION_DENIED:
                raise
            return False
    wait_for(produced, 20, "the ACLs applied")
    return name


class Flood:
    """A producer thread sending 1 KiB records as fast as send() takes them; the
    bytes acknowledged are timestamped, for the rate over any interval."""

    def __init__(self, sec, who: str, topic: str):
        self.producer = Producer(conf(sec, who, **{"linger.ms": 5, "buffer.memory": 262144, "acks": 1,
                                                   "enable.idempotence": False}))
        self.topic = topic
        self.acked: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        value = b"v" * 1024
        while not self.stop.is_set():
            f = self.producer.send(self.topic, value)
            f.add_done_callback(lambda fut: fut.exception() is None and self.acked.append((time.monotonic(), 1024)))

    def rate(self, start: float, end: float) -> float:
        """Bytes/s acknowledged between `start` and `end`: the least-squares slope of the
        cumulative bytes over time (less sensitive than two end points to the bursts a
        windowed rate allows after each window ages out)."""
        return cumulative_slope([(t, n) for t, n in list(self.acked) if start <= t < end])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.producer.close()


def cumulative_slope(samples: list[tuple[float, int]]) -> float:
    """Least-squares slope (units/s) of the running total of `samples` [(time s, units)]."""
    if len(samples) < 2:
        return 0.0
    ts, total, ys = [], 0, []
    for t, n in samples:
        total += n
        ts.append(t)
        ys.append(total)
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / sum((t - mt) ** 2 for t in ts)


def sync_latencies(sec, who: str, topic: str, n: int) -> list[float]:
    """ms of `n` one-record produce-and-wait round trips."""
    out = []
    with Producer(conf(sec, who, **{"linger.ms": 0, "enable.idempotence": False})) as p:
        p.send(topic, b"warm").result(30)
        for _ in range(n):
            start = time.perf_counter()
            p.send(topic, b"y" * 100).result(30)
            out.append((time.perf_counter() - start) * 1000)
    return out


def test_produce_byte_rate_is_held_and_another_user_is_unaffected(sec, topic, tmp_path):
    bob_before = statistics.median(sync_latencies(sec, "bob", topic, 30))
    out = cli(sec, tmp_path, "quotas", "--entity-type", "users", "--entity-name", "alice", "--alter",
              "--add-config", f"producer_byte_rate={RATE}").stdout
    assert "alice" in out
    described = json.loads(cli(sec, tmp_path, "quotas", "--entity-type", "users", "--entity-name", "alice",
                               "--describe", "--json").stdout)
    assert described == [{"entity": {"user": "alice"}, "quotas": {"producer_byte_rate": float(RATE)}}]
    # Applied by the leader's watch: a request far above the rate is throttled.
    wait_for(lambda: raw_produce(sec, "alice", topic, 4 * RATE).throttle_time_ms > 0, 20, "alice's quota applied")
    time.sleep(WINDOWS + 1)  # let that burst age out of the measured windows

    alice = Flood(sec, "alice", topic)
    try:
        start = time.monotonic()
        warm_until = start + 2 * WINDOWS  # the first windows allow a burst, then a long throttle (Kafka's Rate)
        wait_for(lambda: time.monotonic() > warm_until + 1, 30, "alice's warm-up")
        bob_during = sync_latencies(sec, "bob", topic, 30)
        bob_flood = Flood(sec, "bob", topic)
        bob_start = time.monotonic()
        wait_for(lambda: time.monotonic() > warm_until + MEASURE_S, MEASURE_S + 60, "the measuring interval")
        end = time.monotonic()
        bob_flood.close()
        bob_rate = bob_flood.rate(bob_start, end)
        alice_rate = alice.rate(warm_until, end)
        throttle_seen = alice.producer._sender.throttle_time_ms_max
        # While alice's producer runs, her own Produce reads the throttle in the response field.
        raw_alice = raw_produce(sec, "alice", topic, 4 * RATE).throttle_time_ms
    finally:
        alice.close()
    print(f"alice {alice_rate / 1024:.1f} KiB/s for a quota of {RATE / 1024:.0f} KiB/s (max throttle "
          f"{throttle_seen} ms, raw Produce throttle_time_ms {raw_alice}); bob {bob_rate / 1024:.1f} KiB/s, "
          f"produce p50 {bob_before:.1f} ms before, "
          f"{statistics.median(bob_during):.1f} ms while alice is throttled")
    # Record bytes are a little less than the Produce request bytes the quota counts.
    assert 0.9 * RATE <= alice_rate <= 1.1 * RATE, (alice_rate, RATE)
    assert throttle_seen > 0
    assert raw_alice > 0
    # bob: no throttle, and more than the quota alice is held to.
    assert raw_produce(sec, "bob", topic, 64 * 1024).throttle_time_ms == 0
    assert bob_rate > 2 * RATE, bob_rate
    assert statistics.median(bob_during) < max(3 * bob_before, bob_before + 50), (bob_before, bob_during)


def test_consumer_byte_rate_by_client_id(sec, topic, tmp_path):
    """consumer_byte_rate set on a client id: bob's SDK consumer with that `client.id`
    (sent as its gRPC user agent) reads at the rate and sees throttle_time_ms; the
    topic holds megabytes from the producers above, so it could read far faster."""
    from exactly import Consumer, TopicPartition
    cli(sec, tmp_path, "quotas", "--entity-type", "clients", "--entity-name", "slow-reader", "--alter",
        "--add-config", f"consumer_byte_rate={RATE}")
    consumer = Consumer(conf(sec, "bob", **{"client.id": "slow-reader", "auto.offset.reset": "earliest",
                                            "max.partition.fetch.bytes": 65536, "enable.auto.commit": False}))
    try:
        consumer.assign([TopicPartition(topic, 0)])
        received: list[tuple[float, int]] = []
        start = time.monotonic()
        warm_until = start + WINDOWS + 1
        end = warm_until + MEASURE_S
        while time.monotonic() < end:
            for r in consumer.poll(0.5):
                received.append((time.monotonic(), len(r.value or b"")))
        rate = cumulative_slope([(t, n) for t, n in received if t >= warm_until])
        throttle_seen = consumer._fetcher.throttle_time_ms_max
    finally:
        consumer.close()
    print(f"slow-reader {rate / 1024:.1f} KiB/s for a quota of {RATE / 1024:.0f} KiB/s (max throttle "
          f"{throttle_seen} ms)")
    assert throttle_seen > 0
    assert 0.7 * RATE <= rate <= 1.1 * RATE, rate


def test_kafka_port_reports_throttle_time(sec, topic, tmp_path):
    """librdkafka producing as alice (TLS client certificate) on the Kafka port gets
    its throttle_time_ms (the throttle callback), as from a Kafka broker."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    cli(sec, tmp_path, "quotas", "--entity-type", "users", "--entity-name", "alice", "--alter",
        "--add-config", f"producer_byte_rate={RATE}")
    certs = sec.dir / "certs"
    throttles: list[int] = []
    p = confluent_kafka.Producer({
        "bootstrap.servers": sec.services["pl-0"].kafka_address, "security.protocol": "SSL",
        "ssl.ca.location": str(certs / "ca.pem"), "ssl.certificate.location": str(certs / "alice.pem"),
        "ssl.key.location": str(certs / "alice.key"), "linger.ms": 5,
        "throttle_cb": lambda event: throttles.append(event.throttle_time)})
    deadline = time.monotonic() + 30
    while not throttles and time.monotonic() < deadline:
        try:
            p.produce(topic, b"k" * 16384)
        except BufferError:
            pass
        p.poll(0.01)
    p.flush(30)
    assert throttles and max(throttles) > 0


def test_partition_quota(sec, tmp_path):
    """max_partitions for alice: her topics may have 4 partitions in all; a fifth is
    refused (POLICY_VIOLATION naming the quota), by CreateTopics and by
    CreatePartitions; bob, without a quota, creates more."""
    prefix = f"pq-{uuid.uuid4().hex[:6]}"
    with admin_client(sec) as a:
        a.create_acls([AclBinding(f"User:{who}", "Topic", f"{prefix}-{who}", "All", "Allow", "Prefixed")
                       for who in ("alice", "bob")])
    cli(sec, tmp_path, "quotas", "--entity-type", "users", "--entity-name", "alice", "--alter",
        "--add-config", "max_partitions=4")
    wait_for(lambda: _create(sec, "alice", f"{prefix}-alice-probe", 5) == errors.PolicyViolationError, 20,
             "alice's partition quota applied")
    assert _create(sec, "alice", f"{prefix}-alice-a", 3) is None
    refused = _create(sec, "alice", f"{prefix}-alice-b", 2, message=True)
    assert isinstance(refused, errors.PolicyViolationError) and "partition quota of 4" in str(refused), refused
    assert _create(sec, "alice", f"{prefix}-alice-c", 1) is None  # exactly at the quota
    with AdminClient(conf(sec, "alice")) as a:
        with pytest.raises(errors.PolicyViolationError, match="max_partitions"):
            a.create_partitions({f"{prefix}-alice-a": 4})
    for i in range(3):  # bob has no quota: 6 partitions and more
        assert _create(sec, "bob", f"{prefix}-bob-{i}", 2) is None
    with AdminClient(conf(sec, "alice")) as a:  # deleting frees the quota
        a.delete_topics([f"{prefix}-alice-a"])
    wait_for(lambda: _create(sec, "alice", f"{prefix}-alice-d", 3) is None, 20, "the deleted partitions freed")
    # controller_mutation_rate (KIP-599): 1 partition/s, a burst of quota.window.num
    # partitions, per service (asked of one service here, as Kafka clients ask the controller).
    cli(sec, tmp_path, "quotas", "--entity-type", "users", "--entity-name", "bob", "--alter",
        "--add-config", "controller_mutation_rate=1")

    def stub_as(client_id: str) -> pbg.ClusterStub:
        return pbg.ClusterStub(secure_channel(sec.services["pl-0"].address,
                                              TransportSecurity.from_conf(conf(sec, "bob")),
                                              [("grpc.primary_user_agent", f"exactly/{client_id}")]))
    first_client, second_client = stub_as("one"), stub_as("two")

    def create(stub, partitions: int) -> pb.CreateTopicsResponse:
        return stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
            name=f"{prefix}-bob-m{uuid.uuid4().hex[:6]}", num_partitions=partitions, replication_factor=1)]),
            timeout=30)

    # Once the quota applies, a burst past the bucket is answered with a throttle time.
    burst = wait_for(lambda: (r := create(first_client, WINDOWS + 2)).throttle_time_ms > 0 and r, 20,
                     "bob's mutation quota applied")
    assert burst.topics[0].error_code == 0 and burst.throttle_time_ms <= 3000
    # bob's other client (not muted) asks while the bucket is negative: refused.
    refused = create(second_client, 1)
    assert refused.topics[0].error_code == errors.ErrorCode.THROTTLING_QUOTA_EXCEEDED, refused
    assert 0 < refused.throttle_time_ms and "controller_mutation_rate" in refused.topics[0].error_message
    # The first client, muted for its throttle time, is served once the bucket refilled.
    assert create(first_client, 1).topics[0].error_code == 0


def _create(sec, who: str, name: str, partitions: int, message: bool = False):
    """None when created, else the error's class (or the error with `message`)."""
    with AdminClient(conf(sec, who)) as a:
        try:
            a.create_topics([NewTopic(name, partitions, 1)])
        except errors.ExactlyError as exc:
            return exc if message else type(exc)
    return None


def test_kafka_admin_client_alters_and_describes_quotas(sec):
    """kafka-python's AlterClientQuotas / DescribeClientQuotas (keys 49 / 48, KIP-546)
    on the Kafka port, as the admin (a super user); a user without Alter on the
    Cluster is refused."""
    kafka_admin = pytest.importorskip("kafka.admin")
    from kafka.protocol.admin import AlterClientQuotasRequest as Alter, DescribeClientQuotasRequest as Describe
    certs = sec.dir / "certs"

    def client(who: str):
        return kafka_admin.KafkaAdminClient(
            bootstrap_servers=sec.services["pl-0"].kafka_address, security_protocol="SSL",
            ssl_cafile=str(certs / "ca.pem"), ssl_certfile=str(certs / f"{who}.pem"),
            ssl_keyfile=str(certs / f"{who}.key"), request_timeout_ms=20000)

    def alter(a, name, value):
        return a._manager.run(a._manager.send, Alter(validate_only=False, entries=[Alter.EntryData(
            entity=[Alter.EntryData.EntityData(entity_type="client-id", entity_name=name)],
            ops=[Alter.EntryData.OpData(key="consumer_byte_rate", value=value, remove=False)])]))

    a = client("admin")
    try:
        resp = alter(a, "kafka-python-app", 4096.0)
        assert [e.error_code for e in resp.entries] == [0]
        bad = alter(a, "kafka-python-app", -1.0)
        assert [e.error_code for e in bad.entries] == [errors.ErrorCode.INVALID_REQUEST]
        described = a._manager.run(a._manager.send, Describe(strict=True, components=[
            Describe.ComponentData(entity_type="client-id", match_type=0, match="kafka-python-app")]))
        assert described.error_code == 0
        assert [[(v.key, v.value) for v in e.values] for e in described.entries] == [[("consumer_byte_rate", 4096.0)]]
        assert [(c.entity_type, c.entity_name) for c in described.entries[0].entity] == \
            [("client-id", "kafka-python-app")]
    finally:
        a.close()
    b = client("bob")
    try:
        refused = alter(b, "kafka-python-app", 1.0)
        assert [e.error_code for e in refused.entries] == [errors.ErrorCode.CLUSTER_AUTHORIZATION_FAILED]
    finally:
        b.close()
