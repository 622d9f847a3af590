"""SASL on real processes (docs/design.md, "SASL"): on a secured dev cluster (TLS,
authorizer=acl), confluent-kafka, kafka-python and aiokafka connect to the Kafka port
with security.protocol=SASL_SSL (the CA only, no client certificate) and SCRAM-SHA-512
or PLAIN, and produce and consume as User:dave; a wrong password is refused. On the
gRPC port the SDK authenticates once per channel and sends only a session token (a
recording proxy between it and the service sees no password). Password guessing is
slowed to at most 5 a second per user while another client's calls stay as fast."""
from __future__ import annotations

import asyncio
import statistics
import threading
import time
import uuid
from concurrent import futures

import grpc
import pytest

from clusters import chrooted_cluster
from exactly import AclBinding, AdminClient, NewTopic, errors
from exactly_tools.certs import CertificateAuthority
from exactly_wire.error_codes import ErrorCode
from exactly_wire.security import SASL_TOKEN_HEADER, TransportSecurity, secure_channel
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from waiting import wait_for

from .test_authorization import _sasl_fails
from .test_kafka_clients import _aiokafka_read

pytestmark = pytest.mark.integration

PASSWORD = "correct horse battery staple"
TOPIC, GROUP = (f"{p}-{uuid.uuid4().hex[:6]}" for p in ("sasl", "sasl-g"))


@pytest.fixture(scope="module")
def sec(zk, tmp_path_factory):
    cluster = chrooted_cluster(zk, tmp_path_factory.mktemp("sasl-cluster"), "sasl", security=True, leaders=1)
    try:
        ca = CertificateAuthority.load(cluster.dir / "certs")
        for name in ("bob", "alice"):
            ca.issue(name, client=True)
        with _admin(cluster) as admin:
            admin.alter_user_scram_credentials({"dave": PASSWORD, "erin": PASSWORD})
            admin.create_topics([NewTopic(TOPIC, 1, 1)])
            admin.create_acls([AclBinding("User:dave", "Topic", TOPIC, "All"),
                               AclBinding("User:dave", "Group", GROUP, "All"),
                               AclBinding("User:dave", "Cluster", "kafka-cluster", "IdempotentWrite"),
                               AclBinding("User:alice", "Topic", TOPIC, "Describe")])
        yield cluster
    finally:
        cluster.down()


def _admin(cluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap_servers, **cluster.client_config})


def _ca(sec) -> str:
    return str(sec.dir / "certs" / "ca.pem")


def _certs(sec, name: str) -> dict:
    certs = sec.dir / "certs"
    return {"ssl.ca.location": str(certs / "ca.pem"), "ssl.certificate.location": str(certs / f"{name}.pem"),
            "ssl.key.location": str(certs / f"{name}.key")}


# ---------------------------------------------------------------- Kafka port

def _confluent(sec, mechanism: str, password: str, value: bytes) -> list[bytes]:
    from confluent_kafka import Consumer, Producer
    conf = {"bootstrap.servers": sec.kafka_bootstrap_servers, "security.protocol": "SASL_SSL",
            "ssl.ca.location": _ca(sec), "sasl.mechanisms": mechanism, "sasl.username": "dave",
            "sasl.password": password}
    errors_seen: list = []
    p = Producer({**conf, "message.timeout.ms": 20000, "error_cb": errors_seen.append})
    delivered: list = []
    p.produce(TOPIC, value, partition=0, on_delivery=lambda err, msg: delivered.append(err))
    p.flush(25)
    if delivered != [None]:
        raise RuntimeError(f"not delivered: {delivered} {errors_seen}")
    c = Consumer({**conf, "group.id": GROUP, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    from confluent_kafka import TopicPartition
    c.assign([TopicPartition(TOPIC, 0, 0)])
    got, deadline = [], time.monotonic() + 25
    while value not in got and time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    c.close()
    return got


def _kafka_python(sec, mechanism: str, password: str, value: bytes) -> list[bytes]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    conf = dict(bootstrap_servers=sec.kafka_bootstrap_servers.split(","), security_protocol="SASL_SSL",
                ssl_cafile=_ca(sec), sasl_mechanism=mechanism, sasl_plain_username="dave",
                sasl_plain_password=password)
    p = KafkaProducer(**conf, request_timeout_ms=20000)
    try:
        p.send(TOPIC, value=value, partition=0).get(25)
    finally:
        p.close(5)
    c = KafkaConsumer(**conf, auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=20000)
    try:
        c.assign([TopicPartition(TOPIC, 0)])
        c.seek_to_beginning()
        got = []
        for msg in c:
            got.append(msg.value)
            if value in got:
                break
    finally:
        c.close()
    return got


def _aiokafka(sec, mechanism: str, password: str, value: bytes) -> list[bytes]:
    from aiokafka import AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context

    async def run() -> list[bytes]:
        conf = dict(bootstrap_servers=sec.kafka_bootstrap_servers, security_protocol="SASL_SSL",
                    ssl_context=create_ssl_context(cafile=_ca(sec)), sasl_mechanism=mechanism,
                    sasl_plain_username="dave", sasl_plain_password=password)
        p = AIOKafkaProducer(**conf, request_timeout_ms=20000)
        await asyncio.wait_for(p.start(), 30)
        try:
            await asyncio.wait_for(p.send_and_wait(TOPIC, value, partition=0), 30)
        finally:
            await p.stop()
        return await _aiokafka_read(sec, TOPIC, 1, until=lambda got: value in got,
                                    **{k: v for k, v in conf.items() if k != "bootstrap_servers"})
    return asyncio.run(run())


CLIENTS = {"confluent-kafka": _confluent, "kafka-python": _kafka_python, "aiokafka": _aiokafka}


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_kafka_clients_connect_with_sasl_ssl(sec, client, mechanism):
    value = f"{client}-{mechanism}-{uuid.uuid4().hex[:6]}".encode()
    assert value in CLIENTS[client](sec, mechanism, PASSWORD, value)
    log = (sec.dir / "logs" / "pl-0.log").read_text()
    assert f"authenticated as User:dave ({mechanism})" in log


def test_kafka_port_scram_sha_256(sec):
    value = f"sha256-{uuid.uuid4().hex[:6]}".encode()
    assert value in _confluent(sec, "SCRAM-SHA-256", PASSWORD, value)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_a_wrong_password_is_refused_on_the_kafka_port(sec, mechanism):
    from confluent_kafka.admin import AdminClient as KAdmin
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError
    kadmin = KAdmin({"bootstrap.servers": sec.kafka_bootstrap_servers, "security.protocol": "SASL_SSL",
                     "ssl.ca.location": _ca(sec), "sasl.mechanisms": mechanism, "sasl.username": "dave",
                     "sasl.password": "wrong"})
    with pytest.raises(Exception):
        kadmin.list_topics(timeout=5)
    with pytest.raises((KafkaError, OSError)):
        KafkaAdminClient(bootstrap_servers=sec.kafka_bootstrap_servers.split(","), security_protocol="SASL_SSL",
                         ssl_cafile=_ca(sec), sasl_mechanism=mechanism, sasl_plain_username="dave",
                         sasl_plain_password="wrong", request_timeout_ms=5000, api_version_auto_timeout_ms=5000)
    with pytest.raises(Exception):
        _aiokafka_start(sec, mechanism, "wrong")
    log = (sec.dir / "logs" / "pl-0.log").read_text()
    assert f"invalid credentials with SASL mechanism {mechanism}" in log


def _aiokafka_start(sec, mechanism: str, password: str) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context

    async def run():
        p = AIOKafkaProducer(bootstrap_servers=sec.kafka_bootstrap_servers, security_protocol="SASL_SSL",
                             ssl_context=create_ssl_context(cafile=_ca(sec)), sasl_mechanism=mechanism,
                             sasl_plain_username="dave", sasl_plain_password=password, request_timeout_ms=5000)
        try:
            await asyncio.wait_for(p.start(), 20)
        finally:
            await p.stop()
    asyncio.run(run())


def test_a_connection_without_certificate_or_sasl_is_refused(sec):
    """ssl.client.auth=required: the TLS layer lets a connection without a certificate
    in only to authenticate with SASL; anything else closes it."""
    from confluent_kafka.admin import AdminClient as KAdmin
    client = KAdmin({"bootstrap.servers": sec.kafka_bootstrap_servers, "security.protocol": "SSL",
                     "ssl.ca.location": _ca(sec)})
    with pytest.raises(Exception):
        client.list_topics(timeout=5)
    assert "before SASL authentication completed" in (sec.dir / "logs" / "pl-0.log").read_text()


# ---------------------------------------------------------------- gRPC port

class _RecordingProxy:
    """A gRPC proxy (TLS, the service's own certificate) that forwards every unary call
    to `upstream` with its metadata and records what crossed it: each call's method,
    metadata and request bytes."""

    def __init__(self, sec, upstream: str):
        certs = sec.dir / "certs"
        self.calls: list[tuple[str, tuple, bytes]] = []
        up = TransportSecurity.from_conf({"security.protocol": "SSL", **_certs(sec, "bob")})
        self._channel = grpc.secure_channel(upstream, up.channel_credentials())
        proxy = self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details):
                method = details.method

                def forward(request: bytes, context):
                    md = tuple((k, v) for k, v in context.invocation_metadata() if not k.startswith(":"))
                    proxy.calls.append((method, md, request))
                    try:
                        return proxy._channel.unary_unary(method)(request, metadata=md, timeout=20)
                    except grpc.RpcError as exc:
                        context.abort(exc.code(), exc.details())
                return grpc.unary_unary_rpc_method_handler(forward)

        self.server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[Handler()])
        key = (certs / "pl-0.key").read_bytes() if (certs / "pl-0.key").exists() else None
        cert = (certs / "pl-0.pem").read_bytes() if key else None
        if key is None:  # the dev cluster's service certificate, whatever its file name
            pem = sorted(p for p in certs.glob("*.pem") if p.stem not in ("ca", "bob", "alice", "admin"))[0]
            cert, key = pem.read_bytes(), pem.with_suffix(".key").read_bytes()
        self.port = self.server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
        self.server.start()

    def close(self) -> None:
        self.server.stop(0)
        self._channel.close()


def test_the_sdk_sends_no_password_in_its_calls(sec):
    proxy = _RecordingProxy(sec, sec.bootstrap_servers.split(",")[0])
    try:
        conf = {"bootstrap.servers": f"127.0.0.1:{proxy.port}", "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "dave", "sasl.password": PASSWORD,
                **_certs(sec, "bob"), "request.timeout.ms": 10000}
        with AdminClient(conf) as client:
            for _ in range(3):
                # Metadata lists TOPIC for User:dave (bob's certificate has no ACL on it).
                assert TOPIC in client.list_topics()
    finally:
        proxy.close()
    methods = [m for m, _, _ in proxy.calls]
    assert methods.count("/exactly.v1.Cluster/SaslAuthenticate") == 2  # one SCRAM exchange: two steps
    assert methods.count("/exactly.v1.Cluster/Metadata") >= 1  # later ones go to the node's own address
    for method, md, body in proxy.calls:
        seen = b"".join(k.encode() + (v if isinstance(v, bytes) else v.encode()) for k, v in md) + body
        assert PASSWORD.encode() not in seen, (method, md)
        if method != "/exactly.v1.Cluster/SaslAuthenticate":
            assert [k for k, _ in md].count(SASL_TOKEN_HEADER) == 1, (method, md)


def test_a_wrong_password_and_a_forged_token_are_refused_on_grpc(sec):
    base = {"bootstrap.servers": sec.bootstrap_servers, "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "dave", **_certs(sec, "bob"),
            "request.timeout.ms": 10000}
    with pytest.raises(errors.SaslAuthenticationFailedError):
        with AdminClient({**base, "sasl.password": "wrong"}) as client:
            client.list_topics()
    security = TransportSecurity.from_conf({"security.protocol": "SSL", **_certs(sec, "bob")})
    with secure_channel(sec.bootstrap_servers.split(",")[0], security, []) as channel:
        stub = pbg.ClusterStub(channel)
        with pytest.raises(grpc.RpcError) as info:  # the old per-call password: refused
            stub.Metadata(pb.MetadataRequest(), metadata=(("x-exactly-sasl-username", "dave"),
                                                          ("x-exactly-sasl-password", PASSWORD)), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as info:
            stub.Metadata(pb.MetadataRequest(), metadata=((SASL_TOKEN_HEADER, "v1.eyJ1IjoiYWRtaW4ifQ.AAAA"),),
                          timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_scram_sha_256_and_plain_on_grpc_sync_and_asyncio(sec):
    from exactly.aio.admin import AIOAdminClient
    for mechanism in ("SCRAM-SHA-256", "PLAIN", "SCRAM-SHA-512"):
        conf = {"bootstrap.servers": sec.bootstrap_servers, "security.protocol": "SASL_SSL",
                "sasl.mechanism": mechanism, "sasl.username": "dave", "sasl.password": PASSWORD,
                **_certs(sec, "bob"), "request.timeout.ms": 10000}
        with AdminClient(conf) as client:
            assert TOPIC in client.list_topics()

        async def aio(conf=conf) -> dict:
            async with AIOAdminClient(conf) as client:
                return await asyncio.wait_for(client.list_topics(), 30)
        assert TOPIC in asyncio.run(aio())


def test_password_guessing_is_slowed_and_the_service_stays_responsive(sec):
    """Eight threads guess erin's password (PLAIN, each guess a PBKDF2 on the service)
    for 4 s: at most 5 guesses a second are answered, and alice's Metadata calls
    meanwhile take about as long as before."""
    address = sec.bootstrap_servers.split(",")[0]
    security = TransportSecurity.from_conf({"security.protocol": "SSL", **_certs(sec, "bob")})
    alice = TransportSecurity.from_conf({"security.protocol": "SSL", **_certs(sec, "alice")})

    def latencies(stub, seconds: float) -> list[float]:
        out, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            stub.Metadata(pb.MetadataRequest(topics=[TOPIC]), timeout=10)
            out.append(time.perf_counter() - started)
            time.sleep(0.02)
        return out

    with secure_channel(address, alice, []) as ach:
        other = pbg.ClusterStub(ach)
        latencies(other, 0.5)  # warm
        baseline = statistics.median(latencies(other, 2.0))
        answered: list[float] = []
        stop = threading.Event()

        def guess(n: int) -> None:
            with secure_channel(address, security, []) as ch:
                stub = pbg.ClusterStub(ch)
                i = 0
                while not stop.is_set():
                    i += 1
                    resp = stub.SaslAuthenticate(pb.SaslAuthenticateRequest(
                        mechanism="PLAIN", auth_bytes=f"\0erin\0guess-{n}-{i}".encode()), timeout=20)
                    if resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED and \
                            "invalid credentials" in resp.error_message:
                        answered.append(time.monotonic())

        threads = [threading.Thread(target=guess, args=(n,), daemon=True) for n in range(8)]
        started = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(0.5)
        during = statistics.median(latencies(other, 3.5))
        stop.set()
        for t in threads:
            t.join(30)
        elapsed = time.monotonic() - started
    verified = [t for t in answered if t <= started + elapsed]
    rate = len(verified) / elapsed
    print(f"guesses verified: {len(verified)} in {elapsed:.1f} s ({rate:.2f}/s); other client's Metadata p50 "
          f"{baseline * 1000:.1f} ms before, {during * 1000:.1f} ms during")
    assert rate <= 5.5, f"{len(verified)} guesses verified in {elapsed:.1f} s"
    assert len(verified) >= 5, "the guessing threads got no answers at all"
    assert during < max(3 * baseline, baseline + 0.05), (baseline, during)
    # erin herself still gets in (queued behind the guesses, not locked out for good).
    conf = {"bootstrap.servers": sec.bootstrap_servers, "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "erin", "sasl.password": PASSWORD,
            **_certs(sec, "bob"), "request.timeout.ms": 20000}
    wait_for(lambda: not _sasl_fails(conf), 30, "erin authenticates after the guessing")
