"""Topic configs as the Cluster RPCs see them: validation (CreateTopics,
IncrementalAlterConfigs), the operations of IncrementalAlterConfigs and the entries
of DescribeConfigs. Pure; the catalogue of topic configs is the topic-config schema
(`services.common.topic_config`) the partition leaders resolve their configs from, so
a key is accepted exactly when the partition leaders understand it (docs/design.md,
"Administration")."""
from __future__ import annotations

from typing import Iterable, Mapping, NamedTuple

from exactly_wire.error_codes import ErrorCode
from services.common.topic_config import TOPIC_CONFIGS, validate_topic_configs

OP_SET = 0
OP_DELETE = 1
SOURCE_TOPIC = "TOPIC_CONFIG"
SOURCE_DEFAULT = "DEFAULT_CONFIG"


class ConfigEntry(NamedTuple):
    name: str
    value: str
    source: str  # SOURCE_TOPIC or SOURCE_DEFAULT
    documentation: str


def apply_config_ops(configs: dict[str, str], ops: Iterable[tuple[str, int, str]]) -> tuple[ErrorCode, str]:
    """Apply IncrementalAlterConfigs operations (name, op, value) to `configs` in
    place: op 0 SET, 1 DELETE (back to the default). Returns (NONE, "") or
    (INVALID_CONFIG, message) for an unknown key, a malformed value or an
    unsupported operation (APPEND and SUBTRACT apply to list configs, which topics
    here do not have); `configs` may then be partly changed and must not be stored."""
    for name, op, value in ops:
        if name not in TOPIC_CONFIGS:
            return ErrorCode.INVALID_CONFIG, validate_topic_configs({name: value}) or f"unknown topic config {name!r}"
        if op == OP_SET:
            bad = validate_topic_configs({name: value})
            if bad is not None:
                return ErrorCode.INVALID_CONFIG, bad
            configs[name] = str(value)
        elif op == OP_DELETE:
            configs.pop(name, None)
        else:
            return ErrorCode.INVALID_CONFIG, f"config operation {op} is not supported (0 SET, 1 DELETE)"
    return ErrorCode.NONE, ""


def describe_topic_configs(configs: Mapping[str, str], keys: Iterable[str] = ()) -> list[ConfigEntry]:
    """Every topic config (or only `keys`, unknown ones skipped) with the topic's
    value (source TOPIC_CONFIG) or the default (DEFAULT_CONFIG), sorted by name.
    Keys set on the topic that are not topic configs (written before validation
    existed) are shown as they are."""
    names = sorted(set(TOPIC_CONFIGS) | set(configs)) if not keys else [k for k in keys
                                                                          if k in TOPIC_CONFIGS or k in configs]
    out = []
    for name in names:
        default, doc = TOPIC_CONFIGS.get(name, ("", ""))
        if name in configs:
            out.append(ConfigEntry(name, str(configs[name]), SOURCE_TOPIC, doc))
        else:
            out.append(ConfigEntry(name, default, SOURCE_DEFAULT, doc))
    return out


def auto_create_wanted(asked: bool, enabled: bool, may_create: bool) -> bool:
    """Whether Metadata creates a named topic that does not exist (Kafka's
    KafkaApis.handleTopicMetadataRequest): the request allows it
    (allow_auto_topic_creation), the service has auto.create.topics.enable, and the caller
    may Create on the Cluster or the topic. Otherwise the topic is answered
    UNKNOWN_TOPIC_OR_PARTITION."""
    return asked and enabled and may_create


def auto_created_error(code: ErrorCode) -> ErrorCode:
    """What Metadata answers for a topic it asked to create, from the creation's outcome
    (Kafka's KafkaApis.autoCreateTopic): LEADER_NOT_AVAILABLE when it was created, or
    created by another request meanwhile — its partitions do not serve yet, clients ask
    again —, else the creation's own error (INVALID_TOPIC_EXCEPTION for a bad name,
    INVALID_REPLICATION_FACTOR with fewer live partition leaders than
    default.replication.factor, POLICY_VIOLATION past max.partitions, ...)."""
    if code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
        return ErrorCode.LEADER_NOT_AVAILABLE
    return code


__all__ = ["apply_config_ops", "describe_topic_configs", "validate_topic_configs", "ConfigEntry", "OP_SET",
           "OP_DELETE", "SOURCE_TOPIC", "SOURCE_DEFAULT", "auto_create_wanted", "auto_created_error"]
