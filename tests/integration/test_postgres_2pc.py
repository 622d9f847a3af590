"""Atomic PostgreSQL + Exactly transactions (KIP-939 two-phase commit, exactly.postgres)
against a real cluster and a real PostgreSQL server (Debian's postgresql):
recovery of a prepared transaction commits it when the database holds its state and
aborts it when it does not; init_transactions(keep_prepared_txn=True) keeps a prepared
transaction that a plain init_transactions() would abort; the asyncio SDK does the same
(docs/design.md, "Two-phase commit with a database"). A zombie instance that comes
back after the new one recovered -- in its database transaction, or paused (SIGSTOP)
between its database COMMIT and its EndTxn -- is fenced, and both sides stay equal."""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import pathlib
import select
import signal
import subprocess
import sys
import threading

import psycopg
import pytest

from exactly import PreparedTxnState, Producer, errors
from exactly import postgres as exactly_pg
from exactly.aio import AIOProducer

from clusters import module_cluster, running_postgres

from waiting import wait_for

from .test_txn_prepare import _name, create_topic, read_values

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(zk, tmp_path_factory):
    """One cluster for the module (each test has its own topic and transactional.id)."""
    yield from module_cluster(zk, tmp_path_factory, "pg2pc")


@pytest.fixture(scope="module")
def postgres():
    """One PostgreSQL server for the module (each test has its own table)."""
    yield from running_postgres()


class Crash(Exception):
    """Stands for the process dying at a step: raised from on_step after the database
    commit, nothing is rolled back or aborted any more."""


def _producer(cluster, tid: str) -> Producer:
    return Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": tid,
                     "transaction.timeout.ms": 10000, "linger.ms": 5})


def _connect(postgres, table: str) -> psycopg.Connection:
    conn = psycopg.connect(postgres.dsn, autocommit=True, connect_timeout=10)
    conn.execute(f"CREATE TABLE {table} (v text NOT NULL)")
    return conn


def _table(conn, table: str) -> list[str]:
    return sorted(r[0] for r in conn.execute(f"SELECT v FROM {table}").fetchall())


def test_prepared_transaction_whose_state_the_database_holds_is_committed_at_recovery(cluster, postgres):
    topic, tid = create_topic(cluster), _name("pg-commit")
    values = [f"c{i}" for i in range(20)]
    with _connect(postgres, "rows_commit") as conn:
        first = _producer(cluster, tid)
        assert exactly_pg.recover(conn, first) == "none"

        def crash_after_commit(step: str) -> None:
            if step == "database_committed":
                raise Crash(step)

        with pytest.raises(Crash):
            with exactly_pg.transaction(conn, first, on_step=crash_after_commit) as tx:
                for v in values:
                    first.send(topic, v.encode(), partition=values.index(v) % 2)
                    tx.cursor.execute("INSERT INTO rows_commit (v) VALUES (%s)", (v,))
        prepared = first.prepared_transaction_state()
        first.close()  # leaves the prepared transaction open, as a crash would
        assert _table(conn, "rows_commit") == sorted(values)  # the database committed
        assert exactly_pg.stored_state(conn, tid) == prepared
        assert read_values(cluster, topic, 2, "read_committed", quiet_s=0.5) == []  # held by the LSO

        second = _producer(cluster, tid)
        assert exactly_pg.recover(conn, second) == "committed"
        assert read_values(cluster, topic, 2, "read_committed") == sorted(v.encode() for v in values)
        # The recovered producer goes on with a new transaction under a newer epoch.
        with exactly_pg.transaction(conn, second) as tx:
            second.send(topic, b"after", partition=0)
            tx.cursor.execute("INSERT INTO rows_commit (v) VALUES ('after')")
        assert exactly_pg.stored_state(conn, tid).epoch > prepared.epoch
        second.close()
        assert _table(conn, "rows_commit") == sorted([*values, "after"])
        assert read_values(cluster, topic, 2, "read_committed") == sorted([b"after", *(v.encode() for v in values)])


def test_prepared_transaction_whose_state_the_database_lacks_is_aborted_at_recovery(cluster, postgres):
    topic, tid = create_topic(cluster), _name("pg-abort")
    with _connect(postgres, "rows_abort") as conn:
        # An earlier transaction committed on both sides: its state stays in the table.
        first = _producer(cluster, tid)
        exactly_pg.recover(conn, first)
        with exactly_pg.transaction(conn, first) as tx:
            first.send(topic, b"kept", partition=0)
            tx.cursor.execute("INSERT INTO rows_abort (v) VALUES ('kept')")
        older = exactly_pg.stored_state(conn, tid)
        # The next one is prepared in the log, but the process dies before the database
        # commits: the database still holds the older state.
        first.begin_transaction()
        for i in range(10):
            first.send(topic, f"lost{i}".encode(), partition=i % 2)
        prepared = first.prepare_transaction()
        first.close()
        assert prepared != older and exactly_pg.stored_state(conn, tid) == older

        second = _producer(cluster, tid)
        assert exactly_pg.recover(conn, second) == "aborted"
        assert read_values(cluster, topic, 2, "read_committed") == [b"kept"]
        assert sorted(read_values(cluster, topic, 2, "read_uncommitted")) == \
            sorted([b"kept", *(f"lost{i}".encode() for i in range(10))])
        assert _table(conn, "rows_abort") == ["kept"]
        # The aborted transaction's epoch is fenced: the dead instance cannot commit it.
        with pytest.raises((errors.ProducerFencedError, errors.InvalidTxnStateError)):
            from exactly import complete_transaction
            complete_transaction(prepared, cluster.bootstrap_servers, commit=True, timeout=10)
        second.close()


def test_plain_init_transactions_aborts_what_keep_prepared_txn_keeps(cluster, postgres):
    topic, tid = create_topic(cluster), _name("keep")
    p = _producer(cluster, tid)
    p.init_transactions()
    p.begin_transaction()
    p.send(topic, b"x", partition=0)
    prepared = p.prepare_transaction()
    p.close()
    assert PreparedTxnState.deserialize(prepared.serialize()) == prepared

    keeper = _producer(cluster, tid)
    keeper.init_transactions(keep_prepared_txn=True)
    assert keeper.prepared_transaction_state() == prepared
    with pytest.raises(errors.IllegalStateError):
        keeper.begin_transaction()  # the kept transaction must be decided first
    with psycopg.connect(postgres.dsn, autocommit=True, connect_timeout=10) as conn:
        exactly_pg.create_tables(conn)
        with pytest.raises(errors.IllegalStateError):
            with exactly_pg.transaction(conn, keeper):
                pass
    assert keeper.prepared_transaction_state() == prepared  # not aborted by the failed block
    keeper.close()

    # Without keep_prepared_txn the prepared transaction is aborted (fencing).
    plain = _producer(cluster, tid)
    plain.init_transactions()
    assert plain.prepared_transaction_state() is None
    assert plain.complete_transaction(prepared) == "none"
    plain.close()
    assert read_values(cluster, topic, 2, "read_committed") == []


def test_asyncio_producer_keeps_and_completes_a_prepared_transaction(cluster):
    topic, tid = create_topic(cluster), _name("aio-keep")
    conf = {"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": tid, "linger.ms": 5}

    async def scenario() -> str:
        first = AIOProducer(conf)
        await first.init_transactions(keep_prepared_txn=True)
        first.begin_transaction()
        await first.send(topic, b"aio", partition=1)
        state = (await first.prepare_transaction()).serialize()  # stored elsewhere as a string
        await first.close()
        second = AIOProducer(conf)
        await second.init_transactions(keep_prepared_txn=True)
        outcome = await second.complete_transaction(state)
        await second.close()
        return outcome

    assert asyncio.run(scenario()) == "committed"
    assert read_values(cluster, topic, 2, "read_committed") == [b"aio"]


def test_dev_cluster_postgres_is_recorded_in_cluster_json_and_removed_by_down(tmp_path):
    from exactly_tools.devcluster import DevCluster
    dev = DevCluster(tmp_path / "dev")
    dev.start_postgres()
    loaded = DevCluster.load(tmp_path / "dev")  # as `exactly-dev down` finds it
    assert loaded.postgres_dsn == dev.postgres_dsn and loaded.postgres["port"] > 0
    with psycopg.connect(loaded.postgres_dsn, connect_timeout=10) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    data_dir = loaded.postgres_server.data_dir
    assert data_dir.is_dir()
    loaded.down()
    assert not data_dir.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(loaded.postgres_dsn, connect_timeout=3)


def test_recovery_waits_for_a_zombie_inside_its_database_transaction(cluster, postgres):
    topic, tid = create_topic(cluster), _name("pg-zombie")
    at_prepared, release = threading.Event(), threading.Event()

    def hold(step: str) -> None:
        if step == "prepared":
            at_prepared.set()
            assert release.wait(60)

    with _connect(postgres, "rows_zombie") as conn:
        zombie = _producer(cluster, tid)
        exactly_pg.recover(conn, zombie)

        def zombie_work() -> None:
            with exactly_pg.transaction(conn, zombie, on_step=hold) as tx:
                zombie.send(topic, b"z", partition=0)
                tx.cursor.execute("INSERT INTO rows_zombie (v) VALUES ('z')")

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            zombie_done = pool.submit(zombie_work)
            assert at_prepared.wait(60)
            # A new instance while the zombie holds the row lock inside its database
            # transaction: it keeps the prepared transaction and waits for the lock.
            with psycopg.connect(postgres.dsn, autocommit=True, connect_timeout=10) as conn2:
                impatient = _producer(cluster, tid)
                with pytest.raises(psycopg.errors.LockNotAvailable):
                    exactly_pg.recover(conn2, impatient, timeout=1)
                impatient.close()
                successor = _producer(cluster, tid)
                recovered = pool.submit(exactly_pg.recover, conn2, successor, 60)
                with psycopg.connect(postgres.dsn, autocommit=True, connect_timeout=10) as watcher:
                    wait_for(lambda: watcher.execute("SELECT count(*) FROM pg_stat_activity "
                                                     "WHERE wait_event_type = 'Lock'").fetchone()[0] == 1
                             or recovered.done(), 60, "the successor to wait for the row lock")
                assert not recovered.done()
                release.set()  # the zombie commits the database, then is fenced in the log
                with pytest.raises(errors.ProducerFencedError):
                    zombie_done.result(60)
                assert recovered.result(60) == "committed"  # the database decided: commit, once
                # The zombie is fenced for good; the successor goes on.
                with pytest.raises(errors.ProducerFencedError):
                    zombie_work()
                with exactly_pg.transaction(conn2, successor) as tx:
                    successor.send(topic, b"s", partition=0)
                    tx.cursor.execute("INSERT INTO rows_zombie (v) VALUES ('s')")
                successor.close()
        zombie.close()
        assert _table(conn, "rows_zombie") == ["s", "z"]
    assert read_values(cluster, topic, 2, "read_committed") == [b"s", b"z"]


def _stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP): state T in /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def _line(proc: subprocess.Popen, timeout_s: float = 60) -> dict:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"no line from the zombie process within {timeout_s} s"
    line = proc.stdout.readline()
    assert line, f"the zombie process exited ({proc.poll()})"
    return json.loads(line)


def test_zombie_paused_between_its_database_commit_and_its_end_txn_is_fenced(cluster, postgres):
    """Steps 1-5 with exactly.postgres and real processes: the old instance (a process
    of its own) commits its unit of work in the database and is stopped (SIGSTOP)
    before its EndTxn; the new instance recovers -- the database holds the state, so
    it commits the transaction -- and goes on; the old one, continued (SIGCONT), is
    fenced: its EndTxn and its next unit raise ProducerFencedError. Table and topic
    hold the same units, each once."""
    topic, tid = create_topic(cluster), _name("pg-paused")
    values = [f"z{i}" for i in range(5)]
    with _connect(postgres, "rows_paused") as conn:
        zombie = subprocess.Popen(
            [sys.executable, str(pathlib.Path(__file__).with_name("pg_zombie.py")), cluster.bootstrap_servers,
             postgres.dsn, tid, topic, "rows_paused", ",".join(values)],
            stdout=subprocess.PIPE, text=True)
        try:
            assert _line(zombie) == {"stopping": "database_committed"}
            wait_for(lambda: _stopped(zombie.pid), 30, "the zombie to stop")
            assert _table(conn, "rows_paused") == values  # its database transaction committed
            successor = _producer(cluster, tid)
            assert exactly_pg.recover(conn, successor) == "committed"
            assert read_values(cluster, topic, 2, "read_committed") == sorted(v.encode() for v in values)
            zombie.send_signal(signal.SIGCONT)  # right after the recovery, before the successor's next unit
            assert _line(zombie) == {"unit": "ProducerFencedError"}
            assert _line(zombie) == {"next": "ProducerFencedError"}
            assert zombie.wait(60) == 0
            for value, partition in (("live", 0), ("after", 1)):  # the successor is not fenced by it
                with exactly_pg.transaction(conn, successor) as tx:
                    successor.send(topic, value.encode(), partition=partition)
                    tx.cursor.execute("INSERT INTO rows_paused (v) VALUES (%s)", (value,))
            successor.close()
        finally:
            if zombie.poll() is None:
                zombie.kill()
                zombie.wait(30)
        expected = sorted([*values, "live", "after"])
        assert _table(conn, "rows_paused") == expected
    assert read_values(cluster, topic, 2, "read_committed") == [v.encode() for v in expected]
    assert sorted(read_values(cluster, topic, 2, "read_uncommitted")) == [v.encode() for v in expected]
