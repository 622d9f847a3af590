"""Quix Streams (its own virtualenv, .compat/quix, made by scripts/setup.sh: it pins an
older confluent-kafka) against the Kafka ports of a dev cluster with 3 partition
leaders: an exactly-once application (tests/compat/quix_app.py) is killed with SIGKILL
mid-stream and restarted; the output read read_committed then holds every input
record exactly once. The stateful application also counts the records of each key in
Quix's state (RocksDB and its changelog topic, created by Quix with CreateTopics):
each key's counts in the output are then exactly 1..n, so state updated by the
aborted transaction did not survive either. make test runs the stateful application
(a superset of the stateless one) on 2,000 records; EXACTLY_COMPAT_FULL=1 runs both
on 20,000."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from clusters import new_chroot
from exactly_tools.devcluster import DevCluster
from waiting import wait_for

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUIX_PYTHON = ROOT / ".compat" / "quix" / "bin" / "python"
APP = pathlib.Path(__file__).with_name("quix_app.py")
FULL = os.environ.get("EXACTLY_COMPAT_FULL") == "1"
RECORDS = 20000 if FULL else 2000
PARTITIONS = 3
KEYS = 50  # the stateful application counts per key


@pytest.fixture(scope="module")
def qc(zk, tmp_path_factory):
    """A dev cluster of 3 partition leaders and one coordinator of each kind
    (`exactly-dev up`), whose transaction coordinator looks for timed-out
    transactions every second: Quix gives each start a new transactional.id, so the
    transaction open at the SIGKILL is not fenced by the restart but aborted when it
    times out (as in Kafka), and until then read_committed readers wait at it."""
    cluster = DevCluster(tmp_path_factory.mktemp("quix"),
                         props={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"})
    cluster.up(3, 1, 1, zookeeper=new_chroot(zk, "quix"))
    try:
        yield cluster
    finally:
        cluster.down()


class App:
    """The Quix application as a child process; `progress` is the last count it printed."""

    def __init__(self, env: dict, log: pathlib.Path):
        self.log = log.open("ab")
        self.proc = subprocess.Popen([str(QUIX_PYTHON), str(APP)], env=env, stdout=subprocess.PIPE,
                                     stderr=self.log, cwd=str(log.parent))
        self.progress = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.log.write(line)
            self.log.flush()
            if line.startswith(b"processed "):
                self.progress = int(line.split()[1])

    def stop(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._reader.join(timeout=10)


def read_committed(bootstrap: str, topic: str, want: int, timeout_s: float) -> list[dict]:
    """Every record of `topic` a read_committed consumer gets, reading until `want` or
    `timeout_s` seconds without reaching it."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                  "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    got: list[dict] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < want and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error() is None:
                    got.append(json.loads(m.value()))
    finally:
        c.close()
    return got


def read_to_end(bootstrap: str, topic: str) -> list[dict]:
    """Every committed record of `topic`, read up to each partition's end."""
    from confluent_kafka import TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"end-{uuid.uuid4().hex[:6]}",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(PARTITIONS)}
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: list[dict] = []
    done: set[int] = {p for p, end in ends.items() if end == 0}
    deadline = time.monotonic() + 120
    try:
        while len(done) < PARTITIONS and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error() is None:
                    got.append(json.loads(m.value()))
            for tp in c.position([TopicPartition(topic, p) for p in range(PARTITIONS)]):
                if tp.offset >= ends[tp.partition]:
                    done.add(tp.partition)
    finally:
        c.close()
    assert len(done) == PARTITIONS, f"read to the end of {sorted(done)} of {PARTITIONS} partitions only"
    return got


@pytest.mark.skipif(not QUIX_PYTHON.exists(), reason="scripts/setup.sh installs Quix Streams into .compat/quix")
@pytest.mark.parametrize("stateful", [False, True] if FULL else [True], ids=lambda s: "stateful" if s else "stateless")
def test_quix_exactly_once_survives_sigkill(qc, tmp_path, stateful):
    bootstrap = qc.kafka_bootstrap_servers
    tag = uuid.uuid4().hex[:6]
    source, sink = f"quix-in-{tag}", f"quix-out-{tag}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in (source, sink)]).values():
        fut.result(30)
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(RECORDS):
        p.produce(source, key=str(i % KEYS).encode(), value=json.dumps({"i": i}).encode())
        p.poll(0)
    assert p.flush(60) == 0

    env = {**os.environ, "QUIX_BROKERS": bootstrap, "QUIX_GROUP": f"quix-{tag}", "QUIX_INPUT": source,
           "QUIX_OUTPUT": sink, "QUIX_STATE_DIR": str(tmp_path / "state"), "QUIX_REPORT_EVERY": "50",
           "QUIX_DELAY_MS": "2", "QUIX_COMMIT_INTERVAL_S": "0.5", "QUIX_STATEFUL": "1" if stateful else "0"}
    env.pop("VIRTUAL_ENV", None)
    log = tmp_path / "quix.log"
    first = App(env, log)
    try:
        # Mid-stream: a third of the records through, at least one transaction committed.
        wait_for(lambda: first.progress >= RECORDS // 3 or first.proc.poll() is not None, 120,
                 lambda: f"Quix processing a third of the input; log:\n{log.read_text()[-3000:]}")
        assert first.proc.poll() is None, log.read_text()[-3000:]
        killed_at = first.progress
    finally:
        first.stop(signal.SIGKILL)
    assert killed_at < RECORDS, "killed after the end: not mid-stream"

    second = App({**env, "QUIX_DELAY_MS": "0"}, log)
    try:
        got = read_committed(bootstrap, sink, RECORDS, 180 if not FULL else 600)
    finally:
        second.stop(signal.SIGTERM)
    assert len(got) >= RECORDS, f"{len(got)} of {RECORDS} records in the output; log:\n{log.read_text()[-3000:]}"
    got = read_to_end(bootstrap, sink)  # everything, now that nothing writes: duplicates too
    seen = [r["i"] for r in got]
    duplicates = len(seen) - len(set(seen))
    missing = set(range(RECORDS)) - set(seen)
    assert duplicates == 0 and not missing, (
        f"{len(seen)} records, {duplicates} duplicates, {len(missing)} missing; log:\n{log.read_text()[-3000:]}")
    assert all(r["square"] == r["i"] * r["i"] for r in got)
    if stateful:
        counts: dict[int, list[int]] = {}
        for r in got:
            counts.setdefault(r["i"] % KEYS, []).append(r["count"])
        wrong = {k: c for k, c in counts.items() if sorted(c) != list(range(1, len(c) + 1))}
        assert not wrong, f"per-key counts not 1..n for {len(wrong)} keys, e.g. {next(iter(wrong.items()))}"
