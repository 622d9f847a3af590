"""What a client without credentials can do to the default secured dev cluster
(`exactly-dev up --security`: its own ZooKeeper, TLS, client certificates required on
gRPC, SASL on the Kafka port, authorizer=acl): docs/design.md, "Security", "SASL",
"Connections".

- ZooKeeper: nothing is readable or creatable without the services' digest, not the
  topic znodes (which name their creator), nor ZooKeeper's own /zookeeper and
  /zookeeper/quota.
"""
from __future__ import annotations

import uuid

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from exactly import NewTopic
from exactly_tools.devcluster import DevCluster
from clusters import admin_client

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sec(tmp_path_factory):
    """The default secured dev cluster with its own ZooKeeper (no chroot): one service of
    each role."""
    cluster = DevCluster(tmp_path_factory.mktemp("unauthenticated"), security=True)
    try:
        cluster.up(1, 1, 1)
        yield cluster
    finally:
        cluster.down()


def test_zookeeper_is_closed_to_the_world(sec):
    """A ZooKeeper client without the digest can read no znode of the cluster (topic
    znodes name their creator), list nothing at the root, and create nothing anywhere,
    ZooKeeper's own /zookeeper and /zookeeper/quota included."""
    topic = f"zk-{uuid.uuid4().hex[:6]}"
    with admin_client(sec) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    intruder = KazooClient(hosts=sec.zookeeper, timeout=10)
    intruder.start(timeout=30)
    try:
        attempts = {
            "read a topic znode": lambda: intruder.get(f"/exactly/topics/{topic}"),
            "list the topics": lambda: intruder.get_children("/exactly/topics"),
            "read a partition's state": lambda: intruder.get(f"/exactly/topics/{topic}/0/state"),
            "list the root": lambda: intruder.get_children("/"),
            "create at the root": lambda: intruder.create("/intruder", b""),
            "create under /zookeeper": lambda: intruder.create("/zookeeper/intruder", b"x" * 1024),
            "create under /zookeeper/quota": lambda: intruder.create("/zookeeper/quota/intruder", b"x" * 1024),
            "set a quota": lambda: intruder.set("/zookeeper/quota", b"x"),
            "list the quotas": lambda: intruder.get_children("/zookeeper/quota"),
        }
        allowed = []
        for what, attempt in attempts.items():
            try:
                attempt()
                allowed.append(what)
            except NoAuthError:
                pass
        assert allowed == [], f"allowed without credentials: {allowed}"
    finally:
        intruder.stop()
        intruder.close()
    with admin_client(sec) as admin:  # the services still work
        assert topic in admin.list_topics()
