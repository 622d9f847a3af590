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
from services.common.settings import TxnCoordinatorSchema, settings_from_lookup

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

_DEFAULTS = TxnCoordinatorSchema()  # the schema's defaults, as attributes


@dataclass(frozen=True)
class TxnCoordinatorConfig:
    """Coordinator settings. Durations in ms, sizes in bytes."""

    max_transaction_timeout_ms: int = _DEFAULTS.max_timeout_ms
    transactional_id_expiration_ms: int = _DEFAULTS.transactional_id_expiration_ms
    abort_timed_out_interval_ms: int = _DEFAULTS.abort_timed_out_interval_ms
    remove_expired_interval_ms: int = _DEFAULTS.remove_expired_interval_ms
    load_buffer_bytes: int = _DEFAULTS.state_log_load_buffer_size
    retry_backoff_ms: int = _DEFAULTS.txn_retry_backoff_ms
    retry_backoff_max_ms: int = _DEFAULTS.txn_retry_backoff_max_ms
    end_txn_completion_wait_ms: int = _DEFAULTS.txn_end_completion_wait_ms
    previous_completion_wait_ms: int = _DEFAULTS.txn_previous_completion_wait_ms
    batch_linger_ms: int = _DEFAULTS.txn_batch_linger_ms
    pause_after_prepare_ms: int = _DEFAULTS.test_pause_after_prepare_ms
    prepared_max_ms: int = _DEFAULTS.transaction_prepared_max_ms
    producer_id_expiration_ms: int = _DEFAULTS.producer_id_expiration_ms
    producer_id_expiration_check_interval_ms: int = _DEFAULTS.producer_id_expiration_check_interval_ms

    @classmethod
    def from_settings(cls, s: TxnCoordinatorSchema) -> "TxnCoordinatorConfig":
        """From the process's parsed settings (keys, defaults and docs:
        services.common.settings.TxnCoordinatorSchema):

        transaction.max.timeout.ms (or the design doc's max.transaction.timeout.ms):
            largest transaction.timeout.ms of InitProducerId.
        transactional.id.expiration.ms: idle time after which a transactional.id
            without a transaction is expired (tombstone); also how long the
            producer-id binding of a transactional producer outlives its use once the
            transactional.id no longer holds that producer id.
        producer.id.expiration.ms: how long the producer-id binding of an idempotent
            producer outlives its last use (InitProducerId, or a partition leader's or
            group coordinator's VerifyProducerId).
        producer.id.expiration.check.interval.ms: period of the binding expiration scan.
        transaction.abort.timed.out.transaction.cleanup.interval.ms: period of the scan
            that aborts timed-out transactions.
        transaction.remove.expired.transaction.cleanup.interval.ms: period of the
            transactional.id expiration scan.
        transaction.state.log.load.buffer.size: bytes per Fetch when loading.
        exactly.txn.retry.backoff.ms / exactly.txn.retry.backoff.max.ms: backoff of
            marker, completion-append and load retries.
        exactly.txn.end.completion.wait.ms: how long EndTxn waits for the markers and
            the Complete record before answering NONE anyway (0: it answers once the
            Prepare record is written, as Kafka does).
        exactly.txn.previous.completion.wait.ms: how long AddPartitionsToTxn and
            AddOffsetsToTxn of a producer's next transaction wait for the previous one
            to complete (markers written) before answering CONCURRENT_TRANSACTIONS.
        exactly.txn.batch.linger.ms: while several producers commit at once
            (`recently_active`), how long a transaction-log append or marker request
            waits for others to join it (adapters.Linger; 0: never).
        transaction.prepared.max.ms: how long a transaction sealed by PrepareTxn
            (two-phase commit) may wait for its EndTxn; it replaces
            transaction.timeout.ms while prepared. Past it the coordinator aborts the
            transaction with an epoch bump, as for a timeout.
        exactly.test.pause.after.prepare.ms: test hook; sleep between the Prepare
            record of a client's EndTxn and its markers, to widen the window in which a
            coordinator crash leaves a prepared transaction to roll forward.
        """
        return cls(
            max_transaction_timeout_ms=s.max_timeout_ms,
            transactional_id_expiration_ms=s.transactional_id_expiration_ms,
            abort_timed_out_interval_ms=s.abort_timed_out_interval_ms,
            remove_expired_interval_ms=s.remove_expired_interval_ms,
            load_buffer_bytes=s.state_log_load_buffer_size,
            retry_backoff_ms=s.txn_retry_backoff_ms,
            retry_backoff_max_ms=s.txn_retry_backoff_max_ms,
            end_txn_completion_wait_ms=s.txn_end_completion_wait_ms,
            previous_completion_wait_ms=s.txn_previous_completion_wait_ms,
            batch_linger_ms=s.txn_batch_linger_ms,
            pause_after_prepare_ms=s.test_pause_after_prepare_ms,
            prepared_max_ms=s.transaction_prepared_max_ms,
            producer_id_expiration_ms=s.producer_id_expiration_ms,
            producer_id_expiration_check_interval_ms=s.producer_id_expiration_check_interval_ms,
        )

    @classmethod
    def from_props(cls, get_int: Callable[[str, int], int]) -> "TxnCoordinatorConfig":
        """`from_settings` of the settings a `get_int(key, default)` lookup gives
        (services.common.settings.settings_from_lookup). Raises ConfigurationError."""
        return cls.from_settings(settings_from_lookup(TxnCoordinatorSchema, get_int))


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

