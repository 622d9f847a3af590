"""The completion of prepared transactions: markers, the Complete record and the
handover (design doc "Two-phase commit with markers"; docs/design.md, "Prepare ->
append -> complete").

After the PrepareCommit / PrepareAbort record, the markers are written to every
partition of the transaction, then the CompleteCommit / CompleteAbort record is
appended -- or, when the producer's next transaction already asks for its first
partition, that add's Ongoing record completes this transaction too (the handover:
the guarded row of the transition table, `state.Guard.MARKERS_WRITTEN`).

`Completion` is that work for one transactional.id: its task, the fact that its
markers are written, and the next adds waiting for it. `TxnCompletion` (a part of
`coordinator.TransactionCoordinator`) runs it on the coordinator's ports.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Iterator

from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from services.common.cluster.owned import NotOwner, RetryLater, code_name

from . import metrics
from services.common.deadlines import marker_coordinator_wait_ms

from .ports import UNANSWERED_MARKER_ERRORS, TxnMarker
from .state import TransactionMetadata, TxnState, TxnTransitMetadata

if TYPE_CHECKING:
    from .partition import TxnPartition

log = logging.getLogger(__name__)

_PREPARED = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


class Completion:
    """The completion of one transactional.id's PrepareCommit / PrepareAbort
    transaction, kept in its partition's `completions` while it runs, while a next
    add waits for it, or while its markers are written and the handover is due.

    task: the background task writing the markers and the Complete record (None
    before `start`). markers_written: (PID, epoch) of the transaction whose markers
    are all written, when the task stopped for the handover. waiting: how many
    AddPartitionsToTxn / AddOffsetsToTxn of the next transaction wait for it.

    start: run the task unless it runs. markers_done: the task's step once every
    marker is written; with a next add waiting it stops there for the handover.
    hand_over: that add's transition, completing this transaction and starting the
    next. resume: whether a completion stopped for the handover must run again
    because the add did not take over."""

    def __init__(self, transactional_id: str, registry: dict[str, Completion]):
        self.transactional_id = transactional_id
        self.task: asyncio.Task | None = None
        self.markers_written: tuple[int, int] | None = None
        self.waiting = 0
        self._registry = registry

    @classmethod
    def of(cls, registry: dict[str, Completion], transactional_id: str) -> Completion:
        """The Completion of `transactional_id` in `registry`, created when missing."""
        completion = registry.get(transactional_id)
        if completion is None:
            completion = registry[transactional_id] = cls(transactional_id, registry)
        return completion

    @staticmethod
    def runs(registry: dict[str, Completion], transactional_id: str) -> bool:
        """Whether the completion of `transactional_id` in `registry` runs."""
        completion = registry.get(transactional_id)
        return completion is not None and completion.running

    @property
    def running(self) -> bool:
        """Whether the task writing markers or the Complete record runs."""
        return self.task is not None and not self.task.done()

    def start(self, spawn: Callable[[], asyncio.Task]) -> asyncio.Task:
        """Run the task `spawn()` creates, unless one runs (that one is returned)."""
        if self.running:
            return self.task
        self.markers_written = None  # of an earlier transaction (version 1 keeps the epoch)
        self.task = task = spawn()
        task.add_done_callback(lambda _: self._release())
        return task

    def markers_done(self, md: TransactionMetadata, prepared: TxnTransitMetadata) -> bool:
        """Every marker of `prepared` is written. True when the completion stops
        here for the handover: a next add waits, and md is still that transaction
        with nothing pending (the add's Ongoing record completes it, or `resume`
        starts the completion again); False: append the Complete record."""
        if self.waiting and md.state is prepared.state and not md.pending_transition_in_progress:
            self.markers_written = (prepared.producer_id, prepared.producer_epoch)
            return True
        return False

    @contextlib.contextmanager
    def next_add_waiting(self) -> Iterator[None]:
        """Count a first add of the next transaction as waiting for this completion."""
        self.waiting += 1
        try:
            yield
        finally:
            self.waiting -= 1
            self._release()

    def hand_over(self, md: TransactionMetadata, wanted: frozenset[TopicPartition],
                  now_ms: int) -> TxnTransitMetadata | ErrorCode:
        """The first add of the next transaction (md PrepareCommit / PrepareAbort):
        the pending transit of the handover row (md.prepare_next_transaction) when
        every marker of md's transaction is written and the task stopped; else
        CONCURRENT_TRANSACTIONS, or INVALID_PRODUCER_EPOCH at an exhausted epoch
        (InitProducerId rotates the PID first)."""
        if (self.markers_written != (md.producer_id, md.producer_epoch) or self.running
                or md.pending_transition_in_progress):
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if md.is_producer_epoch_exhausted:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        return md.prepare_next_transaction(wanted, now_ms)

    def handed_over(self) -> None:
        """The handover's record is written: this transaction is complete."""
        self.markers_written = None
        self._release()

    @staticmethod
    def resume(completion: Completion | None, md: TransactionMetadata) -> bool:
        """Whether md's prepared transaction needs its completion (again): md is
        PrepareCommit / PrepareAbort with nothing pending, and no task runs and no
        next add waits (`completion` None: none ever started here)."""
        if md.state not in _PREPARED or md.pending_transition_in_progress:
            return False
        return completion is None or (not completion.running and not completion.waiting)

    def _release(self) -> None:
        """Leave the registry once nothing is left to do or to wait for."""
        if (not self.running and not self.waiting and self.markers_written is None
                and self._registry.get(self.transactional_id) is self):
            del self._registry[self.transactional_id]


class TxnCompletion:
    """The completion part of `coordinator.TransactionCoordinator`: aborts by the
    coordinator (fencing, timeouts), the markers and the Complete record, the waits
    of the next transaction and the handover. Uses the coordinator's `_append`,
    `_lookup`, `_spawn`, `_retrying`, `_owns`, `_deposed`, clocks, sleep and ports."""

    async def _fence_and_abort(self, part: TxnPartition, md: TransactionMetadata,
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

    def _start_completion(self, part: TxnPartition, md: TransactionMetadata, prepared: TxnTransitMetadata,
                          from_client: bool, cause: str = "client", started: float | None = None) -> asyncio.Task:
        """Write the markers and the Complete record in the background (the id's
        `Completion`; its running task when it already runs). cause (client, timeout,
        fencing) and started (time.monotonic() of the EndTxn) feed the metrics."""
        completion = Completion.of(part.completions, md.transactional_id)
        return completion.start(lambda: self._spawn(
            part, self._complete(part, md, completion, prepared, from_client, cause, started),
            f"txn-complete-{md.transactional_id}"))

    async def _complete(self, part: TxnPartition, md: TransactionMetadata, completion: Completion,
                        prepared: TxnTransitMetadata, from_client: bool, cause: str = "client",
                        started: float | None = None) -> None:
        """The body of a completion's task: the markers, then the Complete record, or
        the handover (`Completion.markers_done`)."""
        if from_client and self.config.test_pause_after_prepare_ms > 0:
            await self._sleep(self.config.test_pause_after_prepare_ms / 1000)
        committed = prepared.state is TxnState.PREPARE_COMMIT
        marker = TxnMarker(*prepared.marker_producer(), committed, part.coordinator_epoch,
                           prepared.partitions, prepared.transaction_version)
        try:
            markers_started = time.monotonic()
            unanswered = await self._write_markers(part, md, marker)
            metrics.MARKER_WRITE_SECONDS.observe(time.monotonic() - markers_started)
            if unanswered and marker.transaction_version < 2:
                await self._outlive_unanswered_markers(part, md, marker)
            if completion.markers_done(md, prepared):
                # The handover: the next transaction's first add is waiting; its Ongoing
                # record completes this transaction (or _resume_completion appends Complete).
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

    async def _write_markers(self, part: TxnPartition, md: TransactionMetadata, marker: TxnMarker) -> bool:
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

    async def _outlive_unanswered_markers(self, part: TxnPartition, md: TransactionMetadata,
                                          marker: TxnMarker) -> None:
        """Transaction version 1 (no epoch bump): the next transaction of the PID has
        the epoch of this one's markers, so a marker request that got no answer and
        still runs at its leader could end that transaction early. Such a request
        reached the leader, if at all, before the retry that wrote the marker (ahead
        of it on the same stream, or before its stream broke), and the leader
        appends nothing past its deadline (MARKER_LEADER_DEADLINE_MS after arrival),
        so the transaction stays PrepareCommit / PrepareAbort, and the next one
        cannot start, until that deadline and a margin (`marker_coordinator_wait_ms`,
        services/common/deadlines.py; monotonic ms) have passed since the last
        marker was written. Raises NotOwner when this coordinator no longer owns
        `part`."""
        wait_ms = marker_coordinator_wait_ms()
        until = self._monotonic() + wait_ms
        log.info("a marker request for %r (PID %d epoch %d) got no answer; the transaction completes in %d ms, "
                 "once that request can no longer append its marker", md.transactional_id, marker.producer_id,
                 marker.producer_epoch, wait_ms)
        while (left := until - self._monotonic()) > 0:
            if not self._owns(part):
                raise NotOwner()
            await self._sleep(left / 1000)
        if not self._owns(part):
            raise NotOwner()

    async def _append_complete(self, part: TxnPartition, md: TransactionMetadata) -> None:
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
        completion = part.completions.get(tid) if part is not None and not err else None
        if completion is not None and completion.running and self.config.txn_previous_completion_wait_ms > 0:
            with completion.next_add_waiting() if handover else contextlib.nullcontext():
                await self._wait_done({completion.task}, self.config.txn_previous_completion_wait_ms)

    def _resume_completion(self, tid: str, group_id: str) -> None:
        """A completion that stopped for the handover, when the add that was to take
        over did not (refused, failed, or never came): write the Complete record after
        all (the markers are written again first; they are idempotent)."""
        err, part = self._lookup(tid, group_id)
        md = part.txns.get(tid) if part is not None and not err else None
        completion = part.completions.get(tid) if md is not None else None
        if md is not None and (Completion.resume(completion, md)):
            self._start_completion(part, md, md.snapshot(), from_client=False)

    async def _start_next_transaction(self, part: TxnPartition, md: TransactionMetadata,
                                      wanted: frozenset[TopicPartition]) -> ErrorCode:
        """The first AddPartitionsToTxn / AddOffsetsToTxn of the producer's next
        transaction while md is PrepareCommit / PrepareAbort: the handover
        (`Completion.hand_over`) when every marker of md's transaction is written and
        its completion stopped for it, else CONCURRENT_TRANSACTIONS (or
        INVALID_PRODUCER_EPOCH at an exhausted epoch). Returns the append's code."""
        completion = part.completions.get(md.transactional_id)
        if completion is None:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        transit = completion.hand_over(md, wanted, self._clock())
        if isinstance(transit, ErrorCode):
            return transit
        committed = md.state is TxnState.PREPARE_COMMIT

        def handed_over() -> None:  # the Ongoing record also completed the previous transaction
            completion.handed_over()
            metrics.completed(committed, "client")
        return await self._append(part, md, transit, handed_over)
