"""The alerting rules the chart ships (deploy/helm/exactly/files/alerts.yaml): a plain
Prometheus rules file (promtool when installed), every expression parsed, only exported
metric names, annotations and a runbook anchor that exists in docs/operating/alerts.md; and the
optional PrometheusRule: off by default, the same groups when enabled, its options, and
its structure checked against the PrometheusRule CRD's schema for `spec` (a CRD, which
kubernetes-validate has no schema for)."""
from __future__ import annotations

import re
import shutil
import subprocess

import jsonschema
import promql_parser
import pytest
import yaml

from .test_grafana_dashboards import SERIES, metric_names
from .test_helm_chart import CHART, REPO, VALUE_SETS, render

RULES_FILE = CHART / "files" / "alerts.yaml"
RULES = yaml.safe_load(RULES_FILE.read_text())
ALL_RULES = [rule for group in RULES["groups"] for rule in group["rules"]]
REQUIRED = {"ExactlyStuckLastStableOffset", "ExactlyHangingTransaction", "ExactlyUnderReplicatedPartitions",
            "ExactlyOfflinePartitions", "ExactlyCoordinatorUnavailable"}

# The PrometheusRule CRD's openAPIV3Schema of `spec` (prometheus-operator v0.7x,
# monitoring.coreos.com/v1), reduced to the fields the chart may write.
_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
RULE_SPEC_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "properties": {"groups": {"type": "array", "items": {
        "type": "object", "additionalProperties": False, "required": ["name"],
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "interval": {"type": "string", "pattern": _DURATION},
            "limit": {"type": "integer"},
            "partial_response_strategy": {"type": "string"},
            "rules": {"type": "array", "items": {
                "type": "object", "additionalProperties": False, "required": ["expr"],
                "properties": {
                    "alert": {"type": "string"}, "record": {"type": "string"},
                    "expr": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                    "for": {"type": "string", "pattern": _DURATION},
                    "keep_firing_for": {"type": "string", "pattern": _DURATION},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                }}},
        }}}},
}


def prometheus_rules(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"] == "PrometheusRule"]


def test_the_rules_file_has_the_alerts_operators_need():
    names = [r["alert"] for r in ALL_RULES]
    assert len(names) == len(set(names))
    assert REQUIRED <= set(names)
    jsonschema.validate(RULES, RULE_SPEC_SCHEMA)


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r["alert"])
def test_every_alert_parses_uses_exported_metrics_and_keeps_namespace_and_job(rule):
    expr = rule["expr"]
    promql_parser.parse(expr)
    names = metric_names(expr)
    assert names and names <= SERIES, names - SERIES
    for aggregation in re.findall(r"\b(?:sum|max|min) by \(([^)]*)\)", expr):
        labels = {label.strip() for label in aggregation.split(",")}
        assert {"namespace", "job"} <= labels, (rule["alert"], aggregation)  # two releases never merge
    assert rule["labels"]["severity"] in ("warning", "critical")
    assert re.fullmatch(r"\d+m", rule["for"])


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r["alert"])
def test_every_alert_has_a_summary_a_description_and_a_runbook_in_the_docs(rule):
    annotations = rule["annotations"]
    assert annotations["summary"].strip() and annotations["description"].strip()
    assert annotations["runbook_url"] == f"docs/operating/alerts.md#{rule['alert'].lower()}"
    runbooks = (REPO / "docs" / "operating" / "alerts.md").read_text()
    assert f"\n## {rule['alert']}\n" in runbooks, rule["alert"]  # the anchor: the lowercased heading


def test_promtool_accepts_the_rules_file():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    out = subprocess.run([promtool, "check", "rules", str(RULES_FILE)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(ALL_RULES)} rules found" in out.stdout


def test_prometheus_rule_is_off_by_default():
    for values in VALUE_SETS.values():
        assert prometheus_rules(render(values)) == []


def test_enabled_prometheus_rule_ships_the_rules_file_as_is():
    (rule,) = prometheus_rules(render({"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}}))
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"] == "exactly" and rule["metadata"]["namespace"] == "streams"
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["metadata"]["labels"]["app.kubernetes.io/instance"] == "exactly"
    assert rule["spec"] == RULES
    jsonschema.validate(rule["spec"], RULE_SPEC_SCHEMA)
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", rule["metadata"]["name"])


def test_prometheus_rule_options_disable_label_and_link():
    values = {"prometheusRule": {"enabled": True, "disabled": ["ExactlyCoordinatorLoading"],
                                 "ruleLabels": {"team": "streams", "severity": "ignored"},
                                 "runbookBaseUrl": "https://git.example.com/exactly/blob/main/"}}
    (rule,) = prometheus_rules(render(values))
    jsonschema.validate(rule["spec"], RULE_SPEC_SCHEMA)
    rendered = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(rendered) == {r["alert"] for r in ALL_RULES} - {"ExactlyCoordinatorLoading"}
    for original in ALL_RULES:
        if original["alert"] in rendered:
            got = rendered[original["alert"]]
            assert got["labels"] == {"severity": original["labels"]["severity"], "team": "streams"}
            assert got["annotations"]["runbook_url"] == \
                "https://git.example.com/exactly/blob/main/" + original["annotations"]["runbook_url"]
            assert got["expr"] == original["expr"]


def test_service_monitor_makes_the_release_the_job_label():
    (sm,) = [o for o in render(VALUE_SETS["5-leaders"]) if o["kind"] == "ServiceMonitor"]
    assert sm["spec"]["jobLabel"] == "app.kubernetes.io/instance"
    for svc in [o for o in render(VALUE_SETS["5-leaders"]) if o["kind"] == "Service"]:
        if svc["metadata"]["name"] != "exactly" and "zookeeper" not in svc["metadata"]["name"]:
            assert svc["metadata"]["labels"]["app.kubernetes.io/instance"] == "exactly"
