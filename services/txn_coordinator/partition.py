"""One owned partition of `__transaction_state` and its cache (the transaction
coordinator's state per partition; docs/design.md, "Transaction Coordinator")."""
from __future__ import annotations

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
        # bind_producer_ids): producer id -> binding, and its last use (monotonic ms).
        self.bindings: dict[int, txn_log.ProducerIdBinding] = {}
        self.binding_used: dict[int, int] = {}
        # The highest metadata.version the partition's feature-level records record
        # (services.common.cluster.features; the baseline without one).
        self.recorded_level = 0

    def generation(self, group_id: str) -> int:
        """The newest generation of `group_id` a group-aware InitProducerId recorded
        here (-1: none)."""
        return max((a.generation_id for a in self.groups.get(group_id, {}).values()), default=-1)

    @property
    def serving(self) -> bool:
        return not self.loading and self.error is None

