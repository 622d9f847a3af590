"""The completion of prepared transactions: markers, the Complete record and the
handover (design doc "Two-phase commit with markers"; docs/design.md, "Prepare ->
append -> complete").

After the PrepareCommit / PrepareAbort record, the markers are written to every
partition of the transaction, then the CompleteCommit / CompleteAbort record is
appended -- or, when the producer's next transaction already asks for its first
partition, that add's Ongoing record completes this transaction too (the handover:
the guarded row of the transition table, `state.Guard.MARKERS_WRITTEN`, whose fact
the completion records on the metadata: `TransactionMetadata.record_markers_written`).

`partition.Completion` is that work for one transactional.id: its task and the next
adds waiting for it. `Completions` runs it over the store and the markers port: aborts by
the coordinator, the markers, the Complete record, the wait of the next transaction
for the previous one, the handover and the resumption of a completion the handover
did not take over.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Awaitable, Callable, Iterable

from exactly_wire.clock import Clock, monotonic_ms, wall_clock_ms
from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from services.common.cluster.owned import NotOwner, RetryLater, code_name
from services.common.protocol import marker_coordinator_wait_ms
from services.common.settings import TxnCoordinatorSchema

from . import metrics
from .partition import Completion, TxnPartition
from .ports import UNANSWERED_MARKER_ERRORS, MarkerWriter, Topology, TxnMarker
from .state import TransactionMetadata, TxnState, TxnTransitMetadata

if TYPE_CHECKING:
    from .store import TxnStore

log = logging.getLogger(__name__)



class Completions:
    """The completions of the prepared transactions of the owned partitions: aborts
    by the coordinator (fencing, timeouts), the markers and the Complete record, the
    next transaction's wait for the previous one, the handover, and the resumption
    of a completion the handover did not take over.

    store: the transaction metadata (store.TxnStore: lookup, append, the owned
    partitions' tasks and retries); markers: the WriteTxnMarkers port
    (ports.MarkerWriter); topology: ports.Topology (a deleted partition gets no
    marker); config: the parsed settings (TxnCoordinatorSchema); clock: wall-clock
    ms; monotonic: ms of a monotonic clock (the waits' deadlines); sleep: async
    (seconds) -> None, raced with the monotonic clock (injected in tests)."""

    def __init__(self, store: TxnStore, markers: MarkerWriter, topology: Topology,
                 config: TxnCoordinatorSchema | None = None, clock: Clock = wall_clock_ms,
                 monotonic: Clock = monotonic_ms, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self._store = store
        self._owned = store.owned
        self._markers = markers
        self._topology = topology
        self.config = config or TxnCoordinatorSchema()
        self._clock = clock
        self._monotonic = monotonic
        self._sleep = sleep

    async def fence_and_abort(self, part: TxnPartition, md: TransactionMetadata, cause: str = "fencing") -> ErrorCode:
        """Abort md's ongoing transaction with a bumped epoch (fences the producer on
        the coordinator and, through the markers, on the partition leaders). cause:
        "fencing" or "timeout" (metrics). CONCURRENT_TRANSACTIONS when md is not
        Ongoing with nothing pending (or not owned), else the append's code."""
        if not self._owned.owns(part) or md.pending_transition_in_progress or md.state is not TxnState.ONGOING:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        now = self._clock()
        md.prepare_fence_producer_epoch(now)
        transit = md.prepare_abort_or_commit(TxnState.PREPARE_ABORT, now)

        def aborting() -> None:
            log.info("fenced %r: aborting its transaction with PID %d epoch %d", md.transactional_id,
                     transit.producer_id, transit.producer_epoch)
            self.start(part, md, transit, from_client=False, cause=cause)
        return await self._store.append(part, md, transit, aborting)

    def start(self, part: TxnPartition, md: TransactionMetadata, prepared: TxnTransitMetadata,
              from_client: bool, cause: str = "client", started: float | None = None) -> asyncio.Task:
        """Write the markers and the Complete record of `prepared` (md's
        PrepareCommit / PrepareAbort transit) in the background: the id's
        `Completion`, its running task when it already runs. from_client: an
        EndTxn's (exactly.test.pause.after.prepare.ms applies). cause (client,
        timeout, fencing) and started (time.monotonic() of the EndTxn) feed the
        metrics."""
        completion = Completion.of(part.completions, md.transactional_id)
        return completion.start(lambda: self._owned.spawn(
            part, self._complete(part, md, completion, prepared, from_client, cause, started),
            f"txn-complete-{md.transactional_id}"))

    def running(self, part: TxnPartition, transactional_id: str) -> bool:
        """Whether the completion of `transactional_id` in `part` runs."""
        return Completion.runs(part.completions, transactional_id)

    async def wait(self, tasks: Iterable[asyncio.Future], timeout_ms: int) -> None:
        """Wait until every one of `tasks` is done, or until `timeout_ms` ms of the
        injected monotonic clock have passed, whichever comes first; the tasks are
        never cancelled. The deadline is raced with the injected sleep (docs/design.md,
        "Clocks"): the sleep may return early (a test's), the monotonic clock decides."""
        deadline = self._monotonic() + timeout_ms
        pending = {t for t in tasks if not t.done()}
        while pending and (left := deadline - self._monotonic()) > 0:
            if self._sleep is asyncio.sleep:
                await _first_done(pending, left / 1000)  # the same wait without a timer task
                pending = {t for t in pending if not t.done()}
                continue
            timer = asyncio.ensure_future(self._sleep(left / 1000))
            try:
                _, pending = await asyncio.wait(pending | {timer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
            pending.discard(timer)

    async def wait_previous(self, tid: str, group_id: str = "", handover: bool = False) -> None:
        """Wait (up to exactly.txn.previous.completion.wait.ms) while the id's previous
        transaction completes: EndTxn answers once the Prepare record is durable, and the
        producer's next transaction may only start after the markers are written (so it
        never becomes visible before them). Waiting here instead of answering
        CONCURRENT_TRANSACTIONS at once saves the producer a retry loop; on timeout the
        caller answers CONCURRENT_TRANSACTIONS as before. handover: the waiter is the
        next transaction's first add, which may start that transaction with the record
        that also completes this one (`hand_over`); the completion then stops once the
        markers are written, without a Complete record of its own."""
        err, part = self._store.lookup(tid, group_id)
        completion = part.completions.get(tid) if part is not None and not err else None
        if handover and part is not None and not err:
            self._note_back_to_back(part, tid, completion)
        if completion is not None and completion.running and self.config.txn_previous_completion_wait_ms > 0:
            if not handover:
                completion.nudge()  # no handover to wait for: the Complete record now
            with completion.next_add_waiting() if handover else contextlib.nullcontext():
                await self.wait({completion.task}, self.config.txn_previous_completion_wait_ms)

    def _note_back_to_back(self, part: TxnPartition, tid: str, completion: Completion | None) -> None:
        """A first add of `tid`'s next transaction arrived: its producer runs
        transactions back to back when the previous one is still completing, or
        completed at most exactly.txn.handover.wait.ms ago (monotonic ms); its next
        completions then wait that long for the handover (`_complete`)."""
        window = self.config.txn_handover_wait_ms
        if window <= 0 or self.config.txn_previous_completion_wait_ms <= 0 or \
                self.config.txn_end_completion_wait_ms > 0:
            # No handover to wait for: the add does not wait for the completion, or
            # EndTxn waits for the Complete record, so no next add comes before it.
            return
        if completion is not None and completion.running:
            part.back_to_back.add(tid)
            return
        md = part.txns.get(tid)
        if (md is not None and md.state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
                and md.updated_monotonic_ms is not None and self._monotonic() - md.updated_monotonic_ms <= window):
            part.back_to_back.add(tid)

    def nudge(self, part: TxnPartition, tid: str) -> None:
        """A request that needs `tid`'s Complete record without the handover
        (InitProducerId while it completes): its completion stops waiting for a next
        add."""
        completion = part.completions.get(tid)
        if completion is not None and completion.running:
            completion.nudge()

    def resume(self, tid: str, group_id: str) -> None:
        """A completion that stopped for the handover, when the add that was to take
        over did not (refused, failed, or never came): write the Complete record after
        all (the markers are written again first; they are idempotent)."""
        err, part, md = self._store.metadata(tid, group_id)
        if md is not None and not err and Completion.resume(part.completions.get(tid), md):
            part.back_to_back.discard(tid)  # the add failed: the Complete record without waiting for another
            self.start(part, md, md.snapshot(), from_client=False)

    async def hand_over(self, part: TxnPartition, md: TransactionMetadata,
                        wanted: frozenset[TopicPartition]) -> ErrorCode:
        """The first AddPartitionsToTxn / AddOffsetsToTxn of the producer's next
        transaction while md is PrepareCommit / PrepareAbort: the handover row
        (`TransactionMetadata.prepare_next_transaction`, whose guard md checks
        itself) when md records every marker of its transaction as written and no
        completion runs; else CONCURRENT_TRANSACTIONS (or INVALID_PRODUCER_EPOCH at
        an exhausted epoch: InitProducerId rotates the PID first). Returns the
        append's code."""
        if (self.running(part, md.transactional_id) or md.pending_transition_in_progress
                or not md.markers_written):
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if md.is_producer_epoch_exhausted:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        committed = md.state is TxnState.PREPARE_COMMIT
        transit = md.prepare_next_transaction(wanted, self._clock())
        # The Ongoing record also completes the previous transaction.
        return await self._store.append(part, md, transit, lambda: metrics.completed(committed, "client"))

    # ------------------------------------------------------------ the task
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
            if (not completion.waiting and md.transactional_id in part.back_to_back
                    and self.config.txn_handover_wait_ms > 0):
                # A producer running transactions back to back: its next add usually
                # comes within the window, and its Ongoing record then completes this
                # transaction too: one append instead of two, and the add does not wait
                # for a Complete record in flight.
                await self.wait({completion.arrival()}, self.config.txn_handover_wait_ms)
            if completion.markers_done(md, prepared):
                # The handover: the next transaction's first add is waiting; its Ongoing
                # record completes this transaction (or `resume` appends Complete).
                if started is not None:  # complete for every reader now: its markers are written
                    metrics.END_TO_COMPLETE_SECONDS.observe(time.monotonic() - started)
                return
            part.back_to_back.discard(md.transactional_id)  # no next add came in time
            async for attempt in self._owned.retrying():
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
        async for attempt in self._owned.retrying():
            with attempt:
                if not self._owned.owns(part):
                    raise NotOwner()
                if not remaining:
                    return unanswered
                # The first attempt writes `marker` as it is; a retry, the partitions left.
                results = await self._markers.write(marker if len(remaining) == len(marker.partitions)
                                                    else replace(marker, partitions=frozenset(remaining)))
                for tp, code in results.items():
                    if tp not in remaining:
                        continue
                    unanswered = unanswered or code in UNANSWERED_MARKER_ERRORS
                    if code == ErrorCode.NONE:
                        remaining.discard(tp)
                    elif code == ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                        # A marker of a newer coordinator epoch is there: we were replaced.
                        self._owned.deposed(part, f"marker for {md.transactional_id!r} on {tp[0]}-{tp[1]} rejected "
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
        services/common/protocol.py; monotonic ms) have passed since the last
        marker was written. Raises NotOwner when this coordinator no longer owns
        `part`."""
        wait_ms = marker_coordinator_wait_ms()
        until = self._monotonic() + wait_ms
        log.info("a marker request for %r (PID %d epoch %d) got no answer; the transaction completes in %d ms, "
                 "once that request can no longer append its marker", md.transactional_id, marker.producer_id,
                 marker.producer_epoch, wait_ms)
        while (left := until - self._monotonic()) > 0:
            if not self._owned.owns(part):
                raise NotOwner()
            await self._sleep(left / 1000)
        if not self._owned.owns(part):
            raise NotOwner()

    async def _append_complete(self, part: TxnPartition, md: TransactionMetadata) -> None:
        if not self._owned.owns(part):
            raise NotOwner()
        if md.state not in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return  # already completed (a concurrent completion won)
        if md.pending_transition_in_progress:
            raise RetryLater("transition pending")
        err = await self._store.append(part, md, md.prepare_complete(self._clock()))
        if err == ErrorCode.NOT_COORDINATOR:
            raise NotOwner()
        if err:
            raise RetryLater(f"appending the completion failed: {code_name(err)}")


async def _first_done(futures: set[asyncio.Future], timeout_s: float) -> None:
    """Return once one of `futures` is done or `timeout_s` passed (loop time), whichever
    comes first, without cancelling them: asyncio.wait(FIRST_COMPLETED) with a timer
    task, done with one future and one timer handle (a commit under load waits this way
    once or twice)."""
    loop = asyncio.get_running_loop()
    waker = loop.create_future()

    def wake(_=None) -> None:
        if not waker.done():
            waker.set_result(None)
    handle = loop.call_later(timeout_s, wake)
    for f in futures:
        f.add_done_callback(wake)
    try:
        await waker
    finally:
        handle.cancel()
        for f in futures:
            f.remove_done_callback(wake)
