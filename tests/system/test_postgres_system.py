"""Atomic PostgreSQL + Exactly transactions, system test on real processes: the
purchases pipeline writing invoices as PostgreSQL rows and shipments into Exactly
(demo.pipeline_postgres, exactly.postgres) on replication factor 3, with the worker
SIGKILLed at each of the four steps of a transaction (before prepare, after prepare,
after the database commit, after the completion), the transaction coordinator and a
partition leader SIGKILLed once; and a crash while PostgreSQL itself restarts. Both
sides must hold every input exactly once, and the same items
(docs/design.md, "Two-phase commit with a database").

EXACTLY_PG_ITEMS sets the number of items (make test: 800; the demo runs all 9,998)."""
from __future__ import annotations

import json
import os

import psycopg
import pytest

from demo.common import PURCHASES, item_key, read_order_items
from demo.postgres_purchases import PgWorker, compare, copied, create_topics, run_with_failures
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
