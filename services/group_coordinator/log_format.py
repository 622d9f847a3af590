"""Records of the `CONSUMER_OFFSETS_TOPIC` topic: keys and values as protobuf messages
of exactly/v1/offsets_log.proto inside Kafka record batches v2.

- Offset commit: key OffsetsLogKey.offset (group, topic, partition), value
  OffsetCommitValue (offset, leader epoch, metadata, commit timestamp ms), or a
  null value (tombstone). OffsetCommit writes them in a non-transactional batch
  carrying the owner's writer PID and epoch (services.common.cluster.ownership: the
  partition leader fences a deposed owner); TxnOffsetCommit in a transactional
  batch with the producer's PID and epoch and base sequence -1
  (records.NO_SEQUENCE), so the transaction's marker decides.
- Group metadata: key OffsetsLogKey.group, value GroupMetadataValue (the
  GroupSnapshot of a completed rebalance), never transactional, with the writer
  PID and epoch.
- Records with an empty key are a new owner's fence records; `decode_key`
  returns None for them (skipped).

Keys and values carry a version (0, the default, never on the wire; features.py
format "offsets-log"): a record of a version this code does not read raises
NewerOffsetsRecordError, which stops the partition's load (it is not served) instead
of being skipped as a corrupt batch or read as something else.
"""
from __future__ import annotations

from typing import Iterable, Mapping, NamedTuple, Union

from exactly_wire import records
from exactly_wire.types import TopicPartition
from exactly_wire.v1 import offsets_log_pb2 as pb
from services.common.cluster import features
from services.common.protocol import CONSUMER_OFFSETS_TOPIC

from .group import GroupSnapshot, MemberSnapshot
from .offsets import OffsetAndMetadata


class OffsetKey(NamedTuple):
    """Decoded offset commit key."""
    group: str
    tp: TopicPartition


class GroupKey(NamedTuple):
    """Decoded group metadata key."""
    group: str


LogKey = Union[OffsetKey, GroupKey]


class NewerOffsetsRecordError(Exception):
    """A `CONSUMER_OFFSETS_TOPIC` key or value of a version this code does not read: a newer
    version wrote it. The partition is not served (its load stops)."""


def _check_version(version: int, what: str) -> None:
    try:
        features.check_readable("offsets-log", version, f"{CONSUMER_OFFSETS_TOPIC} {what}")
    except features.UnknownFormatVersion as exc:
        raise NewerOffsetsRecordError(str(exc)) from None


def offset_key(group: str, tp: TopicPartition) -> bytes:
    return pb.OffsetsLogKey(offset=pb.OffsetCommitKey(
        group=group, topic=tp.topic, partition=tp.partition)).SerializeToString()


def group_key(group: str) -> bytes:
    return pb.OffsetsLogKey(group=pb.GroupMetadataKey(group=group)).SerializeToString()


def decode_key(data: bytes | None) -> LogKey | None:
    """OffsetKey, GroupKey, or None for a key of no known kind (skipped when
    replaying, so newer record kinds do not stop an older coordinator).
    Raises records.CorruptRecordError when the bytes do not parse."""
    if not data:
        return None  # no key, or a fence record
    key = pb.OffsetsLogKey()
    try:
        key.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError
        raise records.CorruptRecordError(f"{CONSUMER_OFFSETS_TOPIC} key: {exc}") from exc
    _check_version(key.version, "key")
    kind = key.WhichOneof("key")
    if kind == "offset":
        return OffsetKey(key.offset.group, TopicPartition(key.offset.topic, key.offset.partition))
    if kind == "group":
        return GroupKey(key.group.group)
    return None


def encode_offset_value(value: OffsetAndMetadata) -> bytes:
    return pb.OffsetCommitValue(offset=value.offset, leader_epoch=value.leader_epoch,
                                metadata=value.metadata,
                                commit_timestamp_ms=value.commit_timestamp_ms).SerializeToString()


def decode_offset_value(data: bytes | None) -> OffsetAndMetadata | None:
    """None for a tombstone. Raises records.CorruptRecordError."""
    if data is None:
        return None
    v = pb.OffsetCommitValue()
    try:
        v.ParseFromString(data)
    except Exception as exc:
        raise records.CorruptRecordError(f"{CONSUMER_OFFSETS_TOPIC} offset value: {exc}") from exc
    _check_version(v.version, "offset value")
    return OffsetAndMetadata(v.offset, v.metadata, v.leader_epoch, v.commit_timestamp_ms)


def encode_group_value(snap: GroupSnapshot, timestamp_ms: int) -> bytes:
    return pb.GroupMetadataValue(
        protocol_type=snap.protocol_type, generation=snap.generation,
        protocol_name=snap.protocol_name, leader=snap.leader, state_timestamp_ms=timestamp_ms,
        members=[pb.GroupMemberRecord(
            member_id=m.member_id, group_instance_id=m.group_instance_id,
            session_timeout_ms=m.session_timeout_ms, rebalance_timeout_ms=m.rebalance_timeout_ms,
            topics=list(m.topics),
            assignment=[pb.MemberAssignment(topic=t, partitions=list(p)) for t, p in m.assignment])
            for m in snap.members],
        topic_partition_counts=dict(snap.topic_partition_counts)).SerializeToString()


def decode_group_value(group_id: str, data: bytes | None) -> GroupSnapshot | None:
    """None for a tombstone (group deleted). Raises records.CorruptRecordError."""
    if data is None:
        return None
    v = pb.GroupMetadataValue()
    try:
        v.ParseFromString(data)
    except Exception as exc:
        raise records.CorruptRecordError(f"{CONSUMER_OFFSETS_TOPIC} group value: {exc}") from exc
    _check_version(v.version, "group value")
    return GroupSnapshot(
        group_id, v.protocol_type, v.generation, v.protocol_name, v.leader,
        tuple(MemberSnapshot(m.member_id, m.group_instance_id, m.session_timeout_ms,
                             m.rebalance_timeout_ms, tuple(m.topics),
                             tuple((a.topic, tuple(a.partitions)) for a in m.assignment))
              for m in v.members),
        tuple(sorted(v.topic_partition_counts.items())))


NO_WRITER = (records.NO_PRODUCER_ID, records.NO_PRODUCER_EPOCH)


def offsets_batch(group: str, offsets: Mapping[TopicPartition, OffsetAndMetadata], timestamp_ms: int,
                  producer_id: int = records.NO_PRODUCER_ID,
                  producer_epoch: int = records.NO_PRODUCER_EPOCH,
                  writer: tuple[int, int] = NO_WRITER) -> bytes:
    """One record batch with an offset commit record per partition (at least
    one). With producer_id >= 0 the batch is transactional for that PID and
    epoch, base sequence NO_SEQUENCE (TxnOffsetCommit); otherwise it is a plain
    batch with the owner's `writer` (producer id, producer epoch), (-1, -1): no PID."""
    recs = [(offset_key(group, TopicPartition(*tp)), encode_offset_value(v), (), timestamp_ms)
            for tp, v in offsets.items()]
    if producer_id >= 0:
        return records.encode_batch(recs, producer_id=producer_id, producer_epoch=producer_epoch,
                                    base_sequence=records.NO_SEQUENCE, transactional=True)
    return records.encode_batch(recs, producer_id=writer[0], producer_epoch=writer[1],
                                base_sequence=records.NO_SEQUENCE)


def group_batch(snap: GroupSnapshot, timestamp_ms: int, writer: tuple[int, int] = NO_WRITER) -> bytes:
    """One record batch holding the group metadata record of `snap`, written with
    the owner's `writer` (producer id, producer epoch); (-1, -1): no PID."""
    return records.encode_batch([(group_key(snap.group_id), encode_group_value(snap, timestamp_ms),
                                  (), timestamp_ms)], producer_id=writer[0], producer_epoch=writer[1],
                                base_sequence=records.NO_SEQUENCE)


def tombstones_batch(group: str, partitions: Iterable[TopicPartition], timestamp_ms: int,
                     writer: tuple[int, int] = NO_WRITER, group_too: bool = True) -> bytes:
    """One record batch deleting a group (DeleteGroups): a tombstone (null value) for
    the offset key of each of `partitions`, then one for the group metadata key,
    written with the owner's `writer` (producer id, producer epoch). group_too=False:
    the offsets' tombstones only (OffsetDelete)."""
    recs = [(offset_key(group, TopicPartition(*tp)), None, (), timestamp_ms) for tp in sorted(partitions)]
    if group_too:
        recs.append((group_key(group), None, (), timestamp_ms))
    return records.encode_batch(recs, producer_id=writer[0], producer_epoch=writer[1],
                                base_sequence=records.NO_SEQUENCE)
