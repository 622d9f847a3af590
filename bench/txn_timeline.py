"""Where a lone transaction's time goes, step by step, across the processes.

    python -m bench.txn_timeline [--transactions 1000] [--partitions 3] [--dir .run/txn-timeline] [--json]

bench/txn_profile.py says where the CPU goes under load; this says where one
producer's commit waits. On a one-leader dev cluster of the current tree (1
partition leader, 1 transaction and 1 group coordinator, RF 1), one SDK producer runs
`--transactions` transactions, each: begin_transaction, one record of 100 bytes to
each of `--partitions` partitions, wait for the acknowledgements, commit_transaction.
Every process of the run (the services and this one) is started with the probe of
bench/timeline_probe on its path, which writes the start and the end of the calls
named in its `PROBES` (the SDK handing a call to its stream; the leader's produce of
a batch, its KIP-890 add, its markers; the coordinator's AddPartitionsToTxn, EndTxn,
transaction-log appends and markers) with the CLOCK_MONOTONIC time, one clock for
every process of the machine. The report lists each event by its median offset from
the client's send (the first `--warmup` transactions left out): the n-th occurrence of
an event within a transaction is its own row, and an event of the previous
transaction's completion (its markers, its CompleteCommit append) shows where it
overlaps the next one's start.

The figures are wall-clock times on a machine shared by the client and the services:
read them as a budget (which crossing, which wait), not as a latency figure
(bench/against.py's lone producer is that).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import statistics
import sys
import time

from exactly import Producer

from .common import create_topic, machine_info, start_cluster

PROBE_DIR = pathlib.Path(__file__).resolve().parent / "timeline_probe"
ENV = "EXACTLY_BENCH_TIMELINE_DIR"
SEND, ACKED, COMMITTED = "client: send", "client: records acknowledged", "client: commit_transaction returned"


def read_events(directory: pathlib.Path) -> list[tuple[int, str, str]]:
    """Every event written under `directory`: (ns, event, process id), sorted by time."""
    out = []
    for path in directory.glob("events-*.log"):
        pid = path.stem.split("-", 1)[1]
        for line in path.read_text().splitlines():
            ns, _, name = line.partition(" ")
            if name:
                out.append((int(ns), name, pid))
    out.sort()
    return out


def timeline(events: list[tuple[int, str, str]], start: str = SEND, skip: int = 0) -> dict:
    """The steps of the transactions in `events` (read_events): each transaction runs
    from one `start` event to the next (the first `skip` left out). Returns
    {"transactions": n, "cycle_ms": {p50, p90}, "steps": [{"event", "count", "p50_ms",
    "p90_ms"}, ...]} with offsets (ms) from the transaction's `start`, in the order of
    their medians; the n-th occurrence of an event in a transaction is named
    "<event> #n" from the second one on. Steps seen in fewer than half the
    transactions are left out (a periodic task's)."""
    cycles: list[list[tuple[int, str]]] = []
    for ns, name, _ in events:
        if name == start:
            cycles.append([(ns, name)])
        elif cycles:
            cycles[-1].append((ns, name))
    if len(cycles) > 1:
        cycles = cycles[:-1]  # the last one may be cut short by the end of the run
    cycles = cycles[skip:]
    offsets: dict[str, list[float]] = collections.defaultdict(list)
    lengths = []
    for i, cycle in enumerate(cycles):
        t0 = cycle[0][0]
        seen: collections.Counter = collections.Counter()
        for ns, name in cycle:
            seen[name] += 1
            key = name if seen[name] == 1 else f"{name} #{seen[name]}"
            offsets[key].append((ns - t0) / 1e6)
        if i + 1 < len(cycles):
            lengths.append((cycles[i + 1][0][0] - t0) / 1e6)
    steps = [{"event": key, "count": len(values), "p50_ms": statistics.median(values),
              "p90_ms": _p90(values)}
             for key, values in offsets.items() if len(values) * 2 >= len(cycles)]
    steps.sort(key=lambda row: (row["p50_ms"], row["event"]))
    return {"transactions": len(cycles),
            "cycle_ms": {"p50": statistics.median(lengths) if lengths else 0.0,
                         "p90": _p90(lengths) if lengths else 0.0},
            "steps": steps}


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]


def report(result: dict) -> str:
    lines = [f"{result['transactions']} transactions of one record to each of {result['partitions']} partitions; "
             f"one transaction every {result['cycle_ms']['p50']:.2f} ms (p50), {result['cycle_ms']['p90']:.2f} (p90)",
             f"{'ms from the send, p50':>22} {'p90':>7}  event (> start, < end)"]
    for row in result["steps"]:
        lines.append(f"{row['p50_ms']:22.3f} {row['p90_ms']:7.3f}  {row['event']}")
    return "\n".join(lines)


def run(directory: pathlib.Path, transactions: int, partitions: int, warmup: int) -> dict:
    """Start the cluster with the probe, run the producer, stop; the timeline."""
    events_dir = directory / "events"
    if events_dir.exists():
        for old in events_dir.glob("events-*.log"):
            old.unlink()
    os.environ[ENV] = str(events_dir)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROBE_DIR), os.environ.get("PYTHONPATH", "")]))
    sys.path.insert(0, str(PROBE_DIR))
    import exactly_timeline_probe as probe  # noqa: E402 - from PROBE_DIR, on the path only now
    probe.install(str(events_dir))
    cluster = start_cluster(directory / "cluster")
    try:
        topic = "timeline"
        create_topic(cluster, topic, partitions)
        conf = {"bootstrap.servers": cluster.bootstrap_servers, **cluster.client_config,
                "transactional.id": f"timeline-{os.getpid()}-{time.time_ns()}", "linger.ms": 5}
        payload = b"x" * 100
        with Producer(conf) as producer:
            producer.init_transactions()
            for _ in range(transactions + warmup):
                producer.begin_transaction()
                probe.mark(SEND)
                futures = [producer.send(topic, payload, partition=p) for p in range(partitions)]
                for f in futures:
                    f.result(timeout=30)
                probe.mark(ACKED)
                producer.commit_transaction(timeout=30)
                probe.mark(COMMITTED)
            probe.mark(SEND)  # closes the last transaction
    finally:
        cluster.down()
    result = timeline(read_events(events_dir), skip=warmup)
    result.update(partitions=partitions, machine=machine_info())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.txn_timeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=50, help="transactions left out at the start")
    parser.add_argument("--dir", type=pathlib.Path, default=pathlib.Path(".run/txn-timeline"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.dir.resolve(), args.transactions, args.partitions, args.warmup)
    print(json.dumps(result, indent=2) if args.json else report(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
