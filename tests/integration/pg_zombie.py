"""A zombie producer instance of exactly.postgres in a process of its own: one unit of
work (rows in TABLE, records in TOPIC partition 0) whose process stops itself with
SIGSTOP between its database COMMIT and its EndTxn, as a process paused there by the
operating system, a debugger or a long GC would be. Once continued (SIGCONT) it
finishes the unit, then tries another one.

    python pg_zombie.py BOOTSTRAP DSN TRANSACTIONAL_ID TOPIC TABLE VALUE[,VALUE...]

Prints JSON lines: {"stopping": step} just before the SIGSTOP, then {"unit": "done"}
or {"unit": error class name}, then {"next": "done" or error class name}.
"""
from __future__ import annotations

import json
import os
import signal
import sys

import psycopg

from exactly import Producer
from exactly import postgres as exactly_pg


def _say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def _outcome(fn) -> str:
    try:
        fn()
        return "done"
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return type(exc).__name__


def main(bootstrap: str, dsn: str, tid: str, topic: str, table: str, values: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5,
                         "max.block.ms": 30000, "request.timeout.ms": 10000})

    def pause(step: str) -> None:
        if step == "database_committed":
            _say(stopping=step)
            os.kill(os.getpid(), signal.SIGSTOP)

    def unit(rows: list[str], on_step=None) -> None:
        with exactly_pg.transaction(conn, producer, timeout=30, on_step=on_step) as tx:
            for v in rows:
                producer.send(topic, v.encode(), partition=0)
                tx.cursor.execute(f"INSERT INTO {table} (v) VALUES (%s)", (v,))

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        exactly_pg.recover(conn, producer, timeout=30)
        _say(unit=_outcome(lambda: unit(values.split(","), pause)))
        _say(next=_outcome(lambda: unit(["zombie-next"])))
    producer.close(5)


if __name__ == "__main__":
    main(*sys.argv[1:7])
