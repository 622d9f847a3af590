"""`python -m bench --quick` (what `make bench` runs, at small sizes) completes and
writes every figure of the performance table: present, finite and positive; and its
side-by-side phase (bench/against.py, `python -m bench.server_cost --against`) installs
the yardstick commit, measures a cluster of it and one of the current tree in
alternating windows, and prints the ratio table."""
from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import pytest

from bench import against

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
# The side-by-side phase's figures: base, head and ratio finite and positive.
AGAINST = ["server_cpu.librdkafka", "server_cpu.sdk", "txn_per_s.librdkafka", "txn_per_s.sdk",
           "client_cpu.librdkafka", "client_cpu.sdk", "commit_p50.librdkafka", "commit_p50.sdk", "lone.p50", "lone.p99",
           "produce.plain", "produce.txn_100ms", "produce.txn_10ms", "produce.txn_100ms_vs_plain",
           "produce.txn_10ms_vs_plain",
           *(f"server_cpu.{c}.{role}" for c in ("librdkafka", "sdk")
             for role in ("partition_leader", "txn_coordinator"))]
THROUGHPUTS = ["produce.txn_100ms", "produce.txn_10ms", "consume.read_committed", "consume.read_uncommitted",
               "redis.xadd", "redis.xread", "peer.librdkafka", "peer.tls"]


@pytest.mark.timeout(660)
def test_quick_bench_writes_every_figure(tmp_path):
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(out), "--dir", str(tmp_path / "work")],
                          cwd=ROOT, capture_output=True, text=True, timeout=640)
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
    # The machine's cost of a new page of memory, at both ends of the run and of the side-by-side phase.
    for machine in (body["meta"]["machine"], body["details"]["against"]["machine"]):
        assert all(0 < machine[k] < 1000 for k in ("page_touch_us_start", "page_touch_us_end")), machine
    assert proc.stdout.count("a new page of memory written in") == 2, proc.stdout[-2000:]
    side = body["details"]["against"]
    assert side["against"] == against.YARDSTICK and side["commits"]["base"] == against.YARDSTICK[:7], side["commits"]
    for key in AGAINST:
        row = side["figures"][key]
        assert all(math.isfinite(row[k]) and row[k] > 0 for k in ("base", "head", "ratio")), (key, row)
        assert row["ratio"] == pytest.approx(row["head"] / row["base"]), (key, row)
    assert all(w["commits"] > 0 for s in ("base", "head") for c in ("librdkafka", "sdk")
               for w in side["windows"][s][f"load.{c}"])
    # One progress line per phase on stderr, the tables on stdout.
    phases = [line for line in proc.stderr.splitlines() if line.startswith("bench [")]
    assert len(phases) == int(phases[0].split("/", 1)[1].split("]", 1)[0]) == 14, proc.stderr
    assert "goals met" in proc.stdout
    ratio_table = proc.stdout.split(f"Side by side with {against.YARDSTICK}:", 1)[1]
    assert "server CPU per txn, 2 SDK producers over gRPC" in ratio_table and "ratio" in ratio_table
