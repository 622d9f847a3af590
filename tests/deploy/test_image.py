"""The services' image (deploy/docker/Dockerfile), built on this machine with podman by
scripts/build_image.sh as `make image` builds it, and run as the Helm chart runs it.

The chart is rendered offline (plaintext, an external ZooKeeper: the test session's real
server, in a chroot of its own); each pod of its StatefulSets becomes a container of the
image on the host's network, started with the pod's own command (files/launch.sh with the
rendered properties), arguments, environment, mounts and security context (read-only root,
user 10001, no capabilities), only its ports made distinct (the pods share one network here)
and its DNS name replaced by 127.0.0.1. The chart's `helm test` pod then runs its round-trip
script (files/round_trip.py) from the same image against them. The image's tag and label,
`exactly --version` inside it, every service's start-up log line and its /metrics
exactly_build_info name pyproject.toml's release; every service stops cleanly on SIGTERM.

A first build on a machine makes the Debian base with debootstrap and installs the
dependencies (minutes); later builds reuse podman's layers (seconds; test_release.py covers
the release everywhere else)."""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
import time
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from clusters import new_chroot
from exactly_tools.devcluster import wait_serving
from exactly_tools.ports import free_ports
from waiting import wait_for

from tests.deploy.test_helm_chart import COMPONENTS, NAMESPACE, RELEASE, by_kind
from tests.deploy.test_helm_chart import render as render_chart
from tests.deploy.test_release import release

REPO = pathlib.Path(__file__).resolve().parents[2]
PODMAN = ["bash", str(REPO / "scripts" / "podman.sh")]
BUILD_TIMEOUT_S = 1800  # a first build: debootstrap and every dependency from the package index
HOST = "127.0.0.1"       # the pods' address: host networking, loopback only

pytestmark = [pytest.mark.integration, pytest.mark.timeout(BUILD_TIMEOUT_S + 900)]


def podman(*args: str, timeout_s: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout_s)
    if check:
        assert out.returncode == 0, f"podman {' '.join(args[:3])} ...: {out.stderr[-3000:]}"
    return out


@dataclasses.dataclass(frozen=True)
class Image:
    id: str
    tag: str


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Image:
    """The image `make image` builds (scripts/build_image.sh), by id: another checkout may
    tag another build of the same release meanwhile."""
    id_file = tmp_path_factory.mktemp("image") / "id"
    started = time.monotonic()
    out = subprocess.run(["bash", str(REPO / "scripts" / "build_image.sh")], cwd=REPO,
                         env={**os.environ, "IMAGE_ID_FILE": str(id_file)},
                         capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-5000:]
    print(f"image built in {time.monotonic() - started:.0f} s: {out.stderr.strip().splitlines()[-1]}")
    return Image(id_file.read_text().strip().removeprefix("sha256:"), out.stdout.strip().splitlines()[-1])


def test_the_image_is_tagged_and_labelled_with_the_release(image):
    assert image.tag == f"exactly:{release()}"
    inspected = podman("image", "inspect", "--format", '{{ index .Labels "org.opencontainers.image.version" }}',
                       image.id)
    assert inspected.stdout.strip() == release()
    # The tag names this build (podman stores it under localhost/).
    tagged = podman("image", "inspect", "--format", "{{ .Id }}", f"localhost/{image.tag}")
    assert tagged.stdout.strip() == image.id
    version = podman("run", "--rm", "--network", "host", image.id, "exactly", "--version")
    assert version.stdout.strip() == f"exactly, version {release()}"


@dataclasses.dataclass
class Pod:
    """One pod of a rendered StatefulSet, run as a container on the host's network."""
    name: str
    role: str
    port: int
    kafka_port: int
    metrics_port: int
    link_port: int

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) references in a command argument or an env value."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), value)


def pod_environment(container: dict, pod: Pod) -> dict[str, str]:
    """The container's environment as the kubelet makes it: the downward API fields of
    this pod, values with their references expanded in order; POD_FQDN is 127.0.0.1, the
    address the services bind and advertise here (no cluster DNS)."""
    fields = {"metadata.name": pod.name, "metadata.namespace": NAMESPACE, "status.podIP": HOST}
    env: dict[str, str] = {}
    for var in container["env"]:
        if "valueFrom" in var:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[var["name"]] = expand(var["value"], env)
    env["POD_FQDN"] = HOST
    env["EXACTLY_WAIT_FOR_HOST"] = HOST
    return env


def security_options(context: dict) -> list[str]:
    """podman run options of a Kubernetes container securityContext (the chart's)."""
    assert context["readOnlyRootFilesystem"] and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    return ["--read-only", "--user", f"{context['runAsUser']}:{context['runAsGroup']}",
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]


class _Exited(Exception):
    """A pod's container exited before it served; `log` is its output."""

    def __init__(self, log: str):
        super().__init__(log[-200:])
        self.log = log


def with_ports(args: list[str], pod: Pod) -> list[str]:
    """The rendered arguments with this pod's --port, --kafka-port and --link-port."""
    out = list(args)
    for flag, port in (("--port", pod.port), ("--kafka-port", pod.kafka_port), ("--link-port", pod.link_port)):
        out[out.index(flag) + 1] = str(port)
    return out


def write_files(directory: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    """`files` ({name: text}) in `directory`, readable by the image's user."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    for name, text in files.items():
        (directory / name).write_text(text)
        (directory / name).chmod(0o644)
    return directory


def running(name: str) -> bool:
    out = podman("container", "inspect", "--format", "{{ .State.Running }}", name, check=False)
    return out.stdout.strip() == "true"


def logs(name: str) -> str:
    out = podman("logs", name, check=False)
    return out.stdout + out.stderr


def build_info(pod: Pod) -> dict[str, str]:
    """The labels of the pod's exactly_build_info sample (its value must be 1)."""
    with urllib.request.urlopen(f"http://{HOST}:{pod.metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    samples = [s for family in text_string_to_metric_families(text) if family.name == "exactly_build_info"
               for s in family.samples]
    assert len(samples) == 1 and samples[0].value == 1, samples
    return samples[0].labels


def test_the_services_run_from_the_image_as_the_chart_runs_them_and_pass_the_round_trip(image, zk, tmp_path):
    run = uuid.uuid4().hex[:8]
    connect, _, chroot = new_chroot(zk, "image").partition("/")
    objects = render_chart({"security": {"enabled": False}, "network": {"bindAllInterfaces": False},
                            "zookeeper": {"external": {"connect": connect}, "chroot": "/" + chroot},
                            "dashboards": {"enabled": False}, "tests": {"records": 30, "timeoutSeconds": 120}})
    configmaps = by_kind(objects, "ConfigMap")
    config_dir = write_files(tmp_path / "config", configmaps[f"{RELEASE}-config"]["data"])
    test_dir = write_files(tmp_path / "test", configmaps[f"{RELEASE}-test-round-trip"]["data"])

    pods: list[Pod] = []
    started: list[str] = []
    containers: list[dict] = []  # per pod: its StatefulSet's container

    def launch(container: dict, pod: Pod) -> str:
        """Start `pod` as `container` runs it, on the pod's ports; its container's name."""
        env = pod_environment(container, pod)
        data = tmp_path / "data" / pod.name
        data.mkdir(parents=True, exist_ok=True)
        os.chown(data, 10001, 10001)
        # The pods share the host's network here: each its own metrics port, in a
        # properties file after the chart's (a later file's key wins, launch.sh).
        own = write_files(tmp_path / "pods" / pod.name, {"ports.properties": f"metrics.port={pod.metrics_port}\n"})
        name = f"exactly-test-{run}-{pod.name}-{pod.port}"
        env_options = [opt for key, value in env.items() for opt in ("--env", f"{key}={value}")]
        started.append(name)
        podman("run", "--detach", "--name", name, "--label", f"exactly-test={run}", "--network", "host",
               "--timeout", str(BUILD_TIMEOUT_S), *security_options(container["securityContext"]),
               "--volume", f"{config_dir}:/etc/exactly:ro", "--volume", f"{own}:/etc/exactly-pod:ro",
               "--volume", f"{data}:/var/lib/exactly", *env_options, image.id,
               *container["command"][:-1], "/etc/exactly-pod/ports.properties", "--",
               *(expand(arg, env) for arg in with_ports(container["args"], pod)))
        return name

    try:
        names: list[str] = []
        for component, role in COMPONENTS.items():
            sts = by_kind(objects, "StatefulSet")[f"{RELEASE}-{component}"]
            container = sts["spec"]["template"]["spec"]["containers"][0]
            # The chart's pods run the release's image, the tag `make image` gave this build.
            assert container["image"] == image.tag
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            assert mounts == {"config": "/etc/exactly", "tmp": "/tmp", "data": "/var/lib/exactly"}, mounts
            command = list(container["command"])
            assert command[:3] == ["/bin/sh", "/etc/exactly/launch.sh", role] and command[-1] == "--", command
            for i in range(sts["spec"]["replicas"]):
                pod = Pod(f"{RELEASE}-{component}-{i}", role, *free_ports(4))
                pods.append(pod)
                containers.append(container)
                names.append(launch(container, pod))

        for k in range(len(pods)):
            for attempt in range(3):
                pod, name = pods[k], names[k]

                def serving(pod=pod, name=name) -> bool:
                    if wait_serving(pod.address, 1.0):
                        return True
                    if running(name):
                        return False
                    raise _Exited(logs(name))
                try:
                    wait_for(serving, 180, f"{pod.name} to serve on {pod.address}")
                    break
                except _Exited as exited:
                    # A port picked free was taken before the container bound it (ports are
                    # picked in this process and bound in another): the pod again, on new ports.
                    assert "Address already in use" in exited.log and attempt < 2, \
                        f"{pod.name} exited:\n{exited.log[-4000:]}"
                    podman("rm", "--force", "--time", "5", name, check=False)
                    pods[k] = dataclasses.replace(pod, **dict(zip(("port", "kafka_port", "metrics_port", "link_port"),
                                                                  free_ports(4))))
                    names[k] = launch(containers[k], pods[k])

        # The chart's test pod, its command and environment, against the partition leaders.
        test_pod = by_kind(objects, "Pod")[f"{RELEASE}-test-round-trip"]
        tester = test_pod["spec"]["containers"][0]
        assert {m["mountPath"] for m in tester["volumeMounts"]} == {"/opt/exactly-test", "/tmp"}
        env = {var["name"]: var["value"] for var in tester["env"]}
        env["EXACTLY_BOOTSTRAP_SERVERS"] = ",".join(p.address for p in pods if p.role == "partition_leader")
        out = podman("run", "--rm", "--name", f"exactly-test-{run}-round-trip", "--label", f"exactly-test={run}",
                     "--network", "host", *security_options(tester["securityContext"]),
                     "--volume", f"{test_dir}:/opt/exactly-test:ro",
                     *(opt for key, value in env.items() for opt in ("--env", f"{key}={value}")),
                     image.id, *tester["command"], timeout_s=int(env["EXACTLY_TEST_TIMEOUT_S"]) + 120, check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "OK: transactional round trip" in out.stdout
        assert "read 30 committed records back, none aborted, no duplicates" in out.stdout

        python = podman("run", "--rm", "--network", "host", image.id, "python", "-c",
                        "import platform; print(platform.python_version())").stdout.strip()
        for pod, name in zip(pods, names):
            assert build_info(pod) == {"version": release(), "python_version": python}
            text = logs(name)
            assert f"{pod.role} {pod.name} starting: Exactly {release()} (exactly-log), Python {python}" in text
            assert f"{pod.role} {pod.name} (Exactly {release()}) serving on {pod.address}" in text

        # Kubernetes stops a pod with SIGTERM: each service ends cleanly, as PID 1 of its container.
        for pod, name in zip(pods, names):
            podman("stop", "--time", "30", name, timeout_s=60)
            code = podman("container", "inspect", "--format", "{{ .State.ExitCode }}", name).stdout.strip()
            assert code == "0", f"{pod.name} exited with {code} on SIGTERM:\n{logs(name)[-4000:]}"
            assert f"{pod.role} {pod.name} stopping" in logs(name)
    finally:
        for name in started:
            podman("rm", "--force", "--time", "5", name, check=False)
