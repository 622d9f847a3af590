"""Isolation in the Helm chart deploy/helm/exactly: NetworkPolicies (who may reach the
service ports, ZooKeeper and /metrics), each pod's container seeing only its own private
key, ZooKeeper over TLS (secureClientPort) and quorum SASL, /metrics bound to the pod IP.

The NetworkPolicies are checked by evaluating them as Kubernetes does (a pod selected by
a policy admits only what one of its ingress rules allows) for the rendered pods and
pods of other namespaces. The ZooKeeper settings are checked against a real ZooKeeper
server (the Debian package's) started by the chart's own start script with the rendered
zoo.cfg, which the services' ZooKeeper client (services.common.cluster.state.ClusterState) joins
over TLS with the settings the chart renders for them."""
from __future__ import annotations

import functools
import json
import logging
import os
import pathlib
import shutil
import socket
import subprocess
import time

import pytest
from kazoo.client import KazooClient

from exactly_tools.ports import free_ports

from tests.deploy.test_helm_chart import (CERT_MANAGER, CHART, COMPONENTS, NAMESPACE, PLAINTEXT, RELEASE, by_kind,
                                          container, statefulset)
from tests.deploy.test_helm_chart import render as render_chart
from tests.deploy.test_helm_security import mounts, pod_names, properties, set_flags, volumes

def render(values: dict) -> list[dict]:
    """The chart's objects for `values`, rendered once per distinct values (the tests here
    only read them)."""
    return _render(json.dumps(values, sort_keys=True))


@functools.lru_cache(maxsize=None)
def _render(values: str) -> list[dict]:
    return render_chart(json.loads(values))


ZK = f"{RELEASE}-zookeeper"
ZK3 = {"zookeeper": {"replicas": 3}}
EXISTING_SECRET = {"security": {"tls": {"existingSecret": "cluster-certs"}}}


# ------------------------------------------------------------------------- NetworkPolicy evaluation
def _selects(selector: dict | None, labels: dict) -> bool:
    """A label selector (matchLabels, matchExpressions) against `labels`; {} selects all."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {"In": present and value in e.get("values", []), "NotIn": not present or value not in e.get("values", []),
              "Exists": present, "DoesNotExist": not present}[e["operator"]]
        if not ok:
            return False
    return True


def _ns_labels(namespace: str) -> dict:
    return {"kubernetes.io/metadata.name": namespace, **({"team": "streams"} if namespace == "etl" else {})}


def _peer_admits(peer: dict, policy_ns: str, src: dict) -> bool:
    if "ipBlock" in peer:
        return False  # pods are not addressed by IP blocks here
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], _ns_labels(src["namespace"])):
            return False
    elif src["namespace"] != policy_ns:
        return False
    return _selects(peer.get("podSelector", {}), src["labels"])


def _port_admits(rule: dict, port: int) -> bool:
    ports = rule.get("ports")
    return not ports or any(p.get("port") == port and p.get("protocol", "TCP") == "TCP" for p in ports)


def admitted(objects: list[dict], src: dict, dst: dict, port: int) -> bool:
    """Whether a TCP connection from pod `src` to pod `dst` on `port` is admitted by the
    rendered NetworkPolicies (pods: {"namespace", "labels"}; no policy selecting `dst`:
    admitted, Kubernetes' default)."""
    policies = [o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["namespace"] == dst["namespace"]
                and "Ingress" in o["spec"].get("policyTypes", ["Ingress"])
                and _selects(o["spec"]["podSelector"], dst["labels"])]
    if not policies:
        return True
    for policy in policies:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            if _port_admits(rule, port) and (not peers or any(_peer_admits(p, NAMESPACE, src) for p in peers)):
                return True
    return False


def pod(objects: list[dict], name: str) -> dict:
    """A pod of a rendered StatefulSet or the `helm test` pod, as {"namespace", "labels"}."""
    for o in objects:
        if o["kind"] == "StatefulSet" and o["metadata"]["name"] == name:
            return {"namespace": o["metadata"]["namespace"], "labels": o["spec"]["template"]["metadata"]["labels"]}
        if o["kind"] == "Pod" and o["metadata"]["name"] == name:
            return {"namespace": o["metadata"]["namespace"], "labels": o["metadata"]["labels"]}
    raise KeyError(name)


STRANGER = {"namespace": "default", "labels": {"app": "curl"}}
NEIGHBOUR = {"namespace": NAMESPACE, "labels": {"app": "curl"}}  # same namespace, no client label
CLIENT = {"namespace": NAMESPACE, "labels": {"app": "etl", f"{RELEASE}-client": "true"}}
FOREIGN_CLIENT = {"namespace": "etl", "labels": {"app": "etl", f"{RELEASE}-client": "true"}}
PROMETHEUS = {"namespace": "monitoring", "labels": {"app.kubernetes.io/name": "prometheus"}}
OTHER_MONITORING_POD = {"namespace": "monitoring", "labels": {"app.kubernetes.io/name": "grafana"}}
GRPC, KAFKA, LINK, METRICS, ZK_TLS_PORT, ZK_PLAIN_PORT, QUORUM, ELECTION = 9093, 9092, 9094, 9404, 2281, 2181, 2888, 3888


def test_the_default_render_has_network_policies_for_the_exactly_and_zookeeper_pods():
    objects = render({})
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert {p["metadata"]["name"] for p in policies} == {RELEASE, ZK}
    for name in [f"{RELEASE}-{c}" for c in COMPONENTS] + [ZK]:
        target = pod(objects, name)
        assert [p for p in policies if _selects(p["spec"]["podSelector"], target["labels"])], name
        assert not admitted(objects, STRANGER, target, GRPC), name  # default deny for strangers
    assert not [o for o in render({"networkPolicy": {"enabled": False}}) if o["kind"] == "NetworkPolicy"]


@pytest.mark.parametrize("values", [{}, ZK3, PLAINTEXT])
def test_zookeeper_is_reachable_from_the_exactly_services_only(values):
    objects = render(values)
    client_port = ZK_PLAIN_PORT if values is PLAINTEXT else ZK_TLS_PORT
    zk = pod(objects, ZK)
    for component in COMPONENTS:
        assert admitted(objects, pod(objects, f"{RELEASE}-{component}"), zk, client_port), component
        assert not admitted(objects, pod(objects, f"{RELEASE}-{component}"), zk, QUORUM), component
    for src in (STRANGER, NEIGHBOUR, CLIENT, FOREIGN_CLIENT, PROMETHEUS, pod(objects, f"{RELEASE}-test-round-trip")):
        for port in (client_port, ZK_PLAIN_PORT, QUORUM, ELECTION):
            assert not admitted(objects, src, zk, port), (src, port)
    # quorum and leader election among the servers
    assert admitted(objects, zk, zk, QUORUM) and admitted(objects, zk, zk, ELECTION)


def test_service_ports_admit_the_exactly_pods_and_the_configured_clients_only():
    objects = render({})
    test_pod = pod(objects, f"{RELEASE}-test-round-trip")
    for component in COMPONENTS:
        dst = pod(objects, f"{RELEASE}-{component}")
        for port in (GRPC, KAFKA, LINK):  # links: the services' tunnel and the SDKs' calls
            for peer in COMPONENTS:  # the services call each other
                assert admitted(objects, pod(objects, f"{RELEASE}-{peer}"), dst, port)
            assert admitted(objects, test_pod, dst, port)
            assert admitted(objects, CLIENT, dst, port)  # <release>-client=true in the release namespace
            for src in (STRANGER, NEIGHBOUR, FOREIGN_CLIENT, PROMETHEUS, pod(objects, ZK)):
                assert not admitted(objects, src, dst, port), (component, port, src)
        assert not admitted(objects, CLIENT, dst, METRICS)
    # clients of other namespaces by selector; the label rule turned off
    custom = render({"networkPolicy": {"clients": {"clientLabel": False, "from": [
        {"namespaceSelector": {"matchLabels": {"team": "streams"}}, "podSelector": {"matchLabels": {"app": "etl"}}}]}}})
    dst = pod(custom, f"{RELEASE}-partition-leader")
    assert admitted(custom, FOREIGN_CLIENT, dst, GRPC) and admitted(custom, FOREIGN_CLIENT, dst, KAFKA)
    assert admitted(custom, FOREIGN_CLIENT, dst, LINK) and not admitted(custom, CLIENT, dst, LINK)
    assert not admitted(custom, CLIENT, dst, GRPC)
    assert not admitted(custom, FOREIGN_CLIENT, dst, METRICS)
    assert not admitted(custom, FOREIGN_CLIENT, pod(custom, ZK), ZK_TLS_PORT)


def test_the_link_port_admits_whom_the_grpc_port_admits():
    """A link is set up with a ticket from the gRPC port (the services' tunnel, the SDKs'
    Client/Calls): whoever may reach the gRPC port may reach the link port, nobody else;
    linkPort -1 opens no port."""
    for values in ({}, {"networkPolicy": {"clients": {"from": [{"namespaceSelector": {}}]}}}):
        objects = render(values)
        for component in COMPONENTS:
            dst = pod(objects, f"{RELEASE}-{component}")
            for src in (*[pod(objects, f"{RELEASE}-{peer}") for peer in COMPONENTS], STRANGER, NEIGHBOUR, CLIENT,
                        FOREIGN_CLIENT, PROMETHEUS, pod(objects, ZK), pod(objects, f"{RELEASE}-test-round-trip")):
                assert admitted(objects, src, dst, LINK) == admitted(objects, src, dst, GRPC), (component, src)
    objects = render({"network": {"linkPort": -1}})
    dst = pod(objects, f"{RELEASE}-partition-leader")
    assert not admitted(objects, CLIENT, dst, LINK) and admitted(objects, CLIENT, dst, GRPC)


def test_metrics_admit_the_configured_scraper_only():
    objects = render({})
    for component in COMPONENTS:
        dst = pod(objects, f"{RELEASE}-{component}")
        assert admitted(objects, PROMETHEUS, dst, METRICS)
        assert not admitted(objects, PROMETHEUS, dst, GRPC) and not admitted(objects, PROMETHEUS, dst, KAFKA)
        for src in (OTHER_MONITORING_POD, STRANGER, NEIGHBOUR, CLIENT, pod(objects, f"{RELEASE}-{component}")):
            assert not admitted(objects, src, dst, METRICS), (component, src)
    scraper = {"namespace": "observability", "labels": {"app": "vmagent"}}
    custom = render({"networkPolicy": {"metrics": {"from": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
         "podSelector": {"matchLabels": {"app": "vmagent"}}}]}}})
    dst = pod(custom, f"{RELEASE}-txn-coordinator")
    assert admitted(custom, scraper, dst, METRICS) and not admitted(custom, PROMETHEUS, dst, METRICS)
    same_ns = render({"networkPolicy": {"metrics": {"from": [{"podSelector": {"matchLabels": {"app": "vmagent"}}}]}}})
    assert admitted(same_ns, {"namespace": NAMESPACE, "labels": {"app": "vmagent"}}, dst, METRICS)
    assert not admitted(same_ns, scraper, dst, METRICS)
    # no scraper configured: the metrics port admits nobody (an empty `from` would admit everyone)
    closed = render({"networkPolicy": {"metrics": {"from": []}}})
    for src in (PROMETHEUS, scraper, NEIGHBOUR, STRANGER):
        assert not admitted(closed, src, dst, METRICS)


def test_metrics_bind_the_pod_ip():
    for values in ({}, PLAINTEXT):
        objects = render(values)
        for component in COMPONENTS:
            c = container(statefulset(objects, component))
            assert set_flags(c)["metrics.bind.address"] == "$(POD_IP)", component
            env = {e["name"]: e for e in c["env"]}
            assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    off = render({"metrics": {"enabled": False}})
    assert "metrics.bind.address" not in set_flags(container(statefulset(off, "partition-leader")))


VARIANTS = {
    "zk3-cert-manager": {**ZK3, **CERT_MANAGER},
    "zk3-secret": {**ZK3, **EXISTING_SECRET},
    "peers": {"networkPolicy": {"clients": {"clientLabel": False, "from": [
        {"namespaceSelector": {"matchLabels": {"team": "streams"}}, "podSelector": {"matchLabels": {"app": "etl"}}},
        {"ipBlock": {"cidr": "10.10.0.0/16"}}]}, "metrics": {"from": [{"podSelector": {}}]}}},
    "metrics-closed": {"networkPolicy": {"metrics": {"from": []}}},
    "zk-tls-off": {**ZK3, "security": {"zookeeper": {"tls": {"enabled": False}, "quorumAuth": {"enabled": False}}}},
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_object_of_the_isolation_variants_validates_strictly(name):
    import kubernetes_validate
    from tests.deploy.test_helm_chart import CRD_GROUPS, KUBE_VERSION, strip
    objects = render(VARIANTS[name])
    assert [o for o in objects if o["kind"] == "NetworkPolicy"]
    for obj in objects:
        if not obj["apiVersion"].startswith(CRD_GROUPS):
            kubernetes_validate.validate(strip(obj), KUBE_VERSION, strict=True)


# ------------------------------------------------------------------------- each pod its own key
def _secret_keys(objects: list[dict]) -> set[str]:
    """The keys of a security.tls.existingSecret holding every pod's certificate and key."""
    pods = [f"{sts['metadata']['name']}-{i}" for sts in by_kind(objects, "StatefulSet").values()
            for i in range(sts["spec"]["replicas"])]
    return {"ca.crt"} | {f"{p}.{ext}" for p in pods for ext in ("crt", "key")}


def visible_files(objects: list[dict], sts: dict, pod_name: str, volume: str = "tls") -> dict[str, tuple[str, str]]:
    """The files pod `pod_name` of `sts` sees where its container mounts `volume`:
    {file name: (Secret, key)}, with the mount's subPath / subPathExpr applied."""
    spec = sts["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    mount = mounts(c)[volume]
    vol = {v["name"]: v for v in spec["volumes"]}[volume]
    files: dict[str, tuple[str, str]] = {}
    sources = vol["projected"]["sources"] if "projected" in vol else [{"secret": {**vol["secret"],
                                                                                   "name": vol["secret"]["secretName"]}}]
    for source in sources:
        secret = source["secret"]
        items = secret.get("items") or [{"key": k, "path": k} for k in sorted(_secret_keys(objects))]
        for item in items:
            files[item["path"]] = (secret["name"], item["key"])
    sub = mount.get("subPath") or mount.get("subPathExpr", "").replace("$(POD_NAME)", pod_name)
    if sub:
        files = {p[len(sub) + 1:]: v for p, v in files.items() if p.startswith(sub + "/")}
    return files


def _private_keys(files: dict[str, tuple[str, str]]) -> set[tuple[str, str]]:
    return {v for v in files.values() if v[1].endswith(".key")}


@pytest.mark.parametrize("values", [EXISTING_SECRET, CERT_MANAGER, {**ZK3, **EXISTING_SECRET},
                                    {**ZK3, **CERT_MANAGER}], ids=["secret", "cert-manager", "secret-zk3",
                                                                   "cert-manager-zk3"])
def test_each_pod_sees_only_its_own_private_key(values):
    objects = render(values)
    cm = "certManager" in str(values)
    checked = 0
    for sts in by_kind(objects, "StatefulSet").values():
        name = sts["metadata"]["name"]
        for i in range(sts["spec"]["replicas"]):
            pod_name = f"{name}-{i}"
            files = visible_files(objects, sts, pod_name)
            own_secret = f"{pod_name}-tls" if cm else "cluster-certs"
            own = {"ca.crt": (own_secret, "ca.crt"),
                   f"{pod_name}.crt": (own_secret, "tls.crt" if cm else f"{pod_name}.crt"),
                   f"{pod_name}.key": (own_secret, "tls.key" if cm else f"{pod_name}.key")}
            assert files == own, pod_name
            assert _private_keys(files) == {own[f"{pod_name}.key"]}, pod_name
            checked += 1
    assert checked == sum(sts["spec"]["replicas"] for sts in by_kind(objects, "StatefulSet").values())
    assert checked == 7 + (3 if "zookeeper" in values else 1)


def test_the_services_read_their_certificate_from_their_own_directory():
    objects = render(EXISTING_SECRET)
    for component in COMPONENTS:
        sts = statefulset(objects, component)
        c = container(sts)
        flags = set_flags(c)
        for pod_name in pod_names(component):
            files = visible_files(objects, sts, pod_name)
            for key in ("ssl.certificate.location", "ssl.key.location"):
                path = flags[key].replace("$(POD_NAME)", pod_name)
                assert path.startswith("/etc/exactly-tls/") and path.rsplit("/", 1)[1] in files, (pod_name, key)
        assert properties(objects)["ssl.ca.location"].rsplit("/", 1)[1] in files


# ------------------------------------------------------------------------- ZooKeeper TLS and quorum SASL
def zoo_cfg(objects: list[dict]) -> dict[str, str]:
    text = by_kind(objects, "ConfigMap")[ZK]["data"]["zoo.cfg"]
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_zookeeper_serves_clients_over_tls_only_and_the_services_connect_with_tls():
    objects = render({})
    cfg = zoo_cfg(objects)
    assert cfg["secureClientPort"] == "2281" and cfg["ssl.clientAuth"] == "need"
    assert cfg["clientPortAddress"] == "127.0.0.1"  # the plaintext port: the pod's own probes only
    assert cfg["serverCnxnFactory"] == "org.apache.zookeeper.server.NettyServerCnxnFactory"
    for svc in (ZK, f"{ZK}-headless"):
        ports = {p["name"]: p["port"] for p in by_kind(objects, "Service")[svc]["spec"]["ports"]}
        assert ports.get("client-tls") == 2281 and "client" not in ports, svc
    zk_container = container(by_kind(objects, "StatefulSet")[ZK])
    assert {p["name"] for p in zk_container["ports"]} == {"client-tls", "quorum", "election"}
    assert properties(objects)["zookeeper.ssl.client.enable"] == "true"
    for component in COMPONENTS:
        args = container(statefulset(objects, component))["args"]
        assert args[args.index("--zookeeper") + 1] == f"{ZK}.{NAMESPACE}.svc.cluster.local:2281"
    plain = render(PLAINTEXT)
    assert "secureClientPort" not in zoo_cfg(plain) and "zookeeper.ssl.client.enable" not in properties(plain)
    off = render({"security": {"zookeeper": {"tls": {"enabled": False}}}})
    assert "secureClientPort" not in zoo_cfg(off) and "zookeeper.ssl.client.enable" not in properties(off)
    assert "tls" not in volumes(by_kind(off, "StatefulSet")[ZK])
    external = render({"zookeeper": {"external": {"connect": "zk-0.corp:2281"}}})
    assert properties(external)["zookeeper.ssl.client.enable"] == "true"


def test_cert_manager_issues_zookeeper_certificates_naming_the_connect_string_host():
    objects = render({**ZK3, **CERT_MANAGER})
    certs = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "Certificate"}
    host = f"{ZK}.{NAMESPACE}.svc.cluster.local"
    for i in range(3):
        spec = certs[f"{ZK}-{i}"]
        assert spec["secretName"] == f"{ZK}-{i}-tls"
        assert host in spec["dnsNames"]
        assert spec["privateKey"]["encoding"] == "PKCS8"  # what ZooKeeper's PEM keystore reads
        assert "server auth" in spec["usages"]
    external = render({**CERT_MANAGER, "zookeeper": {"external": {"connect": "zk:2281"}}})
    assert not [o for o in external if o["kind"] == "Certificate" and o["metadata"]["name"].startswith(ZK)]


def test_quorum_sasl_with_the_password_from_a_secret_mounted_in_zookeeper_pods_only():
    objects = render(ZK3)
    cfg = zoo_cfg(objects)
    for key in ("quorum.auth.enableSasl", "quorum.auth.learnerRequireSasl", "quorum.auth.serverRequireSasl"):
        assert cfg[key] == "true", key
    assert cfg["quorum.auth.learner.saslLoginContext"] == "QuorumLearner"
    assert cfg["quorum.auth.server.saslLoginContext"] == "QuorumServer"
    zk = by_kind(objects, "StatefulSet")[ZK]
    assert volumes(zk)["quorum-secret"]["secret"]["secretName"] == f"{ZK}-quorum"
    env = {e["name"]: e.get("value") for e in container(zk)["env"]}
    assert env["ZK_QUORUM_PASSWORD_FILE"] == "/etc/zookeeper-quorum/password"
    assert mounts(container(zk))["quorum-secret"]["mountPath"] == "/etc/zookeeper-quorum"
    for component in COMPONENTS:
        assert "quorum-secret" not in volumes(statefulset(objects, component))
    assert "quorum.auth.enableSasl" not in zoo_cfg(render({}))  # a standalone server has no quorum
    assert "quorum.auth.enableSasl" not in zoo_cfg(render({**ZK3, **PLAINTEXT}))
    named = render({**ZK3, "security": {"zookeeper": {"quorumAuth": {"existingSecret": "zkq", "passwordKey": "pw"}}}})
    secret = volumes(by_kind(named, "StatefulSet")[ZK])["quorum-secret"]["secret"]
    assert secret["secretName"] == "zkq" and secret["items"] == [{"key": "pw", "path": "password"}]


# ------------------------------------------------------------------------- a real ZooKeeper
ZOOKEEPER_JAR = pathlib.Path("/usr/share/java/zookeeper.jar")
needs_zookeeper = pytest.mark.skipif(not ZOOKEEPER_JAR.exists() or shutil.which("java") is None,
                                     reason="needs the zookeeper package and java (scripts/setup.sh)")


def _srvr(port: int) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"srvr")
            s.settimeout(1)
            return s.recv(4096).decode(errors="replace")
    except OSError:
        return ""


def _wait(predicate, timeout_s: float, what: str, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


class LocalZooKeeper:
    """One ZooKeeper server started the way the chart starts it: files/zookeeper-start.sh
    with the rendered zoo.cfg, the paths of the pod mapped to a local directory."""

    def __init__(self, objects: list[dict], work: pathlib.Path, pod_name: str, tls_dir: pathlib.Path | None,
                 quorum_password: str | None = None, servers: dict[int, tuple[int, int]] | None = None,
                 client_ports: tuple[int, int] | None = None):
        from exactly_tools.devcluster import ZOOKEEPER_CLASSPATH
        self.dir = work / pod_name
        (self.dir / "data").mkdir(parents=True)
        self.secrets = self.dir / "secrets"
        self.client_port, self.secure_port = client_ports or free_ports(2)
        text = by_kind(objects, "ConfigMap")[ZK]["data"]["zoo.cfg"]
        lines = []
        for line in text.splitlines():
            key = line.split("=", 1)[0]
            if key.startswith("server.") and servers:
                quorum, election = servers[int(key.split(".")[1])]
                line = f"{key}=127.0.0.1:{quorum}:{election}"
            line = {"dataDir": f"dataDir={self.dir / 'data'}", "clientPort": f"clientPort={self.client_port}",
                    "secureClientPort": f"secureClientPort={self.secure_port}", "tickTime": "tickTime=500",
                    "initLimit": "initLimit=20", "syncLimit": "syncLimit=10"}.get(key, line)
            lines.append(line.replace("/tmp/zookeeper-secrets", str(self.secrets))
                         .replace("/etc/zookeeper-tls", str(tls_dir)))
        (self.dir / "zoo.cfg").write_text("\n".join(lines) + "\n")
        env = {**os.environ, "POD_NAME": pod_name, "ZK_SECRETS_DIR": str(self.secrets), "JVMFLAGS": "-Xmx128m",
               "ZK_CLASSPATH": ":".join(p for p in ZOOKEEPER_CLASSPATH if os.path.exists(p))}
        if tls_dir is not None:
            env["ZK_TLS_DIR"] = str(tls_dir)
        if quorum_password is not None:
            (self.dir / "quorum-password").write_text(quorum_password + "\n")
            env.update(ZK_QUORUM_PASSWORD_FILE=str(self.dir / "quorum-password"), ZK_QUORUM_USER="zkquorum")
        # The image's zkServer.sh runs java with $JVMFLAGS, which the start script extends.
        command = ["bash", str(CHART / "files" / "zookeeper-start.sh"), "sh", "-c",
                   f"echo $ZOO_MY_ID > {self.dir / 'data' / 'myid'} && exec java $JVMFLAGS "
                   "-Dzookeeper.admin.enableServer=false -cp \"$ZK_CLASSPATH\" "
                   f"org.apache.zookeeper.server.quorum.QuorumPeerMain {self.dir / 'zoo.cfg'}"]
        self.log = self.dir / "zookeeper.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def serving(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"ZooKeeper exited with {self.proc.returncode}: {self.log.read_text()[-3000:]}")
        return "Mode:" in _srvr(self.client_port)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """The cluster's CA; a ZooKeeper server's and a partition leader's certificate laid out
    as the pods see them (ca.crt, <pod>.crt, <pod>.key in the pod's own directory); and a
    certificate of another CA."""
    from exactly_tools.certs import CertificateAuthority
    work = tmp_path_factory.mktemp("zk-pki")
    ca = CertificateAuthority.create(work / "ca")
    dirs = {}
    for name, hosts in ((f"{ZK}-0", ["localhost"]), (f"{ZK}-1", ["localhost"]),
                        (f"{RELEASE}-partition-leader-0", [])):
        issued = ca.issue(name, hosts=hosts)
        d = work / "pods" / name
        d.mkdir(parents=True)
        (d / "ca.crt").write_bytes(ca.ca_path.read_bytes())
        (d / f"{name}.crt").write_bytes(issued.certificate.read_bytes())
        (d / f"{name}.key").write_bytes(issued.key.read_bytes())
        dirs[name] = d
    rogue = CertificateAuthority.create(work / "rogue").issue(f"{RELEASE}-partition-leader-0")
    return dirs, rogue


@pytest.fixture(scope="module")
def tls_zookeeper(pki, tmp_path_factory):
    dirs, _ = pki
    server = LocalZooKeeper(render({}), tmp_path_factory.mktemp("zk-tls"), f"{ZK}-0", dirs[f"{ZK}-0"])
    try:
        _wait(server.serving, 60, "ZooKeeper to serve")
        yield server
    finally:
        server.stop()


def _service_props(objects: list[dict], pod_dir: pathlib.Path, pod_name: str) -> dict[str, str]:
    """The ZooKeeper and TLS settings the chart gives pod `pod_name`, its files in `pod_dir`."""
    props = {k: v.replace("/etc/exactly-tls", str(pod_dir)) for k, v in properties(objects).items()
             if k.startswith(("zookeeper.ssl.", "ssl.", "security."))}
    flags = set_flags(container(statefulset(objects, "partition-leader")))
    for key in ("ssl.certificate.location", "ssl.key.location"):
        props[key] = flags[key].replace("$(POD_NAME)", pod_name).replace("/etc/exactly-tls", str(pod_dir))
    return props


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _connects(timeout_s: float = 3.0, **kwargs) -> tuple[bool, str]:
    """Whether a kazoo client opens a session with `kwargs`; and kazoo's log of the try."""
    records, logger = _Records(), logging.getLogger("kazoo")
    logger.addHandler(records)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    zk = KazooClient(connection_retry={"max_tries": 1, "deadline": timeout_s}, **kwargs)
    try:
        zk.start(timeout=timeout_s)
        zk.get_children("/")
        return True, ""
    except Exception:  # noqa: BLE001 - any failure to open a session counts as refused
        return False, "\n".join(records.messages)
    finally:
        zk.stop()
        zk.close()
        logger.removeHandler(records)
        logger.setLevel(level)


@needs_zookeeper
def test_the_services_join_the_charts_tls_zookeeper_and_others_are_refused(tls_zookeeper, pki):
    from services.common.cluster.state import ClusterState
    dirs, rogue = pki
    objects = render({})
    pod_name = f"{RELEASE}-partition-leader-0"
    props = _service_props(objects, dirs[pod_name], pod_name)
    assert props["zookeeper.ssl.client.enable"] == "true"
    hosts = f"localhost:{tls_zookeeper.secure_port}"
    cluster = ClusterState(hosts, pod_name, "partition_leader", "localhost", 9093, props=props)
    try:
        cluster.start(timeout_s=15)  # over TLS, the pod's certificate presented
        assert cluster.zk.exists("/exactly/services") is not None
        cluster.register()
        assert cluster.zk.exists(f"/exactly/services/{pod_name}") is not None
    finally:
        cluster.zk.stop()
        cluster.zk.close()
    ca = str(dirs[pod_name] / "ca.crt")
    own = {"certfile": props["ssl.certificate.location"], "keyfile": props["ssl.key.location"]}
    assert _connects(hosts=hosts, use_ssl=True, ca=ca, check_hostname=True, **own) == (True, "")
    # no TLS: no session on the secure port
    assert not _connects(hosts=f"127.0.0.1:{tls_zookeeper.secure_port}")[0]
    # no client certificate, a certificate of another CA: the server ends the handshake (an alert)
    for cert in ({}, {"certfile": str(rogue.certificate), "keyfile": str(rogue.key)}):
        connected, log = _connects(hosts=hosts, use_ssl=True, ca=ca, **cert)
        assert not connected and "alert" in log.lower(), log
    # the server's certificate must name the host connected to (127.0.0.1 is not in it)
    connected, log = _connects(hosts=f"127.0.0.1:{tls_zookeeper.secure_port}", use_ssl=True, ca=ca,
                               check_hostname=True, **own)
    assert not connected and "CERTIFICATE_VERIFY_FAILED" in log, log


@needs_zookeeper
def test_zookeepers_plaintext_port_listens_on_loopback_only(tls_zookeeper):
    assert "Mode:" in _srvr(tls_zookeeper.client_port)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: picks the outgoing interface
            address = probe.getsockname()[0]
        except OSError:
            address = "127.0.0.1"
    if address.startswith("127."):
        pytest.skip("this host has no address besides loopback")
    outside = [address]
    with pytest.raises(OSError):
        socket.create_connection((outside[0], tls_zookeeper.client_port), timeout=2).close()
    socket.create_connection((outside[0], tls_zookeeper.secure_port), timeout=2).close()  # TLS port: everywhere


@needs_zookeeper
def test_a_service_with_unreadable_zookeeper_tls_files_is_refused_before_starting(pki, tmp_path):
    from exactly_wire.config import ConfigurationError
    from services.common.security.zk_tls import ZkTls
    dirs, rogue = pki
    pod_name = f"{RELEASE}-partition-leader-0"
    props = _service_props(render({}), dirs[pod_name], pod_name)
    assert ZkTls.from_props(props).kazoo_kwargs()["use_ssl"] is True
    with pytest.raises(ConfigurationError, match="zookeeper.ssl.truststore.location"):
        ZkTls.from_props({**props, "zookeeper.ssl.truststore.location": str(tmp_path / "missing.crt")})
    with pytest.raises(ConfigurationError, match="ssl.certificate.location"):
        ZkTls.from_props({**props, "ssl.key.location": str(rogue.key)})  # a key of another certificate
    keystore = tmp_path / "keystore.pem"
    keystore.write_bytes(rogue.key.read_bytes() + rogue.certificate.read_bytes())
    kwargs = ZkTls.from_props({**props, "zookeeper.ssl.keystore.location": str(keystore)}).kazoo_kwargs()
    assert kwargs["certfile"] == kwargs["keyfile"] == str(keystore)


@needs_zookeeper
def test_quorum_sasl_forms_an_ensemble_with_the_password_and_refuses_a_server_without_it(pki, tmp_path):
    """Two servers of the chart's ensemble config (quorum.auth.*, the JAAS file written by
    the start script): the same password forms a quorum; a server with another password
    is refused by the leader's SASL check and no quorum forms."""
    dirs, _ = pki
    objects = render({"zookeeper": {"replicas": 2}})
    assert zoo_cfg(objects)["quorum.auth.serverRequireSasl"] == "true"

    picked = free_ports(16)  # every port of both ensembles, distinct

    def ensemble(work: pathlib.Path, second_password: str) -> list[LocalZooKeeper]:
        p = [picked.pop() for _ in range(8)]
        ports = {1: (p[0], p[1]), 2: (p[2], p[3])}
        return [LocalZooKeeper(objects, work, f"{ZK}-0", dirs[f"{ZK}-0"], "quorum-secret", ports, (p[4], p[5])),
                LocalZooKeeper(objects, work, f"{ZK}-1", dirs[f"{ZK}-1"], second_password, ports, (p[6], p[7]))]

    # both ensembles start together (separate ports and directories)
    servers, refused = ensemble(tmp_path / "good", "quorum-secret"), ensemble(tmp_path / "bad", "wrong-password")
    try:
        _wait(lambda: all(s.serving() for s in servers), 90, "the quorum to form")
        modes = sorted(line for s in servers for line in _srvr(s.client_port).splitlines() if line.startswith("Mode:"))
        assert modes == ["Mode: follower", "Mode: leader"]
        for s in servers:
            jaas = (s.secrets / "jaas.conf")
            assert jaas.stat().st_mode & 0o777 == 0o600
            log = s.log_text()
            assert "quorum.auth.serverRequireSasl set to true" in log
            assert "Failed to authenticate using SASL" not in log and "quorum-secret" not in log
        _wait(lambda: any("Failed to authenticate using SASL" in s.log_text() for s in refused), 90,
              "a refused quorum SASL authentication in a server's log")
        assert not any(s.serving() for s in refused)
    finally:
        for s in servers + refused:
            s.stop()
