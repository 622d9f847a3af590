"""The transaction coordinator: PIDs, epochs, the transaction state machine, two-phase
commit with transaction markers, timeouts and transactional.id expiration.

Follows the design doc sections "Transaction Coordinator", "Transaction Log",
"Transaction Coordinator Startup", "Transaction Coordinator Request Handling",
"Coordinator-side Transaction Expiration" and "Coordinator TransactionalId
Expiration", with Kafka's TransactionCoordinator.scala where the doc is silent
(KIP-360 epoch checks, PID rotation on epoch exhaustion, fencing epoch bump).

Pure asyncio, no gRPC: the transaction log, the markers and the cluster topology are
reached through the small ports of `ports.py` (`TxnLogStore`, `MarkerWriter`,
`Topology`), implemented over the cluster in `adapters.py` and by fakes in unit
tests. Every protocol outcome is an `ErrorCode` value; exceptions are bugs.

The package is cut by feature; this module keeps the wiring (ownership, the periodic
scans, the cache lookups, the append of a transition, ListTransactions /
DescribeTransactions) and composes the parts: `requests.py` (the RPCs: check ->
prepare -> append), `completion.py` (markers, Complete record and the handover, one
`Completion` per transactional.id), `group_txn.py` (the KIP-447 draft, behind its
hooks), `scans.py` (timeouts and expirations), `load.py` (partition load and
replay); `partition.py` holds the per-partition cache, `ports.py` the ports,
settings and results (re-exported here).

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

Settings: `services.common.settings.TxnCoordinatorSchema` (each key's default, range and doc).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from typing import Awaitable, Callable, Coroutine, Iterable

from exactly_wire.clock import Clock, monotonic_ms, wall_clock_ms
from exactly_wire.error_codes import RETRIABLE, ErrorCode
from services.common.cluster.owned import PartitionOwner, code_name
from services.common.settings import TxnCoordinatorSchema

from . import metrics, txn_log
from .completion import TxnCompletion
from .group_txn import GroupTxn
from .load import TxnLoad
from .partition import TxnPartition
from .pid_manager import ProducerIdManager
from .ports import (AMBIGUOUS_APPEND_ERRORS, OFFSETS_TOPIC, UNANSWERED_MARKER_ERRORS,
                    DescribeResult, EndTxnResult, InitProducerIdResult, MarkerWriter, Topology,
                    TxnLogFetch, TxnLogStore, TxnMarker)
from .requests import TxnRequests
from .scans import TxnScans
from .state import TransactionMetadata, TxnState, TxnStateSummary, TxnTransitMetadata, listed_state_names

log = logging.getLogger(__name__)

__all__ = [
    "TransactionCoordinator", "TxnPartition", "AMBIGUOUS_APPEND_ERRORS",
    "OFFSETS_TOPIC", "UNANSWERED_MARKER_ERRORS", "DescribeResult", "EndTxnResult", "InitProducerIdResult",
    "MarkerWriter", "Topology", "TxnLogFetch", "TxnLogStore", "TxnMarker",
]


# ---------------------------------------------------------------- coordinator

class TransactionCoordinator(TxnRequests, GroupTxn, TxnCompletion, TxnScans, TxnLoad,
                             PartitionOwner[TxnPartition]):
    """Handles the transaction coordinator RPCs for the `__transaction_state`
    partitions this process owns (`on_elected` / `on_resigned`).

    log, markers, topology: the ports (ports.py); pids: PID allocation; config: the parsed
    settings (services.common.settings.TxnCoordinatorSchema; its defaults when None); clock: wall-clock
    ms (timestamps written to the transaction log); monotonic: ms of a monotonic clock
    (every duration: transaction.timeout.ms, a prepared transaction's age, the
    expirations, the marker deadline; docs/design.md, "Clocks"); sleep: async (seconds) -> None
    (injected in tests); on_fenced(partition, coordinator_epoch): called (on the loop)
    when a newer owner of the partition exists (services.common.cluster.owned.PartitionOwner,
    CoordinatorOwnership.fenced). bind_producer_ids (on with the authorizer): every
    producer id is issued bound to a principal, the binding written to partition
    producer id % n of the log first (docs/design.md, "Producer-id bindings").
    """

    topic = "__transaction_state"

    def __init__(self, log_store: TxnLogStore, markers: MarkerWriter, topology: Topology,
                 pids: ProducerIdManager, config: TxnCoordinatorSchema | None = None,
                 clock: Clock = wall_clock_ms,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 on_fenced: Callable[[int, int], None] | None = None, bind_producer_ids: bool = False,
                 monotonic: Clock = monotonic_ms):
        self.config = config or TxnCoordinatorSchema()
        self._monotonic = monotonic
        self.bind_producer_ids = bind_producer_ids
        self._next_binding_partition = 0
        # (principal, transactional) -> InitProducerIds in flight that add a binding (requests._reserving).
        self._binding_reservations: Counter[tuple[str, bool]] = Counter()
        super().__init__(clock, sleep=sleep, on_fenced=on_fenced, retry_backoff_ms=self.config.txn_retry_backoff_ms,
                         retry_backoff_max_ms=self.config.txn_retry_backoff_max_ms)
        self._log = log_store
        self._markers = markers
        self._topology = topology
        self._pids = pids
        self._recent: dict[str, float] = {}  # transactional.id -> time.monotonic() of its last append

    async def start(self) -> None:
        """Start the periodic scans (timed-out transactions, expired ids)."""
        self._spawn(None, self._every(self.config.abort_timed_out_interval_ms, self.abort_timed_out_transactions),
                    "txn-timeout-abort")
        self._spawn(None, self._every(self.config.remove_expired_interval_ms, self.expire_transactional_ids),
                    "txn-id-expiration")
        if self.bind_producer_ids:
            self._spawn(None, self._every(self.config.producer_id_expiration_check_interval_ms,
                                          self.expire_producer_id_bindings), "pid-binding-expiration")
        self._spawn(None, self._every(self.config.abort_timed_out_interval_ms, self.record_feature_levels),
                    "txn-feature-levels")

    def metadata_version_changed(self) -> None:
        """The finalized metadata.version changed: record it in the owned partitions
        now (`record_feature_levels`) rather than at the next scan. On the loop."""
        self._spawn(None, self.record_feature_levels(), "txn-feature-levels-now")

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

    async def _wait_done(self, tasks: Iterable[asyncio.Future], timeout_ms: int) -> None:
        """Wait until every one of `tasks` is done, or until `timeout_ms` ms of the
        injected monotonic clock have passed, whichever comes first; the tasks are
        never cancelled. The deadline is raced with the injected sleep (docs/design.md,
        "Clocks"): the sleep may return early (a test's), the monotonic clock decides."""
        deadline = self._monotonic() + timeout_ms
        pending = {t for t in tasks if not t.done()}
        while pending and (left := deadline - self._monotonic()) > 0:
            timer = asyncio.ensure_future(self._sleep(left / 1000))
            try:
                _, pending = await asyncio.wait(pending | {timer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
            pending.discard(timer)

    def _new_partition(self, partition: int, coordinator_epoch: int, producer_id: int, producer_epoch: int,
                       retired_producer_id: int) -> TxnPartition:
        return TxnPartition(partition, coordinator_epoch, producer_id, producer_epoch, retired_producer_id)

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

    def _dropped(self, part: TxnPartition) -> None:
        part.completions.clear()

    async def _append_fence(self, part: TxnPartition, batch: bytes) -> int:
        return await self._log.append(part.partition, batch)

    def _lookup(self, transactional_id: str, group_id: str = "") -> tuple[ErrorCode, TxnPartition | None]:
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

    async def _shielded(self, work: Coroutine[None, None, ErrorCode], name: str,
                        after: Callable[[ErrorCode], None] | None = None) -> ErrorCode:
        """The one way the coordinator writes to its log: `work` -- an append and the
        application of its outcome to the cache -- runs in a task of its own (named
        `name`), shielded from the caller's cancellation (a client deadline, a
        disconnect, a broken tunnel stream), so the outcome is applied from the
        append's own result whatever becomes of the caller, as Kafka applies it in
        the append callback. `after(code)` (optional) runs once with the result: in
        the caller before this returns, or, when the caller was cancelled, as soon as
        the task ended. Returns the task's ErrorCode; cancelling the caller raises
        CancelledError in the caller only."""
        task = self._spawn(None, work, name)
        try:
            code = await asyncio.shield(task)
        except asyncio.CancelledError:
            if after is not None:
                task.add_done_callback(
                    lambda t: after(t.result()) if not t.cancelled() and t.exception() is None else None)
            raise
        if after is not None:
            after(code)
        return code

    async def _append(self, part: TxnPartition, md: TransactionMetadata, transit: TxnTransitMetadata,
                      on_complete: Callable[[], None] | None = None,
                      bindings: list[tuple[int, txn_log.ProducerIdBinding | None]] | None = None) -> ErrorCode:
        """Append `transit` (md must have it pending) and complete or cancel it.
        Returns NONE, NOT_COORDINATOR (ownership lost meanwhile),
        COORDINATOR_LOAD_IN_PROGRESS (outcome unknown: the partition reloads),
        COORDINATOR_NOT_AVAILABLE (retriable log failure) or UNKNOWN_SERVER_ERROR.

        Through `_shielded`: a record that waits in the group-commit queue
        (adapters.ClusterTxnLog) goes out even when its request is abandoned, so the
        transition completes when the record is written, is cancelled when the append
        failed, and the partition reloads when the outcome is unknown: the cache
        always agrees with the log. `bindings` (producer-id binding records, see
        `_write_bindings`) are appended first, in the same task: when they fail the
        transition is cancelled and their error returned. `on_complete` (no
        arguments) runs once the transition completed, e.g. to start the completion
        of a Prepare record: in the caller before `_append` returns NONE, or, when
        the caller was cancelled, as soon as the append task completed the
        transition."""
        if not self._owns(part):
            md.cancel_transition()
            return ErrorCode.NOT_COORDINATOR
        batch = txn_log.encode_batch(md.transactional_id, transit, self._clock(),
                                     producer_id=part.producer_id, producer_epoch=part.producer_epoch)
        self._note_active(md.transactional_id)
        return await self._shielded(
            self._append_and_apply(part, md, transit, batch, bindings), f"txn-append-{md.transactional_id}",
            None if on_complete is None else lambda code: on_complete() if code == ErrorCode.NONE else None)

    async def _append_and_apply(self, part: TxnPartition, md: TransactionMetadata, transit: TxnTransitMetadata,
                                batch: bytes, bindings: list | None = None) -> ErrorCode:
        """The body of `_append`: the bindings (if any), then one append of `batch`,
        then its outcome applied to md."""
        try:
            if bindings:
                code = await self._write_bindings(part, bindings)
                if code != ErrorCode.NONE:
                    md.cancel_transition()
                    return code
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

    def list_transactions(self, state_filters: Iterable[str] = (), producer_id_filters: Iterable[int] = (),
                          duration_filter_ms: int = 0) -> tuple[ErrorCode, list[TxnStateSummary]]:
        """ListTransactions over the owned partitions. state_filters: the listed state
        names (`TxnStateSummary.state_name`: Kafka's, "PrepareTxn" for a prepared
        transaction, which "Ongoing" does not select; unknown names match nothing);
        producer_id_filters: PIDs (client-facing); duration_filter_ms > 0: only
        transactions started at least that many ms ago (KIP-994; a transactional.id
        with no transaction started never matches). Empty filters match all.
        COORDINATOR_LOAD_IN_PROGRESS while a partition loads."""
        names = list(state_filters)
        states = listed_state_names(names)
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
                if md.state is TxnState.DEAD or (pids and md.producer_id not in pids):
                    continue
                if duration_filter_ms > 0 and (md.txn_start_timestamp < 0 or
                                               now - md.txn_start_timestamp < duration_filter_ms):
                    continue
                summary = TxnStateSummary.of(md)
                if not states or summary.state_name in states:
                    out.append(summary)
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
