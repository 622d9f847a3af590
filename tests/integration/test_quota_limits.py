"""Quotas hold whatever the client does, on real processes of the default secured dev
cluster (`exactly-dev up --security`: 3 partition leaders, a transaction and a group
coordinator, TLS with client certificates, authorizer=acl; docs/design.md, "Quotas"):

- max_partitions is reserved with the topic: 16 CreateTopics at once, spread over
  every process, under a quota of 4 partitions create 4 partitions, not 16;
- a quota holds whatever the client does: a flood of calls the authorizer refuses
  runs into request_percentage (the principal's own calls are then held); Produce
  calls with 0.3 s deadlines that ignore every throttle, and Produce calls each under
  a client id of a pool of 64, all at once, append at most the principal's
  producer_byte_rate, while another principal's produce p50 on the same partition
  leader stays within 2x of its value before the attack (the least of three rounds on
  each side, measured in the same run; asserted with EXACTLY_ATTACK_P50=1, as make soak
  runs it, printed otherwise);
- quota sensors are bounded: under a `<default>` client-id quota, 4,000 Kafka Metadata
  requests each with a fresh 30 KB client id are refused (the connection closed; they
  made a partition leader keep 116 MB before), on gRPC such a client id is answered
  INVALID_ARGUMENT, and 4,000 fresh client ids of legal length leave a handful of
  sensors (`exactly_quota_sensors`), none once the quota is removed.
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import threading
import time
import uuid

import grpc
import pytest

from exactly import AclBinding, NewTopic
from exactly_tools.certs import CertificateAuthority
from exactly_wire import records
from exactly_wire.clock import wall_clock_ms
from exactly_wire.error_codes import ErrorCode
from exactly_wire.security import TransportSecurity, secure_channel
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from clusters import admin_client, certificate_conf, chrooted_cluster
from waiting import wait_for

pytestmark = pytest.mark.integration

USERS = ("alice", "mallory", "eve", "trudy")


@pytest.fixture(scope="module")
def sec(zk, tmp_path_factory):
    c = chrooted_cluster(zk, tmp_path_factory.mktemp("quota-limits"), "quotalimits", security=True)
    ca = CertificateAuthority.load(c.dir / "certs")
    for name in USERS:
        ca.issue(name, client=True)
    with admin_client(c) as a:
        a.create_acls([AclBinding(f"User:{who}", kind, f"{who}-", "All", pattern="Prefixed")
                       for who in USERS for kind in ("Topic", "Group", "TransactionalId")])
    yield c
    c.down()


def channel(c, who: str, service: str, user_agent: str | None = None) -> grpc.Channel:
    options = [("grpc.primary_user_agent", user_agent)] if user_agent else []
    return secure_channel(c.services[service].address, TransportSecurity.from_conf(certificate_conf(c, who)),
                          options)


def set_quota(c, user: str, **values: float) -> None:
    with admin_client(c) as a:
        a.alter_client_quotas({"user": user}, values)


# ---------------------------------------------------------------- max_partitions
def test_concurrent_create_topics_reserve_the_partition_quota(sec):
    """16 CreateTopics of one partition each, sent at once by 16 threads to the five
    processes in turn, under max_partitions=4: 4 are created, 12 refused with
    POLICY_VIOLATION naming the quota, and the principal's topics hold 4 partitions."""
    prefix = f"eve-pq-{uuid.uuid4().hex[:6]}"
    set_quota(sec, "eve", max_partitions=4)
    probe = pbg.ClusterStub(channel(sec, "eve", "pl-0"))

    def create(stub, name: str, partitions: int = 1) -> pb.CreatableTopicResult:
        return stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=1)]), timeout=60).topics[0]
    # Applied by every process's watch: 5 partitions at once are refused everywhere (a
    # probe created before is deleted again, which gives its partitions back). The
    # fixture's ACLs reach each process by a watch too: until then it denies eve.
    services = sorted(sec.services)
    for service in services:
        stub = pbg.ClusterStub(channel(sec, "eve", service))

        def refused() -> bool:
            name = f"{prefix}-probe-{uuid.uuid4().hex[:4]}"
            try:
                code = create(stub, name, 5).error_code
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    return False  # the ACLs not seen there yet
                raise
            if code == ErrorCode.NONE:
                with admin_client(sec) as a:
                    a.delete_topics([name])
            return code == ErrorCode.POLICY_VIOLATION
        wait_for(refused, 20, f"the quota applied at {service}")
    stubs = [pbg.ClusterStub(channel(sec, "eve", services[i % len(services)])) for i in range(16)]
    barrier = threading.Barrier(16)
    results: dict[int, pb.CreatableTopicResult] = {}

    def run(i: int) -> None:
        barrier.wait(30)
        results[i] = create(stubs[i], f"{prefix}-{i}")
    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    codes = sorted(ErrorCode(r.error_code).name for r in results.values())

    def listed() -> dict[str, int]:  # the topics created, once the metadata lists every one answered NONE
        with admin_client(sec) as a:
            found = {n: len(d.partitions) for n, d in a.describe_topics(
                [n for n in a.list_topics() if n.startswith(f"{prefix}-") and "probe" not in n]).items()}
        return found if len(found) >= codes.count("NONE") else {}
    created = wait_for(listed, 30, "the created topics listed")
    print(f"16 concurrent CreateTopics under max_partitions=4: {codes.count('NONE')} created, "
          f"{sum(created.values())} partitions; answers {codes}")
    assert len(results) == 16
    assert sum(created.values()) == 4, created
    assert codes.count("NONE") == 4 and codes.count("POLICY_VIOLATION") == 12, codes
    refused = next(r for r in results.values() if r.error_code)
    assert "partition quota of 4" in refused.error_message and "max_partitions" in refused.error_message
    assert create(probe, f"{prefix}-more").error_code == ErrorCode.POLICY_VIOLATION


# ---------------------------------------------------------------- quotas the client cannot escape
QUOTA_BYTES = 100 * 1024  # mallory's producer_byte_rate (bytes/s)
REQUEST_PERCENT = 10  # and request_percentage
BATCH = 16 * 1024  # the attackers' record size

QUOTA_SCRIPT = pathlib.Path(__file__).with_name("quota_flood.py")  # one attacking process


def _attack(c, mode: str, leader: str, topic: str, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(QUOTA_SCRIPT), mode, c.services[leader].address, topic, str(seconds),
                             str(c.dir / "certs")], stdout=subprocess.PIPE, text=True)


def _produce(stub, topic: str, size: int, timeout: float = 30) -> pb.PartitionProduceResponse:
    return stub.Produce(pb.ProduceRequest(acks=1, timeout_ms=10000, topics=[pb.TopicProduceData(name=topic, partitions=[
        pb.PartitionProduceData(partition=0, records=records.encode_batch([(None, b"v" * size, (), wall_clock_ms())]))
    ])]), timeout=timeout).topics[0].partitions[0]


def _p50_ms(stub, topic: str, n: int = 300) -> float:
    """Median ms of `n` sequential acks=1 produces of one 100-byte record."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        assert _produce(stub, topic, 100).error_code == 0
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _log_end(c, leader: str, topic: str) -> int:
    stub = pbg.PartitionLeaderStub(channel(c, "admin", leader))
    return stub.ListOffsets(pb.ListOffsetsRequest(topics=[pb.ListOffsetsTopic(name=topic, partitions=[
        pb.ListOffsetsPartition(partition=0, timestamp=-1)])]), timeout=30).topics[0].partitions[0].offset


def _topics_on_one_leader(c, who: tuple[str, ...]) -> tuple[str, dict[str, str]]:
    """(leader, {user: a topic of theirs}), every topic led by the same partition leader."""
    tag = uuid.uuid4().hex[:6]
    with admin_client(c) as a:
        found: dict[str, dict[str, str]] = {}
        for i in range(30):
            names = [f"{u}-q{tag}-{i}" for u in who]
            a.create_topics([NewTopic(n, 1, 1) for n in names])
            described = a.describe_topics(names)
            for u, n in zip(who, names):
                found.setdefault(described[n].partitions[0].leader_id, {}).setdefault(u, n)
            full = [leader for leader, topics in found.items() if len(topics) == len(who)]
            if full:
                return full[0], found[full[0]]
    raise AssertionError("no partition leader leads a topic of each user")


def test_quotas_hold_whatever_the_client_does(sec):
    leader, topics = _topics_on_one_leader(sec, ("alice", "mallory"))
    mallory_topic, alice_topic = topics["mallory"], topics["alice"]
    set_quota(sec, "mallory", producer_byte_rate=QUOTA_BYTES, request_percentage=REQUEST_PERCENT)
    mallory = pbg.PartitionLeaderStub(channel(sec, "mallory", leader))
    alice = pbg.PartitionLeaderStub(channel(sec, "alice", leader))
    wait_for(lambda: _produce(alice, alice_topic, 10).error_code == 0 and
             _produce(mallory, mallory_topic, 10).error_code == 0, 30, "the ACLs applied")
    # Refused calls count: while Produce calls the authorizer refuses flood in, mallory is
    # over request_percentage, so her own Produce calls (3 s deadlines) wait out her mute
    # (or are answered THROTTLING_QUOTA_EXCEEDED at their deadline): 10 of them are held
    # for over a second in all, where they took milliseconds when refused calls were free.
    denied = _attack(sec, "denied", leader, alice_topic, 25)
    time.sleep(5)
    probes = []
    for _ in range(10):
        start = time.perf_counter()
        try:
            outcome = ErrorCode(_produce(mallory, mallory_topic, 10, timeout=3).error_code).name
        except grpc.RpcError as exc:
            # Held past her own deadline: the service's THROTTLING_QUOTA_EXCEEDED at the
            # call's deadline and the client's deadline race; either way she waited.
            assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc
            outcome = exc.code().name
        probes.append((round(time.perf_counter() - start, 3), outcome))
    denied_counts = json.loads(denied.communicate(timeout=120)[0])
    held = sum(seconds for seconds, _ in probes)
    print(f"denied flood: {denied_counts}; mallory's own Produce calls meanwhile (s, answer): {probes}")
    assert held >= 1.0, f"mallory's Produce calls took {held:.3f} s in all during her flood of refused calls"
    time.sleep(3)

    baseline = min(_p50_ms(alice, alice_topic) for _ in range(3))
    attack_s = 45
    attackers = [_attack(sec, mode, leader, mallory_topic, attack_s) for mode in ("deadline", "clientids")]
    attackers.append(_attack(sec, "denied", leader, alice_topic, attack_s))
    try:
        time.sleep(15)  # past the first windows, where a rate may burst (quota.window.num)
        start, first = time.monotonic(), _log_end(sec, leader, mallory_topic)
        attacked = min(_p50_ms(alice, alice_topic) for _ in range(3))
        wait_for(lambda: time.monotonic() > start + 20, 60, "the measuring interval")
        appended = (_log_end(sec, leader, mallory_topic) - first) * BATCH / (time.monotonic() - start)
    finally:
        outcomes = [json.loads(a.communicate(timeout=120)[0] or "{}") for a in attackers]
    print(f"mallory appended {appended / 1024:.1f} KiB/s for a producer_byte_rate of {QUOTA_BYTES / 1024:.0f} KiB/s; "
          f"attackers (deadline, clientids, denied): {outcomes}; alice's produce p50 {baseline:.2f} ms before, "
          f"{attacked:.2f} ms during the attack")
    assert appended <= 1.2 * QUOTA_BYTES, f"{appended / 1024:.0f} KiB/s appended for a quota of 100 KiB/s"
    if os.environ.get("EXACTLY_ATTACK_P50"):
        # A latency ratio: asserted where nothing else loads the machine (make soak); in
        # make test the other test files' clusters share its two cores.
        assert attacked <= 2 * baseline, f"alice's produce p50 {attacked:.2f} ms under attack, {baseline:.2f} ms before"

    # The byte rate alone (no request_percentage to hold mallory first): the two escapes
    # append what the quota allows, not 19x or 24x of it.
    with admin_client(sec) as a:
        a.alter_client_quotas({"user": "mallory"}, remove=["request_percentage"])
    time.sleep(3)
    attackers = [_attack(sec, mode, leader, mallory_topic, 40) for mode in ("deadline", "clientids")]
    try:
        time.sleep(15)
        start, first = time.monotonic(), _log_end(sec, leader, mallory_topic)
        wait_for(lambda: time.monotonic() > start + 20, 60, "the measuring interval")
        appended = (_log_end(sec, leader, mallory_topic) - first) * BATCH / (time.monotonic() - start)
    finally:
        outcomes = [json.loads(a.communicate(timeout=120)[0] or "{}") for a in attackers]
    print(f"producer_byte_rate alone: mallory appended {appended / 1024:.1f} KiB/s for {QUOTA_BYTES / 1024:.0f} "
          f"KiB/s; attackers (deadline, clientids): {outcomes}")
    # At most the quota; and served (a throttle, not a ban): how close to the quota her
    # held-then-refused calls get depends on the machine's load, not on the quota.
    assert 0 < appended <= 1.2 * QUOTA_BYTES, f"{appended / 1024:.0f} KiB/s appended"


# ---------------------------------------------------------------- sensors
def _kafka_pipeline(c, who: str, service: str, client_ids: list[str]) -> int:
    """Send one Metadata v12 request (no topics) per client id over one TLS connection
    to `service`'s Kafka port, then read the answers; returns how many came back
    before the service closed the connection (or all)."""
    import io
    import socket
    import struct

    from kio.schema.request_header.v2.header import RequestHeader
    from kio.serial import entity_writer

    import kafka_requests
    from services.common.kafka import codec
    cls = codec.request_class(3, 12)
    body = io.BytesIO()
    entity_writer(cls)(body, codec.build(cls, {"topics": []}))
    frames = []
    for i, client_id in enumerate(client_ids):
        out = io.BytesIO()
        entity_writer(RequestHeader)(out, RequestHeader(request_api_key=3, request_api_version=12,
                                                        correlation_id=i, client_id=client_id))
        frame = out.getvalue() + body.getvalue()
        frames.append(struct.pack(">i", len(frame)) + frame)
    host, port = c.services[service].kafka_address.rsplit(":", 1)
    context = kafka_requests.tls_context(c.dir / "certs", who)
    answered = 0
    with socket.create_connection((host, int(port)), timeout=60) as raw, \
            context.wrap_socket(raw, server_hostname=host) as sock:
        data = b""
        try:
            for start in range(0, len(frames), 100):  # 100 in flight at a time
                sock.sendall(b"".join(frames[start:start + 100]))
                target = min(start + 100, len(frames))
                while answered < target:
                    while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
                        chunk = sock.recv(1 << 16)
                        if not chunk:
                            return answered
                        data += chunk
                    size = struct.unpack(">i", data[:4])[0]
                    data = data[4 + size:]
                    answered += 1
        except (ConnectionError, OSError):
            return answered
    return answered


def _metric(c, service: str, name: str) -> float | None:
    """The value of label-free series `name` on `service`'s /metrics (None: not served)."""
    import urllib.request
    with urllib.request.urlopen(f"http://{c.services[service].metrics_address}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def test_quota_sensors_and_client_ids_are_bounded(sec):
    from bench.common import rss_bytes
    initial = _metric(sec, "pl-0", "exactly_quota_sensors")  # other tests' quotas may have some
    with admin_client(sec) as a:
        a.alter_client_quotas({"client-id": None}, {"request_percentage": 200})
    time.sleep(2)  # every process's watch applied it
    pl = sec.services["pl-0"]
    before = rss_bytes(pl.pid)
    # 30 KB client ids: the first closes the connection, nothing is kept.
    answered = sum(_kafka_pipeline(sec, "trudy", "pl-0", [f"{i:05d}" + "x" * 30_000 for i in range(400)])
                   for _ in range(10))
    # The refused requests' buffers go back to the system at the service's next heap trim
    # (exactly.memory.trim.interval.ms, 10 s): nothing of them may be kept after it. (Each
    # refused TLS connection was once kept whole, read-ahead and TLS buffers, in reference
    # cycles until a full garbage collection: 12-22 MB after the trims, here.)
    grown = rss_bytes(pl.pid) - before
    deadline = time.monotonic() + 30
    while grown >= 8 * 2**20 and time.monotonic() < deadline:
        time.sleep(0.5)
        grown = rss_bytes(pl.pid) - before
    print(f"4,000 Metadata requests with 30 KB client ids: {answered} answered; leader RSS grew {grown / 2**20:.1f} MB")
    assert answered == 0
    assert grown < 8 * 2**20, f"leader RSS grew {grown / 2**20:.0f} MB, 30 s after the requests"
    assert _kafka_pipeline(sec, "trudy", "pl-0", ["x" * 255]) == 1  # the longest allowed
    with pytest.raises(grpc.RpcError) as refused:
        pbg.ClusterStub(channel(sec, "trudy", "pl-0", "exactly/" + "y" * 1000)).Metadata(pb.MetadataRequest(),
                                                                                          timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 255" in refused.value.details()
    # Fresh client ids of a legal length: no sensor each.
    sensors = _metric(sec, "pl-0", "exactly_quota_sensors")
    assert initial is not None and sensors is not None
    assert _kafka_pipeline(sec, "trudy", "pl-0", [f"fresh-{i}-{uuid.uuid4().hex}" for i in range(4000)]) == 4000
    after = _metric(sec, "pl-0", "exactly_quota_sensors")
    print(f"quota sensors: {sensors:.0f} before 4,000 fresh client ids, {after:.0f} after")
    assert after - sensors <= 10, (sensors, after)
    with admin_client(sec) as a:
        a.alter_client_quotas({"client-id": None}, remove=["request_percentage"])
    wait_for(lambda: _metric(sec, "pl-0", "exactly_quota_sensors") <= initial, 20, "the sensors dropped with the quota")
