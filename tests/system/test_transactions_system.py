"""Transactions under failures, in the spirit of Kafka's transactions system test
(tests/kafkatest/tests/core/transactions_test.py), on real processes and a real
ZooKeeper.

An input topic (2 partitions) holds 20,000 distinct values. One transactional
copier per input partition (tests/system/copier.py) copies them to an output topic
(3 partitions) in consume-transform-produce transactions of up to 300 records with
the consumed offsets (send_offsets_to_transaction); every third transaction is
aborted on purpose and copied again. Both topics and the internal topics have
replication factor 3 and min.insync.replicas 2. While the copy runs, each partition
leader in turn is stopped and restarted, then each coordinator, then each copier (at
20 % progress or more, restarted with the same transactional.id). Afterwards a read_committed reader
of the output must find exactly the input: no duplicate, nothing missing.

Three variants: hard failures (SIGKILL: the others take over when the ZooKeeper
session of the killed process expires, then it comes back), clean restarts
(SIGTERM), and network partitions of processes that keep running (tests/netfault.py):
each partition leader and each coordinator in turn is cut off from ZooKeeper (its
session expires and the others take over while it still reaches, and is reached by,
the other services and the clients), from its peers (it keeps its session and its
role but no other service reaches it), or from everything, then healed; the copiers
are not touched in that variant. A fourth, `disk` (make soak: EXACTLY_DISK_SOAK=1), puts
pl-0's data directory on the fault filesystem (tests/faults/diskfs.py) and makes its
writes and fsyncs fail with EIO: its log directory goes offline (KIP-112), its
leaderships move to in-sync replicas; then the disk is repaired and pl-0 restarted. The
copy is paced (a gate on the input offsets, and
a rate cap applied inside the transactions) so that every fault hits open
transactions and the copy does not end before the last fault.
"""
from __future__ import annotations

import os
import signal
import time

import pytest

from exactly import AdminClient

import netfault
from faults.diskfs import under_faults
from netfault import network_faults  # noqa: F401 - fixture of the partition variant
from waiting import wait_for

from .harness import (Comparison, copier_phases, create_topics, end_offsets, finish_copiers, load_input,
                      make_copiers, partition_and_heal, read_values, wait_gate, wait_in_sync, wait_unregistered)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

INPUT, OUTPUT = "input", "output"
INPUT_PARTITIONS, OUTPUT_PARTITIONS = 2, 3
RECORDS = 20_000
REPLICATION_FACTOR, MIN_INSYNC = 3, 2
TRANSACTION_SIZE = 300
# Records per second per copier (aborted ones included): a tenth of the input, the
# slice of one fault, takes longer than the fault itself, so each fault hits a copy
# in progress.
MAX_RATE = 250.0
PHASE_TIMEOUT_S = 180.0

CLUSTER_PROPS = {
    "zookeeper.session.timeout.ms": "4000",
    "transaction.state.log.replication.factor": str(REPLICATION_FACTOR),
    "offsets.topic.replication.factor": str(REPLICATION_FACTOR),
    "min.insync.replicas": str(MIN_INSYNC),
}
INTERNAL = ["__transaction_state", "__consumer_offsets"]
# Partition variant: followers cut off leave the ISR within 3 s; a coordinator cut off
# from its peers stays so for PEER_CUT_S.
PARTITION_PROPS = {"replica.lag.time.max.ms": "3000"}
PEER_CUT_S = 4.0
PARTITION_FAULTS = [("pl-0", netfault.ZOOKEEPER), ("pl-1", netfault.PEERS), ("pl-2", netfault.ALL),
                    ("txn-0", netfault.ZOOKEEPER), ("txn-1", netfault.PEERS),
                    ("group-0", netfault.PEERS), ("group-1", netfault.ZOOKEEPER)]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# The disk variant copies DISK_RECORDS (6,000; 20,000 under make soak, EXACTLY_DISK_SOAK=1).
DISK_RECORDS = 20_000 if os.environ.get("EXACTLY_DISK_SOAK") else 6_000


def fail_disk_and_repair(cluster, disk, name: str, topics: list[str]) -> str:
    """EIO on writes and fsyncs of `name`'s log directory until no partition has it as
    leader or in its ISR; then kill it, repair the disk, restart, wait until in sync."""
    disk.set(eio=["write", "fsync"], paths=["logs/"])
    bootstrap = ",".join(s.address for n, s in cluster.services.items() if n != name)

    def moved() -> bool:
        admin = AdminClient({"bootstrap.servers": bootstrap, "request.timeout.ms": 3000})
        try:
            described = admin.describe_topics(topics)
        finally:
            admin.close()
        return all(p.leader_id != name and name not in p.isr
                   for t in described.values() for p in t.partitions.values())
    t0 = time.monotonic()
    wait_for(moved, PHASE_TIMEOUT_S, f"every leadership and ISR seat to leave {name}", interval_s=0.2)
    moved_s = time.monotonic() - t0
    cluster.kill(name)
    disk.clear()
    cluster.restart(name)
    return f"leaderships moved in {moved_s:.1f} s"


@pytest.mark.parametrize("variant", ["sigkill", "sigterm", "partition", "disk"])
def test_copy_is_exactly_once_through_failures(make_cluster, tmp_path, request, variant):
    started = time.monotonic()
    hard = variant == "sigkill"
    if variant == "partition":
        request.getfixturevalue("network_faults")  # fails the test without nft; heals on any exit
    props = {**CLUSTER_PROPS, **(PARTITION_PROPS if variant == "partition" else {})}
    cluster = make_cluster(partition_leaders=3, txn_coordinators=2, group_coordinators=2, props=props)
    disk = under_faults(cluster, "pl-0") if variant == "disk" else None
    if disk is not None:
        request.addfinalizer(disk.close)
        request.addfinalizer(lambda: cluster.kill("pl-0"))
    bootstrap = cluster.bootstrap_servers
    create_topics(bootstrap, {INPUT: INPUT_PARTITIONS, OUTPUT: OUTPUT_PARTITIONS}, REPLICATION_FACTOR, MIN_INSYNC)
    records = DISK_RECORDS if variant == "disk" else RECORDS
    expected = load_input(bootstrap, INPUT, INPUT_PARTITIONS, records)
    ends = end_offsets(bootstrap, INPUT, INPUT_PARTITIONS)
    assert sum(ends.values()) == records
    log(f"cluster up and {records:,} input records loaded in {time.monotonic() - started:.1f} s")

    gate, copiers = make_copiers(tmp_path, bootstrap, INPUT, OUTPUT, ends, "system-copiers", TRANSACTION_SIZE,
                                        MAX_RATE)
    faults = [("pl-0", "service"), ("pl-1", "service"), ("pl-2", "service"),
              ("txn-0", "service"), ("txn-1", "service"), ("group-0", "service"), ("group-1", "service"),
              ("copier-0", "copier"), ("copier-1", "copier")]
    if variant == "partition":
        faults = PARTITION_FAULTS
    if variant == "disk":
        faults = [("pl-0", "disk")]
    by_name = {c.name: c for c in copiers}
    sig = signal.SIGKILL if hard else signal.SIGTERM
    topics = [INPUT, OUTPUT, *INTERNAL]

    try:
        for k, fraction in copier_phases(gate, copiers, len(faults), PHASE_TIMEOUT_S):
            name, kind = faults[k]
            time.sleep(0.5)  # let the copiers get into a transaction
            t0 = time.monotonic()
            if kind in netfault.MODES:
                effect = partition_and_heal(cluster, name, kind, topics, PEER_CUT_S)
                if name.startswith("pl-"):
                    wait_in_sync(bootstrap, topics, PHASE_TIMEOUT_S)
                log(f"cut {name} off ({kind}; {effect}) and healed in {time.monotonic() - t0:.1f} s "
                    f"(copiers at {', '.join(f'{c.progress:.0%}' for c in copiers)})")
            elif kind == "disk":
                effect = fail_disk_and_repair(cluster, disk, name, topics)
                wait_in_sync(bootstrap, topics, PHASE_TIMEOUT_S)
                log(f"EIO on {name}'s log directory ({effect}), repaired and restarted in "
                    f"{time.monotonic() - t0:.1f} s (copiers at {', '.join(f'{c.progress:.0%}' for c in copiers)})")
            elif kind == "copier":
                copier = by_name[name]
                assert copier.progress >= 0.2, f"{name} at {copier.progress:.0%} when it should be killed"
                at = copier.progress
                code = copier.signal_and_wait(sig)
                copier.start()
                log(f"{'SIGKILLed' if hard else 'stopped'} {name} at {at:.0%} of its input "
                    f"(exit {code}); restarted with transactional.id {copier.transactional_id}")
            else:
                if hard:
                    cluster.kill(name)
                    wait_unregistered(cluster, name)  # the others take over its work first
                else:
                    cluster.stop(name)
                cluster.restart(name)
                if kind == "service" and name.startswith("pl-"):
                    wait_in_sync(bootstrap, topics, PHASE_TIMEOUT_S)
                log(f"{'SIGKILLed' if hard else 'stopped'} and restarted {name} in {time.monotonic() - t0:.1f} s "
                    f"(copiers at {', '.join(f'{c.progress:.0%}' for c in copiers)})")
            wait_gate(copiers, fraction, PHASE_TIMEOUT_S)
        finish_copiers(copiers, gate, PHASE_TIMEOUT_S)
        log(f"copy finished in {time.monotonic() - started:.1f} s since start")
    finally:
        for c in copiers:
            c.stop()

    committed = read_values(bootstrap, OUTPUT, OUTPUT_PARTITIONS, "read_committed")
    uncommitted = read_values(bootstrap, OUTPUT, OUTPUT_PARTITIONS, "read_uncommitted")
    result = Comparison.of(expected, committed)
    totals = {c.name: c.totals() for c in copiers}
    log(f"output (read_committed): {result.found:,} records of {result.expected:,} expected; "
        f"duplicates {result.duplicates}, missing {result.missing}, unexpected {result.unexpected}; "
        f"read_uncommitted {len(uncommitted):,}; transactions {totals}; total {time.monotonic() - started:.1f} s")
    assert result.exactly_once, result
    # The aborted transactions were really written, and really hidden.
    assert all(t["aborted_txns"] >= 3 for t in totals.values()), totals
    assert len(uncommitted) > len(committed)
