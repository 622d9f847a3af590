"""The Kafka config admin APIs (services.common.kafka.config_api) over an in-memory
stand-in for the topic znodes: what DescribeConfigs lists for topics and brokers,
what AlterConfigs and IncrementalAlterConfigs change or refuse, per-resource
authorization, and answers that encode at every advertised version."""
from __future__ import annotations

import asyncio

import pytest
from kio.serial import entity_reader

from exactly_wire.config import parse
from exactly_wire.error_codes import ErrorCode
from services.common.security import authz
from services.common.security.acl import AclBinding, Authorizer, Operation, PatternType, Permission, ResourceType
from services.common.security.auth import current_principal
from services.common.cluster.state import broker_id
from services.common.kafka import codec, surface
from services.common.kafka.config_api import (BROKER, DEFAULT_CONFIG, DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG,
                                              TOPIC, ConfigApis)
from services.common.kafka.listener import RequestContext
from services.common.settings import PartitionLeaderSchema


class Topics:
    """Topic znodes in memory, with ClusterState's topic_configs / alter_topic_configs."""

    node_id = "pl-0"
    broker_id = 4532103  # ClusterState.broker_id of "pl-0" (derived)

    def __init__(self, **topics: dict):
        self.topics = {name: dict(c) for name, c in topics.items()}

    def topic_configs(self, name):
        return None if name not in self.topics else dict(self.topics[name])

    def alter_topic_configs(self, name, update, validate_only=False):
        if name not in self.topics:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
        configs = dict(self.topics[name])
        code, msg = update(configs)
        if code == ErrorCode.NONE and not validate_only:
            self.topics[name] = configs
        return code, msg


PROPS = {"log.retention.ms": "1000", "zookeeper.ssl.keystore.password": "hunter2"}


def apis(topics: Topics) -> ConfigApis:
    return ConfigApis(topics, parse(PartitionLeaderSchema, PROPS), PROPS)


def call(api: ConfigApis, key: int, version: int, body: dict):
    req = codec.build(codec.request_class(key, version), body)
    value = asyncio.run(api.handlers()[key](req, version, RequestContext("c", version, "peer")))
    frame = codec.encode_response(key, version, 7, value)
    cls = codec.response_class(key, version)
    decoded, _ = entity_reader(cls)(frame, 4 + 4 + (1 if cls.__flexible__ else 0))
    return decoded


def describe(api, *resources, version=4, synonyms=True, docs=True):
    return call(api, surface.DESCRIBE_CONFIGS, version, {
        "resources": [{"resource_type": t, "resource_name": n, "configuration_keys": k} for t, n, k in resources],
        "include_synonyms": synonyms, "include_documentation": docs}).results


def incremental(api, name, ops, validate_only=False, rtype=TOPIC, version=1):
    return call(api, surface.INCREMENTAL_ALTER_CONFIGS, version, {"validate_only": validate_only, "resources": [
        {"resource_type": rtype, "resource_name": name, "configs": [
            {"name": k, "config_operation": op, "value": v} for k, op, v in ops]}]}).responses[0]


def test_describe_topic_sources_synonyms_and_docs():
    api = apis(Topics(t={"segment.ms": "60000"}))
    [result] = describe(api, (TOPIC, "t", None))
    assert result.error_code == ErrorCode.NONE
    entries = {c.name: c for c in result.configs}
    seg, ret, policy = entries["segment.ms"], entries["retention.ms"], entries["cleanup.policy"]
    assert (seg.value, seg.config_source) == ("60000", DYNAMIC_TOPIC_CONFIG)
    assert [s.source for s in seg.synonyms] == [DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG]
    # log.retention.ms set at start is the broker-level synonym that decides retention.ms.
    assert (ret.value, ret.config_source) == ("1000", STATIC_BROKER_CONFIG)
    assert [(s.name, s.source) for s in ret.synonyms] == [("log.retention.ms", STATIC_BROKER_CONFIG),
                                                          ("log.retention.ms", DEFAULT_CONFIG)]
    assert (policy.value, policy.config_source, policy.read_only) == ("delete", DEFAULT_CONFIG, False)
    assert seg.documentation and not seg.is_sensitive
    [only] = describe(api, (TOPIC, "t", ("retention.ms", "no.such")))
    assert [c.name for c in only.configs] == ["retention.ms"]


def test_describe_broker_settings_read_only_and_secrets_hidden():
    api = apis(Topics())
    own = str(broker_id("pl-0"))
    for name in (own, ""):
        [result] = describe(api, (BROKER, name, None))
        entries = {c.name: c for c in result.configs}
        assert entries["log.retention.ms"].config_source == STATIC_BROKER_CONFIG
        assert entries["log.retention.ms"].value == "1000" and entries["log.retention.ms"].read_only
        assert entries["zookeeper.session.timeout.ms"].config_source == DEFAULT_CONFIG
        secret = entries["zookeeper.ssl.keystore.password"]
        assert secret.is_sensitive and secret.value is None
    [other] = describe(api, (BROKER, "12345", None))
    assert other.error_code == ErrorCode.INVALID_REQUEST and "12345" in other.error_message
    [unknown] = describe(api, (TOPIC, "ghost", None))
    assert unknown.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_incremental_alter_sets_deletes_and_validates():
    topics = Topics(t={"segment.ms": "60000"})
    api = apis(topics)
    assert incremental(api, "t", [("retention.ms", 0, "5000"), ("segment.ms", 1, None)]).error_code == 0
    assert topics.topics["t"] == {"retention.ms": "5000"}
    assert incremental(api, "t", [("retention.ms", 0, "9")], validate_only=True).error_code == 0
    assert topics.topics["t"] == {"retention.ms": "5000"}
    for ops in ([("no.such", 0, "1")], [("segment.ms", 0, "1"), ("retention.ms", 0, "soon")],
                [("retention.ms", 2, "1")]):
        r = incremental(api, "t", ops)
        assert r.error_code == ErrorCode.INVALID_CONFIG and r.error_message, ops
        assert topics.topics["t"] == {"retention.ms": "5000"}
    assert incremental(api, "ghost", [("retention.ms", 0, "1")]).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_alter_configs_replaces_the_whole_set():
    topics = Topics(t={"segment.ms": "60000"})
    api = apis(topics)
    for version in (0, 1, 2):
        r = call(api, surface.ALTER_CONFIGS, version, {"validate_only": False, "resources": [
            {"resource_type": TOPIC, "resource_name": "t", "configs": [{"name": "retention.ms", "value": "77"}]}]})
        assert r.responses[0].error_code == 0
        assert topics.topics["t"] == {"retention.ms": "77"}
    bad = call(api, surface.ALTER_CONFIGS, 2, {"validate_only": False, "resources": [
        {"resource_type": TOPIC, "resource_name": "t", "configs": [{"name": "retention.ms", "value": "x"}]}]})
    assert bad.responses[0].error_code == ErrorCode.INVALID_CONFIG and topics.topics["t"] == {"retention.ms": "77"}


def test_broker_alter_is_refused_with_a_reason():
    api = apis(Topics())
    own = str(broker_id("pl-0"))
    known = incremental(api, own, [("log.retention.ms", 0, "5")], rtype=BROKER)
    assert known.error_code == ErrorCode.INVALID_REQUEST and "restart" in known.error_message
    unknown = incremental(api, own, [("no.such.setting", 0, "5")], rtype=BROKER)
    assert unknown.error_code == ErrorCode.INVALID_CONFIG and "no.such.setting" in unknown.error_message
    other = incremental(api, "", [("log.retention.ms", 0, "5")], rtype=8)  # BROKER_LOGGER
    assert other.error_code == ErrorCode.INVALID_REQUEST


@pytest.fixture
def acls():
    def allow(principal, rtype, name, op):
        return AclBinding(principal, rtype, name, PatternType.LITERAL, op, Permission.ALLOW)
    authz.active_authorizer = Authorizer([
        allow("User:reader", ResourceType.TOPIC, "t", Operation.DESCRIBE_CONFIGS),
        allow("User:writer", ResourceType.TOPIC, "t", Operation.ALTER_CONFIGS),
        allow("User:plain", ResourceType.TOPIC, "t", Operation.ALTER),
        allow("User:ops", ResourceType.CLUSTER, "kafka-cluster", Operation.DESCRIBE_CONFIGS)])
    try:
        yield
    finally:
        authz.active_authorizer = None


def as_principal(principal, fn):
    token = current_principal.set(principal)
    try:
        return fn()
    finally:
        current_principal.reset(token)


def test_authorization_per_resource(acls):
    topics = Topics(t={}, u={})
    api = apis(topics)
    # DescribeConfigs on t only: t is described, u and the broker refused, each in its own result.
    t, u, broker = as_principal("User:reader", lambda: describe(api, (TOPIC, "t", None), (TOPIC, "u", None),
                                                                 (BROKER, "", None)))
    assert t.error_code == 0 and t.configs
    assert u.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED and not u.configs
    assert broker.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert as_principal("User:ops", lambda: describe(api, (BROKER, "", None)))[0].error_code == 0
    # Alter needs AlterConfigs (which implies DescribeConfigs); Alter alone is not enough.
    assert as_principal("User:reader", lambda: incremental(api, "t", [("retention.ms", 0, "1")])).error_code \
        == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert as_principal("User:plain", lambda: incremental(api, "t", [("retention.ms", 0, "1")])).error_code \
        == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert topics.topics["t"] == {}
    assert as_principal("User:writer", lambda: incremental(api, "t", [("retention.ms", 0, "1")])).error_code == 0
    assert as_principal("User:writer", lambda: describe(api, (TOPIC, "t", None)))[0].error_code == 0
    assert topics.topics["t"] == {"retention.ms": "1"}


@pytest.mark.parametrize("key", [surface.DESCRIBE_CONFIGS, surface.ALTER_CONFIGS, surface.INCREMENTAL_ALTER_CONFIGS])
def test_every_advertised_version_answers(key):
    api = apis(Topics(t={}))
    served = surface.SURFACE[key]
    assert served.role == surface.CLUSTER
    for version in range(served.min_version, served.max_version + 1):
        if key == surface.DESCRIBE_CONFIGS:
            [r] = describe(api, (TOPIC, "t", None), version=version)
            assert r.error_code == 0 and r.configs
        elif key == surface.ALTER_CONFIGS:
            r = call(api, key, version, {"validate_only": True, "resources": [
                {"resource_type": TOPIC, "resource_name": "t", "configs": [{"name": "retention.ms", "value": "1"}]}]})
            assert r.responses[0].error_code == 0
        else:
            assert incremental(api, "t", [("retention.ms", 0, "1")], True, version=version).error_code == 0
