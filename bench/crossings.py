"""What one crossing of a service's boundary costs, through the services' real stack.

    python -m bench.crossings [--calls 2000] [--in-flight 8] [--min-seconds 2] [--reps 3] [--json]

bench/transport_floor.py measures bare transports with empty handlers; this measures
the same kinds of crossing against a partition leader of the current tree (a one-leader
dev cluster), through everything a real call passes: the server's interceptors
(metrics, the request guard, authentication, quotas), the tunnel's dispatch, the
Kafka listener's framing and codec, and a handler that does almost nothing
(ListOffsets of the latest offset of a one-partition topic). Kinds:

- `tunnel`: a tunneled call (services.common.transport.tunnel.TunnelChannel on grpc.aio,
  as a coordinator's appends, markers and a leader's verification travel);
- `unary_aio`: a direct unary call from grpc.aio (as the group coordinator's offset
  appends and tailing fetches, and the coordinators' loads);
- `unary_sdk`: a direct unary call from grpcio's blocking client (as every SDK call);
- `kafka`: a Kafka ListOffsets request on the leader's Kafka port over asyncio TCP (as
  librdkafka's requests);
- `produce_sdk`: the SDK's unary Produce of a 1-record batch (16 bytes, acks=1, no
  producer id) to the same partition: the crossing of `unary_sdk` plus the write path
  (the batch's checks, the append, the offset index), so the difference between the two
  is what the write path costs one batch.

Each runs `--in-flight` at a time (tasks, threads or connections) for at least
`--min-seconds`; per call: the partition leader's CPU (/proc) and the calling
process's CPU (its process_time: this process, on uvloop as the services). Medians of
`--reps` repetitions.
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import io
import json
import pathlib
import struct
import sys
import time

from .against import Run, Side, Sizes, head_label
from .common import cpu_seconds, median

TOPIC = "crossings"
KINDS = ("tunnel", "unary_aio", "unary_sdk", "kafka", "produce_sdk")
LIST_OFFSETS_VERSION = 1  # the Kafka request: ListOffsets v1 (latest offset), as librdkafka's


def _list_offsets_request():
    from exactly_wire.v1 import exactly_pb2 as pb
    return pb.ListOffsetsRequest(topics=[pb.ListOffsetsTopic(
        name=TOPIC, partitions=[pb.ListOffsetsPartition(partition=0, timestamp=-1)])])


def _kafka_frame() -> bytes:
    """A ListOffsets v1 request for partition 0 of TOPIC, framed (kio's writers)."""
    from kio.schema.request_header.v1.header import RequestHeader
    from kio.serial import entity_writer
    from services.common.kafka import codec
    cls = codec.request_class(2, LIST_OFFSETS_VERSION)
    out = io.BytesIO()
    header = RequestHeader(request_api_key=2, request_api_version=LIST_OFFSETS_VERSION, correlation_id=1,
                           client_id="crossings")
    entity_writer(RequestHeader)(out, header)
    entity_writer(cls)(out, codec.build(cls, {"replica_id": -1, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": -1}]}]}))
    body = out.getvalue()
    return struct.pack(">i", len(body)) + body


async def _spin(one, handles: list, server_pid: int, min_s: float, calls: int) -> tuple[int, float, float]:
    """Run `one(handle)` on every handle at once, `calls` per round, rounds until
    `min_s` passed; returns (calls, server CPU s, this process's CPU s)."""
    for h in handles:
        for _ in range(20):
            await one(h)
    per = max(calls // len(handles), 1)

    async def many(h) -> None:
        for _ in range(per):
            await one(h)
    s0, c0, w0, n = cpu_seconds(server_pid), time.process_time(), time.perf_counter(), 0
    while n == 0 or time.perf_counter() - w0 < min_s:
        await asyncio.gather(*(many(h) for h in handles))
        n += per * len(handles)
    return n, cpu_seconds(server_pid) - s0, time.process_time() - c0


async def _tunnel(address: str, pid: int, in_flight: int, min_s: float, calls: int):
    import grpc
    from exactly_wire.v1 import exactly_pb2 as pb
    from services.common.transport.tunnel import TunnelChannel, method_path
    method, request = method_path("PartitionLeader", "ListOffsets"), _list_offsets_request()
    async with grpc.aio.insecure_channel(address) as channel:
        tunnel = TunnelChannel(channel)
        try:
            async def one(_h) -> None:
                resp = await tunnel.call(method, request, pb.ListOffsetsResponse, 10.0)
                assert resp.topics[0].partitions[0].error_code == 0, resp
            return await _spin(one, list(range(in_flight)), pid, min_s, calls)
        finally:
            await tunnel.close()


async def _unary_aio(address: str, pid: int, in_flight: int, min_s: float, calls: int):
    import grpc
    from exactly_wire.v1 import exactly_pb2_grpc as pbg
    request = _list_offsets_request()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pbg.PartitionLeaderStub(channel)

        async def one(_h) -> None:
            resp = await stub.ListOffsets(request, timeout=10.0)
            assert resp.topics[0].partitions[0].error_code == 0, resp
        return await _spin(one, list(range(in_flight)), pid, min_s, calls)


def _produce_request():
    import time as _time

    from exactly_wire import records
    from exactly_wire.v1 import exactly_pb2 as pb
    batch = records.encode_batch([(None, b"x" * 16, (), int(_time.time() * 1000))])
    return pb.ProduceRequest(acks=1, timeout_ms=10_000, topics=[pb.TopicProduceData(
        name=TOPIC, partitions=[pb.PartitionProduceData(partition=0, records=batch)])])


def _unary_sdk(address: str, pid: int, in_flight: int, min_s: float, calls: int, produce: bool = False):
    import grpc
    from exactly_wire.v1 import exactly_pb2_grpc as pbg
    request = _produce_request() if produce else _list_offsets_request()
    with grpc.insecure_channel(address) as channel:
        stub = pbg.PartitionLeaderStub(channel)
        method = stub.Produce if produce else stub.ListOffsets

        def some(k: int) -> None:
            for _ in range(k):
                resp = method(request, timeout=10.0)
                assert resp.topics[0].partitions[0].error_code == 0, resp
        with concurrent.futures.ThreadPoolExecutor(in_flight) as pool:
            list(pool.map(some, [20] * in_flight))
            per = max(calls // in_flight, 1)
            s0, c0, w0, n = cpu_seconds(pid), time.process_time(), time.perf_counter(), 0
            while n == 0 or time.perf_counter() - w0 < min_s:
                list(pool.map(some, [per] * in_flight))
                n += per * in_flight
            return n, cpu_seconds(pid) - s0, time.process_time() - c0


async def _kafka(address: str, pid: int, in_flight: int, min_s: float, calls: int):
    host, port = address.rsplit(":", 1)
    frame = _kafka_frame()
    conns = [await asyncio.wait_for(asyncio.open_connection(host, int(port)), 10) for _ in range(in_flight)]

    async def one(conn) -> None:
        reader, writer = conn
        writer.write(frame)
        (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 10))
        await reader.readexactly(size)
    try:
        return await _spin(one, conns, pid, min_s, calls)
    finally:
        for _, w in conns:
            w.close()


def _on_uvloop(coro):
    from services.common.transport.server import loop_factory
    with asyncio.Runner(loop_factory=loop_factory("uvloop")) as runner:
        return runner.run(coro)


def measure(cluster, calls: int, in_flight: int, min_s: float) -> dict[str, dict]:
    """One repetition of every kind against the cluster's partition leader:
    {kind: {"calls", "server_cpu_ms", "client_cpu_ms", "per_s"}}."""
    svc = next(s for s in cluster.services.values() if s.role == "partition_leader")
    out = {}
    for kind in KINDS:
        w0 = time.perf_counter()
        if kind in ("unary_sdk", "produce_sdk"):
            n, server, client = _unary_sdk(svc.address, svc.pid, in_flight, min_s, calls, kind == "produce_sdk")
        else:
            fn = {"tunnel": _tunnel, "unary_aio": _unary_aio, "kafka": _kafka}[kind]
            address = svc.kafka_address if kind == "kafka" else svc.address
            n, server, client = _on_uvloop(fn(address, svc.pid, in_flight, min_s, calls))
        out[kind] = {"calls": n, "server_cpu_ms": server * 1000 / n, "client_cpu_ms": client * 1000 / n,
                     "per_s": n / (time.perf_counter() - w0)}
    return out


def run(calls: int = 2000, in_flight: int = 8, min_s: float = 2.0, reps: int = 3,
        work: pathlib.Path = pathlib.Path(".run/crossings")) -> dict:
    """Start a one-leader cluster of the current tree, measure `reps` times, stop it.
    Returns {kind: medians}, "runs": every repetition."""
    from .common import create_topic
    r = Run(work.resolve(), Sizes(rounds=0), lambda line: None)
    side = Side("head", head_label(), sys.executable)
    try:
        r.add_side(side)
        create_topic(side.cluster, TOPIC)
        runs = [measure(side.cluster, calls, in_flight, min_s) for _ in range(reps)]
    finally:
        r.stop()
    med = {kind: {k: median([rr[kind][k] for rr in runs]) for k in runs[0][kind]} for kind in KINDS}
    return {**med, "runs": runs, "in_flight": in_flight}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.crossings", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--min-seconds", type=float, default=2.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", type=pathlib.Path, default=pathlib.Path(".run/crossings"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.calls, args.in_flight, args.min_seconds, args.reps, args.dir)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for kind in KINDS:
        r = result[kind]
        print(f"{kind:10s} server CPU {r['server_cpu_ms']:.3f} ms/call, caller CPU {r['client_cpu_ms']:.3f} ms/call, "
              f"{r['per_s']:,.0f} calls/s ({args.in_flight} in flight)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
