"""The transport's floor on this machine: what one round trip costs before any of
Exactly's code runs.

    python -m bench.transport_floor [--calls 2000] [--in-flight 8] [--reps 3] [--json]

A server process on uvloop, as the services run (`exactly.event.loop`), answers three
kinds of round trip with an empty handler (the request's bytes echoed, 100 bytes):

- `unary`: a unary gRPC call from grpcio's blocking client, as the SDK makes one;
- `stream`: one message each way on an open bidirectional gRPC stream, client on
  grpc.aio and uvloop, as the services call each other (the tunnel,
  services/common/transport/tunnel.py);
- `tcp`: one length-prefixed frame each way on an asyncio TCP connection (uvloop),
  as the Kafka protocol listener reads and answers a request.

Each is measured twice per repetition: one call at a time (`--calls` of them; the
latency p50/p99 in ms, and CPU ms per round trip) and `--in-flight` at a time, for at
least a second (the server's CPU ms per round trip, from /proc/<pid>/stat, which counts
in 10 ms ticks, and the client's, from its process_time). Unary calls are also made as the InitProducerId benchmark makes them
(`unary_many`: grpc.aio clients in 2 processes, 128 calls in flight each; calls/s).
The medians over `--reps` are reported.

These figures bound the transaction path from below (`floors`). A lone SDK producer's
commit waits for 2 unary calls (Produce, EndTxn) and 3 stream round trips in sequence
(the leader's implicit AddPartitionsToTxn, the coordinator's append of it, the append
of PrepareCommit; KIP-98 design document, "Data Flow", and KIP-890's implicit add).
Every transaction makes its own client calls: 2 unary calls from the SDK, 3 Kafka
requests from librdkafka (AddPartitionsToTxn, Produce, EndTxn). The services' calls to
each other carry several transactions at once under load, so the CPU floors leave
them out. `make bench` puts the floors next to its goals (bench/suite.py).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import time

from exactly_tools.ports import free_ports

from .common import cpu_seconds, median, percentile, wait_until

SERVICE = "exactly.floor.Floor"
PAYLOAD = b"x" * 100
_FRAME = struct.Struct(">I")


def _identity(b: bytes) -> bytes:
    return b


# ------------------------------------------------------------------ server process

async def _serve(grpc_port: int, tcp_port: int) -> None:
    import grpc

    async def unary(request: bytes, context) -> bytes:
        return request

    async def stream(requests, context):
        async for request in requests:
            yield request

    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, _identity, _identity),
        "Stream": grpc.stream_stream_rpc_method_handler(stream, _identity, _identity),
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
    server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await server.start()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = _FRAME.unpack(await reader.readexactly(_FRAME.size))
                body = await reader.readexactly(size)
                writer.write(_FRAME.pack(len(body)) + body)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    tcp = await asyncio.start_server(echo, "127.0.0.1", tcp_port)
    async with tcp:
        await server.wait_for_termination()


def _loop_factory():
    """The services' uvloop factory (exactly.event.loop=uvloop; None, with a warning,
    without uvloop)."""
    from services.common.transport.server import loop_factory
    return loop_factory("uvloop")


def serve(grpc_port: int, tcp_port: int) -> None:
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_serve(grpc_port, tcp_port))


# ------------------------------------------------------------------ clients

def _timed(n: int, one) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        one()
        out.append(time.perf_counter() - t0)
    return out


def _unary(addr: str, server_pid: int, calls: int, in_flight: int, timeout_s: float, min_s: float) -> dict:
    """`calls` sequential calls (latency), then `calls` more, `in_flight` at a time from
    as many threads, repeated for at least `min_s` seconds (CPU per call: /proc counts
    in 10 ms ticks)."""
    import concurrent.futures
    import grpc
    with grpc.insecure_channel(addr) as channel:
        call = channel.unary_unary(f"/{SERVICE}/Unary", _identity, _identity)
        for _ in range(50):
            call(PAYLOAD, timeout=timeout_s)
        s0, c0 = cpu_seconds(server_pid), time.process_time()
        latencies = _timed(calls, lambda: call(PAYLOAD, timeout=timeout_s))
        one = (cpu_seconds(server_pid) - s0, time.process_time() - c0)
        per_thread = calls // in_flight
        with concurrent.futures.ThreadPoolExecutor(in_flight) as pool:
            s0, c0, w0 = cpu_seconds(server_pid), time.process_time(), time.perf_counter()
            n = 0
            while n == 0 or time.perf_counter() - w0 < min_s:
                list(pool.map(lambda _i: [call(PAYLOAD, timeout=timeout_s) for _ in range(per_thread)],
                              range(in_flight)))
                n += per_thread * in_flight
            s1, c1, w1 = cpu_seconds(server_pid), time.process_time(), time.perf_counter()
    return _row(latencies, one, n, s1 - s0, c1 - c0, w1 - w0)


async def _round_trips(rtt, handles: list, server_pid: int, calls: int, timeout_s: float, min_s: float) -> dict:
    """`calls` sequential round trips on handles[0] (latency), then `calls` more spread
    over every handle at once, repeated for at least `min_s` seconds (CPU per round trip)."""
    for _ in range(50):
        await asyncio.wait_for(rtt(handles[0]), timeout_s)
    latencies = []
    s0, c0 = cpu_seconds(server_pid), time.process_time()
    for _ in range(calls):
        t0 = time.perf_counter()
        await asyncio.wait_for(rtt(handles[0]), timeout_s)
        latencies.append(time.perf_counter() - t0)
    one = (cpu_seconds(server_pid) - s0, time.process_time() - c0)
    per_handle = calls // len(handles)

    async def many(h) -> None:
        for _ in range(per_handle):
            await asyncio.wait_for(rtt(h), timeout_s)
    s0, c0, w0 = cpu_seconds(server_pid), time.process_time(), time.perf_counter()
    n = 0
    while n == 0 or time.perf_counter() - w0 < min_s:
        await asyncio.gather(*(many(h) for h in handles))
        n += per_handle * len(handles)
    s1, c1, w1 = cpu_seconds(server_pid), time.process_time(), time.perf_counter()
    return _row(latencies, one, n, s1 - s0, c1 - c0, w1 - w0)


async def _stream(addr: str, server_pid: int, calls: int, in_flight: int, timeout_s: float, min_s: float) -> dict:
    import grpc
    async with grpc.aio.insecure_channel(addr) as channel:
        method = channel.stream_stream(f"/{SERVICE}/Stream", _identity, _identity)
        streams = [method() for _ in range(in_flight)]

        async def rtt(s) -> None:
            await s.write(PAYLOAD)
            await s.read()
        try:
            return await _round_trips(rtt, streams, server_pid, calls, timeout_s, min_s)
        finally:
            for s in streams:
                s.cancel()


async def _tcp(port: int, server_pid: int, calls: int, in_flight: int, timeout_s: float, min_s: float) -> dict:
    conns = [await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout_s) for _ in range(in_flight)]
    frame = _FRAME.pack(len(PAYLOAD)) + PAYLOAD

    async def rtt(conn) -> None:
        r, w = conn
        w.write(frame)
        (size,) = _FRAME.unpack(await r.readexactly(_FRAME.size))
        await r.readexactly(size)
    try:
        return await _round_trips(rtt, conns, server_pid, calls, timeout_s, min_s)
    finally:
        for _, w in conns:
            w.close()


async def _unary_aio(addr: str, calls: int, concurrency: int, timeout_s: float, barrier=None,
                     min_s: float = 0.0) -> tuple[float, int]:
    """`calls` unary calls (a first 200 to connect, then, after `barrier`, `calls` more
    repeated for at least `min_s` seconds), `concurrency` at a time; returns the
    process's CPU seconds and the calls of the second part."""
    import grpc
    async with grpc.aio.insecure_channel(addr) as channel:
        call = channel.unary_unary(f"/{SERVICE}/Unary", _identity, _identity)

        async def some(count: int) -> None:
            left = iter(range(count))

            async def worker() -> None:
                for _ in left:
                    await call(PAYLOAD, timeout=timeout_s)
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        await some(min(calls, 200))
        if barrier is not None:
            await asyncio.to_thread(barrier.wait, timeout_s * 10)
        c0, w0, n = time.process_time(), time.perf_counter(), 0
        while n == 0 or time.perf_counter() - w0 < min_s:
            await some(calls)
            n += calls
        return time.process_time() - c0, n


def _unary_aio_process(addr: str, calls: int, concurrency: int, timeout_s: float, min_s: float, barrier,
                       out) -> None:
    try:
        out.put(("ok", *asyncio.run(_unary_aio(addr, calls, concurrency, timeout_s, barrier, min_s))))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        out.put(("error", repr(exc)))


def _unary_many(addr: str, server_pid: int, calls: int, processes: int, concurrency: int,
                timeout_s: float, min_s: float) -> dict:
    """Empty unary calls as the InitProducerId benchmark makes them (bench.recovery
    create_transactional_ids): grpc.aio clients in `processes` processes with
    `concurrency` calls in flight each, `calls` per process, repeated for at least
    `min_s` seconds. Returns calls/s and CPU ms per call of the server and of the clients."""
    from .transactions import worker_context
    ctx = worker_context()
    out, barrier = ctx.Queue(), ctx.Barrier(processes + 1)
    procs = [ctx.Process(target=_unary_aio_process, args=(addr, calls, concurrency, timeout_s, min_s, barrier, out),
                         daemon=True) for _ in range(processes)]
    for proc in procs:
        proc.start()
    try:
        barrier.wait(timeout_s * 10)
        s0, w0 = cpu_seconds(server_pid), time.perf_counter()
        answers = [out.get(timeout=timeout_s * 60) for _ in procs]
        s1, w1 = cpu_seconds(server_pid), time.perf_counter()
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    failed = [a[1] for a in answers if a[0] != "ok"]
    if failed:
        raise RuntimeError(f"unary clients failed: {failed[0]}")
    n = sum(a[2] for a in answers)
    return {"per_s": n / (w1 - w0), "server_cpu_ms": (s1 - s0) / n * 1000,
            "client_cpu_ms": sum(a[1] for a in answers) / n * 1000}


def _on_uvloop(coro) -> dict:
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(coro)


def _row(latencies: list[float], one_at_a_time: tuple[float, float], n: int, server_cpu_s: float,
         client_cpu_s: float, wall_s: float) -> dict:
    """Latency p50/p99 (ms) of the sequential round trips; CPU ms per round trip of the
    server and the client, one at a time (`*_cpu_ms_sequential`) and `in_flight` at a
    time, and the round trips per second of the latter."""
    k = len(latencies)
    latencies = sorted(latencies)
    return {"p50_ms": percentile(latencies, 0.5) * 1000, "p99_ms": percentile(latencies, 0.99) * 1000,
            "server_cpu_ms_sequential": one_at_a_time[0] / k * 1000,
            "client_cpu_ms_sequential": one_at_a_time[1] / k * 1000,
            "server_cpu_ms": server_cpu_s / n * 1000, "client_cpu_ms": client_cpu_s / n * 1000,
            "per_s": n / wall_s}


def measure_once(server_pid: int, grpc_port: int, tcp_port: int, calls: int, in_flight: int,
                 timeout_s: float = 10.0, min_s: float = 1.0) -> dict:
    """One repetition: {"unary"|"stream"|"tcp": {p50_ms, p99_ms, server_cpu_ms, client_cpu_ms, ...}
    (`_row`), "unary_many": {per_s, server_cpu_ms, client_cpu_ms} (`_unary_many`)}."""
    addr = f"127.0.0.1:{grpc_port}"
    return {"unary": _unary(addr, server_pid, calls, in_flight, timeout_s, min_s),
            "stream": _on_uvloop(_stream(addr, server_pid, calls, in_flight, timeout_s, min_s)),
            "tcp": _on_uvloop(_tcp(tcp_port, server_pid, calls, in_flight, timeout_s, min_s)),
            "unary_many": _unary_many(addr, server_pid, calls * 2, 2, 128, timeout_s, min_s)}


def floors(fig: dict) -> dict:
    """What the transport alone costs the transaction path, from one set of medians
    (module docstring), before any of Exactly's code runs. Only round trips that no
    batching removes count: a lone producer's commit has nothing to share a round trip
    with, and every transaction makes its own client calls, while the services' calls
    to each other (appends, markers, verification) carry several transactions at once
    under load.
    - sdk_commit_p50_ms: an SDK commit's latency, 2 unary calls + 3 stream round trips;
    - sdk_client_cpu_ms_per_txn: an SDK producer's CPU for its 2 calls (Produce,
      EndTxn), one at a time;
    - sdk_server_cpu_ms_per_txn: the services' CPU for those 2 calls;
    - librdkafka_server_cpu_ms_per_txn: the services' CPU for librdkafka's 3 Kafka
      requests (AddPartitionsToTxn, Produce, EndTxn);
    - unary_calls_per_s: empty unary calls a second from 2 processes with 128 in flight
      each, the InitProducerId benchmark's clients (one call per id)."""
    u, s, t = fig["unary"], fig["stream"], fig["tcp"]
    return {"sdk_commit_p50_ms": 2 * u["p50_ms"] + 3 * s["p50_ms"],
            "sdk_client_cpu_ms_per_txn": 2 * u["client_cpu_ms_sequential"],
            "sdk_server_cpu_ms_per_txn": 2 * u["server_cpu_ms"],
            "librdkafka_server_cpu_ms_per_txn": 3 * t["server_cpu_ms"],
            "unary_calls_per_s": fig["unary_many"]["per_s"]}


def _listening(proc: subprocess.Popen, port: int) -> bool:
    """Whether `port` on 127.0.0.1 accepts connections; RuntimeError once `proc` exited."""
    if proc.poll() is not None:
        raise RuntimeError(f"the echo server exited with {proc.returncode}")
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def run(calls: int = 2000, in_flight: int = 8, reps: int = 3, timeout_s: float = 10.0, min_s: float = 1.0) -> dict:
    """Start the echo server, measure `reps` times (each CPU measurement at least `min_s`
    seconds long); the medians, every repetition, and
    `floors`. Raises TimeoutError when the server does not listen within 30 s, RuntimeError
    when it exits first."""
    grpc_port, tcp_port = free_ports(2)
    proc = subprocess.Popen([sys.executable, "-m", "bench.transport_floor", "--serve", str(grpc_port), str(tcp_port)],
                            stdout=subprocess.DEVNULL, cwd=os.path.dirname(os.path.dirname(__file__)))
    try:
        wait_until(lambda: _listening(proc, grpc_port) and _listening(proc, tcp_port), 30, 0.05, "the echo server")
        runs = [measure_once(proc.pid, grpc_port, tcp_port, calls, in_flight, timeout_s, min_s) for _ in range(reps)]
    finally:
        proc.kill()
        proc.wait(timeout=30)
    med = {kind: {k: median([r[kind][k] for r in runs]) for k in runs[0][kind]} for kind in runs[0]}
    return {**med, "floors": floors(med), "runs": runs, "calls": calls, "in_flight": in_flight}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transport_floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="round trips per measurement")
    parser.add_argument("--in-flight", type=int, default=8, help="concurrent round trips of the CPU measurement")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--serve", nargs=2, type=int, metavar=("GRPC_PORT", "TCP_PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(*args.serve)
        return 0
    result = run(args.calls, args.in_flight, args.reps)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for kind in ("unary", "stream", "tcp"):
        r = result[kind]
        print(f"{kind:6s}  p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms | one at a time: server CPU "
              f"{r['server_cpu_ms_sequential']:.3f} ms, client CPU {r['client_cpu_ms_sequential']:.3f} ms | "
              f"{result['in_flight']} at a time: server CPU {r['server_cpu_ms']:.3f} ms, client CPU "
              f"{r['client_cpu_ms']:.3f} ms, {r['per_s']:,.0f}/s")
    m = result["unary_many"]
    print(f"unary, 2 processes x 128 in flight: {m['per_s']:,.0f} calls/s, server CPU {m['server_cpu_ms']:.3f} ms, "
          f"client CPU {m['client_cpu_ms']:.3f} ms per call")
    f = result["floors"]
    print(f"floors: SDK commit p50 {f['sdk_commit_p50_ms']:.2f} ms; SDK client CPU per transaction "
          f"{f['sdk_client_cpu_ms_per_txn']:.2f} ms; services' CPU per transaction "
          f"{f['sdk_server_cpu_ms_per_txn']:.2f} ms (SDK), {f['librdkafka_server_cpu_ms_per_txn']:.2f} ms "
          f"(librdkafka); unary calls {f['unary_calls_per_s']:,.0f}/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
