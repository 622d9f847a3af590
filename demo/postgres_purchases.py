"""The purchases pipeline with PostgreSQL: invoices as rows, shipments in Exactly,
atomically (exactly.postgres), with crashes. `make demo DEMO_ARGS=--postgres`
(python -m demo.purchases --postgres) runs it on a dev cluster started with a
PostgreSQL server (`exactly-dev up --postgres`); the system test runs the same
`run_with_failures` on a subset of the items.

The worker (demo.pipeline_postgres) is SIGKILLed at each of the four steps of a
transaction — before prepare, after prepare, after the database commit, after the
completion — and restarted with the same transactional.id (its recover() decides the
transaction left prepared); then the transaction coordinator txn-0 and, with a
replication factor above 1, the partition leader pl-1 are SIGKILLed and restarted
while it runs. The comparison reads the invoices table and the shipments topic under
read_committed: both must hold every item exactly once, the same item ids, and the
invoice totals must match the CSV.
"""
from __future__ import annotations

import collections
import pathlib
import signal
import subprocess
import sys
import time
from decimal import Decimal
from typing import Callable

import psycopg

from exactly import AdminClient, NewTopic
from exactly import postgres as exactly_pg

from .common import PURCHASES, SHIPMENTS, Worker, load_purchases, read_topic, track, wait_gone
from .pipeline_postgres import GROUP_ID, INVOICES_TABLE, PARTITIONS

ROOT = pathlib.Path(__file__).resolve().parent.parent

RECOVERY = {"none": "nothing prepared was left (an open, unprepared transaction is aborted by InitProducerId)",
            "aborted": "a prepared transaction the database did not hold: aborted",
            "committed": "a prepared transaction the database held: committed"}

# Where, in the share of the items copied, each failure is injected.
KILL_POINTS = (("before_prepare", 0.1), ("prepared", 0.2), ("database_committed", 0.3), ("completed", 0.4))
COORDINATOR_AT, LEADER_AT = 0.6, 0.8


class PgWorker(Worker):
    """One demo.pipeline_postgres process (status() and check_alive() as the purchases
    Worker's). hold_at / hold_after: where it holds; pause: it stops itself there with
    SIGSTOP (`stopped()`), and goes on when continued (`cont()`)."""

    def __init__(self, bootstrap: str, dsn: str, run_dir: pathlib.Path, name: str, hold_at: str | None = None,
                 hold_after: int = 0, max_records: int = 100, cluster=None, pause: bool = False):
        self.name = name
        self.status_file = run_dir / f"{name}.status"
        self.status_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "demo.pipeline_postgres", "--bootstrap-servers", bootstrap, "--dsn", dsn,
               "--status-file", str(self.status_file), "--max-records", str(max_records)]
        if hold_at:
            cmd += ["--hold-at", hold_at, "--hold-after", str(hold_after)] + (["--pause"] if pause else [])
        (run_dir / "logs").mkdir(exist_ok=True)
        self.log = open(run_dir / "logs" / f"{name}.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        track(cluster, name, self.proc)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stopped(self) -> bool:
        """Whether the process is stopped (SIGSTOP): state T in /proc/PID/stat."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
        except FileNotFoundError:
            return False

    def cont(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


def create_topics(bootstrap: str, replication_factor: int) -> None:
    configs = {"min.insync.replicas": str(min(2, replication_factor))}
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(t, PARTITIONS, replication_factor, configs) for t in (PURCHASES, SHIPMENTS)])


def copied(dsn: str) -> int:
    """Items copied so far: the sum of the offsets the database committed."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            return sum(exactly_pg.committed_offsets(conn, GROUP_ID).values())
    except psycopg.errors.UndefinedTable:
        return 0
    except psycopg.OperationalError:
        return -1  # the database is down (restarting)


def wait_until(what: str, cond: Callable[[], bool], workers: list[PgWorker], deadline: float) -> None:
    while not cond():
        for w in workers:
            w.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def run_with_failures(cluster, dsn: str, total: int, run_dir: pathlib.Path, say: Callable[[str], None],
                      replication_factor: int = 1, timeout_s: float = 900, max_records: int = 100) -> list[str]:
    """Run the pipeline over `total` loaded items, SIGKILLing the worker at each of
    the four steps, then the transaction coordinator and (replication factor > 1) a
    partition leader; return once the database committed offsets for every item.
    Returns the events, in order."""
    bootstrap = cluster.bootstrap_servers
    deadline = time.monotonic() + timeout_s
    events: list[str] = []
    for n, (step, share) in enumerate(KILL_POINTS, 1):
        worker = PgWorker(bootstrap, dsn, run_dir, f"pg-worker-{n}", hold_at=step, hold_after=int(total * share),
                          max_records=max_records, cluster=cluster)
        wait_until(f"worker {n} to hold at {step}", lambda: worker.status().get("state") == "holding", [worker],
                   deadline)
        if n > 1:
            say(f"  the next worker's recover(): {RECOVERY.get(worker.status().get('recovered'), '?')}")
        worker.kill()
        events.append(f"SIGKILLed the worker at '{step}' with {copied(dsn):,} items committed; "
                      "restarting it with the same transactional.id")
        say(events[-1])
    worker = PgWorker(bootstrap, dsn, run_dir, "pg-worker-5", max_records=max_records, cluster=cluster)
    try:
        wait_until("the last worker's recovery", lambda: "recovered" in worker.status(), [worker], deadline)
        say(f"  the next worker's recover(): {RECOVERY.get(worker.status()['recovered'], '?')}")
        wait_until("the pipeline to reach the coordinator kill", lambda: copied(dsn) >= total * COORDINATOR_AT,
                   [worker], deadline)
        cluster.kill("txn-0")
        cluster.restart("txn-0")
        events.append(f"SIGKILLed and restarted the transaction coordinator txn-0 at {copied(dsn):,} items")
        say(events[-1])
        if replication_factor > 1:
            wait_until("the pipeline to reach the leader kill", lambda: copied(dsn) >= total * LEADER_AT, [worker],
                       deadline)
            cluster.kill("pl-1")
            wait_gone(cluster, "pl-1", deadline)
            cluster.restart("pl-1")
            events.append(f"SIGKILLed the partition leader pl-1 at {copied(dsn):,} items; other replicas led "
                          "its partitions until it came back as a follower")
            say(events[-1])
        wait_until("every item to be copied", lambda: copied(dsn) >= total, [worker], deadline)
    finally:
        worker.stop()
    return events


def compare(bootstrap: str, dsn: str, expected: dict[str, dict]) -> tuple[list[str], bool]:
    """Compare the invoices table and the shipments topic (read_committed) with the
    items of the CSV (item key -> row). Returns (summary lines, ok): ok only when both
    hold every item exactly once, the same ids, and the invoice totals match."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(f"SELECT item_key, total FROM {INVOICES_TABLE}").fetchall()
    shipments = read_topic(bootstrap, SHIPMENTS, "read_committed")
    table_keys = collections.Counter(k for k, _ in rows)
    topic_keys = collections.Counter(r.key.decode() for r in shipments)
    width = 37
    lines, ok = [f"{'items in (CSV):':{width}} {len(expected):>8,}"], True
    for name, keys in (("invoice rows (PostgreSQL):", table_keys), ("shipments (Exactly, read_committed):", topic_keys)):
        dups = sum(n - 1 for n in keys.values() if n > 1)
        missing = len(set(expected) - set(keys))
        unexpected = len(set(keys) - set(expected))
        lines.append(f"{name:{width}} {sum(keys.values()):>8,}   duplicates {dups:,}   missing {missing:,}"
                     f"   unknown {unexpected:,}")
        ok &= sum(keys.values()) == len(expected) and dups == 0 and missing == 0 and unexpected == 0
    same = set(table_keys) == set(topic_keys)
    lines.append(f"{'same purchase ids in both:':{width}} {'yes' if same else 'NO':>8}")
    invoice_total = sum((Decimal(t) for _, t in rows), Decimal(0))
    csv_total = sum(Decimal(r["price"]) + Decimal(r["freight_value"]) for r in expected.values())
    lines.append(f"{'sum of invoice totals (table):':{width}} {invoice_total:>14,}")
    lines.append(f"{'sum of price + freight (CSV):':{width}} {csv_total:>14,}   "
                 f"{'match' if invoice_total == csv_total else 'MISMATCH'}")
    return lines, ok and same and invoice_total == csv_total


def run(run_dir: pathlib.Path, keep: bool, replication_factor: int, say: Callable[[str], None]) -> int:
    """The demo: a dev cluster with PostgreSQL, the items loaded, run_with_failures,
    the comparison. Returns 0 only when both sides are exact."""
    from exactly_tools.devcluster import DevCluster, replication_props

    from .common import fresh_run_dir, item_key, read_order_items, take_down

    rows = read_order_items()
    expected = {item_key(r): r for r in rows}
    fresh_run_dir(run_dir)
    say(f"Starting a dev cluster in {run_dir} with PostgreSQL (exactly-dev up --postgres; "
        f"replication factor {replication_factor}) ...")
    cluster = DevCluster(run_dir, props=replication_props(replication_factor))
    try:
        cluster.up(partition_leaders=3, txn_coordinators=1, group_coordinators=1, postgres=True)
        bootstrap, dsn = cluster.bootstrap_servers, cluster.postgres_dsn
        say(f"Cluster serving: bootstrap.servers={bootstrap}; PostgreSQL: {dsn}")
        create_topics(bootstrap, replication_factor)
        say(f"Loading {len(rows):,} order items into '{PURCHASES}' ...")
        load_purchases(bootstrap, rows)
        say("Running the pipeline (demo.pipeline_postgres): invoices -> PostgreSQL table "
            f"'{INVOICES_TABLE}', shipments -> topic '{SHIPMENTS}', one atomic transaction per poll")
        run_with_failures(cluster, dsn, len(rows), run_dir, say, replication_factor)
        say("Comparing the table and the topic ...")
        lines, ok = compare(bootstrap, dsn, expected)
        say("\n=== Summary ===")
        for line in lines:
            say(line)
        say("RESULT: exactly once in both" if ok else "RESULT: FAILED")
        return 0 if ok else 1
    finally:
        if not keep:
            take_down(cluster)
