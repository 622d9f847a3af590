"""The purchases worker writing invoices as PostgreSQL rows and shipments into Exactly,
atomically (exactly.postgres: KIP-939 two-phase commit, the database deciding).

    python -m demo.pipeline_postgres --bootstrap-servers H:P[,H:P] --dsn DSN
        [--transactional-id ID] [--status-file F] [--max-records 100]
        [--hold-at STEP --hold-after N [--pause]]

Each poll's records become one unit of work: an `invoices` row and a `shipments`
record per purchased item, plus the consumed offsets in the same database
transaction (exactly_consumer_offsets), all committed by exactly.postgres.transaction.
At start-up, and again after losing the database or the log mid-way, the worker
makes a new producer and runs exactly.postgres.recover(), which completes a kept
prepared transaction as the database says, then continues from the database's offsets.

--hold-at STEP (before_prepare, prepared, database_committed, completed) makes the
worker, once it has copied N items, stop at that step of a transaction, report
"holding" in the status file and wait there until it is killed; with --pause it
stops itself there with SIGSTOP instead, and goes on where it was when continued
(SIGCONT). A worker fenced by a newer instance of its transactional.id
(ProducerFencedError) reports "fenced" and exits: the newer one owns the work. Runs
until SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import signal
import sys
import time

import psycopg

from exactly import Consumer, Producer, TopicPartition, errors
from exactly import postgres as exactly_pg

from .common import PURCHASES, SHIPMENTS, invoice_for, item_key, shipment_for

GROUP_ID = "purchases-pipeline-pg"
TRANSACTIONAL_ID = "purchases-pipeline-pg-0"
PARTITIONS = 3
INVOICES_TABLE = "invoices"

_stop = False


def _on_signal(signum, frame) -> None:
    global _stop
    _stop = True


def _status(path: pathlib.Path | None, **fields) -> None:
    if path is not None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(fields))
        tmp.replace(path)


def create_invoices_table(conn: psycopg.Connection) -> None:
    """The application's table (no unique key on the item: a duplicate would show)."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (INVOICES_TABLE,))
        cur.execute(f"CREATE TABLE IF NOT EXISTS {INVOICES_TABLE} (id bigserial PRIMARY KEY, item_key text NOT NULL,"
                    " order_id text NOT NULL, seller_id text NOT NULL, price numeric NOT NULL,"
                    " freight_value numeric NOT NULL, total numeric NOT NULL)")


def connect(dsn: str, status) -> psycopg.Connection:
    """Connect (autocommit), retrying while the server is down or starting, until stopped."""
    while True:
        try:
            return psycopg.connect(dsn, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:
            if _stop:
                raise
            status("waiting for the database")
            print(f"pipeline: database unavailable ({str(exc).strip()[:120]}); retrying", file=sys.stderr)
            time.sleep(0.5)


def run(args: argparse.Namespace) -> int:
    status_file = pathlib.Path(args.status_file) if args.status_file else None

    recovery: dict[str, str] = {}  # the last recover() outcome, kept in every status

    def status(state: str, **extra) -> None:
        _status(status_file, state=state, **recovery, **extra)

    parts = [TopicPartition(PURCHASES, p) for p in range(PARTITIONS)]
    consumer = Consumer({"bootstrap.servers": args.bootstrap_servers, "isolation.level": "read_committed",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign(parts)
    producer_conf = {"bootstrap.servers": args.bootstrap_servers, "transactional.id": args.transactional_id,
                     "transaction.timeout.ms": 60000, "linger.ms": 5}
    status("starting")
    fenced = False
    try:
        while not _stop and not fenced:
            conn = connect(args.dsn, status)
            producer = Producer(producer_conf)
            try:
                create_invoices_table(conn)
                outcome = exactly_pg.recover(conn, producer)
                offsets = exactly_pg.committed_offsets(conn, GROUP_ID, parts)
                print(f"pipeline: recovered (prepared transaction: {outcome}); offsets {offsets}", file=sys.stderr)
                for tp in parts:
                    if tp in offsets:
                        consumer.seek(tp, offsets[tp])
                    else:
                        consumer.seek_to_beginning([tp])
                copied = sum(offsets.values())
                recovery["recovered"] = outcome
                status("running", copied=copied)
                copy_loop(args, conn, consumer, producer, status, lambda n, base=copied: n + base)
            except errors.ProducerFencedError as exc:
                # A newer instance of the transactional.id took over (KIP-939 recovery
                # fences the old instance): its recover() decides what was left; stop.
                print(f"pipeline: fenced by a newer instance ({exc}); stopping", file=sys.stderr)
                fenced = True
            except (psycopg.OperationalError, errors.ExactlyError) as exc:
                # The database or the log failed mid-way: start over with a new producer,
                # whose recover() decides any transaction left prepared.
                print(f"pipeline: {exc!r}; recovering with a new producer", file=sys.stderr)
                time.sleep(0.5)
            finally:
                producer.close()
                conn.close()
    finally:
        status("fenced" if fenced else "stopped")
        consumer.close()
    return 0


def copy_loop(args, conn, consumer, producer, status, total_after) -> None:
    done = 0

    def on_step(step: str) -> None:
        if step == args.hold_at and total_after(done) >= args.hold_after:
            producer.flush()
            status("holding", step=step)
            if args.pause:
                args.hold_at = None  # once: continued, the worker goes on with this transaction
                os.kill(os.getpid(), signal.SIGSTOP)
                return
            while True:  # at this step of the transaction, until killed
                time.sleep(1)

    while not _stop:
        batch = consumer.poll(timeout=0.5, max_records=args.max_records)
        if not batch:
            continue
        with exactly_pg.transaction(conn, producer, on_step=on_step) as tx:
            rows, offsets = [], {}
            for rec in batch:
                purchase = json.loads(rec.value)
                key = item_key(purchase)
                inv = invoice_for(purchase)
                rows.append((key, inv["order_id"], inv["seller_id"], inv["price"], inv["freight_value"], inv["total"]))
                producer.send(SHIPMENTS, json.dumps(shipment_for(purchase)).encode(), key=key.encode())
                offsets[TopicPartition(rec.topic, rec.partition)] = rec.offset + 1
            tx.cursor.executemany(f"INSERT INTO {INVOICES_TABLE} (item_key, order_id, seller_id, price, "
                                  "freight_value, total) VALUES (%s, %s, %s, %s, %s, %s)", rows)
            tx.store_offsets(offsets, GROUP_ID)
        done += len(batch)
        status("running", copied=total_after(done))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.pipeline_postgres", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--transactional-id", default=TRANSACTIONAL_ID)
    parser.add_argument("--status-file")
    parser.add_argument("--max-records", type=int, default=100)
    parser.add_argument("--hold-at", choices=exactly_pg.STEPS)
    parser.add_argument("--hold-after", type=int, default=0)
    parser.add_argument("--pause", action="store_true", help="at the hold point, stop with SIGSTOP (until SIGCONT)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
