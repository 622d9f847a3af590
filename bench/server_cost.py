"""Server CPU per committed transaction, measured on its own for profiling, or side by
side with an earlier commit.

    python -m bench.server_cost [--client sdk|librdkafka|both] [--producers 8] [--seconds 10]
                                [--reps 3] [--profile DIR [--profile-format raw]] [--dir .run/bench-cost] [--json]
    python -m bench.server_cost --compare-event-loops [--client ...] [--reps 3] ...
    python -m bench.server_cost --against COMMIT [--reps 3] [--seconds 10] [--producers 8]
                                [--latency-transactions 500] [--records 50000] [--quick] [--out FILE] [--json]

One dev cluster (1 partition leader, 1 transaction and 1 group coordinator, RF 1), a
3-partition topic, `--producers` processes committing 1-record transactions; per window
the committed transactions/s and the CPU ms per transaction of the partition leader, the
transaction coordinator and the group coordinator (from /proc) and of the clients.
`--profile DIR` records py-spy flame graphs of the services during an extra window.
`make bench` runs the same measurement (bench/suite.py); this entry point is for
profiling one figure quickly.

`--against COMMIT` compares the current tree with COMMIT in alternating windows on two
clusters at once, `--reps` rounds, and prints the ratio table (bench/against.py: server
and client CPU per transaction, txn/s and commit p50 under load with librdkafka and with
the SDK, a lone SDK producer's commit p50 / p99, transactional against plain producing).
`--quick`: one short round, for the smoke test.

`--event-loop asyncio|uvloop` sets the services' exactly.event.loop (default: the
services' default, uvloop). `--compare-event-loops` measures both loops in alternating
windows, each on a fresh cluster (asyncio, uvloop, asyncio, ...), and prints the
ratio uvloop / asyncio of the server CPU per transaction (medians over the windows).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

from . import against, transactions
from .common import create_topic, median, start_cluster


def server_pids(cluster) -> dict[str, int]:
    """{"partition_leader": pid, "txn_coordinator": pid, "group_coordinator": pid} of a
    one-leader dev cluster."""
    return {svc.role: svc.pid for svc in cluster.services.values()}


def measure(cluster, client: str, producers: int, reps: int, seconds: float, topic: str) -> list[dict]:
    bootstrap = cluster.kafka_bootstrap_servers if client == "librdkafka" else cluster.bootstrap_servers
    return transactions.coordinator_throughput(bootstrap, topic, 3, producers, reps, seconds, client=client,
                                               server_pids=server_pids(cluster))


def summary(rows: list[dict]) -> dict:
    """Medians over the windows: txn/s, server CPU ms per txn (each service and total), client CPU ms."""
    out = {"txn_per_s": median([r["txn_per_s"] for r in rows]),
           "client_cpu_ms_per_txn": median([r["client_cpu_ms_per_txn"] for r in rows])}
    for name in rows[0]["server_cpu_ms_per_txn"]:
        out[f"server_cpu_ms_per_txn.{name}"] = median([r["server_cpu_ms_per_txn"][name] for r in rows])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.server_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", choices=["sdk", "librdkafka", "both"], default="both")
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", type=pathlib.Path, default=pathlib.Path(".run/bench-cost"))
    parser.add_argument("--profile", type=pathlib.Path, metavar="DIR")
    parser.add_argument("--profile-format", choices=["flamegraph", "raw", "speedscope"], default="flamegraph",
                        help="py-spy's output format (raw: folded stacks, one line per stack)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--event-loop", choices=["uvloop", "asyncio"],
                        help="the services' exactly.event.loop (default: theirs, uvloop)")
    parser.add_argument("--compare-event-loops", action="store_true",
                        help="alternate windows on asyncio and on uvloop; print the ratio of server CPU per txn")
    parser.add_argument("--against", metavar="COMMIT",
                        help=f"compare with COMMIT side by side (make bench: {against.YARDSTICK}); --reps rounds")
    parser.add_argument("--latency-transactions", type=int, default=against.Sizes.latency_transactions,
                        help="--against: transactions of the lone producer per round")
    parser.add_argument("--records", type=int, default=against.Sizes.records,
                        help="--against: records per produce run")
    parser.add_argument("--quick", action="store_true", help="--against: one short round (the smoke test)")
    parser.add_argument("--out", type=pathlib.Path, help="--against: also write the results (JSON) here")
    parser.add_argument("--head-set", action="append", default=[], metavar="KEY=VALUE",
                        help="--against: a setting of the head cluster's services only (repeatable), e.g. "
                             "unstable.feature.versions.enable=true")
    args = parser.parse_args(argv)
    if args.compare_event_loops:
        return compare_event_loops(args)
    if args.against:
        return compare_with_commit(args)
    cluster = start_cluster(args.dir.resolve(), props=_loop_props(args.event_loop))
    results = {}
    try:
        clients = _clients(args.client)
        for i, client in enumerate(clients):
            topic = f"bench-cost-{i}"
            create_topic(cluster, topic, 3)
            rows = measure(cluster, client, args.producers, args.reps, args.seconds, topic)
            results[client] = {"windows": rows, **summary(rows)}
            if args.profile:
                from .profiling import PySpy
                spy = PySpy(args.profile / client, server_pids(cluster), prefix=f"cost-{client}",
                            fmt=args.profile_format)
                try:
                    measure(cluster, client, args.producers, 1, args.seconds, topic)
                finally:
                    results[client]["profiles"] = spy.stop()
            if not args.json:
                s = results[client]
                print(f"{client:>10}: {s['txn_per_s']:7.0f} txn/s  server CPU/txn "
                      f"{s['server_cpu_ms_per_txn.total']:.2f} ms (leader "
                      f"{s['server_cpu_ms_per_txn.partition_leader']:.2f} + coordinator "
                      f"{s['server_cpu_ms_per_txn.txn_coordinator']:.2f} + group coordinator "
                      f"{s['server_cpu_ms_per_txn.group_coordinator']:.2f})  client CPU/txn "
                      f"{s['client_cpu_ms_per_txn']:.2f} ms", file=sys.stderr, flush=True)
    finally:
        cluster.down()
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


def _clients(choice: str) -> list[str]:
    return ["librdkafka", "sdk"] if choice == "both" else [choice]


def _loop_props(event_loop: str | None) -> dict[str, str]:
    return {"exactly.event.loop": event_loop} if event_loop else {}


def compare_with_commit(args) -> int:
    """`--against COMMIT`: bench/against.py's run with these sizes; prints the ratio
    table (or with --json the results) and writes them to --out."""
    sizes = against.QUICK if args.quick else against.Sizes(
        rounds=args.reps, producers=args.producers, seconds=args.seconds,
        latency_transactions=args.latency_transactions, records=args.records)
    head_props = {}
    for item in args.head_set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--head-set {item!r}: expected KEY=VALUE")
        head_props[key.strip()] = value.strip()
    result = against.run(args.against, args.dir.resolve() / "against", sizes, head_props=head_props)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2) if args.json else against.table(result))
    return 0


def compare_event_loops(args) -> int:
    """`--reps` rounds; per round and client, one window of `--seconds` on a fresh
    cluster with each event loop (asyncio first). Prints (or with --json returns) the
    medians per loop and the ratio uvloop / asyncio of the server CPU per transaction."""
    clients = _clients(args.client)
    loops = ("asyncio", "uvloop")
    rows: dict[tuple[str, str], list[dict]] = {(c, lp): [] for c in clients for lp in loops}
    for rep in range(args.reps):
        for event_loop in loops:
            cluster = start_cluster(args.dir.resolve(), props=_loop_props(event_loop))
            try:
                for i, client in enumerate(clients):
                    topic = f"bench-cost-{i}"
                    create_topic(cluster, topic, 3)
                    window = measure(cluster, client, args.producers, 1, args.seconds, topic)
                    rows[(client, event_loop)].extend(window)
                    w = window[0]
                    print(f"round {rep + 1}/{args.reps} {event_loop:>7} {client:>10}: {w['txn_per_s']:6.0f} txn/s  "
                          f"server CPU/txn {w['server_cpu_ms_per_txn']['total']:.2f} ms", file=sys.stderr, flush=True)
            finally:
                cluster.down()
    results = {}
    for client in clients:
        per_loop = {lp: summary(rows[(client, lp)]) for lp in loops}
        ratio = (per_loop["uvloop"]["server_cpu_ms_per_txn.total"]
                 / per_loop["asyncio"]["server_cpu_ms_per_txn.total"])
        results[client] = {**per_loop, "server_cpu_ratio_uvloop_to_asyncio": ratio}
        if not args.json:
            print(f"{client:>10}: server CPU/txn asyncio {per_loop['asyncio']['server_cpu_ms_per_txn.total']:.2f} ms, "
                  f"uvloop {per_loop['uvloop']['server_cpu_ms_per_txn.total']:.2f} ms: {ratio:.2f} x; txn/s "
                  f"{per_loop['asyncio']['txn_per_s']:.0f} -> {per_loop['uvloop']['txn_per_s']:.0f}")
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
