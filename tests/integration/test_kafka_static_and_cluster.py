"""confluent-kafka against the Kafka listeners (docs/design.md, "Kafka protocol"):
AdminClient.describe_cluster() with the newest confluent-kafka and with 2.12
(librdkafka 2.12.1, in its own virtualenv `.compat/confluent-2.12` made by
scripts/setup.sh), and static group membership (KIP-345) through the Kafka port.

Each client runs in a subprocess: a client that crashes (librdkafka 2.12's
describe_cluster died with SIGSEGV on a cluster id followed by a controller id
with a non-zero top byte) fails the test instead of killing the test run."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import threading
import time
import uuid

import pytest
from exactly_wire.error_codes import ErrorCode

from clusters import chrooted_cluster
from exactly import AdminClient as XAdmin
from waiting import wait_for
from services.common.cluster.state import broker_id

from .test_consumer_calls import StaticMemberProcess
from .test_kafka_clients import new_topic
from .test_kafka_surface import call

pytestmark = pytest.mark.integration

REPO = pathlib.Path(__file__).resolve().parents[2]
COMPAT_2_12 = REPO / ".compat" / "confluent-2.12" / "bin" / "python"

_DESCRIBE_CLUSTER = """
import json, sys
import confluent_kafka
from confluent_kafka.admin import AdminClient
admin = AdminClient({"bootstrap.servers": sys.argv[1]})
d = admin.describe_cluster(request_timeout=20).result(30)
node = lambda n: None if n is None else [n.id, n.host, n.port]
print(json.dumps({"version": confluent_kafka.libversion()[0], "cluster_id": d.cluster_id,
                  "controller": node(d.controller), "nodes": sorted(node(n) for n in d.nodes)}), flush=True)
"""


@pytest.fixture(scope="module")
def kc(zk, tmp_path_factory):
    """One cluster (2 partition leaders, one coordinator of each kind) for this module."""
    cluster = chrooted_cluster(zk, tmp_path_factory.mktemp("kstatic"), "kstatic", leaders=2)
    try:
        yield cluster
    finally:
        cluster.down()


def _describe_cluster(python: pathlib.Path | str, bootstrap: str) -> dict:
    proc = subprocess.run([str(python), "-c", _DESCRIBE_CLUSTER, bootstrap], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"{python}: exit {proc.returncode}: {proc.stderr[-2000:]}"
    return json.loads(proc.stdout)


@pytest.mark.parametrize("python", ["newest", "2.12"])
def test_confluent_describe_cluster(kc, python):
    """describe_cluster() answers the cluster id, the controller and every node with a
    Kafka listener, with the .venv's confluent-kafka and with confluent-kafka 2.12.1
    (which crashed, exit -11, while broker ids used 31 bits)."""
    if python == "2.12":
        if not COMPAT_2_12.exists():
            pytest.fail(f"{COMPAT_2_12} is missing: run make setup (scripts/setup.sh creates it)")
        exe, version = COMPAT_2_12, "2.12.1"
    else:
        exe, version = sys.executable, None
    d = _describe_cluster(exe, kc.kafka_bootstrap_servers)
    if version:
        assert d["version"] == version
    assert d["cluster_id"] == "exactly"
    assert d["nodes"] == sorted([broker_id(s.name), "127.0.0.1", s.kafka_port]
                                for s in kc.services.values() if s.kafka_port)
    first_leader = min(s.name for s in kc.services.values() if s.role == "partition_leader")
    assert d["controller"] == [broker_id(first_leader), "127.0.0.1", kc.services[first_leader].kafka_port]


# ---------------------------------------------------------------- static membership (KIP-345)

_STATIC_MEMBER = """
import json, sys
from confluent_kafka import Consumer
bootstrap, group, topic, instance = sys.argv[1:5]
c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.instance.id": instance,
              "session.timeout.ms": 30000, "heartbeat.interval.ms": 300, "enable.auto.commit": False,
              "auto.offset.reset": "earliest"})
def event(kind):
    def cb(consumer, tps):
        print(json.dumps([kind, sorted(t.partition for t in tps)]), flush=True)
    return cb
c.subscribe([topic], on_assign=event("assign"), on_revoke=event("revoke"), on_lost=event("lost"))
while True:
    c.poll(0.2)
"""


class _Events(list):
    """A list whose `changed` event is set by every append."""

    def __init__(self):
        super().__init__()
        self.changed = threading.Event()

    def append(self, item) -> None:
        super().append(item)
        self.changed.set()


class StaticMember(StaticMemberProcess):
    """A confluent-kafka consumer process with `group.instance.id` = `instance`; its
    rebalance callbacks ([kind, partitions]) are read from its stdout into `events`
    (`events.changed` is set by each)."""

    def __init__(self, kc, group: str, topic: str, instance: str):
        self.proc = subprocess.Popen([sys.executable, "-c", _STATIC_MEMBER, kc.kafka_bootstrap_servers, group, topic,
                                      instance], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.events = _Events()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def assigned(self) -> list[int] | None:
        """The partitions of its last callback when that was an assignment."""
        return self.events[-1][1] if self.events and self.events[-1][0] == "assign" else None

    def kill(self) -> None:
        if self.proc.poll() is None:
            super().kill()


def two_static_members(kc, group: str, topic: str, members: list) -> None:
    """Start static-a, then static-b, appending them to `members`, and wait for the
    two-member generation: range over instance ids gives static-a [0, 1], static-b [2, 3]."""
    members.append(StaticMember(kc, group, topic, "static-a"))
    wait_for(members[0].assigned, 60, "the first member's assignment")
    members.append(StaticMember(kc, group, topic, "static-b"))
    wait_for(lambda: [m.assigned() for m in members] == [[0, 1], [2, 3]], 60, "the two-member generation")


@pytest.mark.parametrize("restarted_instance", ["static-a", "static-b"])
def test_confluent_static_member_restarted_gets_its_partitions_back_without_a_rebalance(kc, restarted_instance):
    """Two confluent-kafka consumers with group.instance.id; one (the group leader,
    static-a, which joined first, or the other) is SIGKILLed (no LeaveGroup) and started
    again with the same instance id within the session timeout: it gets its partitions
    back in the same generation under a new member id, and the other member sees no
    rebalance callback at all."""
    topic, group = new_topic(kc, 4), f"g-{uuid.uuid4().hex[:8]}"
    admin = XAdmin({"bootstrap.servers": kc.bootstrap_servers})
    members: list[StaticMember] = []
    try:
        two_static_members(kc, group, topic, members)
        wanted = {"static-a": [0, 1], "static-b": [2, 3]}
        before = admin.describe_groups([group])[group]
        assert before.state == "Stable" and len(before.members) == 2
        old_ids = {m.group_instance_id: m.member_id for m in before.members}
        assert before.leader == old_ids["static-a"]
        victim, other = (members[0], members[1]) if restarted_instance == "static-a" else (members[1], members[0])
        seen_by_other = list(other.events)
        other.events.changed.clear()

        victim.kill()
        restarted = StaticMember(kc, group, topic, restarted_instance)
        members.append(restarted)
        wait_for(restarted.assigned, 25, "the restarted member's assignment")
        assert restarted.events == [["assign", wanted[restarted_instance]]]
        after = admin.describe_groups([group])[group]
        assert after.generation_id == before.generation_id
        ids = {m.group_instance_id: m.member_id for m in after.members}
        for instance in wanted:
            assert (ids[instance] == old_ids[instance]) == (instance != restarted_instance), (old_ids, ids)
        # The other member goes on in the same generation (heartbeats every 300 ms): no
        # callback within 8 s (a rebalance would reach it at its next heartbeat).
        assert not other.events.changed.wait(8), \
            f"the other member saw a rebalance: {other.events[len(seen_by_other):]}"
        assert other.events == seen_by_other and restarted.events == [["assign", wanted[restarted_instance]]]
        final = admin.describe_groups([group])[group]
        assert final.generation_id == before.generation_id and final.state == "Stable"
        assert {m.group_instance_id: m.member_id for m in final.members} == ids
    finally:
        for m in members:
            m.kill()
        admin.close()


def test_a_dead_static_member_is_removed_by_its_instance_id(kc):
    """KIP-345's RemoveMembers over the Kafka port: a static member SIGKILLed (it sends
    no LeaveGroup) keeps its partitions until its session times out (30 s), unless a
    LeaveGroup v4 names it by group.instance.id alone (member id ""): then the other
    member takes every partition at once. Naming it again: UNKNOWN_MEMBER_ID."""
    topic, group = new_topic(kc, 4), f"g-{uuid.uuid4().hex[:8]}"
    admin = XAdmin({"bootstrap.servers": kc.bootstrap_servers})
    members: list[StaticMember] = []
    try:
        two_static_members(kc, group, topic, members)
        a = members[0]
        members[1].kill()
        coordinator = next(s.kafka_address for s in kc.services.values() if s.role == "group_coordinator")
        remove = {"group_id": group, "members": [{"member_id": "", "group_instance_id": "static-b"}]}
        resp = call(coordinator, 13, 4, remove)
        assert (resp.error_code, [(m.group_instance_id, m.error_code) for m in resp.members]) == \
            (0, [("static-b", 0)])
        removed_at = time.monotonic()
        wait_for(lambda: a.assigned() == [0, 1, 2, 3], 25, "the other member to take every partition")
        assert time.monotonic() - removed_at < 20  # not the session timeout (30 s)
        assert [m.group_instance_id for m in admin.describe_groups([group])[group].members] == ["static-a"]
        again = call(coordinator, 13, 4, remove)
        assert [m.error_code for m in again.members] == [ErrorCode.UNKNOWN_MEMBER_ID]
    finally:
        for m in members:
            m.kill()
        admin.close()
