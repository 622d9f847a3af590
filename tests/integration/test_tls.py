"""TLS on real processes (docs/design.md, "Security"): a cluster started with
`exactly-dev up --security` (a CA, a certificate per service, client certificates
required) serves the SDK and a Kafka client over TLS, services call each other
over mutual TLS; a plaintext connection, a certificate from another CA and a
client without a certificate are refused, and the services keep serving."""
from __future__ import annotations

import uuid

import pytest

from exactly import AclBinding, AdminClient, Consumer, NewTopic, Producer, TopicPartition, errors
from exactly_tools.certs import CertificateAuthority
from clusters import chrooted_cluster
from waiting import wait_for

pytestmark = pytest.mark.integration

FAST_FAIL = {"request.timeout.ms": 2000, "retry.backoff.ms": 50, "retry.backoff.max.ms": 200}


@pytest.fixture(scope="module")
def secured(zk, tmp_path_factory):
    c = chrooted_cluster(zk, tmp_path_factory.mktemp("tls-cluster"), "tls", security=True)
    yield c
    c.down()


def test_transactions_over_tls_and_between_services(secured):
    conf = {"bootstrap.servers": secured.bootstrap_servers, **secured.client_config}
    assert conf["security.protocol"] == "SSL"
    topic = f"tls-{uuid.uuid4().hex[:6]}"
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic(topic, 2, 2)])
    p = Producer({**conf, "transactional.id": f"tx-{topic}"})
    p.init_transactions()
    with p.transaction():
        for i in range(20):
            p.send(topic, b"r%02d" % i, partition=i % 2)
    p.close()
    c = Consumer({**conf, "isolation.level": "read_committed", "group.id": f"g-{topic}", "auto.offset.reset":
                  "earliest"})
    c.subscribe([topic])
    got = []
    wait_for(lambda: got.extend(c.poll(0.5)) or len(got) >= 20, 60, "20 records over TLS")
    c.commit()
    c.close()
    assert sorted(r.value for r in got) == [b"r%02d" % i for i in range(20)]


def test_plaintext_and_foreign_certificates_are_refused(secured, tmp_path):
    plain = {"bootstrap.servers": secured.bootstrap_servers, **FAST_FAIL}
    with pytest.raises(errors.ExactlyError):
        with AdminClient(plain) as admin:
            admin.list_topics()
    # A certificate signed by another CA, trusting the right CA.
    other = CertificateAuthority.create(tmp_path / "other-ca")
    mallory = other.issue("mallory", client=True)
    foreign = {**plain, "security.protocol": "SSL", "ssl.ca.location": secured.client_config["ssl.ca.location"],
               "ssl.certificate.location": str(mallory.certificate), "ssl.key.location": str(mallory.key)}
    with pytest.raises(errors.ExactlyError):
        with AdminClient(foreign) as admin:
            admin.list_topics()
    # No client certificate at all (ssl.client.auth=required).
    anonymous = {**plain, "security.protocol": "SSL", "ssl.ca.location": secured.client_config["ssl.ca.location"]}
    with pytest.raises(errors.ExactlyError):
        with AdminClient(anonymous) as admin:
            admin.list_topics()
    # The cluster's CA does not trust a server certificate of the other CA either.
    trust_other = {**plain, "security.protocol": "SSL", "ssl.ca.location": str(other.ca_path)}
    with pytest.raises(errors.ExactlyError):
        with AdminClient(trust_other) as admin:
            admin.list_topics()
    # The services kept serving the right clients.
    with AdminClient({"bootstrap.servers": secured.bootstrap_servers, **secured.client_config}) as admin:
        assert "__consumer_offsets" in admin.list_topics(include_internal=True)


def test_an_encrypted_client_key_needs_its_password(secured, tmp_path):
    ca = CertificateAuthority.load(secured.dir / "certs")
    bob = ca.issue("bob", client=True, key_password=b"s3cret")
    base = {"bootstrap.servers": secured.bootstrap_servers, "security.protocol": "SSL",
            "ssl.ca.location": secured.client_config["ssl.ca.location"],
            "ssl.certificate.location": str(bob.certificate), "ssl.key.location": str(bob.key)}
    with pytest.raises(errors.ConfigurationError) as info:
        AdminClient({**base, "ssl.key.password": "wrong"})
    assert info.value.key == "ssl.key.password"
    with AdminClient({**base, "ssl.key.password": "s3cret"}) as admin:
        assert isinstance(admin.list_topics(), dict)


def test_kafka_client_over_tls(secured):
    from confluent_kafka import Consumer as KConsumer, Producer as KProducer
    certs = secured.dir / "certs"
    CertificateAuthority.load(certs).issue("kafka-user", client=True)
    tls = {"bootstrap.servers": secured.kafka_bootstrap_servers, "security.protocol": "SSL",
           "ssl.ca.location": str(certs / "ca.pem"), "ssl.certificate.location": str(certs / "kafka-user.pem"),
           "ssl.key.location": str(certs / "kafka-user.key")}
    topic = f"ktls-{uuid.uuid4().hex[:6]}"
    user = "User:kafka-user"
    with AdminClient({"bootstrap.servers": secured.bootstrap_servers, **secured.client_config}) as admin:
        admin.create_topics([NewTopic(topic, 1)])
        admin.create_acls([AclBinding(user, "Topic", topic, "Write"), AclBinding(user, "Topic", topic, "Read"),
                           AclBinding(user, "TransactionalId", f"k-{topic}", "Write"),
                           AclBinding(user, "TransactionalId", f"k-{topic}", "Describe"),
                           AclBinding(user, "Group", f"g-{topic}", "Read"),
                           AclBinding(user, "Cluster", "kafka-cluster", "IdempotentWrite")])
    # An idempotent producer's InitProducerId goes to any service, which forwards it
    # naming the client, so the producer id is bound to User:kafka-user.
    idem = KProducer({**tls, "enable.idempotence": True})
    delivered = []
    idem.produce(topic, b"idempotent", on_delivery=lambda err, msg: delivered.append(err))
    idem.flush(30)
    assert delivered == [None]
    p = KProducer({**tls, "transactional.id": f"k-{topic}"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, b"over-tls")
    p.commit_transaction(30)
    c = KConsumer({**tls, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                   "isolation.level": "read_committed"})
    c.subscribe([topic])
    got = []

    def poll():
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
        return len(got) >= 2
    wait_for(poll, 60, lambda: f"the records over the Kafka port with TLS (got {got})")
    c.close()
    assert got == [b"idempotent", b"over-tls"]


def test_kafka_client_without_acls_gets_kafkas_authorization_errors(secured):
    """A refused Kafka-protocol request is answered with Kafka's error code (the
    connection stays open), so librdkafka reports it instead of retrying forever."""
    from confluent_kafka import KafkaError, KafkaException, Producer as KProducer
    certs = secured.dir / "certs"
    CertificateAuthority.load(certs).issue("kafka-nobody", client=True)
    tls = {"bootstrap.servers": secured.kafka_bootstrap_servers, "security.protocol": "SSL",
           "ssl.ca.location": str(certs / "ca.pem"), "ssl.certificate.location": str(certs / "kafka-nobody.pem"),
           "ssl.key.location": str(certs / "kafka-nobody.key")}
    topic = f"kdeny-{uuid.uuid4().hex[:6]}"
    with AdminClient({"bootstrap.servers": secured.bootstrap_servers, **secured.client_config}) as admin:
        admin.create_topics([NewTopic(topic, 1)])
        # Describe only: the topic is visible, writing it is not allowed.
        admin.create_acls([AclBinding("User:kafka-nobody", "Topic", topic, "Describe")])
    p = KProducer({**tls, "message.timeout.ms": 20000})
    errors_seen = []
    p.produce(topic, b"refused", on_delivery=lambda err, msg: errors_seen.append(err))
    p.flush(30)
    assert [e.code() for e in errors_seen] == [KafkaError.TOPIC_AUTHORIZATION_FAILED], errors_seen
    t = KProducer({**tls, "transactional.id": f"nobody-{topic}"})
    with pytest.raises(KafkaException) as info:
        t.init_transactions(20)
    assert info.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_kafka_config_apis_need_describe_configs_and_alter_configs(secured):
    """DescribeConfigs and the alters over the Kafka port are authorized per resource
    as in Kafka: DescribeConfigs on the topic (or the Cluster for a BROKER resource) to
    describe, AlterConfigs to alter; Alter alone does not do; a refused alter changes
    nothing (docs/kafka-clients.md, "Config admin APIs")."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import (AdminClient as KAdmin, AlterConfigOpType, ConfigEntry, ConfigResource,
                                       ResourceType)
    certs = secured.dir / "certs"
    CertificateAuthority.load(certs).issue("kafka-configs", client=True)
    tls = {"bootstrap.servers": secured.kafka_bootstrap_servers, "security.protocol": "SSL",
           "ssl.ca.location": str(certs / "ca.pem"), "ssl.certificate.location": str(certs / "kafka-configs.pem"),
           "ssl.key.location": str(certs / "kafka-configs.key")}
    mine, other = f"kcfg-{uuid.uuid4().hex[:6]}", f"kcfg-{uuid.uuid4().hex[:6]}"
    user = "User:kafka-configs"
    conf = {"bootstrap.servers": secured.bootstrap_servers, **secured.client_config}
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic(mine, 1), NewTopic(other, 1)])
        admin.create_acls([AclBinding(user, "Topic", mine, "DescribeConfigs"),
                           AclBinding(user, "Topic", mine, "Alter"), AclBinding(user, "Topic", other, "Describe")])
    k = KAdmin(tls)

    def outcome(fut) -> int:
        try:
            fut.result(30)
            return KafkaError.NO_ERROR
        except KafkaException as e:
            return e.args[0].code()

    def describe(name: str) -> int:
        res = ConfigResource(ResourceType.TOPIC, name)
        return outcome(k.describe_configs([res], request_timeout=30)[res])

    def set_retention(value: str) -> int:
        res = ConfigResource(ResourceType.TOPIC, mine, incremental_configs=[
            ConfigEntry("retention.ms", value, incremental_operation=AlterConfigOpType.SET)])
        return outcome(k.incremental_alter_configs([res], request_timeout=30)[res])

    wait_for(lambda: describe(mine) == KafkaError.NO_ERROR, 20, "the DescribeConfigs ACL applied")
    assert describe(other) == KafkaError.TOPIC_AUTHORIZATION_FAILED  # Describe is not DescribeConfigs
    broker = ConfigResource(ResourceType.BROKER, str(sorted(k.list_topics(timeout=30).brokers)[0]))
    assert outcome(k.describe_configs([broker], request_timeout=30)[broker]) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert set_retention("1234") == KafkaError.TOPIC_AUTHORIZATION_FAILED  # Alter is not AlterConfigs
    with AdminClient(conf) as admin:
        assert admin.describe_configs([mine])[mine]["retention.ms"].source == "DEFAULT_CONFIG"
        admin.create_acls([AclBinding(user, "Topic", mine, "AlterConfigs")])
    wait_for(lambda: set_retention("1234") == KafkaError.NO_ERROR, 20, "the AlterConfigs ACL applied")
    with AdminClient(conf) as admin:
        assert admin.describe_configs([mine])[mine]["retention.ms"].value == "1234"
