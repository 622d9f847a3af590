"""A real Prometheus server (Debian package `prometheus`, /usr/bin/prometheus) scrapes
every process of a dev cluster under a transactional workload; every PromQL expression
of the Grafana dashboards (deploy/grafana, through deploy/grafana/exprs.py) must return
data through Prometheus's HTTP API. With a transaction held open the LSO series stays
below the high watermark and the oldest-open-transaction age grows; after the commit
the LSO equals the high watermark (docs/design.md, "Metrics"; design doc "Last Stable
Offset Tracking")."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest

from exactly import AdminClient, Consumer, NewTopic, OffsetAndMetadata, Producer, TopicPartition

from waiting import wait_for

pytestmark = pytest.mark.integration

PROMETHEUS = "/usr/bin/prometheus"
REPO = pathlib.Path(__file__).resolve().parents[2]


def _exprs_module():
    spec = importlib.util.spec_from_file_location("grafana_exprs", REPO / "deploy" / "grafana" / "exprs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusServer:
    """/usr/bin/prometheus on 127.0.0.1 with a temporary config and TSDB."""

    def __init__(self, directory: pathlib.Path, targets: dict[str, str]):
        self.dir = directory
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{
                "job_name": "exactly",
                "static_configs": [{"targets": [address], "labels": {"service_name": name}}
                                   for name, address in sorted(targets.items())],
            }],
        }
        (directory / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.log = open(directory / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={directory / 'prometheus.yml'}",
             f"--storage.tsdb.path={directory / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                    return resp.status == 200
            except (urllib.error.URLError, OSError):
                return False
        wait_for(ready, timeout_s, "prometheus to be ready", interval_s=0.2)

    def query(self, expr: str) -> list[dict]:
        """Instant query through /api/v1/query; the result vector (or [] for none)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", (expr, body)
        result = body["data"]["result"]
        if body["data"]["resultType"] == "scalar":
            return [{"value": result}]
        return result

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def prometheus(cluster, tmp_path):
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.fail(f"{PROMETHEUS} is missing: install Debian's prometheus package (scripts/setup.sh)")
    targets = {s.name: s.metrics_address for s in cluster.services.values()}
    assert all(targets.values()), targets
    d = tmp_path / "prometheus"
    d.mkdir()
    server = PrometheusServer(d, targets)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _consume(c: Consumer, count: int, timeout_s: float = 30.0) -> list:
    out: list = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        out += c.poll(0.2)
    return out


def run_workload(cluster, src: str, dst: str) -> None:
    """Idempotent produce, a consumer group, committed and aborted transactions with
    offsets (consume-transform-produce), read_committed reads of the output."""
    bootstrap = cluster.bootstrap_servers
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    try:
        for i in range(30):
            plain.send(src, f"in-{i}".encode(), partition=i % 3)
        plain.flush()
    finally:
        plain.close()
    group = _name("g")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "fetch.max.wait.ms": 100})
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": _name("tx"), "linger.ms": 0})
    try:
        consumer.subscribe([src])
        batch = _consume(consumer, 30)
        assert len(batch) == 30
        meta = consumer.group_metadata()
        txn.init_transactions()
        for round_, commit in enumerate((False, True, True)):
            txn.begin_transaction()
            for r in batch:
                txn.send(dst, r.value.replace(b"in", f"out{round_}".encode()), partition=r.partition)
            positions = {TopicPartition(src, p): OffsetAndMetadata(consumer.position(TopicPartition(src, p)))
                         for p in range(3)}
            txn.send_offsets_to_transaction(positions, meta)
            if commit:
                txn.commit_transaction()
            else:
                txn.flush()  # appended, then aborted: entries in the aborted-transaction indexes
                txn.abort_transaction()
    finally:
        txn.close()
        consumer.close()
    reader = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                       "isolation.level": "read_committed", "fetch.max.wait.ms": 100})
    try:
        reader.assign([TopicPartition(dst, p) for p in range(3)])
        assert len(_consume(reader, 60)) == 60
    finally:
        reader.close()


def test_every_dashboard_expression_returns_data_and_lso_follows_transactions(cluster, prometheus):
    wait_for(lambda: prometheus.value("count(up == 1)") == len(cluster.services), 30,
             "every service to be scraped", interval_s=0.5)
    src, dst = _name("src"), _name("dst")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    try:
        admin.create_topics([NewTopic(src, 3), NewTopic(dst, 3)], timeout=60)
    finally:
        admin.close()
    run_workload(cluster, src, dst)

    # A transaction held open on dst-0.
    held = Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": _name("held"),
                     "linger.ms": 0, "transaction.timeout.ms": 120000})
    try:
        held.init_transactions()
        held.begin_transaction()
        for i in range(5):
            held.send(dst, f"held-{i}".encode(), partition=0)
        held.flush()
        sel = f'{{topic="{dst}",partition="0"}}'

        def lso_below_hw():
            hw = prometheus.value(f"exactly_partition_high_watermark{sel}")
            lso = prometheus.value(f"exactly_partition_last_stable_offset{sel}")
            return (hw, lso) if hw is not None and lso is not None and lso < hw else None

        hw_open, _ = wait_for(lso_below_hw, 30, "the LSO of the open transaction's partition to trail the HW",
                              interval_s=0.5)
        age_1 = wait_for(lambda: prometheus.value(f"exactly_partition_oldest_open_transaction_age_seconds{sel}"),
                         30, "a non-zero oldest open transaction age", interval_s=0.5)
        assert prometheus.value(f"exactly_partition_lso_lag_offsets{sel}") >= 5
        assert prometheus.value(f"exactly_partition_ongoing_transactions{sel}") == 1

        # Every dashboard expression returns data (rates need a few scrapes).
        exprs = _exprs_module().dashboard_expressions()
        assert len(exprs) >= 30
        missing: list[tuple[str, str, str]] = []

        def all_have_data():
            missing[:] = [(board, panel, expr) for board, panel, expr in exprs if not prometheus.query(expr)]
            return not missing

        wait_for(all_have_data, 60, lambda: "every dashboard expression to return data; without data:\n"
                 + "\n".join(" | ".join(m) for m in missing), interval_s=1.0)

        # While it stays open the LSO stays below the high watermark and the age grows.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            hw = prometheus.value(f"exactly_partition_high_watermark{sel}")
            lso = prometheus.value(f"exactly_partition_last_stable_offset{sel}")
            assert lso < hw, (lso, hw)
            time.sleep(0.5)
        age_2 = prometheus.value(f"exactly_partition_oldest_open_transaction_age_seconds{sel}")
        assert age_2 > age_1 + 2, (age_1, age_2)
        assert prometheus.value('max(exactly_partition_oldest_open_transaction_age_seconds)') >= age_2
        held.commit_transaction()
    finally:
        held.close()

    def lso_caught_up():
        hw = prometheus.value(f"exactly_partition_high_watermark{sel}")
        lso = prometheus.value(f"exactly_partition_last_stable_offset{sel}")
        return hw is not None and hw == lso and hw > hw_open  # the COMMIT marker is in
    wait_for(lso_caught_up, 30, "the LSO to equal the high watermark after the commit", interval_s=0.5)
    wait_for(lambda: prometheus.value(f"exactly_partition_lso_lag_offsets{sel}") == 0, 30, "LSO lag 0",
             interval_s=0.5)
    wait_for(lambda: prometheus.value(f"exactly_partition_oldest_open_transaction_age_seconds{sel}") == 0, 30,
             "no open transaction", interval_s=0.5)

    # The workload shows up in the coordinator and throughput series (once scraped).
    expected = {
        'sum(exactly_txn_completed_total{outcome="commit",cause="client"})': 3,
        'sum(exactly_txn_completed_total{outcome="abort",cause="client"})': 1,
        "sum(exactly_txn_end_to_complete_seconds_count)": 4,
        "sum(exactly_txn_marker_write_seconds_count)": 4,
        "sum(exactly_txn_pid_blocks_allocated_total)": 1,
        "sum(exactly_partition_aborted_index_entries)": 1,
        f'sum(exactly_produce_records_total{{topic="{dst}"}})': 95,
        f'sum(exactly_fetch_records_total{{topic="{src}"}})': 30,
        "sum(exactly_group_rebalances_total)": 1,
        'sum(exactly_rpc_request_duration_seconds_count{service="PartitionLeader",method="Produce"})': 1,
        'sum(exactly_rpc_request_duration_seconds_count{service="TransactionCoordinator",method="EndTxn"})': 4,
    }
    for expr, least in expected.items():
        wait_for(lambda: (prometheus.value(expr) or 0) >= least, 30, f"{expr} >= {least}", interval_s=0.5)
