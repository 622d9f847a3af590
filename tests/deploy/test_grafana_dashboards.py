"""The Grafana dashboards in deploy/grafana: valid JSON, every query through the
`datasource` variable and filtered by the namespace/job/instance variables (so two
releases are never summed together), only the services' metric names in the PromQL,
and every panel described in deploy/grafana/README.md."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import re

import promql_parser
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
GRAFANA = REPO / "deploy" / "grafana"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# The metric names the services export (Prometheus conventions: counters end in _total,
# histograms are queried through their _bucket, _count and _sum series).
GAUGES = {
    "exactly_partition_live_producer_ids", "exactly_partition_high_watermark",
    "exactly_partition_last_stable_offset", "exactly_partition_lso_lag_offsets",
    "exactly_partition_ongoing_transactions", "exactly_partition_oldest_open_transaction_age_seconds",
    "exactly_partition_aborted_index_entries",
    "exactly_txn_active_transactional_ids", "exactly_txn_transactions",
    "exactly_group_groups", "exactly_group_members", "exactly_group_pending_txn_offsets",
    "exactly_partition_replicas", "exactly_partition_in_sync_replicas", "exactly_partition_under_replicated",
    "exactly_partition_at_min_isr", "exactly_partition_under_min_isr", "exactly_partition_log_start_offset",
    "exactly_partition_log_size_bytes", "exactly_controller_active", "exactly_cluster_offline_partitions",
    "exactly_cluster_live_nodes", "exactly_coordinator_unavailable_partitions", "exactly_coordinator_partitions",
    "exactly_group_committed_offset", "exactly_group_lag_offsets", "exactly_log_dir_offline",
    "exactly_txn_prepared_transactions", "exactly_txn_oldest_prepared_transaction_age_seconds",
}
COUNTERS = {
    "exactly_produce_bytes_total", "exactly_produce_records_total", "exactly_fetch_bytes_total",
    "exactly_fetch_records_total", "exactly_txn_completed_total", "exactly_txn_pid_blocks_allocated_total",
    "exactly_group_rebalances_total", "exactly_rpc_errors_total",
}
HISTOGRAMS = {
    "exactly_txn_end_to_complete_seconds", "exactly_txn_marker_write_seconds",
    "exactly_rpc_request_duration_seconds",
}
PROCESS = {"process_cpu_seconds_total", "process_resident_memory_bytes"}
SERIES = GAUGES | COUNTERS | PROCESS | {h + s for h in HISTOGRAMS for s in ("_bucket", "_count", "_sum")}


def load_exprs_module():
    spec = importlib.util.spec_from_file_location("grafana_exprs", GRAFANA / "exprs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


exprs = load_exprs_module()
DASHBOARDS = {p.stem: json.loads(p.read_text()) for p in sorted(GRAFANA.glob("*.json"))}


def all_panels(board: dict) -> list[dict]:
    out = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def metric_names(expr: str) -> set[str]:
    names: set[str] = set()

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def test_both_dashboards_exist():
    assert sorted(DASHBOARDS) == ["services", "transactions"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_is_a_grafana_39_dashboard_with_a_prometheus_datasource_variable(name):
    board = DASHBOARDS[name]
    assert board["schemaVersion"] == 39
    assert board["uid"] == f"exactly-{name}"
    assert board["title"].startswith("Exactly / ")
    assert board["id"] is None
    variables = {v["name"]: v for v in board["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE, var["name"]
            match = re.fullmatch(r"label_values\((\w+)(\{[^}]*\})?, *(\w+)\)", var["query"]["query"])
            assert match and match.group(1) in SERIES, var["name"]
            assert match.group(3) == var["name"], var["name"]


FILTERS = {"namespace": "$namespace", "job": "$job", "instance": "$instance"}


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_namespace_job_and_instance_variables_come_first_and_depend_on_each_other(name):
    names = [v["name"] for v in DASHBOARDS[name]["templating"]["list"]]
    assert names[:4] == ["datasource", "namespace", "job", "instance"]
    variables = {v["name"]: v for v in DASHBOARDS[name]["templating"]["list"]}
    # One namespace at a time (no "All"): releases in two namespaces are never summed.
    assert variables["namespace"]["multi"] is False and variables["namespace"]["includeAll"] is False
    assert '{namespace=~"$namespace"}' in variables["job"]["query"]["query"]
    assert '{namespace=~"$namespace", job=~"$job"}' in variables["instance"]["query"]["query"]
    for later in names[4:]:
        assert "namespace=~\"$namespace\"" in variables[later]["query"]["query"], later


def selector_matchers(expr: str) -> list[dict[str, str]]:
    """{label: value} of the regex matchers of every vector selector of `expr`."""
    found: list[dict[str, str]] = []

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            found.append({m.name: m.value for m in node.matchers.matchers if m.op == promql_parser.MatchOp.Re})

    promql_parser.walk(promql_parser.parse(expr.replace("$__rate_interval", "1m")), visit)
    return found


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_selector_is_filtered_by_namespace_job_and_instance(name):
    for panel in all_panels(DASHBOARDS[name]):
        for target in panel.get("targets", []):
            for matchers in selector_matchers(target["expr"]):
                for label, value in FILTERS.items():
                    assert matchers.get(label) == value, (panel["title"], label, target["expr"])


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_and_target_uses_the_datasource_variable(name):
    panels = all_panels(DASHBOARDS[name])
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    queried = [p for p in panels if p["type"] != "row"]
    assert queried
    for panel in queried:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert target["expr"].strip(), panel["title"]
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_promql_expression_parses_and_uses_only_exported_metric_names(name):
    board = DASHBOARDS[name]
    for panel in all_panels(board):
        for target in panel.get("targets", []):
            expr = exprs.resolve_variables(target["expr"])
            names = metric_names(expr)
            assert names, (panel["title"], expr)
            assert names <= SERIES, (panel["title"], names - SERIES)


def test_every_exported_metric_appears_on_a_dashboard():
    used = set()
    for _, _, expr in exprs.dashboard_expressions():
        used |= metric_names(expr)
    bases = {re.sub(r"_(bucket|count|sum)$", "", n) if re.sub(r"_(bucket|count|sum)$", "", n) in HISTOGRAMS
             else n for n in used}
    assert (GAUGES | COUNTERS | HISTOGRAMS) - bases == set()


def test_latency_panels_take_p50_and_p99_of_histograms():
    found = {}
    for _, panel, expr in exprs.dashboard_expressions():
        m = re.match(r"histogram_quantile\((0\.\d+), .*?(\w+)_bucket[\[{]", expr)
        if m:
            found.setdefault(m.group(2), set()).add(m.group(1))
    assert found == {h: {"0.5", "0.99"} for h in HISTOGRAMS}


def test_commit_and_abort_rates_are_split_by_outcome_and_cause():
    (expr,) = [e for _, p, e in exprs.dashboard_expressions() if p == "Commit and abort rate"]
    assert expr.startswith("sum by (outcome, cause) (rate(exactly_txn_completed_total{")


def test_dashboard_expressions_lists_every_target_resolved_for_prometheus():
    resolved = exprs.dashboard_expressions()
    raw = exprs.dashboard_expressions(resolve=False)
    count = sum(len(p.get("targets", [])) for b in DASHBOARDS.values() for p in all_panels(b))
    assert len(resolved) == len(raw) == count
    titles = {b["title"] for b in DASHBOARDS.values()}
    for (dashboard, panel, expr), (_, _, original) in zip(resolved, raw):
        assert dashboard in titles and panel
        assert "$" not in expr and "[[" not in expr
        promql_parser.parse(expr)
    assert any("$__rate_interval" in e for _, _, e in raw)
    assert exprs.resolve_variables('rate(x{a=~"$topic"}[$__rate_interval])', "30s") == 'rate(x{a=~".*"}[30s])'


def test_readme_describes_every_panel():
    readme = (GRAFANA / "README.md").read_text()
    for board in DASHBOARDS.values():
        assert board["title"] in readme
        for panel in all_panels(board):
            if panel["type"] != "row":
                assert f"| {panel['title']} |" in readme, panel["title"]
