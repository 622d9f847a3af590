"""What one client can make a partition leader hold, on real processes (docs/design.md,
"Tunnel and fetch limits"; docs/security.md):

- `Tunnel/Calls` and `Tunnel/Batches` are the services' own streams: a principal without ClusterAction on
  the Cluster (here one allowed to read the topic directly) is refused before any of
  its 2,000 tunneled 1 MB Fetches runs, and the leader's memory does not grow; a
  service principal's stream that stops reading its replies has at most
  `exactly.tunnel.max.in.flight.calls` of them served meanwhile;
- links (the tunnel on TCP, services/common/transport/link.py): the services call each
  other on TLS links; the same principal gets no ticket for one, and a connection to the
  link port without a valid ticket (plaintext, or TLS with made-up bytes) is closed
  with nothing read; a service's link that stops reading is held as its stream is;
- PARKED Fetches parked on one tenant's own topic leave the leader's CPU per append of
  another tenant within 2x its baseline of the same run: an append wakes only the
  fetches its partition and offset concern. CPU, not latency, is compared: latency on
  a machine shared with other tests varies by more than 2x from round to round;
- /metrics names no user topic unless `metrics.topic.labels=true`.

RSS is read from /proc/<pid>/status (VmRSS), CPU from /proc/<pid>/stat."""
from __future__ import annotations

import os
import collections
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import grpc
import pytest

from bench.common import cpu_seconds, rss_bytes
from exactly import AclBinding, AdminClient, NewTopic
from exactly_tools.certs import CertificateAuthority
from exactly_tools.devcluster import DevCluster
from exactly_wire import records
from exactly_wire.clock import wall_clock_ms
from exactly_wire.security import TransportSecurity, secure_channel
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from clusters import new_chroot
from services.common.transport.tunnel import TUNNEL_METHOD, method_path
from waiting import wait_for

pytestmark = pytest.mark.integration

MB = 1 << 20
FETCH = method_path("PartitionLeader", "Fetch")
TUNNEL_BATCHES = method_path("Tunnel", "Batches")
IN_FLIGHT = 16
MAX_WAIT_MS = 2000


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        return r.read().decode()


def metric(address: str, name: str, labels: str = "") -> float:
    """The sum of the samples of `name` whose labels contain `labels`."""
    total = 0.0
    for line in scrape(address).splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if labels in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


def produce_request(topic: str, value: bytes, acks: int = 1) -> pb.ProduceRequest:
    return pb.ProduceRequest(acks=acks, timeout_ms=10000, topics=[pb.TopicProduceData(name=topic, partitions=[
        pb.PartitionProduceData(partition=0, records=records.encode_batch([(None, value, (), wall_clock_ms())]))])])


def fetch_request(topic: str, offset: int = 0, max_wait_ms: int = 0) -> pb.FetchRequest:
    return pb.FetchRequest(max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=MB, topics=[pb.FetchTopic(
        topic=topic, partitions=[pb.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=MB)])])


# ------------------------------------------------------------ the tunnel

@pytest.fixture(scope="module")
def sec(zk, tmp_path_factory):
    """A secured cluster (TLS, client certificates, the ACL authorizer) with one
    partition leader, its tunnel streams bounded to IN_FLIGHT calls in flight and a
    consumer's max_wait_ms cut to MAX_WAIT_MS (fetch.max.wait.ms); User:mallory may
    Read topic `big`, which holds 4 batches of ~900 KB."""
    c = DevCluster(tmp_path_factory.mktemp("tunnel-cluster"), security=True,
                   props={"exactly.tunnel.max.in.flight.calls": str(IN_FLIGHT),
                          "fetch.max.wait.ms": str(MAX_WAIT_MS)})
    c.up(1, 1, 1, zookeeper=new_chroot(zk, "tunnel"))
    CertificateAuthority.load(c.dir / "certs").issue("mallory", client=True)
    with AdminClient({"bootstrap.servers": c.bootstrap_servers, **c.client_config}) as a:
        a.create_topics([NewTopic("big", 1, 1)])
        a.create_acls([AclBinding("User:mallory", "Topic", "big", "Read")])
    leader = c.services["pl-0"].address
    admin = pbg.PartitionLeaderStub(channel(c, "admin", leader))
    for _ in range(4):
        [[part]] = [[p for p in t.partitions] for t in admin.Produce(
            produce_request("big", b"x" * 900_000), timeout=30).topics]
        assert part.error_code == 0, part
    # The leader learns of mallory's ACL from its ZooKeeper watch, after create_acls returned.
    wait_for(lambda: _may_fetch(c, "mallory", leader), 30, "mallory's Read ACL on the leader")
    yield c
    c.down()


def _may_fetch(c: DevCluster, who: str, address: str) -> bool:
    try:
        with channel(c, who, address) as ch:
            pbg.PartitionLeaderStub(ch).Fetch(fetch_request("big"), timeout=20)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
            return False
        raise
    return True


def channel(c: DevCluster, who: str, address: str) -> grpc.Channel:
    certs = c.dir / "certs"
    security = TransportSecurity.from_conf({
        "security.protocol": "SSL", "ssl.ca.location": str(certs / "ca.pem"),
        "ssl.certificate.location": str(certs / f"{who}.pem"), "ssl.key.location": str(certs / f"{who}.key")})
    return secure_channel(address, security, [])


def _link_port(c: DevCluster, name: str) -> int:
    return int((c.dir / name / "link-port").read_text())


def _tls(c: DevCluster, who: str | None = None) -> ssl.SSLContext:
    """A TLS client context trusting the cluster's CA, with `who`'s certificate (None:
    none)."""
    ctx = ssl.create_default_context(cafile=str(c.dir / "certs" / "ca.pem"))
    if who is not None:
        ctx.load_cert_chain(str(c.dir / "certs" / f"{who}.pem"), str(c.dir / "certs" / f"{who}.key"))
    return ctx


class _UnreadLink:
    """A link opened as `who` with a ticket from Tunnel/Attach, on which `n` 1 MB
    Fetches of `big` are sent, 50 to a frame, and no reply is read; `cancel()` closes it."""

    def __init__(self, c: DevCluster, who: str, n: int):
        pl = c.services["pl-0"]
        answer = pbg.TunnelStub(channel(c, who, pl.address)).Attach(pb.TunnelAttachRequest(), timeout=20)
        assert answer.port == _link_port(c, "pl-0") and len(answer.ticket) == 32, answer
        self.sock = _tls(c, who).wrap_socket(socket.create_connection(("127.0.0.1", answer.port), timeout=20),
                                             server_hostname="127.0.0.1")
        self.sock.sendall(answer.ticket)
        assert self.sock.recv(1) == b"\x01"
        body = fetch_request("big").SerializeToString()
        calls = [pb.TunneledCall(correlation_id=i + 1, method=FETCH, request=body) for i in range(n)]
        frames = [pb.TunneledCalls(calls=calls[i:i + 50]).SerializeToString() for i in range(0, n, 50)]
        self.sender = threading.Thread(target=self._send, args=(frames,), daemon=True)
        self.sender.start()

    def _send(self, frames: list[bytes]) -> None:
        try:
            for frame in frames:  # blocks once the leader stops reading: TCP's flow control
                self.sock.sendall(len(frame).to_bytes(4, "big") + frame)
        except OSError:
            pass

    def cancel(self) -> None:
        self.sock.close()


def _unread_tunneled_fetches(c: DevCluster, who: str, n: int, batches: bool = False):
    """Open a Tunnel/Calls stream as `who` (Tunnel/Batches with `batches`: 50 calls to
    a message; a link with "link"), send `n` 1 MB Fetches of `big` and read no reply: the
    call object (its status once the stream ends)."""
    if batches == "link":
        return _UnreadLink(c, who, n)
    body = fetch_request("big").SerializeToString()
    calls = [pb.TunneledCall(correlation_id=i + 1, method=FETCH, request=body) for i in range(n)]
    if batches:
        raw = channel(c, who, c.services["pl-0"].address).stream_stream(
            TUNNEL_BATCHES, request_serializer=pb.TunneledCalls.SerializeToString,
            response_deserializer=pb.TunneledReplies.FromString)
        return raw(iter([pb.TunneledCalls(calls=calls[i:i + 50]) for i in range(0, n, 50)]), timeout=60)
    raw = channel(c, who, c.services["pl-0"].address).stream_stream(
        TUNNEL_METHOD, request_serializer=pb.TunneledCall.SerializeToString,
        response_deserializer=pb.TunneledReply.FromString)
    return raw(iter(calls), timeout=60)


@pytest.mark.parametrize("batches", [False, True], ids=["calls", "batches"])
def test_an_unprivileged_principal_cannot_open_the_tunnel(sec, batches):
    pl = sec.services["pl-0"]
    direct = pbg.PartitionLeaderStub(channel(sec, "mallory", pl.address)).Fetch(fetch_request("big"), timeout=20)
    assert len(direct.responses[0].partitions[0].records) > 800_000  # mallory may read the topic directly
    # Bytes of user topics answered by Fetch (the coordinators' own fetches read internal topics).
    served = metric(pl.metrics_address, "exactly_fetch_bytes_total", 'topic="(hidden)"')
    assert served > 800_000
    before = rss_bytes(pl.pid)
    call = _unread_tunneled_fetches(sec, "mallory", 2000, batches)
    assert call.code() == grpc.StatusCode.PERMISSION_DENIED, call
    assert call.details().startswith("CLUSTER_AUTHORIZATION_FAILED"), call.details()
    assert metric(pl.metrics_address, "exactly_fetch_bytes_total", 'topic="(hidden)"') == served  # none ran
    refusals = [line for line in scrape(pl.metrics_address).splitlines() if 'method="Open"' in line]
    assert any('error_code="GRPC_PERMISSION_DENIED"' in line for line in refusals), refusals  # counted
    grown = rss_bytes(pl.pid) - before
    print(f"leader RSS grew {grown / MB:.1f} MB after 2000 refused tunneled fetches")
    assert grown < 50 * MB, f"leader RSS grew {grown / MB:.0f} MB"
    # The leader serves on.
    again = pbg.PartitionLeaderStub(channel(sec, "mallory", pl.address)).Fetch(fetch_request("big"), timeout=20)
    assert again.responses[0].partitions[0].records


@pytest.mark.parametrize("batches", [False, True, "link"], ids=["calls", "batches", "link"])
def test_a_service_stream_that_reads_no_reply_is_held_at_its_in_flight_bound(sec, batches):
    pl = sec.services["pl-0"]

    def answered() -> float:  # 1 MB Fetches of `big` answered
        return metric(pl.metrics_address, "exactly_fetch_bytes_total", 'topic="(hidden)"') // 900_000

    served = answered()
    before = rss_bytes(pl.pid)
    call = _unread_tunneled_fetches(sec, "txn-0", 2000, batches)  # a service principal: admitted
    try:
        wait_for(lambda: answered() - served >= IN_FLIGHT, 30, "the first calls of the stream served")
        time.sleep(2)  # time for more to be read, were the stream not held
        ran = answered() - served
        # In flight, plus those whose replies gRPC took into its send window.
        assert IN_FLIGHT <= ran <= 4 * IN_FLIGHT, ran
        grown = rss_bytes(pl.pid) - before
        print(f"service stream: {ran:.0f} of 2000 unread fetches served, leader RSS grew {grown / MB:.1f} MB")
        assert grown < 50 * MB, f"leader RSS grew {grown / MB:.0f} MB"
    finally:
        call.cancel()


def test_the_services_and_the_sdk_call_on_tls_links(sec):
    """A transaction's calls from the coordinator to the leader (its appends to
    __transaction_state, its markers) go on a TLS link, admitted by the coordinator's
    certificate: the leader counts a link from each coordinator (the group coordinator's
    tails the offsets topic) and refuses no ticket of theirs. The SDK producer's own calls
    move to TLS links to the leader and the coordinator (Client/Attach, its certificate),
    its transactions committing on them, and the links end with the producer."""
    from exactly import Consumer, Producer, TopicPartition
    pl, txn = sec.services["pl-0"], sec.services["txn-0"]
    with AdminClient({"bootstrap.servers": sec.bootstrap_servers, **sec.client_config}) as a:
        a.create_topics([NewTopic("linked", 1, 1)])
    producer = Producer({"bootstrap.servers": sec.bootstrap_servers, **sec.client_config,
                         "transactional.id": f"linked-{uuid.uuid4().hex[:6]}"})
    committed = 0

    def client_links(service) -> float:
        return metric(service.metrics_address, "exactly_tunnel_links", 'kind="client"')

    def commit_one() -> bool:
        nonlocal committed
        producer.begin_transaction()
        producer.send("linked", value=b"v%d" % committed)
        producer.commit_transaction()
        committed += 1
        return client_links(pl) >= 1 and client_links(txn) >= 1
    try:
        producer.init_transactions()
        wait_for(commit_one, 30, "the producer's calls on links to the leader and the coordinator")
        for _ in range(3):
            commit_one()  # on the links
    finally:
        producer.close()
    wait_for(lambda: client_links(pl) == 0 and client_links(txn) == 0, 30, "the producer's links to end")
    with Consumer({"bootstrap.servers": sec.bootstrap_servers, **sec.client_config,
                   "isolation.level": "read_committed"}) as consumer:
        tp = TopicPartition("linked", 0)
        assert consumer.end_offsets([tp])[tp] == 2 * committed  # each record and its commit marker
    wait_for(lambda: metric(pl.metrics_address, "exactly_tunnel_links", 'kind="service"') >= 2, 30,
             "links from both coordinators to the leader")
    assert metric(pl.metrics_address, "exactly_connections_refused_total", 'reason="ticket"') == 0
    assert "no link to a peer" not in (sec.dir / "logs" / "txn-0.log").read_text()


def test_a_link_needs_a_ticket_of_a_service_principal(sec):
    """mallory (who may read `big` directly) gets no ticket; made-up bytes on the link
    port, in plaintext, over TLS without a certificate (the cluster requires client
    certificates) or with mallory's, close the connection with nothing answered, and the
    leader serves on."""
    pl = sec.services["pl-0"]
    with pytest.raises(grpc.RpcError) as denied:
        pbg.TunnelStub(channel(sec, "mallory", pl.address)).Attach(pb.TunnelAttachRequest(), timeout=20)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert denied.value.details().startswith("CLUSTER_AUTHORIZATION_FAILED"), denied.value.details()
    port = _link_port(sec, "pl-0")

    def refused(reason: str) -> float:
        return metric(pl.metrics_address, "exactly_connections_refused_total", f'reason="{reason}"')

    failed, tickets, links = refused("ssl.handshake.failed"), refused("ticket"), \
        metric(pl.metrics_address, "exactly_tunnel_links")
    with socket.create_connection(("127.0.0.1", port), timeout=20) as plain:
        plain.sendall(os.urandom(32) + (1 << 20).to_bytes(4, "big"))
        assert plain.recv(1) == b""  # not TLS: the handshake fails and the connection closes
    with _tls(sec).wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=20),
                               server_hostname="127.0.0.1") as anonymous:
        try:  # TLS 1.3: the server refuses the missing certificate after the client's handshake ended
            anonymous.sendall(os.urandom(32))
            answered = anonymous.recv(1)
        except (ssl.SSLError, ConnectionError):
            answered = b""
        assert answered == b""
    with _tls(sec, "mallory").wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=20),
                                          server_hostname="127.0.0.1") as tls:
        tls.sendall(os.urandom(32))
        assert tls.recv(1) == b""
    wait_for(lambda: refused("ssl.handshake.failed") == failed + 2 and refused("ticket") == tickets + 1, 10,
             "the refusals counted")
    assert metric(pl.metrics_address, "exactly_tunnel_links") == links
    again = pbg.PartitionLeaderStub(channel(sec, "mallory", pl.address)).Fetch(fetch_request("big"), timeout=20)
    assert again.responses[0].partitions[0].records


# ------------------------------------------------------------ parked fetches

def test_a_consumer_cannot_park_a_fetch_past_fetch_max_wait_ms(sec):
    """max_wait_ms=600000 (ten minutes, which a leader once honoured) at the end of
    `big`: the leader answers, with no records, after fetch.max.wait.ms."""
    stub = pbg.PartitionLeaderStub(channel(sec, "mallory", sec.services["pl-0"].address))
    start = time.monotonic()
    resp = stub.Fetch(fetch_request("big", 4, max_wait_ms=600000), timeout=30)
    waited = time.monotonic() - start
    [part] = resp.responses[0].partitions
    assert resp.error_code == 0 and part.error_code == 0 and not part.records, resp
    assert MAX_WAIT_MS / 1000 * 0.9 <= waited < MAX_WAIT_MS / 1000 + 10, f"answered after {waited:.1f} s"


# Parked fetches of the attacker (EXACTLY_PARKED_FETCHES sets another count).
PARKED = int(os.environ.get("EXACTLY_PARKED_FETCHES", "5000"))


@pytest.fixture(scope="module")
def tenants(zk, tmp_path_factory):
    """One partition leader; topics `victim` and `attacker`; parked fetches per
    connection raised above PARKED and fetch.max.wait.ms to 3 minutes, so that all of
    them park and stay parked however long a loaded machine takes to send them."""
    c = DevCluster(tmp_path_factory.mktemp("parked-cluster"),
                   props={"exactly.fetch.max.parked.per.principal": str(2 * PARKED),
                          "fetch.max.wait.ms": "180000"})
    c.up(1, 1, 1, zookeeper=new_chroot(zk, "parked"))
    with AdminClient({"bootstrap.servers": c.bootstrap_servers}) as a:
        a.create_topics([NewTopic("victim", 1, 1), NewTopic("attacker", 1, 1)])
    yield c
    c.down()


def _produce_cost(stub, pid: int, n: int = 400, topic: str = "victim",
                  budget_s: float = float("inf")) -> tuple[float, float]:
    """(median seconds, leader CPU seconds per call) of `n` sequential acks=1 Produce
    calls of one small record to `topic` (fewer when they take over `budget_s` in all);
    `pid` is the leader's process."""
    times = []
    cpu = cpu_seconds(pid)
    end = time.monotonic() + budget_s
    for i in range(n):
        if i and time.monotonic() > end:
            n = i
            break
        start = time.perf_counter()
        resp = stub.Produce(produce_request(topic, b"v%d" % i), timeout=10)
        times.append(time.perf_counter() - start)
        assert resp.topics[0].partitions[0].error_code == 0
    return statistics.median(times), (cpu_seconds(pid) - cpu) / n


# One attacking process: argv address, count, a serialized FetchRequest (hex), seconds
# each fetch may take, and the certificates directory of User:mallory (TLS; "": plaintext).
# It sends the fetches, 50 per connection, prints their outcomes as they end (a parked
# fetch does not end) and exits when its stdin closes.
_ATTACKER = """
import sys, threading, grpc
from exactly_wire.security import TransportSecurity, secure_channel
from exactly_wire.v1 import exactly_pb2 as pb, exactly_pb2_grpc as pbg
address, n, request = sys.argv[1], int(sys.argv[2]), pb.FetchRequest.FromString(bytes.fromhex(sys.argv[3]))
timeout, certs = float(sys.argv[4]), sys.argv[5]
def channel(i):
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.primary_user_agent", f"attacker-{i}")]
    if not certs:
        return grpc.insecure_channel(address, options=options)
    return secure_channel(address, TransportSecurity.from_conf({
        "security.protocol": "SSL", "ssl.ca.location": f"{certs}/ca.pem",
        "ssl.certificate.location": f"{certs}/mallory.pem", "ssl.key.location": f"{certs}/mallory.key"}), options)
channels = [channel(i) for i in range((n + 49) // 50)]
lock = threading.Lock()
def done(f):
    with lock:
        print("ended", f.exception().code().name if f.exception() is not None else "answered", flush=True)
for i in range(n):
    pbg.PartitionLeaderStub(channels[i % len(channels)]).Fetch.future(request, timeout=timeout).add_done_callback(done)
print("sent", n, flush=True)
sys.stdin.read()
"""


def test_parked_fetches_on_one_topic_leave_appends_to_another_as_cheap(tenants):
    pl = tenants.services["pl-0"]
    victim = pbg.PartitionLeaderStub(grpc.insecure_channel(pl.address))
    _produce_cost(victim, pl.pid, 30)  # warm up
    # The least of three rounds on each side: a cost of the parked fetches is paid on
    # every append, so in every round; /proc counts CPU in 10 ms ticks, and 400 appends
    # take some 40 of them.
    baseline = min(_produce_cost(victim, pl.pid) for _ in range(3))
    # The attacker parks PARKED fetches (and a few more) at the end of its own (empty)
    # topic from 5 processes, 50 per connection; one process after the other, so that no
    # call waits longer than gRPC's 30 s to be taken up by the leader (it cancels those).
    request = fetch_request("attacker", 0, max_wait_ms=180000).SerializeToString().hex()
    attackers = []
    parked = lambda: metric(pl.metrics_address, "exactly_purgatory_size")
    try:
        for k in range(1, 6):
            attackers.append(subprocess.Popen(
                [sys.executable, "-c", _ATTACKER, pl.address, str(PARKED * 11 // 50), request, "200", ""],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            wait_for(lambda: parked() >= PARKED * k // 5, 120,
                     lambda: f"{PARKED * k // 5} fetches parked (parked: {parked()})", interval_s=0.5)
        woken = lambda: sum(metric(pl.metrics_address, "exactly_fetch_wakeups_total",
                                   f'fetcher_type="consumer",outcome="{o}"') for o in ("completed", "parked_again"))
        assert 'exactly_fetch_wakeups_total{fetcher_type="consumer",outcome="parked_again"}' in \
            scrape(pl.metrics_address)
        before = woken()
        attacked = [_produce_cost(victim, pl.pid) for _ in range(3)]
        assert metric(pl.metrics_address, "exactly_purgatory_size") >= PARKED  # still parked throughout
        # The victim's appends read none of the parked fetches again (one round of it: PARKED).
        assert woken() - before < 50, f"{woken() - before} parked consumer fetches woken by the victim's appends"
    finally:
        for a in attackers:
            a.kill()
            out, _ = a.communicate(timeout=30)
            print("attacker:", collections.Counter(out.splitlines()).most_common(4))
    p50 = min(p for p, _ in attacked)
    cpu = min(c for _, c in attacked)
    print(f"produce p50: {baseline[0] * 1000:.2f} ms before, {p50 * 1000:.2f} ms with {PARKED} parked fetches; "
          f"leader CPU per append: {baseline[1] * 1000:.3f} ms before, {cpu * 1000:.3f} ms with them")
    assert cpu <= 2 * baseline[1], f"leader CPU per append {cpu * 1000:.3f} ms with {PARKED} parked fetches, " \
                                   f"{baseline[1] * 1000:.3f} ms before"


# ------------------------------------------------------------ long polls on one's own topic

# Fetches one principal parks on her own topic: the default cap of a principal's parked
# fetches (exactly.fetch.max.parked.per.principal).
OWN_PARKED = 1000


@pytest.fixture(scope="module")
def own_topic(zk, tmp_path_factory):
    """A secured cluster (TLS, client certificates, the ACL authorizer) with one
    partition leader, fetch.max.wait.ms raised so that parked fetches stay parked;
    User:mallory may use topic `mallory-own`, User:alice topic `alice-own`."""
    c = DevCluster(tmp_path_factory.mktemp("own-topic-cluster"), security=True,
                   props={"fetch.max.wait.ms": "600000"})
    c.up(1, 1, 1, zookeeper=new_chroot(zk, "owntopic"))
    ca = CertificateAuthority.load(c.dir / "certs")
    for who in ("mallory", "alice"):
        ca.issue(who, client=True)
    with AdminClient({"bootstrap.servers": c.bootstrap_servers, **c.client_config}) as a:
        a.create_topics([NewTopic("mallory-own", 1, 1), NewTopic("alice-own", 1, 1)])
        a.create_acls([AclBinding(f"User:{who}", "Topic", f"{who}-own", "All") for who in ("mallory", "alice")])
    yield c
    c.down()


def test_appends_to_ones_own_topic_wake_only_the_fetches_they_satisfy(own_topic):
    """mallory parks OWN_PARKED fetches on her own topic asking 1 MB (min_bytes) and
    appends small records to it: an append brings far less than a parked fetch waits
    for, so it wakes none of them (each append once re-read all 1,000: 1,000 reads per
    append on the leader's event loop). Her appends cost the leader's CPU no more than
    within 2x of appends without parked fetches, and alice's produce p50 on the same
    leader, while mallory appends, stays within 2x of its value while mallory appends
    before the attack (least of three rounds each: the same load but the parked fetches)."""
    pl = own_topic.services["pl-0"]
    mallory = pbg.PartitionLeaderStub(channel(own_topic, "mallory", pl.address))
    alice = pbg.PartitionLeaderStub(channel(own_topic, "alice", pl.address))
    def writable(stub, topic: str) -> bool:
        try:
            return stub.Produce(produce_request(topic, b"w"), timeout=10).topics[0].partitions[0].error_code == 0
        except grpc.RpcError as exc:  # PERMISSION_DENIED until the ACL watch fired
            if exc.code() != grpc.StatusCode.PERMISSION_DENIED:
                raise
            return False
    wait_for(lambda: writable(mallory, "mallory-own") and writable(alice, "alice-own"), 30, "the ACLs applied")
    _produce_cost(mallory, pl.pid, 30, "mallory-own")  # warm up
    baseline = min(_produce_cost(mallory, pl.pid, 300, "mallory-own") for _ in range(3))

    def alice_while_mallory_appends() -> float:
        """alice's produce p50 (least of three rounds) while mallory keeps appending to her topic."""
        stop = threading.Event()

        def keep_appending():
            while not stop.is_set():
                mallory.Produce(produce_request("mallory-own", b"m"), timeout=10)
        appender = threading.Thread(target=keep_appending, daemon=True)
        appender.start()
        try:
            return min(_produce_cost(alice, pl.pid, 300, "alice-own", budget_s=10)[0] for _ in range(3))
        finally:
            stop.set()
            appender.join(30)

    alice_before = alice_while_mallory_appends()
    end = mallory.ListOffsets(pb.ListOffsetsRequest(topics=[pb.ListOffsetsTopic(name="mallory-own", partitions=[
        pb.ListOffsetsPartition(partition=0, timestamp=-1)])]), timeout=10).topics[0].partitions[0].offset
    request = pb.FetchRequest(max_wait_ms=600000, min_bytes=MB, max_bytes=MB, topics=[pb.FetchTopic(
        topic="mallory-own", partitions=[pb.FetchPartition(partition=0, fetch_offset=end, partition_max_bytes=MB)])])
    attacker = subprocess.Popen([sys.executable, "-c", _ATTACKER, pl.address, str(OWN_PARKED),
                                 request.SerializeToString().hex(), "700", str(own_topic.dir / "certs")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    parked = lambda: metric(pl.metrics_address, "exactly_purgatory_size")  # noqa: E731
    woken = lambda: sum(metric(pl.metrics_address, "exactly_fetch_wakeups_total",  # noqa: E731
                               f'fetcher_type="consumer",outcome="{o}"') for o in ("completed", "parked_again"))
    try:
        wait_for(lambda: parked() >= OWN_PARKED, 120, lambda: f"{OWN_PARKED} fetches parked (parked: {parked()})",
                 interval_s=0.5)
        before = woken()
        attacked = [_produce_cost(mallory, pl.pid, 100, "mallory-own", budget_s=10) for _ in range(3)]
        wakeups = woken() - before
        assert parked() >= OWN_PARKED  # parked throughout
        # alice produces while mallory keeps appending to her topic under the parked fetches.
        alice_during = alice_while_mallory_appends()
        still = parked()
    finally:
        attacker.kill()
        out, _ = attacker.communicate(timeout=30)
        print("attacker:", collections.Counter(out.splitlines()).most_common(4))
    cpu = min(c for _, c in attacked)
    print(f"mallory's appends under {OWN_PARKED} of her own parked 1 MB fetches: leader CPU per append "
          f"{baseline[1] * 1000:.3f} ms before, {cpu * 1000:.3f} ms with them; parked fetches woken {wakeups:.0f}; "
          f"alice's produce p50 beside mallory's appends {alice_before * 1000:.2f} ms before, "
          f"{alice_during * 1000:.2f} ms meanwhile")
    assert still >= OWN_PARKED, still
    assert wakeups < 50, f"{wakeups:.0f} parked fetches woken by appends far short of their min_bytes"
    assert cpu <= 2 * baseline[1], f"leader CPU per append {cpu * 1000:.3f} ms, {baseline[1] * 1000:.3f} ms before"
    assert alice_during <= 2 * alice_before, (alice_before, alice_during)


# ------------------------------------------------------------ topic names on /metrics

def test_metrics_name_no_user_topic_by_default(tenants):
    pl = tenants.services["pl-0"]
    secret = f"secret-{uuid.uuid4().hex[:6]}"
    with AdminClient({"bootstrap.servers": tenants.bootstrap_servers}) as a:
        a.create_topics([NewTopic(secret, 1, 1)])
    stub = pbg.PartitionLeaderStub(grpc.insecure_channel(pl.address))
    wait_for(lambda: stub.Produce(produce_request(secret, b"s"), timeout=10).topics[0].partitions[0].error_code == 0,
             30, "the topic's leader ready")
    stub.Fetch(fetch_request(secret), timeout=10)
    def hidden_series() -> str | None:
        text = scrape(pl.metrics_address)
        return text if 'topic="(hidden)"' in text else None
    text = wait_for(hidden_series, 30, "the user topics' series")
    assert secret not in text and 'topic="victim"' not in text
    assert 'exactly_produce_records_total{topic="(hidden)"}' in text
