"""KIP-447 draft, system test: three consume-transform-produce workers, each with ONE
group-aware transactional producer, share a consumer group over a 6-partition input
on a cluster with 2 transaction coordinators and 2 group coordinators. Workers join,
leave and are SIGKILLed so that partitions move between them several times; the
outputs read with read_committed hold every input item exactly once."""
from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys
import uuid

import pytest

from demo.common import (INVOICES, PURCHASES, SHIPMENTS, check_outputs, item_key, read_order_items, read_topic)
from exactly import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from waiting import wait_for

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
ITEMS = 6000
INPUT_PARTITIONS = 6


class GroupWorker:
    def __init__(self, bootstrap: str, run_dir: pathlib.Path, name: str, group: str):
        self.name = name
        self.status_file = run_dir / f"{name}.status"
        self.log = open(run_dir / f"{name}.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "demo.pipeline_group", "--bootstrap-servers", bootstrap,
             "--transactional-id", f"{group}-{name}", "--group-id", group, "--status-file", str(self.status_file),
             "--max-records", "25", "--session-timeout-ms", "4000", "--pause-ms", "40"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)

    def status(self) -> dict:
        try:
            return json.loads(self.status_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def stop(self, sig: int) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=60)


def test_group_aware_workers_copy_every_item_exactly_once_while_partitions_move(make_cluster, tmp_path):
    cluster = make_cluster(txn_coordinators=2, group_coordinators=2)
    bootstrap = cluster.bootstrap_servers
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(PURCHASES, INPUT_PARTITIONS), NewTopic(INVOICES, 3), NewTopic(SHIPMENTS, 3)])
    rows = read_order_items()[:ITEMS]
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 10}) as p:
        for row in rows:
            p.send(PURCHASES, json.dumps(row).encode(), key=row["order_id"].encode())
        p.flush(60)
    group = f"g-{uuid.uuid4().hex[:8]}"
    watcher = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    parts = [TopicPartition(PURCHASES, p) for p in range(INPUT_PARTITIONS)]

    def progress() -> int:
        return sum(om.offset for om in watcher.committed(parts).values() if om is not None)

    workers: dict[str, GroupWorker] = {}
    generations: set[int] = set()

    def start(name: str) -> None:
        workers[name] = GroupWorker(bootstrap, tmp_path, name, group)

    def reach(fraction: float) -> None:
        def done():
            for w in workers.values():
                if w.proc.poll() is None:
                    generations.add(w.status().get("generation", -1))
                elif w.proc.returncode not in (0, -signal.SIGKILL):
                    raise AssertionError(f"{w.name} exited with {w.proc.returncode}; see {w.log.name}")
            return progress() >= fraction * ITEMS
        wait_for(done, 240, lambda: f"{fraction:.0%} of {ITEMS} items copied (at {progress()})", interval_s=0.2)

    try:
        for name in ("w1", "w2", "w3"):
            start(name)
        reach(0.15)
        workers["w2"].stop(signal.SIGKILL)       # its partitions move after session.timeout.ms
        reach(0.35)
        start("w4")                              # joins: partitions move again
        reach(0.55)
        workers["w1"].stop(signal.SIGTERM)       # leaves cleanly
        reach(0.70)
        workers["w3"].stop(signal.SIGKILL)
        start("w5")
        reach(1.0)
    finally:
        for w in workers.values():
            if w.proc.poll() is None:
                w.stop(signal.SIGTERM)
        watcher.close()
    generations.discard(-1)
    assert len(generations) >= 4, f"partitions moved too few times: generations {sorted(generations)}"
    expected = {item_key(r): r for r in rows}
    committed = {t: read_topic(bootstrap, t, "read_committed") for t in (INVOICES, SHIPMENTS)}
    lines, ok = check_outputs(committed, expected)
    assert ok, "\n".join(lines)
