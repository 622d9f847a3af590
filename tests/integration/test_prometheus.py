"""A real Prometheus server (Debian package `prometheus`, /usr/bin/prometheus) scrapes
every process of a dev cluster under a transactional workload; every PromQL expression
of the Grafana dashboards (deploy/grafana, through deploy/grafana/exprs.py) must return
data through Prometheus's HTTP API. With a transaction held open the LSO series stays
below the high watermark and the oldest-open-transaction age grows; after the commit
the LSO equals the high watermark (docs/design.md, "Metrics"; design doc "Last Stable
Offset Tracking").

The same server loads the chart's alerting rules (deploy/helm/exactly/files/alerts.yaml)
through `rule_files`, with durations and the hanging-transaction threshold shortened
for the test (`rules_for_test`): every rule must be healthy, the held-open transaction
fires the stuck-LSO and hanging-transaction alerts, and SIGKILLed processes fire the
offline-partition, under-replicated and coordinator alerts."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest
import yaml

from exactly import (AdminClient, Consumer, NewTopic, OffsetAndMetadata, Producer, TopicPartition,
                     decide_prepared_transaction)

from waiting import wait_for
from exactly_tools.ports import free_port

pytestmark = pytest.mark.integration

PROMETHEUS = "/usr/bin/prometheus"
REPO = pathlib.Path(__file__).resolve().parents[2]
ALERTS = REPO / "deploy" / "helm" / "exactly" / "files" / "alerts.yaml"
NAMESPACE = "exactly-test"  # the label Kubernetes service discovery would add


def rules_for_test(text: str) -> dict:
    """The alert rules of `text` with every `for` at 1 s, the stuck-LSO window at 5 s
    and the hanging- and prepared-transaction thresholds at 3 s (instead of
    transaction.max.timeout.ms and 5 minutes), so that they can fire within a test.
    Fails when the rule file changed shape."""
    rules = yaml.safe_load(text)
    seen = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            seen.add(rule["alert"])
            rule["for"] = "1s"
            if rule["alert"] == "ExactlyStuckLastStableOffset":
                assert "[5m]" in rule["expr"]
                rule["expr"] = rule["expr"].replace("[5m]", "[5s]")
            if rule["alert"] == "ExactlyHangingTransaction":
                assert rule["expr"].endswith(" > 900")
                rule["expr"] = rule["expr"][:-len("900")] + "3"
            if rule["alert"] == "ExactlyPreparedTransactionWaiting":
                assert rule["expr"].endswith(" > 300")
                rule["expr"] = rule["expr"][:-len("300")] + "3"
    assert {"ExactlyStuckLastStableOffset", "ExactlyHangingTransaction", "ExactlyOfflinePartitions",
            "ExactlyUnderReplicatedPartitions", "ExactlyCoordinatorUnavailable"} <= seen
    return rules


def _exprs_module():
    spec = importlib.util.spec_from_file_location("grafana_exprs", REPO / "deploy" / "grafana" / "exprs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class PrometheusServer:
    """/usr/bin/prometheus on 127.0.0.1 with a temporary config and TSDB."""

    def __init__(self, directory: pathlib.Path, targets: dict[str, str]):
        self.dir = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (directory / "alerts.yml").write_text(json.dumps(rules_for_test(ALERTS.read_text())))
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(directory / "alerts.yml")],
            "scrape_configs": [{
                "job_name": "exactly",
                "static_configs": [{"targets": [address], "labels": {"service_name": name, "namespace": NAMESPACE}}
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

    def rules(self) -> list[dict]:
        """Every alerting rule Prometheus loaded (/api/v1/rules), with its health,
        state and alerts."""
        with urllib.request.urlopen(f"{self.url}/api/v1/rules?type=alert", timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return [rule for group in body["data"]["groups"] for rule in group["rules"]]

    def firing(self, alert: str) -> list[dict]:
        """Label sets of the firing alerts of the rule named `alert`."""
        return [a["labels"] for rule in self.rules() if rule["name"] == alert
                for a in rule.get("alerts", []) if a["state"] == "firing"]

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


def _start_prometheus(cluster, directory: pathlib.Path) -> PrometheusServer:
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.fail(f"{PROMETHEUS} is missing: install Debian's prometheus package (scripts/setup.sh)")
    targets = {s.name: s.metrics_address for s in cluster.services.values()}
    assert all(targets.values()), targets
    directory.mkdir()
    return PrometheusServer(directory, targets)


# The dashboards' per-topic panels and the alerts' topic labels need the topic names:
# metrics.topic.labels=true (off by default; docs/design.md, "Metrics and topic names").
TOPIC_LABELS = {"metrics.topic.labels": "true"}


@pytest.fixture
def cluster(make_cluster):
    return make_cluster(props=TOPIC_LABELS)


@pytest.fixture
def prometheus(cluster, tmp_path):
    server = _start_prometheus(cluster, tmp_path / "prometheus")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def wait_rules_loaded_and_healthy(prometheus: PrometheusServer) -> list[dict]:
    """Wait until Prometheus evaluated every rule of the file once, all healthy."""
    expected = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    rules: list[dict] = []

    def evaluated():
        rules[:] = prometheus.rules()
        return {r["name"] for r in rules} == expected and all(
            not r.get("lastEvaluation", "0001").startswith("0001") for r in rules)  # 0001-01-01: not yet

    wait_for(evaluated, 30, lambda: f"every alert rule to be loaded and evaluated: {rules}", interval_s=0.5)
    unhealthy = [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert unhealthy == []
    return rules


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
    wait_rules_loaded_and_healthy(prometheus)
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

        # The alert rules see it: older than the (test) threshold, and an LSO that does not move.
        for alert in ("ExactlyHangingTransaction", "ExactlyStuckLastStableOffset"):
            labels = wait_for(lambda: [a for a in prometheus.firing(alert)
                                       if a.get("topic") == dst and a.get("partition") == "0"],
                              30, f"{alert} to fire for {dst}-0", interval_s=0.5)[0]
            assert labels["namespace"] == NAMESPACE and labels["job"] == "exactly", labels
            assert labels["severity"] in ("warning", "critical")
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
    wait_for(lambda: not [a for a in prometheus.firing("ExactlyHangingTransaction") if a.get("topic") == dst],
             30, "the hanging-transaction alert to resolve after the commit", interval_s=0.5)

    # Healthy cluster: ISR full, nothing offline, one controller, coordinators owned and
    # the group's lag to the LSO is 0 (it committed up to the end of src).
    healthy = {
        f'sum(exactly_partition_under_replicated{{namespace="{NAMESPACE}"}})': 0,
        f'sum(exactly_cluster_offline_partitions{{namespace="{NAMESPACE}"}})': 0,
        f'sum(exactly_controller_active{{namespace="{NAMESPACE}"}})': 1,
        f'sum(exactly_coordinator_unavailable_partitions{{namespace="{NAMESPACE}"}})': 0,
        f'sum(exactly_coordinator_partitions{{state="loading"}})': 0,
        f'sum(exactly_group_lag_offsets{{topic="{src}"}})': 0,
        f'count(exactly_group_lag_offsets{{topic="{src}"}})': 3,
        f'sum(exactly_partition_in_sync_replicas{{topic="{src}"}})': 3,
        'sum(exactly_cluster_live_nodes{role="partition_leader"})': 3,
    }
    for expr, want in healthy.items():
        wait_for(lambda: prometheus.value(expr) == want, 30, f"{expr} == {want}", interval_s=0.5)
    assert prometheus.value(f'min(exactly_partition_log_size_bytes{{topic="{dst}"}})') > 0
    assert prometheus.value(f'max(exactly_partition_log_start_offset{{topic="{dst}"}})') == 0

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


def test_the_prepared_transaction_alert_fires_until_the_transaction_is_decided(cluster, prometheus):
    """A transaction prepared (KIP-939) and left by its application: the coordinator
    keeps it and reports its age; ExactlyPreparedTransactionWaiting fires (threshold
    lowered to 3 s) and resolves once an operator decided it."""
    wait_rules_loaded_and_healthy(prometheus)
    topic, tid = _name("prep"), _name("prep")
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(topic, 1)], timeout=60)
    p = Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": tid})
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, b"prepared", partition=0)
        state = p.prepare_transaction()
    finally:
        p.close()  # the application is gone
    wait_for(lambda: prometheus.value("sum(exactly_txn_prepared_transactions)") == 1, 30,
             "the coordinator to report one prepared transaction", interval_s=0.5)
    labels = wait_for(lambda: prometheus.firing("ExactlyPreparedTransactionWaiting"), 30,
                      "ExactlyPreparedTransactionWaiting to fire", interval_s=0.5)[0]
    assert (labels["namespace"], labels["job"], labels["severity"]) == (NAMESPACE, "exactly", "critical")
    assert prometheus.value("max(exactly_txn_oldest_prepared_transaction_age_seconds)") >= 3
    decide_prepared_transaction(tid, cluster.bootstrap_servers, commit=True, state=state)
    wait_for(lambda: prometheus.value("sum(exactly_txn_prepared_transactions)") == 0
             and prometheus.value("max(exactly_txn_oldest_prepared_transaction_age_seconds)") == 0, 30,
             "no prepared transaction left", interval_s=0.5)
    wait_for(lambda: not prometheus.firing("ExactlyPreparedTransactionWaiting"), 30,
             "the alert to resolve once the transaction is decided", interval_s=0.5)


def test_alerts_fire_for_offline_under_replicated_partitions_and_an_unowned_coordinator(make_cluster, tmp_path):
    """RF 3 topic and RF 1 topic on 3 partition leaders: SIGKILL of the RF 1 topic's
    replica takes that partition offline and leaves the RF 3 partitions with 2 in-sync
    replicas; SIGKILL of the only group coordinator leaves __consumer_offsets unowned.
    The rules fire once the ZooKeeper sessions end (4 s)."""
    cluster = make_cluster(props={"zookeeper.session.timeout.ms": "4000", **TOPIC_LABELS})
    prometheus = _start_prometheus(cluster, tmp_path / "prometheus")
    try:
        prometheus.wait_ready()
        wait_for(lambda: prometheus.value("count(up == 1)") == len(cluster.services), 30,
                 "every service to be scraped", interval_s=0.5)
        replicated, solo = _name("rf3"), _name("rf1")
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        try:
            admin.create_topics([NewTopic(replicated, 2, replication_factor=3), NewTopic(solo, 1)], timeout=60)
        finally:
            admin.close()
        # A group with committed offsets makes __consumer_offsets exist and be owned.
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": _name("g"),
                             "enable.auto.commit": False})
        try:
            consumer.commit(offsets={TopicPartition(solo, 0): OffsetAndMetadata(0)})
        finally:
            consumer.close()
        wait_for(lambda: prometheus.value(f'sum(exactly_partition_in_sync_replicas{{topic="{replicated}"}})') == 6,
                 30, "full ISRs of the RF 3 topic", interval_s=0.5)
        wait_for(lambda: prometheus.value(
            'sum(exactly_coordinator_partitions{kind="group", state="serving"})') == 4, 30,
            "every __consumer_offsets partition owned and served", interval_s=0.5)
        rules = wait_rules_loaded_and_healthy(prometheus)
        assert all(r["state"] == "inactive" for r in rules if r["name"] != "ExactlyCoordinatorLoading"), \
            [(r["name"], r["state"]) for r in rules]

        # Which process hosts the RF 1 partition: the instance label of its leader's series.
        (series,) = wait_for(lambda: prometheus.query(f'exactly_partition_high_watermark{{topic="{solo}"}}'), 30,
                             "the RF 1 partition's series", interval_s=0.5)
        by_address = {s.metrics_address: s.name for s in cluster.services.values()}
        victim = by_address[series["metric"]["instance"]]
        cluster.kill(victim)
        cluster.kill("group-0")

        offline = wait_for(lambda: prometheus.firing("ExactlyOfflinePartitions"), 60,
                           "ExactlyOfflinePartitions to fire", interval_s=0.5)
        topics = {a["topic"] for a in offline}
        # the internal topics are RF 1 too: their partitions on the victim go offline with it
        assert solo in topics and topics <= {solo, "__consumer_offsets", "__transaction_state"}, offline
        assert replicated not in topics
        under = wait_for(lambda: [a for a in prometheus.firing("ExactlyUnderReplicatedPartitions")
                                  if a["topic"] == replicated], 60,
                         "ExactlyUnderReplicatedPartitions to fire for the RF 3 topic", interval_s=0.5)
        assert under[0]["severity"] == "warning"
        assert prometheus.value(f'sum(exactly_partition_in_sync_replicas{{topic="{replicated}"}})') == 4
        unowned = wait_for(lambda: prometheus.firing("ExactlyCoordinatorUnavailable"), 60,
                           "ExactlyCoordinatorUnavailable to fire", interval_s=0.5)
        assert {a["kind"] for a in unowned} == {"group"}, unowned
        assert prometheus.value('sum(exactly_cluster_live_nodes{role="group_coordinator"})') == 0
        assert prometheus.value(f'sum(exactly_cluster_offline_partitions{{topic="{solo}"}})') == 1

        # The replica comes back: the partition is online again and the alert resolves.
        cluster.restart(victim)
        wait_for(lambda: not prometheus.firing("ExactlyOfflinePartitions"), 60,
                 "ExactlyOfflinePartitions to resolve after the restart", interval_s=0.5)
        assert all(r["health"] == "ok" for r in prometheus.rules())
    finally:
        prometheus.stop()
