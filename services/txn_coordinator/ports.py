"""The ports and results of the transaction coordinator
(`services.txn_coordinator.coordinator.TransactionCoordinator` and its parts).

The coordinator reaches the transaction log, the partition leaders' markers and the
cluster topology through the small ports below (`TxnLogStore`, `MarkerWriter`,
`Topology`), implemented over the cluster in `adapters.py` and by fakes in unit
tests. Every protocol outcome is an `ErrorCode` value.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple, Protocol

from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition

from .state import TxnStateSummary

# Append outcomes that do not tell whether the record reached the log: the leader may
# have appended it before answering (timeout, ISR shrink or leadership change while
# waiting for acks=all, a storage error after the write) or the answer was lost.
AMBIGUOUS_APPEND_ERRORS = frozenset({
    ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.NETWORK_EXCEPTION, ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.UNKNOWN_SERVER_ERROR,
})

# Marker outcomes that do not tell whether the request is over at the partition
# leader: no answer within the caller's deadline, or the transport broke. The
# request may still append its marker there until the leader's own deadline.
UNANSWERED_MARKER_ERRORS = frozenset({ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NETWORK_EXCEPTION})

# ---------------------------------------------------------------- ports

@dataclass(frozen=True)
class TxnLogFetch:
    """A read of the transaction log: error code, raw record batches, high watermark
    and log start offset of the partition."""

    error_code: int
    records: bytes = b""
    high_watermark: int = -1
    log_start_offset: int = 0


class TxnLogStore(Protocol):
    """The `TRANSACTION_STATE_TOPIC` topic."""

    async def append(self, partition: int, batch: bytes) -> int:
        """Append one record batch with acks=all; returns an ErrorCode value."""

    async def fetch(self, partition: int, offset: int, max_bytes: int) -> TxnLogFetch:
        """Read whole batches from `offset` (read_uncommitted)."""


@dataclass(frozen=True)
class TxnMarker:
    """A COMMIT (committed=True) or ABORT marker for `partitions`, written with the
    transaction's PID and epoch and this coordinator's epoch for its partition."""

    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int
    partitions: frozenset[TopicPartition]
    transaction_version: int = 2  # 1: the marker epoch equals the data's (no KIP-890 part 2 bump)


class MarkerWriter(Protocol):
    async def write(self, marker: TxnMarker) -> dict[TopicPartition, int]:
        """One attempt: send WriteTxnMarkers to the leader of every partition (one
        request per leader). Returns an ErrorCode value per partition (NONE: marker
        written); a partition left out of the result is retried."""

    def partitions_added(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         coordinator_epoch: int, partitions: Iterable[TopicPartition]) -> None:
        """`partitions` are in the ongoing transaction of a transaction version 1
        producer (its AddPartitionsToTxn appended): tell their leaders, so that the
        producer's first batch there needs no verification call (KIP-890 part 1;
        PartitionLeader/TxnPartitionsAdded). Best effort: never waits, never raises; a
        leader not told asks as before."""


class Topology(Protocol):
    def txn_partition_for(self, transactional_id: str) -> int:
        """Partition of `TRANSACTION_STATE_TOPIC` owning the id (crc32 % N), -1 while the
        topic does not exist."""

    def offsets_partition_for(self, group_id: str) -> int:
        """Partition of `CONSUMER_OFFSETS_TOPIC` of the group, -1 while it does not exist."""

    def partition_exists(self, topic: str, partition: int) -> bool:
        """Whether the topic partition exists in the cluster metadata."""

    def txn_partition_count(self) -> int:
        """Partitions of `TRANSACTION_STATE_TOPIC` (0 while the topic does not exist)."""

    def metadata_version(self) -> int:
        """The finalized metadata.version (services.common.cluster.features): which
        formats the coordinator may write."""



# ---------------------------------------------------------------- results

@dataclass(frozen=True)
class InitProducerIdResult:
    """InitProducerId outcome: the error code, the (client-facing) producer id and
    epoch, and, when keepPreparedTxn kept a prepared transaction (KIP-939), that
    transaction's own pair as ongoing_txn_producer_id / _epoch (-1 otherwise)."""

    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1
    message: str = ""
    ongoing_txn_producer_id: int = -1
    ongoing_txn_producer_epoch: int = -1

    @property
    def kept_prepared(self) -> bool:
        """Whether a prepared transaction was kept (KIP-939 keepPreparedTxn)."""
        return self.ongoing_txn_producer_id >= 0


class EndTxnResult(NamedTuple):
    """EndTxn outcome: the error code, and the producer id and epoch the producer
    continues with (the epoch after the end-of-transaction bump; -1 on error)."""

    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True)
class DescribeResult:
    transactional_id: str
    error: ErrorCode
    summary: TxnStateSummary | None = None

