"""Producer and consumer throughput, like kafka-producer-perf-test / kafka-consumer-perf-test.

    python bench/producer_perf.py [--num-records 200000] [--record-size 1024]
        [--commit-interval-ms 100] [--dir .run/bench | --bootstrap-servers H:P]

In one run, against one partition leader on loopback: records/s, MB/s and send
latency p50/p99 (send() to acknowledgement) for plain (acks=1, no idempotence),
idempotent, and transactional producing (a commit every --commit-interval-ms);
then consumer records/s for read_uncommitted vs read_committed over the
transactional topic. Next to them, in the same run: the plain producer against a
second cluster with TLS, client certificates and the ACL authorizer on;
confluent-kafka (librdkafka)
producing the same records through the Kafka protocol listener (acks=1), and
redis-benchmark's XADD of the same record size into a Redis Stream on loopback (a
C client, pipelined 32 deep; skipped when redis-server is not installed — `make
bench` installs it). Ratios are to the plain SDK producer of the same run. Prints
a table and writes bench/results.json.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from exactly import AdminClient, Consumer, NewTopic, Producer, TopicPartition  # noqa: E402
from exactly_tools.devcluster import DevCluster  # noqa: E402


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def produce_run(bootstrap: str, topic: str, mode: str, n: int, size: int, commit_interval_ms: int,
                security: dict | None = None) -> dict:
    conf = {"bootstrap.servers": bootstrap, **(security or {}), "linger.ms": 5, "batch.size": 262144}
    if mode == "plain":
        conf.update({"enable.idempotence": False, "acks": 1})
    elif mode == "idempotent":
        conf.update({"enable.idempotence": True, "acks": "all"})
    else:
        conf.update({"transactional.id": f"bench-{os.getpid()}-{time.time_ns()}", "acks": "all"})
    producer = Producer(conf)
    payload = os.urandom(size // 2).hex().encode()[:size]
    latencies: list[float] = []
    transactional = mode == "transactional"
    if transactional:
        producer.init_transactions()
        producer.begin_transaction()
    commits = 0
    start = time.perf_counter()
    last_commit = start
    for i in range(n):
        t0 = time.perf_counter()
        fut = producer.send(topic, payload, partition=0)
        fut.add_done_callback(lambda _f, t0=t0: latencies.append(time.perf_counter() - t0))
        if transactional and (i & 255) == 0:
            now = time.perf_counter()
            if (now - last_commit) * 1000 >= commit_interval_ms:
                producer.commit_transaction()
                commits += 1
                producer.begin_transaction()
                last_commit = now
    if transactional:
        producer.commit_transaction()
        commits += 1
    producer.flush()
    elapsed = time.perf_counter() - start
    producer.close()
    latencies.sort()
    return {"mode": mode, "records": n, "seconds": elapsed, "records_per_s": n / elapsed,
            "mb_per_s": n * size / elapsed / 1e6, "p50_ms": percentile(latencies, 0.5) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000, "commits": commits}


def consume_run(bootstrap: str, topic: str, isolation: str, expected: int) -> dict:
    c = Consumer({"bootstrap.servers": bootstrap, "isolation.level": isolation, "enable.auto.commit": False,
                  "max.poll.records": 5000})
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek_to_beginning([tp])
    got = 0
    start = time.perf_counter()
    while got < expected:
        got += len(c.poll(timeout=1.0))
        if time.perf_counter() - start > 300:
            break
    elapsed = time.perf_counter() - start
    c.close()
    return {"isolation.level": isolation, "records": got, "seconds": elapsed, "records_per_s": got / elapsed}


def kafka_produce_run(kafka_bootstrap: str, topic: str, n: int, size: int) -> dict:
    """confluent-kafka (librdkafka) producing `n` records of `size` bytes through the
    Kafka protocol listener, acks=1, no idempotence: records/s from the first send to
    the last delivery report."""
    from confluent_kafka import Producer as KafkaProducer
    p = KafkaProducer({"bootstrap.servers": kafka_bootstrap, "acks": 1, "enable.idempotence": False,
                       "linger.ms": 5, "queue.buffering.max.messages": 1_000_000})
    value = os.urandom(size)
    delivered = [0]

    def done(err, msg):
        if err is None:
            delivered[0] += 1
    start = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value, on_delivery=done)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(300)
    elapsed = time.perf_counter() - start
    return {"client": "confluent-kafka (Kafka port)", "records": delivered[0],
            "records_per_s": delivered[0] / elapsed, "mb_per_s": delivered[0] * size / elapsed / 1e6}


def tls_produce_run(directory: pathlib.Path, n: int, size: int) -> dict:
    """The plain producer against a second dev cluster started with --security (TLS,
    client certificates, authorizer=acl; the admin principal is a super user)."""
    if (directory / "cluster.json").exists():
        DevCluster.load(directory).down()
    secured = DevCluster(directory, security=True)
    secured.up(partition_leaders=1, txn_coordinators=1, group_coordinators=1)
    try:
        conf = dict(secured.client_config)
        topic = f"perf-tls-{time.strftime('%H%M%S')}"
        with AdminClient({"bootstrap.servers": secured.bootstrap_servers, **conf}) as admin:
            admin.create_topics([NewTopic(topic, 1)])
        r = produce_run(secured.bootstrap_servers, topic, "plain", n, size, 0, conf)
    finally:
        secured.down()
    return {"client": "exactly SDK, plain, TLS + authorizer", "records": n, "records_per_s": r["records_per_s"],
            "mb_per_s": r["mb_per_s"]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_xadd_run(n: int, size: int, work_dir: pathlib.Path) -> dict | None:
    """redis-benchmark XADD of `size`-byte values into one stream of a redis-server on
    loopback, pipelined 32 deep; None when Redis is not installed."""
    if not (shutil.which("redis-server") and shutil.which("redis-benchmark")):
        return None
    port = _free_port()
    work_dir.mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", str(work_dir)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        out = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-n", str(n), "-P", "32",
                              "-c", "1", "--csv", "XADD", "bench", "*", "f", "x" * size],
                             capture_output=True, text=True, timeout=600, check=True).stdout
        rps = float([line for line in out.splitlines() if line.startswith('"XADD')][-1].split(",")[1].strip('"'))
    finally:
        server.terminate()
        server.wait(timeout=30)
    return {"client": "redis-benchmark XADD (C, pipelined 32)", "records": n, "records_per_s": rps,
            "mb_per_s": rps * size / 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-records", type=int, default=200_000)
    parser.add_argument("--record-size", type=int, default=1024, help="bytes")
    parser.add_argument("--commit-interval-ms", type=int, default=100)
    parser.add_argument("--dir", type=pathlib.Path, default=pathlib.Path(".run/bench"))
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--kafka-bootstrap-servers", help="with --bootstrap-servers: the Kafka protocol listeners")
    parser.add_argument("--output", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parent / "results.json")
    args = parser.parse_args(argv)
    cluster = None
    if args.bootstrap_servers:
        bootstrap = args.bootstrap_servers
        kafka_bootstrap = args.kafka_bootstrap_servers
    else:
        if (args.dir / "cluster.json").exists():
            DevCluster.load(args.dir).down()
        cluster = DevCluster(args.dir.resolve())
        print(f"starting a dev cluster in {args.dir} (1 partition leader)", flush=True)
        cluster.up(partition_leaders=1, txn_coordinators=1, group_coordinators=1)
        bootstrap = cluster.bootstrap_servers
        kafka_bootstrap = cluster.kafka_bootstrap_servers
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        run_id = time.strftime("%H%M%S")
        topics = {m: f"perf-{m}-{run_id}" for m in ("plain", "idempotent", "transactional", "kafka")}
        admin.create_topics([NewTopic(t, 1) for t in topics.values()])
        admin.close()
        results = {"num_records": args.num_records, "record_size": args.record_size,
                   "commit_interval_ms": args.commit_interval_ms, "producer": [], "consumer": []}
        results["peers"] = []
        for mode, topic in topics.items():
            if mode == "kafka":
                if kafka_bootstrap:
                    print(f"producing {args.num_records:,} x {args.record_size} B (confluent-kafka through the "
                          "Kafka port) ...", flush=True)
                    results["peers"].append(kafka_produce_run(kafka_bootstrap, topic, args.num_records,
                                                              args.record_size))
                continue
            print(f"producing {args.num_records:,} x {args.record_size} B ({mode}) ...", flush=True)
            results["producer"].append(produce_run(bootstrap, topic, mode, args.num_records, args.record_size,
                                                   args.commit_interval_ms))
        if cluster is not None:
            print(f"producing {args.num_records:,} x {args.record_size} B (plain, over TLS with a client "
                  "certificate and the ACL authorizer on) ...", flush=True)
            results["peers"].append(tls_produce_run(args.dir.resolve() / "tls", args.num_records, args.record_size))
        print(f"redis-benchmark XADD {args.num_records:,} x {args.record_size} B ...", flush=True)
        redis = redis_xadd_run(args.num_records, args.record_size, args.dir.resolve() / "redis")
        if redis is None:
            print("  (redis-server / redis-benchmark not installed: skipped)", flush=True)
        else:
            results["peers"].append(redis)
        for iso in ("read_uncommitted", "read_committed"):
            print(f"consuming ({iso}) ...", flush=True)
            results["consumer"].append(consume_run(bootstrap, topics["transactional"], iso, args.num_records))
    finally:
        if cluster is not None:
            cluster.down()
    print()
    print(f"{'producer':14} {'records/s':>11} {'MB/s':>8} {'p50 ms':>9} {'p99 ms':>9} {'commits':>8}")
    for r in results["producer"]:
        print(f"{r['mode']:14} {r['records_per_s']:>11,.0f} {r['mb_per_s']:>8.1f} {r['p50_ms']:>9.1f} "
              f"{r['p99_ms']:>9.1f} {r['commits']:>8}")
    base = results["producer"][0]["records_per_s"]
    print(f"\n{'same records, other clients':40} {'records/s':>11} {'MB/s':>8} {'x plain SDK':>12}")
    for r in results["peers"]:
        r["ratio_to_plain_sdk"] = r["records_per_s"] / base
        print(f"{r['client']:40} {r['records_per_s']:>11,.0f} {r['mb_per_s']:>8.1f} {r['ratio_to_plain_sdk']:>12.2f}")
    print(f"\n{'consumer':18} {'records/s':>11} {'records':>9}")
    for r in results["consumer"]:
        print(f"{r['isolation.level']:18} {r['records_per_s']:>11,.0f} {r['records']:>9,}")
    args.output.write_text(json.dumps(results, indent=2))
    print(f"\nwritten to {args.output}")
    ok = all(r["records"] == args.num_records for r in results["consumer"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
