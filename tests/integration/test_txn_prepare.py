"""Two-phase commit (in the spirit of KIP-939) against a real cluster:
Producer.prepare_transaction() seals a transaction that another process completes
with exactly.complete_transaction(); the coordinator never aborts a prepared
transaction (not after transaction.timeout.ms, nor when a new owner's clock says it
is old), it survives a transaction coordinator restart, and is fenced by a newer
epoch (docs/design.md, "Transactions")."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

from exactly import (AdminClient, Consumer, NewTopic, PreparedTransaction, Producer, TopicPartition,
                     complete_transaction, errors)
from exactly._client import COORDINATOR_TRANSACTION
from exactly_tools.devcluster import DevCluster

import clockfault
from clockfault import clock_faults  # noqa: F401 - fixture: fails without libfaketime
from clusters import REPLICATED_TXN_LOG, new_chroot
from waiting import wait_for

pytestmark = pytest.mark.integration

FAST_TIMEOUTS = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "200"}


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(cluster, partitions: int = 2) -> str:
    topic = _name("t")
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(topic, partitions)], timeout=60)
    return topic


def read_values(cluster, topic: str, partitions: int, isolation: str, quiet_s: float = 1.5) -> list[bytes]:
    c = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "isolation.level": isolation,
                  "enable.auto.commit": False, "fetch.max.wait.ms": 100})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(tps)
        out: list[bytes] = []
        quiet_until = time.monotonic() + quiet_s
        deadline = time.monotonic() + 30
        while time.monotonic() < min(quiet_until, deadline):
            got = c.poll(0.2)
            if got:
                out += [r.value for r in got]
                quiet_until = time.monotonic() + quiet_s
        return sorted(out)
    finally:
        c.close()


def prepare(cluster, topic: str, tid: str, n: int = 10, timeout_ms: int = 60000) -> PreparedTransaction:
    p = Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": tid,
                  "transaction.timeout.ms": timeout_ms, "linger.ms": 5})
    try:
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(n):
            p.send(topic, f"v{i}".encode(), partition=i % 2)
        prepared = p.prepare_transaction(30)
        with pytest.raises(errors.IllegalStateError):
            p.send(topic, b"late")
        return prepared
    finally:
        p.close()  # leaves the prepared transaction open


def leave_open(cluster, topic: str, tid: str, timeout_ms: int) -> tuple[int, int]:
    """Start a transaction that writes one record to partition 0 and is neither
    prepared nor ended; returns its (producer id, epoch)."""
    p = Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": tid,
                  "transaction.timeout.ms": timeout_ms, "linger.ms": 0})
    try:
        p.init_transactions(30)
        d = describe(cluster, tid)  # Empty: no timer runs before the first partition is added
        p.begin_transaction()
        p.send(topic, b"unprepared", partition=0)
        p.flush(30)  # AddPartitionsToTxn done: the coordinator times the transaction from here
        return d.producer_id, d.producer_epoch
    finally:
        p.close()  # leaves the transaction open


def describe(cluster, tid: str):
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        return admin.describe_transactions([tid])[tid]


def test_prepared_transaction_outlives_its_timeout_and_is_committed_by_another_process(make_cluster):
    cluster = make_cluster(props=FAST_TIMEOUTS)
    topic = create_topic(cluster)
    tid = _name("2pc")
    prepared = prepare(cluster, topic, tid, timeout_ms=1000)
    assert prepared.transactional_id == tid and prepared.producer_id >= 0 and prepared.epoch >= 0
    # The control: an unprepared transaction with the same timeout, started after the
    # prepared one. When the timeout scan aborts it, that same scan also found the
    # prepared transaction past its transaction.timeout.ms, and left it open.
    control = _name("open")
    pid, epoch = leave_open(cluster, topic, control, timeout_ms=1000)
    aborted = wait_for(lambda: (lambda d: d if d.state == "CompleteAbort" else None)(describe(cluster, control)),
                       20, "the timeout scan to abort the unprepared transaction")
    assert (aborted.producer_id, aborted.producer_epoch) == (pid, epoch + 1)  # fenced by the abort
    d = describe(cluster, tid)
    assert (d.state, d.producer_id, d.producer_epoch) == ("PrepareTxn", prepared.producer_id, prepared.epoch)
    assert read_values(cluster, topic, 2, "read_committed", quiet_s=0.5) == []
    # The second phase, from another process, with only the three values.
    script = ("import json, sys; from exactly import complete_transaction; "
              "complete_transaction(tuple(json.loads(sys.argv[1])), sys.argv[2], commit=True)")
    subprocess.run([sys.executable, "-c", script, json.dumps(list(prepared)), cluster.bootstrap_servers],
                   check=True, timeout=60)
    assert read_values(cluster, topic, 2, "read_committed") == sorted(f"v{i}".encode() for i in range(10))
    complete_transaction(prepared, {"bootstrap.servers": cluster.bootstrap_servers}, commit=True)  # idempotent
    with pytest.raises(errors.InvalidTxnStateError):
        complete_transaction(prepared, cluster.bootstrap_servers, commit=False)


def _owned_by(admin: AdminClient, cluster, name: str, prefix: str) -> str:
    """A transactional.id whose coordinator is service `name`."""
    address = cluster.services[name].address
    for i in range(512):
        tid = f"{prefix}-{i}"
        if admin._core.find_coordinator(tid, COORDINATOR_TRANSACTION) == address:
            return tid
    raise AssertionError(f"no transactional.id of {name} among {prefix}-0..511")


def _metric(cluster, name: str, family: str) -> float:
    """The value of the unlabelled sample `family` on service `name`'s /metrics (0 when absent)."""
    with urllib.request.urlopen(f"http://{cluster.services[name].metrics_address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    m = re.search(rf"^{family} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_a_new_owner_whose_clock_is_ahead_does_not_abort_a_prepared_transaction(zk, tmp_path, clock_faults):
    """The transaction coordinator txn-1 runs with its wall clock an hour and a minute
    ahead (libfaketime; an hour was transaction.prepared.max.ms's default). txn-0, on
    time, owns a prepared transaction and is SIGKILLed; txn-1 takes its
    __transaction_state partition over and loads the transaction, which looks more
    than an hour old to it. Scan after scan (every 200 ms) it keeps it prepared -- the
    database may have committed it -- and reports its age; the application's recovery
    then commits it."""
    ahead = clockfault.SteppedClock(tmp_path / "txn-1.faketime")
    ahead.set(3660)
    cluster = DevCluster(tmp_path / "cluster", props={**FAST_TIMEOUTS, **REPLICATED_TXN_LOG},
                         service_env={"txn-1": ahead.env()})
    try:
        cluster.up(2, 2, 1, zookeeper=new_chroot(zk, "t"))
        topic = create_topic(cluster)
        with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
            tid = _owned_by(admin, cluster, "txn-0", "ahead")
        prepared = prepare(cluster, topic, tid)
        cluster.kill("txn-0")
        with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
            def moved() -> bool:
                admin._core.invalidate_coordinator(tid, COORDINATOR_TRANSACTION)
                return admin._core.find_coordinator(tid, COORDINATOR_TRANSACTION) == cluster.services["txn-1"].address
            wait_for(moved, 60, "txn-1 to own the transactional.id", interval_s=0.5)
        deadline = time.monotonic() + 5  # 25 timeout scans of txn-1 after its load
        while time.monotonic() < deadline:
            d = describe(cluster, tid)
            assert d.state not in ("PrepareAbort", "CompleteAbort"), d  # never aborted by the new owner
            time.sleep(0.2)
        assert (d.state, d.prepared_state) == ("PrepareTxn", prepared)
        wait_for(lambda: _metric(cluster, "txn-1", "exactly_txn_oldest_prepared_transaction_age_seconds") > 3600,
                 30, "txn-1 to report the transaction's age, an hour by its clock", interval_s=0.5)
        assert read_values(cluster, topic, 2, "read_committed", quiet_s=0.5) == []
        p = Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": tid})
        try:
            p.init_transactions(30, keep_prepared_txn=True)
            assert p.complete_transaction(prepared, 30) == "committed"  # what the database holds
        finally:
            p.close()
        assert read_values(cluster, topic, 2, "read_committed") == sorted(f"v{i}".encode() for i in range(10))
    finally:
        cluster.down()


def test_new_epoch_fences_a_prepared_transaction(cluster):
    topic = create_topic(cluster)
    tid = _name("2pc")
    prepared = prepare(cluster, topic, tid)
    p = Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": tid})
    try:
        p.init_transactions(30)  # aborts the prepared transaction (keepPreparedTxn=false)
        p.begin_transaction()
        p.send(topic, b"new", partition=0)
        p.commit_transaction(30)
    finally:
        p.close()
    with pytest.raises(errors.ProducerFencedError):
        complete_transaction(prepared, cluster.bootstrap_servers, commit=True)
    assert read_values(cluster, topic, 2, "read_committed") == [b"new"]
    assert len(read_values(cluster, topic, 2, "read_uncommitted")) == 11


def test_prepared_transaction_survives_coordinator_restart(cluster):
    topic = create_topic(cluster)
    tid = _name("2pc")
    prepared = prepare(cluster, topic, tid)
    cluster.kill("txn-0")
    cluster.restart("txn-0")
    d = describe(cluster, tid)
    assert (d.state, d.producer_epoch) == ("PrepareTxn", prepared.epoch)
    complete_transaction(prepared, cluster.bootstrap_servers, commit=False, timeout=60)
    assert read_values(cluster, topic, 2, "read_committed", quiet_s=0.5) == []
    assert describe(cluster, tid).state == "CompleteAbort"


def test_prepared_transaction_committed_by_its_own_producer(cluster):
    topic = create_topic(cluster)
    p = Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": _name("2pc")})
    try:
        p.init_transactions(30)
        p.begin_transaction()
        p.send(topic, b"a", partition=0)
        p.prepare_transaction(30)
        p.commit_transaction(30)
        p.begin_transaction()  # an empty transaction can be prepared and completed too
        p.prepare_transaction(30)
        p.abort_transaction(30)
    finally:
        p.close()
    assert read_values(cluster, topic, 2, "read_committed") == [b"a"]
