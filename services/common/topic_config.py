"""The topic-config schema: every config a topic may set (CreateTopics, AlterConfigs,
IncrementalAlterConfigs, `exactly topics alter-config`), declared once, as Kafka's
ConfigDef (LogConfig) declares them: key, Kafka config type, default, allowed range
or values, documentation, and the broker-level setting whose value is the default
of a topic that does not set it (Kafka's synonym, e.g. `log.retention.ms` for
`retention.ms`; docs/design.md, "Administration" and "Retention and compaction").

Read by the partition leader (`PartitionConfig.from_settings` resolves topic value,
else broker-level setting, else default), by the Cluster RPCs and the Kafka config
APIs (validation, DescribeConfigs types, sources and synonyms), by the partition
leader's settings schema (`services.common.settings`: the broker-level defaults) and
by the topic-config table of docs/reference/configuration.md (`exactly_tools.config_docs`).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Mapping

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INT32_MAX = (1 << 31) - 1

# Kafka's ConfigDef.Type names of the topic configs.
INT, LONG, LIST = "INT", "LONG", "LIST"
DELETE, COMPACT = "delete", "compact"
CLEANUP_POLICY = "cleanup.policy"  # the one LIST config, resolved apart from the integers
SEGMENT_BYTES = "segment.bytes"  # set on the internal topics at creation
MIN_INSYNC_REPLICAS = "min.insync.replicas"  # set on the transaction log at creation


@dataclass(frozen=True)
class TopicConfigDef:
    """One topic config. key: Kafka's topic-level name; kind: INT, LONG (integers;
    INT at most 2^31-1, LONG a 64-bit signed integer) or LIST (one of `allowed`);
    default: the value a topic that sets neither it nor `broker_key` gets (int, or
    str for LIST); doc: one sentence with units; broker_key: the partition leader's
    setting that gives the default (itself when the broker-level name is the
    topic-level one); low / high: inclusive range of an integer value."""

    key: str
    kind: str
    default: int | str
    doc: str
    broker_key: str
    low: int = INT64_MIN
    high: int = INT64_MAX
    allowed: tuple[str, ...] = ()

    @property
    def default_text(self) -> str:
        """The default as DescribeConfigs shows it (a string)."""
        return str(self.default)

    def allowed_text(self) -> str:
        """What a value may be, in words (docs/reference/configuration.md, "Topic configs"; error messages)."""
        if self.allowed:
            return "one of: " + ", ".join(self.allowed)
        if self.high == INT64_MAX:
            return f"an integer >= {self.low}" if self.low != INT64_MIN else "an integer"
        return f"an integer in [{self.low}, {self.high}]"

    def check(self, value: object) -> str | None:
        """None when `value` (a string as stored in the topic's znode) is well formed,
        else a message naming the key, the value and what is allowed."""
        if self.allowed:
            if str(value).replace(" ", "") not in self.allowed:
                return f"topic config {self.key}={value!r}: allowed values are {', '.join(self.allowed)}"
            return None
        try:
            number = int(str(value))
        except ValueError:
            return f"topic config {self.key}={value!r} is not an integer"
        if not self.low <= number <= self.high:
            return f"topic config {self.key}={value!r} is outside [{self.low}, {self.high}]"
        return None


_POLICIES = ("delete", "compact", "compact,delete", "delete,compact")

SCHEMA: tuple[TopicConfigDef, ...] = (
    TopicConfigDef(SEGMENT_BYTES, INT, 1073741824, "Roll the active segment past this many bytes.",
                   "log.segment.bytes", low=1024, high=INT32_MAX),
    TopicConfigDef("index.interval.bytes", INT, 4096, "Bytes between offset index entries.",
                   "log.index.interval.bytes", low=1, high=INT32_MAX),
    TopicConfigDef("flush.messages", LONG, sys.maxsize, "Fsync the log after this many records (default: never).",
                   "log.flush.interval.messages", low=1),
    TopicConfigDef("producer.snapshot.interval.ms", LONG, 30000, "ms between periodic producer-state snapshots.",
                   "producer.snapshot.interval.ms", low=1),
    TopicConfigDef("producer.snapshot.retained", INT, 3, "Producer-state snapshots kept per partition.",
                   "producer.snapshot.retained", low=1, high=1000),
    TopicConfigDef("producer.id.expiration.ms", LONG, 86400000, "Idle ms after which a producer id without an "
                   "open transaction is forgotten.", "producer.id.expiration.ms", low=1),
    TopicConfigDef(MIN_INSYNC_REPLICAS, INT, 1, "In-sync replicas acks=all and transaction markers need.",
                   "min.insync.replicas", low=1, high=INT32_MAX),
    TopicConfigDef(CLEANUP_POLICY, LIST, DELETE, "delete: segments past retention are deleted; compact: the "
                   "latest record per key is kept.", "log.cleanup.policy", allowed=_POLICIES),
    TopicConfigDef("retention.ms", LONG, 604800000, "Delete segments older than this (ms; -1: no limit).",
                   "log.retention.ms", low=-1),
    TopicConfigDef("retention.bytes", LONG, -1, "Delete old segments while the partition is larger (bytes; -1: "
                   "no limit).", "log.retention.bytes", low=-1),
    TopicConfigDef("segment.ms", LONG, 604800000, "Roll the active segment after this many ms.", "log.roll.ms",
                   low=1),
    TopicConfigDef("delete.retention.ms", LONG, 86400000, "How long tombstones stay in a compacted topic (ms).",
                   "log.cleaner.delete.retention.ms", low=0),
    TopicConfigDef("max.message.bytes", INT, 1048588, "Largest record batch a Produce may append (bytes; "
                   "MESSAGE_TOO_LARGE).", "message.max.bytes", low=0, high=INT32_MAX),
)

BY_KEY: dict[str, TopicConfigDef] = {d.key: d for d in SCHEMA}

# The defaults as attributes, the key's dots as underscores (DEFAULTS.retention_ms), for
# the dataclasses that carry resolved values (LogConfig, PartitionConfig).
DEFAULTS = SimpleNamespace(**{d.key.replace(".", "_"): d.default for d in SCHEMA})

# Topic config -> (default shown by DescribeConfigs, documentation).
TOPIC_CONFIGS: dict[str, tuple[str, str]] = {d.key: (d.default_text, d.doc) for d in SCHEMA}

# Topic config -> its broker-level synonym, where the names differ (KIP-226).
BROKER_SYNONYMS: dict[str, str] = {d.key: d.broker_key for d in SCHEMA if d.broker_key != d.key}


def validate_topic_configs(configs: Mapping[str, str]) -> str | None:
    """None when every key is a topic config with a well-formed value, else a message
    naming the first bad key or value and what is allowed."""
    for key, value in configs.items():
        spec = BY_KEY.get(key)
        if spec is None:
            return f"unknown topic config {key!r}; topic configs are: {', '.join(sorted(BY_KEY))}"
        bad = spec.check(value)
        if bad is not None:
            return bad
    return None


def markdown_table() -> str:
    """The topic-config table of docs/reference/configuration.md: key, broker-level setting giving the default,
    allowed values, default, description (one row per key, schema order)."""
    rows = ["| topic config | process default | allowed | default | description |", "|---|---|---|---|---|"]
    for d in SCHEMA:
        rows.append(f"| `{d.key}` | `{d.broker_key}` | {d.allowed_text()} | `{d.default}` | {d.doc} |")
    return "\n".join(rows)


__all__ = ["TopicConfigDef", "SCHEMA", "BY_KEY", "TOPIC_CONFIGS", "BROKER_SYNONYMS", "DEFAULTS",
           "validate_topic_configs", "markdown_table", "INT", "LONG", "LIST", "DELETE", "COMPACT", "CLEANUP_POLICY",
           "SEGMENT_BYTES", "MIN_INSYNC_REPLICAS"]
