"""`exactly-k8s`: operations on an Exactly release installed with the Helm chart
(deploy/helm/exactly), through the Kubernetes API (the `kubernetes` package).

    exactly-k8s pods --namespace NS --release R
        The pods of the release's StatefulSets with their identity: node id (the pod
        name), advertised address (the pod's DNS name through its headless Service and
        the gRPC port, what the service registers in ZooKeeper), pod IP, readiness.

    exactly-k8s rolling-restart --namespace NS --release R [--components C,C]
                                [--address pod-ip|dns] [--timeout SECONDS] [--dry-run]
        Restarts the pods one at a time: transaction coordinators, then group
        coordinators, then partition leaders (or the --components given, in that order);
        within a StatefulSet from the highest ordinal down, as a StatefulSet rolling
        update does. Before each restart and after the last, it waits until every pod of
        the release is Ready and answers grpc.health.v1 SERVING on its gRPC port (at the
        pod IP, or the pod DNS name with --address dns: run it inside the cluster, e.g. as
        a Job, or with --address none to rely on the Ready condition alone). A pod is
        restarted by deleting it; its StatefulSet creates it again with the same name and
        volumes, and the process recovers its log and producer state.

Connects with the in-cluster service account when run in a pod, else with the current
kubeconfig context (`--context` to pick another). Needs get/list on pods and
statefulsets and delete on pods in the namespace.

The planning and readiness rules are pure functions over the Kubernetes API objects
(`plan_rolling_restart`, `pod_is_ready`, `pod_identity`, `not_ready`); `RollingRestart`
drives them through an API client.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

log = logging.getLogger("exactly-k8s")

# Restart order: coordinators first (their state is in the log, they reload quickly),
# partition leaders last.
COMPONENT_ORDER = ("txn-coordinator", "group-coordinator", "partition-leader")
COMPONENT_LABEL = "app.kubernetes.io/component"
DEFAULT_GRPC_PORT = 9093


def release_selector(release: str, name: str = "exactly") -> str:
    """Label selector of the release's Exactly pods and StatefulSets (the chart's
    exactly.selectorLabels; ZooKeeper carries another app.kubernetes.io/name)."""
    return f"app.kubernetes.io/name={name},app.kubernetes.io/instance={release}"


# ------------------------------------------------------------------ pure rules

@dataclass(frozen=True)
class RestartStep:
    """One pod to restart: its StatefulSet, component and ordinal."""

    statefulset: str
    component: str
    pod: str
    ordinal: int


@dataclass(frozen=True)
class PodIdentity:
    """node_id: the pod name (the chart passes it as --node-id); advertised:
    "<pod>.<headless service>.<namespace>.svc.<cluster domain>:<gRPC port>"."""

    node_id: str
    component: str
    advertised: str
    pod_ip: str
    ready: bool


def _component(obj: Any) -> str:
    return (obj.metadata.labels or {}).get(COMPONENT_LABEL, "")


def pod_ordinal(pod_name: str, statefulset: str) -> int | None:
    """Ordinal of a StatefulSet pod ("exactly-partition-leader-2" -> 2), or None when
    the pod does not belong to `statefulset`."""
    prefix = statefulset + "-"
    if not pod_name.startswith(prefix) or not pod_name[len(prefix):].isdigit():
        return None
    return int(pod_name[len(prefix):])


def plan_rolling_restart(statefulsets: Iterable[Any], components: Sequence[str] | None = None
                         ) -> list[RestartStep]:
    """The pods to restart, in order: by component (COMPONENT_ORDER, or the order of
    `components`), then by StatefulSet name, then from the highest ordinal down.
    StatefulSets of other components are left out; replicas 0 plans nothing."""
    order = list(components) if components else list(COMPONENT_ORDER)
    rank = {c: i for i, c in enumerate(order)}
    steps = []
    for sts in statefulsets:
        component = _component(sts)
        if component not in rank:
            continue
        for ordinal in range(int(sts.spec.replicas or 0)):
            steps.append(RestartStep(sts.metadata.name, component, f"{sts.metadata.name}-{ordinal}", ordinal))
    return sorted(steps, key=lambda s: (rank[s.component], s.statefulset, -s.ordinal))


def pod_is_ready(pod: Any) -> bool:
    """Ready condition True and not being deleted."""
    if pod is None or pod.metadata.deletion_timestamp is not None:
        return False
    for cond in (pod.status.conditions or []) if pod.status else []:
        if cond.type == "Ready":
            return cond.status == "True"
    return False


def grpc_port(statefulset: Any) -> int:
    """The container port named "grpc" of the StatefulSet's pods (9093 if none)."""
    for container in statefulset.spec.template.spec.containers or []:
        for port in container.ports or []:
            if port.name == "grpc":
                return int(port.container_port)
    return DEFAULT_GRPC_PORT


def pod_identity(pod: Any, statefulset: Any, namespace: str, cluster_domain: str = "cluster.local"
                 ) -> PodIdentity:
    """Identity of a pod of an Exactly StatefulSet (see PodIdentity)."""
    name = pod.metadata.name
    fqdn = f"{name}.{statefulset.spec.service_name}.{namespace}.svc.{cluster_domain}"
    return PodIdentity(name, _component(statefulset), f"{fqdn}:{grpc_port(statefulset)}",
                       (pod.status.pod_ip if pod.status else None) or "", pod_is_ready(pod))


def not_ready(statefulsets: Iterable[Any], pods: Iterable[Any]) -> list[str]:
    """Names of the pods the StatefulSets should have (ordinals below replicas) that
    are missing or not Ready, sorted."""
    by_name = {p.metadata.name: p for p in pods}
    missing = []
    for sts in statefulsets:
        for ordinal in range(int(sts.spec.replicas or 0)):
            name = f"{sts.metadata.name}-{ordinal}"
            if not pod_is_ready(by_name.get(name)):
                missing.append(name)
    return sorted(missing)


# ------------------------------------------------------------------ API-driven steps

def grpc_serving(address: str, timeout_s: float = 3.0) -> bool:
    """True when grpc.health.v1 Check("") at `address` answers SERVING."""
    with grpc.insecure_channel(address) as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                             timeout=timeout_s)
        except grpc.RpcError:
            return False
    return resp.status == health_pb2.HealthCheckResponse.SERVING


class RestartError(RuntimeError):
    """The release did not become ready in time, or the plan cannot run."""


class RollingRestart:
    """Runs `plan_rolling_restart` against the API.

    core: kubernetes.client.CoreV1Api-like (list_namespaced_pod, delete_namespaced_pod);
    apps: AppsV1Api-like (list_namespaced_stateful_set); address: "pod-ip", "dns" or
    "none" (where to send the gRPC health check); serving(address) -> bool; timeout_s:
    bound of each wait for the release to be ready; poll_s: polling period.
    """

    def __init__(self, core: Any, apps: Any, namespace: str, release: str, *, name_label: str = "exactly",
                 components: Sequence[str] | None = None, address: str = "pod-ip",
                 cluster_domain: str = "cluster.local", timeout_s: float = 600.0, poll_s: float = 2.0,
                 serving: Callable[[str], bool] = grpc_serving,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        if address not in ("pod-ip", "dns", "none"):
            raise ValueError(f"address must be pod-ip, dns or none, not {address!r}")
        self.core, self.apps = core, apps
        self.namespace, self.release = namespace, release
        self.selector = release_selector(release, name_label)
        self.components = components
        self.address = address
        self.cluster_domain = cluster_domain
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self.serving, self.clock, self.sleep = serving, clock, sleep

    def statefulsets(self) -> list[Any]:
        return list(self.apps.list_namespaced_stateful_set(self.namespace, label_selector=self.selector).items)

    def pods(self) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=self.selector).items)

    def identities(self) -> list[PodIdentity]:
        """Identity of every pod of the release's StatefulSets, by name."""
        out = []
        sets = self.statefulsets()
        for pod in self.pods():
            for sts in sets:
                if pod_ordinal(pod.metadata.name, sts.metadata.name) is not None:
                    out.append(pod_identity(pod, sts, self.namespace, self.cluster_domain))
                    break
        return sorted(out, key=lambda i: i.node_id)

    def plan(self) -> list[RestartStep]:
        return plan_rolling_restart(self.statefulsets(), self.components)

    def unhealthy(self) -> list[str]:
        """Pods of the release that are missing, not Ready, or (address != none) do
        not answer SERVING."""
        sets, pods = self.statefulsets(), self.pods()
        bad = not_ready(sets, pods)
        if self.address == "none":
            return bad
        by_name = {p.metadata.name: p for p in pods}
        for sts in sets:
            port = grpc_port(sts)
            for ordinal in range(int(sts.spec.replicas or 0)):
                name = f"{sts.metadata.name}-{ordinal}"
                if name in bad:
                    continue
                pod = by_name[name]
                if self.address == "pod-ip":
                    target = f"{pod.status.pod_ip}:{port}"
                else:
                    target = pod_identity(pod, sts, self.namespace, self.cluster_domain).advertised
                if not self.serving(target):
                    bad.append(name)
        return sorted(bad)

    def wait_healthy(self, why: str) -> None:
        deadline = self.clock() + self.timeout_s
        while True:
            bad = self.unhealthy()
            if not bad:
                return
            if self.clock() >= deadline:
                raise RestartError(f"{why}: not ready after {self.timeout_s:.0f} s: {', '.join(bad)}")
            log.info("%s: waiting for %s", why, ", ".join(bad))
            self.sleep(self.poll_s)

    def _uid(self, pod_name: str) -> str | None:
        for pod in self.pods():
            if pod.metadata.name == pod_name:
                return pod.metadata.uid
        return None

    def restart(self, step: RestartStep) -> None:
        """Delete the pod, wait until its replacement (another UID) exists, then until
        the whole release is healthy again."""
        old_uid = self._uid(step.pod)
        log.info("restarting %s (%s, ordinal %d)", step.pod, step.component, step.ordinal)
        self.core.delete_namespaced_pod(step.pod, self.namespace)
        deadline = self.clock() + self.timeout_s
        while self._uid(step.pod) in (old_uid, None):
            if self.clock() >= deadline:
                raise RestartError(f"{step.pod} was not recreated within {self.timeout_s:.0f} s")
            self.sleep(self.poll_s)
        self.wait_healthy(f"after restarting {step.pod}")

    def run(self, dry_run: bool = False) -> list[RestartStep]:
        """Restart every planned pod in order (nothing with dry_run); returns the plan."""
        steps = self.plan()
        if not steps:
            raise RestartError(f"no Exactly StatefulSets match {self.selector} in namespace {self.namespace}")
        if dry_run:
            return steps
        self.wait_healthy("before the restart")
        for step in steps:
            self.restart(step)
        return steps


# ------------------------------------------------------------------ command line

def connect(context: str | None = None) -> tuple[Any, Any]:
    """(CoreV1Api, AppsV1Api) from the in-cluster service account, else kubeconfig."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config(context=context)
        except config.ConfigException as exc:
            raise RestartError(f"no Kubernetes API configuration (in-cluster or kubeconfig): {exc}") from None
    return client.CoreV1Api(), client.AppsV1Api()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="exactly-k8s", description="Operate an Exactly release on Kubernetes.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, helptext in (("pods", "list the pods with their node id and advertised address"),
                           ("rolling-restart", "restart the pods one at a time, waiting for health")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--namespace", "-n", required=True)
        p.add_argument("--release", "-r", required=True, help="Helm release name")
        p.add_argument("--context", help="kubeconfig context (outside a cluster)")
        p.add_argument("--name-label", default="exactly", help="app.kubernetes.io/name of the pods")
        p.add_argument("--cluster-domain", default="cluster.local")
    rr = sub.choices["rolling-restart"]
    rr.add_argument("--components", default=",".join(COMPONENT_ORDER),
                    help="components to restart, in this order (default: %(default)s)")
    rr.add_argument("--address", choices=["pod-ip", "dns", "none"], default="pod-ip",
                    help="where to send the gRPC health check (none: the Ready condition only)")
    rr.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for health after each restart")
    rr.add_argument("--dry-run", action="store_true", help="print the plan only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    kwargs = dict(name_label=args.name_label, cluster_domain=args.cluster_domain)
    try:
        core, apps = connect(args.context)
        if args.cmd == "pods":
            for ident in RollingRestart(core, apps, args.namespace, args.release, **kwargs).identities():
                print(f"{ident.node_id:40} {ident.component:18} {ident.advertised:70} "
                      f"{ident.pod_ip or '-':16} {'ready' if ident.ready else 'not ready'}")
            return 0
        components = [c.strip() for c in args.components.split(",") if c.strip()]
        restart = RollingRestart(core, apps, args.namespace, args.release, components=components,
                                 address=args.address, timeout_s=args.timeout, **kwargs)
        steps = restart.run(dry_run=args.dry_run)
        for step in steps:
            print(f"{'would restart' if args.dry_run else 'restarted'} {step.pod}")
    except RestartError as exc:
        print(f"exactly-k8s: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
