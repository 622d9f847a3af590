"""Committed and pending transactional offsets of the groups of one
`CONSUMER_OFFSETS_TOPIC` partition, as materialised from that partition's log. Pure.

Follows the KIP-98 design document, "Consumer Coordinator" ("Client-Coordinator
request handling" and "Consumer Coordinator Startup"): an offset commit written
by TxnOffsetCommit (a transactional batch with the producer's PID) is held as
pending for that PID and is only put into the cache when the COMMIT marker of
that PID appears in the partition; an ABORT marker forgets it. KIP-447:
OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for partitions
with a pending transactional offset.

As in Kafka's GroupMetadata, every committed offset remembers the log offset of
the record that wrote it, and a transactional offset materialised by a COMMIT
marker only replaces a committed offset written earlier in the log.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple

from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from services.common.nested import put_or_remove

NO_OFFSET = -1


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """A committed position: `offset` is the next offset to consume;
    leader_epoch -1 is unknown; commit_timestamp_ms is wall-clock ms."""

    offset: int
    metadata: str = ""
    leader_epoch: int = -1
    commit_timestamp_ms: int = -1


@dataclass(frozen=True, slots=True)
class FetchedOffset:
    """One partition of an OffsetFetch answer (offset -1: none committed)."""

    offset: int
    metadata: str
    error: ErrorCode
    leader_epoch: int = -1


class _Entry(NamedTuple):
    value: OffsetAndMetadata
    log_offset: int  # offset of the CONSUMER_OFFSETS_TOPIC record that wrote it


class OffsetStore:
    """Offsets of the groups of one `CONSUMER_OFFSETS_TOPIC` partition.

    Mutated only by applying log records in log order (`apply_commit`,
    `apply_txn_commit`, `complete_txn`); read by `fetch`.
    """

    def __init__(self) -> None:
        self._committed: dict[str, dict[TopicPartition, _Entry]] = {}
        # producer id -> group -> partition -> pending entry
        self._pending: dict[int, dict[str, dict[TopicPartition, _Entry]]] = {}

    # ------------------------------------------------------------ applying the log

    def apply_commit(self, group: str, tp: TopicPartition, value: OffsetAndMetadata | None,
                     log_offset: int) -> None:
        """A non-transactional offset commit record at `log_offset` (value None:
        tombstone, the committed offset is deleted)."""
        put_or_remove(self._committed, group, tp, None if value is None else _Entry(value, log_offset))

    def apply_txn_commit(self, producer_id: int, group: str, tp: TopicPartition,
                         value: OffsetAndMetadata, log_offset: int) -> None:
        """A transactional offset commit record of `producer_id` at `log_offset`:
        pending until that PID's marker."""
        self._pending.setdefault(producer_id, {}).setdefault(group, {})[tp] = _Entry(value, log_offset)

    def complete_txn(self, producer_id: int, committed: bool) -> set[str]:
        """A COMMIT (committed=True) or ABORT marker of `producer_id`: its pending
        offsets become committed offsets, or are discarded. Returns the groups
        that had pending offsets of this PID."""
        groups = self._pending.pop(producer_id, {})
        if committed:
            for group, entries in groups.items():
                offsets = self._committed.setdefault(group, {})
                for tp, entry in entries.items():
                    current = offsets.get(tp)
                    if current is None or current.log_offset < entry.log_offset:
                        offsets[tp] = entry
        return set(groups)

    # ------------------------------------------------------------ reading

    def has_pending(self, group: str, tp: TopicPartition) -> bool:
        """True when a transactional offset for `tp` of `group` awaits its marker."""
        return any(tp in groups.get(group, ()) for groups in self._pending.values())

    def pending_partitions(self, group: str) -> set[TopicPartition]:
        return {tp for groups in self._pending.values() for tp in groups.get(group, ())}

    def pending_count(self) -> int:
        """Transactional offsets waiting for a marker, over all groups and PIDs."""
        return sum(len(tps) for groups in self._pending.values() for tps in groups.values())

    def committed(self, group: str, tp: TopicPartition) -> OffsetAndMetadata | None:
        entry = self._committed.get(group, {}).get(tp)
        return entry.value if entry else None

    def committed_partitions(self, group: str) -> list[TopicPartition]:
        """Partitions with a committed offset of `group`, sorted."""
        return sorted(self._committed.get(group, {}))

    def groups(self) -> set[str]:
        """Groups with committed or pending offsets."""
        out = set(self._committed)
        for groups in self._pending.values():
            out.update(groups)
        return out

    def fetch(self, group: str, partitions: Iterable[TopicPartition] | None,
              require_stable: bool) -> dict[TopicPartition, FetchedOffset]:
        """OffsetFetch. `partitions` None: every partition with a committed offset
        (plus, with require_stable, those with a pending one). A partition with no
        committed offset answers offset -1, error NONE. With require_stable, a
        partition with a pending transactional offset answers offset -1 and
        UNSTABLE_OFFSET_COMMIT (KIP-447); without it, pending offsets are invisible.
        """
        committed = self._committed.get(group, {})
        pending = self.pending_partitions(group) if require_stable else set()
        if partitions is None:
            partitions = sorted(set(committed) | pending)
        out: dict[TopicPartition, FetchedOffset] = {}
        for tp in partitions:
            tp = TopicPartition(*tp)
            if tp in pending:
                out[tp] = FetchedOffset(NO_OFFSET, "", ErrorCode.UNSTABLE_OFFSET_COMMIT)
                continue
            entry = committed.get(tp)
            if entry is None:
                out[tp] = FetchedOffset(NO_OFFSET, "", ErrorCode.NONE)
            else:
                out[tp] = FetchedOffset(entry.value.offset, entry.value.metadata, ErrorCode.NONE,
                                        entry.value.leader_epoch)
        return out

    def state(self) -> tuple[dict, dict]:
        """(committed, pending) as plain dicts, for comparisons in tests and debugging."""
        committed = {g: {tp: e for tp, e in offs.items()} for g, offs in self._committed.items()}
        pending = {pid: {g: dict(offs) for g, offs in groups.items()}
                   for pid, groups in self._pending.items()}
        return committed, pending
