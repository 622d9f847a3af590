"""The KIP-447 draft (group-aware transactions, "Proposed Changes") of the
transaction coordinator, behind narrow hooks.

A producer of a consumer group initialises with the group's generation and assigned
input partitions, lives on the transaction log partition of crc32(group id),
fences the open transactions of the group's other producers on those partitions, and
is refused (ILLEGAL_GENERATION) once a newer generation was recorded. The
assignments are records of their own in the transaction log, applied by the
partition's replay (partition.TxnPartition.replay) when written and when loaded.

`GroupTxn` is the draft's part; the requests reach it only through its hooks:
`init` (InitProducerId), `recorded_assignment` (a new transactional.id's
metadata), `check_generation` (every later request) and `forget`
(transactional.id expiration).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from exactly_wire.error_codes import ErrorCode

from .ports import InitProducerIdResult
from .state import COMPLETED_STATES, GroupAssignment, TransactionMetadata, TxnState

if TYPE_CHECKING:
    from .completion import Completions
    from .partition import TxnPartition
    from .store import TxnStore


class GroupTxn:
    """The KIP-447 draft part of the coordinator.

    store: the transaction metadata (store.TxnStore: lookup, the group assignment
    records, the owned partitions' tasks); completions: completion.Completions (the
    fencing abort of another producer's transaction)."""

    def __init__(self, store: TxnStore, completions: Completions):
        self._store = store
        self._completions = completions

    async def init(self, tid: str, group: GroupAssignment) -> InitProducerIdResult | None:
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
        err, part = self._store.lookup(tid, group.group_id)
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
                self._store.owned.spawn(part, self._completions.fence_and_abort(part, other),
                                        f"txn-group-fence-{other_tid}")
        if waiting:
            return InitProducerIdResult(ErrorCode.PENDING_TRANSACTION,
                                        message=f"transactions of {sorted(waiting)} on partitions newly assigned "
                                                "to this producer are being completed")
        if part.groups.get(group.group_id, {}).get(tid) == group:
            return None
        err = await self._store.append_group(part, tid, group)
        return InitProducerIdResult(err) if err else None

    @staticmethod
    def check_generation(part: TxnPartition, md: TransactionMetadata, group_id: str,
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
    def recorded_assignment(part: TxnPartition, group_id: str, tid: str) -> GroupAssignment | None:
        """The hook of a new transactional.id's metadata: the group assignment recorded
        for `tid` in `group_id` (None: none, or `group_id` empty)."""
        return part.groups.get(group_id, {}).get(tid)

    async def forget(self, part: TxnPartition, tid: str, group: GroupAssignment | None) -> None:
        """The hook of transactional.id expiration: tombstone the group assignment of
        the expired `tid` (best effort: a failed tombstone leaves an assignment without
        its id, which blocks nothing and is replaced by a later init)."""
        if group is not None:
            await self._store.append_group(part, tid, None, group.group_id)
