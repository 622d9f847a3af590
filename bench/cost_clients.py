"""The client side of the side-by-side measurement (bench/against.py), one process per
client, run by the interpreter of the installation measured: the current tree's, or the
virtualenv of the commit it is compared with (exactly_tools.releases). So each cluster is
driven by its own SDK, and the SDK's CPU is compared as well as the services'.

    python -m bench.cost_clients load --client sdk|librdkafka --bootstrap B --topic T
                                      --partitions 3 --transactional-id ID --seconds S
    python -m bench.cost_clients latency --bootstrap B --topic T --partitions 3 --transactions N
    python -m bench.cost_clients produce --bootstrap B --topic T --mode plain|transactional
                                         [--commit-interval-ms MS] --records N --record-size BYTES

`load`: one transactional producer committing 1-record transactions; it initializes,
commits 3 warm-up transactions, prints `ready`, waits for a line on stdin (the window's
start, given to every producer of the window at once), commits for `--seconds`, and
prints one JSON line: {"commits", "seconds", "cpu_s" (its own process CPU over the
window), "latencies_ms" (begin to commit returned, per transaction), "pid", "threads"
(bench.common.thread_cpu at the window's start and end)}. `latency` and
`produce` print one JSON line with bench.transactions.commit_latency_run's and
bench.producer_perf.produce_run's result. Only the SDK, confluent-kafka and the standard
library are imported besides, so the module runs against any version of the SDK that has
those calls.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def _load(args: argparse.Namespace) -> None:
    import os

    from .common import thread_cpu
    from .transactions import CLIENTS
    client = CLIENTS[args.client](args.bootstrap, args.transactional_id)
    value = b"x" * 16
    partition = args.partition % args.partitions
    for _ in range(3):
        client.transaction(args.topic, value, partition)
    print("ready", flush=True)
    if not sys.stdin.readline():
        return  # the parent went away before the window
    latencies: list[float] = []
    threads0 = thread_cpu()
    cpu0 = time.process_time()
    start = time.perf_counter()
    deadline = start + args.seconds
    now = start
    while now < deadline:
        client.transaction(args.topic, value, partition)
        t = time.perf_counter()
        latencies.append((t - now) * 1000)
        now = t
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    threads1 = thread_cpu()
    print(json.dumps({"commits": len(latencies), "seconds": elapsed, "cpu_s": cpu,
                      "latencies_ms": [round(v, 3) for v in latencies], "pid": os.getpid(),
                      "threads": [threads0, threads1]}), flush=True)
    client.close()


def _latency(args: argparse.Namespace) -> None:
    from .transactions import commit_latency_run
    print(json.dumps(commit_latency_run(args.bootstrap, args.topic, args.partitions, args.transactions)), flush=True)


def _produce(args: argparse.Namespace) -> None:
    from .producer_perf import produce_run
    print(json.dumps(produce_run(args.bootstrap, args.topic, args.mode, args.records, args.record_size,
                                 args.commit_interval_ms)), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cost_clients", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    load = sub.add_parser("load")
    load.add_argument("--client", choices=["sdk", "librdkafka"], required=True)
    load.add_argument("--transactional-id", required=True)
    load.add_argument("--partition", type=int, default=0)
    load.add_argument("--seconds", type=float, required=True)
    latency = sub.add_parser("latency")
    latency.add_argument("--transactions", type=int, required=True)
    produce = sub.add_parser("produce")
    produce.add_argument("--mode", choices=["plain", "transactional"], required=True)
    produce.add_argument("--commit-interval-ms", type=int, default=0)
    produce.add_argument("--records", type=int, required=True)
    produce.add_argument("--record-size", type=int, default=1024)
    for p in (load, latency, produce):
        p.add_argument("--bootstrap", required=True)
        p.add_argument("--topic", required=True)
        p.add_argument("--partitions", type=int, default=1)
    args = parser.parse_args(argv)
    {"load": _load, "latency": _latency, "produce": _produce}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
