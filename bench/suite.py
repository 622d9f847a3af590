"""`make bench`: every figure of the performance table in one run.

    python -m bench [--quick] [--out .run/bench/results.json] [--dir .run/bench]
                    [--profile DIR] [--reps 3] [size options, see --help]

Starts its own dev clusters (exactly_tools.devcluster) on loopback and a private
redis-server, measures each figure as the median of --reps repetitions, prints a
table with the goals and a pass/fail column, and writes every figure (with its
repetitions) to --out. One progress line per phase goes to stderr.

The last phase compares the current tree with an earlier commit (--against, by default
bench/against.py's YARDSTICK) side by side, in alternating windows on two clusters at
once, and prints its ratio table after the figures.

Clusters: "main" (1 partition leader, 1 transaction and 1 group coordinator):
producers, commit latency, coordinator throughput at replication factor 1,
consumers, librdkafka; "rf3" (3 partition leaders, the topic and the internal
topics replicated 3 times, min.insync.replicas 2): coordinator throughput at
replication factor 3; "tls" (TLS, client certificates, ACL authorizer): the plain
producer again; "restart" and "txn-load" (1 partition leader each): the
recovery figures (bench/recovery.py).
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import pathlib
import subprocess
import sys
import time

from exactly_tools.devcluster import DevCluster, replication_props

from . import against, producer_perf, recovery, redis_peer, server_cost, transactions, transport_floor
from .common import Progress, create_topic, machine_conditions, machine_end, machine_info, median, start_cluster

FULL = {"num_records": 200_000, "latency_transactions": 1000, "coordinator_seconds": 10.0,
        "redis_transactions": 20_000, "restart_batches": [1_000_000, 10_000_000], "restart_producers": 10_000,
        "transactional_ids": 100_000, "floor_calls": 2000}
QUICK = {"num_records": 3_000, "latency_transactions": 50, "coordinator_seconds": 1.0,
         "redis_transactions": 500, "restart_batches": [20_000, 200_000], "restart_producers": 200,
         # enough ids that the coordinator's growth (~0.8 KB each) stands out of the
         # RSS noise between two processes (a few tens of KB either way)
         "transactional_ids": 20_000, "floor_calls": 300}


class Figures:
    """The figures of one run: key -> {label, value, unit, reps, ratio?, goal?, pass?}."""

    def __init__(self):
        self.rows: dict[str, dict] = {}

    def add(self, key: str, label: str, reps: list[float], unit: str, **extra) -> dict:
        row = {"label": label, "value": median(reps), "unit": unit, "reps": reps, **extra}
        self.rows[key] = row
        return row

    def value(self, key: str) -> float:
        return self.rows[key]["value"]

    def ratio(self, key: str, base_key: str) -> None:
        self.rows[key]["ratio_to_plain" if base_key == "produce.plain" else "ratio_to"] = \
            self.value(key) / self.value(base_key)
        if base_key != "produce.plain":
            self.rows[key]["ratio_base"] = base_key

    def goal(self, key: str, text: str, passed: bool) -> None:
        self.rows[key]["goal"] = text
        self.rows[key]["pass"] = bool(passed)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(".run/bench/results.json"))
    parser.add_argument("--dir", type=pathlib.Path, default=pathlib.Path(".run/bench"),
                        help="working directory of the clusters and redis-server")
    parser.add_argument("--profile", type=pathlib.Path, metavar="DIR",
                        help="py-spy flame graphs of the producer, a partition leader and the transaction "
                             "coordinator during an extra 10 ms-commit transactional run")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per figure (the median is reported)")
    parser.add_argument("--record-size", type=int, default=1024, help="bytes per record (produce, XADD)")
    parser.add_argument("--num-records", type=int, help=f"records per produce/consume/XADD run "
                                                        f"(default {FULL['num_records']:,})")
    parser.add_argument("--latency-transactions", type=int, help="3-partition transactions timed per repetition")
    parser.add_argument("--coordinator-producers", type=int, default=8)
    parser.add_argument("--coordinator-seconds", type=float, help="seconds per coordinator-throughput window")
    parser.add_argument("--redis-transactions", type=int, help="MULTI/EXEC transactions per repetition")
    parser.add_argument("--redis-pipeline", type=int, default=500, help="XADD pipeline depth")
    parser.add_argument("--redis-read-batch", type=int, default=1000, help="XREAD COUNT")
    parser.add_argument("--restart-batches", type=int, nargs=2, metavar=("SMALL", "LARGE"),
                        help="one-record batches in the restarted partition, the two sizes compared "
                             f"(default {FULL['restart_batches'][0]:,} and {FULL['restart_batches'][1]:,})")
    parser.add_argument("--restart-producers", type=int, help="producer ids writing them")
    parser.add_argument("--transactional-ids", type=int, help="transactional ids loaded by the coordinator")
    parser.add_argument("--floor-calls", type=int, help="round trips per transport-floor measurement "
                                                        "(bench/transport_floor.py)")
    parser.add_argument("--against", default=against.YARDSTICK, metavar="COMMIT",
                        help=f"the commit of the side-by-side phase (default {against.YARDSTICK}; none: skip it)")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except OSError:
        return ""


def run(args: argparse.Namespace) -> dict:
    work = args.dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    n, size, reps = args.num_records, args.record_size, args.reps
    fig = Figures()
    extra: dict = {}
    side_by_side = args.against.lower() != "none"
    progress = Progress(13 + (1 if args.profile else 0) + (1 if side_by_side else 0))
    clusters: list[DevCluster] = []

    def cluster(name: str, leaders: int = 1, props: dict | None = None, security: bool = False) -> DevCluster:
        c = start_cluster(work / name, leaders, props, security)
        clusters.append(c)
        return c

    def down(c: DevCluster) -> None:
        c.down()
        clusters.remove(c)

    try:
        # ---- 0: the transport's floor (bench/transport_floor.py), on a quiet machine
        # --quick: one short repetition (the smoke test runs beside other tests, and this
        # phase keeps both cores busy while it runs).
        floor_reps = 1 if args.quick else reps
        progress.start(f"transport floor: empty-handler round trips (unary gRPC, gRPC stream, TCP), "
                       f"{args.floor_calls:,} x {floor_reps}")
        tf = transport_floor.run(args.floor_calls, reps=floor_reps, min_s=0.3 if args.quick else 1.0)
        for kind, label in (("unary", "unary gRPC call (grpcio blocking client, as the SDK)"),
                            ("stream", "gRPC stream round trip (grpc.aio, as between the services)"),
                            ("tcp", "TCP frame round trip (asyncio, as the Kafka port)")):
            fig.add(f"floor.{kind}", f"transport floor: {label}, empty handler, p50",
                    [r[kind]["p50_ms"] for r in tf["runs"]], "ms",
                    **{k: v for k, v in tf[kind].items() if k != "p50_ms"})
        bounds = (("sdk_commit_p50_ms", "SDK commit latency p50 (2 unary calls + 3 stream round trips in "
                                        "sequence)", "ms"),
                  ("sdk_client_cpu_ms_per_txn", "SDK producer's CPU per txn (its 2 unary calls)", "ms"),
                  ("sdk_server_cpu_ms_per_txn", "services' CPU per SDK txn (its 2 unary calls)", "ms"),
                  ("librdkafka_server_cpu_ms_per_txn", "services' CPU per librdkafka txn (its 3 Kafka requests)",
                   "ms"),
                  ("unary_calls_per_s", "unary gRPC calls/s, 2 processes x 128 in flight (InitProducerId is one "
                                        "per id)", "calls/s"))
        for key, label, unit in bounds:
            fig.add(f"floor.{key}", f"transport floor of the {label}",
                    [transport_floor.floors(r)[key] for r in tf["runs"]], unit)
        extra["transport_floor"] = tf
        progress.done(f"unary {fig.value('floor.unary'):.2f} ms, stream {fig.value('floor.stream'):.2f} ms, "
                      f"TCP {fig.value('floor.tcp'):.2f} ms")

        progress.start("main cluster: 1 partition leader, 1 transaction and 1 group coordinator")
        main = cluster("main")
        bootstrap = main.bootstrap_servers
        progress.done(bootstrap)

        # ---- 1, 2: producers
        progress.start(f"produce {n:,} x {size} B: plain, idempotent, idempotent with flush.messages=1, "
                       f"transactional (commit every 100 ms, 10 ms) x {reps}, interleaved")
        modes = [("plain", "plain", 0), ("idempotent", "idempotent", 0), ("flush_messages_1", "idempotent", 0),
                 ("txn_100ms", "transactional", 100), ("txn_10ms", "transactional", 10)]
        runs: dict[str, list[dict]] = {m[0]: [] for m in modes}
        for rep in range(reps):
            for key, mode, interval in modes:
                topic = f"bench-{key.replace('_', '-')}-{rep}"
                # flush.messages=1: every append fsynced before it is acknowledged (durability
                # of RF 1 against power loss; docs/operating/failures.md, "Disk faults and durability").
                create_topic(main, topic, configs={"flush.messages": "1"} if key == "flush_messages_1" else None)
                runs[key].append(producer_perf.produce_run(bootstrap, topic, mode, n, size, interval))
        labels = {"plain": "plain produce (acks=1), 1 SDK producer, 1 KB records",
                  "idempotent": "idempotent produce (acks=all)",
                  "flush_messages_1": "idempotent produce, topic flush.messages=1 (fsync every append)",
                  "txn_100ms": "transactional produce, commit every 100 ms",
                  "txn_10ms": "transactional produce, commit every 10 ms"}
        for key, _, _ in modes:
            fig.add(f"produce.{key}", labels[key], [r["records_per_s"] for r in runs[key]], "records/s",
                    p50_send_ms=median([r["p50_ms"] for r in runs[key]]),
                    p99_send_ms=median([r["p99_ms"] for r in runs[key]]),
                    commits=median([r["commits"] for r in runs[key]]))
            fig.ratio(f"produce.{key}", "produce.plain")
        # The cost of flush.messages=1 against the default (never fsync on append), same run.
        fig.ratio("produce.flush_messages_1", "produce.idempotent")
        fig.add("produce.flush_messages_1_ratio", "flush.messages=1 / default, idempotent produce (per rep)",
                [f["records_per_s"] / d["records_per_s"] for f, d in zip(runs["flush_messages_1"], runs["idempotent"])],
                "x")
        fig.goal("produce.txn_100ms", ">= 0.97 x plain", fig.rows["produce.txn_100ms"]["ratio_to_plain"] >= 0.97)
        fig.goal("produce.txn_10ms", ">= 0.70 x plain", fig.rows["produce.txn_10ms"]["ratio_to_plain"] >= 0.70)
        extra["produce_runs"] = runs
        progress.done(", ".join(f"{k} {fig.value('produce.' + k):,.0f}/s" for k, _, _ in modes))

        if args.profile:
            from .profiling import PySpy
            progress.start(f"profile (py-spy) of an extra transactional run, commit every 10 ms -> {args.profile}")
            topic = "bench-profile"
            create_topic(main, topic)
            spy: dict = {}

            def attach() -> None:
                spy["rec"] = PySpy(args.profile.resolve(), {"producer": os.getpid(),
                                                            "partition-leader": main.services["pl-0"].pid,
                                                            "txn-coordinator": main.services["txn-0"].pid})
                time.sleep(1.0)  # py-spy attaches
            try:
                producer_perf.produce_run(bootstrap, topic, "transactional", n, size, 10, on_started=attach)
            finally:
                written = spy["rec"].stop() if "rec" in spy else {}
            extra["profile"] = written
            progress.done(f"{len(written)} flame graphs")

        # ---- 3: commit latency
        progress.start(f"commit latency: 1 record to each of 3 partitions + commit, "
                       f"{args.latency_transactions:,} transactions x {reps}")
        create_topic(main, "bench-latency", 3)
        lat = [transactions.commit_latency_run(bootstrap, "bench-latency", 3, args.latency_transactions)
               for _ in range(reps)]
        fig.add("commit_3p.p50", "3-partition transaction, send + commit, p50", [r["p50_ms"] for r in lat], "ms")
        fig.add("commit_3p.p99", "3-partition transaction, send + commit, p99", [r["p99_ms"] for r in lat], "ms")
        fig.goal("commit_3p.p99", "<= 5 ms", fig.value("commit_3p.p99") <= 5)
        extra["commit_latency_runs"] = lat
        progress.done(f"p50 {fig.value('commit_3p.p50'):.1f} ms, p99 {fig.value('commit_3p.p99'):.1f} ms")

        # ---- 5: consumers (over the last transactional topic, commits every 100 ms)
        progress.start(f"consume {n:,} records (read_uncommitted, read_committed) x {reps}, interleaved")
        topic = f"bench-txn-100ms-{reps - 1}"
        cons: dict[str, list[dict]] = {"read_uncommitted": [], "read_committed": []}
        for _ in range(reps):
            for iso in cons:
                r = producer_perf.consume_run(bootstrap, topic, iso, n)
                if r["records"] != n:
                    raise RuntimeError(f"{iso} consumer read {r['records']} of {n} records")
                cons[iso].append(r)
        for iso, rows in cons.items():
            fig.add(f"consume.{iso}", f"consume, {iso}", [r["records_per_s"] for r in rows], "records/s")
            fig.ratio(f"consume.{iso}", "produce.plain")
        progress.done(", ".join(f"{iso} {fig.value('consume.' + iso):,.0f}/s" for iso in cons))

        # ---- librdkafka through the Kafka listener
        progress.start(f"confluent-kafka (librdkafka) produce {n:,} x {size} B through the Kafka port x {reps}")
        kr = []
        for rep in range(reps):
            topic = f"bench-kafka-{rep}"
            create_topic(main, topic)
            kr.append(producer_perf.kafka_produce_run(main.kafka_bootstrap_servers, topic, n, size))
            if kr[-1]["records"] != n:
                raise RuntimeError(f"librdkafka delivered {kr[-1]['records']} of {n}")
        fig.add("peer.librdkafka", "confluent-kafka (librdkafka) produce, Kafka port, acks=1",
                [r["records_per_s"] for r in kr], "records/s")
        fig.ratio("peer.librdkafka", "produce.plain")
        progress.done(f"{fig.value('peer.librdkafka'):,.0f}/s")

        # ---- 4: coordinator throughput and server CPU per transaction, RF 1
        pcount, secs = args.coordinator_producers, args.coordinator_seconds
        rf1 = {}
        for client, label in (("librdkafka", "librdkafka through the Kafka port"), ("sdk", "the SDK over gRPC")):
            progress.start(f"committed transactions/s and server CPU per transaction, {pcount} {label} producer "
                           f"processes, 1 coordinator, RF 1, {reps} windows of {secs:g} s")
            topic = f"bench-coord-{client}"
            create_topic(main, topic, 3)
            rows = server_cost.measure(main, client, pcount, reps, secs, topic)
            rf1[client] = rows
            key = "coordinator.rf1" if client == "sdk" else f"coordinator.rf1_{client}"
            fig.add(key, f"committed txn/s, {pcount} {'SDK' if client == 'sdk' else client} producers, "
                         f"1-record txns, RF 1", [r["txn_per_s"] for r in rows], "txn/s")
            split = {name: median([r["server_cpu_ms_per_txn"][name] for r in rows])
                     for name in ("partition_leader", "txn_coordinator", "group_coordinator")}
            fig.add(f"server_cpu.{client}", f"server CPU per txn, {client} producers (leader "
                                            f"{split['partition_leader']:.2f} + coordinator "
                                            f"{split['txn_coordinator']:.2f} + group coordinator "
                                            f"{split['group_coordinator']:.2f} ms)",
                    [r["server_cpu_ms_per_txn"]["total"] for r in rows], "ms",
                    partition_leader_ms=split["partition_leader"], txn_coordinator_ms=split["txn_coordinator"],
                    group_coordinator_ms=split["group_coordinator"])
            fig.add(f"client_cpu.{client}", f"client CPU per txn, {client} producers",
                    [r["client_cpu_ms_per_txn"] for r in rows], "ms")
            progress.done(f"{fig.value(key):,.0f} txn/s, server {fig.value(f'server_cpu.{client}'):.2f} ms/txn, "
                          f"client {fig.value(f'client_cpu.{client}'):.2f} ms/txn")
        fig.goal("coordinator.rf1_librdkafka", ">= 1,000 txn/s", fig.value("coordinator.rf1_librdkafka") >= 1000)
        fig.goal("server_cpu.librdkafka", "<= 1.2 ms", fig.value("server_cpu.librdkafka") <= 1.2)
        fig.goal("server_cpu.sdk", "<= 1.6 ms", fig.value("server_cpu.sdk") <= 1.6)
        fig.goal("client_cpu.sdk", "<= 0.8 ms", fig.value("client_cpu.sdk") <= 0.8)
        down(main)

        progress.start(f"committed transactions/s, RF 3 (3 partition leaders, internal topics RF 3, "
                       f"min.insync.replicas 2), {reps} windows of {secs:g} s")
        rf3c = cluster("rf3", 3, replication_props(3))
        create_topic(rf3c, "bench-coord", 3, 3)
        rf3 = transactions.coordinator_throughput(rf3c.bootstrap_servers, "bench-coord", 3, pcount, reps, secs)
        fig.add("coordinator.rf3", f"committed txn/s, {pcount} producers, 1-record txns, RF 3",
                [r["txn_per_s"] for r in rf3], "txn/s")
        fig.goal("coordinator.rf3", ">= 1,000 txn/s", fig.value("coordinator.rf3") >= 1000)
        extra["coordinator_runs"] = {"rf1": rf1, "rf3": rf3}
        down(rf3c)
        progress.done(f"{fig.value('coordinator.rf3'):,.0f} txn/s")

        # ---- TLS
        progress.start(f"plain produce over TLS with client certificates and the ACL authorizer, x {reps}")
        tls = cluster("tls", security=True)
        tr = []
        for rep in range(reps):
            topic = f"bench-tls-{rep}"
            create_topic(tls, topic)
            tr.append(producer_perf.produce_run(tls.bootstrap_servers, topic, "plain", n, size, 0,
                                                dict(tls.client_config)))
        fig.add("peer.tls", "plain produce, TLS + client certificate + ACL authorizer",
                [r["records_per_s"] for r in tr], "records/s")
        fig.ratio("peer.tls", "produce.plain")
        down(tls)
        progress.done(f"{fig.value('peer.tls'):,.0f}/s")

        # ---- 6: Redis Streams
        progress.start(f"Redis Streams from redis-py: XADD (pipelined {args.redis_pipeline}), MULTI/EXEC over "
                       f"2 streams, XREAD (COUNT {args.redis_read_batch}) x {reps}")
        server = redis_peer.RedisServer(work / "redis")
        try:
            xadd, multi, xread, cbench = [], [], [], []
            for _ in range(reps):
                xadd.append(redis_peer.xadd_run(server.client, "bench", n, size, args.redis_pipeline))
                xread.append(redis_peer.xread_run(server.client, "bench", n, args.redis_read_batch))
                multi.append(redis_peer.multi_exec_run(server.client, args.redis_transactions))
                c = redis_peer.redis_benchmark_xadd(server.port, n, size)
                if c is not None:
                    cbench.append(c)
        finally:
            server.stop()
        fig.add("redis.xadd", f"Redis XADD from redis-py, pipelined {args.redis_pipeline}",
                [r["records_per_s"] for r in xadd], "records/s")
        fig.ratio("redis.xadd", "produce.plain")
        fig.add("redis.multi_exec", "Redis MULTI/EXEC (XADD to 2 streams) from redis-py",
                [r["txn_per_s"] for r in multi], "txn/s")
        fig.add("redis.xread", f"Redis XREAD from redis-py, COUNT {args.redis_read_batch}",
                [r["records_per_s"] for r in xread], "records/s")
        fig.ratio("redis.xread", "produce.plain")
        if cbench:
            fig.add("redis.xadd_c", "Redis XADD from redis-benchmark (C), pipelined 32",
                    [r["records_per_s"] for r in cbench], "records/s")
            fig.ratio("redis.xadd_c", "produce.plain")
        fig.add("vs_redis.produce", "plain produce / Redis XADD (redis-py)",
                [fig.value("produce.plain") / fig.value("redis.xadd")], "x")
        fig.goal("vs_redis.produce", ">= 1.2", fig.value("vs_redis.produce") >= 1.2)
        fig.add("vs_redis.read_committed", "read_committed consume / Redis XREAD (redis-py)",
                [fig.value("consume.read_committed") / fig.value("redis.xread")], "x")
        fig.goal("vs_redis.read_committed", ">= 1.05", fig.value("vs_redis.read_committed") >= 1.05)
        progress.done(f"XADD {fig.value('redis.xadd'):,.0f}/s, MULTI/EXEC {fig.value('redis.multi_exec'):,.0f}/s, "
                      f"XREAD {fig.value('redis.xread'):,.0f}/s")

        # ---- 7: partition-leader restart, at two partition sizes
        small, large = sorted(args.restart_batches)
        progress.start(f"partition-leader restart: {small:,} then {large:,} one-record batches from "
                       f"{args.restart_producers:,} producer ids; SIGKILL + start x {reps} with the snapshot, "
                       f"x {reps} without, at each size")
        rc = cluster("restart")
        rs = recovery.leader_restart(rc, [small, large], args.restart_producers, reps)
        down(rc)
        for run in rs["runs"]:
            for case in ("snapshot", "scan"):
                expected = str(run["log_end_offset"]) if case == "snapshot" else "None"
                wrong = [r for r in run[f"restart_{case}"]
                         if r["snapshot_at"] != expected or r["producers_loaded"] != args.restart_producers]
                if wrong:
                    raise RuntimeError(f"restart {case} at {run['batches']:,} batches: the leader loaded {wrong[0]} "
                                       f"(expected snapshot at {expected}, {args.restart_producers} producers)")
        for size, run in zip(("small", "large"), rs["runs"]):
            n = f"{run['batches']:,} batches"
            fig.add(f"restart.snapshot_{size}", f"leader restart to serving, from the producer-state snapshot, {n}",
                    [r["seconds"] for r in run["restart_snapshot"]], "s", batches=run["batches"],
                    cpu_s=median([r["cpu_s"] for r in run["restart_snapshot"]]))
            fig.add(f"restart.scan_{size}", f"leader restart to serving, snapshot removed (full log scan), {n}",
                    [r["seconds"] for r in run["restart_scan"]], "s", batches=run["batches"],
                    cpu_s=median([r["cpu_s"] for r in run["restart_scan"]]))
            fig.add(f"restart.ratio_{size}", f"restart: scan / snapshot, {n}",
                    [fig.value(f"restart.scan_{size}") / fig.value(f"restart.snapshot_{size}")], "x")
            fig.add(f"restart.open_snapshot_{size}", f"Partition.open alone (in-process), from the snapshot, {n}",
                    [s * 1000 for s in run["open_snapshot_s"]], "ms", batches=run["batches"])
            fig.add(f"restart.open_scan_{size}", f"Partition.open alone (in-process), full log scan, {n}",
                    [s * 1000 for s in run["open_scan_s"]], "ms", batches=run["batches"])
            fig.add(f"restart.open_ratio_{size}", f"Partition.open: scan / snapshot, {n}",
                    [fig.value(f"restart.open_scan_{size}") / fig.value(f"restart.open_snapshot_{size}")], "x")
        times = f"{large / small:g} x the batches"
        fig.add("restart.snapshot_growth", f"restart from the snapshot: {large:,} / {small:,} batches ({times})",
                [fig.value("restart.snapshot_large") / fig.value("restart.snapshot_small")], "x")
        fig.goal("restart.snapshot_growth", "<= 1.2", fig.value("restart.snapshot_growth") <= 1.2)
        fig.add("restart.snapshot_cpu_growth", f"restart from the snapshot, the leader's CPU time until serving: "
                                               f"{large:,} / {small:,} batches",
                [fig.rows["restart.snapshot_large"]["cpu_s"] / fig.rows["restart.snapshot_small"]["cpu_s"]], "x")
        fig.add("restart.scan_growth", f"restart with a full log scan: {large:,} / {small:,} batches ({times})",
                [fig.value("restart.scan_large") / fig.value("restart.scan_small")], "x")
        fig.goal("restart.open_ratio_large", ">= 20", fig.value("restart.open_ratio_large") >= 20)
        extra["restart"] = rs
        progress.done(f"snapshot {fig.value('restart.snapshot_small'):.2f} / {fig.value('restart.snapshot_large'):.2f} s "
                      f"(x{fig.value('restart.snapshot_growth'):.2f}), scan {fig.value('restart.scan_small'):.2f} / "
                      f"{fig.value('restart.scan_large'):.2f} s; Partition.open at {large:,}: "
                      f"{fig.value('restart.open_snapshot_large'):.0f} / {fig.value('restart.open_scan_large'):.0f} ms "
                      f"(x{fig.value('restart.open_ratio_large'):.0f})")

        # ---- 8: transaction-coordinator load
        progress.start(f"transaction coordinator: InitProducerId of {args.transactional_ids:,} ids, then SIGKILL + "
                       f"start x {reps}")
        lc = cluster("txn-load")
        ld = recovery.coordinator_load(lc, args.transactional_ids, reps)
        down(lc)
        fig.add("txn_load.loaded", f"coordinator restart until __transaction_state is loaded "
                                   f"({args.transactional_ids:,} ids)", [r["loaded_s"] for r in ld["restarts"]], "s",
                serving_s=median([r["serving_s"] for r in ld["restarts"]]),
                logged_load_ms_max=median([r["logged_load_ms_max"] for r in ld["restarts"]]))
        fig.add("txn_load.bytes_per_id", "coordinator RSS per transactional id",
                [r["bytes_per_id"] for r in ld["restarts"]], "B")
        fig.goal("txn_load.bytes_per_id", "<= 1 KB", fig.value("txn_load.bytes_per_id") <= 1024)
        fig.add("txn_load.init_rate", "InitProducerId rate while creating the ids (raw gRPC, 2 processes)",
                [ld["creation"]["ids_per_s"]], "ids/s")
        fig.goal("txn_load.init_rate", ">= 10,000 ids/s", fig.value("txn_load.init_rate") >= 10_000)
        extra["txn_load"] = ld
        progress.done(f"{fig.value('txn_load.loaded'):.2f} s, {fig.value('txn_load.bytes_per_id'):,.0f} B/id "
                      f"(ids created at {ld['creation']['ids_per_s']:,.0f}/s)")

        # ---- side by side with an earlier commit (bench/against.py)
        if side_by_side:
            sizes = against.QUICK if args.quick else against.Sizes(
                rounds=reps, producers=args.coordinator_producers, seconds=args.coordinator_seconds,
                latency_transactions=args.latency_transactions, records=n, record_size=size)
            progress.start(f"side by side with {args.against}: {sizes.rounds} rounds of alternating windows on a "
                           f"cluster of each")
            print(file=sys.stderr)
            side = against.run(args.against, work / "against", sizes)
            extra["against"] = side
            progress.done(f"server CPU per txn {side['figures']['server_cpu.librdkafka']['ratio']:.2f} x "
                          f"(librdkafka), {side['figures']['server_cpu.sdk']['ratio']:.2f} x (SDK)")
    finally:
        for c in list(clusters):
            try:
                c.down()
            except Exception as exc:  # noqa: BLE001 - keep stopping the others
                print(f"bench: stopping {c.dir} failed: {exc!r}", file=sys.stderr)
    return {"figures": fig.rows, "details": extra}


def table(figures: dict[str, dict]) -> str:
    def fmt(v: float, unit: str) -> str:
        if unit in ("records/s", "txn/s", "ids/s", "calls/s", "B"):
            return f"{v:,.0f} {unit}"
        if unit == "x":
            return f"{v:.2f} x"
        if unit == "ms":
            return f"{v:.2f} ms"
        return f"{v:.2f} {unit}"
    rows = [("figure", "median of reps", "x plain", "goal", "pass")]
    for row in figures.values():
        ratio = row.get("ratio_to_plain")
        passed = row.get("pass")
        rows.append((row["label"], fmt(row["value"], row["unit"]), "" if ratio is None else f"{ratio:.2f}",
                     row.get("goal", ""), "" if passed is None else ("PASS" if passed else "FAIL")))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[j]) if j == 0 or j == 3 else c.rjust(widths[j])
                               for j, c in enumerate(r)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The service classes used in this process (bench/recovery.py) log warnings a
    # restart after SIGKILL makes expected; keep stderr to the progress lines.
    logging.getLogger("services").setLevel(logging.ERROR)
    started = time.time()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": git_commit(), "machine": machine_info(), "quick": args.quick, "reps": args.reps,
            "sizes": {k: getattr(args, k) for k in [*FULL, "record_size", "coordinator_producers",
                                                     "redis_pipeline", "redis_read_batch"]}}
    result = run(args)
    machine_end(meta["machine"])
    meta["seconds"] = round(time.time() - started, 1)
    bad = [k for k, r in result["figures"].items() if not (math.isfinite(r["value"]) and r["value"] > 0)]
    out = {"meta": meta, **result}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str))
    print(table(result["figures"]))
    if "against" in result["details"]:
        print(f"\nSide by side with {args.against}:\n{against.table(result['details']['against'])}")
    goals = [r for r in result["figures"].values() if "pass" in r]
    print(f"\n{sum(r['pass'] for r in goals)} of {len(goals)} goals met; {args.reps} repetitions per figure; "
          f"{meta['machine']['cpus']} CPUs, {machine_conditions(meta['machine'])}; {meta['seconds']:.0f} s")
    print(f"written to {args.out}")
    if bad:
        print(f"bench: figures missing or not positive: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0
