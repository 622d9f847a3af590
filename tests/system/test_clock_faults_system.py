"""The transactional copy of the system test (tests/system/test_transactions_system.py:
RF 3, min.insync.replicas 2, 2 transaction and 2 group coordinators) under clock
faults (docs/design.md, "Clocks"; tests/clockfault.py):

- pl-0, group-0 and txn-1: wall clock stepped +10 minutes, then -10 minutes (a
  20-minute step back), then back to the real time, while they run;
- txn-0: the opposite steps (-10, +10, 0 minutes), so in each of the first two phases
  one transaction coordinator is 10 minutes ahead and the other 10 minutes behind;
- pl-1 and group-1: clocks (wall and monotonic) running 1.5 times as fast as real time.

The monotonic clocks of the stepped processes are not touched, as with a real NTP
step. Afterwards a read_committed reader finds every input value exactly once; no
coordinator aborted a transaction for its timeout (none expired early, none hung);
after each step the copy and the stepped leader serve again within 30 s, and each
copier commits transactions again (the coordinators scan for timed-out transactions
every 500 ms, so a transaction expired early would be seen), and a transaction
abandoned just before its coordinator's clock steps back is aborted after its 5 s
transaction.timeout.ms, not 10 minutes later. Along the
way: the step reaches pl-0's Python code (its log cleaner's last-run gauge, set from
its wall clock every second, moves by the step); records keep the producer's
timestamps (CreateTime: a producer stepped like pl-0 writes them to a partition pl-0
leads), and ListOffsets by timestamp (offsets_for_times) over those non-monotonic
timestamps answers the first offset whose timestamp is >= the one asked for;
time-based retention (retention.ms 2 minutes, passes every second) deletes none of
the fresh data of the leader whose clock jumped 10 minutes ahead.

make test runs EXACTLY_CLOCK_RECORDS=3000 input records; make soak 20,000.
"""
from __future__ import annotations

import os
import re
import time
import urllib.request

import pytest

import clockfault
from clockfault import clock_faults  # noqa: F401 - fixture: fails without libfaketime
from clusters import new_chroot
from exactly import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from exactly._client import COORDINATOR_TRANSACTION
from exactly_tools.devcluster import DevCluster
from waiting import wait_for

from .harness import (Comparison, CopierProcess, copier_phases, create_topics, end_offsets, finish_copiers, load_input,
                      read_values, make_copiers, wait_gate)
from .harness import check_copiers as harness_check_copiers
from .test_transactions_system import CLUSTER_PROPS as COPY_PROPS
from .test_transactions_system import MIN_INSYNC, REPLICATION_FACTOR

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

INPUT, OUTPUT = "input", "output"
INPUT_PARTITIONS, OUTPUT_PARTITIONS = 2, 3
RECORDS = int(os.environ.get("EXACTLY_CLOCK_RECORDS", "3000"))
TRANSACTION_SIZE = 100
MAX_RATE = 300.0  # records per second per copier, aborted ones included
STEP_S = 600
SERVE_WITHIN_S = 30.0
PHASE_TIMEOUT_S = 180.0
# Probe topics, one partition per partition leader at least (RF 1): timestamps of a
# producer stepped like pl-0; fresh data under a 2-minute retention.ms.
STAMPED, RETAINED, ABANDONED = "probe-timestamps", "probe-retention", "probe-abandoned"
ABANDONED_TIMEOUT_MS = 5000
PROBE_PARTITIONS = 6
RETENTION_MS = 120_000

# The copy's cluster (RF 3 everywhere, min.insync.replicas 2), the cleaner every second.
CLUSTER_PROPS = {**COPY_PROPS, "log.retention.check.interval.ms": "1000",
                 "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"}
# (offset of pl-0, group-0 and txn-1, offset of txn-0), seconds, one phase after the other.
STEPS = [(STEP_S, -STEP_S), (-STEP_S, STEP_S), (0, 0)]
SLEWED = ("pl-1", "group-1")
SLEW_RATE = 1.5


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def leader_partition(admin: AdminClient, topic: str, leader_id: str) -> int:
    """A partition of `topic` led by `leader_id`."""
    found = [n for n, p in admin.describe_topics([topic])[topic].partitions.items() if p.leader_id == leader_id]
    assert found, f"no partition of {topic} is led by {leader_id}"
    return found[0]


def metric(cluster: DevCluster, name: str, family: str) -> float:
    """The value of the unlabelled sample `family` on service `name`'s /metrics (0 when absent)."""
    with urllib.request.urlopen(f"http://{cluster.services[name].metrics_address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    m = re.search(rf"^{family} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def cleaner_runs(cluster: DevCluster, name: str) -> float:
    return metric(cluster, name, "exactly_log_cleaner_runs_total")


def wall_clock_offset_s(cluster: DevCluster, name: str) -> float:
    """How far (s) service `name`'s wall clock is from ours: its log cleaner's last
    pass (a gauge set from its wall clock, every log.retention.check.interval.ms)
    minus our clock, the pass interval not counted."""
    return metric(cluster, name, "exactly_log_cleaner_last_run_timestamp_seconds") - time.time()


def probe_ids(admin: AdminClient, cluster: DevCluster) -> dict[str, str]:
    """Transaction coordinator name -> a transactional.id it coordinates."""
    by_address = {cluster.services[n].address: n for n in ("txn-0", "txn-1")}
    out: dict[str, str] = {}
    for i in range(256):
        tid = f"clock-probe-{i}"
        name = by_address.get(admin._core.find_coordinator(tid, COORDINATOR_TRANSACTION))
        out.setdefault(name, tid)
        if "txn-0" in out and "txn-1" in out:
            return {n: out[n] for n in ("txn-0", "txn-1")}
    raise AssertionError(f"no transactional.id found for each coordinator: {out}")


def abandon_transaction(bootstrap: str, transactional_id: str) -> Producer:
    """A producer with an open transaction (one record written) that it never ends."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                  "transaction.timeout.ms": ABANDONED_TIMEOUT_MS})
    p.init_transactions()
    p.begin_transaction()
    p.send(ABANDONED, b"abandoned", partition=0).result(30)
    return p


def read_partition(bootstrap: str, tp: TopicPartition) -> list[tuple[int, int]]:
    """(offset, timestamp) of every record of `tp`, from its start to its end."""
    c = Consumer({"bootstrap.servers": bootstrap, "enable.auto.commit": False})
    try:
        end = c.end_offsets([tp])[tp]
        c.assign([tp])
        c.seek(tp, 0)
        out: list[tuple[int, int]] = []
        deadline = time.monotonic() + 60
        while (not out or out[-1][0] < end - 1) and time.monotonic() < deadline:
            out += [(r.offset, r.timestamp) for r in c.poll(1.0)]
        assert out and out[-1][0] == end - 1, f"read {len(out)} records of {tp}, end offset {end}"
        return out
    finally:
        c.close()


def test_copy_is_exactly_once_through_clock_faults(zk, tmp_path, clock_faults):  # noqa: F811
    started = time.monotonic()
    files = tmp_path / "clocks"
    files.mkdir()
    ahead, behind = clockfault.SteppedClock(files / "pl-0"), clockfault.SteppedClock(files / "txn-0")
    env = {"pl-0": ahead.env(), "group-0": ahead.env(), "txn-1": ahead.env(), "txn-0": behind.env(),
           **{name: clockfault.slewed_env(SLEW_RATE) for name in SLEWED}}
    cluster = DevCluster(tmp_path / "cluster", props=dict(CLUSTER_PROPS), service_env=env)
    copiers: list[CopierProcess] = []
    try:
        cluster.up(3, 2, 2, zookeeper=new_chroot(zk, "t"))
        bootstrap = cluster.bootstrap_servers
        create_topics(bootstrap, {INPUT: INPUT_PARTITIONS, OUTPUT: OUTPUT_PARTITIONS}, REPLICATION_FACTOR, MIN_INSYNC)
        with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            admin.create_topics([
                NewTopic(STAMPED, PROBE_PARTITIONS, 1),
                NewTopic(ABANDONED, 1, 1),
                NewTopic(RETAINED, PROBE_PARTITIONS, 1, {"retention.ms": str(RETENTION_MS), "segment.bytes": "4096"}),
            ], timeout=60)
            stamped = TopicPartition(STAMPED, leader_partition(admin, STAMPED, "pl-0"))
            retained = TopicPartition(RETAINED, leader_partition(admin, RETAINED, "pl-0"))
            probes = probe_ids(admin, cluster)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        offsets = {"txn-0": 0, "txn-1": 0}  # the coordinators' clock offsets now
        expected = load_input(bootstrap, INPUT, INPUT_PARTITIONS, RECORDS)
        ends = end_offsets(bootstrap, INPUT, INPUT_PARTITIONS)
        assert sum(ends.values()) == RECORDS
        probe = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 0})
        # Fresh CreateTime data (this host's clock) in several closed segments of pl-0.
        for n in range(60):
            probe.send(RETAINED, b"x" * 500, partition=retained.partition)
        probe.flush(60)
        log(f"cluster up (pl-0, group-0, txn-1, txn-0 stepped by file; {', '.join(SLEWED)} at x{SLEW_RATE}), "
            f"{RECORDS:,} input records in {time.monotonic() - started:.1f} s")

        gate, copiers = make_copiers(tmp_path, bootstrap, INPUT, OUTPUT, ends, "clock-copiers", TRANSACTION_SIZE,
                                            MAX_RATE)

        def check_copiers() -> None:
            harness_check_copiers(copiers)

        for k, fraction in copier_phases(gate, copiers, len(STEPS), PHASE_TIMEOUT_S):
            pl_offset, txn_offset = STEPS[k]
            positions = [c.position for c in copiers]
            commits = [int(c.status().get("committed_txns", 0)) for c in copiers]
            runs = cleaner_runs(cluster, "pl-0")
            new_offsets = {"txn-0": txn_offset, "txn-1": pl_offset}
            [back] = [n for n in offsets if new_offsets[n] < offsets[n]]
            abandoned = abandon_transaction(bootstrap, probes[back])
            t0 = time.monotonic()
            ahead.set(pl_offset)
            behind.set(txn_offset)
            offsets = new_offsets
            # The step reaches pl-0's Python code (time.time() there), and pl-0 serves.
            wait_for(lambda: abs(wall_clock_offset_s(cluster, "pl-0") - pl_offset) < 3, SERVE_WITHIN_S,
                     f"pl-0's wall clock {pl_offset:+d} s off", interval_s=0.2)
            for n in range(20):  # a producer whose clock is stepped as pl-0's
                probe.send(STAMPED, b"t", partition=stamped.partition,
                           timestamp_ms=int((time.time() + pl_offset) * 1000) + n).result(SERVE_WITHIN_S)
            wait_for(lambda: check_copiers() or all(c.position > p for c, p in zip(copiers, positions)),
                     SERVE_WITHIN_S, "the copy to go on after the step", interval_s=0.2)
            wait_for(lambda: check_copiers() or all(int(c.status().get("committed_txns", 0)) >= n + 2
                                                    for c, n in zip(copiers, commits)),
                     SERVE_WITHIN_S, "two more commits of each copier after the step", interval_s=0.2)
            # The transaction left open on the coordinator whose clock stepped back ends
            # after its timeout.
            wait_for(lambda: admin.describe_transactions([probes[back]])[probes[back]].state == "CompleteAbort",
                     SERVE_WITHIN_S, f"{back} to abort the abandoned transaction of {probes[back]}", interval_s=0.5)
            aborted_after = time.monotonic() - t0
            try:
                abandoned.close(5)
            except Exception:  # noqa: BLE001 - fenced by the abort: nothing to close cleanly
                pass
            log(f"stepped pl-0/group-0/txn-1 to {pl_offset:+d} s, txn-0 to {txn_offset:+d} s: {back}'s abandoned "
                f"transaction aborted {aborted_after:.1f} s after the step; pl-0's clock "
                f"{wall_clock_offset_s(cluster, 'pl-0'):+.1f} s off, copy going on after "
                f"{time.monotonic() - t0:.1f} s (copiers at {', '.join(f'{c.progress:.0%}' for c in copiers)})")
            if pl_offset > 0:
                # Two cleaner passes on pl-0 with its clock 10 minutes ahead: the
                # minutes-old data stays (retention.ms is 2 minutes).
                wait_for(lambda: cleaner_runs(cluster, "pl-0") >= runs + 2, SERVE_WITHIN_S,
                         "two log cleaner passes on pl-0")
                with Consumer({"bootstrap.servers": bootstrap}) as c:
                    assert c.beginning_offsets([retained])[retained] == 0, "fresh data deleted by retention.ms"
            wait_gate(copiers, fraction, PHASE_TIMEOUT_S)
        finish_copiers(copiers, gate, PHASE_TIMEOUT_S)
        log(f"copy finished in {time.monotonic() - started:.1f} s since start")
        probe.close(30)

        committed = read_values(bootstrap, OUTPUT, OUTPUT_PARTITIONS, "read_committed")
        result = Comparison.of(expected, committed)
        totals = {c.name: c.totals() for c in copiers}
        log(f"output (read_committed): {result.found:,} of {result.expected:,}; duplicates {result.duplicates}, "
            f"missing {result.missing}, unexpected {result.unexpected}; transactions {totals}")
        assert result.exactly_once, result
        assert all(t["aborted_txns"] >= 1 for t in totals.values()), totals
        # No coordinator aborted a copier's transaction for its timeout (only the abandoned ones).
        for name in ("txn-0", "txn-1"):
            text = (cluster.dir / "logs" / f"{name}.log").read_text(errors="replace")
            expired = set(re.findall(r"transaction of '([^']+)' \(PID \d+ epoch \d+\) timed out after", text))
            assert expired <= set(probes.values()), f"{name} expired transactions of {expired}: see its log"
        admin.close()

        # ListOffsets by timestamp over the stepped CreateTime timestamps: the first
        # offset whose timestamp is >= the one asked for.
        stamps = read_partition(bootstrap, stamped)
        assert max(t for _, t in stamps) - min(t for _, t in stamps) >= STEP_S * 1000, "no step seen"
        with Consumer({"bootstrap.servers": bootstrap}) as c:
            targets = sorted({t for _, t in stamps})
            targets = targets[:: max(1, len(targets) // 25)] + [targets[-1]]
            for t in targets:
                answers = c.offsets_for_times({stamped: t}, timeout=30)
                first = next((o, ts) for o, ts in stamps if ts >= t)
                got = answers[stamped]
                assert got is not None and (got.offset, got.timestamp) == first, (t, got, first)
        log(f"offsets_for_times: {len(targets)} timestamps over {len(stamps)} stepped records answered; "
            f"total {time.monotonic() - started:.1f} s")
    finally:
        for c in copiers:
            c.stop()
        cluster.down()
