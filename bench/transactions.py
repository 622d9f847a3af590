"""Transaction costs: the commit latency of a small transaction over 3 partitions
(one producer), and committed transactions/s through one transaction coordinator
with several producer processes, each with its own transactional.id."""
from __future__ import annotations

import multiprocessing
import os
import time

from exactly import Producer

from .common import cpu_seconds, percentile


def commit_latency_run(bootstrap: str, topic: str, partitions: int, transactions: int, warmup: int = 10) -> dict:
    """Per transaction: begin, one 16-byte record to each of `partitions` partitions,
    commit; the wall time of send + commit, over `transactions` transactions."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-latency-{os.getpid()}-{time.time_ns()}",
                  "linger.ms": 0})
    p.init_transactions()
    value = b"x" * 16
    times: list[float] = []
    for i in range(warmup + transactions):
        t0 = time.perf_counter()
        p.begin_transaction()
        for part in range(partitions):
            p.send(topic, value, partition=part)
        p.commit_transaction()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    p.close()
    times.sort()
    return {"transactions": len(times), "p50_ms": percentile(times, 0.5) * 1000,
            "p99_ms": percentile(times, 0.99) * 1000, "max_ms": times[-1] * 1000,
            "mean_ms": sum(times) / len(times) * 1000}


def worker_context():
    """Worker processes forked from a fresh forkserver that imported the SDK once
    (cheaper than spawning each, and no fork of this process's gRPC threads)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["exactly", "bench.transactions", "bench.recovery"])
    return ctx


class _SdkTxnClient:
    """The SDK's transactional producer, as the worker drives it."""

    def __init__(self, bootstrap: str, transactional_id: str):
        self.p = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 0})
        self.p.init_transactions()

    def transaction(self, topic: str, value: bytes, partition: int) -> None:
        self.p.begin_transaction()
        self.p.send(topic, value, partition=partition)
        self.p.commit_transaction()

    def close(self) -> None:
        self.p.close()


class _RdkafkaTxnClient:
    """confluent-kafka (librdkafka), a C client, through the Kafka protocol port."""

    def __init__(self, bootstrap: str, transactional_id: str):
        from confluent_kafka import Producer as KafkaProducer
        self.p = KafkaProducer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                                "linger.ms": 0, "enable.idempotence": True})
        self.p.init_transactions(60)

    def transaction(self, topic: str, value: bytes, partition: int) -> None:
        self.p.begin_transaction()
        self.p.produce(topic, value, partition=partition)
        self.p.commit_transaction(60)

    def close(self) -> None:
        self.p.flush(30)


CLIENTS = {"sdk": _SdkTxnClient, "librdkafka": _RdkafkaTxnClient}


def _txn_worker(bootstrap: str, topic: str, partitions: int, index: int, run_id: str, reps: int, seconds: float,
                ready, barrier, results, client: str = "sdk") -> None:
    """One producer process: init, warm up, then for each repetition (all workers
    released together by `barrier`) commit 1-record transactions for `seconds`.
    Puts (index, rep, commits, elapsed s, error, own CPU s) on `results`."""
    try:
        p = CLIENTS[client](bootstrap, f"bench-coord-{run_id}-{index}")
        value = b"x" * 16
        part = index % partitions
        for _ in range(3):
            p.transaction(topic, value, part)
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        results.put((index, -1, 0, 0.0, repr(exc), 0.0))
        ready.put(index)
        return
    ready.put(index)
    for rep in range(reps):
        barrier.wait()
        commits = 0
        cpu0 = time.process_time()
        start = time.perf_counter()
        deadline = start + seconds
        error = ""
        try:
            while time.perf_counter() < deadline:
                p.transaction(topic, value, part)
                commits += 1
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            error = repr(exc)
        results.put((index, rep, commits, time.perf_counter() - start, error, time.process_time() - cpu0))
        if error:
            break
    p.close()


def coordinator_throughput(bootstrap: str, topic: str, partitions: int, producers: int, reps: int,
                           seconds: float, client: str = "sdk", server_pids: dict[str, int] | None = None
                           ) -> list[dict]:
    """`producers` processes (forked from a forkserver), each its own transactional.id and 1-record
    transactions, for `reps` windows of `seconds`; per window: committed transactions/s (the sum of
    the processes' rates), and CPU ms per committed transaction of the clients (their own
    process CPU) and of each service in `server_pids` ({name: pid}, read from /proc over the window).
    `client`: "sdk" (gRPC) or "librdkafka" (confluent-kafka through the Kafka port; `bootstrap`
    must then be the Kafka listeners)."""
    ctx = worker_context()
    ready, results = ctx.Queue(), ctx.Queue()
    barrier = ctx.Barrier(producers + 1)
    run_id = f"{os.getpid()}-{time.time_ns()}"
    server_pids = server_pids or {}
    procs = [ctx.Process(target=_txn_worker, args=(bootstrap, topic, partitions, i, run_id, reps, seconds,
                                                   ready, barrier, results, client), daemon=True)
             for i in range(producers)]
    for proc in procs:
        proc.start()
    try:
        for _ in range(producers):
            ready.get(timeout=180)
        if not results.empty():
            raise RuntimeError(f"transactional producer failed to start: {results.get()[4]}")
        out = []
        for rep in range(reps):
            barrier.wait(timeout=120)
            cpu0 = {name: cpu_seconds(pid) for name, pid in server_pids.items()}
            rows = [results.get(timeout=seconds + 120) for _ in range(producers)]
            cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in server_pids.items()}
            errors = [r[4] for r in rows if r[4]]
            if errors:
                raise RuntimeError(f"transactional producer failed: {errors[0]}")
            commits = sum(r[2] for r in rows)
            rate = sum(r[2] / r[3] for r in rows if r[3] > 0)
            row = {"producers": producers, "client": client, "seconds": seconds, "commits": commits,
                   "txn_per_s": rate, "client_cpu_ms_per_txn": sum(r[5] for r in rows) * 1000 / max(commits, 1)}
            if server_pids:
                row["server_cpu_ms_per_txn"] = {name: c * 1000 / max(commits, 1) for name, c in cpu.items()}
                row["server_cpu_ms_per_txn"]["total"] = sum(cpu.values()) * 1000 / max(commits, 1)
            out.append(row)
        return out
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
