"""Security of the Helm chart deploy/helm/exactly: secure by default (TLS on the gRPC and
Kafka ports with per-pod certificates, client certificates, authorizer=acl, super.users,
ZooKeeper digest credentials from a Secret), plaintext only with security.enabled=false,
cert-manager certificates naming every pod, TLS exec probes, the launcher's secret
settings, and the `helm test` pod and NOTES.txt of a secured release."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import pathlib
import re
import stat
import subprocess
import sys

import grpc
import helm_python as helm
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.deploy.test_helm_chart import (CERT_MANAGER, CHART, COMPONENTS, NAMESPACE, PLAINTEXT, RELEASE,
                                          USER_SECRETS, ZOOKEEPER_AUTH_KEYS, _kubelet_expand, by_kind, container,
                                          merged, render, statefulset)

TLS_DIR = "/etc/exactly-tls"
SECRET_SETTINGS_DIR = "/etc/exactly-secret-settings"
REPLICAS = {"partition-leader": 3, "txn-coordinator": 2, "group-coordinator": 2}
DNS_1123 = re.compile(r"(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def properties(objects: list[dict], name: str = "common.properties") -> dict[str, str]:
    text = by_kind(objects, "ConfigMap")[f"{RELEASE}-config"]["data"][name]
    out = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "!")):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def pod_names(component: str, replicas: int | None = None) -> list[str]:
    return [f"{RELEASE}-{component}-{i}" for i in range(REPLICAS[component] if replicas is None else replicas)]


def pod_fqdn(sts: dict, pod: str) -> str:
    """The pod's POD_FQDN as the kubelet expands it."""
    env = {e["name"]: e.get("value", "") for e in container(sts)["env"]}
    return _kubelet_expand(env["POD_FQDN"], {"POD_NAME": pod, "POD_NAMESPACE": NAMESPACE})


def volumes(sts: dict) -> dict[str, dict]:
    return {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}


def mounts(c: dict) -> dict[str, dict]:
    return {m["name"]: m for m in c.get("volumeMounts", [])}


def set_flags(c: dict) -> dict[str, str]:
    args = c["args"]
    return dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--set")


def notes(values: dict) -> str:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(merged(USER_SECRETS, values), name=RELEASE, namespace=NAMESPACE, is_install=True)
    (text,) = [t for path, t in manifests.items() if path.endswith("NOTES.txt")]
    return text


# ------------------------------------------------------------------------- secure by default
def test_default_render_turns_tls_client_certificates_and_the_acl_authorizer_on():
    objects = render({})
    props = properties(objects)
    assert props["security.protocol"] == "SSL"
    assert props["ssl.ca.location"] == f"{TLS_DIR}/ca.crt"
    assert props["ssl.client.auth"] == "required"
    assert props["authorizer"] == "acl"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    for component in COMPONENTS:
        c = container(statefulset(objects, component))
        flags = set_flags(c)
        assert flags["ssl.certificate.location"] == f"{TLS_DIR}/$(POD_NAME).crt"
        assert flags["ssl.key.location"] == f"{TLS_DIR}/$(POD_NAME).key"


def test_default_render_mounts_the_tls_secret_read_only_in_every_exactly_pod():
    objects = render({})
    for component in COMPONENTS:
        sts = statefulset(objects, component)
        mount = mounts(container(sts))["tls"]
        assert mount["mountPath"] == TLS_DIR and mount["readOnly"] is True
        secret = volumes(sts)["tls"]["secret"]
        assert secret["secretName"] == f"{RELEASE}-tls"
        assert secret["defaultMode"] == 0o440
    named = render({"security": {"tls": {"existingSecret": "my-certs"}}})
    for component in COMPONENTS:
        assert volumes(statefulset(named, component))["tls"]["secret"]["secretName"] == "my-certs"


def test_no_plaintext_listener_or_setting_in_the_default_render():
    objects = render({})
    data = by_kind(objects, "ConfigMap")[f"{RELEASE}-config"]["data"]
    for name, text in data.items():
        if name.endswith(".properties"):
            assert "PLAINTEXT" not in text, name
    assert properties(objects)["security.protocol"] == "SSL"  # both the gRPC and the Kafka listener
    for component in COMPONENTS:
        c = container(statefulset(objects, component))
        # gRPC, Kafka and the services' links (all TLS with security.protocol=SSL) and the HTTP
        # /metrics port only
        assert {p["name"] for p in c["ports"]} == {"grpc", "kafka", "link", "metrics"}
        assert not any("PLAINTEXT" in a for a in c["args"])
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert "grpc" not in c[probe], (component, probe)


def test_super_users_are_every_service_pod_and_the_values():
    objects = render({})
    pods = [p for component in COMPONENTS for p in pod_names(component)]
    assert sorted(properties(objects)["super.users"].split(";")) == sorted(
        [f"User:{p}" for p in pods] + ["User:admin"])
    custom = render({"security": {"superUsers": ["User:ops", "User:CN=backup,O=acme"]},
                     "partitionLeaders": {"replicas": 5}})
    users = properties(custom)["super.users"].split(";")
    assert "User:admin" not in users
    assert users[-2:] == ["User:ops", "User:CN=backup,O=acme"]
    assert {f"User:{p}" for p in pod_names("partition-leader", 5)} <= set(users)


def test_client_auth_follows_the_values():
    assert properties(render({"security": {"clientAuth": "requested"}}))["ssl.client.auth"] == "requested"


# ------------------------------------------------------------------------- plaintext, explicitly
def test_security_disabled_renders_plaintext_with_native_grpc_probes():
    objects = render(PLAINTEXT)
    props = properties(objects)
    for key in ("security.protocol", "ssl.ca.location", "ssl.client.auth", "authorizer", "super.users",
                *ZOOKEEPER_AUTH_KEYS):
        assert key not in props, key
    data = by_kind(objects, "ConfigMap")[f"{RELEASE}-config"]["data"]
    assert "probe.py" not in data
    for component in COMPONENTS:
        sts = statefulset(objects, component)
        c = container(sts)
        assert set_flags(c) == {"metrics.bind.address": "$(POD_IP)"}  # no TLS setting
        assert "tls" not in volumes(sts) and "secret-settings" not in volumes(sts)
        assert "tls" not in mounts(c)
        assert c["readinessProbe"]["grpc"] == {"port": 9093}
        assert "EXACTLY_SECRET_SETTINGS_DIR" not in {e["name"] for e in c["env"]}
    assert not [o for o in render({**PLAINTEXT, **{"security": {"enabled": False, "tls": {
        "certManager": {"enabled": True}}}}}) if o["apiVersion"].startswith("cert-manager.io/")]
    assert "UNSAFE" in notes(PLAINTEXT)
    assert "UNSAFE" not in notes({})


# ------------------------------------------------------------------------- cert-manager
def certificates(objects: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "Certificate"}


def test_cert_manager_is_off_by_default():
    assert not [o for o in render({}) if o["apiVersion"].startswith("cert-manager.io/")]


def test_cert_manager_certificates_are_well_formed():
    objects = render(CERT_MANAGER)
    certs = certificates(objects)
    assert certs
    for name, cert in certs.items():
        assert cert["apiVersion"] == "cert-manager.io/v1"
        assert cert["metadata"]["namespace"] == NAMESPACE
        spec = cert["spec"]
        assert set(spec) <= {"secretName", "commonName", "dnsNames", "duration", "renewBefore", "privateKey",
                              "usages", "issuerRef", "isCA"}, name
        assert spec["secretName"] and spec["issuerRef"]["name"], name
        assert spec["issuerRef"]["group"] == "cert-manager.io"
        assert 0 < len(spec["commonName"]) <= 64, name
        for dns in spec.get("dnsNames", []):
            assert DNS_1123.fullmatch(dns) and len(dns) <= 253, (name, dns)
        assert set(spec.get("usages", [])) <= {"server auth", "client auth", "digital signature",
                                               "key encipherment", "cert sign"}, name
        assert re.fullmatch(r"\d+h", spec["duration"]), name
        if "renewBefore" in spec:
            assert int(spec["renewBefore"][:-1]) < int(spec["duration"][:-1])
    issuers = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Issuer"}
    # no issuerRef: a self-signed CA of the release's own signs the cluster's certificates
    assert issuers[f"{RELEASE}-selfsigned"]["spec"] == {"selfSigned": {}}
    assert certs[f"{RELEASE}-ca"]["spec"]["isCA"] is True
    assert issuers[f"{RELEASE}-ca"]["spec"]["ca"]["secretName"] == certs[f"{RELEASE}-ca"]["spec"]["secretName"]


def test_cert_manager_issues_one_certificate_per_pod_naming_its_dns_names():
    objects = render(CERT_MANAGER)
    certs = certificates(objects)
    client_service = f"{RELEASE}.{NAMESPACE}.svc.cluster.local"
    for component in COMPONENTS:
        sts = statefulset(objects, component)
        for pod in pod_names(component):
            spec = certs[pod]["spec"]
            assert spec["commonName"] == pod  # the node id: principal User:<pod>
            assert spec["secretName"] == f"{pod}-tls"
            assert pod_fqdn(sts, pod) in spec["dnsNames"]  # what the service advertises
            assert client_service in spec["dnsNames"]  # the bootstrap address
            assert {"server auth", "client auth"} <= set(spec["usages"])
            assert spec["issuerRef"]["name"] == f"{RELEASE}-ca"
    super_users = set(properties(objects)["super.users"].split(";"))
    pods = {c["spec"]["commonName"] for c in certs.values() if c["spec"]["secretName"].endswith("-tls")
            and c["metadata"]["labels"].get("app.kubernetes.io/component") in COMPONENTS}
    assert {f"User:{p}" for p in pods} <= super_users
    assert len(pods) == sum(REPLICAS.values())


def test_cert_manager_scales_with_the_replicas():
    objects = render({**CERT_MANAGER, "partitionLeaders": {"replicas": 5}})
    sts = statefulset(objects, "partition-leader")
    certs = certificates(objects)
    for pod in pod_names("partition-leader", 5):
        assert pod_fqdn(sts, pod) in certs[pod]["spec"]["dnsNames"]
    assert f"{RELEASE}-partition-leader-5" not in certs


def test_the_tls_volume_lays_out_each_pods_certificate_in_a_directory_of_its_own():
    objects = render(CERT_MANAGER)
    for component in COMPONENTS:
        sts = statefulset(objects, component)
        projected = volumes(sts)["tls"]["projected"]
        paths = {}
        for source in projected["sources"]:
            for item in source["secret"]["items"]:
                paths[item["path"]] = (source["secret"]["name"], item["key"])
        expected = {}
        for pod in pod_names(component):
            expected[f"{pod}/ca.crt"] = (f"{pod}-tls", "ca.crt")
            expected[f"{pod}/{pod}.crt"] = (f"{pod}-tls", "tls.crt")
            expected[f"{pod}/{pod}.key"] = (f"{pod}-tls", "tls.key")
        assert paths == expected
        # the container mounts its own directory only (tests/deploy/test_helm_isolation.py)
        assert mounts(container(sts))["tls"] == {"name": "tls", "mountPath": TLS_DIR, "subPathExpr": "$(POD_NAME)",
                                                 "readOnly": True}


def test_cert_manager_uses_a_given_issuer_and_creates_none():
    objects = render({"security": {"tls": {"certManager": {
        "enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}}})
    assert not [o for o in objects if o["kind"] == "Issuer"]
    certs = certificates(objects)
    assert f"{RELEASE}-ca" not in certs
    for cert in certs.values():
        assert cert["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}


def test_cert_manager_issues_the_admin_client_certificate_of_the_test_pod():
    objects = render(CERT_MANAGER)
    admin = certificates(objects)[f"{RELEASE}-admin"]["spec"]
    assert admin["commonName"] == "admin" and "User:admin" in properties(objects)["super.users"].split(";")
    assert admin["usages"] == ["client auth", "digital signature", "key encipherment"]
    (pod,) = [o for o in objects if o["kind"] == "Pod"]
    assert {v["name"]: v for v in pod["spec"]["volumes"]}["client-tls"]["secret"]["secretName"] == admin["secretName"]
    off = render({"security": {"tls": {"certManager": {"enabled": True, "admin": {"enabled": False}}}}})
    assert f"{RELEASE}-admin" not in certificates(off)


# ------------------------------------------------------------------------- probes
def test_secured_probes_run_the_tls_health_check_instead_of_native_grpc_probes():
    objects = render({})
    data = by_kind(objects, "ConfigMap")[f"{RELEASE}-config"]["data"]
    assert data["probe.py"] == (CHART / "files" / "probe.py").read_text()
    for component in COMPONENTS:
        c = container(statefulset(objects, component))
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert "grpc" not in c[probe] and "tcpSocket" not in c[probe], (component, probe)
        assert c["startupProbe"]["exec"]["command"] == ["python", "/etc/exactly/probe.py", "9093"]
        assert c["readinessProbe"]["exec"]["command"] == ["python", "/etc/exactly/probe.py", "9093"]
        assert c["livenessProbe"]["exec"]["command"] == ["python", "/etc/exactly/probe.py", "9093", "liveness"]
        assert c["readinessProbe"]["successThreshold"] == 1
        env = {e["name"]: e for e in c["env"]}
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


@pytest.fixture(scope="module")
def pod_tls(tmp_path_factory):
    """A CA and the certificate of pod exactly-partition-leader-0 (its DNS name as SAN),
    laid out as the chart mounts them."""
    from exactly_tools.certs import CertificateAuthority
    work = tmp_path_factory.mktemp("pki")
    pod = f"{RELEASE}-partition-leader-0"
    fqdn = f"{pod}.{RELEASE}-partition-leader.{NAMESPACE}.svc.cluster.local"
    ca = CertificateAuthority.create(work / "ca")
    issued = ca.issue(pod, hosts=[fqdn])
    tls = work / "tls"
    tls.mkdir()
    (tls / "ca.crt").write_bytes(ca.ca_path.read_bytes())
    (tls / f"{pod}.crt").write_bytes(issued.certificate.read_bytes())
    (tls / f"{pod}.key").write_bytes(issued.key.read_bytes())
    return tls, pod, fqdn


async def _run_probe(tls, status, env_overrides=(), service=""):
    """Start a TLS gRPC server requiring client certificates with the pod's certificate,
    health status `status`, and run files/probe.py against it; returns its exit code."""
    tls_dir, pod, fqdn = tls
    creds = grpc.ssl_server_credentials([((tls_dir / f"{pod}.key").read_bytes(),
                                          (tls_dir / f"{pod}.crt").read_bytes())],
                                        root_certificates=(tls_dir / "ca.crt").read_bytes(),
                                        require_client_auth=True)
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    await servicer.set(service, status)
    port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    try:
        env = {**os.environ, "POD_NAME": pod, "POD_IP": "127.0.0.1", "POD_FQDN": fqdn,
               "EXACTLY_TLS_DIR": str(tls_dir), **dict(env_overrides)}
        argv = [sys.executable, str(CHART / "files" / "probe.py"), str(port)] + ([service] if service else [])
        proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        await asyncio.wait_for(proc.communicate(), 30)
        return proc.returncode
    finally:
        await server.stop(None)


def test_probe_script_checks_the_health_service_over_mutual_tls(pod_tls):
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    assert asyncio.run(_run_probe(pod_tls, serving)) == 0
    assert asyncio.run(_run_probe(pod_tls, serving, service="liveness")) == 0
    assert asyncio.run(_run_probe(pod_tls, not_serving)) == 1
    # the server's certificate must name the pod's DNS name
    assert asyncio.run(_run_probe(pod_tls, serving, {"POD_FQDN": "someone-else.example"})) == 1


# ------------------------------------------------------------------------- ZooKeeper credentials
def test_zookeeper_digest_credentials_come_from_a_secret_only_with_security():
    objects = render({})
    props = properties(objects)
    assert props["zookeeper.set.acl"] == "true"
    assert props["zookeeper.digest.username"] == "exactly"
    data = by_kind(objects, "ConfigMap")[f"{RELEASE}-config"]["data"]
    assert not any("zookeeper.digest.password" in line for text in data.values() if isinstance(text, str)
                   for line in text.splitlines() if not line.lstrip().startswith("#"))
    for component in COMPONENTS:
        sts = statefulset(objects, component)
        c = container(sts)
        secret = volumes(sts)["secret-settings"]["secret"]
        assert secret["secretName"] == f"{RELEASE}-zookeeper"
        assert secret["items"] == [{"key": "password", "path": "zookeeper.digest.password"}]
        assert mounts(c)["secret-settings"] == {"name": "secret-settings", "mountPath": SECRET_SETTINGS_DIR,
                                                "readOnly": True}
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["EXACTLY_SECRET_SETTINGS_DIR"] == SECRET_SETTINGS_DIR
        assert not any("password" in a for a in c["args"])
    custom = render({"security": {"zookeeper": {"existingSecret": "zk-creds", "passwordKey": "pw",
                                                "username": "svc", "setAcl": False}}})
    assert properties(custom)["zookeeper.set.acl"] == "false"
    assert properties(custom)["zookeeper.digest.username"] == "svc"
    secret = volumes(statefulset(custom, "txn-coordinator"))["secret-settings"]["secret"]
    assert secret["secretName"] == "zk-creds" and secret["items"][0]["key"] == "pw"
    off = render({"security": {"zookeeper": {"enabled": False}}})
    assert not set(ZOOKEEPER_AUTH_KEYS) & set(properties(off))
    assert "secret-settings" not in volumes(statefulset(off, "group-coordinator"))
    assert properties(off)["authorizer"] == "acl"


def _argv_stub(tmp_path: pathlib.Path) -> pathlib.Path:
    """A `python` that prints its arguments and the settings of its --config file as JSON."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python"
    stub.write_text(
        f"#!/bin/sh\nexec {sys.executable} -c '"
        "import json, os, pathlib, sys; from services.common.config import read_properties; "
        "args = sys.argv[1:]; cfg = args[args.index(\"--config\") + 1] if \"--config\" in args else None; "
        "print(json.dumps({\"argv\": args, \"config\": read_properties(pathlib.Path(cfg)) if cfg else None, "
        "\"mode\": os.stat(cfg).st_mode & 0o777 if cfg else None}))' \"$@\"\n")
    stub.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("password", ["s3cret", r"back\slash=and:colon #hash", "  leading blanks", "пароль€"])
def test_launcher_hands_secret_settings_to_the_service_in_a_private_properties_file(tmp_path, password):
    secrets = tmp_path / "secret-settings"
    secrets.mkdir()
    (secrets / "zookeeper.digest.password").write_text(password + "\n")  # a trailing newline is dropped
    (secrets / "..data").mkdir()  # what a Secret volume also holds: ignored
    bin_dir = _argv_stub(tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(tmp),
           "EXACTLY_SECRET_SETTINGS_DIR": str(secrets)}
    for _ in range(2):  # a restarted container writes the file again
        out = subprocess.run(["/bin/sh", str(CHART / "files" / "launch.sh"), "partition_leader", "--", "--node-id",
                              "x"], env=env, capture_output=True, text=True, timeout=60, check=True)
        result = json.loads(out.stdout)
        assert result["config"] == {"zookeeper.digest.password": password}
        assert result["mode"] == 0o600
        assert not any(password in a for a in result["argv"])
        assert result["argv"][:4] == ["-m", "services.partition_leader", "--node-id", "x"]


def test_launcher_refuses_a_multi_line_secret_setting(tmp_path):
    secrets = tmp_path / "secret-settings"
    secrets.mkdir()
    (secrets / "zookeeper.digest.password").write_text("one\ntwo\n")
    env = {**os.environ, "PATH": f"{_argv_stub(tmp_path)}:{os.environ['PATH']}", "TMPDIR": str(tmp_path),
           "EXACTLY_SECRET_SETTINGS_DIR": str(secrets)}
    out = subprocess.run(["/bin/sh", str(CHART / "files" / "launch.sh"), "txn_coordinator", "--"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "one line" in out.stderr


def test_secured_pod_command_line_passes_the_services_own_checks(tmp_path, pod_tls):
    """The launcher with the rendered secured settings, the pod's environment and real
    certificate files: the services' parser accepts the command line (including its
    readable-certificate checks) and sees TLS, the authorizer and the pod's certificate."""
    tls_dir, pod, fqdn = pod_tls
    objects = render({})
    etc = tmp_path / "etc"
    etc.mkdir()
    for key, text in by_kind(objects, "ConfigMap")[f"{RELEASE}-config"]["data"].items():
        (etc / key).write_text(text.replace(TLS_DIR, str(tls_dir)))
    secrets = tmp_path / "secret-settings"
    secrets.mkdir()
    (secrets / "zookeeper.digest.password").write_text("zk-pass")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(
        f"#!/bin/sh\n[ \"$1\" = -m ] || exit 3\nmodule=\"$2\"; shift 2\n"
        f"exec {sys.executable} -c '"
        "import json, sys; from services.common.config import parse_args; "
        "cfg = parse_args(sys.argv[1].split(\".\", 1)[1], sys.argv[2:]); "
        "print(json.dumps({\"node_id\": cfg.node_id, \"props\": cfg.props}))' \"$module\" \"$@\"\n")
    (bin_dir / "python").chmod(0o755)
    c = container(statefulset(objects, "partition-leader"))
    env = {"POD_NAME": pod, "POD_NAMESPACE": NAMESPACE, "POD_IP": "10.0.0.7"}
    for e in c["env"]:
        if "value" in e:
            env[e["name"]] = _kubelet_expand(e["value"], env)
    assert env["POD_FQDN"] == fqdn
    env["EXACTLY_SECRET_SETTINGS_DIR"] = str(secrets)
    argv = [_kubelet_expand(a, env).replace("/etc/exactly/", f"{etc}/").replace(TLS_DIR, str(tls_dir))
            for a in c["command"] + c["args"]]
    run_env = {**os.environ, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
    out = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    props = json.loads(out.stdout)["props"]
    assert props["security.protocol"] == "SSL" and props["authorizer"] == "acl"
    assert props["ssl.certificate.location"] == f"{tls_dir}/{pod}.crt"
    assert props["ssl.key.location"] == f"{tls_dir}/{pod}.key"
    assert f"User:{pod}" in props["super.users"].split(";")
    assert props["zookeeper.set.acl"] == "true" and props["zookeeper.digest.password"] == "zk-pass"


# ------------------------------------------------------------------------- helm test pod, NOTES
def _round_trip_module():
    spec = importlib.util.spec_from_file_location("round_trip", CHART / "files" / "round_trip.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_secured_helm_test_pod_uses_the_client_certificate_secret():
    objects = render({})
    (pod,) = [o for o in objects if o["kind"] == "Pod"]
    (c,) = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    security = _round_trip_module().security_config(env)
    assert security == {"security.protocol": "SSL", "ssl.ca.location": "/etc/exactly-client/ca.crt",
                        "ssl.certificate.location": "/etc/exactly-client/tls.crt",
                        "ssl.key.location": "/etc/exactly-client/tls.key"}
    assert mounts(c)["client-tls"] == {"name": "client-tls", "mountPath": "/etc/exactly-client", "readOnly": True}
    volume = {v["name"]: v for v in pod["spec"]["volumes"]}["client-tls"]["secret"]
    assert volume["secretName"] == f"{RELEASE}-admin-tls"
    named = render({"security": {"tls": {"clientSecret": "ops-cert"}}})
    (pod,) = [o for o in named if o["kind"] == "Pod"]
    assert {v["name"]: v for v in pod["spec"]["volumes"]}["client-tls"]["secret"]["secretName"] == "ops-cert"
    (pod,) = [o for o in render(PLAINTEXT) if o["kind"] == "Pod"]
    (c,) = pod["spec"]["containers"]
    assert _round_trip_module().security_config({e["name"]: e["value"] for e in c["env"]}) == {}
    assert "client-tls" not in {v["name"] for v in pod["spec"]["volumes"]}


def test_secured_notes_show_how_an_administrator_connects():
    text = notes({})
    assert f"secret {RELEASE}-admin-tls" in text
    assert '"security.protocol": "SSL"' in text
    assert f"User:{RELEASE}-partition-leader-0" in text and "User:admin" in text
    assert f"Secret {RELEASE}-tls" in text
    assert "cert-manager issues" in notes(CERT_MANAGER)
    assert '"security.protocol"' not in notes(PLAINTEXT)
