"""Atomic writes to PostgreSQL and Exactly in one transaction (KIP-939 two-phase commit,
with the database as the transaction manager), on psycopg 3.

The recipe (docs/design.md, "Two-phase commit with a database"; docs/postgres.md, "Atomic
writes to PostgreSQL and Exactly"):

1. in one database transaction: lock this transactional.id's row of the table the
   helper owns (`exactly_prepared_txn`), write the application's rows, send the
   records of the log transaction;
2. `producer.prepare_transaction()` -> PreparedTxnState;
3. store the state in the locked row (and, optionally, the consumed offsets in
   `exactly_consumer_offsets`), COMMIT the database transaction;
4. `producer.complete_transaction(state)`: the log transaction commits.

After a crash anywhere, `recover()` at start-up (with a new producer of the same
transactional.id) runs `init_transactions(keep_prepared_txn=True)`, reads the state
back from the database and completes the kept transaction: committed when the
database holds its state (the database committed: step 3 was reached), aborted
otherwise. The row lock makes a zombie instance's database transaction finish first.

    with psycopg.connect(dsn, autocommit=True) as conn:
        producer = Producer({..., "transactional.id": "orders-1"})
        exactly.postgres.recover(conn, producer)
        with exactly.postgres.transaction(conn, producer) as tx:
            tx.cursor.execute("INSERT INTO invoices ...")
            producer.send("shipments", ...)
            tx.store_offsets({TopicPartition("purchases", 0): 42}, "pipeline")  # or send_offsets_to_transaction
        # here both the rows and the records are committed

Errors: what psycopg raises (psycopg.Error) and what the producer raises. When the
database COMMIT itself fails its outcome is unknown: the log transaction is left
prepared, and the error is raised; the application restarts the producer and calls
recover(), which decides from what the database holds.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Callable, Iterator, Mapping

try:
    import psycopg
    from psycopg import pq
except ImportError as _exc:  # pragma: no cover - depends on the installation
    from exactly_wire import DISTRIBUTION
    raise ImportError(f"exactly.postgres needs psycopg 3: pip install '{DISTRIBUTION}[postgres]'") from _exc

from ._two_phase import PreparedTxnState
from .producer import Producer
from .types import OffsetAndMetadata, TopicPartition

log = logging.getLogger(__name__)

STATE_TABLE = "exactly_prepared_txn"
OFFSETS_TABLE = "exactly_consumer_offsets"

# The steps of transaction(), in order, as passed to its on_step callback.
STEPS = ("before_prepare", "prepared", "database_committed", "completed")

_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {STATE_TABLE} ("
    " transactional_id text PRIMARY KEY,"
    " producer_id bigint NOT NULL DEFAULT -1,"
    " producer_epoch integer NOT NULL DEFAULT -1,"
    " updated_at timestamptz NOT NULL DEFAULT now())",
    f"CREATE TABLE IF NOT EXISTS {OFFSETS_TABLE} ("
    " group_id text NOT NULL, topic text NOT NULL, partition integer NOT NULL,"
    " committed_offset bigint NOT NULL,"
    " PRIMARY KEY (group_id, topic, partition))",
)


def create_tables(conn: psycopg.Connection) -> None:
    """Create the helper's tables when missing: exactly_prepared_txn (transactional_id,
    producer_id, producer_epoch, updated_at) and exactly_consumer_offsets (group_id,
    topic, partition, committed_offset). Runs in its own database transaction."""
    _require_idle(conn)
    with conn.transaction(), conn.cursor() as cur:
        # Two first starts at once would both try to create the tables.
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (STATE_TABLE,))
        for statement in _SCHEMA:
            cur.execute(statement)


def _require_idle(conn: psycopg.Connection) -> None:
    if conn.info.transaction_status != pq.TransactionStatus.IDLE:
        raise psycopg.ProgrammingError("exactly.postgres needs a connection outside any transaction "
                                       "(autocommit=True, or commit first): its transaction must really commit")


# How long taking the state row's lock may wait (another instance inside its database
# transaction) when the caller gives no timeout: psycopg.errors.LockNotAvailable past it.
DEFAULT_LOCK_TIMEOUT_S = 60.0


def _lock_state(cur: psycopg.Cursor, transactional_id: str, timeout: float | None) -> PreparedTxnState | None:
    """Lock this transactional.id's state row (created when missing), waiting at most
    `timeout` seconds (default DEFAULT_LOCK_TIMEOUT_S); return the stored state, None
    when none was ever stored."""
    wait_ms = int(1000 * (DEFAULT_LOCK_TIMEOUT_S if timeout is None else timeout))
    cur.execute("SELECT set_config('lock_timeout', %s, true)", (f"{max(wait_ms, 1)}ms",))
    cur.execute(f"INSERT INTO {STATE_TABLE} (transactional_id) VALUES (%s) ON CONFLICT DO NOTHING",
                (transactional_id,))
    cur.execute(f"SELECT producer_id, producer_epoch FROM {STATE_TABLE} WHERE transactional_id = %s FOR UPDATE",
                (transactional_id,))
    pid, epoch = cur.fetchone()
    return None if pid < 0 else PreparedTxnState(transactional_id, pid, epoch)


def stored_state(conn: psycopg.Connection, transactional_id: str) -> PreparedTxnState | None:
    """The PreparedTxnState last committed to the database for `transactional_id`
    (None when none). Reads in its own database transaction."""
    _require_idle(conn)
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(f"SELECT producer_id, producer_epoch FROM {STATE_TABLE} WHERE transactional_id = %s",
                    (transactional_id,))
        row = cur.fetchone()
    return None if row is None or row[0] < 0 else PreparedTxnState(transactional_id, row[0], row[1])


def recover(conn: psycopg.Connection, producer: Producer, timeout: float | None = None) -> str:
    """Start-up of a transactional producer whose transactions are decided by the
    database: create the tables when missing, `init_transactions(keep_prepared_txn=True)`,
    then, holding the state row's lock (so a zombie instance's database transaction
    ends first), complete the kept prepared transaction with the state the database
    holds: commit when it is that transaction's, abort otherwise. `producer`: a new,
    uninitialised Producer with transactional.id; `timeout` in seconds per producer
    call (default max.block.ms).

    Returns "committed", "aborted" or "none" (no prepared transaction was kept).
    Raises psycopg.errors.LockNotAvailable when another instance holds the row lock
    longer than `timeout` (default 60 s); errors.ProducerFencedError when another instance of the
    transactional.id initialised after this one (it decides now), the producer's other errors,
    psycopg.Error. The coordinator never aborts a prepared transaction by itself, so what the
    database committed is never aborted in the log behind its back.
    """
    tid = producer.transactional_id
    if not tid:
        raise ValueError("exactly.postgres.recover needs a producer with transactional.id")
    create_tables(conn)
    producer.init_transactions(timeout=timeout, keep_prepared_txn=True)
    with conn.transaction(), conn.cursor() as cur:
        stored = _lock_state(cur, tid, timeout)
    prepared = producer.prepared_transaction_state()
    outcome = producer.complete_transaction(stored, timeout=timeout)
    if prepared is not None:
        log.info("recovery of %s: prepared transaction (PID %d epoch %d) %s; the database holds %s", tid,
                 prepared.producer_id, prepared.epoch, outcome, stored)
    return outcome


class DatabaseTransaction:
    """The database side of one `transaction()` block: `connection`, `cursor` (use it
    for the application's writes: they commit with the log transaction), and
    `store_offsets()`."""

    def __init__(self, connection: psycopg.Connection, cursor: psycopg.Cursor):
        self.connection = connection
        self.cursor = cursor
        self._offsets: dict[tuple[str, TopicPartition], int] = {}

    def store_offsets(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int], group_id: str) -> None:
        """Commit these consumed offsets (the next offset to read, per partition) in the
        database transaction, table exactly_consumer_offsets, under `group_id`; read
        them back with `committed_offsets()`. (Offsets may instead go into the log
        transaction with producer.send_offsets_to_transaction.)"""
        for tp, om in offsets.items():
            off = om.offset if isinstance(om, OffsetAndMetadata) else int(om)
            if off < 0:
                raise ValueError(f"offset of {tp} must be >= 0, not {off}")
            self._offsets[(group_id, TopicPartition(*tp))] = off

    def _write_offsets(self) -> None:
        if self._offsets:
            self.cursor.executemany(
                f"INSERT INTO {OFFSETS_TABLE} (group_id, topic, partition, committed_offset) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (group_id, topic, partition) "
                "DO UPDATE SET committed_offset = EXCLUDED.committed_offset",
                [(g, tp.topic, tp.partition, off) for (g, tp), off in self._offsets.items()])


def committed_offsets(conn: psycopg.Connection, group_id: str,
                      partitions: list[TopicPartition] | None = None) -> dict[TopicPartition, int]:
    """The offsets store_offsets() committed for `group_id` (the next offset to read),
    optionally only of `partitions`. Reads in its own database transaction."""
    _require_idle(conn)
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(f"SELECT topic, partition, committed_offset FROM {OFFSETS_TABLE} WHERE group_id = %s",
                    (group_id,))
        found = {TopicPartition(t, p): o for t, p, o in cur.fetchall()}
    if partitions is not None:
        wanted = {TopicPartition(*tp) for tp in partitions}
        found = {tp: o for tp, o in found.items() if tp in wanted}
    return found


@contextlib.contextmanager
def transaction(conn: psycopg.Connection, producer: Producer, timeout: float | None = None,
                on_step: Callable[[str], None] | None = None) -> Iterator[DatabaseTransaction]:
    """One atomic unit of work over PostgreSQL and Exactly (the recipe above): opens a
    database transaction on `conn` (which must be outside any transaction) and locks
    the transactional.id's state row, begins the log transaction, and yields a
    DatabaseTransaction for the block's writes. When the block ends normally:
    prepare_transaction(), store the PreparedTxnState and offsets, COMMIT the database,
    complete_transaction(state). When it raises: the database rolls back, the log
    transaction is aborted, the exception propagates. `producer`: an initialised
    (recover()) transactional Producer without an open transaction; `timeout` in
    seconds per producer call. `on_step(name)`: called at each of STEPS
    ("before_prepare", "prepared", "database_committed", "completed"), for tracing.

    A failure of the database COMMIT (unknown outcome) leaves the log transaction
    prepared and raises: restart the producer and call recover(). Raises the
    producer's errors (the database is then rolled back) and psycopg.Error (among
    them LockNotAvailable when the row lock is not had within `timeout`, default 60 s)."""
    tid = producer.transactional_id
    if not tid:
        raise ValueError("exactly.postgres.transaction needs a producer with transactional.id")
    _require_idle(conn)
    step = on_step or (lambda _name: None)
    db_txn = conn.transaction()
    db_txn.__enter__()
    state: PreparedTxnState | None = None
    began = False  # a transaction this call did not begin (e.g. a kept one) is never aborted here
    try:
        with conn.cursor() as cur:
            _lock_state(cur, tid, timeout)
            producer.begin_transaction()
            began = True
            work = DatabaseTransaction(conn, cur)
            yield work
            step("before_prepare")
            state = producer.prepare_transaction(timeout)
            step("prepared")
            cur.execute(f"UPDATE {STATE_TABLE} SET producer_id = %s, producer_epoch = %s, updated_at = now() "
                        "WHERE transactional_id = %s", (state.producer_id, state.epoch, tid))
            work._write_offsets()
    except BaseException as exc:
        _rollback(db_txn, exc)
        if began:
            _abort_log(producer, exc)
        raise
    db_txn.__exit__(None, None, None)  # COMMIT; on failure the log transaction stays prepared
    step("database_committed")
    producer.complete_transaction(state, timeout)
    step("completed")


def _rollback(db_txn, exc: BaseException) -> None:
    try:
        db_txn.__exit__(type(exc), exc, exc.__traceback__)
    except psycopg.Error as rollback_exc:  # the connection is gone: the database rolled back itself
        log.warning("database rollback failed (%s); the server rolls the transaction back", rollback_exc)


def _abort_log(producer: Producer, exc: BaseException) -> None:
    from . import errors
    from ._txn_manager import TransactionManagerState as S
    try:
        if producer._txn.state in (S.IN_TRANSACTION, S.PREPARED_TRANSACTION, S.ABORTABLE_ERROR):
            producer.abort_transaction()
    except errors.ExactlyError as abort_exc:
        log.warning("aborting the log transaction after %r failed: %r (recover() decides it at the next start)",
                    exc, abort_exc)


__all__ = ["transaction", "recover", "create_tables", "stored_state", "committed_offsets", "DatabaseTransaction",
           "STATE_TABLE", "OFFSETS_TABLE", "STEPS", "DEFAULT_LOCK_TIMEOUT_S"]
