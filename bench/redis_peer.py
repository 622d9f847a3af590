"""The Redis Streams peer, measured from Python (redis-py) like the SDK: a private
redis-server on a free loopback port without persistence; pipelined XADD of the
same 1 KB values, MULTI/EXEC transactions of one XADD to each of two streams, and
XREAD of the stream in batches. Also redis-benchmark's XADD (a C client) when
installed, for reference."""
from __future__ import annotations

import pathlib
import shutil
import subprocess
import time

from exactly_tools.ports import free_port

from .common import wait_until


class RedisServer:
    """redis-server on 127.0.0.1:<free port>, --save "" --appendonly no; stopped by stop()."""

    def __init__(self, work_dir: pathlib.Path):
        if not shutil.which("redis-server"):
            raise RuntimeError("redis-server is not installed (make bench installs it with apt-get)")
        import redis
        work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", str(work_dir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(host="127.0.0.1", port=self.port)

        def up() -> bool:
            try:
                return bool(self.client.ping())
            except redis.ConnectionError:
                return False
        wait_until(up, 10, 0.05, "redis-server")

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def xadd_run(r, stream: str, n: int, size: int, depth: int) -> dict:
    """XADD `n` values of `size` bytes, `depth` commands per pipeline round trip."""
    r.delete(stream)
    value = b"x" * size
    start = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(stream, {"v": value})
        if (i + 1) % depth == 0:
            pipe.execute()
    pipe.execute()
    elapsed = time.perf_counter() - start
    assert r.xlen(stream) == n
    return {"records": n, "seconds": elapsed, "records_per_s": n / elapsed, "pipeline_depth": depth}


def multi_exec_run(r, transactions: int) -> dict:
    """MULTI; XADD a; XADD b; EXEC, one round trip per transaction."""
    r.delete("bench-txn-a", "bench-txn-b")
    value = b"x" * 16
    start = time.perf_counter()
    for _ in range(transactions):
        pipe = r.pipeline(transaction=True)
        pipe.xadd("bench-txn-a", {"v": value})
        pipe.xadd("bench-txn-b", {"v": value})
        pipe.execute()
    elapsed = time.perf_counter() - start
    return {"transactions": transactions, "seconds": elapsed, "txn_per_s": transactions / elapsed}


def xread_run(r, stream: str, expected: int, count: int) -> dict:
    """XREAD the stream from the start, `count` entries per call."""
    got = 0
    last = "0-0"
    start = time.perf_counter()
    while got < expected:
        resp = r.xread({stream: last}, count=count)
        if not resp:
            break
        entries = resp[0][1]
        got += len(entries)
        last = entries[-1][0]
    elapsed = time.perf_counter() - start
    return {"records": got, "seconds": elapsed, "records_per_s": got / elapsed, "batch": count}


def redis_benchmark_xadd(port: int, n: int, size: int) -> dict | None:
    """redis-benchmark (C) XADD, pipelined 32 deep, one connection; None when missing."""
    if not shutil.which("redis-benchmark"):
        return None
    out = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-n", str(n), "-P", "32",
                          "-c", "1", "--csv", "XADD", "bench-c", "*", "f", "x" * size],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    rps = float([line for line in out.splitlines() if line.startswith('"XADD')][-1].split(",")[1].strip('"'))
    return {"records": n, "records_per_s": rps}
