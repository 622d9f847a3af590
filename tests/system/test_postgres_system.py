"""Atomic PostgreSQL + Exactly transactions, system test on real processes: the
purchases pipeline writing invoices as PostgreSQL rows and shipments into Exactly
(demo.pipeline_postgres, exactly.postgres) on replication factor 3, with the worker
SIGKILLed at each of the four steps of a transaction (before prepare, after prepare,
after the database commit, after the completion), the transaction coordinator and a
partition leader SIGKILLed once; and a crash while PostgreSQL itself restarts. Both
sides must hold every input exactly once, and the same items
(docs/design.md, "Two-phase commit with a database"). The same with the worker paused
(SIGSTOP) at each step instead, and continued once its successor recovered: the old
worker is fenced, both sides stay equal.

EXACTLY_PG_ITEMS sets the number of items (make test: 800; the demo runs all 9,998)."""
from __future__ import annotations

import json
import os
import subprocess
import time

import psycopg
import pytest

from demo.common import PURCHASES, item_key, read_order_items
from demo.postgres_purchases import (KILL_POINTS, PgWorker, compare, copied, create_topics, run_with_failures,
                                    wait_until)
from exactly import Producer
from exactly_tools.devcluster import replication_props
from waiting import wait_for

pytestmark = pytest.mark.integration

ITEMS = int(os.environ.get("EXACTLY_PG_ITEMS", "800"))


def _load(bootstrap: str, rows: list[dict]) -> None:
    with Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                   "linger.ms": 10}) as p:
        for row in rows:
            p.send(PURCHASES, json.dumps(row).encode(), key=row["order_id"].encode())
        p.flush(60)


def _assert_equal(bootstrap: str, dsn: str, rows: list[dict]) -> None:
    lines, ok = compare(bootstrap, dsn, {item_key(r): r for r in rows})
    assert ok, "\n".join(lines)


def test_pipeline_killed_at_every_step_and_with_its_cluster_keeps_table_and_topic_equal(make_cluster, postgres,
                                                                                          tmp_path):
    cluster = make_cluster(props=replication_props(3))
    create_topics(cluster.bootstrap_servers, 3)
    rows = read_order_items()[:ITEMS]
    _load(cluster.bootstrap_servers, rows)
    events = run_with_failures(cluster, postgres.dsn, len(rows), tmp_path, print, replication_factor=3,
                               timeout_s=600, max_records=25)
    assert len(events) == 6, events  # four worker kills, the coordinator, the partition leader
    _assert_equal(cluster.bootstrap_servers, postgres.dsn, rows)
    # What each restarted worker's recovery found, by where its predecessor was killed:
    # before prepare -> aborted by InitProducerId, nothing kept; after prepare -> the
    # database lacks the state: aborted; after the database commit -> committed; after
    # completion -> nothing prepared.
    found = [_recovery(tmp_path, f"pg-worker-{n}") for n in (2, 3, 4, 5)]
    assert found == ["none", "aborted", "committed", "none"], found


def _lock_waiters(dsn: str) -> int:
    """Sessions of the database waiting for a lock (a new worker's recover() waiting for
    the state row a paused worker holds)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()[0]


def test_pipeline_paused_at_every_step_and_resumed_after_its_successor_recovered_keeps_table_and_topic_equal(
        cluster, postgres, tmp_path):
    """The old worker is not killed but paused (SIGSTOP) at each of the four steps of
    a transaction; a new worker with the same transactional.id starts and recovers
    (its init_transactions(keep_prepared_txn=True) fences the old one; its recover()
    then waits for the state row the paused one holds, or decides at once); then the
    old one is continued (SIGCONT): whatever it does next is fenced, it reports
    "fenced" and exits. Every item is once in the table and once in the topic."""
    create_topics(cluster.bootstrap_servers, 1)
    rows = read_order_items()[:ITEMS]
    _load(cluster.bootstrap_servers, rows)
    dsn, total = postgres.dsn, len(rows)
    deadline = time.monotonic() + 600

    def worker(n: int) -> PgWorker:
        hold = {}
        if n <= len(KILL_POINTS):
            step, share = KILL_POINTS[n - 1]
            hold = {"hold_at": step, "hold_after": int(total * share), "pause": True}
        return PgWorker(cluster.bootstrap_servers, dsn, tmp_path, f"pg-paused-{n}", max_records=25, cluster=cluster,
                        **hold)

    old = worker(1)
    try:
        for n, (step, _share) in enumerate(KILL_POINTS, 1):
            wait_until(f"worker {n} to stop at '{step}'", lambda: old.status().get("state") == "holding"
                       and old.stopped(), [old], deadline)
            new = worker(n + 1)
            wait_until(f"worker {n + 1} to recover or wait for the state row worker {n} holds",
                       lambda: "recovered" in new.status() or _lock_waiters(dsn) > 0, [new], deadline)
            old.cont()
            try:  # a fenced worker stops within seconds; one that is not goes on copying
                old.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                pytest.fail(f"worker {n}, continued after '{step}', was not fenced: {old.status()}")
            assert old.status().get("state") == "fenced", (step, old.status())
            old.stop()
            old = new
        wait_until("every item to be copied", lambda: copied(dsn) >= total, [old], deadline)
    finally:
        old.stop()
    _assert_equal(cluster.bootstrap_servers, dsn, rows)
    # Paused before prepare: the successor's InitProducerId aborted the open transaction
    # (nothing kept); after prepare: the paused worker, continued, committed the database,
    # which then decided the kept transaction: committed; after the database commit:
    # committed; after completion: nothing prepared.
    found = [_recovery(tmp_path, f"pg-paused-{n}") for n in (2, 3, 4, 5)]
    assert found == ["none", "committed", "committed", "none"], found
    for n in (1, 2, 3, 4):
        assert "fenced by a newer instance" in (tmp_path / "logs" / f"pg-paused-{n}.log").read_text()


def _recovery(run_dir, name: str) -> str:
    log = (run_dir / "logs" / f"{name}.log").read_text()
    return log.split("recovered (prepared transaction: ", 1)[1].split(")", 1)[0]


def test_crash_while_postgresql_restarts_leaves_both_sides_equal(cluster, postgres, tmp_path):
    create_topics(cluster.bootstrap_servers, 1)
    rows = read_order_items()[:400]
    _load(cluster.bootstrap_servers, rows)
    dsn = postgres.dsn
    # A transaction prepared in the log, its database transaction open: PostgreSQL
    # crashes (immediate stop, recovered from its WAL at the next start) and the worker
    # is SIGKILLed while the database is down.
    first = PgWorker(cluster.bootstrap_servers, dsn, tmp_path, "pg-restart-1", hold_at="prepared", hold_after=100,
                     max_records=25)
    wait_for(lambda: first.status().get("state") == "holding" or first.check_alive(), 120, "worker at 'prepared'")
    postgres.stop("immediate")
    first.kill()
    second = PgWorker(cluster.bootstrap_servers, dsn, tmp_path, "pg-restart-2", max_records=25)
    try:
        wait_for(lambda: second.status().get("state") == "waiting for the database" or second.check_alive(), 120,
                 "the new worker to wait for the database")
        postgres.start()
        wait_for(lambda: copied(dsn) >= 200 or second.check_alive(), 120, "progress after the restart")
        # PostgreSQL restarts again under the running worker: its database commit or
        # next statement fails, it recovers with a new producer.
        postgres.stop("immediate")
        postgres.start()
        wait_for(lambda: copied(dsn) >= len(rows) or second.check_alive(), 180, "every item copied")
    finally:
        second.stop()
    _assert_equal(cluster.bootstrap_servers, dsn, rows)
    # The comparison fails when the two sides differ (one invoice row lost).
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM invoices WHERE id = (SELECT min(id) FROM invoices)")
    lines, ok = compare(cluster.bootstrap_servers, dsn, {item_key(r): r for r in rows})
    assert not ok and any("missing 1" in line for line in lines), lines
    log = (tmp_path / "logs" / "pg-restart-2.log").read_text()
    # The transaction the first worker prepared was not in the database: aborted.
    assert "recovered (prepared transaction: aborted)" in log, log[-3000:]
