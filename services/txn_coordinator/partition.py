"""One owned partition of the transaction log and its cache (the transaction
coordinator's state per partition; docs/design.md, "Transaction Coordinator"), and
`TxnPartition.replay`, the one function that applies a record of the log to that
cache, and `Completion`, the running completion of one transactional.id the cache
keeps (Kafka's `CoordinatorShard.replay`): every record when a partition loads, and a
group assignment, producer-id binding or feature-level record when it was written;
and `Completion`, the completion of one transactional.id's prepared transaction that
the cache keeps while it runs (completion.Completions runs it).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from typing import Callable, Iterator

from services.common.cluster import features
from services.common.cluster.owned import OwnedPartition
from services.common.nested import put_or_remove

from . import txn_log
from .state import GroupAssignment, TransactionMetadata, TxnState, TxnTransitMetadata

log = logging.getLogger(__name__)


class TxnPartition(OwnedPartition):
    """One owned partition of the transaction log and its transaction status cache:
    txns (transactional.id -> metadata), completions (transactional.id -> its
    `Completion`: the task writing the markers and the Complete record of its
    prepared transaction, and the handover), back_to_back (the transactional.ids whose
    producer started its last transaction while the previous one was completing or
    within exactly.txn.handover.wait.ms after: their completions wait that long for the
    next add before appending a Complete record of their own), groups (KIP-447 draft
    group assignments),
    bindings / binding_used (producer-id bindings and their last use), recorded_level
    (the metadata.version its feature-level records record), error (corrupt log: the
    partition is disabled and answers NOT_COORDINATOR)."""

    def __init__(self, partition: int, coordinator_epoch: int, producer_id: int = -1,
                 producer_epoch: int = -1, retired_producer_id: int = -1):
        super().__init__(partition, coordinator_epoch, producer_id, producer_epoch, retired_producer_id)
        self.error: str | None = None
        self.txns: dict[str, TransactionMetadata] = {}
        self.completions: dict[str, Completion] = {}
        self.back_to_back: set[str] = set()
        # KIP-447 draft: group id -> {transactional.id -> its group assignment}, from
        # the group assignment records of this partition.
        self.groups: dict[str, dict[str, GroupAssignment]] = {}
        # transactional.id -> its latest group assignment record (what a transactional.id
        # whose first record follows its assignment's starts with).
        self._assigned: dict[str, GroupAssignment] = {}
        # Producer-id bindings of the producer ids p with p % n == partition (with
        # bind_producer_ids): producer id -> binding, and its last use (monotonic ms);
        # changed through bind / unbind, which keep `held` in step.
        self.bindings: dict[int, txn_log.ProducerIdBinding] = {}
        self.binding_used: dict[int, int] = {}
        self.held = HeldByPrincipal()
        # The highest metadata.version the partition's feature-level records record
        # (services.common.cluster.features; the baseline without one).
        self.recorded_level = features.BASELINE_LEVEL

    def generation(self, group_id: str) -> int:
        """The newest generation of `group_id` a group-aware InitProducerId recorded
        here (-1: none)."""
        return max((a.generation_id for a in self.groups.get(group_id, {}).values()), default=-1)

    @property
    def serving(self) -> bool:
        return not self.loading and self.error is None

    def bind(self, producer_id: int, binding: txn_log.ProducerIdBinding, used_ms: int) -> None:
        """`producer_id` is bound to `binding`, last used at `used_ms` (monotonic ms)."""
        old = self.bindings.get(producer_id)
        if old is not None:
            self.held.remove(old)
        self.bindings[producer_id] = binding
        self.binding_used[producer_id] = used_ms
        self.held.add(binding)

    def unbind(self, producer_id: int) -> None:
        """`producer_id` is bound to no one any more."""
        old = self.bindings.pop(producer_id, None)
        self.binding_used.pop(producer_id, None)
        if old is not None:
            self.held.remove(old)

    def replay(self, entry: object, used_at_ms: int) -> None:
        """Apply one record of this partition's log (an entry of
        `txn_log.decode_fetched`) to the cache, in log order:

        - TxnLogEntry: the last record of a transactional.id wins ("Transaction
          Coordinator Startup" 1.b; `TransactionMetadata.replay`), a tombstone removes
          it. A record whose epoch is lower than the one before of the same PID is not
          an error: an append whose outcome the coordinator could not learn (a
          timeout, a leader change after the local append) may have landed while the
          coordinator went on from its previous state, so the log can hold, say, a
          PrepareAbort at epoch e+1 followed by a commit at epoch e. The later record
          is what the coordinator acted on last; it wins, and the regression is logged.
        - GroupAssignmentEntry (KIP-447 draft): the transactional.id's assignment in
          its group, a tombstone removes it; also set on its metadata.
        - ProducerIdBindingEntry: the producer id's binding, used at `used_at_ms`
          (monotonic ms); a tombstone removes it.
        - FeatureLevelEntry: the highest metadata.version recorded.

        A transaction record is replayed only at load: when written, its transition
        is completed by the state machine (`TransactionMetadata.complete_transition`,
        through the same apply function as `TransactionMetadata.replay`)."""
        if isinstance(entry, txn_log.TxnLogEntry):
            self._replay_transaction(entry)
        elif isinstance(entry, txn_log.GroupAssignmentEntry):
            put_or_remove(self.groups, entry.group_id, entry.transactional_id, entry.assignment)
            tid, assignment = entry.transactional_id, entry.assignment
            current = self._assigned.get(tid)
            if assignment is not None:
                self._assigned[tid] = assignment
            elif current is not None and current.group_id == entry.group_id:
                del self._assigned[tid]
            md = self.txns.get(tid)
            if md is not None and (assignment is not None or md.group is None
                                   or md.group.group_id == entry.group_id):
                md.group = assignment
        elif isinstance(entry, txn_log.ProducerIdBindingEntry):
            if entry.binding is None:
                self.unbind(entry.producer_id)
            else:
                self.bind(entry.producer_id, entry.binding, used_at_ms)
        elif isinstance(entry, txn_log.FeatureLevelEntry):
            self.recorded_level = max(self.recorded_level, entry.metadata_version)
        else:
            raise TypeError(f"not a record of the transaction log: {entry!r}")

    def _replay_transaction(self, entry: txn_log.TxnLogEntry) -> None:
        tid, transit = entry.transactional_id, entry.transit
        if transit is None:
            self.txns.pop(tid, None)
            return
        md = self.txns.get(tid)
        if md is None:
            self.txns[tid] = TransactionMetadata.from_transit(tid, transit, group=self._assigned.get(tid))
            return
        if md.producer_id == transit.producer_id and transit.producer_epoch < md.producer_epoch:
            log.warning("transactional.id %r at offset %d: epoch %d of PID %d follows the higher epoch %d; "
                        "the later record wins", tid, entry.offset, transit.producer_epoch, transit.producer_id,
                        md.producer_epoch)
        md.replay(transit)


class Completion:
    """The completion of one transactional.id's PrepareCommit / PrepareAbort
    transaction, kept in its partition's `completions` while it runs or while a next
    add waits for it.

    task: the background task writing the markers and the Complete record (None
    before `start`). waiting: how many AddPartitionsToTxn / AddOffsetsToTxn of the
    next transaction wait for it.

    start: run the task unless it runs. markers_done: the task's step once every
    marker is written; with a next add waiting it records that fact on the metadata
    (`TransactionMetadata.record_markers_written`) and stops there for the handover.
    arrival: a future the task may wait on (up to exactly.txn.handover.wait.ms) for a
    next add, resolved when one starts waiting (`next_add_waiting`) or by `nudge` (a
    request that needs the Complete record now: InitProducerId, PrepareTxn).
    resume: whether a completion stopped for the handover must run again because
    the add did not take over."""

    def __init__(self, transactional_id: str, registry: dict[str, Completion]):
        self.transactional_id = transactional_id
        self.task: asyncio.Task | None = None
        self.waiting = 0
        self._registry = registry
        self._arrival: asyncio.Future | None = None

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
        self.task = task = spawn()
        task.add_done_callback(lambda _: self._release())
        return task

    def markers_done(self, md: TransactionMetadata, prepared: TxnTransitMetadata) -> bool:
        """Every marker of `prepared` is written. True when the completion stops
        here for the handover: a next add waits, and md recorded the fact
        (`record_markers_written`: md is still that transaction with nothing
        pending), so that add's Ongoing record completes it (or `resume` starts the
        completion again); False: append the Complete record."""
        return bool(self.waiting) and md.record_markers_written(prepared)

    def arrival(self) -> asyncio.Future:
        """A future resolved when a next add starts waiting or `nudge` is called
        (already resolved if one of them happened since the last `arrival`)."""
        if self._arrival is None:
            self._arrival = asyncio.get_running_loop().create_future()
        return self._arrival

    def nudge(self) -> None:
        """End a wait on `arrival` now (a next add came, or a request needs the
        Complete record without the handover)."""
        arrival = self.arrival()
        if not arrival.done():
            arrival.set_result(None)

    @contextlib.contextmanager
    def next_add_waiting(self) -> Iterator[None]:
        """Count a first add of the next transaction as waiting for this completion
        (which ends its wait on `arrival`)."""
        self.waiting += 1
        self.nudge()
        try:
            yield
        finally:
            self.waiting -= 1
            self._release()

    @staticmethod
    def resume(completion: Completion | None, md: TransactionMetadata) -> bool:
        """Whether md's prepared transaction needs its completion (again): md is
        PrepareCommit / PrepareAbort with nothing pending, and no task runs and no
        next add waits (`completion` None: none runs here)."""
        if md.state not in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT) or md.pending_transition_in_progress:
            return False
        return completion is None or (not completion.running and not completion.waiting)

    def _release(self) -> None:
        """Leave the registry once nothing is left to do or to wait for."""
        if not self.running and not self.waiting and self._registry.get(self.transactional_id) is self:
            del self._registry[self.transactional_id]


class HeldByPrincipal:
    """What each principal holds through its producer-id bindings in one partition
    (exactly.producer.ids.max.per.principal, exactly.transactional.ids.max.per.principal):
    its idempotent bindings, and per transactional.id the bindings naming it."""

    __slots__ = ("idempotent", "tids")

    def __init__(self) -> None:
        self.idempotent: Counter[str] = Counter()
        self.tids: dict[str, Counter[str]] = {}

    def add(self, binding: txn_log.ProducerIdBinding) -> None:
        if binding.transactional_id:
            self.tids.setdefault(binding.principal, Counter())[binding.transactional_id] += 1
        else:
            self.idempotent[binding.principal] += 1

    def remove(self, binding: txn_log.ProducerIdBinding) -> None:
        if binding.transactional_id:
            held = self.tids.get(binding.principal)
            if held is None:
                return
            held[binding.transactional_id] -= 1
            if held[binding.transactional_id] <= 0:
                del held[binding.transactional_id]
                if not held:
                    del self.tids[binding.principal]
        else:
            self.idempotent[binding.principal] -= 1
            if self.idempotent[binding.principal] <= 0:
                del self.idempotent[binding.principal]

    def transactional_ids(self, principal: str) -> int:
        return len(self.tids.get(principal, ()))

    def holds(self, principal: str, transactional_id: str) -> bool:
        return transactional_id in self.tids.get(principal, ())
