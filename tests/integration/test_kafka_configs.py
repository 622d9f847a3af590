"""Kafka's config admin APIs (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs)
on the Kafka ports of a real dev cluster, with unmodified clients: confluent-kafka's
AdminClient and kafka-python's KafkaAdminClient (docs/design.md, "Administration";
docs/kafka-clients.md, "Config admin APIs"). A change made over the Kafka port is seen over gRPC."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource,
                                   NewTopic, ResourceType)

from exactly import AdminClient as XAdmin
from clusters import module_cluster
from waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kc(zk, tmp_path_factory):
    """One cluster (3 partition leaders) for this module's tests."""
    yield from module_cluster(zk, tmp_path_factory, "configs")


@pytest.fixture(scope="module")
def admin(kc):
    return AdminClient({"bootstrap.servers": kc.kafka_bootstrap_servers})


def new_topic(kc, admin, **configs) -> str:
    name = f"cfg-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(30)
    return name


def grpc_configs(kc, topic: str) -> dict[str, tuple[str, str]]:
    """name -> (value, source) over gRPC (Cluster/DescribeConfigs)."""
    with XAdmin({"bootstrap.servers": kc.bootstrap_servers}) as x:
        return {k: (e.value, e.source) for k, e in x.describe_configs([topic])[topic].items()}


def describe(admin, topic: str) -> dict:
    res = ConfigResource(ResourceType.TOPIC, topic)
    return admin.describe_configs([res], request_timeout=30)[res].result(30)


def kafka_error(future) -> KafkaError:
    with pytest.raises(KafkaException) as info:
        future.result(30)
    return info.value.args[0]


def test_confluent_describe_reports_every_topic_config(kc, admin):
    topic = new_topic(kc, admin, **{"retention.ms": "3600000"})
    entries = describe(admin, topic)
    assert set(entries) >= {"retention.ms", "segment.bytes", "cleanup.policy", "min.insync.replicas"}
    set_one, default_one = entries["retention.ms"], entries["segment.bytes"]
    assert (set_one.value, set_one.source) == ("3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert (default_one.value, default_one.source) == ("1073741824", ConfigSource.DEFAULT_CONFIG.value)
    assert not set_one.is_read_only and not set_one.is_sensitive
    # Synonyms (librdkafka asks for them): the topic's value first, then the default.
    assert [s.source for s in set_one.synonyms.values()][0] == ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def test_confluent_incremental_alter_changes_retention(kc, admin):
    topic = new_topic(kc, admin)
    assert grpc_configs(kc, topic)["retention.ms"] == ("604800000", "DEFAULT_CONFIG")
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "120000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res], request_timeout=30)[res].result(30)
    assert grpc_configs(kc, topic)["retention.ms"] == ("120000", "TOPIC_CONFIG")
    assert describe(admin, topic)["retention.ms"].value == "120000"
    # validate_only checks and writes nothing.
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "5", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res], request_timeout=30, validate_only=True)[res].result(30)
    assert grpc_configs(kc, topic)["retention.ms"] == ("120000", "TOPIC_CONFIG")
    # DELETE: back to the default.
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)])
    admin.incremental_alter_configs([res], request_timeout=30)[res].result(30)
    assert grpc_configs(kc, topic)["retention.ms"] == ("604800000", "DEFAULT_CONFIG")


def test_confluent_alter_configs_replaces_the_set(kc, admin):
    topic = new_topic(kc, admin, **{"segment.ms": "3600000"})
    res = ConfigResource(ResourceType.TOPIC, topic, set_config={"retention.ms": "7200000"})
    admin.alter_configs([res], request_timeout=30)[res].result(30)
    seen = grpc_configs(kc, topic)
    assert seen["retention.ms"] == ("7200000", "TOPIC_CONFIG")
    assert seen["segment.ms"][1] == "DEFAULT_CONFIG"  # AlterConfigs replaces the whole set


def test_errors_are_specific_and_change_nothing(kc, admin):
    topic = new_topic(kc, admin, **{"retention.ms": "3600000"})
    before = grpc_configs(kc, topic)
    cases = {
        "unknown key": ([ConfigEntry("no.such.config", "1", incremental_operation=AlterConfigOpType.SET)],
                        KafkaError.INVALID_CONFIG),
        "bad value": ([ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET),
                       ConfigEntry("segment.ms", "60000", incremental_operation=AlterConfigOpType.SET)],
                      KafkaError.INVALID_CONFIG),
        "out of range": ([ConfigEntry("retention.ms", "-7", incremental_operation=AlterConfigOpType.SET)],
                         KafkaError.INVALID_CONFIG),
    }
    for what, (entries, code) in cases.items():
        res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
        err = kafka_error(admin.incremental_alter_configs([res], request_timeout=30)[res])
        assert err.code() == code, (what, err)
        assert err.str(), what
    res = ConfigResource(ResourceType.TOPIC, topic, set_config={"retention.ms": "never"})
    assert kafka_error(admin.alter_configs([res], request_timeout=30)[res]).code() == KafkaError.INVALID_CONFIG
    assert grpc_configs(kc, topic) == before
    ghost = f"ghost-{uuid.uuid4().hex[:6]}"
    for fut in (admin.describe_configs([ConfigResource(ResourceType.TOPIC, ghost)], request_timeout=30),
                admin.incremental_alter_configs([ConfigResource(ResourceType.TOPIC, ghost, incremental_configs=[
                    ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)])],
                    request_timeout=30)):
        assert kafka_error(next(iter(fut.values()))).code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_confluent_broker_configs_describe_and_refuse_alter(kc, admin):
    md = admin.list_topics(timeout=30)
    broker = sorted(md.brokers)[0]
    res = ConfigResource(ResourceType.BROKER, str(broker))
    entries = admin.describe_configs([res], request_timeout=30)[res].result(30)
    assert "zookeeper.session.timeout.ms" in entries
    entry = entries["zookeeper.session.timeout.ms"]
    assert entry.is_read_only and entry.source in (ConfigSource.DEFAULT_CONFIG.value,
                                                   ConfigSource.STATIC_BROKER_CONFIG.value)
    alter = ConfigResource(ResourceType.BROKER, str(broker), incremental_configs=[
        ConfigEntry("zookeeper.session.timeout.ms", "20000", incremental_operation=AlterConfigOpType.SET)])
    err = kafka_error(admin.incremental_alter_configs([alter], request_timeout=30)[alter])
    assert err.code() == KafkaError.INVALID_REQUEST and "dynamically" in err.str()
    unknown = ConfigResource(ResourceType.BROKER, str(broker), incremental_configs=[
        ConfigEntry("no.such.setting", "1", incremental_operation=AlterConfigOpType.SET)])
    assert kafka_error(admin.incremental_alter_configs([unknown], request_timeout=30)[unknown]).code() \
        == KafkaError.INVALID_CONFIG
    again = admin.describe_configs([res], request_timeout=30)[res].result(30)
    assert again["zookeeper.session.timeout.ms"].value == entry.value


def test_kafka_python_describe_configs(kc, admin):
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource as KPResource, ConfigResourceType
    topic = new_topic(kc, admin, **{"retention.ms": "86400000"})
    client = KafkaAdminClient(bootstrap_servers=kc.kafka_bootstrap_servers.split(","), request_timeout_ms=30000)
    try:
        modified = client.describe_configs([KPResource(ConfigResourceType.TOPIC, topic)], include_synonyms=True)
        every = client.describe_configs([KPResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
        [(_rtype, by_name)] = modified.items()
        assert set(by_name[topic]) == {"retention.ms"}  # only what is set on the topic
        [(_rtype, by_name)] = every.items()
        found = {k: v["value"] for k, v in by_name[topic].items()}
        assert found["retention.ms"] == "86400000"
        assert found["cleanup.policy"] == "delete"
    finally:
        client.close()
    wait_for(lambda: grpc_configs(kc, topic)["retention.ms"][0] == "86400000", 10, "the same over gRPC")
