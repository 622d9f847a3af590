"""Where a transaction's server CPU goes: per process, per thread and per call.

    python -m bench.txn_profile [--client sdk|librdkafka|both] [--producers 8] [--seconds 10]
                                [--py-spy] [--dir .run/txn-profile] [--json]

On one dev cluster of the current tree (1 partition leader, 1 transaction and 1 group
coordinator, RF 1), first 10 s without clients (each service's CPU per second for its
own background work: leases, ZooKeeper, metrics, the group coordinator's tailing), then
`--producers` processes commit 1-record transactions to a 3-partition topic for
`--seconds` (bench/against.py's load window). Over the window:

- the CPU ms per committed transaction of each service and of each of its threads
  (/proc/<pid>/task/<tid>/stat): the event loop's thread (the process's main thread),
  gRPC's poller thread, the rest (kazoo, executors) by name;
- the calls per committed transaction each service answered, per method (its
  exactly_rpc_request_duration_seconds counts, direct and tunneled calls alike: a
  crossing of the gRPC boundary each), scraped from /metrics before and after;
- with `--py-spy`, a second window under py-spy (Python frames, 100 samples/s,
  nonblocking): the share of each service's event-loop samples per part of the code
  (`CATEGORIES`; samples with no Python frame below the loop: `LOOP_C`), which
  apportions the thread's measured CPU.

The first window is the measurement, the second only apportions it: py-spy's sampling
costs the processes CPU of its own.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import pathlib
import re
import sys
import time
import urllib.request

from .against import ROLES, Run, Side, Sizes, head_label
from .common import cpu_seconds, thread_cpu

IDLE_S = 10.0  # the idle window before the load, in which each service's own background work is measured
# (category, pattern over a sample's frames, outermost first): the first that matches a
# frame names the sample, searched from the innermost frame outwards, so a sample is
# counted under the most specific part it was in.
CATEGORIES: list[tuple[str, re.Pattern]] = [(name, re.compile(pattern)) for name, pattern in [
    ("protobuf (de)serialization", r"(google/protobuf|SerializeToString|FromString|ParseFromString)"),
    ("gRPC runtime (grpc.aio, cygrpc)", r"(grpc/aio/|grpc/_cython|grpc/_channel|grpc/_server|grpc/_interceptor)"),
    ("tunnel (services/common/transport/tunnel.py)", r"transport/tunnel\.py"),
    ("interceptors: metrics, guard, auth, quotas", r"(common/metrics\.py|transport/guard\.py|security/auth\.py|"
                                                    r"security/quotas\.py|security/authz\.py)"),
    ("Kafka port codec and listener", r"common/kafka/"),
    ("log append, index, segment I/O", r"partition_leader/(log|segment|index|offset_index)"),
    ("produce path, producer state, markers", r"partition_leader/(produce|partition|producer_state|replica_manager|"
                                              r"purgatory|servicer|replicas|lease)"),
    ("record batch codec (exactly_wire.records)", r"exactly_wire/records"),
    ("transaction coordinator", r"services/txn_coordinator/"),
    ("group coordinator", r"services/group_coordinator/"),
    ("verification, producer-id bindings", r"(cluster/verification\.py|security/pid_binding\.py)"),
    ("cluster state, ZooKeeper (kazoo)", r"(services/common/cluster/|kazoo/)"),
    ("other service code", r"services/"),
    ("asyncio / uvloop machinery", r"(asyncio/|uvloop)"),
]]
# A sample of the event loop's thread with no Python frame below the loop's run(): uvloop's
# own C code, the Cython callbacks that complete gRPC's operations, and time the thread was
# runnable but waiting for a core (py-spy leaves out samples of a thread that sleeps, not
# those of one that waits for the CPU; on a shared 2-core machine every part has some).
LOOP_C = "uvloop and gRPC's Cython callbacks (no Python frame)"
_LOOP_LEAF = re.compile(r"^Runner\.run \(asyncio/runners\.py")


def thread_groups(pid: int, before: dict, after: dict, main: str = "event loop (main thread)",
                  into: dict[str, float] | None = None) -> dict[str, float]:
    """CPU s per thread group between two `thread_cpu` snapshots, added to `into`:
    `main` for the process's main thread, the others by name with their numbers
    dropped ("python": Python's own threads, which keep the process's name; gRPC's
    threads are named by gRPC)."""
    out: dict[str, float] = collections.defaultdict(float, into or {})
    for tid, (name, cpu) in after.items():
        spent = cpu - before.get(tid, (name, 0.0))[1]
        out[main if tid == pid else (re.sub(r"[-_]?\d+$", "", name) or name)] += spent
    return dict(out)


def rpc_counts(metrics_address: str) -> dict[str, float]:
    """{"Service/Method": calls answered so far} from a service's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name != "exactly_rpc_request_duration_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_count"):
                out[f"{sample.labels['service']}/{sample.labels['method']}"] = sample.value
    return out


def categorize(folded: pathlib.Path, thread_prefix: str = "MainThread") -> dict[str, int]:
    """Samples per category (CATEGORIES, LOOP_C, "other") of the threads whose name
    contains `thread_prefix` in a py-spy raw (folded) file. A sample counts under the
    innermost frame that matches a category; asyncio's and uvloop's frames only when no
    other frame does (a socket write of the Kafka listener is the listener's cost)."""
    generic = CATEGORIES[-1]
    out: dict[str, int] = collections.Counter()
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not frames or thread_prefix not in frames[0]:
            continue
        frames = frames[1:]
        if not frames or _LOOP_LEAF.match(frames[-1]):
            out[LOOP_C] += int(count)
            continue
        name = next((c for frame in reversed(frames) for c, pattern in CATEGORIES[:-1] if pattern.search(frame)),
                    None)
        if name is None:
            name = generic[0] if any(generic[1].search(f) for f in frames) else "other"
        out[name] += int(count)
    return dict(out)


def apportion(samples: dict[str, int], loop_ms: float) -> dict[str, float]:
    """The event loop's CPU (`loop_ms` per transaction) spread over `samples`' categories."""
    total = sum(samples.values())
    return {k: loop_ms * v / total for k, v in sorted(samples.items(), key=lambda kv: -kv[1])} if total else {}


def _observer(cluster, result: dict):
    """Run.load_window's `observe`: each service's threads' CPU and RPC counts over the
    window, into `result`."""
    def observe(pids: dict[str, int], client_pids: list[int]):
        @contextlib.contextmanager
        def window():
            addresses = {svc.role: svc.metrics_address for svc in cluster.services.values()}
            threads0 = {role: thread_cpu(pid) for role, pid in pids.items()}
            calls0 = {role: rpc_counts(addr) for role, addr in addresses.items()}
            yield
            for role, pid in pids.items():
                result.setdefault("threads", {})[role] = thread_groups(pid, threads0[role], thread_cpu(pid))
                calls1 = rpc_counts(addresses[role])
                result.setdefault("calls", {})[role] = {m: calls1[m] - calls0[role].get(m, 0.0) for m in calls1
                                                        if calls1[m] - calls0[role].get(m, 0.0) > 0}
        return window()
    return observe


def _spy(directory: pathlib.Path, client: str, result: dict):
    """Run.load_window's `observe`: py-spy on the services and one producer."""
    from .profiling import PySpy

    def observe(pids: dict[str, int], client_pids: list[int]):
        @contextlib.contextmanager
        def window():
            spy = PySpy(directory, {**pids, "sdk_client" if client == "sdk" else "client": client_pids[0]},
                        prefix=f"profile-{client}", fmt="raw")
            time.sleep(1.0)  # py-spy attaches
            try:
                yield
            finally:
                result["py_spy"] = spy.stop()
        return window()
    return observe


def profile(run: Run, side: Side, client: str, spy_dir: pathlib.Path | None) -> dict:
    """One measured window (and with `spy_dir` one under py-spy) of `client`; per
    service: CPU ms per txn in all and per thread group, calls per txn per method, and
    the py-spy categories in ms per txn (the event loop's CPU apportioned by samples)."""
    result: dict = {}
    pids = side.pids()
    idle0 = {role: cpu_seconds(pid) for role, pid in pids.items()}
    time.sleep(IDLE_S)
    idle = {role: (cpu_seconds(pid) - idle0[role]) * 1000 / IDLE_S for role, pid in pids.items()}
    window = run.load_window(side, client, 0, _observer(side.cluster, result))
    commits = window["commits"]
    clients: dict[str, float] = {}
    for pid, (before, after) in window["client_threads"].items():
        clients = thread_groups(pid, before, after, "main thread", clients)
    # Threads that ended within the window (gRPC's per-call channel threads) are in the
    # processes' own CPU but in neither snapshot.
    clients["threads that ended in the window"] = max(
        window["client_cpu_ms_per_txn"] * commits / 1000 - sum(clients.values()), 0.0)
    out = {"window": window, "services": {},
           "client_threads_ms_per_txn": {k: v * 1000 / commits for k, v in sorted(clients.items(),
                                                                                   key=lambda kv: -kv[1])}}
    for role in ROLES:
        threads = {k: v * 1000 / commits for k, v in sorted(result["threads"][role].items(), key=lambda kv: -kv[1])}
        calls = {k: v / commits for k, v in sorted(result["calls"][role].items(), key=lambda kv: -kv[1])}
        out["services"][role] = {"cpu_ms_per_txn": window["server_cpu_ms_per_txn"][role],
                                 "idle_cpu_ms_per_s": idle[role],
                                 "idle_share_ms_per_txn": idle[role] / window["txn_per_s"],
                                 "threads_ms_per_txn": threads, "calls_per_txn": calls}
    if spy_dir is not None:
        spied: dict = {}
        run.load_window(side, client, 1, _spy(spy_dir, client, spied))
        for role, path in spied.get("py_spy", {}).items():
            if role not in ROLES:
                out.setdefault("clients", {})[role] = categorize(pathlib.Path(path))
                continue
            samples = categorize(pathlib.Path(path))
            loop_ms = out["services"][role]["threads_ms_per_txn"].get("event loop (main thread)", 0.0)
            out["services"][role]["event_loop_samples"] = samples
            out["services"][role]["event_loop_ms_per_txn"] = apportion(samples, loop_ms)
    return out


def report(client: str, prof: dict) -> str:
    w = prof["window"]
    lines = [f"{client}: {w['txn_per_s']:.0f} txn/s, server CPU {w['server_cpu_ms_per_txn']['total']:.2f} ms/txn, "
             f"client CPU {w['client_cpu_ms_per_txn']:.2f} ms/txn"]
    for role, s in prof["services"].items():
        lines.append(f"  {ROLES[role]}: {s['cpu_ms_per_txn']:.2f} ms/txn (idle it spends {s['idle_cpu_ms_per_s']:.1f} "
                     f"ms/s, {s['idle_share_ms_per_txn']:.2f} ms per txn at this rate)")
        lines.append("    threads: " + ", ".join(f"{k} {v:.2f}" for k, v in s["threads_ms_per_txn"].items() if v >= 0.005))
        lines.append("    calls/txn: " + ", ".join(f"{k} {v:.2f}" for k, v in s["calls_per_txn"].items() if v >= 0.005))
        if "event_loop_ms_per_txn" in s:
            lines.append("    event loop, ms/txn by part: " + ", ".join(
                f"{k} {v:.2f}" for k, v in s["event_loop_ms_per_txn"].items() if v >= 0.005))
    lines.append("  clients' threads, ms/txn: " + ", ".join(
        f"{k} {v:.2f}" for k, v in prof["client_threads_ms_per_txn"].items() if v >= 0.005))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.txn_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", choices=["sdk", "librdkafka", "both"], default="both")
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--py-spy", action="store_true", help="apportion the event loop's CPU with py-spy")
    parser.add_argument("--dir", type=pathlib.Path, default=pathlib.Path(".run/txn-profile"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    run = Run(args.dir.resolve(), Sizes(rounds=0, producers=args.producers, seconds=args.seconds))
    side = Side("head", head_label(), sys.executable)
    results = {}
    try:
        run.add_side(side)
        for client in (["librdkafka", "sdk"] if args.client == "both" else [args.client]):
            results[client] = profile(run, side, client, run.work / "py-spy" if args.py_spy else None)
            if not args.json:
                print(report(client, results[client]), flush=True)
    finally:
        run.stop()
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
