"""Records of the transaction log (`TRANSACTION_STATE_TOPIC`), design doc "Transaction Log".

One record per state change of a transactional.id, in its own record batch v2
(`exactly_wire.records.encode_batch`, not transactional; with the owner's writer
producer id and epoch and no sequence, so that the partition leader fences a
deposed owner, see services.common.cluster.ownership):

    key   = transactional.id, UTF-8 bytes
    value = exactly.v1.TransactionLogValue (protos/exactly_wire/v1/txn_log.proto) holding the
            transit: state, producer id/epoch, last producer id/epoch, timeout (ms),
            partitions, start and last-update timestamps (ms),
            the prepared timestamp (ms) of a transaction sealed by PrepareTxn, the
            (PID, epoch) of a prepared transaction a new instance kept (KIP-939;
            value version 1, written only at metadata.version 2 or above);
            None (a tombstone) when the transactional.id expired.

KIP-447 draft group assignments are records of their own (`encode_group_batch`):

    key   = "\\0group\\0" + consumer group id + "\\0" + transactional.id (UTF-8)
    value = exactly.v1.GroupAssignmentValue: generation and assigned input partitions;
            None (a tombstone) when the transactional.id expired.

Producer-id bindings are records of their own too (`encode_binding_batch`):

    key   = "\\0pid\\0" + producer id in decimal (ASCII)
    value = exactly.v1.ProducerIdBindingValue: principal, transactional.id, timestamp (ms);
            None (a tombstone) when the binding expired.

The feature-level record (metadata.version 2 and above, `encode_feature_level_batch`):

    key   = "\\0features\\0metadata.version"
    value = exactly.v1.FeatureLevelValue: the finalized metadata.version the owner
            saw (services.common.cluster.features); never a tombstone.

The last record of a key wins on replay ("Transaction Coordinator Startup" 1.b;
partition.TxnPartition.replay applies each record read back).
Records with an empty key are fence records of a new owner and are skipped. A record
of a version this code does not read, or a feature level above the ones it supports,
makes the partition unreadable (NewerTxnLogError), never something else.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from exactly_wire import records
from exactly_wire.types import TopicPartition
from exactly_wire.v1 import txn_log_pb2
from services.common.cluster import features
from services.common.protocol import TRANSACTION_STATE_TOPIC

from .state import GroupAssignment, TxnState, TxnTransitMetadata

VALUE_VERSION = 0
# The TransactionLogValue version that carries ongoing_txn_producer_id / _epoch.
KEPT_TXN_VALUE_VERSION = 1



class CorruptTxnLogError(Exception):
    """The transaction log cannot be materialised: undecodable record, or a PID whose
    epoch goes backwards ("Transaction Coordinator Startup" 1.a). The partition is
    then disabled: requests for it get NOT_COORDINATOR."""


class NewerTxnLogError(CorruptTxnLogError):
    """The partition holds a record of a version this code does not read, or records
    a feature level above the ones it supports: a newer version wrote it. Disabled
    as a corrupt one, with this error naming the version or level."""


@dataclass(frozen=True)
class FeatureLevelEntry:
    """A feature-level record read back: its offset and the metadata.version it records."""

    offset: int
    metadata_version: int


FEATURES_KEY = b"\0features\0" + features.METADATA_VERSION.encode()


def encode_feature_level_batch(level: int, timestamp_ms: int, producer_id: int = records.NO_PRODUCER_ID,
                               producer_epoch: int = records.NO_PRODUCER_EPOCH) -> bytes:
    """One record batch holding the feature-level record of `level` (metadata.version).
    producer_id/producer_epoch: the owner's writer identity."""
    value = txn_log_pb2.FeatureLevelValue(metadata_version=level, version=0).SerializeToString()
    return records.encode_batch([(FEATURES_KEY, value, (), timestamp_ms)], producer_id=producer_id,
                                producer_epoch=producer_epoch, base_sequence=records.NO_SEQUENCE)


def _decode_feature_level(offset: int, value: bytes | None) -> FeatureLevelEntry:
    try:
        v = txn_log_pb2.FeatureLevelValue.FromString(value or b"")
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError or others
        raise CorruptTxnLogError(f"undecodable feature-level record at offset {offset}: {exc}") from exc
    _check_version("txn-log-feature-level", v.version, offset)
    if not features.KNOWN.covers(v.metadata_version):
        raise NewerTxnLogError(f"the feature-level record at offset {offset} records metadata.version "
                               f"{v.metadata_version}; this version of Exactly supports {features.KNOWN}: "
                               "a newer version wrote this partition")
    return FeatureLevelEntry(offset, v.metadata_version)


def _check_version(name: str, version: int, offset: int) -> None:
    """NewerTxnLogError for a record version this code does not read (features.FORMATS)."""
    try:
        features.check_readable(name, version, f"{TRANSACTION_STATE_TOPIC} record at offset {offset}")
    except features.UnknownFormatVersion as exc:
        raise NewerTxnLogError(str(exc)) from None


@dataclass(frozen=True)
class TxnLogEntry:
    """One record read back: its offset, key and transit (None for a tombstone)."""

    offset: int
    transactional_id: str
    transit: TxnTransitMetadata | None


@dataclass(frozen=True)
class GroupAssignmentEntry:
    """A group assignment record read back (KIP-447 draft): its offset, consumer group,
    transactional.id and assignment (None for a tombstone)."""

    offset: int
    group_id: str
    transactional_id: str
    assignment: GroupAssignment | None


GROUP_KEY_PREFIX = b"\0group\0"
BINDING_KEY_PREFIX = b"\0pid\0"


@dataclass(frozen=True)
class ProducerIdBinding:
    """Who a producer id was issued to: principal ("User:alice"), transactional.id
    ("" for an idempotent producer) and when the binding was written (ms)."""

    principal: str
    transactional_id: str = ""
    timestamp_ms: int = 0


@dataclass(frozen=True)
class ProducerIdBindingEntry:
    """A producer-id binding record read back: offset, producer id and binding (None
    for a tombstone)."""

    offset: int
    producer_id: int
    binding: ProducerIdBinding | None


def binding_key(producer_id: int) -> bytes:
    """Key of the binding record of `producer_id`; never a transactional.id's key
    (transactional.ids hold no NUL)."""
    return BINDING_KEY_PREFIX + str(producer_id).encode()


def encode_binding_batch(bindings: Iterable[tuple[int, ProducerIdBinding | None]], timestamp_ms: int,
                         producer_id: int = records.NO_PRODUCER_ID,
                         producer_epoch: int = records.NO_PRODUCER_EPOCH) -> bytes:
    """One record batch holding a binding record per (producer id, binding); binding
    None writes the tombstone. producer_id/producer_epoch: the owner's writer identity."""
    out = []
    for pid, b in bindings:
        value = None if b is None else txn_log_pb2.ProducerIdBindingValue(
            version=VALUE_VERSION, principal=b.principal, transactional_id=b.transactional_id,
            timestamp_ms=b.timestamp_ms).SerializeToString()
        out.append((binding_key(pid), value, (), timestamp_ms))
    return records.encode_batch(out, producer_id=producer_id, producer_epoch=producer_epoch,
                                base_sequence=records.NO_SEQUENCE)


def _decode_binding(offset: int, key: bytes, value: bytes | None) -> ProducerIdBindingEntry:
    try:
        pid = int(key[len(BINDING_KEY_PREFIX):].decode("ascii"))
        if value is None:
            return ProducerIdBindingEntry(offset, pid, None)
        v = txn_log_pb2.ProducerIdBindingValue.FromString(value)
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError or others
        raise CorruptTxnLogError(f"undecodable producer-id binding at offset {offset}: {exc}") from exc
    _check_version("txn-log-producer-id-binding", v.version, offset)
    return ProducerIdBindingEntry(offset, pid, ProducerIdBinding(v.principal, v.transactional_id, v.timestamp_ms))


def group_key(group_id: str, transactional_id: str) -> bytes:
    """Key of the group assignment record of (group, transactional.id). Group ids and
    transactional.ids never hold NUL (the coordinator refuses them), so the key is
    unambiguous and never equal to a transactional.id's key."""
    return GROUP_KEY_PREFIX + group_id.encode() + b"\0" + transactional_id.encode()


def encode_group_batch(group_id: str, transactional_id: str, assignment: GroupAssignment | None,
                       timestamp_ms: int, producer_id: int = records.NO_PRODUCER_ID,
                       producer_epoch: int = records.NO_PRODUCER_EPOCH) -> bytes:
    """One record batch holding the group assignment record of (group_id,
    transactional_id): a GroupAssignmentValue, or the tombstone when `assignment` is
    None. producer_id/producer_epoch: the owner's writer identity."""
    value = None
    if assignment is not None:
        value = txn_log_pb2.GroupAssignmentValue(
            version=VALUE_VERSION, generation_id=assignment.generation_id,
            assigned_partitions=_partitions_to_pb(assignment.partitions)).SerializeToString()
    return records.encode_batch([(group_key(group_id, transactional_id), value, (), timestamp_ms)],
                                producer_id=producer_id, producer_epoch=producer_epoch,
                                base_sequence=records.NO_SEQUENCE)


def _decode_group(offset: int, key: bytes, value: bytes | None) -> GroupAssignmentEntry:
    group, sep, tid = key[len(GROUP_KEY_PREFIX):].partition(b"\0")
    if not sep:
        raise CorruptTxnLogError(f"group assignment key without transactional.id at offset {offset}")
    group_id = group.decode()
    if value is None:
        return GroupAssignmentEntry(offset, group_id, tid.decode(), None)
    try:
        v = txn_log_pb2.GroupAssignmentValue.FromString(value)
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError or others
        raise CorruptTxnLogError(f"undecodable group assignment at offset {offset}: {exc}") from exc
    _check_version("txn-log-group-assignment", v.version, offset)
    return GroupAssignmentEntry(offset, group_id, tid.decode(),
                                GroupAssignment(group_id, v.generation_id, _partitions_from_pb(v.assigned_partitions)))


def _partitions_to_pb(partitions: Iterable[TopicPartition]) -> list[txn_log_pb2.TxnLogTopicPartitions]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return [txn_log_pb2.TxnLogTopicPartitions(topic=t, partitions=sorted(ps)) for t, ps in sorted(by_topic.items())]


def _partitions_from_pb(items) -> frozenset[TopicPartition]:
    return frozenset((tp.topic, p) for tp in items for p in tp.partitions)


def encode_value(transit: TxnTransitMetadata) -> bytes:
    """Serialize a transit as a TransactionLogValue: version 1 when it holds a kept
    prepared transaction's pair (which only metadata.version 2 lets a coordinator
    make), else version 0, byte for byte as versions before it wrote it."""
    if transit.state in (TxnState.DEAD, TxnState.PREPARE_EPOCH_FENCE):
        raise ValueError(f"{transit.state.kafka_name} is never written as a value")
    kept = transit.ongoing_txn_producer_id >= 0
    value = txn_log_pb2.TransactionLogValue(
        version=KEPT_TXN_VALUE_VERSION if kept else VALUE_VERSION, producer_id=transit.producer_id, last_producer_id=transit.last_producer_id,
        producer_epoch=transit.producer_epoch, last_producer_epoch=transit.last_producer_epoch,
        transaction_timeout_ms=transit.txn_timeout_ms, state=int(transit.state),
        partitions=_partitions_to_pb(transit.partitions),
        txn_last_update_timestamp_ms=transit.txn_last_update_timestamp,
        txn_start_timestamp_ms=transit.txn_start_timestamp,
        prepared_timestamp_ms=max(transit.prepared_timestamp, 0), transaction_version=transit.transaction_version)
    if kept:  # only then: other records stay as older versions wrote them
        value.ongoing_txn_producer_id = transit.ongoing_txn_producer_id
        value.ongoing_txn_producer_epoch = transit.ongoing_txn_producer_epoch
    return value.SerializeToString()


def decode_value(data: bytes, offset: int = -1) -> TxnTransitMetadata:
    """Parse a TransactionLogValue (version 0 or 1). Raises CorruptTxnLogError,
    NewerTxnLogError for a version this code does not read."""
    try:
        v = txn_log_pb2.TransactionLogValue.FromString(data)
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError or others
        raise CorruptTxnLogError(f"undecodable transaction log value at offset {offset}: {exc}") from exc
    _check_version("txn-log-value", v.version, offset)
    try:
        state = TxnState(v.state)
    except ValueError as exc:
        raise CorruptTxnLogError(f"transaction log value at offset {offset}: {exc}") from exc
    return TxnTransitMetadata(
        producer_id=v.producer_id, last_producer_id=v.last_producer_id, producer_epoch=v.producer_epoch,
        last_producer_epoch=v.last_producer_epoch, txn_timeout_ms=v.transaction_timeout_ms, state=state,
        partitions=_partitions_from_pb(v.partitions), txn_start_timestamp=v.txn_start_timestamp_ms,
        txn_last_update_timestamp=v.txn_last_update_timestamp_ms,
        prepared_timestamp=v.prepared_timestamp_ms if v.prepared_timestamp_ms > 0 else -1,
        transaction_version=v.transaction_version or 2,
        ongoing_txn_producer_id=v.ongoing_txn_producer_id if v.HasField("ongoing_txn_producer_id") else -1,
        ongoing_txn_producer_epoch=v.ongoing_txn_producer_epoch if v.HasField("ongoing_txn_producer_epoch") else -1)


def encode_batch(transactional_id: str, transit: TxnTransitMetadata | None, timestamp_ms: int,
                 producer_id: int = records.NO_PRODUCER_ID,
                 producer_epoch: int = records.NO_PRODUCER_EPOCH) -> bytes:
    """One record batch holding the record of `transactional_id`; transit None (or a
    Dead transit) writes the tombstone. producer_id/producer_epoch: the owner's
    writer identity (-1: a batch without PID)."""
    value = None if transit is None or transit.state is TxnState.DEAD else encode_value(transit)
    return records.encode_batch([(transactional_id.encode(), value, (), timestamp_ms)],
                                producer_id=producer_id, producer_epoch=producer_epoch,
                                base_sequence=records.NO_SEQUENCE)


def decode_fetched(buf: bytes | memoryview) -> tuple[list[object], int | None]:
    """Entries of the whole batches in `buf` (a Fetch response's records, CRC
    checked; control batches skipped) — TxnLogEntry for a transactional.id's record,
    GroupAssignmentEntry for a group assignment, ProducerIdBindingEntry for a
    producer-id binding, FeatureLevelEntry for a feature-level record — and the
    offset following the last whole batch (None when `buf` holds no whole batch).
    Raises CorruptTxnLogError (NewerTxnLogError: a record of a newer version)."""
    entries: list[object] = []
    next_offset = None
    try:
        for pos, header in records.iter_batches(buf, verify=True):
            next_offset = header.last_offset + 1
            if header.is_control:
                continue
            for rec in records.decode_records(buf, pos, header):
                if rec.key is None:
                    raise CorruptTxnLogError(f"transaction log record without key at offset {rec.offset}")
                if not rec.key:
                    continue  # a new owner's fence record
                if rec.key.startswith(GROUP_KEY_PREFIX):
                    entries.append(_decode_group(rec.offset, rec.key, rec.value))
                    continue
                if rec.key.startswith(BINDING_KEY_PREFIX):
                    entries.append(_decode_binding(rec.offset, rec.key, rec.value))
                    continue
                if rec.key == FEATURES_KEY:
                    entries.append(_decode_feature_level(rec.offset, rec.value))
                    continue
                if rec.key.startswith(b"\0"):  # a record type of a newer version: never a transactional.id
                    raise NewerTxnLogError(f"{TRANSACTION_STATE_TOPIC} record at offset {rec.offset} has key "
                                           f"{rec.key[:40]!r}, a record type this version of Exactly does not read")
                transit = None if rec.value is None else decode_value(rec.value, rec.offset)
                entries.append(TxnLogEntry(rec.offset, rec.key.decode(), transit))
    except (records.CorruptRecordError, UnicodeDecodeError) as exc:
        raise CorruptTxnLogError(str(exc)) from exc
    return entries, next_offset
