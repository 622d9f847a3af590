"""The Helm chart deploy/helm/exactly: strict lint, offline render (default values, the
5-partition-leader values and an external-ZooKeeper variant), and validation of every
rendered manifest against the Kubernetes 1.30 schemas in strict mode."""
from __future__ import annotations

import json
import os
import pathlib
import py_compile
import re
import subprocess
import sys

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "exactly"
GRAFANA = REPO / "deploy" / "grafana"
KUBE_VERSION = "1.30"
RELEASE = "exactly"
NAMESPACE = "streams"

EXTERNAL_ZK = {
    "zookeeper": {"external": {"connect": "zk-0.zk:2181,zk-1.zk:2181"}, "chroot": "/exactly"},
    "network": {"bindAllInterfaces": True},
    "metrics": {"enabled": False},
    "dashboards": {"enabled": False},
    "serviceAccount": {"create": False},
}
PLAINTEXT = {"security": {"enabled": False}}
CERT_MANAGER = {"security": {"tls": {"certManager": {"enabled": True}}}}
VALUE_SETS = {
    "default": {},
    "5-leaders": yaml.safe_load((CHART / "ci" / "values-5-leaders.yaml").read_text()),
    "external-zookeeper": EXTERNAL_ZK,
    "plaintext": PLAINTEXT,
    "cert-manager": CERT_MANAGER,
}
# CRDs: no Kubernetes schema (checked by their own tests).
CRD_GROUPS = ("monitoring.coreos.com/", "cert-manager.io/")
COMPONENTS = {"partition-leader": "partition_leader", "txn-coordinator": "txn_coordinator",
              "group-coordinator": "group_coordinator"}


# The certificates' Secrets a secured install names without cert-manager (the chart fails
# naming them otherwise: test_helm_secrets.py); every render below names them unless its
# values say otherwise.
USER_SECRETS = {"security": {"tls": {"existingSecret": f"{RELEASE}-tls", "clientSecret": f"{RELEASE}-admin-tls"}}}


def merged(base: dict, values: dict) -> dict:
    """`values` over `base`, nested mappings merged key by key."""
    out = dict(base)
    for key, value in values.items():
        out[key] = merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def render(values: dict, chart_dir: pathlib.Path = CHART, name: str = RELEASE, namespace: str = NAMESPACE,
           user_secrets: bool = True) -> list[dict]:
    """Every object the chart renders with `values` (hooks included, NOTES.txt not), over
    USER_SECRETS unless `user_secrets` is False."""
    if user_secrets and chart_dir == CHART:
        values = merged(USER_SECRETS, values)
    with helm.Chart.load(chart_dir) as chart:
        manifests = chart.render(values, name=name, namespace=namespace, is_install=True)
    objects = []
    for path, text in sorted(manifests.items()):
        if not path.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc.setdefault("_template", path)
                objects.append(doc)
    return objects


def secrets_needed(objects: list[dict]) -> set[str]:
    """Names of the Secrets the rendered pods (and pod templates) mount or read."""
    names: set[str] = set()
    for _, spec in pod_specs(objects):
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                names.add(volume["secret"]["secretName"])
            for source in volume.get("projected", {}).get("sources", []):
                if "secret" in source:
                    names.add(source["secret"]["name"])
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    names.add(ref["name"])
            for source in c.get("envFrom", []):
                if "secretRef" in source:
                    names.add(source["secretRef"]["name"])
    return names


def secrets_missing(objects: list[dict], made_by_hand: set[str]) -> set[str]:
    """The Secrets the pods need that neither the chart (a Secret, or a cert-manager
    Certificate's secretName) nor `made_by_hand` provides."""
    provided = {o["metadata"]["name"] for o in objects if o["kind"] == "Secret"}
    provided |= {o["spec"]["secretName"] for o in objects if o["kind"] == "Certificate"}
    return secrets_needed(objects) - provided - made_by_hand


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, render(VALUE_SETS[request.param])


def strip(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k != "_template"}


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_specs(objects: list[dict]) -> list[tuple[str, dict]]:
    specs = [(o["metadata"]["name"], o["spec"]["template"]["spec"])
             for o in objects if o["kind"] in ("StatefulSet", "Deployment")]
    specs += [(o["metadata"]["name"], o["spec"]) for o in objects if o["kind"] == "Pod"]
    return specs


def statefulset(objects: list[dict], component: str) -> dict:
    return by_kind(objects, "StatefulSet")[f"{RELEASE}-{component}"]


def container(sts: dict) -> dict:
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    return c


# ------------------------------------------------------------------------- lint + schema
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_chart_lints_clean_in_strict_mode(name):
    report = helm.lint(CHART, VALUE_SETS[name], strict=True, kube_version=f"v{KUBE_VERSION}.0")
    assert report["errors"] == []
    assert report["total_charts_linted"] == 1
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == []


def invalid(objects: list[dict]) -> list[str]:
    """What fails strict validation against the Kubernetes schemas, one line per object
    (CRDs, which have no Kubernetes schema, are checked by their own tests)."""
    failures = []
    for obj in objects:
        if obj["apiVersion"].startswith(CRD_GROUPS):
            continue  # a CRD: no Kubernetes schema; see test_service_monitor, test_helm_security
        try:
            kubernetes_validate.validate(strip(obj), KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            failures.append(f"{obj['_template']} {obj['kind']}/{obj['metadata']['name']}: {e.message} at "
                            f"{'.'.join(map(str, e.path))}")
    return failures


def test_every_manifest_validates_against_kubernetes_schemas_strictly(rendered):
    name, objects = rendered
    assert objects
    failures = invalid(objects)
    assert failures == [], f"{name}: " + "\n".join(failures)


def test_every_object_has_standard_labels_and_the_release_namespace(rendered):
    _, objects = rendered
    for obj in objects:
        labels = obj["metadata"]["labels"]
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                    "app.kubernetes.io/managed-by", "helm.sh/chart"):
            assert key in labels, (obj["kind"], obj["metadata"]["name"], key)
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert obj["metadata"]["namespace"] == NAMESPACE


# ------------------------------------------------------------------------- workloads
def test_partition_leader_replicas_follow_the_values():
    assert statefulset(render({}), "partition-leader")["spec"]["replicas"] == 3
    assert statefulset(render(VALUE_SETS["5-leaders"]), "partition-leader")["spec"]["replicas"] == 5


def test_each_role_is_a_statefulset_with_a_headless_service_and_a_pdb(rendered):
    _, objects = rendered
    services = by_kind(objects, "Service")
    pdbs = by_kind(objects, "PodDisruptionBudget")
    for sts in by_kind(objects, "StatefulSet").values():
        headless = services[sts["spec"]["serviceName"]]
        assert headless["spec"]["clusterIP"] == "None"
        assert headless["spec"]["publishNotReadyAddresses"] is True
        assert headless["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
        pdb = pdbs[sts["metadata"]["name"]]
        assert pdb["spec"]["selector"] == sts["spec"]["selector"]
        assert pdb["spec"]["maxUnavailable"] == 1
    for component in COMPONENTS:
        assert f"{RELEASE}-{component}" in by_kind(objects, "StatefulSet")


def test_client_service_selects_every_exactly_pod_and_no_zookeeper(rendered):
    _, objects = rendered
    selector = by_kind(objects, "Service")[RELEASE]["spec"]["selector"]

    def selected(labels: dict) -> bool:
        return all(labels.get(k) == v for k, v in selector.items())

    for sts in by_kind(objects, "StatefulSet").values():
        component = sts["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        assert selected(sts["spec"]["template"]["metadata"]["labels"]) == (component in COMPONENTS)


def test_node_id_and_advertised_host_are_the_pod_name_and_its_dns_name():
    objects = render({})
    for component, role in COMPONENTS.items():
        sts = statefulset(objects, component)
        c = container(sts)
        assert c["command"][:3] == ["/bin/sh", "/etc/exactly/launch.sh", role]
        args = c["args"]
        assert args[args.index("--node-id") + 1] == "$(POD_NAME)"
        assert args[args.index("--host") + 1] == "0.0.0.0"
        assert args[args.index("--advertised-host") + 1] == "$(POD_FQDN)"
        assert args[args.index("--port") + 1] == "9093"
        assert args[args.index("--kafka-port") + 1] == "9092"
        assert args[args.index("--link-port") + 1] == "9094"
        # the secureClientPort: ZooKeeper over TLS by default
        assert args[args.index("--zookeeper") + 1] == f"{RELEASE}-zookeeper.{NAMESPACE}.svc.cluster.local:2281"
        env = {e["name"]: e for e in c["env"]}
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["POD_FQDN"]["value"] == (f"$(POD_NAME).{sts['spec']['serviceName']}.$(POD_NAMESPACE)"
                                           ".svc.cluster.local")
        assert "EXACTLY_WAIT_FOR_HOST" not in env
        names = [e["name"] for e in c["env"]]
        assert names.index("POD_NAME") < names.index("POD_FQDN")  # dependent variables come later


def test_kafka_port_on_pods_headless_and_client_services_and_off_with_minus_one():
    objects = render({})
    services = [svc for svc in by_kind(objects, "Service").values()
                if svc["metadata"]["labels"].get("app.kubernetes.io/component") in (*COMPONENTS, "bootstrap")]
    assert len(services) == len(COMPONENTS) + 1
    for svc in services:
        ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
        assert ports["kafka"] == 9092 and ports["grpc"] == 9093
    for component in COMPONENTS:
        c = container(statefulset(objects, component))
        assert {p["name"]: p["containerPort"] for p in c["ports"]}["kafka"] == 9092
    off = render({"network": {"kafkaPort": -1}})
    for component in COMPONENTS:
        c = container(statefulset(off, component))
        assert "kafka" not in {p["name"] for p in c["ports"]}
        assert c["args"][c["args"].index("--kafka-port") + 1] == "-1"
    assert all("kafka" not in {p["name"] for p in svc["spec"]["ports"]} for svc in by_kind(off, "Service").values())


def test_link_port_on_pods_and_headless_services_and_off_with_minus_one():
    """The services' links to each other: a container port and a port of each headless
    Service (pod-to-pod; the client Service has none), -1 passed on to turn them off."""
    objects = render({})
    for component in COMPONENTS:
        sts = statefulset(objects, component)
        assert {p["name"]: p["containerPort"] for p in container(sts)["ports"]}["link"] == 9094
        headless = by_kind(objects, "Service")[sts["spec"]["serviceName"]]
        assert {p["name"]: p["port"] for p in headless["spec"]["ports"]}["link"] == 9094
    off = render({"network": {"linkPort": -1}})
    for component in COMPONENTS:
        c = container(statefulset(off, component))
        assert "link" not in {p["name"] for p in c["ports"]}
        assert c["args"][c["args"].index("--link-port") + 1] == "-1"
    assert all("link" not in {p["name"] for p in svc["spec"]["ports"]} for svc in by_kind(off, "Service").values())


def test_without_bind_all_interfaces_the_service_binds_its_dns_name():
    objects = render({"network": {"bindAllInterfaces": False}})
    for component in COMPONENTS:
        c = container(statefulset(objects, component))
        args = c["args"]
        assert args[args.index("--host") + 1] == "$(POD_FQDN)"
        assert "--advertised-host" not in args
        env = {e["name"]: e for e in c["env"]}
        assert env["EXACTLY_WAIT_FOR_HOST"]["value"] == "$(POD_FQDN)"


def test_probes_are_native_grpc_probes_on_the_grpc_port_without_security():
    objects = render(PLAINTEXT)
    for component in COMPONENTS:
        c = container(statefulset(objects, component))
        (port,) = [p["containerPort"] for p in c["ports"] if p["name"] == "grpc"]
        for probe in ("startupProbe", "readinessProbe"):
            assert c[probe]["grpc"] == {"port": port}, (component, probe)
        # the health service that stays SERVING while a coordinator loads a partition
        assert c["livenessProbe"]["grpc"] == {"port": port, "service": "liveness"}, component


def test_pods_run_as_non_root_with_a_read_only_root_and_no_capabilities(rendered):
    _, objects = rendered
    for name, spec in pod_specs(objects):
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True, name
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["automountServiceAccountToken"] is False, name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, name
            if not c["image"].startswith("zookeeper:"):
                assert pod["runAsUser"] == sc["runAsUser"] == 10001, name
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            assert "/tmp" in mounts, name
            assert c["resources"]["requests"] and c["resources"]["limits"], name


def test_partition_leaders_keep_log_and_snapshots_on_persistent_volumes():
    sts = statefulset(render({}), "partition-leader")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    c = container(sts)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert c["args"][c["args"].index("--data-dir") + 1] == mounts["data"] == "/var/lib/exactly"

    sts = statefulset(render(VALUE_SETS["5-leaders"]), "partition-leader")
    claims = {t["metadata"]["name"]: t for t in sts["spec"]["volumeClaimTemplates"]}
    assert claims["data"]["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert claims["snapshots"]["spec"]["resources"]["requests"]["storage"] == "2Gi"
    mounts = {m["name"]: m["mountPath"] for m in container(sts)["volumeMounts"]}
    assert mounts["snapshots"] == "/var/lib/exactly/producer-state"  # services/partition_leader/service.py


def test_transaction_coordinators_keep_their_log_on_persistent_volumes():
    # They lead their own __transaction_state partitions (metadata.version 3).
    objects = render({})
    sts = statefulset(objects, "txn-coordinator")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    c = container(sts)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert c["args"][c["args"].index("--data-dir") + 1] == mounts["data"] == "/var/lib/exactly"
    assert "data" not in {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}
    txn = by_kind(objects, "ConfigMap")[f"{RELEASE}-config"]["data"]["txn-coordinator.properties"].splitlines()
    assert "transaction.state.log.replication.factor=3" in txn


def test_group_coordinators_use_an_empty_dir_for_their_data_directory():
    sts = statefulset(render({}), "group-coordinator")
    assert "volumeClaimTemplates" not in sts["spec"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["data"]


def test_metrics_port_annotations_and_settings(rendered):
    name, objects = rendered
    enabled = name != "external-zookeeper"
    config = by_kind(objects, "ConfigMap")[f"{RELEASE}-config"]["data"]
    assert ("metrics.port=9404" in config["common.properties"].splitlines()) == enabled
    # User topic names are labels only when the values say so (metrics.topicLabels).
    assert ("metrics.topic.labels=false" in config["common.properties"].splitlines()) == enabled
    assert ("metrics.group.labels=false" in config["common.properties"].splitlines()) == enabled
    for component in COMPONENTS:
        sts = statefulset(objects, component)
        annotations = sts["spec"]["template"]["metadata"]["annotations"]
        ports = {p["name"]: p["containerPort"] for p in container(sts)["ports"]}
        headless = by_kind(objects, "Service")[sts["spec"]["serviceName"]]
        if enabled:
            assert annotations["prometheus.io/scrape"] == "true"
            assert annotations["prometheus.io/port"] == "9404" and ports["metrics"] == 9404
            assert "metrics" in {p["name"] for p in headless["spec"]["ports"]}
        else:
            assert "prometheus.io/scrape" not in annotations and "metrics" not in ports
        assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/config"])


def test_service_monitor_is_off_by_default_and_selects_the_headless_services():
    assert not [o for o in render({}) if o["kind"] == "ServiceMonitor"]
    objects = render(VALUE_SETS["5-leaders"])
    (sm,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    sel = sm["spec"]["selector"]
    matched = set()
    for svc in by_kind(objects, "Service").values():
        labels = svc["metadata"]["labels"]
        if all(labels.get(k) == v for k, v in sel["matchLabels"].items()) and all(
                labels.get(e["key"]) in e["values"] for e in sel["matchExpressions"]):
            matched.add(svc["metadata"]["name"])
            assert "metrics" in {p["name"] for p in svc["spec"]["ports"]}
    assert matched == {f"{RELEASE}-{c}" for c in COMPONENTS}


def test_metrics_topic_labels_follow_the_values():
    data = by_kind(render({"metrics": {"topicLabels": True}}), "ConfigMap")[f"{RELEASE}-config"]["data"]
    assert "metrics.topic.labels=true" in data["common.properties"].splitlines()
    data = by_kind(render({"metrics": {"groupLabels": True}}), "ConfigMap")[f"{RELEASE}-config"]["data"]
    assert "metrics.group.labels=true" in data["common.properties"].splitlines()


def test_settings_configmap_renders_kafka_style_properties():
    objects = render({"config": {"partitionLeader": {"segment.bytes": 1073741824, "x.ratio": 0.5},
                                 "txnCoordinator": {"transaction.max.timeout.ms": "900000"}}})
    data = by_kind(objects, "ConfigMap")[f"{RELEASE}-config"]["data"]
    assert "zookeeper.session.timeout.ms=10000" in data["common.properties"].splitlines()
    assert "transaction.state.log.num.partitions=8" in data["txn-coordinator.properties"].splitlines()
    assert "offsets.topic.num.partitions=8" in data["group-coordinator.properties"].splitlines()
    leader = data["partition-leader.properties"].splitlines()
    assert "segment.bytes=1073741824" in leader and "x.ratio=0.5" in leader
    assert "transaction.max.timeout.ms=900000" in data["txn-coordinator.properties"].splitlines()
    assert data["launch.sh"] == (CHART / "files" / "launch.sh").read_text()


# ------------------------------------------------------------------------- ZooKeeper
def test_zookeeper_ensemble_of_three_lists_every_server():
    objects = render(VALUE_SETS["5-leaders"])
    sts = by_kind(objects, "StatefulSet")[f"{RELEASE}-zookeeper"]
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"].startswith("zookeeper:")
    cfg = by_kind(objects, "ConfigMap")[f"{RELEASE}-zookeeper"]["data"]["zoo.cfg"].splitlines()
    headless = sts["spec"]["serviceName"]
    for i in range(3):
        assert (f"server.{i + 1}={RELEASE}-zookeeper-{i}.{headless}.{NAMESPACE}.svc.cluster.local:2888:3888"
                in cfg)
    assert "standaloneEnabled=false" in cfg
    assert not [line for line in render({}) if line["kind"] == "ConfigMap"
                and "server.1=" in line["data"].get("zoo.cfg", "")]


def test_external_zookeeper_replaces_the_ensemble():
    objects = render(EXTERNAL_ZK)
    # Only the services' digest password (the chart makes it): no ensemble, no quorum password.
    assert [(o["kind"], o["metadata"]["name"]) for o in objects if "zookeeper" in o["metadata"]["name"]] == [
        ("Secret", f"{RELEASE}-zookeeper")]
    for component in COMPONENTS:
        args = container(statefulset(objects, component))["args"]
        assert args[args.index("--zookeeper") + 1] == "zk-0.zk:2181,zk-1.zk:2181/exactly"


# ------------------------------------------------------------------------- dashboards
def test_dashboards_in_the_chart_are_identical_to_deploy_grafana():
    chart_copies = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))
    originals = sorted(p.name for p in GRAFANA.glob("*.json"))
    assert chart_copies == originals == ["services.json", "transactions.json"]
    for name in originals:
        assert (CHART / "dashboards" / name).read_bytes() == (GRAFANA / name).read_bytes(), name


def test_dashboards_ship_as_configmaps_for_the_grafana_sidecar():
    objects = render(VALUE_SETS["5-leaders"])
    maps = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["labels"].get("grafana_dashboard")]
    assert len(maps) == 2
    shipped = {}
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "Exactly"}
        for key, text in cm["data"].items():
            shipped[key] = json.loads(text)
    assert shipped == {f"exactly-{p.stem}.json": json.loads(p.read_text()) for p in GRAFANA.glob("*.json")}
    assert not [o for o in render(EXTERNAL_ZK) if o["metadata"]["labels"].get("grafana_dashboard")]


# ------------------------------------------------------------------------- helm test hook
def test_helm_test_hook_runs_the_round_trip_script():
    objects = render({})
    pods = [o for o in objects if o["kind"] == "Pod"]
    (pod,) = pods
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    (c,) = pod["spec"]["containers"]
    assert c["command"] == ["python", "/opt/exactly-test/round_trip.py"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["EXACTLY_BOOTSTRAP_SERVERS"] == f"{RELEASE}.{NAMESPACE}.svc.cluster.local:9093"
    script_map = by_kind(objects, "ConfigMap")[pod["spec"]["volumes"][0]["configMap"]["name"]]
    assert script_map["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert script_map["data"]["round_trip.py"] == (CHART / "files" / "round_trip.py").read_text()


def test_round_trip_script_compiles_and_uses_the_sdk(tmp_path):
    script = CHART / "files" / "round_trip.py"
    py_compile.compile(str(script), cfile=str(tmp_path / "round_trip.pyc"), doraise=True)
    text = script.read_text()
    assert "from exactly import AdminClient, Consumer, NewTopic, Producer" in text
    for call in ("init_transactions(", "begin_transaction(", ".send(", "commit_transaction(",
                 "abort_transaction(", '"isolation.level": "read_committed"'):
        assert call in text, call


# ------------------------------------------------------------------------- launcher
def _kubelet_expand(value: str, env: dict[str, str]) -> str:
    """$(NAME) references expanded as the kubelet does for args and env values."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def _write_pod_files(tmp_path: pathlib.Path, objects: list[dict]) -> pathlib.Path:
    etc = tmp_path / "etc"
    etc.mkdir()
    for key, text in by_kind(objects, "ConfigMap")[f"{RELEASE}-config"]["data"].items():
        (etc / key).write_text(text)
    # A stand-in for `python -m services.<role>` that parses the command line with the
    # services' own parser and prints the resulting configuration.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python"
    stub.write_text(
        f"#!/bin/sh\n[ \"$1\" = -m ] || exit 3\nmodule=\"$2\"; shift 2\n"
        f"exec {sys.executable} -c '"
        "import json, sys; from services.common.config import parse_args; "
        "cfg = parse_args(sys.argv[1].split(\".\", 1)[1], sys.argv[2:]); "
        "print(json.dumps({\"role\": cfg.role, \"node_id\": cfg.node_id, \"host\": cfg.host, "
        "\"advertised_host\": cfg.advertised_host, "
        "\"port\": cfg.port, \"zookeeper\": cfg.zookeeper, \"data_dir\": str(cfg.data_dir), "
        "\"props\": cfg.props}))' \"$module\" \"$@\"\n")
    stub.chmod(0o755)
    return etc


def test_launcher_turns_settings_into_set_flags_of_the_service_command_line(tmp_path):
    objects = render({**PLAINTEXT, "config": {"common": {"zookeeper.session.timeout.ms": "6000"},
                                 "partitionLeader": {"segment.bytes": "1048576", "min.insync.replicas": "2"}}})
    etc = _write_pod_files(tmp_path, objects)
    c = container(statefulset(objects, "partition-leader"))
    env = {"POD_NAME": "exactly-partition-leader-0", "POD_NAMESPACE": NAMESPACE, "POD_IP": "10.0.0.7"}
    for e in c["env"]:
        if "value" in e:
            env[e["name"]] = _kubelet_expand(e["value"], env)
    env["EXACTLY_WAIT_FOR_HOST"] = "localhost"  # the pod FQDN does not resolve here
    argv = [_kubelet_expand(a, env).replace("/etc/exactly", str(etc)) for a in c["command"] + c["args"]]
    run_env = {**os.environ, **env, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    out = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=60, check=True)
    cfg = json.loads(out.stdout)
    assert cfg["role"] == "partition_leader"
    assert cfg["node_id"] == "exactly-partition-leader-0"
    assert cfg["host"] == "0.0.0.0"
    assert cfg["advertised_host"] == f"exactly-partition-leader-0.exactly-partition-leader.{NAMESPACE}.svc.cluster.local"
    assert cfg["port"] == 9093
    assert cfg["zookeeper"] == f"{RELEASE}-zookeeper.{NAMESPACE}.svc.cluster.local:2181"
    assert cfg["data_dir"] == "/var/lib/exactly"
    assert cfg["props"] == {"metrics.port": "9404", "metrics.bind.address": "10.0.0.7",  # the pod IP
                            "metrics.topic.labels": "false", "metrics.group.labels": "false",
                            "zookeeper.session.timeout.ms": "6000", "segment.bytes": "1048576",
                            "min.insync.replicas": "2"}


# ZooKeeper digest authentication keys the chart passes with security on; a service whose
# schema does not define them yet is checked without them.
ZOOKEEPER_AUTH_KEYS = ("zookeeper.set.acl", "zookeeper.digest.username", "zookeeper.digest.password")


@pytest.mark.parametrize("values", ["default", "ci", "plaintext", "cert-manager"])
def test_every_services_rendered_settings_pass_its_schema(values):
    """Each service refuses a setting its role does not have: the chart's defaults (and
    the CI values, plaintext and cert-manager variants) must only give each role its own keys."""
    from services.common.settings import SERVICE_SCHEMAS
    from exactly_wire.config import parse
    overrides = VALUE_SETS["5-leaders" if values == "ci" else values]
    data = by_kind(render(overrides), "ConfigMap")[f"{RELEASE}-config"]["data"]
    files = {"partition_leader": "partition-leader.properties", "txn_coordinator": "txn-coordinator.properties",
             "group_coordinator": "group-coordinator.properties"}
    for role, name in files.items():
        props = {}
        for line in data["common.properties"].splitlines() + data[name].splitlines():
            if line and not line.startswith(("#", "!")):
                key, _, value = line.partition("=")
                props[key] = value
        parse(SERVICE_SCHEMAS[role], props)  # raises ConfigurationError naming a wrong key


def test_launcher_gives_up_when_the_advertised_name_never_resolves(tmp_path):
    etc = _write_pod_files(tmp_path, render({}))
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "EXACTLY_WAIT_FOR_HOST": "no-such-pod.invalid", "EXACTLY_WAIT_FOR_HOST_SECONDS": "1"}
    out = subprocess.run(["/bin/sh", str(etc / "launch.sh"), "txn_coordinator", str(etc / "common.properties"),
                          "--", "--node-id", "x"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "does not resolve" in out.stderr
