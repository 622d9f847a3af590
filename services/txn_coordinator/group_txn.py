"""The KIP-447 draft (group-aware transactions, "Proposed Changes") of the
transaction coordinator, behind narrow hooks.

A producer of a consumer group initialises with the group's generation and assigned
input partitions, lives on the `__transaction_state` partition of crc32(group id),
fences the open transactions of the group's other producers on those partitions, and
is refused (ILLEGAL_GENERATION) once a newer generation was recorded. The
assignments are records of their own in the transaction log.

`GroupTxn` is a part of `coordinator.TransactionCoordinator`; the rest of it reaches
the draft only through these hooks: `_init_group` (InitProducerId),
`_recorded_assignment` (a new transactional.id's metadata), `_check_generation`
(every later request), `_forget_group` (transactional.id expiration) and
`_loaded_groups` (the load).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from exactly_wire.error_codes import RETRIABLE, ErrorCode
from services.common.nested import put_or_remove

from . import txn_log
from .ports import AMBIGUOUS_APPEND_ERRORS, InitProducerIdResult
from .state import COMPLETED_STATES, GroupAssignment, TransactionMetadata, TxnState

if TYPE_CHECKING:
    from .partition import TxnPartition


class GroupTxn:
    """The KIP-447 draft part of the coordinator. Uses the coordinator's `_lookup`,
    `_spawn`, `_shielded`, `_fence_and_abort`, `_owns`, `_restart`, `_is_fenced`, clock and log."""

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

    async def _append_group(self, part: TxnPartition, tid: str, assignment: GroupAssignment | None,
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
        return await self._shielded(self._append_group_and_apply(part, tid, group_id, assignment, batch),
                                    f"txn-append-group-{tid}")

    async def _append_group_and_apply(self, part: TxnPartition, tid: str, group_id: str,
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
        put_or_remove(part.groups, group_id, tid, assignment)
        md = part.txns.get(tid)
        if md is not None:
            md.group = assignment
        return ErrorCode.NONE

    @staticmethod
    def _check_generation(part: TxnPartition, md: TransactionMetadata, group_id: str,
                          generation_id: int) -> ErrorCode:
        """KIP-447 draft: a group-aware producer's request must carry the generation it
        initialised with, and no newer generation of the group may have been recorded
        since ("it will refuse to handle requests from the previous generation")."""
        if md.group is None or md.group.group_id != group_id:
            return ErrorCode.ILLEGAL_GENERATION
        if generation_id != md.group.generation_id or generation_id < part.generation(group_id):
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    @staticmethod
    def _recorded_assignment(part: TxnPartition, group_id: str, tid: str) -> GroupAssignment | None:
        """The hook of a new transactional.id's metadata: the group assignment recorded
        for `tid` in `group_id` (None: none, or `group_id` empty)."""
        return part.groups.get(group_id, {}).get(tid)

    async def _forget_group(self, part: TxnPartition, tid: str, group: GroupAssignment | None) -> None:
        """The hook of transactional.id expiration: tombstone the group assignment of
        the expired `tid` (best effort: a failed tombstone leaves an assignment without
        its id, which blocks nothing and is replaced by a later init)."""
        if group is not None:
            await self._append_group(part, tid, None, group.group_id)

    @staticmethod
    def _loaded_groups(entries: list[txn_log.TxnLogEntry],
                       txns: dict[str, TransactionMetadata]) -> dict[str, dict[str, GroupAssignment]]:
        """The hook of the load: the group assignments replayed from `entries`, each
        also set on its transactional.id's metadata in `txns`. Raises
        txn_log.CorruptTxnLogError."""
        groups = txn_log.rebuild_groups(entries)
        for members in groups.values():
            for tid, assignment in members.items():
                if tid in txns:
                    txns[tid].group = assignment
        return groups
