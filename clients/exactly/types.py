"""Plain value types shared by the Producer, the Consumer and the AdminClient.

They mirror the Java client's TopicPartition, OffsetAndMetadata, OffsetAndTimestamp,
ConsumerRecord, RecordMetadata, ConsumerGroupMetadata and NewTopic (docs/design.md, "SDK" and "Decisions"). All are
immutable; TopicPartition is hashable and ordered (topic, then partition).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

from exactly_wire.types import TopicPartition


class OffsetAndMetadata(NamedTuple):
    """An offset to commit: the offset of the *next* record to consume, and an
    optional free-form metadata string stored with it."""

    offset: int
    metadata: str = ""


class ConsumerRecord(NamedTuple):
    """A record read from a partition. `key`/`value` are bytes or None; `headers`
    is a sequence of (str, bytes | None); `timestamp` is in ms since the epoch."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]
    timestamp: int


class OffsetAndTimestamp(NamedTuple):
    """The answer of `Consumer.offsets_for_times` for one partition: the earliest
    offset whose record timestamp is >= the one asked for, and that record's
    timestamp in ms since the epoch (Kafka's OffsetAndTimestamp)."""

    offset: int
    timestamp: int


class RecordMetadata(NamedTuple):
    """Where a sent record landed: its real log offset, and its timestamp in ms
    (the create time set by the producer, or the log append time). The offset is -1
    when it is not known: for a batch answered with an error after a later batch of
    the producer's PID and epoch was acknowledged on the partition (it is in the log,
    before that batch: a leader appends a PID's batches only in sequence, KIP-98
    design document, "Idempotent Producer Guarantees")."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class ConsumerGroupMetadata(NamedTuple):
    """The consumer's group identity passed to `Producer.send_offsets_to_transaction`
    so the group coordinator can reject a stale generation (KIP-447).
    `generation_id=-1` skips the generation check."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


class NewTopic(NamedTuple):
    """A topic to create with `AdminClient.create_topics`. `config` holds
    Kafka-style topic configs (str -> str)."""

    name: str
    num_partitions: int
    replication_factor: int = 1
    config: dict[str, str] | None = None


__all__ = ["TopicPartition", "OffsetAndMetadata", "OffsetAndTimestamp", "ConsumerRecord", "RecordMetadata",
           "ConsumerGroupMetadata", "NewTopic"]
