"""Certificate identity on real processes (docs/design.md, "Security"): on a secured
dev cluster, CA-signed client certificates whose subject hides "CN=admin" or
"CN=pl-0" (both super users) behind an escaped "," in another attribute act as
User:mallory on the gRPC port and on the Kafka port; a subject with two common
names is refused on both."""
from __future__ import annotations

import uuid

import pytest

from clusters import chrooted_cluster
from crafted_certs import CRAFTED, TWO_COMMON_NAMES, name, write_certificate
from exactly import AclBinding, AdminClient, NewTopic, errors
from exactly_tools.certs import CertificateAuthority
from waiting import wait_for

pytestmark = pytest.mark.integration

FAST_FAIL = {"request.timeout.ms": 3000, "retry.backoff.ms": 50, "retry.backoff.max.ms": 200}
MINE, THEIRS = (f"{p}-{uuid.uuid4().hex[:6]}" for p in ("mallorys", "admins"))


@pytest.fixture(scope="module")
def sec(zk, tmp_path_factory):
    cluster = chrooted_cluster(zk, tmp_path_factory.mktemp("identity-cluster"), "identity", security=True, leaders=1)
    try:
        ca = CertificateAuthority.load(cluster.dir / "certs")
        for stem, subject in CRAFTED.items():
            write_certificate(ca, stem, name(subject))
        write_certificate(ca, "two-cns", name(TWO_COMMON_NAMES))
        with AdminClient({"bootstrap.servers": cluster.bootstrap_servers, **cluster.client_config}) as admin:
            admin.create_topics([NewTopic(MINE, 1, 1), NewTopic(THEIRS, 1, 1)])
            admin.create_acls([AclBinding("User:mallory", "Topic", MINE, "Describe")])
        yield cluster
    finally:
        cluster.down()


def _tls(sec, stem: str) -> dict:
    certs = sec.dir / "certs"
    return {"security.protocol": "SSL", "ssl.ca.location": str(certs / "ca.pem"),
            "ssl.certificate.location": str(certs / f"{stem}.pem"), "ssl.key.location": str(certs / f"{stem}.key")}


def _topics(sec) -> set[str]:
    with AdminClient({"bootstrap.servers": sec.bootstrap_servers, **sec.client_config}) as admin:
        return set(admin.list_topics())


@pytest.mark.parametrize("stem", sorted(CRAFTED))
def test_grpc_port_maps_a_crafted_subject_to_its_common_name(sec, stem):
    conf = {"bootstrap.servers": sec.bootstrap_servers, **_tls(sec, stem), **FAST_FAIL}
    with AdminClient(conf) as client:
        # User:mallory sees the topic it may Describe and nothing else (a super user sees all).
        topics = wait_for(lambda: (lambda t: t if MINE in t else None)(set(client.list_topics())), 20,
                          f"{stem}: User:mallory's ACL applied")
        assert THEIRS not in topics, f"{CRAFTED[stem]} acted as a super user on the gRPC port: {sorted(topics)}"
        grab = f"grab-{stem}-{uuid.uuid4().hex[:4]}"
        with pytest.raises(errors.TopicAuthorizationFailedError):
            client.create_topics([NewTopic(grab, 1, 1)])
    assert grab not in _topics(sec)


@pytest.mark.parametrize("stem", sorted(CRAFTED))
def test_kafka_port_maps_a_crafted_subject_to_its_common_name(sec, stem):
    from confluent_kafka.admin import AdminClient as KAdmin, NewTopic as KNewTopic
    client = KAdmin({"bootstrap.servers": sec.kafka_bootstrap_servers, **_tls(sec, stem)})
    topics = set(client.list_topics(timeout=20).topics)
    assert MINE in topics
    assert THEIRS not in topics, f"{CRAFTED[stem]} acted as a super user on the Kafka port: {sorted(topics)}"
    grab = f"kgrab-{stem}-{uuid.uuid4().hex[:4]}"
    future = client.create_topics([KNewTopic(grab, 1, 1)], operation_timeout=10)[grab]
    with pytest.raises(Exception):  # refused (CLUSTER_AUTHORIZATION_FAILED or the connection closed)
        future.result(20)
    assert grab not in _topics(sec)


def test_two_common_names_are_refused_on_both_ports(sec):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient as KAdmin
    conf = {"bootstrap.servers": sec.bootstrap_servers, **_tls(sec, "two-cns"), **FAST_FAIL}
    with pytest.raises(errors.ExactlyError) as info:
        with AdminClient(conf) as client:
            client.list_topics()
    assert "UNAUTHENTICATED" in str(info.value), info.value
    client = KAdmin({"bootstrap.servers": sec.kafka_bootstrap_servers, **_tls(sec, "two-cns")})
    with pytest.raises(KafkaException):
        client.list_topics(timeout=5)
    logs = (sec.dir / "logs" / "pl-0.log").read_text()
    assert "has 2 common names; refused" in logs
