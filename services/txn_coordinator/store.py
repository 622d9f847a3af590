"""The store of transaction metadata: the owned partitions' caches, the lookup of a
transactional.id, and the one way the coordinator writes its log -- append a record,
then apply it (Kafka's `TransactionStateManager`; design doc "Transaction Log";
docs/design.md, "Prepare -> append -> complete").

A transition is appended and then completed on its metadata
(`TransactionMetadata.complete_transition`), cancelled when the append failed, and
the partition reloads when the outcome is unknown: the cache always agrees with the
log. Group assignment, producer-id binding and feature-level records are applied by
the partition's `replay` (partition.py), the function that also applies them when a
partition loads.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Callable, Coroutine, Iterable

from exactly_wire.clock import Clock, monotonic_ms, wall_clock_ms
from exactly_wire.error_codes import RETRIABLE, ErrorCode
from services.common.cluster.owned import OwnedPartitions, code_name
from services.common.protocol import TRANSACTION_STATE_TOPIC

from . import metrics, txn_log
from .partition import TxnPartition
from .ports import AMBIGUOUS_APPEND_ERRORS, DescribeResult, Topology, TxnLogStore
from .state import GroupAssignment, TransactionMetadata, TxnState, TxnStateSummary, TxnTransitMetadata, listed_state_names

log = logging.getLogger(__name__)

Bindings = list[tuple[int, txn_log.ProducerIdBinding | None]]


class TxnStore:
    """The transaction metadata of the owned partitions of the transaction log.

    owned: the owned partitions and their lifecycle (OwnedPartitions of TxnPartition);
    log: the transaction log (ports.TxnLogStore); topology: ports.Topology; clock:
    wall-clock ms (timestamps written to the log); monotonic: ms of a monotonic clock
    (when a transition was applied, the last use of a binding; docs/design.md,
    "Clocks")."""

    def __init__(self, owned: OwnedPartitions[TxnPartition], log: TxnLogStore, topology: Topology,
                 clock: Clock = wall_clock_ms, monotonic: Clock = monotonic_ms):
        self.owned = owned
        self._log = log
        self._topology = topology
        self._clock = clock
        self._monotonic = monotonic
        self._recent: dict[str, float] = {}  # transactional.id -> time.monotonic() of its last append

    # ------------------------------------------------------------ lookups
    def lookup(self, transactional_id: str, group_id: str = "") -> tuple[ErrorCode, TxnPartition | None]:
        """The owned partition holding `transactional_id`: partition crc32(key) % n
        with key = the consumer group of a group-aware producer (KIP-447 draft: every
        producer of a group lives with one coordinator), else the transactional.id.
        (NONE, partition), or (COORDINATOR_NOT_AVAILABLE: no transaction log yet |
        NOT_COORDINATOR: not owned here, or disabled, or loading without a leader of its
        log to fence through (OwnedPartition.leaderless) | COORDINATOR_LOAD_IN_PROGRESS,
        None)."""
        partition = self._topology.txn_partition_for(group_id or transactional_id)
        if partition < 0:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, None
        part = self.owned.get(partition)
        if part is None or part.error is not None:
            return ErrorCode.NOT_COORDINATOR, None
        if part.loading:
            return (ErrorCode.NOT_COORDINATOR if part.leaderless else ErrorCode.COORDINATOR_LOAD_IN_PROGRESS), None
        return ErrorCode.NONE, part

    def metadata(self, transactional_id: str, group_id: str = ""
                 ) -> tuple[ErrorCode, TxnPartition | None, TransactionMetadata | None]:
        """`lookup`, and the id's metadata there (None when it has none)."""
        err, part = self.lookup(transactional_id, group_id)
        return err, part, part.txns.get(transactional_id) if part is not None else None

    def serving(self) -> list[TxnPartition]:
        """The owned partitions that serve (loaded, not disabled)."""
        return [part for part in self.owned.values() if part.serving]

    def loaded_txns(self) -> list[tuple[TxnPartition, TransactionMetadata]]:
        """(partition, metadata) of every transactional.id of the serving owned
        partitions: a snapshot, safe to iterate across awaits."""
        return [(part, md) for part in self.serving() for md in list(part.txns.values())]

    def add(self, part: TxnPartition, md: TransactionMetadata) -> None:
        """Cache a new transactional.id's metadata in `part`."""
        part.txns[md.transactional_id] = md
        metrics.TRANSACTIONAL_IDS.set(part.partition, len(part.txns))

    def forget(self, part: TxnPartition, md: TransactionMetadata) -> bool:
        """Drop `md` (its tombstone is written) from `part`; False when the cache holds
        another metadata for its id by now."""
        if part.txns.get(md.transactional_id) is not md:
            return False
        del part.txns[md.transactional_id]
        metrics.TRANSACTIONAL_IDS.set(part.partition, len(part.txns))
        return True

    # ------------------------------------------------------------ append and apply
    async def shielded(self, work: Coroutine[None, None, ErrorCode], name: str,
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
        task = self.owned.spawn(None, work, name)
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

    async def append(self, part: TxnPartition, md: TransactionMetadata, transit: TxnTransitMetadata,
                     on_complete: Callable[[], None] | None = None, bindings: Bindings | None = None) -> ErrorCode:
        """Append `transit` (md must have it pending) and complete or cancel it.
        Returns NONE, NOT_COORDINATOR (ownership lost meanwhile),
        COORDINATOR_LOAD_IN_PROGRESS (outcome unknown: the partition reloads),
        COORDINATOR_NOT_AVAILABLE (retriable log failure) or UNKNOWN_SERVER_ERROR.

        Through `shielded`: a record that waits in the group-commit queue
        (adapters.ClusterTxnLog) goes out even when its request is abandoned, so the
        transition completes when the record is written, is cancelled when the append
        failed, and the partition reloads when the outcome is unknown: the cache
        always agrees with the log. `bindings` (producer-id binding records, see
        `append_bindings`) are appended first, in the same task: when they fail the
        transition is cancelled and their error returned. `on_complete` (no
        arguments) runs once the transition completed, e.g. to start the completion
        of a Prepare record: in the caller before `append` returns NONE, or, when
        the caller was cancelled, as soon as the append task completed the
        transition."""
        if not self.owned.owns(part):
            md.cancel_transition()
            return ErrorCode.NOT_COORDINATOR
        batch = txn_log.encode_batch(md.transactional_id, transit, self._clock(),
                                     producer_id=part.producer_id, producer_epoch=part.producer_epoch)
        self._note_active(md.transactional_id)
        return await self.shielded(
            self._append_and_apply(part, md, transit, batch, bindings), f"txn-append-{md.transactional_id}",
            None if on_complete is None else lambda code: on_complete() if code == ErrorCode.NONE else None)

    async def _append_and_apply(self, part: TxnPartition, md: TransactionMetadata, transit: TxnTransitMetadata,
                                batch: bytes, bindings: Bindings | None = None) -> ErrorCode:
        """The body of `append`: the bindings (if any), then one append of `batch`,
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
        if not self.owned.owns(part):
            return ErrorCode.NOT_COORDINATOR
        if code == ErrorCode.NONE:
            self.apply(md, transit)
            return ErrorCode.NONE
        if code in AMBIGUOUS_APPEND_ERRORS:
            # The record may be in the log: neither complete nor cancel; learn the
            # outcome from the log itself (the reload fences first, so every earlier
            # record of ours is then committed or gone for good).
            log.warning("appending %s of %r to %s-%d: outcome unknown (%s); reloading the partition from its "
                        "log", transit.state.kafka_name, md.transactional_id, TRANSACTION_STATE_TOPIC,
                        part.partition, code_name(code))
            self.owned.restart(part)
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        md.cancel_transition()
        if self.owned.is_fenced(part, code):
            return ErrorCode.NOT_COORDINATOR
        log.warning("appending %s of %r to %s-%d failed: %s", transit.state.kafka_name, md.transactional_id,
                    TRANSACTION_STATE_TOPIC, part.partition, code_name(code))
        return ErrorCode.COORDINATOR_NOT_AVAILABLE if code in RETRIABLE else ErrorCode.UNKNOWN_SERVER_ERROR

    def apply(self, md: TransactionMetadata, transit: TxnTransitMetadata) -> None:
        """Apply a transition whose record is in the log: complete it on md (the state
        machine re-checks it), then note the monotonic times its timeouts count from
        (a new start or prepare timestamp restarts the matching one)."""
        start_before, prepared_before = md.txn_start_timestamp, md.prepared_timestamp
        md.complete_transition(transit)
        now = self._monotonic()
        md.updated_monotonic_ms = now
        if md.txn_start_timestamp != start_before or md.started_monotonic_ms is None:
            md.started_monotonic_ms = now
        if md.prepared_timestamp != prepared_before or md.prepared_monotonic_ms is None:
            md.prepared_monotonic_ms = now

    async def append_record(self, part: TxnPartition, batch: bytes, entries: list[object], name: str,
                            reload_when_unknown: bool = True) -> ErrorCode:
        """Append `batch`, a record batch of `part` other than a transition (group
        assignments, a feature level), and once written replay `entries`, its
        records, into the cache (`TxnPartition.replay`), shielded from the caller's
        cancellation as every append (`shielded`). An append whose outcome is unknown
        reloads the partition, as for any record of the log, unless
        `reload_when_unknown` is False (a record written again until it is known:
        COORDINATOR_NOT_AVAILABLE then). Returns NONE, NOT_COORDINATOR,
        COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE or UNKNOWN_SERVER_ERROR."""
        if not self.owned.owns(part):
            return ErrorCode.NOT_COORDINATOR
        return await self.shielded(self._append_and_replay(part, batch, entries, reload_when_unknown), name)

    async def _append_and_replay(self, part: TxnPartition, batch: bytes, entries: list[object],
                                 reload_when_unknown: bool) -> ErrorCode:
        code = await self._log.append(part.partition, batch)
        if not self.owned.owns(part):
            return ErrorCode.NOT_COORDINATOR
        if code in AMBIGUOUS_APPEND_ERRORS:
            if not reload_when_unknown:
                return ErrorCode.COORDINATOR_NOT_AVAILABLE
            self.owned.restart(part)
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if code:
            if self.owned.is_fenced(part, code):
                return ErrorCode.NOT_COORDINATOR
            log.warning("appending %d records to %s-%d failed: %s", len(entries), TRANSACTION_STATE_TOPIC,
                        part.partition, code_name(code))
            return ErrorCode.COORDINATOR_NOT_AVAILABLE if code in RETRIABLE else ErrorCode.UNKNOWN_SERVER_ERROR
        now = self._monotonic()
        for entry in entries:
            part.replay(entry, now)
        return ErrorCode.NONE

    async def append_group(self, part: TxnPartition, tid: str, assignment: GroupAssignment | None,
                           group_id: str | None = None) -> ErrorCode:
        """Append the KIP-447 draft group assignment record of `tid` (a tombstone when
        `assignment` is None; then `group_id` names the group) and replay it
        (`append_record`)."""
        group_id = assignment.group_id if assignment is not None else group_id
        batch = txn_log.encode_group_batch(group_id, tid, assignment, self._clock(),
                                           producer_id=part.producer_id, producer_epoch=part.producer_epoch)
        return await self.append_record(part, batch, [txn_log.GroupAssignmentEntry(-1, group_id, tid, assignment)],
                                        f"txn-append-group-{tid}")

    async def append_feature_level(self, part: TxnPartition, level: int) -> ErrorCode:
        """Append the feature-level record of `level` (metadata.version) and replay it
        (`append_record`); one whose outcome is unknown is written again later, the
        partition keeps serving."""
        batch = txn_log.encode_feature_level_batch(level, self._clock(), producer_id=part.producer_id,
                                                   producer_epoch=part.producer_epoch)
        return await self.append_record(part, batch, [txn_log.FeatureLevelEntry(-1, level)],
                                        f"txn-feature-level-{part.partition}", reload_when_unknown=False)

    async def append_bindings(self, part: TxnPartition, items: Bindings) -> ErrorCode:
        """Append binding records (None: the tombstone) to `part` as one batch and,
        once written, replay them into its bindings (`_write_bindings`), shielded from
        the caller's cancellation as every append of the log (`shielded`). Returns
        NONE, NOT_COORDINATOR (not the owner any more) or COORDINATOR_NOT_AVAILABLE
        (the append failed or its outcome is unknown: a binding of a producer id never
        handed out, or a tombstone not applied, is harmless and expires or is
        retried)."""
        return await self.shielded(self._write_bindings(part, items), f"txn-append-bindings-{part.partition}")

    async def _write_bindings(self, part: TxnPartition, items: Bindings) -> ErrorCode:
        """The body of `append_bindings` (and the first step of an `append` with
        bindings): one append of the binding records, then their replay."""
        if not self.owned.owns(part):
            return ErrorCode.NOT_COORDINATOR
        batch = txn_log.encode_binding_batch(items, self._clock(), producer_id=part.producer_id,
                                             producer_epoch=part.producer_epoch)
        code = await self._log.append(part.partition, batch)
        if not self.owned.owns(part):
            return ErrorCode.NOT_COORDINATOR
        if code != ErrorCode.NONE:
            if self.owned.is_fenced(part, code):
                return ErrorCode.NOT_COORDINATOR
            log.warning("appending %d producer-id binding records to %s-%d failed: %s", len(items),
                        TRANSACTION_STATE_TOPIC, part.partition, code_name(code))
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        now = self._monotonic()
        for pid, binding in items:
            part.replay(txn_log.ProducerIdBindingEntry(-1, pid, binding), now)
        metrics.PRODUCER_ID_BINDINGS.set(part.partition, len(part.bindings))
        return ErrorCode.NONE

    # ------------------------------------------------------------ activity
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

    # ------------------------------------------------------------ reads
    def state_counts(self) -> dict[str, int]:
        """Kafka state name -> transactional ids in that state, over the serving owned
        partitions (metrics)."""
        counts: dict[str, int] = {}
        for _, md in self.loaded_txns():
            counts[md.state.kafka_name] = counts.get(md.state.kafka_name, 0) + 1
        return counts

    def prepared_count(self) -> int:
        """Prepared transactions of the serving owned partitions (metrics)."""
        return sum(1 for _, md in self.loaded_txns() if md.is_prepared)

    def oldest_prepared_age_ms(self) -> int:
        """Age (ms, on this process's monotonic clock; a transaction loaded from the log
        counts its wall-clock age at the load) of the oldest prepared transaction of the
        serving owned partitions; 0 when none is prepared (metrics)."""
        now = self._monotonic()
        ages = [now - md.prepared_monotonic_ms for _, md in self.loaded_txns()
                if md.is_prepared and md.prepared_monotonic_ms is not None]
        return max(ages, default=0)

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
        if any(p.loading for p in self.owned.values()):
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, []
        now = self._clock()
        out = []
        for part, md in self.loaded_txns():
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
            err, _, md = self.metadata(tid) if tid else (ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, None, None)
            if not err and (md is None or md.state is TxnState.DEAD):
                err = ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
            out.append(DescribeResult(tid, err, TxnStateSummary.of(md) if not err else None))
        return out
