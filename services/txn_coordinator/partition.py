"""One owned partition of `__transaction_state` and its cache (the transaction
coordinator's state per partition; docs/design.md, "Transaction Coordinator")."""
from __future__ import annotations

from collections import Counter

from services.common.cluster.owned import OwnedPartition

from . import txn_log
from .completion import Completion
from .state import GroupAssignment, TransactionMetadata


class TxnPartition(OwnedPartition):
    """One owned partition of `__transaction_state` and its transaction status cache:
    txns (transactional.id -> metadata), completions (transactional.id -> its
    `Completion`: the task writing the markers and the Complete record of its
    prepared transaction, and the handover), groups (KIP-447 draft group assignments),
    error (corrupt log: the partition is disabled and answers NOT_COORDINATOR)."""

    def __init__(self, partition: int, coordinator_epoch: int, producer_id: int = -1,
                 producer_epoch: int = -1, retired_producer_id: int = -1):
        super().__init__(partition, coordinator_epoch, producer_id, producer_epoch, retired_producer_id)
        self.error: str | None = None
        self.txns: dict[str, TransactionMetadata] = {}
        self.completions: dict[str, Completion] = {}
        # KIP-447 draft: group id -> {transactional.id -> its group assignment}, from
        # the group assignment records of this partition.
        self.groups: dict[str, dict[str, GroupAssignment]] = {}
        # Producer-id bindings of the producer ids p with p % n == partition (with
        # bind_producer_ids): producer id -> binding, and its last use (monotonic ms);
        # changed through bind / unbind / set_bindings, which keep `held` in step.
        self.bindings: dict[int, txn_log.ProducerIdBinding] = {}
        self.binding_used: dict[int, int] = {}
        # The highest metadata.version the partition's feature-level records record
        # (services.common.cluster.features; the baseline without one).
        self.recorded_level = 0
        self.held = HeldByPrincipal()

    def bind(self, producer_id: int, binding: txn_log.ProducerIdBinding, used_ms: int) -> None:
        old = self.bindings.get(producer_id)
        if old is not None:
            self.held.remove(old)
        self.bindings[producer_id] = binding
        self.binding_used[producer_id] = used_ms
        self.held.add(binding)

    def unbind(self, producer_id: int) -> None:
        old = self.bindings.pop(producer_id, None)
        self.binding_used.pop(producer_id, None)
        if old is not None:
            self.held.remove(old)

    def set_bindings(self, bindings: dict[int, txn_log.ProducerIdBinding], used_ms: int) -> None:
        """The bindings replayed from the log (a load), each counted as used at `used_ms`."""
        self.bindings = bindings
        self.binding_used = {pid: used_ms for pid in bindings}
        self.held = HeldByPrincipal()
        for binding in bindings.values():
            self.held.add(binding)

    def generation(self, group_id: str) -> int:
        """The newest generation of `group_id` a group-aware InitProducerId recorded
        here (-1: none)."""
        return max((a.generation_id for a in self.groups.get(group_id, {}).values()), default=-1)

    @property
    def serving(self) -> bool:
        return not self.loading and self.error is None



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
