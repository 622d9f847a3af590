"""The current tree against an earlier commit, side by side in one run
(`python -m bench.server_cost --against COMMIT`; `make bench` against YARDSTICK).

Absolute figures taken on one machine cannot be judged on another, or on the same one a
day later; the ratio of two versions measured in alternating windows on the same machine
can. So:

- the commit is installed once into `.run/releases/<hash>` (exactly_tools.releases: its
  tree, its gRPC modules, a virtualenv with it; reruns find it there);
- two dev clusters run at once, each 1 partition leader, 1 transaction and 1 group
  coordinator (replication factor 1): "base", every service from the commit's virtualenv,
  and "head", from the current tree; every client of a cluster runs in a process of its
  own with that cluster's interpreter (bench/cost_clients.py), so each cluster is driven by
  its own SDK (confluent-kafka is the same on both sides);
- `rounds` rounds; in each, every phase measures one window on each cluster, the side that
  goes first alternating from round to round;
- each figure is the median over the rounds per side, and its ratio is head / base.

Phases, in each round:

- `load-librdkafka`, `load-sdk`: `producers` processes (librdkafka through the Kafka port,
  or the SDK over gRPC), each its own transactional.id, commit 1-record transactions to a
  3-partition topic for `seconds`; committed transactions/s (the sum of the producers'
  rates), the CPU ms per committed transaction of each service (user + system from
  /proc/<pid>/stat over the window: partition leader + transaction coordinator + group
  coordinator) and of the producers (their own process CPU), and the p50 / p99 of the time
  from begin_transaction to commit_transaction's return;
- `lone`: one SDK producer, `latency_transactions` transactions of one record to each of 3
  partitions: p50 / p99 of send + commit;
- `produce`: one SDK producer sends `records` records of `record_size` bytes to one
  partition: plain (acks=1, no idempotence), transactional committing every 100 ms and every
  10 ms; records/s, and each transactional rate over the plain one of the same side and
  round. Each window's topic is deleted after it: its 500 MB would otherwise stay in the
  page cache, and the later windows' log writes would pay for the kernel finding them
  memory. On the 2-core machine, four rounds on one cluster: plain windows cost the
  partition leader 3.7-5.0 ms of CPU per 1,000 records one after another, 2.6-2.9 ms with
  each topic deleted; transactional / plain every 10 ms read 0.61-0.74, and 0.87-0.92;
- `idle`: no client for `idle_seconds`: the services' CPU per second for their own
  background work (leases, ZooKeeper, the connection sweep, the group coordinator's
  tailing), which every other figure includes.

CPU per transaction from /proc is the steadiest of these on a shared machine: it counts the
work, not the waiting. Rates and latencies move with whatever else runs; the alternation
exposes both sides to the same neighbours, and each round's windows are minutes apart at
most.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import queue
import subprocess
import sys
import threading
import time

from .common import (cluster_level, cpu_seconds, create_topic, delete_topic, machine_conditions, machine_end,
                     machine_info, median, percentile, start_cluster)

# The commit the performance goals are stated against (docs/benchmarks.md, "Side by side").
YARDSTICK = "5f0f6d9"
ROOT = pathlib.Path(__file__).resolve().parent.parent
ROLES = {"partition_leader": "partition leader", "txn_coordinator": "transaction coordinator",
         "group_coordinator": "group coordinator"}
CLIENTS = ("librdkafka", "sdk")
PRODUCE_MODES = (("plain", "plain", 0), ("txn_100ms", "transactional", 100), ("txn_10ms", "transactional", 10))
READY_TIMEOUT_S = 180.0
RUN_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What one run measures: `rounds` windows per phase and side; per load window
    `producers` processes for `seconds`; `latency_transactions` for the lone producer;
    `records` of `record_size` bytes per produce run."""

    rounds: int = 3
    producers: int = 8
    seconds: float = 10.0
    latency_transactions: int = 1000
    records: int = 500_000
    record_size: int = 1024
    idle_seconds: float = 5.0


QUICK = Sizes(rounds=1, producers=2, seconds=1.0, latency_transactions=20, records=2_000, idle_seconds=1.0)


# Figures: key -> (label, unit, goal of the phase after this one or "", how the goal is read).
# "ratio<=" goals compare head / base; "head>=" goals the head's own value.
FIGURES = {
    "server_cpu.librdkafka": ("server CPU per txn, {p} librdkafka producers via the Kafka port", "ms",
                              "<= 0.5 x", ("ratio<=", 0.5)),
    "txn_per_s.librdkafka": ("committed txn/s, {p} librdkafka producers", "txn/s", "", None),
    "client_cpu.librdkafka": ("librdkafka client CPU per txn", "ms", "", None),
    "commit_p50.librdkafka": ("commit p50 under that load (begin to commit), librdkafka", "ms", "<= 0.6 x",
                              ("ratio<=", 0.6)),
    "server_cpu.sdk": ("server CPU per txn, {p} SDK producers over gRPC", "ms", "<= 0.5 x", ("ratio<=", 0.5)),
    "txn_per_s.sdk": ("committed txn/s, {p} SDK producers", "txn/s", "", None),
    "client_cpu.sdk": ("SDK client CPU per txn", "ms", "<= 0.6 x", ("ratio<=", 0.6)),
    "commit_p50.sdk": ("commit p50 under that load (begin to commit), SDK", "ms", "<= 0.6 x", ("ratio<=", 0.6)),
    "lone.p50": ("lone SDK producer, 3-partition send + commit, p50", "ms", "", None),
    "lone.p99": ("lone SDK producer, 3-partition send + commit, p99", "ms", "<= 0.6 x", ("ratio<=", 0.6)),
    "produce.plain": ("plain produce (acks=1), 1 SDK producer", "records/s", "", None),
    "produce.txn_100ms": ("transactional produce, commit every 100 ms", "records/s", "", None),
    "produce.txn_100ms_vs_plain": ("  / plain produce of the same side and round", "x", ">= 0.97 (head)",
                                   ("head>=", 0.97)),
    "produce.txn_10ms": ("transactional produce, commit every 10 ms", "records/s", "", None),
    "produce.txn_10ms_vs_plain": ("  / plain produce of the same side and round", "x", ">= 0.70 (head)",
                                  ("head>=", 0.70)),
    "idle.total": ("services' CPU with no client (leader + coordinators)", "ms/s", "", None),
}
# The services' share of server_cpu.*, listed under it.
for _client in CLIENTS:
    for _role in ROLES:
        FIGURES[f"server_cpu.{_client}.{_role}"] = (f"  {ROLES[_role]}", "ms", "", None)


class ClientError(RuntimeError):
    """A client process failed, or did not answer within its deadline."""


@dataclasses.dataclass
class Side:
    """One of the two clusters: `name` "base" or "head", `label` the commit it runs,
    `python` the interpreter of its services and clients."""

    name: str
    label: str
    python: str
    cluster: object = None  # exactly_tools.devcluster.DevCluster, once started
    props: dict = dataclasses.field(default_factory=dict)  # settings of its services (Kafka keys)
    level: int = 0  # its finalized metadata.version, once started

    def pids(self) -> dict[str, int]:
        return {svc.role: svc.pid for svc in self.cluster.services.values()}


class _Lines:
    """A client process's stdout, line by line, each read with a deadline."""

    def __init__(self, proc: subprocess.Popen, what: str, log: pathlib.Path):
        self.proc, self.what, self.log = proc, what, log
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._q.put(line)
        self._q.put(None)

    def read(self, timeout_s: float) -> str:
        try:
            line = self._q.get(timeout=timeout_s)
        except queue.Empty:
            raise ClientError(f"{self.what}: no answer within {timeout_s:.0f} s (log: {self.log})") from None
        if line is None:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise ClientError(f"{self.what} exited ({self.proc.wait(timeout=30)}) without answering: {tail}")
        return line.strip()


class Run:
    """Clusters ("sides") and the client processes of one run, under `work`."""

    def __init__(self, work: pathlib.Path, sizes: Sizes, say=None):
        self.work = work
        self.sizes = sizes
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.sides: list[Side] = []
        self._client_dir = work / "clients"
        self._pythonpath = work / "pythonpath"
        self._seq = 0
        self.work.mkdir(parents=True, exist_ok=True)
        self._client_dir.mkdir(exist_ok=True)
        # The clients import bench.cost_clients from here and `exactly` from their own
        # installation (a PYTHONPATH of the tree itself would put its services first).
        self._pythonpath.mkdir(exist_ok=True)
        link = self._pythonpath / "bench"
        if not link.is_symlink() or link.resolve() != (ROOT / "bench").resolve():
            if link.is_symlink():
                link.unlink()
            link.symlink_to(ROOT / "bench")

    # ------------------------------------------------------------ setup
    def add_side(self, side: Side) -> None:
        """Start `side`'s cluster (its services on `side.python`) and create the topics."""
        t0 = time.monotonic()
        self.sides.append(side)
        side.cluster = start_cluster(self.work / side.name, props=side.props,
                                     python="" if side.python == sys.executable else side.python)
        side.level = cluster_level(side.cluster)
        self.say(f"  {side.name} cluster ({side.label}) serving at metadata.version {side.level} after "
                 f"{time.monotonic() - t0:.0f} s")
        for client in CLIENTS:
            create_topic(side.cluster, f"load-{client}", 3)
        create_topic(side.cluster, "lone", 3)
        for r in range(self.sizes.rounds):
            for key, _, _ in PRODUCE_MODES:
                create_topic(side.cluster, f"produce-{key.replace('_', '-')}-{r}")

    def stop(self) -> None:
        for side in self.sides:
            if side.cluster is not None:
                try:
                    side.cluster.down()
                except Exception as exc:  # noqa: BLE001 - stop the other one too
                    print(f"bench: stopping {side.name} failed: {exc!r}", file=sys.stderr)

    # ------------------------------------------------------------ clients
    def _spawn(self, side: Side, args: list[str]) -> tuple[subprocess.Popen, pathlib.Path]:
        self._seq += 1
        log = self._client_dir / f"{side.name}-{args[0]}-{self._seq}.log"
        env = {**os.environ, "PYTHONPATH": str(self._pythonpath)}
        with open(log, "wb") as err:
            proc = subprocess.Popen([side.python, "-m", "bench.cost_clients", *args], cwd=self._client_dir, env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
        return proc, log

    def _one_shot(self, side: Side, args: list[str]) -> dict:
        proc, log = self._spawn(side, args)
        try:
            line = _Lines(proc, f"{side.name} {args[0]}", log).read(RUN_TIMEOUT_S)
            return json.loads(line)
        finally:
            _reap(proc)

    def load_window(self, side: Side, client: str, window: int, observe=None) -> dict:
        """One window of `producers` processes of `client` on `side` (module docstring).
        `observe(server_pids, client_pids)`: a context manager entered around the window
        (once every producer is ready) and left when all have answered (a profiler)."""
        s = self.sizes
        bootstrap = (side.cluster.kafka_bootstrap_servers if client == "librdkafka"
                     else side.cluster.bootstrap_servers)
        run_id = f"{side.name}-{client}-{window}-{time.time_ns()}"
        procs = [self._spawn(side, ["load", "--client", client, "--bootstrap", bootstrap, "--topic", f"load-{client}",
                                    "--partitions", "3", "--partition", str(i), "--transactional-id",
                                    f"cost-{run_id}-{i}", "--seconds", str(s.seconds)])
                 for i in range(s.producers)]
        try:
            lines = [_Lines(p, f"{side.name} {client} producer {i}", log) for i, (p, log) in enumerate(procs)]
            for ln in lines:
                if ln.read(READY_TIMEOUT_S) != "ready":
                    raise ClientError(f"{ln.what} did not say ready")
            pids = side.pids()
            with observe(pids, [p.pid for p, _ in procs]) if observe else contextlib.nullcontext():
                cpu0 = {role: cpu_seconds(pid) for role, pid in pids.items()}
                for p, _ in procs:
                    p.stdin.write("go\n")
                    p.stdin.flush()
                rows = [json.loads(ln.read(s.seconds + RUN_TIMEOUT_S)) for ln in lines]
                cpu = {role: cpu_seconds(pid) - cpu0[role] for role, pid in pids.items()}
        finally:
            for p, _ in procs:
                _reap(p)
        commits = sum(r["commits"] for r in rows)
        if commits == 0:
            raise ClientError(f"{side.name} {client}: no transaction committed in {s.seconds:g} s")
        latencies = sorted(v for r in rows for v in r["latencies_ms"])
        out = {"commits": commits, "txn_per_s": sum(r["commits"] / r["seconds"] for r in rows),
               "client_cpu_ms_per_txn": sum(r["cpu_s"] for r in rows) * 1000 / commits,
               "commit_p50_ms": percentile(latencies, 0.5), "commit_p99_ms": percentile(latencies, 0.99),
               "server_cpu_ms_per_txn": {role: c * 1000 / commits for role, c in cpu.items()}}
        out["server_cpu_ms_per_txn"]["total"] = sum(cpu.values()) * 1000 / commits
        # {pid: (thread_cpu at the start, at the end)} of each producer (bench.txn_profile)
        out["client_threads"] = {r["pid"]: tuple({int(t): tuple(v) for t, v in snap.items()} for snap in r["threads"])
                                 for r in rows if "threads" in r}
        return out

    def lone(self, side: Side) -> dict:
        return self._one_shot(side, ["latency", "--bootstrap", side.cluster.bootstrap_servers, "--topic", "lone",
                                     "--partitions", "3", "--transactions", str(self.sizes.latency_transactions)])

    def idle(self, side: Side) -> dict[str, float]:
        """CPU ms per second of each service (and "total") over `idle_seconds` without clients."""
        pids = side.pids()
        cpu0, t0 = {role: cpu_seconds(pid) for role, pid in pids.items()}, time.monotonic()
        time.sleep(self.sizes.idle_seconds)
        elapsed = time.monotonic() - t0
        out = {role: (cpu_seconds(pid) - cpu0[role]) * 1000 / elapsed for role, pid in pids.items()}
        out["total"] = sum(out.values())
        return out

    def produce(self, side: Side, key: str, mode: str, interval_ms: int, rnd: int) -> dict:
        """One produce window; its topic is deleted after it (module docstring)."""
        topic = f"produce-{key.replace('_', '-')}-{rnd}"
        window = self._one_shot(side, ["produce", "--bootstrap", side.cluster.bootstrap_servers, "--topic", topic,
                                       "--mode", mode, "--commit-interval-ms", str(interval_ms),
                                       "--records", str(self.sizes.records),
                                       "--record-size", str(self.sizes.record_size)])
        delete_topic(side.cluster, topic)
        return window

    # ------------------------------------------------------------ rounds
    def measure(self) -> dict[str, dict[str, list]]:
        """Every phase, `rounds` times, alternating the sides; the windows per side."""
        s = self.sizes
        windows: dict[str, dict[str, list]] = {side.name: {} for side in self.sides}
        for rnd in range(s.rounds):
            order = self.sides if rnd % 2 == 0 else self.sides[::-1]
            for client in CLIENTS:
                for side in order:
                    w = self.load_window(side, client, rnd)
                    w.pop("client_threads", None)
                    windows[side.name].setdefault(f"load.{client}", []).append(w)
                    self.say(f"  round {rnd + 1}/{s.rounds} {side.name} {client:>10}: {w['txn_per_s']:5.0f} txn/s, "
                             f"server CPU {w['server_cpu_ms_per_txn']['total']:.2f} ms/txn, client CPU "
                             f"{w['client_cpu_ms_per_txn']:.2f} ms/txn, commit p50 {w['commit_p50_ms']:.1f} ms")
            for side in order:
                w = self.lone(side)
                windows[side.name].setdefault("lone", []).append(w)
                self.say(f"  round {rnd + 1}/{s.rounds} {side.name} lone producer: p50 {w['p50_ms']:.1f} ms, "
                         f"p99 {w['p99_ms']:.1f} ms")
            for side in order:
                w = self.idle(side)
                windows[side.name].setdefault("idle", []).append(w)
                self.say(f"  round {rnd + 1}/{s.rounds} {side.name} idle: {w['total']:.1f} ms/s of CPU")
            for side in order:
                runs = {key: self.produce(side, key, mode, interval, rnd) for key, mode, interval in PRODUCE_MODES}
                windows[side.name].setdefault("produce", []).append(runs)
                self.say(f"  round {rnd + 1}/{s.rounds} {side.name} produce: "
                         + ", ".join(f"{k} {r['records_per_s']:,.0f}/s" for k, r in runs.items()))
        return windows


def _reap(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
    for f in (proc.stdin, proc.stdout):
        if f is not None:
            f.close()


def head_label() -> str:
    """The current tree's commit (short hash), "+ changes" when the tree differs from it."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""
    commit = git("rev-parse", "--short=7", "HEAD") or "current tree"
    return commit + (" + changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def per_round(windows: dict[str, list]) -> dict[str, list[float]]:
    """figure key -> its value in each round, from one side's windows."""
    out: dict[str, list[float]] = {}
    for client in CLIENTS:
        rows = windows[f"load.{client}"]
        out[f"server_cpu.{client}"] = [r["server_cpu_ms_per_txn"]["total"] for r in rows]
        for role in ROLES:
            out[f"server_cpu.{client}.{role}"] = [r["server_cpu_ms_per_txn"].get(role, 0.0) for r in rows]
        out[f"txn_per_s.{client}"] = [r["txn_per_s"] for r in rows]
        out[f"client_cpu.{client}"] = [r["client_cpu_ms_per_txn"] for r in rows]
        out[f"commit_p50.{client}"] = [r["commit_p50_ms"] for r in rows]
    out["lone.p50"] = [r["p50_ms"] for r in windows["lone"]]
    out["lone.p99"] = [r["p99_ms"] for r in windows["lone"]]
    for key, _, _ in PRODUCE_MODES:
        out[f"produce.{key}"] = [r[key]["records_per_s"] for r in windows["produce"]]
    for key in ("txn_100ms", "txn_10ms"):
        out[f"produce.{key}_vs_plain"] = [r[key]["records_per_s"] / r["plain"]["records_per_s"]
                                          for r in windows["produce"]]
    out["idle.total"] = [w["total"] for w in windows["idle"]]
    return out


def figures(windows: dict[str, dict[str, list]], producers: int) -> dict[str, dict]:
    """key -> {label, unit, base, head (medians over the rounds), ratio (head / base),
    base_rounds, head_rounds, goal, met (None without a goal)}, in FIGURES' order with
    each service's share after its total."""
    base, head = per_round(windows["base"]), per_round(windows["head"])
    order = []
    for key in FIGURES:
        if key.count(".") == 2:
            continue
        order.append(key)
        if key.startswith("server_cpu."):
            order.extend(f"{key}.{role}" for role in ROLES)
    out = {}
    for key in order:
        label, unit, goal, rule = FIGURES[key]
        b, h = median(base[key]), median(head[key])
        ratio = h / b if b else float("nan")
        met = None
        if rule is not None:
            kind, bound = rule
            met = bool(ratio <= bound) if kind == "ratio<=" else bool(h >= bound)
        out[key] = {"label": label.format(p=producers), "unit": unit, "base": b, "head": h, "ratio": ratio,
                    "base_rounds": base[key], "head_rounds": head[key], "goal": goal, "met": met}
    return out


def table(result: dict) -> str:
    """The ratio table: figure, the commit's median, the current tree's median, head /
    base, and the goal of the design's next phase with whether this run meets it."""
    def fmt(v: float, unit: str) -> str:
        if unit in ("txn/s", "records/s"):
            return f"{v:,.0f} {unit}"
        if unit == "ms/s":
            return f"{v:.1f} {unit}"
        return f"{v:.2f} {unit}" if unit != "x" else f"{v:.2f} x"
    base, head = result["commits"]["base"], result["commits"]["head"]
    rows = [("figure", base, head, "ratio", "goal", "met")]
    for row in result["figures"].values():
        met = "" if row["met"] is None else ("yes" if row["met"] else "no")
        rows.append((row["label"], fmt(row["base"], row["unit"]), fmt(row["head"], row["unit"]),
                     f"{row['ratio']:.2f}", row["goal"], met))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[j]) if j in (0, 4) else c.rjust(widths[j])
                               for j, c in enumerate(r)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    m = result["machine"]
    s = result["sizes"]
    if result.get("head_props"):
        lines.append("\nhead settings: " + ", ".join(f"{k}={v}" for k, v in sorted(result["head_props"].items())))
    if result.get("levels"):
        lines.append("metadata.version: " + ", ".join(f"{k} {v}" for k, v in result["levels"].items()))
    lines.append(f"\nmedians of {s['rounds']} rounds, alternating windows; ratio = {head} / {base}; "
                 f"{m['cpus']} CPUs ({m.get('cpu_model', '?')}), {machine_conditions(m)}; {result['seconds']:.0f} s")
    return "\n".join(lines)


def run(against: str = YARDSTICK, work: pathlib.Path = ROOT / ".run" / "bench-against", sizes: Sizes = Sizes(),
        say=None, head_props: dict[str, str] | None = None) -> dict:
    """Install `against`, start both clusters, measure, stop them. `head_props`: settings
    of the head cluster's services only (e.g. unstable.feature.versions.enable=true, to
    measure a level still being built). Returns {"commits": {"base", "head"},
    "head_props", "sizes", "machine", "seconds", "figures" (`figures`), "windows"}.
    Raises exactly_tools.releases.ReleaseInstallError when the commit cannot be
    installed, ClientError when a client fails."""
    from exactly_tools import releases
    started = time.time()
    machine = machine_info()
    r = Run(work.resolve(), sizes, say)
    try:
        t0 = time.monotonic()
        release = releases.install(against, ROOT)
        r.say(f"  {against} installed in {release.src.parent} ({time.monotonic() - t0:.0f} s)")
        r.add_side(Side("base", release.commit[:7], str(release.python)))
        r.add_side(Side("head", head_label(), sys.executable, props=dict(head_props or {})))
        windows = r.measure()
    finally:
        r.stop()
    machine_end(machine)
    return {"commits": {side.name: side.label for side in r.sides}, "against": against,
            "head_props": dict(head_props or {}), "levels": {side.name: side.level for side in r.sides},
            "sizes": dataclasses.asdict(sizes), "machine": machine, "seconds": round(time.time() - started, 1),
            "figures": figures(windows, sizes.producers), "windows": windows}
