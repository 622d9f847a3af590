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

import pytest

from clusters import module_cluster
from services.common.cluster import broker_id

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
    """One cluster (3 partition leaders, one coordinator of each kind) for this module."""
    yield from module_cluster(zk, tmp_path_factory, "kstatic")


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
