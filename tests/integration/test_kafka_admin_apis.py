"""Kafka's admin APIs on the Kafka ports of a secured dev cluster (3 partition leaders,
a transaction and a group coordinator; TLS client certificates, authorizer=acl) with
unmodified clients (docs/design.md, "Kafka protocol"): confluent-kafka's AdminClient
creates, describes and deletes ACLs (a created one really grants, a deleted one really
denies); ListGroups from every port lists every group (confluent-kafka and kafka-python);
kafka-python deletes group offsets (OffsetDelete), describes log directories and asks for
leader elections; both describe the cluster."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaException, Producer as KProducer, TopicPartition as KTP
from confluent_kafka.admin import (AclBinding as KAcl, AclBindingFilter, AclOperation, AclPermissionType,
                                   AdminClient as KAdmin, ResourcePatternType, ResourceType)

from exactly import NewTopic
from exactly_tools.certs import CertificateAuthority
from services.common.cluster.state import broker_id
from clusters import admin_client, chrooted_cluster
from waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sec(zk, tmp_path_factory):
    c = chrooted_cluster(zk, tmp_path_factory.mktemp("kadmin-cluster"), "kadmin", security=True)
    ca = CertificateAuthority.load(c.dir / "certs")
    for name in ("alice", "bob"):
        ca.issue(name, client=True)
    yield c
    c.down()


def kconf(sec, who: str, bootstrap: str | None = None) -> dict:
    """librdkafka settings of `who` (a client certificate of the cluster's CA)."""
    certs = sec.dir / "certs"
    return {"bootstrap.servers": bootstrap or sec.kafka_bootstrap_servers, "security.protocol": "SSL",
            "ssl.ca.location": str(certs / "ca.pem"), "ssl.certificate.location": str(certs / f"{who}.pem"),
            "ssl.key.location": str(certs / f"{who}.key")}


def kafka_python_admin(sec, bootstrap: str | None = None):
    from kafka import KafkaAdminClient
    certs = sec.dir / "certs"
    return KafkaAdminClient(bootstrap_servers=(bootstrap or sec.kafka_bootstrap_servers).split(","),
                            security_protocol="SSL", ssl_cafile=str(certs / "ca.pem"),
                            ssl_certfile=str(certs / "admin.pem"), ssl_keyfile=str(certs / "admin.key"),
                            ssl_check_hostname=False, request_timeout_ms=20000)


@pytest.fixture(scope="module")
def topic(sec):
    name = f"ka-{uuid.uuid4().hex[:6]}"
    with admin_client(sec) as a:
        a.create_topics([NewTopic(name, 3, 1)])
    return name


def produce_error(sec, who: str, topic: str) -> str | None:
    """One record produced by `who` on the Kafka port (a fresh librdkafka producer, so
    nothing is cached): None when acknowledged, else the error's name."""
    p = KProducer({**kconf(sec, who), "message.timeout.ms": 8000, "enable.idempotence": False,
                   "topic.metadata.refresh.interval.ms": 500})
    outcome = []
    p.produce(topic, b"v", on_delivery=lambda err, msg: outcome.append(err))
    p.flush(15)
    return "no delivery report" if not outcome else (outcome[0].name() if outcome[0] else None)


def test_acls_created_described_and_deleted_on_the_kafka_port(sec, topic):
    admin = KAdmin(kconf(sec, "admin"))
    assert produce_error(sec, "alice", topic) == "TOPIC_AUTHORIZATION_FAILED"
    write = KAcl(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:alice", "*",
                 AclOperation.WRITE, AclPermissionType.ALLOW)
    prefixed = KAcl(ResourceType.GROUP, "ka-", ResourcePatternType.PREFIXED, "User:alice", "*",
                    AclOperation.READ, AclPermissionType.DENY)
    for future in admin.create_acls([write, prefixed], request_timeout=20).values():
        assert future.result(30) is None

    # Outside Exactly's model: refused with the reason, nothing stored.
    bad = KAcl(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:bob", "10.0.0.1",
               AclOperation.READ, AclPermissionType.ALLOW)
    with pytest.raises(KafkaException, match="only '\\*' is accepted"):
        admin.create_acls([bad], request_timeout=20)[bad].result(30)

    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    listed = admin.describe_acls(everything, request_timeout=20).result(30)
    assert write in listed and prefixed in listed and not any(b.principal == "User:bob" for b in listed)
    # MATCH: every binding that applies to a name, prefixes included.
    matching = admin.describe_acls(AclBindingFilter(ResourceType.GROUP, "ka-group", ResourcePatternType.MATCH,
                                                    None, None, AclOperation.ANY, AclPermissionType.ANY),
                                   request_timeout=20).result(30)
    assert matching == [prefixed]

    # The created ACL grants: alice produces once the watch delivered it.
    wait_for(lambda: produce_error(sec, "alice", topic) is None, 40, "alice's Write ACL applied")
    # alice may not change ACLs (Alter on the Cluster).
    alice = KAdmin(kconf(sec, "alice"))
    with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED"):
        alice.create_acls([prefixed], request_timeout=20)[prefixed].result(30)

    alices = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:alice", None,
                              AclOperation.ANY, AclPermissionType.ANY)
    deleted = admin.delete_acls([alices], request_timeout=20)[alices].result(30)
    assert sorted(map(str, deleted)) == sorted(map(str, [write, prefixed]))
    assert admin.describe_acls(alices, request_timeout=20).result(30) == []
    # The deleted ACL no longer grants.
    wait_for(lambda: produce_error(sec, "alice", topic) == "TOPIC_AUTHORIZATION_FAILED", 40,
             "alice's Write ACL removed")


def _commit_group(sec, group: str, topic: str, subscribe: bool = False):
    """A group with a committed offset on `topic`-0 (a librdkafka consumer as admin);
    with `subscribe` the consumer stays a member subscribed to `topic` (returned)."""
    from confluent_kafka import Consumer
    c = Consumer({**kconf(sec, "admin"), "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "session.timeout.ms": 10000})
    if subscribe:
        assigned = []
        c.subscribe([topic], on_assign=lambda consumer, parts: assigned.extend(parts))
        wait_for(lambda: c.poll(0.2) is not None and False or bool(assigned), 40, f"{group} joined")
    c.commit(offsets=[KTP(topic, 0, 1)], asynchronous=False)
    if subscribe:
        return c
    c.close()
    return None


def test_list_groups_from_every_port(sec, topic):
    groups = {f"ka-lg-{i}-{uuid.uuid4().hex[:4]}" for i in range(3)}
    for g in groups:
        _commit_group(sec, g, topic)
    admin = KAdmin(kconf(sec, "admin"))
    result = admin.list_consumer_groups(request_timeout=20).result(30)
    assert result.errors == [], result.errors
    listed = [g.group_id for g in result.valid]
    assert groups <= set(listed) and len(listed) == len(set(listed)), listed
    # bob, without Describe on them, is shown none of them (and no error).
    bob = KAdmin(kconf(sec, "bob"))
    hidden = bob.list_consumer_groups(request_timeout=20).result(30)
    assert hidden.errors == [] and not groups & {g.group_id for g in hidden.valid}, hidden.valid
    # Each port answers the union on its own: a partition leader's port, not a group
    # coordinator, lists them all (kafka-python asking one broker at a time).
    client = kafka_python_admin(sec)
    try:
        assert groups <= {g[0] if isinstance(g, tuple) else g["group_id"] for g in client.list_groups()}
        leaders = [s for s in sec.services.values() if s.role == "partition_leader"]
        for s in leaders:
            one = kafka_python_admin(sec, s.kafka_address)
            try:
                names = {g[0] if isinstance(g, tuple) else g["group_id"]
                         for g in one.list_groups(broker_ids=[broker_id(s.name)])}
            finally:
                one.close()
            assert groups <= names, (s.name, names)
    finally:
        client.close()


class _NONE:
    offset = -1


def test_offset_delete(sec, topic):
    """kafka-python's delete_group_offsets: an Empty group's offsets go; a member
    subscribed to the topic keeps them (GROUP_SUBSCRIBED_TO_TOPIC)."""
    from kafka.structs import TopicPartition
    empty, live = f"ka-od-{uuid.uuid4().hex[:4]}", f"ka-od-live-{uuid.uuid4().hex[:4]}"
    _commit_group(sec, empty, topic)
    member = _commit_group(sec, live, topic, subscribe=True)
    client = kafka_python_admin(sec)
    try:
        tp = TopicPartition(topic, 0)

        def committed(group: str) -> int:
            return client.list_group_offsets(group).get(group, {}).get(tp, _NONE).offset
        assert committed(empty) == 1 and committed(live) == 1
        result = client.delete_group_offsets(empty, [tp])
        assert committed(empty) == -1
        result = client.delete_group_offsets(live, [tp])
        assert "SUBSCRIBED" in str(result).upper(), result
        assert committed(live) == 1
    finally:
        client.close()
        member.close()


def test_describe_log_dirs_elect_leaders_and_describe_cluster(sec):
    """kafka-python's describe_log_dirs: each partition leader reports its data
    directory with the replicas it stores and their sizes (the one written to is not
    empty); elect_leaders (kafka-python and confluent-kafka): ELECTION_NOT_NEEDED for a
    partition its preferred replica leads; describe_cluster lists every service."""
    from confluent_kafka import ElectionType
    topic = f"ld-{uuid.uuid4().hex[:6]}"  # its own: the module's topic takes records on any partition
    with admin_client(sec) as a:
        a.create_topics([NewTopic(topic, 3, 1)])
    p = KProducer({**kconf(sec, "admin"), "enable.idempotence": False})
    for i in range(20):
        p.produce(topic, b"x" * 100, partition=0)
    assert p.flush(30) == 0
    client = kafka_python_admin(sec)
    try:
        leaders = [s.name for s in sec.services.values() if s.role == "partition_leader"]
        homes = {str((sec.dir / name / "logs").resolve()) for name in leaders}
        sizes, dirs = {}, set()
        for broker in client.describe_log_dirs():
            for d in broker["log_dirs"]:
                dirs.add(d["log_dir"])
                for t in d["topics"]:
                    if t["name"] == topic:
                        sizes.update({q["partition_index"]: q["partition_size"] for q in t["partitions"]})
        assert dirs == homes, (dirs, homes)
        assert set(sizes) == {0, 1, 2} and sizes[0] >= 20 * 100 and sizes[1] == sizes[2] == 0, sizes

        result = client.elect_leaders(0, {topic: [0]}, raise_errors=False)
        assert [(r.topic, [(q.partition_id, q.error_code) for q in r.partition_result])
                for r in result.replica_election_results] == [(topic, [(0, 84)])], result  # ELECTION_NOT_NEEDED
        cluster = client.describe_cluster()
        assert cluster["cluster_id"] == "exactly" and len(cluster["brokers"]) == len(sec.services), cluster
    finally:
        client.close()
    admin = KAdmin(kconf(sec, "admin"))
    try:
        elected = admin.elect_leaders(ElectionType.PREFERRED, [KTP(topic, 0)]).result(30)
        assert "ELECTION_NOT_NEEDED" in str(elected), elected
    except KafkaException as exc:
        assert "ELECTION_NOT_NEEDED" in str(exc), exc
    described = admin.describe_cluster(request_timeout=20).result(30)
    assert described.cluster_id == "exactly" and len(described.nodes) == len(sec.services)
