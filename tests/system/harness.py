"""Shared pieces of the system tests: input loading, copier processes, fault
injection on a dev cluster (kill/stop and restart of any service, network
partitions of a running one), waiting for replicas to be back in sync, and reading
a topic to its end."""
from __future__ import annotations

import collections
import json
import math
import pathlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Iterator

from exactly import AdminClient, Consumer, NewTopic, Producer, TopicPartition, errors
from exactly_tools.devcluster import DevCluster, pid_alive

from waiting import wait_for

COPIER = pathlib.Path(__file__).resolve().parent / "copier.py"
ROOT = COPIER.parent.parent.parent


class SystemTestError(AssertionError):
    """The system under test did not get where it should within its time bound."""


# ---------------------------------------------------------------- topics and data

def create_topics(bootstrap: str, topics: dict[str, int], replication_factor: int, min_insync: int,
                  config: dict | None = None) -> None:
    """Create `topics` (name -> partitions) with the replication factor and
    min.insync.replicas given; `config`: further SDK settings (a secured cluster's)."""
    with AdminClient({**(config or {}), "bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(name, n, replication_factor, {"min.insync.replicas": str(min_insync)})
                             for name, n in topics.items()], timeout=60)


def load_input(bootstrap: str, topic: str, partitions: int, count: int, config: dict | None = None) -> list[bytes]:
    """Write `count` distinct values round-robin over the partitions with an
    idempotent acks=all producer; returns the values. `config`: further SDK settings."""
    values = [f"value-{n:07d}".encode() for n in range(count)]
    producer = Producer({**(config or {}), "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 10})
    try:
        futures = [producer.send(topic, v, key=v, partition=n % partitions) for n, v in enumerate(values)]
        producer.flush(120)
        for f in futures:
            f.result(0)
    finally:
        producer.close(30)
    return values


def end_offsets(bootstrap: str, topic: str, partitions: int, config: dict | None = None) -> dict[int, int]:
    """Partition -> high watermark (read_uncommitted end); `config`: further SDK settings."""
    c = Consumer({**(config or {}), "bootstrap.servers": bootstrap, "enable.auto.commit": False})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_end(tps)
        return {tp.partition: c.position(tp, timeout=60) for tp in tps}
    finally:
        c.close()


def read_values(bootstrap: str, topic: str, partitions: int, isolation_level: str,
                timeout_s: float = 120.0, config: dict | None = None) -> list[bytes]:
    """Every value of `topic` from the beginning up to its end. Under read_committed
    the end is taken once every transaction written so far is complete (LSO = high
    watermark): EndTxn answers once the outcome is durable and the markers follow, so
    the last commits may still be waiting for theirs. `config`: further SDK settings."""
    c = Consumer({**(config or {}), "bootstrap.servers": bootstrap, "isolation.level": isolation_level,
                  "enable.auto.commit": False, "fetch.max.wait.ms": 100})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        deadline = time.monotonic() + timeout_s
        while True:
            c.seek_to_end(tps)
            ends = {tp: c.position(tp, timeout=60) for tp in tps}
            if isolation_level != "read_committed" or \
                    ends == {tp: hw for tp, hw in zip(tps, end_offsets(bootstrap, topic, partitions,
                                                                       config).values())}:
                break
            if time.monotonic() > deadline:
                raise SystemTestError(f"transactions on {topic} did not complete in {timeout_s:.0f} s")
            time.sleep(0.1)
        c.seek_to_beginning(tps)
        out: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        while any(c.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise SystemTestError(f"reading {topic} did not reach its end in {timeout_s:.0f} s")
            out += [r.value for r in c.poll(timeout=0.5)]
        return out
    finally:
        c.close()


@dataclass
class Comparison:
    """Output against input: counts of duplicates, missing and unexpected values."""

    expected: int
    found: int
    duplicates: int
    missing: int
    unexpected: int

    @classmethod
    def of(cls, expected: list[bytes], found: list[bytes]) -> "Comparison":
        counts = collections.Counter(found)
        want = set(expected)
        return cls(len(want), len(found), sum(n - 1 for n in counts.values() if n > 1),
                   len(want - set(counts)), len(set(counts) - want))

    @property
    def exactly_once(self) -> bool:
        return self.duplicates == 0 and self.missing == 0 and self.unexpected == 0 and self.found == self.expected


# ---------------------------------------------------------------- cluster state

def wait_in_sync(bootstrap: str, topics: list[str], timeout_s: float = 60.0, config: dict | None = None) -> None:
    """Until every partition of `topics` has a live leader and its whole replica
    set in the ISR (a restarted replica caught up); `config`: further SDK settings."""
    admin = AdminClient({**(config or {}), "bootstrap.servers": bootstrap})
    try:
        def in_sync() -> bool:
            try:
                desc = admin.describe_topics(topics)
            except errors.ExactlyError:
                return False
            return all(p.leader is not None and set(p.isr) == set(p.replicas)
                       for t in desc.values() for p in t.partitions.values())
        wait_for(in_sync, timeout_s, f"every replica of {', '.join(topics)} in sync", interval_s=0.25)
    finally:
        admin.close()


def wait_unregistered(cluster: DevCluster, name: str, timeout_s: float = 30.0) -> None:
    """Until `name` is gone from the cluster's live services (its ZooKeeper session
    expired or it deregistered), so that the others took over its work."""
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=cluster.zookeeper)
    zk.start(timeout=15)
    try:
        wait_for(lambda: not zk.exists(f"/exactly/services/{name}"), timeout_s, f"{name} to leave the cluster")
    finally:
        zk.stop()
        zk.close()


def wait_registered(cluster: DevCluster, name: str, timeout_s: float = 60.0) -> None:
    """Until `name` is among the cluster's live services again (a new session after
    a partition healed)."""
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=cluster.zookeeper)
    zk.start(timeout=15)
    try:
        wait_for(lambda: zk.exists(f"/exactly/services/{name}"), timeout_s, f"{name} to rejoin the cluster")
    finally:
        zk.stop()
        zk.close()


def partition_and_heal(cluster: DevCluster, name: str, mode: str, topics: list[str], hold_s: float,
                       timeout_s: float = 60.0) -> str:
    """Cut service `name` off the network in `mode` (tests/netfault.py: ZOOKEEPER,
    PEERS or ALL) while it keeps running, until the cut had its effect, then heal and
    wait until it is back; returns what happened, for the log.

    ZOOKEEPER and ALL: until its ZooKeeper session expired (it left the live services,
    so the others took over its partitions or coordinator role); healed, until it
    registered again. PEERS: a partition leader until it dropped an unreachable
    follower from the ISR of a partition it leads (it keeps its ZooKeeper session and
    stays leader), at most `hold_s` s when it leads none with followers; a
    coordinator for `hold_s` s (it stays owner; requests that need its internal
    topic fail meanwhile). Raises SystemTestError when an effect does not come within
    `timeout_s` s."""
    import netfault
    role = cluster.services[name].role
    with netfault.cut(cluster, name, mode) as fault:
        if mode in (netfault.ZOOKEEPER, netfault.ALL):
            wait_unregistered(cluster, name, timeout_s)
            effect = f"session expired after {time.monotonic() - fault.started:.1f} s"
        elif role == "partition_leader":
            effect = _wait_isr_shrink(cluster, name, topics, hold_s, timeout_s)
        else:
            time.sleep(hold_s)  # the fault's duration: nothing in ZooKeeper shows it
            effect = f"held {hold_s:.0f} s"
    if mode in (netfault.ZOOKEEPER, netfault.ALL):
        wait_registered(cluster, name, timeout_s)
    return effect


def _wait_isr_shrink(cluster: DevCluster, name: str, topics: list[str], hold_s: float, timeout_s: float) -> str:
    started = time.monotonic()
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        def led() -> list:
            try:
                desc = admin.describe_topics(topics)
            except errors.ExactlyError:
                return []
            return [p for t in desc.values() for p in t.partitions.values()
                    if p.leader_id == name and len(p.replicas) > 1]
        if wait_for(lambda: led() or time.monotonic() - started > hold_s, timeout_s, f"{name}'s partitions") is True:
            return f"led nothing with followers; held {hold_s:.0f} s"
        wait_for(lambda: any(len(p.isr) < len(p.replicas) for p in led()), timeout_s,
                   f"{name} to drop its unreachable followers from an ISR")
        return f"ISR shrunk after {time.monotonic() - started:.1f} s"


# ---------------------------------------------------------------- copiers

@dataclass
class CopierProcess:
    """One copier (tests/system/copier.py) for one input partition; restartable
    with the same transactional.id."""

    name: str
    bootstrap: str
    input_topic: str
    input_partition: int
    output_topic: str
    end_offset: int
    group_id: str
    run_dir: pathlib.Path
    gate_file: pathlib.Path | None = None
    transaction_size: int = 300
    abort_every: int = 3
    max_rate: float = 0.0
    # Further SDK settings of the copier's clients (a secured cluster's), written to a file.
    client_config: dict = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    starts: int = 0
    history: list[dict] = field(default_factory=list)

    @property
    def transactional_id(self) -> str:
        return f"{self.name}-{self.input_topic}-{self.input_partition}"

    @property
    def status_file(self) -> pathlib.Path:
        return self.run_dir / f"{self.name}.status"

    @property
    def log_file(self) -> pathlib.Path:
        return self.run_dir / f"{self.name}.log"

    def start(self) -> None:
        cmd = [sys.executable, str(COPIER), "--bootstrap-servers", self.bootstrap,
               "--transactional-id", self.transactional_id, "--group-id", self.group_id,
               "--input-topic", self.input_topic, "--input-partition", str(self.input_partition),
               "--output-topic", self.output_topic, "--end-offset", str(self.end_offset),
               "--status-file", str(self.status_file), "--transaction-size", str(self.transaction_size),
               "--abort-every", str(self.abort_every), "--max-rate", str(self.max_rate)]
        if self.gate_file is not None:
            cmd += ["--gate-file", str(self.gate_file)]
        if self.client_config:
            config = self.run_dir / f"{self.name}.client.json"
            config.write_text(json.dumps(self.client_config))
            cmd += ["--client-config", str(config)]
        self.status_file.unlink(missing_ok=True)
        log = open(self.log_file, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=ROOT)
        log.close()
        self.starts += 1

    def status(self) -> dict:
        try:
            return json.loads(self.status_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    @property
    def position(self) -> int:
        return int(self.status().get("position", 0))

    @property
    def progress(self) -> float:
        return self.position / self.end_offset if self.end_offset else 1.0

    def check_alive(self) -> None:
        """Raise if the copier exited other than by our signal or completion."""
        if self.proc is not None and self.proc.poll() is not None and self.status().get("state") != "done":
            raise SystemTestError(f"copier {self.name} exited with {self.proc.returncode} "
                                  f"(state {self.status().get('state')}); log tail:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def signal_and_wait(self, sig: int, timeout_s: float = 90.0) -> int:
        """Send `sig` and wait for the process to end; returns its exit code."""
        assert self.proc is not None
        self.history.append(self.status())
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise SystemTestError(f"copier {self.name} did not end within {timeout_s:.0f} s of signal {sig}")

    def stop(self) -> None:
        if self.proc is not None and pid_alive(self.proc.pid):
            self.signal_and_wait(signal.SIGTERM)

    def totals(self) -> dict[str, int]:
        """Committed and aborted transactions over every run of this copier."""
        runs = self.history + [self.status()]
        return {k: sum(int(r.get(k, 0)) for r in runs) for k in ("committed_txns", "aborted_txns", "failed_txns")}


def make_copiers(tmp_path: pathlib.Path, bootstrap: str, source: str, sink: str, ends: dict[int, int],
                 group: str, transaction_size: int, max_rate: float, abort_every: int = 3,
                 client_config: dict | None = None) -> tuple[pathlib.Path, list[CopierProcess]]:
    """(gate file, copiers): one copier per input partition of `ends` (partition ->
    end offset), copying `source` to `sink` in consumer group `group` and aborting
    every `abort_every`-th transaction on purpose, with their status files and the
    gate under tmp_path/copiers (not started yet); `client_config`: further SDK
    settings (security)."""
    run_dir = tmp_path / "copiers"
    run_dir.mkdir()
    gate = run_dir / "gate.json"
    return gate, [CopierProcess(f"copier-{p}", bootstrap, source, p, sink, end, group, run_dir, gate_file=gate,
                                transaction_size=transaction_size, abort_every=abort_every, max_rate=max_rate,
                                client_config=dict(client_config or {}))
                  for p, end in sorted(ends.items())]


def finish_copiers(copiers: list[CopierProcess], gate_file: pathlib.Path, timeout_s: float) -> None:
    """Open the gate fully and wait until every copier is done and exited with 0
    (raises SystemTestError for a copier that died, AssertionError on a time-out)."""
    set_gate(gate_file, 1.0)

    def done() -> bool:
        for c in copiers:
            c.check_alive()
        return all(c.status().get("state") == "done" for c in copiers)
    wait_for(done, timeout_s, "the copiers to finish")
    for c in copiers:
        assert c.proc.wait(60) == 0, c.log_tail()


def set_gate(gate_file: pathlib.Path, fraction: float) -> None:
    """Let the copiers consume up to `fraction` of their input."""
    tmp = gate_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"fraction": min(1.0, fraction)}))
    tmp.replace(gate_file)


def gate_offset(fraction: float, end: int) -> int:
    return min(end, math.ceil(fraction * end))


def check_copiers(copiers: list[CopierProcess]) -> None:
    """Raise SystemTestError when a copier exited other than by our signal or completion."""
    for c in copiers:
        c.check_alive()


def copier_phases(gate: pathlib.Path, copiers: list[CopierProcess], phases: int,
                  timeout_s: float) -> Iterator[tuple[int, float]]:
    """Start the copiers with the gate half-way to the first phase's end; then, for each
    of `phases` phases, open the gate to its end fraction (k + 1) / (phases + 1), wait
    (up to timeout_s) until every copier runs, and yield (k, fraction) for the caller to
    inject its fault."""
    set_gate(gate, 1 / (phases + 1) / 2)
    for c in copiers:
        c.start()
    for k in range(phases):
        fraction = (k + 1) / (phases + 1)
        set_gate(gate, fraction)
        wait_for(lambda: check_copiers(copiers) or all(c.status().get("state") == "running" for c in copiers),
                 timeout_s, "the copiers to run")
        yield k, fraction


def wait_gate(copiers: list[CopierProcess], fraction: float, timeout_s: float) -> None:
    """Until every copier's position reached `fraction` of its input."""
    wait_for(lambda: check_copiers(copiers) or all(c.position >= gate_offset(fraction, c.end_offset)
                                                   for c in copiers),
             timeout_s, f"the copiers to reach {fraction:.0%} of their input", interval_s=0.2)
