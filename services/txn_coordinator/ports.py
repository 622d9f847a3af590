"""The ports, settings and results of the transaction coordinator
(`services.txn_coordinator.coordinator.TransactionCoordinator`).

The coordinator reaches the transaction log, the partition leaders' markers and the
cluster topology through the small ports below (`TxnLogStore`, `MarkerWriter`,
`Topology`), implemented over the cluster in `adapters.py` and by fakes in unit
tests. Every protocol outcome is an `ErrorCode` value.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol

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

# How long a partition leader may work on a WriteTxnMarkers request after receiving
# it before it drops the markers it has not appended (at least the leaders'
# services.partition_leader.replica_manager.MARKER_TIMEOUT_MS).
MARKER_LEADER_DEADLINE_MS = 25_000

OFFSETS_TOPIC = "__consumer_offsets"


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
    """The `__transaction_state` topic."""

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


class Topology(Protocol):
    def txn_partition_for(self, transactional_id: str) -> int:
        """Partition of `__transaction_state` owning the id (crc32 % N), -1 while the
        topic does not exist."""

    def offsets_partition_for(self, group_id: str) -> int:
        """Partition of `__consumer_offsets` of the group, -1 while it does not exist."""

    def partition_exists(self, topic: str, partition: int) -> bool:
        """Whether the topic partition exists in the cluster metadata."""

    def txn_partition_count(self) -> int:
        """Partitions of `__transaction_state` (0 while the topic does not exist)."""



# ---------------------------------------------------------------- config and results

@dataclass(frozen=True)
class TxnCoordinatorConfig:
    """Coordinator settings. Durations in ms, sizes in bytes."""

    max_transaction_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 604_800_000
    abort_timed_out_interval_ms: int = 10_000
    remove_expired_interval_ms: int = 3_600_000
    load_buffer_bytes: int = 5_242_880
    retry_backoff_ms: int = 20
    retry_backoff_max_ms: int = 1_000
    end_txn_completion_wait_ms: int = 0
    previous_completion_wait_ms: int = 5_000
    batch_linger_ms: int = 1
    pause_after_prepare_ms: int = 0
    prepared_max_ms: int = 3_600_000
    producer_id_expiration_ms: int = 86_400_000
    producer_id_expiration_check_interval_ms: int = 600_000

    @classmethod
    def from_props(cls, get_int: Callable[[str, int], int]) -> "TxnCoordinatorConfig":
        """Read the settings through `get_int(key, default)` (ServiceConfig.get_int):

        transaction.max.timeout.ms (900000; the design doc's max.transaction.timeout.ms
            is accepted too): largest transaction.timeout.ms of InitProducerId.
        transactional.id.expiration.ms (604800000): idle time after which a
            transactional.id without a transaction is expired (tombstone); also how
            long the producer-id binding of a transactional producer outlives its
            use once the transactional.id no longer holds that producer id.
        producer.id.expiration.ms (86400000): how long the producer-id binding of an
            idempotent producer outlives its last use (InitProducerId, or a partition
            leader's or group coordinator's VerifyProducerId).
        producer.id.expiration.check.interval.ms (600000): period of the binding
            expiration scan.
        transaction.abort.timed.out.transaction.cleanup.interval.ms (10000): period of
            the scan that aborts timed-out transactions.
        transaction.remove.expired.transaction.cleanup.interval.ms (3600000): period of
            the transactional.id expiration scan.
        transaction.state.log.load.buffer.size (5242880): bytes per Fetch when loading.
        exactly.txn.retry.backoff.ms (20) / exactly.txn.retry.backoff.max.ms (1000):
            backoff of marker, completion-append and load retries.
        exactly.txn.end.completion.wait.ms (0): how long EndTxn waits for the
            markers and the Complete record before answering NONE anyway (0: it
            answers once the Prepare record is written, as Kafka does).
        exactly.txn.previous.completion.wait.ms (5000): how long AddPartitionsToTxn
            and AddOffsetsToTxn of a producer's next transaction wait for the previous
            one to complete (markers written) before
            answering CONCURRENT_TRANSACTIONS.
        exactly.txn.batch.linger.ms (1): while several producers commit at once
            (`recently_active`), how long a transaction-log append or marker request
            waits for others to join it (adapters.Linger; 0: never).
        transaction.prepared.max.ms (3600000): how long a transaction sealed by
            PrepareTxn (two-phase commit) may wait for its EndTxn; it replaces
            transaction.timeout.ms while prepared. Past it the coordinator aborts the
            transaction with an epoch bump, as for a timeout.
        exactly.test.pause.after.prepare.ms (0): test hook; sleep between the Prepare
            record of a client's EndTxn and its markers, to widen the window in which a
            coordinator crash leaves a prepared transaction to roll forward.
        """
        d = cls()
        max_timeout = get_int("max.transaction.timeout.ms", d.max_transaction_timeout_ms)
        return cls(
            max_transaction_timeout_ms=get_int("transaction.max.timeout.ms", max_timeout),
            transactional_id_expiration_ms=get_int("transactional.id.expiration.ms",
                                                   d.transactional_id_expiration_ms),
            abort_timed_out_interval_ms=get_int("transaction.abort.timed.out.transaction.cleanup.interval.ms",
                                                d.abort_timed_out_interval_ms),
            remove_expired_interval_ms=get_int("transaction.remove.expired.transaction.cleanup.interval.ms",
                                               d.remove_expired_interval_ms),
            load_buffer_bytes=get_int("transaction.state.log.load.buffer.size", d.load_buffer_bytes),
            retry_backoff_ms=get_int("exactly.txn.retry.backoff.ms", d.retry_backoff_ms),
            retry_backoff_max_ms=get_int("exactly.txn.retry.backoff.max.ms", d.retry_backoff_max_ms),
            end_txn_completion_wait_ms=get_int("exactly.txn.end.completion.wait.ms",
                                               d.end_txn_completion_wait_ms),
            previous_completion_wait_ms=get_int("exactly.txn.previous.completion.wait.ms",
                                                d.previous_completion_wait_ms),
            batch_linger_ms=get_int("exactly.txn.batch.linger.ms", d.batch_linger_ms),
            pause_after_prepare_ms=get_int("exactly.test.pause.after.prepare.ms", d.pause_after_prepare_ms),
            prepared_max_ms=get_int("transaction.prepared.max.ms", d.prepared_max_ms),
            producer_id_expiration_ms=get_int("producer.id.expiration.ms", d.producer_id_expiration_ms),
            producer_id_expiration_check_interval_ms=get_int("producer.id.expiration.check.interval.ms",
                                                             d.producer_id_expiration_check_interval_ms),
        )


@dataclass(frozen=True)
class InitProducerIdResult:
    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1
    message: str = ""
    kept_prepared: bool = False  # KIP-939 keepPreparedTxn: PID/epoch are the prepared transaction's


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

