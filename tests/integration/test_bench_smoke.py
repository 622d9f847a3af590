"""`python -m bench --quick` (what `make bench` runs, at small sizes) completes and
writes every figure of the performance table: present, finite and positive."""
from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

FIGURES = [
    "produce.plain", "produce.idempotent", "produce.flush_messages_1", "produce.flush_messages_1_ratio",
    "produce.txn_100ms", "produce.txn_10ms",
    "commit_3p.p50", "commit_3p.p99", "coordinator.rf1", "coordinator.rf1_librdkafka", "coordinator.rf3",
    "server_cpu.librdkafka", "server_cpu.sdk", "client_cpu.librdkafka", "client_cpu.sdk",
    "consume.read_committed", "consume.read_uncommitted",
    "redis.xadd", "redis.multi_exec", "redis.xread", "vs_redis.produce", "vs_redis.read_committed",
    *(f"restart.{f}_{size}" for size in ("small", "large")
      for f in ("snapshot", "scan", "ratio", "open_snapshot", "open_scan", "open_ratio")),
    "restart.snapshot_growth", "restart.snapshot_cpu_growth", "restart.scan_growth",
    "txn_load.loaded", "txn_load.bytes_per_id", "peer.librdkafka", "peer.tls",
    "floor.unary", "floor.stream", "floor.tcp", "floor.sdk_commit_p50_ms", "floor.librdkafka_server_cpu_ms_per_txn",
    "floor.sdk_server_cpu_ms_per_txn", "floor.sdk_client_cpu_ms_per_txn", "floor.unary_calls_per_s",
]
GOALS = ["produce.txn_100ms", "produce.txn_10ms", "commit_3p.p99", "coordinator.rf1_librdkafka", "coordinator.rf3",
         "server_cpu.librdkafka", "server_cpu.sdk", "client_cpu.sdk",
         "vs_redis.produce", "vs_redis.read_committed", "restart.snapshot_growth", "restart.open_ratio_large",
         "txn_load.bytes_per_id"]
THROUGHPUTS = ["produce.txn_100ms", "produce.txn_10ms", "consume.read_committed", "consume.read_uncommitted",
               "redis.xadd", "redis.xread", "peer.librdkafka", "peer.tls"]


@pytest.mark.timeout(420)
def test_quick_bench_writes_every_figure(tmp_path):
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(out), "--dir", str(tmp_path / "work")],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    body = json.loads(out.read_text())
    figures = body["figures"]
    for key in FIGURES:
        row = figures[key]
        assert len(row["reps"]) >= 1 and math.isfinite(row["value"]) and row["value"] > 0, (key, row)
        assert all(math.isfinite(v) and v > 0 for v in row["reps"]), (key, row)
    for key in ("produce.plain", "commit_3p.p99", "restart.snapshot_small", "restart.snapshot_large", "txn_load.loaded",
                "coordinator.rf3"):
        assert len(figures[key]["reps"]) == 3, key
    for key in GOALS:
        assert figures[key]["goal"] and isinstance(figures[key]["pass"], bool), key
    for key in THROUGHPUTS:
        assert math.isfinite(figures[key]["ratio_to_plain"]) and figures[key]["ratio_to_plain"] > 0, key
    assert body["meta"]["quick"] is True and body["meta"]["machine"]["cpus"] >= 1
    # One progress line per phase on stderr, the table on stdout.
    phases = [line for line in proc.stderr.splitlines() if line.startswith("bench [")]
    assert len(phases) == int(phases[0].split("/", 1)[1].split("]", 1)[0]) == 13, proc.stderr
    assert "goals met" in proc.stdout
