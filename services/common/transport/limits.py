"""Limits and request validation shared by the services: pure functions that check
a request before anything is allocated for it, as Kafka does (docs/design.md,
"Input validation and limits"). Each returns None when the input is acceptable,
else (Kafka error code, message).

Settings (declared with their defaults in services.common.settings; every service
reads them, since every service answers CreateTopics and CreatePartitions):

- `max.partitions.per.topic`: partitions one topic may have (CreateTopics,
  CreatePartitions) -> INVALID_PARTITIONS;
- `max.partitions` (KIP-578's cluster-wide limit): partitions of all topics together
  -> POLICY_VIOLATION;
- `socket.request.max.bytes`: the largest request a server receives (gRPC's receive
  limit; RESOURCE_EXHAUSTED);
- `exactly.max.concurrent.streams`: calls in flight per connection;
- `message.max.bytes` (partition leaders; topic config `max.message.bytes`,
  services.common.topic_config): the largest record batch -> MESSAGE_TOO_LARGE.
"""
from __future__ import annotations

import re
from typing import Collection, Mapping

from exactly_wire.error_codes import ErrorCode

from ..settings import ServiceSchema, key_of, service_settings
from ..topic_config import DEFAULTS

# Key names for refusal messages; the values are ServiceSchema's attributes.
MAX_PARTITIONS_PER_TOPIC = key_of(ServiceSchema, "max_partitions_per_topic")
MAX_PARTITIONS = key_of(ServiceSchema, "max_partitions")
DEFAULT_MESSAGE_MAX_BYTES = DEFAULTS.max_message_bytes

TOPIC_NAME_MAX_LENGTH = 249  # Kafka's Topic.MAX_NAME_LENGTH
_LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
INT32_MAX = (1 << 31) - 1
INT16_MAX = (1 << 15) - 1

Refusal = tuple[ErrorCode, str]


def unify_collision_chars(name: str) -> str:
    """Kafka's Topic.unifyCollisionChars: '.' and '_' collide in metric names, so
    "a.b" and "a_b" cannot both exist."""
    return name.replace(".", "_")


def validate_topic_name(name: str, existing: Collection[str] = (), internal: bool = False) -> Refusal | None:
    """Kafka's Topic.validate plus its collision check (INVALID_TOPIC_EXCEPTION):
    not empty, not "." or "..", at most 249 characters of [a-zA-Z0-9._-]; no existing
    topic (other than `name` itself) equal to it once '.' and '_' are unified;
    names starting with "__" are reserved for internal topics unless `internal`."""
    if not name:
        return ErrorCode.INVALID_TOPIC_EXCEPTION, "topic name is empty"
    if name in (".", ".."):
        return ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic name cannot be {name!r}"
    if len(name) > TOPIC_NAME_MAX_LENGTH:
        return (ErrorCode.INVALID_TOPIC_EXCEPTION,
                f"topic name is {len(name)} characters long, the limit is {TOPIC_NAME_MAX_LENGTH}")
    if not _LEGAL_TOPIC_NAME.fullmatch(name):
        return (ErrorCode.INVALID_TOPIC_EXCEPTION,
                f"topic name {name!r} has characters other than ASCII alphanumerics, '.', '_' and '-'")
    if name.startswith("__") and not internal:
        return ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic names starting with '__' are reserved: {name!r}"
    unified = unify_collision_chars(name)
    for other in existing:
        if other != name and unify_collision_chars(other) == unified:
            return (ErrorCode.INVALID_TOPIC_EXCEPTION,
                    f"topic {name!r} collides with existing topic {other!r} ('.' and '_' are equivalent)")
    return None


def validate_partition_count(topic: str, count: int, cluster_partitions: int,
                             settings: ServiceSchema | Mapping[str, object]) -> Refusal | None:
    """A topic with `count` partitions in a cluster that has `cluster_partitions`
    partitions besides this topic's (CreateTopics: all others; CreatePartitions: all
    others than the topic's current ones): INVALID_PARTITIONS below 1 or above
    `max.partitions.per.topic`, POLICY_VIOLATION when the cluster would pass
    `max.partitions`. `settings`: the service's parsed settings (or a mapping of
    Kafka keys, parsed; ConfigurationError for a wrong value)."""
    if count < 1:
        return ErrorCode.INVALID_PARTITIONS, f"topic {topic!r}: the number of partitions must be at least 1, got {count}"
    settings = settings if isinstance(settings, ServiceSchema) else service_settings(settings)
    per_topic = settings.max_partitions_per_topic
    if count > per_topic:
        return (ErrorCode.INVALID_PARTITIONS,
                f"topic {topic!r}: {count} partitions is more than {MAX_PARTITIONS_PER_TOPIC}={per_topic}")
    total = settings.max_partitions
    if cluster_partitions + count > total:
        return (ErrorCode.POLICY_VIOLATION,
                f"topic {topic!r}: {count} partitions would bring the cluster to {cluster_partitions + count}, "
                f"more than {MAX_PARTITIONS}={total}")
    return None


def validate_replication_factor(replication_factor: int, live_leaders: int) -> Refusal | None:
    """INVALID_REPLICATION_FACTOR below 1 or above the live partition leaders."""
    if replication_factor < 1 or replication_factor > live_leaders:
        return (ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor {replication_factor} with {live_leaders} live partition leaders "
                "(it must be between 1 and their number)")
    return None


def validate_batch_size(size: int, max_bytes: int) -> Refusal | None:
    """MESSAGE_TOO_LARGE for a record batch of `size` bytes above `max_bytes`
    (`message.max.bytes` / topic config `max.message.bytes`)."""
    if size > max_bytes:
        return (ErrorCode.MESSAGE_TOO_LARGE,
                f"record batch of {size} bytes is larger than max.message.bytes={max_bytes}")
    return None


def validate_producer_epoch(epoch: int) -> Refusal | None:
    """INVALID_REQUEST for a producer epoch outside Kafka's int16 range [0, 32767]
    (-1 means "none" and is checked by the caller where it is allowed)."""
    if not 0 <= epoch <= INT16_MAX:
        return ErrorCode.INVALID_REQUEST, f"producer epoch {epoch} is outside [0, {INT16_MAX}]"
    return None


__all__ = ["validate_topic_name", "validate_partition_count", "validate_replication_factor",
           "validate_batch_size", "validate_producer_epoch", "unify_collision_chars",
           "MAX_PARTITIONS_PER_TOPIC", "MAX_PARTITIONS", "DEFAULT_MESSAGE_MAX_BYTES"]
