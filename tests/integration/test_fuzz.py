"""Hostile input on real processes (docs/design.md, "Input validation and limits"):
requests generated from the protobuf descriptors (tests/fuzz_requests.py), so every
unary RPC of every service is covered without editing this test, sent over real gRPC
to a real development cluster. Afterwards every service process is alive and
answers, no call came back with gRPC status INTERNAL or UNKNOWN (nor error code
UNKNOWN_SERVER_ERROR), none hung, the data written before the fuzzing (plain and
idempotent records and a committed transaction, with the SDK) reads back unchanged
through the SDK, and no last stable offset is stuck: LSO == high watermark on every
partition once the transactions the fuzzing may have opened timed out.

Requests per RPC: EXACTLY_FUZZ_REQUESTS (default 60: `make test`); `make fuzz` runs
2,000 per RPC. EXACTLY_FUZZ_SEED picks the seed (default: a fixed one). The figures
are printed (run with -s) and, with EXACTLY_FUZZ_REPORT=path, written as JSON.
"""
from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import random
import time
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from exactly import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from exactly_tools.devcluster import pid_alive
from exactly_wire import client_calls
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from fuzz_requests import Pools, Rpc, generate, raw_garbage, rpcs
from services.common.transport.server import ROLE_SERVICES
from services.common.transport.tunnel import CLIENT_CARRIED, CLIENT_METHOD, TUNNEL_METHOD, TunnelError, method_path
from waiting import wait_for

pytestmark = pytest.mark.integration

REQUESTS = int(os.environ.get("EXACTLY_FUZZ_REQUESTS", "60"))
SEED = int(os.environ.get("EXACTLY_FUZZ_SEED", "20240611"))
# Above the longest wait a server may take on its own: WriteTxnMarkers and acks=all
# appends wait up to 25-30 s for the high watermark when a follower lags.
CALL_DEADLINE_S = 35.0
PARALLEL = 16
# The share of requests sent through the tunnel instead of directly, half of them on
# Tunnel/Calls and half on Tunnel/Batches (on Client/Calls, the SDK's stream, for the
# methods it carries): the same interceptors and handlers must answer them the same way.
TUNNEL_BATCHES = method_path("Tunnel", "Batches")
TUNNELED = 0.25
# Legitimate administrative operations that delete or rewrite data: the generator
# names only scratch topics and groups in them (see fuzz_requests.Pools).
DESTRUCTIVE = frozenset({"DeleteTopics", "DeleteRecords", "IncrementalAlterConfigs", "DeleteGroups",
                         "CreatePartitions"})
# Fields by which a request asks the server to wait (long polls, acks=all, rebalances).
WAIT_FIELDS = ("max_wait_ms", "timeout_ms", "rebalance_timeout_ms", "session_timeout_ms")
FAILED_STATUSES = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
FUZZ_PROPS = {
    # Transactions a fuzzed request opens end quickly, so a stuck LSO shows.
    "transaction.max.timeout.ms": "4000",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
    # CreateTopics of a few hundred partitions is legitimate; the cluster-wide limit keeps
    # the fuzzed topics within what two partition leaders on a small machine hold open.
    "max.partitions": "3000",
}


def _role_of_service() -> dict[str, str]:
    return {service: role for role, service in ROLE_SERVICES.items()}


def _asked_to_wait(msg, limit_ms: float) -> bool:
    """Whether a request asked for a wait of at least `limit_ms` (or the server's
    default wait, a wait field 0 or negative), or is a JoinGroup (answered when the
    rebalance completes)."""
    if isinstance(msg, pb.JoinGroupRequest):
        return True
    for f, value in msg.ListFields():
        if f.name in WAIT_FIELDS and (value <= 0 or value >= limit_ms):
            return True
        if f.message_type is not None:
            items = value if f.is_repeated else [value]
            if any(hasattr(v, "ListFields") and _asked_to_wait(v, limit_ms) for v in items):
                return True
    return False


def _unknown_server_errors(msg) -> int:
    """How many error_code fields in a response are UNKNOWN_SERVER_ERROR."""
    n = 0
    for f, value in msg.ListFields():
        if f.name == "error_code" and value == ErrorCode.UNKNOWN_SERVER_ERROR:
            n += 1
        elif f.message_type is not None and not f.message_type.GetOptions().map_entry:
            for v in (value if f.is_repeated else [value]):
                n += _unknown_server_errors(v)
    return n


def _seed_data(cluster, data_topic: str, group: str) -> tuple[list[int], str]:
    """Plain, idempotent and transactional records in `data_topic`, offsets committed
    for `group`; returns the producer ids used and the transactional.id."""
    txn_id = f"fuzz-tx-{uuid.uuid4().hex[:6]}"
    with Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 0,
                   "enable.idempotence": False, "acks": "1"}) as p:
        for i in range(10):
            p.send(data_topic, value=f"plain-{i}".encode(), key=f"k{i}".encode())
        p.flush(30)
    with Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 0}) as p:
        for i in range(10):
            p.send(data_topic, value=f"idempotent-{i}".encode(), key=f"k{i}".encode())
        p.flush(30)
    p = Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": txn_id, "linger.ms": 0,
                  "transaction.timeout.ms": 4000})
    try:
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(10):
            p.send(data_topic, value=f"txn-{i}".encode(), key=f"k{i}".encode())
        p.commit_transaction(30)
    finally:
        p.close()
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.alter_consumer_group_offsets(group, {TopicPartition(data_topic, 0): 3})
        pids = [s.producer_id for states in admin.describe_producers(
            [TopicPartition(data_topic, q) for q in range(2)]).values() for s in states]
    return pids, txn_id


def _read_committed(cluster, topic: str, partitions: int, ends: dict[int, int]) -> list[tuple]:
    """(partition, offset, key, value) of every committed record below `ends`
    (partition -> end offset), read with the SDK's read_committed consumer."""
    c = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "isolation.level": "read_committed",
                  "enable.auto.commit": False, "fetch.max.wait.ms": 100})
    try:
        tps = [TopicPartition(topic, q) for q in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(tps)
        out: list[tuple] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(c.position(tp) < ends[tp.partition] for tp in tps):
            out += [(r.partition, r.offset, r.key, r.value) for r in c.poll(0.2) if r.offset < ends[r.partition]]
        return sorted(out)
    finally:
        c.close()


class _Tally:
    def __init__(self):
        self.requests = collections.Counter()
        self.statuses: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.internal: list[str] = []
        self.hangs: list[str] = []

    def record(self, rpc: Rpc, msg, outcome) -> None:
        name = f"{rpc.service}/{rpc.name}"  # one method name may be two services' (Tunnel/Attach, Client/Attach)
        self.requests[name] += 1
        if isinstance(outcome, grpc.RpcError):
            code = outcome.code()
            self.statuses[name][code.name] += 1
            if code in FAILED_STATUSES:
                self.internal.append(f"{name}: {code.name} {outcome.details()!r} for {_short(msg)}")
            elif code == grpc.StatusCode.DEADLINE_EXCEEDED and not (
                    msg is not None and _asked_to_wait(msg, CALL_DEADLINE_S * 1000)):
                self.hangs.append(f"{name}: no answer in {CALL_DEADLINE_S} s for {_short(msg)}")
        else:
            self.statuses[name]["OK"] += 1
            bad = _unknown_server_errors(outcome)
            if bad:
                self.internal.append(f"{name}: {bad} x UNKNOWN_SERVER_ERROR for {_short(msg)}")


def _short(msg) -> str:
    if msg is None:
        return "raw garbage"
    text = str(msg).replace("\n", " ")
    return text[:300] + ("..." if len(text) > 300 else "")


def _tunneled(channel: grpc.Channel, rpc: Rpc, msg, body: bytes, batches: bool = False,
              batches_method: str = TUNNEL_BATCHES):
    """The request through Tunnel/Calls, or alone in a message of Tunnel/Batches with
    `batches` (Client/Calls with that `batches_method`; services.common.transport.tunnel):
    its response, or a TunnelError with the
    status it was answered with. Raw garbage is sent as the stream's message itself (it
    must come back INVALID_ARGUMENT under correlation id 0)."""
    call = pb.TunneledCall(correlation_id=1, method=rpc.path, request=body)
    if batches:
        wrapped = body if msg is None else pb.TunneledCalls(calls=[call]).SerializeToString()
        calls = channel.stream_stream(batches_method, request_serializer=None,
                                      response_deserializer=pb.TunneledReplies.FromString)
    else:
        wrapped = body if msg is None else call.SerializeToString()
        calls = channel.stream_stream(TUNNEL_METHOD, request_serializer=None,
                                      response_deserializer=pb.TunneledReply.FromString)
    asked_wait_s = min(max(getattr(msg, "max_wait_ms", 0), 0) / 1000, CALL_DEADLINE_S) if msg is not None else 0.0
    try:
        replies = list(calls(iter([wrapped]), timeout=CALL_DEADLINE_S + asked_wait_s))
    except grpc.RpcError as exc:
        return exc
    if batches:
        replies = [r for message in replies for r in message.replies]
    if len(replies) != 1:
        return TunnelError(grpc.StatusCode.INTERNAL, f"{len(replies)} replies to one tunneled call")
    reply = replies[0]
    if reply.status_code:
        return TunnelError(client_calls.status(reply.status_code), reply.status_details)
    if reply.correlation_id != 1:
        return TunnelError(grpc.StatusCode.INTERNAL, f"a reply under correlation id {reply.correlation_id}")
    return rpc.response.FromString(reply.response)


def _fuzz(cluster, pools: Pools, requests: int, seed: int) -> _Tally:
    role_of = _role_of_service()
    addresses = collections.defaultdict(list)
    for svc in cluster.services.values():
        addresses[svc.role].append(svc.address)
    everyone = [a for addrs in addresses.values() for a in addrs]
    channels = {a: grpc.insecure_channel(a, options=[("grpc.max_receive_message_length", 128 << 20)])
                for a in everyone}
    tally = _Tally()
    rng = random.Random(seed)
    plan = [rpc for rpc in rpcs() for _ in range(requests)]
    rng.shuffle(plan)

    def jobs():
        """Requests made as they are sent (a long run does not hold them all in memory)."""
        for rpc in plan:
            targets = addresses[role_of[rpc.service]] if rpc.service in role_of else everyone
            target = rng.choice(targets)
            tunneled = ("batches" if rng.random() < 0.5 else "calls") if rng.random() < TUNNELED else None
            if tunneled == "batches" and rpc.path in CLIENT_CARRIED:
                tunneled = "client"  # the SDK's stream: the same message form, any authenticated caller
            if rng.random() < 0.05:
                yield rpc, target, None, raw_garbage(rng), tunneled
            else:
                msg = generate(rpc, rng, pools)
                yield rpc, target, msg, msg.SerializeToString(), tunneled

    def call(job):
        rpc, target, msg, body, tunneled = job
        if tunneled:
            return rpc, msg, _tunneled(channels[target], rpc, msg, body, tunneled != "calls",
                                       CLIENT_METHOD if tunneled == "client" else TUNNEL_BATCHES)
        method = channels[target].unary_unary(rpc.path, request_serializer=None,
                                              response_deserializer=rpc.response.FromString)
        # A Fetch long-polls for the max_wait_ms it asks for: an answer just after it is
        # not a hang (longer asked waits are not counted as hangs at all, _asked_to_wait).
        asked_wait_s = min(max(getattr(msg, "max_wait_ms", 0), 0) / 1000, CALL_DEADLINE_S) if msg is not None else 0.0
        try:
            return rpc, msg, method(body, timeout=CALL_DEADLINE_S + asked_wait_s)
        except grpc.RpcError as exc:
            return rpc, msg, exc

    try:
        with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
            pending: set = set()
            for job in jobs():
                pending.add(pool.submit(call, job))
                if len(pending) >= 2 * PARALLEL:
                    done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                    for f in done:
                        tally.record(*f.result())
            for f in concurrent.futures.as_completed(pending):
                tally.record(*f.result())
    finally:
        for ch in channels.values():
            ch.close()
    return tally


def _answers_health(address: str, timeout_s: float = 60.0) -> bool:
    """The process answers its liveness check at once and is ready (health "",
    SERVING) within `timeout_s`: a coordinator reloading a partition it was elected
    for again after a ZooKeeper hiccup is NOT_SERVING meanwhile, not hung."""
    with grpc.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        try:
            live = stub.Check(health_pb2.HealthCheckRequest(service="liveness"), timeout=5)
        except grpc.RpcError:
            return False
        if live.status != health_pb2.HealthCheckResponse.SERVING:
            return False
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                return False
            time.sleep(0.2)
        return False


def test_fuzz_every_rpc(make_cluster):
    started = time.monotonic()
    cluster = make_cluster(partition_leaders=2, props=FUZZ_PROPS)
    data_topic, group = "fuzz.data", "fuzz-group"
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(data_topic, 2, replication_factor=2), NewTopic("fuzz_scratch", 1),
                             NewTopic("scratch-2", 2, replication_factor=2)], timeout=60)
    pids, txn_id = _seed_data(cluster, data_topic, group)
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        before_offsets = admin.list_offsets([TopicPartition(data_topic, q) for q in range(2)])
    ends = {tp.partition: hw for tp, (hw, lso) in before_offsets.items()}
    before = _read_committed(cluster, data_topic, 2, ends)
    assert len(before) == 30

    pools = Pools(topics=[data_topic, "__transaction_state", "__consumer_offsets"],
                  scratch_topics=["fuzz_scratch", "scratch-2", "no-such-topic"],
                  groups=[group], scratch_groups=["scratch-group"], transactional_ids=[txn_id, "fuzz-other-tx"],
                  producer_ids=pids + [999_999], node_ids=list(cluster.services), destructive=DESTRUCTIVE)
    fuzz_started = time.monotonic()
    tally = _fuzz(cluster, pools, REQUESTS, SEED)
    fuzz_s = time.monotonic() - fuzz_started

    dead = [name for name, svc in cluster.services.items() if not pid_alive(svc.pid)]
    deaf = [name for name, svc in cluster.services.items() if name not in dead and not _answers_health(svc.address)]
    after = _read_committed(cluster, data_topic, 2, ends)
    intact = after == before

    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        topics = admin.list_topics(include_internal=True)
        tps = [TopicPartition(t, q) for t, parts in topics.items() for q in parts]

        def stuck() -> list:
            return [(tp, hw, lso) for tp, (hw, lso) in admin.list_offsets(tps).items() if hw != lso]
        try:
            wait_for(lambda: not stuck(), 60, "LSO == high watermark on every partition")
            stuck_lso = []
        except AssertionError:
            stuck_lso = stuck()

    report = {
        "requests_per_rpc": REQUESTS, "rpcs": len(tally.requests), "requests": sum(tally.requests.values()),
        "seed": SEED, "deaths": len(dead), "unresponsive": len(deaf), "hangs": len(tally.hangs),
        "internal_errors": len(tally.internal), "data_intact": intact, "stuck_lso": len(stuck_lso),
        "fuzz_seconds": round(fuzz_s, 1), "test_seconds": round(time.monotonic() - started, 1),
        "cpus": os.cpu_count(), "statuses": {k: dict(v) for k, v in sorted(tally.statuses.items())},
        "hung_calls": tally.hangs[:30], "internal_answers": tally.internal[:30],
    }
    print(json.dumps(report, indent=1))
    if os.environ.get("EXACTLY_FUZZ_REPORT"):
        with open(os.environ["EXACTLY_FUZZ_REPORT"], "w") as f:
            json.dump(report, f, indent=1)
    assert not dead, f"services died: {dead}"
    assert not deaf, f"services stopped answering health checks: {deaf}"
    assert not tally.internal, "INTERNAL/UNKNOWN answers:\n" + "\n".join(tally.internal[:30])
    assert not tally.hangs, "hung calls:\n" + "\n".join(tally.hangs[:30])
    assert intact, f"data changed: before {before}, after {after}"
    assert not stuck_lso, f"stuck LSO (partition, high watermark, LSO): {stuck_lso}"
    assert all(n == REQUESTS for n in tally.requests.values()) and len(tally.requests) == len(rpcs())
