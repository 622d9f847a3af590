"""exactly_tools.k8s: the rolling-restart plan, readiness rules and pod identities over
fake Kubernetes API objects (shaped like the kubernetes package's models), and the
restart loop against a fake API whose StatefulSets recreate deleted pods."""
from __future__ import annotations

import itertools
from types import SimpleNamespace as NS

import pytest

from exactly.testing import MockTime
from exactly_tools import k8s

NAMESPACE = "streams"


def statefulset(component: str, replicas: int, release: str = "exactly", port: int = 9092):
    name = f"{release}-{component}"
    return NS(metadata=NS(name=name, labels={k8s.COMPONENT_LABEL: component}),
              spec=NS(replicas=replicas, service_name=name,
                      template=NS(spec=NS(containers=[NS(ports=[NS(name="metrics", container_port=9404),
                                                                NS(name="grpc", container_port=port)])]))))


_uids = itertools.count()


def pod(name: str, ready: bool = True, ip: str = "10.0.0.1", deleting: bool = False):
    return NS(metadata=NS(name=name, uid=f"uid-{next(_uids)}", deletion_timestamp="now" if deleting else None,
                          labels={}),
              status=NS(pod_ip=ip, conditions=[NS(type="PodScheduled", status="True"),
                                               NS(type="Ready", status="True" if ready else "False")]))


RELEASE = [statefulset("partition-leader", 3), statefulset("txn-coordinator", 2),
           statefulset("group-coordinator", 1)]


# ------------------------------------------------------------------ plan

def test_plan_restarts_coordinators_first_then_leaders_each_from_the_highest_ordinal():
    plan = k8s.plan_rolling_restart(RELEASE)
    assert [s.pod for s in plan] == [
        "exactly-txn-coordinator-1", "exactly-txn-coordinator-0",
        "exactly-group-coordinator-0",
        "exactly-partition-leader-2", "exactly-partition-leader-1", "exactly-partition-leader-0"]
    assert plan[0] == k8s.RestartStep("exactly-txn-coordinator", "txn-coordinator", "exactly-txn-coordinator-1", 1)


def test_plan_follows_the_components_given_and_skips_others_and_empty_sets():
    plan = k8s.plan_rolling_restart(RELEASE + [statefulset("zookeeper", 3), statefulset("txn-coordinator", 0, "b")],
                                    ["partition-leader", "group-coordinator"])
    assert [s.pod for s in plan] == ["exactly-partition-leader-2", "exactly-partition-leader-1",
                                     "exactly-partition-leader-0", "exactly-group-coordinator-0"]


# ------------------------------------------------------------------ readiness and identity

def test_ready_needs_the_ready_condition_and_no_deletion():
    assert k8s.pod_is_ready(pod("a"))
    assert not k8s.pod_is_ready(pod("a", ready=False))
    assert not k8s.pod_is_ready(pod("a", deleting=True))
    assert not k8s.pod_is_ready(None)
    assert not k8s.pod_is_ready(NS(metadata=NS(name="a", deletion_timestamp=None), status=NS(conditions=None)))


def test_not_ready_lists_missing_and_unready_members():
    pods = [pod("exactly-partition-leader-0"), pod("exactly-partition-leader-1", ready=False),
            pod("exactly-txn-coordinator-0"), pod("exactly-txn-coordinator-1"), pod("exactly-group-coordinator-0"),
            pod("exactly-partition-leader-7")]  # beyond replicas: ignored
    assert k8s.not_ready(RELEASE, pods) == ["exactly-partition-leader-1", "exactly-partition-leader-2"]


def test_identity_is_the_pod_name_and_its_dns_name_with_the_grpc_port():
    sts = statefulset("partition-leader", 3, port=9999)
    ident = k8s.pod_identity(pod("exactly-partition-leader-1", ip="10.1.2.3"), sts, NAMESPACE, "example.org")
    assert ident == k8s.PodIdentity(
        "exactly-partition-leader-1", "partition-leader",
        "exactly-partition-leader-1.exactly-partition-leader.streams.svc.example.org:9999", "10.1.2.3", True)
    assert k8s.pod_ordinal("exactly-partition-leader-12", "exactly-partition-leader") == 12
    assert k8s.pod_ordinal("exactly-partition-leader-x", "exactly-partition-leader") is None
    assert k8s.pod_ordinal("exactly-txn-coordinator-0", "exactly-partition-leader") is None
    assert k8s.release_selector("r") == "app.kubernetes.io/name=exactly,app.kubernetes.io/instance=r"


# ------------------------------------------------------------------ the restart loop

class FakeCluster:
    """CoreV1Api/AppsV1Api stand-ins: a deleted pod comes back (new UID, not Ready)
    after `recreate_polls` pod listings and turns Ready `ready_polls` listings later."""

    def __init__(self, statefulsets, recreate_polls: int = 2, ready_polls: int = 2):
        self.sets = statefulsets
        self.pods = {f"{s.metadata.name}-{i}": pod(f"{s.metadata.name}-{i}", ip=f"10.0.{n}.{i}")
                     for n, s in enumerate(statefulsets) for i in range(s.spec.replicas)}
        self.recreate_polls, self.ready_polls = recreate_polls, ready_polls
        self.pending: dict[str, int] = {}  # pod -> listings since deletion
        self.deleted: list[str] = []
        self.selectors: set[str] = set()
        self.events: list[str] = []

    def list_namespaced_stateful_set(self, namespace, label_selector):
        assert namespace == NAMESPACE
        self.selectors.add(label_selector)
        return NS(items=list(self.sets))

    def list_namespaced_pod(self, namespace, label_selector):
        assert namespace == NAMESPACE
        self.selectors.add(label_selector)
        for name in list(self.pending):
            self.pending[name] += 1
            n = self.pending[name]
            if n == self.recreate_polls:
                self.pods[name] = pod(name, ready=False, ip=self.pods_ip(name))
            elif n >= self.recreate_polls + self.ready_polls:
                self.pods[name].status.conditions[-1].status = "True"
                del self.pending[name]
        return NS(items=list(self.pods.values()))

    def pods_ip(self, name):
        return "10.9.9." + name.rsplit("-", 1)[1]

    def delete_namespaced_pod(self, name, namespace):
        assert namespace == NAMESPACE
        assert not self.pending, f"{name} deleted while {self.pending} is still coming back"
        self.deleted.append(name)
        self.events.append(f"delete {name}")
        del self.pods[name]
        self.pending[name] = 0


def make(fake, **kwargs):
    clock = MockTime(0, auto_tick_ms=1000)  # each reading 1 s after the one before
    serving_calls = []

    def serving(address):
        serving_calls.append(address)
        return True

    kwargs.setdefault("serving", serving)
    restart = k8s.RollingRestart(fake, fake, NAMESPACE, "exactly", clock=clock.now_s, sleep=lambda s: None,
                                 timeout_s=1000, **kwargs)
    return restart, serving_calls


def test_rolling_restart_deletes_one_pod_at_a_time_in_plan_order_waiting_for_health():
    fake = FakeCluster(RELEASE)
    restart, serving_calls = make(fake)
    steps = restart.run()
    assert fake.deleted == [s.pod for s in k8s.plan_rolling_restart(RELEASE)]
    assert [s.pod for s in steps] == fake.deleted
    assert not fake.pending
    assert fake.selectors == {"app.kubernetes.io/name=exactly,app.kubernetes.io/instance=exactly"}
    assert "10.9.9.1:9092" in serving_calls  # the recreated pod was checked at its new IP


def test_rolling_restart_waits_for_grpc_serving_before_the_next_pod():
    fake = FakeCluster([statefulset("txn-coordinator", 2)], recreate_polls=1, ready_polls=1)
    answers = {"10.9.9.1:9092": iter([False, False, True])}  # the new txn-coordinator-1 loads first

    def serving(address):
        fake.events.append(f"check {address}")
        return next(answers.get(address, iter([True])), True)

    restart, _ = make(fake, serving=serving)
    restart.run()
    events = fake.events
    second_delete = events.index("delete exactly-txn-coordinator-0")
    checks_of_new = [i for i, e in enumerate(events) if e == "check 10.9.9.1:9092"]
    assert len(checks_of_new) >= 3 and checks_of_new[2] < second_delete


def test_dns_address_mode_checks_the_advertised_name():
    fake = FakeCluster([statefulset("group-coordinator", 1)])
    restart, serving_calls = make(fake, address="dns")
    restart.run()
    assert set(serving_calls) == {"exactly-group-coordinator-0.exactly-group-coordinator.streams.svc.cluster.local:9092"}


def test_dry_run_plans_without_deleting_and_an_unhealthy_release_times_out():
    fake = FakeCluster(RELEASE)
    restart, _ = make(fake)
    assert [s.pod for s in restart.run(dry_run=True)] == [s.pod for s in k8s.plan_rolling_restart(RELEASE)]
    assert fake.deleted == []

    fake.pods["exactly-partition-leader-0"].status.conditions[-1].status = "False"
    restart, _ = make(fake, address="none")
    with pytest.raises(k8s.RestartError, match="exactly-partition-leader-0"):
        restart.run()
    assert fake.deleted == []


def test_no_statefulsets_is_an_error():
    restart, _ = make(FakeCluster([]))
    with pytest.raises(k8s.RestartError, match="no Exactly StatefulSets"):
        restart.run()
    with pytest.raises(ValueError):
        k8s.RollingRestart(None, None, NAMESPACE, "r", address="somewhere")
