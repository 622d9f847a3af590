"""Topic configs of the Cluster RPCs: validation against the partition leader's
topic configs, IncrementalAlterConfigs operations, DescribeConfigs entries."""
from __future__ import annotations

from exactly_wire.error_codes import ErrorCode
from services.common.cluster.topic_admin import (OP_DELETE, OP_SET, SOURCE_DEFAULT, SOURCE_TOPIC, apply_config_ops,
                                                 describe_topic_configs, validate_topic_configs)
from services.common.topic_config import TOPIC_CONFIGS
from services.partition_leader.partition import PartitionConfig


def test_every_topic_config_the_leader_reads_is_accepted():
    assert validate_topic_configs({k: v for k, (v, _doc) in TOPIC_CONFIGS.items()}) is None
    # The integer ones parse as PartitionConfig reads them.
    cfg = PartitionConfig.from_settings({}, {"segment.bytes": "2048", "min.insync.replicas": "2"})
    assert (cfg.log.segment_bytes, cfg.min_insync_replicas) == (2048, 2)


def test_validation_messages():
    assert "unknown topic config 'segment.byte'" in validate_topic_configs({"segment.byte": "1"})
    assert "not an integer" in validate_topic_configs({"retention.ms": "1h"})
    assert "allowed values" in validate_topic_configs({"cleanup.policy": "forever"})
    assert validate_topic_configs({"cleanup.policy": "compact,delete"}) is None


def test_apply_config_ops():
    configs = {"segment.bytes": "1024"}
    assert apply_config_ops(configs, [("retention.ms", OP_SET, "60000"), ("segment.bytes", OP_DELETE, "")]) == \
        (ErrorCode.NONE, "")
    assert configs == {"retention.ms": "60000"}
    code, msg = apply_config_ops(dict(configs), [("colour", OP_SET, "red")])
    assert code == ErrorCode.INVALID_CONFIG and "colour" in msg
    assert apply_config_ops({}, [("retention.ms", 2, "1")])[0] == ErrorCode.INVALID_CONFIG
    assert apply_config_ops({}, [("retention.ms", OP_SET, "x")])[0] == ErrorCode.INVALID_CONFIG


def test_describe_topic_configs():
    entries = {e.name: e for e in describe_topic_configs({"retention.ms": "5", "legacy.key": "x"})}
    assert entries["retention.ms"].source == SOURCE_TOPIC and entries["retention.ms"].value == "5"
    assert entries["segment.bytes"] == (entries["segment.bytes"].name, "1073741824", SOURCE_DEFAULT,
                                        entries["segment.bytes"].documentation)
    assert entries["legacy.key"].value == "x"
    assert [e.name for e in describe_topic_configs({}, ["min.insync.replicas", "nope"])] == ["min.insync.replicas"]


def test_automatic_topic_creation_rules():
    from services.common.cluster.topic_admin import auto_create_wanted, auto_created_error
    # Kafka's rules: the request allows it, the service is configured for it, the caller may Create.
    assert auto_create_wanted(True, True, True)
    assert not auto_create_wanted(False, True, True)
    assert not auto_create_wanted(True, False, True)
    assert not auto_create_wanted(True, True, False)
    # Created (by this request or a concurrent one): not served yet, the client asks again.
    assert auto_created_error(ErrorCode.NONE) == ErrorCode.LEADER_NOT_AVAILABLE
    assert auto_created_error(ErrorCode.TOPIC_ALREADY_EXISTS) == ErrorCode.LEADER_NOT_AVAILABLE
    for code in (ErrorCode.INVALID_TOPIC_EXCEPTION, ErrorCode.INVALID_REPLICATION_FACTOR, ErrorCode.POLICY_VIOLATION):
        assert auto_created_error(code) == code
