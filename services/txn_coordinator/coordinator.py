"""The transaction coordinator: PIDs, epochs, the transaction state machine, two-phase
commit with transaction markers, timeouts and transactional.id expiration.

Follows the design doc sections "Transaction Coordinator", "Transaction Log",
"Transaction Coordinator Startup", "Transaction Coordinator Request Handling",
"Coordinator-side Transaction Expiration" and "Coordinator TransactionalId
Expiration", with Kafka's TransactionCoordinator.scala where the doc is silent
(KIP-360 epoch checks, PID rotation on epoch exhaustion, fencing epoch bump).

Pure asyncio, no gRPC: the transaction log, the markers and the cluster topology are
reached through the small ports below (`TxnLogStore`, `MarkerWriter`, `Topology`),
implemented over the cluster in `adapters.py` and by fakes in unit tests. Every
protocol outcome is an `ErrorCode` value; exceptions are bugs.

State changes follow prepare -> append to the log -> complete (state.py). All request
handling runs on one event loop; the checks and the prepare of a request happen
without an `await` in between, so a second request sees the pending transition and
gets CONCURRENT_TRANSACTIONS.

Commit/abort: EndTxn appends PrepareCommit/PrepareAbort (the synchronisation point),
then a background task writes the markers to the leader of every partition of the
transaction (WriteTxnMarkers, grouped by leader, with the coordinator epoch), retried
with backoff until each partition answered, then appends CompleteCommit/
CompleteAbort -- unless the producer's next transaction already asks for its first
partition: its Ongoing record then completes this transaction too (the handover,
`TransactionMetadata.prepare_next_transaction`). EndTxn answers NONE as soon as the
Prepare record is in the log; it waits up to `exactly.txn.end.completion.wait.ms` for the completion so that the
producer's next transaction does not start with CONCURRENT_TRANSACTIONS.
`__consumer_offsets` partitions added by AddOffsetsToTxn get their marker the same
way, from the partition leader of that partition.

Settings (Kafka keys unless prefixed `exactly.`), see `TxnCoordinatorConfig.from_settings`.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Awaitable, Callable, Iterable, NamedTuple, Protocol

from exactly_wire.clock import Clock, monotonic_ms, wall_clock_ms
from exactly_wire.error_codes import RETRIABLE, ErrorCode
from exactly_wire.types import TopicPartition
from services.common.owned import NotOwner, OwnedPartition, PartitionOwner, RetryLater, code_name
from services.common.pid_binding import refusal, refusal_code
from services.common.settings import TxnCoordinatorSchema, settings_from_lookup

from . import metrics, txn_log
from .pid_manager import ProducerIdAllocationError, ProducerIdManager
from .state import (COMPLETED_STATES, NO_PRODUCER_EPOCH, GroupAssignment, TransactionMetadata, TxnState,
                    TxnStateSummary, TxnTransitMetadata, is_epoch_exhausted)

log = logging.getLogger(__name__)

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


class _TxnPartition(OwnedPartition):
    """One owned partition of `__transaction_state` and its transaction status cache:
    txns (transactional.id -> metadata), completions (transactional.id -> the task
    writing its markers and Complete record), groups (KIP-447 draft group assignments),
    error (corrupt log: the partition is disabled and answers NOT_COORDINATOR)."""

    def __init__(self, partition: int, coordinator_epoch: int, producer_id: int = -1,
                 producer_epoch: int = -1, retired_producer_id: int = -1):
        super().__init__(partition, coordinator_epoch, producer_id, producer_epoch, retired_producer_id)
        self.error: str | None = None
        self.txns: dict[str, TransactionMetadata] = {}
        self.completions: dict[str, asyncio.Task] = {}
        # The handover (TransactionMetadata.prepare_next_transaction): transactional.id ->
        # (PID, epoch) of its Prepare* transaction whose markers are all written, and
        # transactional.id -> how many AddPartitionsToTxn / AddOffsetsToTxn of its next
        # transaction wait for that completion.
        self.markers_written: dict[str, tuple[int, int]] = {}
        self.next_waiting: Counter[str] = Counter()
        # KIP-447 draft: group id -> {transactional.id -> its group assignment}, from
        # the group assignment records of this partition.
        self.groups: dict[str, dict[str, GroupAssignment]] = {}
        # Producer-id bindings of the producer ids p with p % n == partition (with
        # bind_producer_ids): producer id -> binding, and its last use (monotonic ms).
        self.bindings: dict[int, txn_log.ProducerIdBinding] = {}
        self.binding_used: dict[int, int] = {}

    def generation(self, group_id: str) -> int:
        """The newest generation of `group_id` a group-aware InitProducerId recorded
        here (-1: none)."""
        return max((a.generation_id for a in self.groups.get(group_id, {}).values()), default=-1)

    @property
    def serving(self) -> bool:
        return not self.loading and self.error is None


_NEED_PID = object()


# ---------------------------------------------------------------- coordinator

class TransactionCoordinator(PartitionOwner[_TxnPartition]):
    """Handles the transaction coordinator RPCs for the `__transaction_state`
    partitions this process owns (`on_elected` / `on_resigned`).

    log, markers, topology: the ports above; pids: PID allocation; clock: wall-clock
    ms (timestamps written to the transaction log); monotonic: ms of a monotonic clock
    (every duration: transaction.timeout.ms, transaction.prepared.max.ms, the
    expirations, the marker deadline; docs/design.md, "Clocks"); sleep: async (seconds) -> None
    (injected in tests); on_fenced(partition, coordinator_epoch): called (on the loop)
    when a newer owner of the partition exists (services.common.owned.PartitionOwner,
    CoordinatorOwnership.fenced). bind_producer_ids (on with the authorizer): every
    producer id is issued bound to a principal, the binding written to partition
    producer id % n of the log first (docs/design.md, "Producer-id bindings").
    """

    topic = "__transaction_state"

    def __init__(self, log_store: TxnLogStore, markers: MarkerWriter, topology: Topology,
                 pids: ProducerIdManager, config: TxnCoordinatorConfig | None = None,
                 clock: Clock = wall_clock_ms,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 on_fenced: Callable[[int, int], None] | None = None, bind_producer_ids: bool = False,
                 monotonic: Clock = monotonic_ms):
        self.config = config or TxnCoordinatorConfig()
        self._monotonic = monotonic
        self.bind_producer_ids = bind_producer_ids
        self._next_binding_partition = 0
        super().__init__(clock, sleep=sleep, on_fenced=on_fenced, retry_backoff_ms=self.config.retry_backoff_ms,
                         retry_backoff_max_ms=self.config.retry_backoff_max_ms)
        self._log = log_store
        self._markers = markers
        self._topology = topology
        self._pids = pids
        self._recent: dict[str, float] = {}  # transactional.id -> time.monotonic() of its last append

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the periodic scans (timed-out transactions, expired ids)."""
        self._spawn(None, self._every(self.config.abort_timed_out_interval_ms, self.abort_timed_out_transactions),
                    "txn-timeout-abort")
        self._spawn(None, self._every(self.config.remove_expired_interval_ms, self.expire_transactional_ids),
                    "txn-id-expiration")
        if self.bind_producer_ids:
            self._spawn(None, self._every(self.config.producer_id_expiration_check_interval_ms,
                                          self.expire_producer_id_bindings), "pid-binding-expiration")

    async def stop(self) -> None:
        """Cancel the scans and the work of every owned partition."""
        await super().stop()
        await self._pids.close()

    async def _every(self, interval_ms: int, fn: Callable[[], Awaitable[int]]) -> None:
        while True:
            await self._sleep(max(interval_ms, 1) / 1000)
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a scan bug must not stop later scans
                log.exception("periodic %s failed", getattr(fn, "__name__", fn))

    # ------------------------------------------------------------ ownership
    def _new_partition(self, partition: int, coordinator_epoch: int, producer_id: int, producer_epoch: int,
                       retired_producer_id: int) -> _TxnPartition:
        return _TxnPartition(partition, coordinator_epoch, producer_id, producer_epoch, retired_producer_id)

    async def on_elected(self, partition: int, coordinator_epoch: int, producer_id: int = -1,
                         producer_epoch: int = -1, retired_producer_id: int = -1) -> None:
        """This process now owns `__transaction_state` partition `partition` with
        `coordinator_epoch`: requests for its ids get COORDINATOR_LOAD_IN_PROGRESS
        while it is replayed from offset 0 to the high watermark; then prepared
        transactions are rolled forward and their timeouts run again
        ("Transaction Coordinator Startup"). Writer identity and fencing as
        PartitionOwner.on_elected."""
        await super().on_elected(partition, coordinator_epoch, producer_id, producer_epoch, retired_producer_id)

    async def on_resigned(self, partition: int) -> None:
        """Another coordinator owns `partition` now: forget its cache and stop its
        marker and completion work (requests get NOT_COORDINATOR)."""
        owned = partition in self._parts
        await super().on_resigned(partition)
        if owned:
            metrics.TRANSACTIONAL_IDS.remove_partition(partition)
            metrics.PRODUCER_ID_BINDINGS.remove_partition(partition)

    def recently_active(self, window_s: float = 0.02) -> int:
        """How many transactional ids had a transition appended in the last `window_s`
        seconds (at least; the count stops at 2): producers committing through this
        coordinator at once."""
        cutoff = time.monotonic() - window_s
        seen = 0
        for tid, at in reversed(self._recent.items()):
            if at < cutoff:
                break
            seen += 1
            if seen >= 2:
                break
        return seen

    def _note_active(self, tid: str) -> None:
        recent = self._recent
        recent.pop(tid, None)
        recent[tid] = time.monotonic()  # newest last
        if len(recent) > 1024:
            for old in list(itertools.islice(recent, len(recent) - 64)):
                del recent[old]

    def state_counts(self) -> dict[str, int]:
        """Kafka state name -> transactional ids in that state, over the loaded owned
        partitions (metrics)."""
        counts: dict[str, int] = {}
        for part in self._parts.values():
            if part.loading or part.error:
                continue
            for md in part.txns.values():
                counts[md.state.kafka_name] = counts.get(md.state.kafka_name, 0) + 1
        return counts

    def _dropped(self, part: _TxnPartition) -> None:
        part.completions.clear()

    async def _append_fence(self, part: _TxnPartition, batch: bytes) -> int:
        return await self._log.append(part.partition, batch)

    def _lookup(self, transactional_id: str, group_id: str = "") -> tuple[ErrorCode, _TxnPartition | None]:
        """The owned partition holding `transactional_id`: partition crc32(key) % n
        with key = the consumer group of a group-aware producer (KIP-447 draft: every
        producer of a group lives with one coordinator), else the transactional.id."""
        partition = self._topology.txn_partition_for(group_id or transactional_id)
        if partition < 0:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, None
        part = self._parts.get(partition)
        if part is None or part.error is not None:
            return ErrorCode.NOT_COORDINATOR, None
        if part.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, None
        return ErrorCode.NONE, part

    # ------------------------------------------------------------ the log
    async def _append(self, part: _TxnPartition, md: TransactionMetadata, transit: TxnTransitMetadata,
                      on_complete: Callable[[], None] | None = None) -> ErrorCode:
        """Append `transit` (md must have it pending) and complete or cancel it.
        Returns NONE, NOT_COORDINATOR (ownership lost meanwhile),
        COORDINATOR_LOAD_IN_PROGRESS (outcome unknown: the partition reloads),
        COORDINATOR_NOT_AVAILABLE (retriable log failure) or UNKNOWN_SERVER_ERROR.

        The outcome is applied from the append's own result, as Kafka applies it in
        the append callback, whatever becomes of the caller: the append and its
        application run in a task of their own, shielded from the caller's
        cancellation (a client deadline, a disconnect, a broken tunnel stream). A
        record that waits in the group-commit queue (adapters.ClusterTxnLog) goes out
        even when its request is abandoned, so the transition completes when the
        record is written, is cancelled when the append failed, and the partition
        reloads when the outcome is unknown: the cache always agrees with the log.
        `on_complete` (no arguments) runs once the transition completed, e.g. to
        start the completion of a Prepare record: in the caller before `_append`
        returns NONE, or, when the caller was cancelled, as soon as the append task
        completed the transition. Cancelling the caller raises CancelledError in the
        caller only."""
        if not self._owns(part):
            md.cancel_transition()
            return ErrorCode.NOT_COORDINATOR
        batch = txn_log.encode_batch(md.transactional_id, transit, self._clock(),
                                     producer_id=part.producer_id, producer_epoch=part.producer_epoch)
        self._note_active(md.transactional_id)
        append = self._spawn(None, self._append_and_apply(part, md, transit, batch),
                             f"txn-append-{md.transactional_id}")
        try:
            code = await asyncio.shield(append)
        except asyncio.CancelledError:
            if on_complete is not None:
                append.add_done_callback(
                    lambda t: on_complete() if not t.cancelled() and t.exception() is None
                    and t.result() == ErrorCode.NONE else None)
            raise
        if code == ErrorCode.NONE and on_complete is not None:
            on_complete()
        return code

    async def _append_and_apply(self, part: _TxnPartition, md: TransactionMetadata, transit: TxnTransitMetadata,
                                batch: bytes) -> ErrorCode:
        """The body of `_append`: one append of `batch`, then its outcome applied to md."""
        try:
            code = await self._log.append(part.partition, batch)
        except BaseException:
            md.cancel_transition()
            raise
        if not self._owns(part):
            return ErrorCode.NOT_COORDINATOR
        if code == ErrorCode.NONE:
            start, prepared = md.txn_start_timestamp, md.prepared_timestamp
            md.complete_transition(transit)
            self._note_applied(md, start, prepared)
            return ErrorCode.NONE
        if code in AMBIGUOUS_APPEND_ERRORS:
            # The record may be in the log: neither complete nor cancel; learn the
            # outcome from the log itself (the reload fences first, so every earlier
            # record of ours is then committed or gone for good).
            log.warning("appending %s of %r to __transaction_state-%d: outcome unknown (%s); reloading the "
                        "partition from its log", transit.state.kafka_name, md.transactional_id, part.partition,
                        code_name(code))
            self._restart(part)
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        md.cancel_transition()
        if self._is_fenced(part, code):
            return ErrorCode.NOT_COORDINATOR
        log.warning("appending %s of %r to %s-%d failed: %s", transit.state.kafka_name, md.transactional_id,
                    "__transaction_state", part.partition, code_name(code))
        return ErrorCode.COORDINATOR_NOT_AVAILABLE if code in RETRIABLE else ErrorCode.UNKNOWN_SERVER_ERROR

    def _note_applied(self, md: TransactionMetadata, start_before: int, prepared_before: int) -> None:
        """After a transition was applied: the monotonic times its timeouts count from
        (a new start or prepare timestamp restarts the matching one)."""
        now = self._monotonic()
        md.updated_monotonic_ms = now
        if md.txn_start_timestamp != start_before or md.started_monotonic_ms is None:
            md.started_monotonic_ms = now
        if md.prepared_timestamp != prepared_before or md.prepared_monotonic_ms is None:
            md.prepared_monotonic_ms = now

    # ------------------------------------------------------------ InitProducerId
    async def init_producer_id(self, transactional_id: str | None, transaction_timeout_ms: int,
                               expected: tuple[int, int] | None = None,
                               group: GroupAssignment | None = None, principal: str = "",
                               keep_prepared_txn: bool = False) -> InitProducerIdResult:
        """InitProducerId (design doc "Transaction Coordinator Request Handling", InitPid).

        transactional_id None/"": a fresh PID with epoch 0 (idempotent producer).
        Otherwise: transaction_timeout_ms must be in (0, transaction.max.timeout.ms]
        (INVALID_TRANSACTION_TIMEOUT); expected = (producer_id, producer_epoch) of
        KIP-360 or None; group: KIP-447 draft group-aware init, see `_init_group`
        (ILLEGAL_GENERATION, PENDING_TRANSACTION, INVALID_GROUP_ID).
        An ongoing transaction of the id (also one sealed by PrepareTxn: the
        keepPreparedTxn=false behaviour of KIP-939) is aborted with a bumped epoch first and the
        answer is CONCURRENT_TRANSACTIONS until it completed; a prepared one ->
        CONCURRENT_TRANSACTIONS. Then the epoch is bumped (a new PID with epoch 0 when
        the epoch is exhausted) and the record appended.
        keep_prepared_txn (KIP-939 keepPreparedTxn=true, classic form only): a transaction
        sealed by PrepareTxn is kept open instead, nothing is appended, and the answer is
        NONE with its PID and epoch (kept_prepared=True), so the caller completes it with
        EndTxn from what its external transaction manager recorded; an ongoing transaction
        that is not prepared is still aborted (it cannot have been recorded anywhere).
        Other errors: NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
        COORDINATOR_NOT_AVAILABLE, PRODUCER_FENCED (KIP-360 mismatch).

        With bind_producer_ids the producer id handed out is bound to `principal`
        (and the transactional.id) in the log before the answer: an idempotent
        producer gets a producer id of a partition this coordinator owns
        (NOT_COORDINATOR when it owns none that is loaded), a transactional one a
        producer id of its transactional.id's partition."""
        if not transactional_id and self.bind_producer_ids:
            return await self._init_bound_idempotent(principal)
        if not transactional_id:
            try:
                return InitProducerIdResult(ErrorCode.NONE, await self._pids.generate(), 0)
            except ProducerIdAllocationError as exc:
                return InitProducerIdResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, message=str(exc))
        if not 0 < transaction_timeout_ms <= self.config.max_transaction_timeout_ms:
            return InitProducerIdResult(
                ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                message=f"transaction.timeout.ms {transaction_timeout_ms} not in (0, "
                        f"{self.config.max_transaction_timeout_ms}] (transaction.max.timeout.ms)")
        if "\0" in transactional_id:
            return InitProducerIdResult(ErrorCode.INVALID_REQUEST, message="transactional.id holds a NUL character")
        group_id = ""
        if group is not None:
            blocked = await self._init_group(transactional_id, group)
            if blocked is not None:
                return blocked
            group_id = group.group_id
        while True:
            try:
                await self._pids.ensure_available()
            except ProducerIdAllocationError as exc:
                return InitProducerIdResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, message=str(exc))
            outcome = self._prepare_init(transactional_id, transaction_timeout_ms, expected, group_id,
                                         keep_prepared_txn and group is None)
            if outcome is not _NEED_PID:
                break
        if isinstance(outcome, InitProducerIdResult):
            return outcome
        kind, part, md, transit = outcome
        if kind == "fence":
            err = await self._fence_and_abort(part, md)
            return InitProducerIdResult(err or ErrorCode.CONCURRENT_TRANSACTIONS,
                                        message="aborting the ongoing transaction of the previous producer")
        if self.bind_producer_ids:
            wanted = txn_log.ProducerIdBinding(principal, transactional_id, self._clock())
            current = part.bindings.get(transit.producer_id)
            if current is None or (current.principal, current.transactional_id) != (principal, transactional_id):
                err = await self._append_bindings(part, [(transit.producer_id, wanted)])
                if err:
                    md.cancel_transition()
                    return InitProducerIdResult(err, message="the producer id could not be bound; retry")
            else:
                part.binding_used[transit.producer_id] = self._monotonic()
        err = await self._append(part, md, transit)
        if err:
            return InitProducerIdResult(err)
        return InitProducerIdResult(ErrorCode.NONE, transit.producer_id, transit.producer_epoch)

    async def _init_bound_idempotent(self, principal: str) -> InitProducerIdResult:
        """InitProducerId of an idempotent producer with bind_producer_ids: a fresh
        producer id p with p % n a loaded partition this coordinator owns, bound to
        `principal` by a record in partition p % n before it is handed out."""
        n = self._topology.txn_partition_count()
        if n <= 0:
            return InitProducerIdResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, message="no __transaction_state yet")
        while True:
            serving = sorted(p for p, part in self._parts.items() if part.serving and p < n)
            if not serving:
                return InitProducerIdResult(ErrorCode.NOT_COORDINATOR,
                                            message="this coordinator owns no loaded __transaction_state partition")
            # One residue at a time, in turn: the bindings spread over the owned partitions.
            self._next_binding_partition = (self._next_binding_partition + 1) % len(serving)
            pid = self._pids.next_pid_in({serving[self._next_binding_partition]}, n)
            if pid is not None:
                break
            try:
                await self._pids.ensure_available()
            except ProducerIdAllocationError as exc:
                return InitProducerIdResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, message=str(exc))
        part = self._parts.get(pid % n)
        if part is None or not part.serving:
            return InitProducerIdResult(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        err = await self._append_bindings(part, [(pid, txn_log.ProducerIdBinding(principal, "", self._clock()))])
        if err:
            return InitProducerIdResult(err, message="the producer id could not be bound; retry")
        return InitProducerIdResult(ErrorCode.NONE, pid, 0)

    async def _append_bindings(self, part: _TxnPartition,
                               items: list[tuple[int, txn_log.ProducerIdBinding | None]]) -> ErrorCode:
        """Append binding records (None: the tombstone) to `part` as one batch and,
        once written, apply them to its bindings. Returns NONE, NOT_COORDINATOR (not
        the owner any more) or COORDINATOR_NOT_AVAILABLE (the append failed or its
        outcome is unknown: a binding of a producer id never handed out, or a
        tombstone not applied, is harmless and expires or is retried)."""
        if not self._owns(part):
            return ErrorCode.NOT_COORDINATOR
        now = self._clock()
        batch = txn_log.encode_binding_batch(items, now, producer_id=part.producer_id,
                                             producer_epoch=part.producer_epoch)
        code = await self._log.append(part.partition, batch)
        if not self._owns(part):
            return ErrorCode.NOT_COORDINATOR
        if code != ErrorCode.NONE:
            if self._is_fenced(part, code):
                return ErrorCode.NOT_COORDINATOR
            log.warning("appending %d producer-id binding records to __transaction_state-%d failed: %s",
                        len(items), part.partition, code_name(code))
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        for pid, binding in items:
            if binding is None:
                part.bindings.pop(pid, None)
                part.binding_used.pop(pid, None)
            else:
                part.bindings[pid] = binding
                part.binding_used[pid] = self._monotonic()
        metrics.PRODUCER_ID_BINDINGS.set(part.partition, len(part.bindings))
        return ErrorCode.NONE

    def verify_producer_id(self, producer_id: int, principal: str, transactional_id: str,
                           transactional: bool) -> tuple[ErrorCode, str]:
        """VerifyProducerId: whether `producer_id` is bound to `principal` (and, for a
        transactional batch, to `transactional_id`), from the bindings of partition
        producer_id % n. A binding found counts as a use (it expires
        producer.id.expiration.ms / transactional.id.expiration.ms after its last
        use). Returns (NONE, ""), (the refusal code, why) — never issued, expired,
        another principal's or another transactional.id's — or NOT_COORDINATOR,
        COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE (ask again)."""
        n = self._topology.txn_partition_count()
        if n <= 0 or producer_id < 0:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE if n <= 0 else refusal_code(transactional), \
                f"producer id {producer_id} was not issued by a transaction coordinator of this cluster"
        part = self._parts.get(producer_id % n)
        if part is None or part.error is not None:
            return ErrorCode.NOT_COORDINATOR, ""
        if part.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ""
        binding = part.bindings.get(producer_id)
        why = refusal(binding, producer_id, principal, transactional_id, transactional)
        if why is not None:
            return refusal_code(transactional), why
        part.binding_used[producer_id] = self._monotonic()
        return ErrorCode.NONE, ""

    async def expire_producer_id_bindings(self) -> int:
        """Write tombstones for, and forget, the expired producer-id bindings of the
        loaded owned partitions: an idempotent producer's binding unused for
        producer.id.expiration.ms; a transactional producer's binding whose
        transactional.id no longer holds the producer id (expired, or rotated to
        another producer id) and unused for transactional.id.expiration.ms. One
        batch per partition and up to 1000 records; a failed append is retried at
        the next scan. Returns the number expired. Use times are monotonic ms (a
        binding loaded from the log counts as used at the load)."""
        now = self._monotonic()
        expired = 0
        for part in list(self._parts.values()):
            if not part.serving:
                continue
            gone = []
            for pid, b in part.bindings.items():
                used = part.binding_used.setdefault(pid, now)
                if not b.transactional_id:
                    if used + self.config.producer_id_expiration_ms <= now:
                        gone.append((pid, used))
                    continue
                md = part.txns.get(b.transactional_id)
                if md is not None and pid in (md.producer_id, md.last_producer_id):
                    continue
                if used + self.config.transactional_id_expiration_ms <= now:
                    gone.append((pid, used))
            for i in range(0, len(gone), 1000):
                # Not one used (or rebound) since the scan looked at it.
                chunk = [pid for pid, used in gone[i:i + 1000] if part.binding_used.get(pid) == used]
                if chunk and await self._append_bindings(part, [(pid, None) for pid in chunk]) == ErrorCode.NONE:
                    expired += len(chunk)
        if expired:
            log.info("expired %d producer-id bindings", expired)
        return expired

    def _new_pid(self, part: _TxnPartition) -> int | None:
        """The next producer id for a transactional.id of `part` (None: reserve a
        block first); with bind_producer_ids one whose binding lives in `part`."""
        if self.bind_producer_ids:
            return self._pids.next_pid_in({part.partition}, self._topology.txn_partition_count())
        return self._pids.next_pid()

    def _prepare_init(self, tid: str, timeout_ms: int, expected: tuple[int, int] | None, group_id: str,
                      keep_prepared: bool = False):
        err, part = self._lookup(tid, group_id)
        if err:
            return InitProducerIdResult(err)
        now = self._clock()
        md = part.txns.get(tid)
        if md is None:
            pid = self._new_pid(part)
            if pid is None:
                return _NEED_PID
            md = TransactionMetadata(tid, pid, txn_timeout_ms=timeout_ms, txn_last_update_timestamp=now,
                                     group=part.groups.get(group_id, {}).get(tid))
            part.txns[tid] = md
            metrics.TRANSACTIONAL_IDS.set(part.partition, len(part.txns))
        if md.pending_transition_in_progress:
            return InitProducerIdResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        if expected is not None and not _valid_producer_id(md, *expected):
            return InitProducerIdResult(ErrorCode.PRODUCER_FENCED,
                                        message=f"producer id {expected[0]} epoch {expected[1]} is not current")
        state = md.state
        if state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return InitProducerIdResult(ErrorCode.CONCURRENT_TRANSACTIONS,
                                        message="the previous transaction is completing")
        if state is TxnState.ONGOING and keep_prepared and md.is_prepared:
            log.info("InitProducerId for %r keeps its prepared transaction (PID %d epoch %d)", tid,
                     md.producer_id, md.producer_epoch)
            return InitProducerIdResult(ErrorCode.NONE, md.producer_id, md.producer_epoch, kept_prepared=True)
        if state is TxnState.ONGOING:
            return "fence", part, md, None
        if state not in COMPLETED_STATES:
            log.error("InitProducerId for %r in unexpected state %s", tid, state.kafka_name)
            return InitProducerIdResult(ErrorCode.UNKNOWN_SERVER_ERROR)
        # With bindings a producer id must live in its transactional.id's partition; one
        # issued before bindings were on is replaced, as an exhausted one is.
        misplaced = self.bind_producer_ids and md.producer_epoch >= 0 and \
            md.producer_id % max(self._topology.txn_partition_count(), 1) != part.partition
        if misplaced or (md.is_producer_epoch_exhausted and (expected is None or expected[1] == md.producer_epoch)):
            new_pid = self._new_pid(part)
            if new_pid is None:
                return _NEED_PID
            transit = md.prepare_producer_id_rotation(new_pid, timeout_ms, now, expected is not None)
        else:
            transit = md.prepare_increment_producer_epoch(timeout_ms, expected[1] if expected else None, now)
            if isinstance(transit, ErrorCode):
                return InitProducerIdResult(transit)
        return "append", part, md, transit

    async def _init_group(self, tid: str, group: GroupAssignment) -> InitProducerIdResult | None:
        """KIP-447 draft, "Proposed Changes": the group-aware part of InitProducerId,
        on the partition of crc32(group id). Refuses a generation older than the newest
        one recorded for the group (ILLEGAL_GENERATION); aborts, with an epoch bump
        that fences them, the ongoing transactions of the group's other producers whose
        recorded assignment overlaps the new one, and answers PENDING_TRANSACTION
        (retriable) until none of those is open or completing; then appends the group
        assignment record (its own record type, replayed on load and failover).
        Returns None when the init may go on, else the answer."""
        if not group.group_id or "\0" in group.group_id:
            return InitProducerIdResult(ErrorCode.INVALID_GROUP_ID, message="invalid consumer group id")
        err, part = self._lookup(tid, group.group_id)
        if err:
            return InitProducerIdResult(err)
        known = part.generation(group.group_id)
        if group.generation_id < known:
            return InitProducerIdResult(ErrorCode.ILLEGAL_GENERATION,
                                        message=f"generation {group.generation_id} of group {group.group_id!r} "
                                                f"is older than {known}")
        waiting = []
        for other_tid, assignment in list(part.groups.get(group.group_id, {}).items()):
            other = part.txns.get(other_tid)
            if other_tid == tid or other is None or not assignment.partitions & group.partitions:
                continue
            if other.state in COMPLETED_STATES and not other.pending_transition_in_progress:
                continue
            waiting.append(other_tid)
            if other.state is TxnState.ONGOING and not other.pending_transition_in_progress:
                self._spawn(part, self._fence_and_abort(part, other), f"txn-group-fence-{other_tid}")
        if waiting:
            return InitProducerIdResult(ErrorCode.PENDING_TRANSACTION,
                                        message=f"transactions of {sorted(waiting)} on partitions newly assigned "
                                                "to this producer are being completed")
        if part.groups.get(group.group_id, {}).get(tid) == group:
            return None
        err = await self._append_group(part, tid, group)
        return InitProducerIdResult(err) if err else None

    async def _append_group(self, part: _TxnPartition, tid: str, assignment: GroupAssignment | None,
                            group_id: str | None = None) -> ErrorCode:
        """Append the group assignment record of `tid` (a tombstone when `assignment`
        is None; then `group_id` names the group) and apply it. An append whose outcome
        is unknown reloads the partition, as for any record of the log. As in
        `_append`, the outcome is applied from the append's own result in a task
        shielded from the caller's cancellation. Returns NONE, NOT_COORDINATOR,
        COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE or
        UNKNOWN_SERVER_ERROR."""
        group_id = assignment.group_id if assignment is not None else group_id
        if not self._owns(part):
            return ErrorCode.NOT_COORDINATOR
        batch = txn_log.encode_group_batch(group_id, tid, assignment, self._clock(),
                                           producer_id=part.producer_id, producer_epoch=part.producer_epoch)
        append = self._spawn(None, self._append_group_and_apply(part, tid, group_id, assignment, batch),
                             f"txn-append-group-{tid}")
        return await asyncio.shield(append)

    async def _append_group_and_apply(self, part: _TxnPartition, tid: str, group_id: str,
                                      assignment: GroupAssignment | None, batch: bytes) -> ErrorCode:
        """The body of `_append_group`: one append of `batch`, then its outcome applied."""
        code = await self._log.append(part.partition, batch)
        if not self._owns(part):
            return ErrorCode.NOT_COORDINATOR
        if code in AMBIGUOUS_APPEND_ERRORS:
            self._restart(part)
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if code:
            if self._is_fenced(part, code):
                return ErrorCode.NOT_COORDINATOR
            return ErrorCode.COORDINATOR_NOT_AVAILABLE if code in RETRIABLE else ErrorCode.UNKNOWN_SERVER_ERROR
        members = part.groups.setdefault(group_id, {})
        if assignment is None:
            members.pop(tid, None)
            if not members:
                del part.groups[group_id]
        else:
            members[tid] = assignment
        md = part.txns.get(tid)
        if md is not None:
            md.group = assignment
        return ErrorCode.NONE

    @staticmethod
    def _check_generation(part: _TxnPartition, md: TransactionMetadata, group_id: str,
                          generation_id: int) -> ErrorCode:
        """KIP-447 draft: a group-aware producer's request must carry the generation it
        initialised with, and no newer generation of the group may have been recorded
        since ("it will refuse to handle requests from the previous generation")."""
        if md.group is None or md.group.group_id != group_id:
            return ErrorCode.ILLEGAL_GENERATION
        if generation_id != md.group.generation_id or generation_id < part.generation(group_id):
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    # ------------------------------------------------------------ AddPartitions / AddOffsets
    def _check_producer(self, tid: str, producer_id: int, producer_epoch: int, group_id: str = "",
                        generation_id: int = -1
                        ) -> tuple[ErrorCode, _TxnPartition | None, TransactionMetadata | None]:
        err, part = self._lookup(tid, group_id)
        if err:
            return err, None, None
        md = part.txns.get(tid)
        if md is None or md.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING, None, None
        if producer_epoch != md.producer_epoch:
            return ErrorCode.PRODUCER_FENCED, None, None
        if group_id:
            err = self._check_generation(part, md, group_id, generation_id)
            if err:
                return err, None, None
        if md.pending_transition_in_progress:
            return ErrorCode.CONCURRENT_TRANSACTIONS, None, None
        return ErrorCode.NONE, part, md

    async def add_partitions_to_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                    partitions: Iterable[TopicPartition], verify_only: bool = False,
                                    group_id: str = "", generation_id: int = -1
                                    ) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn: add (topic, partition) pairs to the transaction, starting
        it (state Ongoing, timer started) with the first. Returns one ErrorCode per
        partition, the same for all: NONE, UNKNOWN_TOPIC_OR_PARTITION (some partition
        does not exist; none is added), INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED,
        CONCURRENT_TRANSACTIONS (pending change or a completing transaction),
        NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE.

        verify_only (KIP-890 part 1, asked by a partition leader before it accepts a
        producer's first transactional batch, and by the group coordinator before a
        TxnOffsetCommit): nothing is appended; per partition NONE when the id's
        transaction is Ongoing with this PID and epoch, not sealed or completing, and
        holds the partition, else INVALID_TXN_STATE; INVALID_PRODUCER_ID_MAPPING,
        PRODUCER_FENCED and the coordinator errors as above.

        group_id / generation_id (KIP-447 draft): a group-aware producer's group (its
        state lives on the group's partition) and the generation it initialised with;
        ILLEGAL_GENERATION for another or an outdated one (not checked on
        verify_only, whose askers know no generation)."""
        wanted = frozenset(partitions)
        if not wanted:
            return {}
        if verify_only:
            return self._verify(transactional_id, producer_id, producer_epoch, wanted, group_id)
        missing = [tp for tp in wanted if not self._topology.partition_exists(*tp)]
        if missing:
            return {tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION for tp in wanted}
        err = await self._add_partitions(transactional_id, producer_id, producer_epoch, wanted, group_id,
                                         generation_id)
        return {tp: err for tp in wanted}

    async def _previous_completed(self, tid: str, group_id: str = "", handover: bool = False) -> None:
        """Wait (up to exactly.txn.previous.completion.wait.ms) while the id's previous
        transaction completes: EndTxn answers once the Prepare record is durable, and the
        producer's next transaction may only start after the markers are written (so it
        never becomes visible before them). Waiting here instead of answering
        CONCURRENT_TRANSACTIONS at once saves the producer a retry loop; on timeout the
        caller answers CONCURRENT_TRANSACTIONS as before. handover: the waiter is the
        next transaction's first add, which may start that transaction with the record
        that also completes this one (`_add_partitions`); the completion then stops once
        the markers are written, without a Complete record of its own."""
        err, part = self._lookup(tid, group_id)
        task = part.completions.get(tid) if part is not None and not err else None
        if task is not None and not task.done() and self.config.previous_completion_wait_ms > 0:
            waiting = part.next_waiting
            if handover:
                waiting[tid] += 1
            try:
                await asyncio.wait({task}, timeout=self.config.previous_completion_wait_ms / 1000)
            finally:
                if handover:
                    waiting[tid] -= 1
                    if waiting[tid] <= 0:
                        del waiting[tid]

    def _verify(self, tid: str, producer_id: int, producer_epoch: int,
                wanted: frozenset[TopicPartition], group_id: str = "") -> dict[TopicPartition, ErrorCode]:
        err, part = self._lookup(tid, group_id)
        if err:
            return {tp: err for tp in wanted}
        md = part.txns.get(tid)
        if md is None or md.producer_id != producer_id:
            return {tp: ErrorCode.INVALID_PRODUCER_ID_MAPPING for tp in wanted}
        if producer_epoch != md.producer_epoch:
            return {tp: ErrorCode.PRODUCER_FENCED for tp in wanted}
        if md.pending_state is not None and md.pending_state is not TxnState.ONGOING:
            # Being ended or fenced right now (e.g. an epoch fence whose bump is not yet
            # written): retriable, as Kafka answers; the retry sees the outcome (the new
            # epoch: PRODUCER_FENCED) instead of a misleading INVALID_TXN_STATE.
            return {tp: ErrorCode.CONCURRENT_TRANSACTIONS for tp in wanted}
        if md.state is not TxnState.ONGOING or md.is_prepared:
            return {tp: ErrorCode.INVALID_TXN_STATE for tp in wanted}
        return {tp: ErrorCode.NONE if tp in md.partitions else ErrorCode.INVALID_TXN_STATE for tp in wanted}

    async def add_offsets_to_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                 group_id: str, consumer_group_id: str = "", generation_id: int = -1) -> ErrorCode:
        """AddOffsetsToTxn: add the `__consumer_offsets` partition of `group_id`
        (crc32(group_id) % offsets.topic.num.partitions) to the transaction, so that it
        gets the marker. Errors as `add_partitions_to_txn` (COORDINATOR_NOT_AVAILABLE
        while `__consumer_offsets` does not exist; INVALID_REQUEST for an empty group).
        consumer_group_id / generation_id: a group-aware producer's, as there."""
        if not group_id:
            return ErrorCode.INVALID_REQUEST
        partition = self._topology.offsets_partition_for(group_id)
        if partition < 0:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return await self._add_partitions(transactional_id, producer_id, producer_epoch,
                                          frozenset({(OFFSETS_TOPIC, partition)}), consumer_group_id, generation_id)

    async def _add_partitions(self, tid: str, producer_id: int, producer_epoch: int,
                              wanted: frozenset[TopicPartition], group_id: str = "",
                              generation_id: int = -1) -> ErrorCode:
        try:
            await self._previous_completed(tid, group_id, handover=True)
            return await self._add_partitions_now(tid, producer_id, producer_epoch, wanted, group_id, generation_id)
        finally:
            self._resume_completion(tid, group_id)

    def _resume_completion(self, tid: str, group_id: str) -> None:
        """A completion that stopped for the handover, when the add that was to take
        over did not (refused, failed, or never came): write the Complete record after
        all (the markers are written again first; they are idempotent)."""
        err, part = self._lookup(tid, group_id)
        md = part.txns.get(tid) if part is not None and not err else None
        if (md is not None and md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
                and not md.pending_transition_in_progress and tid not in part.completions
                and not part.next_waiting.get(tid)):
            self._start_completion(part, md, md.snapshot(), from_client=False)

    async def _add_partitions_now(self, tid: str, producer_id: int, producer_epoch: int,
                                  wanted: frozenset[TopicPartition], group_id: str, generation_id: int) -> ErrorCode:
        err, part, md = self._check_producer(tid, producer_id, producer_epoch, group_id, generation_id)
        if err:
            return err
        if md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            if (part.markers_written.get(tid) != (md.producer_id, md.producer_epoch) or tid in part.completions
                    or md.pending_transition_in_progress):
                return ErrorCode.CONCURRENT_TRANSACTIONS
            if md.is_producer_epoch_exhausted:
                return ErrorCode.INVALID_PRODUCER_EPOCH  # as below: InitProducerId rotates the PID first
            committed = md.state is TxnState.PREPARE_COMMIT

            def handed_over() -> None:  # the Ongoing record also completed the previous transaction
                part.markers_written.pop(tid, None)
                metrics.completed(committed, "client")
            return await self._append(part, md, md.prepare_next_transaction(wanted, self._clock()), handed_over)
        if md.is_prepared:
            return ErrorCode.INVALID_TXN_STATE  # sealed by PrepareTxn
        if md.state in COMPLETED_STATES and md.is_producer_epoch_exhausted:
            # Every transaction ends under the next epoch: none may start at the last ones.
            # InitProducerId (KIP-360, with the current PID and epoch) rotates the PID.
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if md.state is TxnState.ONGOING and wanted <= md.partitions:
            return ErrorCode.NONE
        transit = md.prepare_add_partitions(wanted, self._clock())
        return await self._append(part, md, transit)

    # ------------------------------------------------------------ EndTxn
    async def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                      committed: bool, group_id: str = "", generation_id: int = -1,
                      transaction_version: int = 2) -> EndTxnResult:
        """EndTxn: commit (committed=True) or abort the ongoing transaction.

        Ongoing (also sealed by PrepareTxn; then the request may come from any process
        holding the PID and epoch): PrepareCommit/PrepareAbort is appended to the log
        under the next producer epoch (KIP-890 part 2: the markers carry it, so late
        batches and late duplicate markers of this transaction are fenced), the markers
        and the Complete record follow in the background; answers NONE with the PID and
        the bumped epoch, which the producer uses from now on, once the Prepare record
        is written (after waiting up to exactly.txn.end.completion.wait.ms for the
        completion). A retry (the same request, from before the bump) after
        completion: same command -> NONE, the other -> INVALID_TXN_STATE; while
        completing: same command -> CONCURRENT_TRANSACTIONS, the other ->
        INVALID_TXN_STATE. No transaction (Empty) -> INVALID_TXN_STATE. Also
        INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED (another epoch),
        CONCURRENT_TRANSACTIONS, NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
        COORDINATOR_NOT_AVAILABLE (design doc "Transaction Coordinator Request
        Handling", EndTxn). group_id / generation_id: a group-aware producer's, as in
        add_partitions_to_txn (ILLEGAL_GENERATION). transaction_version 1 (a Kafka
        client with EndTxn below v5): no epoch bump; the transaction ends, and the
        markers are written, under the producer's current epoch. An answer from the
        cache for the current epoch without an ongoing transaction (none to end, or a
        version-1 retry) first passes the ownership barrier
        (PartitionOwner._confirm_ownership): NOT_COORDINATOR when this owner was
        deposed, COORDINATOR_NOT_AVAILABLE when the barrier could not be written."""
        err, part = self._lookup(transactional_id, group_id)
        md = part.txns.get(transactional_id) if part is not None else None
        if md is not None and not md.pending_transition_in_progress and \
                md.is_end_txn_retry(producer_id, producer_epoch):
            return self._end_txn_outcome(md, committed)
        for confirmed in (False, True):
            err, part, md = self._check_producer(transactional_id, producer_id, producer_epoch, group_id,
                                                 generation_id)
            if err:
                return EndTxnResult(err)
            if md.state is TxnState.ONGOING:
                return await self._end_ongoing(part, md, committed, transaction_version)
            if confirmed:
                break
            # Nothing ongoing in the cache under the producer's current epoch. Either
            # there is no transaction, or this owner was deposed without noticing yet
            # and the producer's transaction lives with the new owner (a Kafka client's
            # retry without an epoch bump looks the same). The cache answers only once
            # the ownership barrier shows it is current; a stale owner answers
            # NOT_COORDINATOR, so the producer finds the new owner instead of being told
            # that a transaction the new owner still holds open was committed.
            err = await self._confirm_ownership(part)
            if err:
                return EndTxnResult(err)
        return self._end_txn_outcome(md, committed)

    async def _end_ongoing(self, part: _TxnPartition, md: TransactionMetadata, committed: bool,
                           transaction_version: int) -> EndTxnResult:
        """EndTxn of an ongoing transaction: append Prepare*, start the completion."""
        started = time.monotonic()
        target = TxnState.PREPARE_COMMIT if committed else TxnState.PREPARE_ABORT
        bump = transaction_version != 1
        transit = md.prepare_abort_or_commit(target, self._clock(), bump_epoch=bump,
                                             transaction_version=2 if bump else 1)
        completions: list[asyncio.Task] = []
        err = await self._append(part, md, transit, lambda: completions.append(
            self._start_completion(part, md, transit, from_client=True, started=started)))
        if err:
            return EndTxnResult(err)
        if self.config.end_txn_completion_wait_ms > 0:
            await asyncio.wait(completions, timeout=self.config.end_txn_completion_wait_ms / 1000)
        return EndTxnResult(ErrorCode.NONE, transit.producer_id, transit.producer_epoch)

    @staticmethod
    def _end_txn_outcome(md: TransactionMetadata, committed: bool) -> EndTxnResult:
        """The answer to an EndTxn when no transaction is ongoing: a retry of the end
        that is completing or completed, or a request without a transaction."""
        state = md.state
        done = TxnState.COMPLETE_COMMIT if committed else TxnState.COMPLETE_ABORT
        completing = TxnState.PREPARE_COMMIT if committed else TxnState.PREPARE_ABORT
        if state is done:
            return EndTxnResult(ErrorCode.NONE, md.producer_id, md.producer_epoch)
        if state is completing:
            return EndTxnResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        return EndTxnResult(ErrorCode.INVALID_TXN_STATE)

    # ------------------------------------------------------------ PrepareTxn
    async def prepare_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          group_id: str = "", generation_id: int = -1) -> ErrorCode:
        """PrepareTxn: two-phase commit in the spirit of KIP-939. Seals the ongoing
        transaction: it stays Ongoing (its data below the LSO stays undecided), later
        AddPartitionsToTxn / AddOffsetsToTxn get INVALID_TXN_STATE, and instead of
        transaction.timeout.ms it is bounded by transaction.prepared.max.ms. The prepared
        timestamp is appended to the transaction log, so it survives coordinator restart
        and failover. EndTxn with the same PID and epoch, from any process, completes it;
        InitProducerId of the transactional.id aborts it with an epoch bump (fencing), as
        for any ongoing transaction.

        Answers NONE (also when already prepared: a retry); without a transaction in
        progress an empty one is started and sealed. Like AddPartitionsToTxn it first
        waits for the producer's previous transaction to complete, and answers
        CONCURRENT_TRANSACTIONS (retriable) while that one is still PrepareCommit /
        PrepareAbort: the wait ran out, or a handover add of the next transaction
        woke with this request and takes over after it. INVALID_PRODUCER_ID_MAPPING,
        PRODUCER_FENCED (another epoch), NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
        COORDINATOR_NOT_AVAILABLE as EndTxn; ILLEGAL_GENERATION (group-aware)."""
        await self._previous_completed(transactional_id, group_id)
        err, part, md = self._check_producer(transactional_id, producer_id, producer_epoch, group_id,
                                             generation_id)
        if err:
            return err
        if md.is_prepared:
            return ErrorCode.NONE
        if md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS  # the previous transaction is still completing
        if md.state not in COMPLETED_STATES and md.state is not TxnState.ONGOING:
            return ErrorCode.INVALID_TXN_STATE
        if md.state in COMPLETED_STATES and md.is_producer_epoch_exhausted:
            return ErrorCode.INVALID_PRODUCER_EPOCH  # as AddPartitionsToTxn: InitProducerId first
        return await self._append(part, md, md.prepare_mark_prepared(self._clock()))

    # ------------------------------------------------------------ completion (markers)
    async def _fence_and_abort(self, part: _TxnPartition, md: TransactionMetadata,
                               cause: str = "fencing") -> ErrorCode:
        """Abort md's ongoing transaction with a bumped epoch (fences the producer on
        the coordinator and, through the markers, on the partition leaders). cause:
        "fencing" or "timeout" (metrics)."""
        if not self._owns(part) or md.pending_transition_in_progress or md.state is not TxnState.ONGOING:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        now = self._clock()
        md.prepare_fence_producer_epoch(now)
        transit = md.prepare_abort_or_commit(TxnState.PREPARE_ABORT, now)

        def aborting() -> None:
            log.info("fenced %r: aborting its transaction with PID %d epoch %d", md.transactional_id,
                     transit.producer_id, transit.producer_epoch)
            self._start_completion(part, md, transit, from_client=False, cause=cause)
        return await self._append(part, md, transit, aborting)

    def _start_completion(self, part: _TxnPartition, md: TransactionMetadata, prepared: TxnTransitMetadata,
                          from_client: bool, cause: str = "client", started: float | None = None) -> asyncio.Task:
        """Write the markers and the Complete record in the background. cause (client,
        timeout, fencing) and started (time.monotonic() of the EndTxn) feed the metrics."""
        tid = md.transactional_id
        running = part.completions.get(tid)
        if running is not None and not running.done():
            return running
        part.markers_written.pop(tid, None)  # of an earlier transaction (version 1 keeps the epoch)
        task = self._spawn(part, self._complete(part, md, prepared, from_client, cause, started),
                           f"txn-complete-{tid}")
        part.completions[tid] = task
        task.add_done_callback(lambda t: part.completions.pop(tid, None) if part.completions.get(tid) is t else None)
        return task

    async def _complete(self, part: _TxnPartition, md: TransactionMetadata, prepared: TxnTransitMetadata,
                        from_client: bool, cause: str = "client", started: float | None = None) -> None:
        if from_client and self.config.pause_after_prepare_ms > 0:
            await self._sleep(self.config.pause_after_prepare_ms / 1000)
        committed = prepared.state is TxnState.PREPARE_COMMIT
        marker = TxnMarker(prepared.producer_id, prepared.producer_epoch, committed, part.coordinator_epoch,
                           prepared.partitions, prepared.transaction_version)
        try:
            markers_started = time.monotonic()
            unanswered = await self._write_markers(part, md, marker)
            metrics.MARKER_WRITE_SECONDS.observe(time.monotonic() - markers_started)
            if unanswered and marker.transaction_version < 2:
                await self._outlive_unanswered_markers(part, md, marker)
            if part.next_waiting.get(md.transactional_id) and md.state is prepared.state \
                    and not md.pending_transition_in_progress:
                # The handover: the next transaction's first add is waiting; its Ongoing
                # record completes this transaction (or _resume_completion appends Complete).
                part.markers_written[md.transactional_id] = (prepared.producer_id, prepared.producer_epoch)
                if started is not None:  # complete for every reader now: its markers are written
                    metrics.END_TO_COMPLETE_SECONDS.observe(time.monotonic() - started)
                return
            async for attempt in self._retrying():
                with attempt:
                    await self._append_complete(part, md)
        except NotOwner:
            return
        metrics.completed(committed, cause)
        if started is not None:
            metrics.END_TO_COMPLETE_SECONDS.observe(time.monotonic() - started)

    async def _write_markers(self, part: _TxnPartition, md: TransactionMetadata, marker: TxnMarker) -> bool:
        """Write `marker` to every partition, retried until each answered (design doc
        "Two-phase commit with markers"). Returns whether some attempt got no answer
        (UNANSWERED_MARKER_ERRORS): that request may still be running at its leader.
        Raises NotOwner when this coordinator no longer owns `part`."""
        remaining = set(marker.partitions)
        unanswered = False
        async for attempt in self._retrying():
            with attempt:
                if not self._owns(part):
                    raise NotOwner()
                if not remaining:
                    return unanswered
                results = await self._markers.write(replace(marker, partitions=frozenset(remaining)))
                for tp, code in results.items():
                    if tp not in remaining:
                        continue
                    unanswered = unanswered or code in UNANSWERED_MARKER_ERRORS
                    if code == ErrorCode.NONE:
                        remaining.discard(tp)
                    elif code == ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                        # A marker of a newer coordinator epoch is there: we were replaced.
                        self._deposed(part, f"marker for {md.transactional_id!r} on {tp[0]}-{tp[1]} rejected "
                                            "(TRANSACTION_COORDINATOR_FENCED)")
                        raise NotOwner()
                    elif code in (ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED):
                        # The leader holds a newer epoch of this PID than the one this
                        # coordinator issued. With transaction verification and the
                        # end-of-transaction bump that should not happen; retrying would
                        # wedge the id, so the marker is not written — never silently:
                        # an error in the log and a counter to alert on.
                        log.error("marker %s of %r (PID %d epoch %d, coordinator epoch %d) refused on %s-%d: %s; "
                                  "the partition holds a newer epoch of the PID, marker not written",
                                  "COMMIT" if marker.committed else "ABORT", md.transactional_id,
                                  marker.producer_id, marker.producer_epoch, marker.coordinator_epoch,
                                  tp[0], tp[1], code_name(code))
                        metrics.MARKERS_REJECTED.labels(code_name(code)).inc()
                        remaining.discard(tp)
                    elif not self._topology.partition_exists(*tp):
                        log.warning("partition %s-%d of %r no longer exists; no marker written",
                                    tp[0], tp[1], md.transactional_id)
                        remaining.discard(tp)
                if remaining:
                    raise RetryLater(f"markers pending for {sorted(remaining)}")
        return unanswered

    async def _outlive_unanswered_markers(self, part: _TxnPartition, md: TransactionMetadata,
                                          marker: TxnMarker) -> None:
        """Transaction version 1 (no epoch bump): the next transaction of the PID has
        the epoch of this one's markers, so a marker request that got no answer and
        still runs at its leader could end that transaction early. Such a request
        reached the leader, if at all, before the retry that wrote the marker (ahead
        of it on the same stream, or before its stream broke), and the leader
        appends nothing past its deadline (MARKER_LEADER_DEADLINE_MS after arrival),
        so the transaction stays PrepareCommit / PrepareAbort, and the next one
        cannot start, until that much time (monotonic ms) has passed since the last
        marker was written. Raises NotOwner when this coordinator no longer owns
        `part`."""
        until = self._monotonic() + MARKER_LEADER_DEADLINE_MS
        log.info("a marker request for %r (PID %d epoch %d) got no answer; the transaction completes in %d ms, "
                 "once that request can no longer append its marker", md.transactional_id, marker.producer_id,
                 marker.producer_epoch, MARKER_LEADER_DEADLINE_MS)
        while (left := until - self._monotonic()) > 0:
            if not self._owns(part):
                raise NotOwner()
            await self._sleep(left / 1000)
        if not self._owns(part):
            raise NotOwner()

    async def _append_complete(self, part: _TxnPartition, md: TransactionMetadata) -> None:
        if not self._owns(part):
            raise NotOwner()
        if md.state not in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return  # already completed (a concurrent completion won)
        if md.pending_transition_in_progress:
            raise RetryLater("transition pending")
        err = await self._append(part, md, md.prepare_complete(self._clock()))
        if err == ErrorCode.NOT_COORDINATOR:
            raise NotOwner()
        if err:
            raise RetryLater(f"appending the completion failed: {code_name(err)}")

    # ------------------------------------------------------------ periodic scans
    async def abort_timed_out_transactions(self) -> int:
        """Design doc "Coordinator-side Transaction Expiration": abort, with an epoch
        bump, every ongoing transaction older than its transaction.timeout.ms (from its
        first partition), and every prepared one (PrepareTxn) older than
        transaction.prepared.max.ms (from its prepare); restart the completion of prepared transactions whose
        completion is not running. Returns the number of transactions aborted.

        Both durations count on this process's monotonic clock from when it applied the
        transition: a wall clock stepped forwards expires nothing early, one stepped
        backwards holds nothing longer. A transaction loaded after a failover or restart
        resumes with its wall-clock age at the load (`_resume_timeouts`; docs/design.md,
        "Clocks")."""
        now = self._monotonic()
        aborts = []
        for part in list(self._parts.values()):
            if part.loading or part.error:
                continue
            for md in list(part.txns.values()):
                if md.pending_transition_in_progress:
                    continue
                if md.started_monotonic_ms is None:
                    md.started_monotonic_ms = now
                if md.prepared_monotonic_ms is None:
                    md.prepared_monotonic_ms = now
                if md.is_prepared:
                    if md.prepared_monotonic_ms + self.config.prepared_max_ms < now:
                        log.info("prepared transaction of %r (PID %d epoch %d) waited more than "
                                 "transaction.prepared.max.ms (%d ms); aborting", md.transactional_id,
                                 md.producer_id, md.producer_epoch, self.config.prepared_max_ms)
                        aborts.append(self._fence_and_abort(part, md))
                elif md.state is TxnState.ONGOING and md.started_monotonic_ms + md.txn_timeout_ms < now:
                    log.info("transaction of %r (PID %d epoch %d) timed out after %d ms; aborting",
                             md.transactional_id, md.producer_id, md.producer_epoch, md.txn_timeout_ms)
                    aborts.append(self._fence_and_abort(part, md, cause="timeout"))
                elif (md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
                      and md.transactional_id not in part.completions):
                    self._start_completion(part, md, md.snapshot(), from_client=False)
        results = await asyncio.gather(*aborts)
        return sum(1 for r in results if r == ErrorCode.NONE)

    async def expire_transactional_ids(self) -> int:
        """Design doc "Coordinator TransactionalId Expiration": write a tombstone for,
        and forget, every transactional.id without a transaction in progress whose
        last update is older than transactional.id.expiration.ms. A failed tombstone
        is ignored (retried at the next scan). Returns the number expired.

        The age is the last update's wall-clock timestamp (it outlives restarts, as in
        Kafka); one updated by this process must also be that old on its monotonic
        clock, so a wall clock stepped forwards expires no id in use."""
        now = self._clock()
        mono = self._monotonic()
        expiring = []
        for part in list(self._parts.values()):
            if part.loading or part.error:
                continue
            for md in list(part.txns.values()):
                if (md.state in COMPLETED_STATES and not md.pending_transition_in_progress
                        and md.txn_last_update_timestamp + self.config.transactional_id_expiration_ms <= now
                        and (md.updated_monotonic_ms is None
                             or md.updated_monotonic_ms + self.config.transactional_id_expiration_ms <= mono)):
                    expiring.append(self._expire(part, md, now))
        return sum(await asyncio.gather(*expiring))

    async def _expire(self, part: _TxnPartition, md: TransactionMetadata, now: int) -> int:
        group = md.group
        err = await self._append(part, md, md.prepare_dead(now))
        if err or part.txns.get(md.transactional_id) is not md:
            return 0
        del part.txns[md.transactional_id]
        if group is not None:
            # Best effort: a failed tombstone leaves an assignment without its id,
            # which blocks nothing (no transaction) and is replaced by a later init.
            await self._append_group(part, md.transactional_id, None, group.group_id)
        metrics.TRANSACTIONAL_IDS.set(part.partition, len(part.txns))
        log.info("transactional.id %r expired", md.transactional_id)
        return 1

    # ------------------------------------------------------------ loading
    async def _load(self, part: _TxnPartition) -> None:
        started = time.monotonic()
        entries: list[txn_log.TxnLogEntry] = []
        offset, target = 0, None
        max_bytes = self.config.load_buffer_bytes
        try:
            await self._fence_previous_owner(part)
            async for attempt in self._retrying():
                with attempt:
                    while True:
                        if not self._owns(part):
                            raise NotOwner()
                        res = await self._log.fetch(part.partition, offset, max_bytes)
                        if res.error_code == ErrorCode.OFFSET_OUT_OF_RANGE and offset < res.log_start_offset:
                            offset = res.log_start_offset
                            continue
                        if res.error_code:
                            raise RetryLater(f"fetching __transaction_state-{part.partition}: {code_name(res.error_code)}")
                        if target is None:
                            target = res.high_watermark
                        if offset >= target:
                            break
                        batch_entries, next_offset = txn_log.decode_fetched(res.records)
                        if next_offset is None or next_offset <= offset:
                            max_bytes *= 2  # a batch larger than the buffer
                            raise RetryLater(f"no progress reading __transaction_state-{part.partition} at {offset}")
                        entries.extend(batch_entries)
                        offset = next_offset
            txns = txn_log.rebuild(entries)
            groups = txn_log.rebuild_groups(entries)
            bindings = txn_log.rebuild_bindings(entries)
        except NotOwner:
            return
        except txn_log.CorruptTxnLogError as exc:
            part.error = str(exc)
            part.finish_loading()
            log.error("__transaction_state-%d is corrupt; disabled: %s", part.partition, exc)
            return
        part.txns = txns
        part.groups = groups
        # A use seen by the previous owner is not in the log: count the load as one,
        # so a failover never expires a binding early.
        loaded_at = self._monotonic()
        self._resume_timeouts(txns.values(), loaded_at)
        part.bindings = bindings
        part.binding_used = {pid: loaded_at for pid in bindings}
        metrics.PRODUCER_ID_BINDINGS.set(part.partition, len(bindings))
        for members in groups.values():
            for tid, assignment in members.items():
                if tid in txns:
                    txns[tid].group = assignment
        part.finish_loading()
        metrics.TRANSACTIONAL_IDS.set(part.partition, len(txns))
        prepared = [md for md in txns.values() if md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)]
        log.info("loaded __transaction_state-%d (coordinator epoch %d): %d transactional ids, %d groups, %d records, "
                 "%d to roll forward, in %.0f ms", part.partition, part.coordinator_epoch, len(txns), len(groups),
                 len(entries), len(prepared), (time.monotonic() - started) * 1000)
        for md in prepared:
            self._start_completion(part, md, md.snapshot(), from_client=False)

    def _resume_timeouts(self, txns: Iterable[TransactionMetadata], loaded_at: int) -> None:
        """A loaded transaction resumes its timeout: its age at the load is the wall
        clock's (now - txn_start_timestamp, or - prepared_timestamp), taken as 0 when
        negative (this host's clock is behind the previous owner's: no hang) and at
        most its limit + 1 ms; from then on only the monotonic clock counts."""
        now = self._clock()
        for md in txns:
            if md.txn_start_timestamp >= 0:
                age = min(max(now - md.txn_start_timestamp, 0), md.txn_timeout_ms + 1)
                md.started_monotonic_ms = loaded_at - age
            if md.prepared_timestamp >= 0:
                age = min(max(now - md.prepared_timestamp, 0), self.config.prepared_max_ms + 1)
                md.prepared_monotonic_ms = loaded_at - age

    # ------------------------------------------------------------ admin
    def list_transactions(self, state_filters: Iterable[str] = (), producer_id_filters: Iterable[int] = (),
                          duration_filter_ms: int = 0) -> tuple[ErrorCode, list[TxnStateSummary]]:
        """ListTransactions over the owned partitions. state_filters: Kafka state
        names ("Ongoing", ...; unknown names match nothing); producer_id_filters: PIDs;
        duration_filter_ms > 0: only transactions started at least that many ms ago
        (KIP-994; a transactional.id with no transaction started never matches).
        Empty filters match all. COORDINATOR_LOAD_IN_PROGRESS while a partition loads."""
        names = list(state_filters)
        states = set()
        for name in names:
            try:
                states.add(TxnState.from_name(name))
            except ValueError:
                pass
        if names and not states:
            return ErrorCode.NONE, []
        pids = set(producer_id_filters)
        if any(p.loading for p in self._parts.values()):
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, []
        now = self._clock()
        out = []
        for part in self._parts.values():
            if part.error:
                continue
            for md in part.txns.values():
                if md.state is TxnState.DEAD or (states and md.state not in states) or \
                        (pids and md.producer_id not in pids):
                    continue
                if duration_filter_ms > 0 and (md.txn_start_timestamp < 0 or
                                               now - md.txn_start_timestamp < duration_filter_ms):
                    continue
                out.append(TxnStateSummary.of(md))
        return ErrorCode.NONE, sorted(out, key=lambda s: s.transactional_id)

    def describe_transactions(self, transactional_ids: Iterable[str]) -> list[DescribeResult]:
        """DescribeTransactions: per id NONE with its summary, NOT_COORDINATOR,
        COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE or
        TRANSACTIONAL_ID_NOT_FOUND."""
        out = []
        for tid in transactional_ids:
            err, part = self._lookup(tid) if tid else (ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, None)
            md = part.txns.get(tid) if part is not None else None
            if not err and (md is None or md.state is TxnState.DEAD):
                err = ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
            out.append(DescribeResult(tid, err, TxnStateSummary.of(md) if not err else None))
        return out


OFFSETS_TOPIC = "__consumer_offsets"


def _valid_producer_id(md: TransactionMetadata, producer_id: int, producer_epoch: int) -> bool:
    """KIP-360 (Kafka's isValidProducerId): the id may be re-initialised when it is
    new, the PID matches, or it is the previous PID retried after a rotation."""
    return (md.producer_epoch == NO_PRODUCER_EPOCH or producer_id == md.producer_id
            or (producer_id == md.last_producer_id and is_epoch_exhausted(producer_epoch)))
