"""Shared pieces of the purchases demo: the CSV, record shapes, a reader, loading the
purchases and running pipeline workers."""
from __future__ import annotations

import collections
import csv
import json
import pathlib
import signal
import subprocess
import sys
import time
from decimal import Decimal
from typing import TYPE_CHECKING

from tqdm import tqdm

from exactly import Consumer, Producer, TopicPartition

if TYPE_CHECKING:
    from exactly_tools.devcluster import DevCluster

ROOT = pathlib.Path(__file__).resolve().parent.parent
ORDER_ITEMS = ROOT / "data" / "olist" / "order_items.csv"

PURCHASES, INVOICES, SHIPMENTS = "purchases", "invoices", "shipments"
GROUP_ID = "purchases-pipeline"
TRANSACTIONAL_ID = "purchases-pipeline-0"


def read_order_items(path: pathlib.Path = ORDER_ITEMS) -> list[dict[str, str]]:
    """Rows of order_items.csv as dicts (strings as in the file)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fresh_run_dir(run_dir: pathlib.Path) -> None:
    """Stop a dev cluster left in `run_dir` by an earlier run and delete the directory."""
    import shutil

    from exactly_tools.devcluster import DevCluster
    if run_dir.exists():
        if (run_dir / "cluster.json").exists():
            DevCluster.load(run_dir).down()
        shutil.rmtree(run_dir)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def stop_on_signals() -> None:
    """Make SIGTERM, SIGINT (Ctrl-C) and SIGHUP (the terminal closed) end the demo
    with SystemExit(128 + signal number), so that its `finally` takes the cluster down
    (take_down). A signal the process was started ignoring (nohup, a background job)
    stays ignored."""
    def on_signal(signum: int, frame) -> None:
        ignore_stop_signals()
        print(f"\n{signal.Signals(signum).name}: stopping the demo and its cluster", flush=True)
        raise SystemExit(128 + signum)

    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, on_signal)


def ignore_stop_signals() -> None:
    """Ignore STOP_SIGNALS from here on: nothing cuts a teardown short."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def take_down(cluster: DevCluster) -> None:
    """Stop the cluster's workers, services and ZooKeeper (DevCluster.down) with the
    stop signals ignored, so a second Ctrl-C or SIGTERM does not leave part of it running."""
    ignore_stop_signals()
    cluster.down()


def item_key(row: dict) -> str:
    """The key of a purchased item: "order_id:order_item_id"."""
    return f"{row['order_id']}:{row['order_item_id']}"


def invoice_for(purchase: dict) -> dict:
    """One invoice per purchased item; total = price + freight (exact decimals)."""
    total = Decimal(purchase["price"]) + Decimal(purchase["freight_value"])
    return {"order_id": purchase["order_id"], "order_item_id": purchase["order_item_id"],
            "seller_id": purchase["seller_id"], "price": purchase["price"],
            "freight_value": purchase["freight_value"], "total": str(total)}


def shipment_for(purchase: dict) -> dict:
    """One shipment per purchased item."""
    return {"order_id": purchase["order_id"], "order_item_id": purchase["order_item_id"],
            "product_id": purchase["product_id"], "seller_id": purchase["seller_id"],
            "ship_by": purchase["shipping_limit_date"]}


def read_topic(bootstrap: str, topic: str, isolation_level: str, timeout_s: float = 120.0,
               security: dict | None = None) -> list:
    """Every record of `topic` up to its current end (the LSO under read_committed),
    read from the beginning without a group. Returns list[ConsumerRecord]."""
    import time
    c = Consumer({"bootstrap.servers": bootstrap, **(security or {}), "isolation.level": isolation_level,
                  "enable.auto.commit": False})
    try:
        parts = [TopicPartition(topic, p) for p in range(_partition_count(c, bootstrap, topic, security))]
        c.assign(parts)
        c.seek_to_end(parts)
        ends = {tp: c.position(tp) for tp in parts}
        c.seek_to_beginning(parts)
        out = []
        deadline = time.monotonic() + timeout_s
        while any(c.position(tp) < ends[tp] for tp in parts):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} did not reach its end in {timeout_s:.0f} s")
            out.extend(c.poll(timeout=1.0))
        return out
    finally:
        c.close()


def read_topic_kafka(kafka_bootstrap: str, topic: str, isolation_level: str, timeout_s: float = 120.0) -> list:
    """Every record of `topic` up to its end as a confluent-kafka (librdkafka) consumer
    reads it through the Kafka protocol listeners: list of (partition, offset, key,
    value) tuples."""
    import time
    from confluent_kafka import OFFSET_BEGINNING, Consumer as KafkaConsumer, TopicPartition as KafkaTopicPartition
    c = KafkaConsumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"read-{topic}",
                       "isolation.level": isolation_level, "enable.auto.commit": False})
    try:
        parts = [KafkaTopicPartition(topic, p, OFFSET_BEGINNING) for p in c.list_topics(topic, 30).topics[topic].partitions]
        ends = {tp.partition: c.get_watermark_offsets(tp, timeout=30)[1] for tp in parts}
        c.assign(parts)
        out, position = [], {p: 0 for p in ends}
        deadline = time.monotonic() + timeout_s
        while any(position[p] < ends[p] for p in ends):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} through the Kafka port did not reach its end")
            for m in c.consume(500, 1.0):
                if m.error() is None:
                    out.append((m.partition(), m.offset(), m.key(), m.value()))
                    position[m.partition()] = m.offset() + 1
            for tp in c.position([KafkaTopicPartition(topic, p) for p in ends]):
                if tp.offset >= 0:
                    position[tp.partition] = max(position[tp.partition], tp.offset)
        return out
    finally:
        c.close()


def _partition_count(consumer, bootstrap: str, topic: str, security: dict | None = None) -> int:
    from exactly import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap, **(security or {})})
    try:
        return len(admin.list_topics()[topic])
    finally:
        admin.close()


def loads(value: bytes) -> dict:
    return json.loads(value)


def check_outputs(committed: dict[str, list], expected: dict[str, dict], width: int = 31) -> tuple[list[str], bool]:
    """Compare the read_committed outputs (topic -> records) with the expected items.

    Returns (summary lines, ok): per output topic its count, duplicates and missing keys,
    then the sum of invoice totals against price + freight from the CSV; ok is True only
    when every item appears exactly once in each output and the totals match exactly.
    """
    ok = True
    lines = [f"{'items in:':{width}} {len(expected):>8,}"]
    for topic in (INVOICES, SHIPMENTS):
        keys = collections.Counter(r.key.decode() for r in committed[topic])
        dups = sum(n - 1 for n in keys.values() if n > 1)
        missing = len(set(expected) - set(keys))
        unexpected = len(set(keys) - set(expected))
        lines.append(f"{topic + ' out (read_committed):':{width}} {len(committed[topic]):>8,}   "
                     f"duplicates {dups:,}   missing {missing:,}")
        ok &= len(committed[topic]) == len(expected) and dups == 0 and missing == 0 and unexpected == 0
    invoice_total = sum(Decimal(json.loads(r.value)["total"]) for r in committed[INVOICES])
    csv_total = sum(Decimal(r["price"]) + Decimal(r["freight_value"]) for r in expected.values())
    lines.append(f"{'sum of invoice totals:':{width}} {invoice_total:>14,}")
    lines.append(f"{'sum of price + freight (CSV):':{width}} {csv_total:>14,}   "
                 f"{'match' if invoice_total == csv_total else 'MISMATCH'}")
    return lines, ok and invoice_total == csv_total


def load_purchases(bootstrap: str, rows: list[dict], security: dict | None = None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, **(security or {}), "enable.idempotence": True, "acks": "all",
                         "linger.ms": 10})
    futures = []
    with tqdm(total=len(rows), desc="records loaded", unit="rec", file=sys.stdout, mininterval=0.5) as bar:
        for row in rows:
            f = producer.send(PURCHASES, json.dumps(row).encode(), key=row["order_id"].encode())
            f.add_done_callback(lambda _f: bar.update(1))
            futures.append(f)
        producer.flush()
        for f in futures:
            f.result()
    producer.close()


def track(cluster: DevCluster | None, name: str, proc: subprocess.Popen) -> None:
    """Record a worker process in `cluster`'s state (DevCluster.track), so that taking
    the cluster down stops it too."""
    if cluster is not None:
        cluster.track(name, proc.pid)


class Worker:
    """One pipeline worker process (`cluster`: the DevCluster that stops it in down())."""

    def __init__(self, bootstrap: str, run_dir: pathlib.Path, name: str, hold_open_after: int | None = None,
                 group_aware_id: str | None = None, module: str = "demo.pipeline",
                 client_config: pathlib.Path | None = None, cluster: DevCluster | None = None):
        self.status_file = run_dir / f"{name}.status"
        self.status_file.unlink(missing_ok=True)
        if group_aware_id is None:
            cmd = [sys.executable, "-m", module, "--bootstrap-servers", bootstrap,
                   "--transactional-id", TRANSACTIONAL_ID, "--status-file", str(self.status_file)]
        else:  # one group-aware producer per worker (KIP-447 draft), each its own transactional.id
            cmd = [sys.executable, "-m", "demo.pipeline_group", "--bootstrap-servers", bootstrap,
                   "--transactional-id", group_aware_id, "--status-file", str(self.status_file)]
        if hold_open_after is not None:
            cmd += ["--hold-open-after", str(hold_open_after)]
        if client_config is not None:
            cmd += ["--client-config", str(client_config)]
        self.log = open(run_dir / "logs" / f"{name}.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=pathlib.Path(__file__).resolve().parent.parent)
        track(cluster, name, self.proc)

    def status(self) -> dict:
        try:
            return json.loads(self.status_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"pipeline worker exited with {self.proc.returncode}; see {self.log.name}")


def wait_gone(cluster: DevCluster, name: str, deadline: float) -> None:
    """Until `name` left the cluster's live services in ZooKeeper (its session
    expired), i.e. the others took over its work."""
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=cluster.zookeeper)
    zk.start(timeout=30)
    try:
        while zk.exists(f"/exactly/services/{name}"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} still registered")
            time.sleep(0.2)
    finally:
        zk.stop()
        zk.close()
