"""The copier system test (tests/system/test_transactions_system.py) under ZooKeeper
faults, on real processes and a real ZooKeeper server of the cluster's own (docs/design.md,
"ZooKeeper faults"):

- zookeeper_down: the ZooKeeper server is SIGKILLed, stays down ZK_DOWN_S seconds (30 in the
  long run), and is started again on its data directory. Meanwhile the copiers keep
  committing transactions (produce, fetch, offset commits and markers on partitions whose
  leadership does not change); once it is back, every service is registered, every
  replica in sync and the copiers commit within 30 s. The server restores the sessions
  from its log and each keeps it when it reconnects within its timeout of the server's
  start (a slow start under load can expire them: then it goes as in sessions_lost).
- session_expiry: one service is SIGSTOPped past its session timeout (ZooKeeper expires
  its session, the others take over its partitions or coordinator role), then continued:
  it fences itself (acknowledges nothing under its stale role), rejoins with a new
  session and catches up.
- sessions_lost: every service is cut off from ZooKeeper (tests/netfault.py), ZooKeeper
  is SIGKILLed and started again on its data directory, and the services stay cut off
  until it has expired every session it restored; then healed: each service finds its
  session gone, registers anew, and the controller elects again.

Replication factor 3 and min.insync.replicas 2, 3 partition leaders, 2 transaction and
2 group coordinators. After the faults the copiers finish and a read_committed reader
finds every input value exactly once; after every fault each copier commits again
within the transaction timeout. `make test` runs a short copy; EXACTLY_ZK_FAULT_SOAK=1
(`make soak`) a long one: more records, ZooKeeper down 30 s, every service's session
expired in turn.
"""
from __future__ import annotations

import os
import signal
import time

import pytest

import netfault
from netfault import network_faults  # noqa: F401 - fixture: sessions_lost cuts every service off
from exactly_tools.devcluster import DevCluster
from waiting import wait_for

from .harness import (Comparison, create_topics, end_offsets, finish_copiers, gate_offset, load_input,
                      read_values, make_copiers, set_gate, wait_in_sync, wait_registered, wait_unregistered)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

SOAK = os.environ.get("EXACTLY_ZK_FAULT_SOAK") == "1"
INPUT, OUTPUT = "input", "output"
INPUT_PARTITIONS, OUTPUT_PARTITIONS = 2, 3
RECORDS = 20_000 if SOAK else 1_800
TRANSACTION_SIZE = 50
# Records per second per copier: a slice of the input (one per fault) takes longer
# than the fault, so every fault hits a copy in progress.
MAX_RATE = 100.0 if SOAK else 25.0
REPLICATION_FACTOR, MIN_INSYNC = 3, 2
SESSION_TIMEOUT_S = 4.0
ZK_DOWN_S = 30.0 if SOAK else 10.0
BACK_WITHIN_S = 30.0  # serving again this long after ZooKeeper's return
TXN_TIMEOUT_S = 30.0  # the copiers' transaction.timeout.ms
PHASE_TIMEOUT_S = 180.0
# The paced copy of a whole input partition (aborted transactions copy a third again), plus slack.
FINISH_TIMEOUT_S = PHASE_TIMEOUT_S + 1.5 * RECORDS / INPUT_PARTITIONS / MAX_RATE
SESSION_FAULTS = ["pl-0", "pl-1", "pl-2", "txn-0", "txn-1", "group-0", "group-1"] if SOAK else ["pl-0"]
FAULTS = ["zookeeper_down", *(f"session_expiry:{name}" for name in SESSION_FAULTS), "sessions_lost"]

CLUSTER_PROPS = {
    "zookeeper.session.timeout.ms": str(int(SESSION_TIMEOUT_S * 1000)),
    "transaction.state.log.replication.factor": str(REPLICATION_FACTOR),
    "offsets.topic.replication.factor": str(REPLICATION_FACTOR),
    "min.insync.replicas": str(MIN_INSYNC),
}
TOPICS = [INPUT, OUTPUT, "__transaction_state", "__consumer_offsets"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@pytest.fixture
def own_zookeeper_cluster(tmp_path):
    """A cluster with a ZooKeeper server of its own (the session-wide one must not be
    killed): 3 partition leaders, 2 + 2 coordinators."""
    cluster = DevCluster(tmp_path / "cluster", props=dict(CLUSTER_PROPS))
    try:
        cluster.up(3, 2, 2)
        yield cluster
    finally:
        cluster.down()


def session_owners(cluster: DevCluster) -> dict[str, int] | None:
    """Service name -> the session id owning its registration znode; None when
    ZooKeeper does not answer within 10 s."""
    from kazoo.client import KazooClient
    from kazoo.handlers.threading import KazooTimeoutError
    zk = KazooClient(hosts=cluster.zookeeper, timeout=10)
    try:
        zk.start(timeout=10)
    except KazooTimeoutError:
        return None
    try:
        out = {}
        for name in zk.get_children("/exactly/services"):
            try:
                out[name] = zk.get(f"/exactly/services/{name}")[1].ephemeralOwner
            except Exception:  # noqa: BLE001 - gone meanwhile
                pass
        return out
    finally:
        zk.stop()
        zk.close()


def registered(cluster: DevCluster) -> bool:
    """Whether every service of `cluster` is registered in ZooKeeper."""
    return set(session_owners(cluster) or ()) == set(cluster.services)


def test_copy_is_exactly_once_through_zookeeper_faults(own_zookeeper_cluster, tmp_path, request):
    cluster = own_zookeeper_cluster
    request.getfixturevalue("network_faults")  # fails the test without nft; heals on any exit
    started = time.monotonic()
    bootstrap = cluster.bootstrap_servers
    create_topics(bootstrap, {INPUT: INPUT_PARTITIONS, OUTPUT: OUTPUT_PARTITIONS}, REPLICATION_FACTOR, MIN_INSYNC)
    expected = load_input(bootstrap, INPUT, INPUT_PARTITIONS, RECORDS)
    ends = end_offsets(bootstrap, INPUT, INPUT_PARTITIONS)
    log(f"cluster up and {RECORDS:,} input records loaded in {time.monotonic() - started:.1f} s")

    gate, copiers = make_copiers(tmp_path, bootstrap, INPUT, OUTPUT, ends, "zk-fault-copiers", TRANSACTION_SIZE,
                                        MAX_RATE)

    def check_copiers() -> None:
        for c in copiers:
            c.check_alive()

    def committed() -> list[int]:
        return [int(c.status().get("committed_txns", 0)) for c in copiers]

    # The input is opened slice by slice, one before each wait for commits and one for the
    # end, so each wait finds work left however long the faults before it took.
    slices = len(FAULTS) + 3
    opened = [0]

    def open_slice() -> None:
        opened[0] += 1
        set_gate(gate, min(1.0, opened[0] / slices))

    def wait_commits(before: list[int], timeout_s: float, what: str) -> float:
        """Open a slice, then wait until every copier committed a transaction more than in
        `before`; returns the wait (s)."""
        open_slice()
        t0 = time.monotonic()

        def done() -> bool:
            check_copiers()
            return all(now > then for now, then in zip(committed(), before))
        wait_for(done, timeout_s, what, interval_s=0.1)
        return time.monotonic() - t0

    try:
        set_gate(gate, 0.0)
        for c in copiers:
            c.start()
        wait_commits([0] * len(copiers), PHASE_TIMEOUT_S, "the copiers' first commits")
        for fault in FAULTS:
            t0 = time.monotonic()
            if fault == "zookeeper_down":
                sessions = session_owners(cluster)
                cluster.kill_zookeeper()
                # Produce, fetch, offset commits and markers go on without ZooKeeper.
                during = wait_commits(committed(), ZK_DOWN_S, "a commit of every copier while ZooKeeper is down")
                wait_for(lambda: time.monotonic() - t0 >= ZK_DOWN_S, ZK_DOWN_S + 1, "the outage to last")
                before = committed()
                cluster.restart_zookeeper()
                back = time.monotonic()
                wait_for(lambda: registered(cluster), BACK_WITHIN_S,
                         "every service registered after ZooKeeper's return")
                wait_in_sync(bootstrap, TOPICS, BACK_WITHIN_S)
                wait_commits(before, BACK_WITHIN_S, "a commit of every copier after ZooKeeper's return")
                serving = time.monotonic() - back
                assert serving <= BACK_WITHIN_S
                kept = sorted(n for n, owner in (session_owners(cluster) or {}).items() if sessions.get(n) == owner)
                log(f"ZooKeeper down {back - t0:.1f} s (every copier committed during it, first after "
                    f"{during:.1f} s); serving {serving:.1f} s after its return; sessions kept: "
                    f"{', '.join(kept) or 'none (expired while ZooKeeper started)'}")
            elif fault.startswith("session_expiry:"):
                name = fault.split(":", 1)[1]
                sessions = session_owners(cluster)
                cluster.signal(name, signal.SIGSTOP)
                try:
                    wait_unregistered(cluster, name, PHASE_TIMEOUT_S)
                    expired = time.monotonic() - t0
                finally:
                    cluster.signal(name, signal.SIGCONT)
                before = committed()
                wait_registered(cluster, name, PHASE_TIMEOUT_S)
                assert (session_owners(cluster) or {}).get(name) != sessions[name], "rejoined with the expired session"
                wait_in_sync(bootstrap, TOPICS, PHASE_TIMEOUT_S)
                wait_commits(before, TXN_TIMEOUT_S, f"a commit of every copier after {name} rejoined")
                log(f"{name} stopped, session expired after {expired:.1f} s; continued, rejoined and in sync "
                    f"{time.monotonic() - t0:.1f} s after the stop")
            else:
                sessions = session_owners(cluster)
                cuts = [netfault.cut(cluster, name, netfault.ZOOKEEPER) for name in cluster.services]
                try:
                    cluster.kill_zookeeper()
                    cluster.restart_zookeeper()
                    # ZooKeeper restored the sessions from its log; nobody reaches it, so it expires them.
                    wait_for(lambda: session_owners(cluster) == {}, PHASE_TIMEOUT_S,
                             "ZooKeeper to expire every restored session")
                finally:
                    for cut in cuts:
                        cut.heal()
                healed = time.monotonic()
                before = committed()
                wait_for(lambda: registered(cluster), PHASE_TIMEOUT_S,
                         "every service registered again")
                new = session_owners(cluster) or {}
                assert not set(new.values()) & set(sessions.values()), (sessions, new)
                wait_in_sync(bootstrap, TOPICS, PHASE_TIMEOUT_S)
                wait_commits(before, TXN_TIMEOUT_S, "a commit of every copier after the sessions were lost")
                log(f"every session lost in a ZooKeeper restart; services registered anew and the copiers "
                    f"committing {time.monotonic() - healed:.1f} s after the heal")
            check_copiers()
        finish_copiers(copiers, gate, FINISH_TIMEOUT_S)
        log(f"copy finished in {time.monotonic() - started:.1f} s since start")
    finally:
        for c in copiers:
            c.stop()

    result = Comparison.of(expected, read_values(bootstrap, OUTPUT, OUTPUT_PARTITIONS, "read_committed"))
    totals = {c.name: c.totals() for c in copiers}
    log(f"output (read_committed): {result.found:,} of {result.expected:,}; duplicates {result.duplicates}, "
        f"missing {result.missing}, unexpected {result.unexpected}; transactions {totals}; "
        f"total {time.monotonic() - started:.1f} s")
    assert result.exactly_once, result
    assert all(gate_offset(1.0, c.end_offset) == c.position for c in copiers)
