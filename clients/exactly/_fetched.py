"""The pure parts of fetching for the Consumer: the read_committed filter of aborted
transactions (`AbortedTransactions`), the records of one partition from one Fetch
(`FetchedRecords`) and their decoding (`parse_fetched`). No I/O: unit tests drive
them directly; `_fetcher.Fetcher` sends the requests and `_consumer_state` keeps a
partition's buffered records.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Iterable

from exactly import errors
from exactly.types import ConsumerRecord, TopicPartition
from exactly_wire import records


class AbortedTransactions:
    """read_committed state of one partition: which records belong to aborted
    transactions (design doc "Consumer", the min-heap algorithm).

    Fetch responses carry `(producer_id, first_offset)` for every aborted
    transaction intersecting the fetched range. They go into a min-heap ordered by
    first offset. While batches are processed in offset order, every heap entry
    whose first offset is at or below the batch's last offset is popped and its PID
    joins the set of PIDs inside an aborted transaction; transactional data batches
    of such a PID are dropped, and the PID leaves the set at its ABORT marker.
    Popping by offset (not only when the head's PID matches the batch's) is the
    refinement Kafka's consumer uses: it stays correct when a fetch starts inside
    an aborted transaction or when producers interleave.

    The state lives across fetch responses (a transaction may span several) and is
    cleared on seek. An entry is ignored when its transaction already ended at an
    ABORT marker this state has processed, or when it is already queued, so a
    leader repeating entries in consecutive responses does no harm.
    """

    __slots__ = ("_heap", "_queued", "_aborted_pids", "_ended_at")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int]] = []          # (first_offset, pid)
        self._queued: set[tuple[int, int]] = set()
        self._aborted_pids: set[int] = set()
        self._ended_at: dict[int, int] = {}             # pid -> offset of its last ABORT marker

    def add(self, aborted: Iterable[tuple[int, int]]) -> None:
        """Queue aborted transactions given as `(producer_id, first_offset)` pairs."""
        for pid, first_offset in aborted:
            key = (first_offset, pid)
            if key in self._queued or first_offset <= self._ended_at.get(pid, -1):
                continue
            heapq.heappush(self._heap, key)
            self._queued.add(key)

    def _consume_up_to(self, offset: int) -> None:
        heap = self._heap
        while heap and heap[0][0] <= offset:
            key = heapq.heappop(heap)
            self._queued.discard(key)
            self._aborted_pids.add(key[1])

    def is_aborted(self, header: records.BatchHeader) -> bool:
        """For a data batch, in offset order: True when it belongs to an aborted
        transaction and must be dropped."""
        if header.producer_id < 0:
            return False
        self._consume_up_to(header.last_offset)
        return header.is_transactional and header.producer_id in self._aborted_pids

    def on_marker(self, header: records.BatchHeader, control_type: int) -> None:
        """For a control batch (transaction marker) of type ABORT (0) or COMMIT (1)."""
        self._consume_up_to(header.last_offset)
        if control_type == records.CONTROL_ABORT:
            self._aborted_pids.discard(header.producer_id)
            self._ended_at[header.producer_id] = header.last_offset

    @property
    def aborted_pids(self) -> frozenset[int]:
        """PIDs currently inside an aborted transaction (for tests and debugging)."""
        return frozenset(self._aborted_pids)

    def __len__(self) -> int:
        return len(self._heap)


@dataclass(slots=True)
class FetchedRecords:
    """Records of one partition from one Fetch response, drained by `poll`.

    `next_fetch_offset` is one past the last batch processed, including control
    batches and dropped aborted batches, so the position moves past them once the
    deliverable records are drained. `error` (if any) is raised after the records
    before it were returned.
    """

    tp: TopicPartition
    fetch_offset: int
    next_fetch_offset: int
    records: list[ConsumerRecord]
    error: errors.ExactlyError | None = None
    index: int = 0

    @property
    def exhausted(self) -> bool:
        return self.index >= len(self.records)

    def drain(self, max_records: int) -> tuple[list[ConsumerRecord], int]:
        """Take up to `max_records` records; returns (records, new position)."""
        start = self.index
        end = min(len(self.records), start + max_records)
        out = self.records[start:end]
        self.index = end
        if end >= len(self.records):
            return out, self.next_fetch_offset
        return out, out[-1].offset + 1 if out else self.records[start].offset


def parse_fetched(tp: TopicPartition, data: bytes, fetch_offset: int,
                  aborted: AbortedTransactions | None = None,
                  last_stable_offset: int = -1, check_crcs: bool = True) -> FetchedRecords:
    """Decode the raw record batches of a Fetch response for `tp`.

    `fetch_offset` is the position the fetch was sent for; records below it (the
    batch holding it may start earlier) are skipped. `aborted` is the partition's
    read_committed state (None for read_uncommitted); the response's aborted
    transactions must already be added to it. With read_committed and a known
    `last_stable_offset`, batches at or past it are not processed (the leader
    already bounds the data by the LSO; this keeps the consumer safe anyway).

    Control batches are never returned. A corrupt batch ends the parse: the records
    before it are returned and `error` is a CorruptMessageError; the next fetch
    starts at that batch.
    """
    out: list[ConsumerRecord] = []
    next_offset = fetch_offset
    error: errors.ExactlyError | None = None
    topic, partition = tp.topic, tp.partition
    bound_by_lso = aborted is not None and last_stable_offset >= 0
    new = tuple.__new__  # ConsumerRecord(...) without the NamedTuple's Python-level __new__
    append = out.append
    try:
        for pos, h in records.iter_batches(data, verify=check_crcs):
            if bound_by_lso and h.base_offset >= last_stable_offset:
                break
            if h.is_control:
                if aborted is not None:
                    ctrl = records.decode_records(data, pos, h)
                    if ctrl:
                        aborted.on_marker(h, records.decode_control_record(ctrl[0])[0])
            elif aborted is None or not aborted.is_aborted(h):
                max_ts = h.max_timestamp if h.attributes & records.TIMESTAMP_TYPE_BIT else None  # LogAppendTime
                for offset, ts, key, value, headers in records.decode_records(data, pos, h):
                    if offset >= fetch_offset:
                        append(new(ConsumerRecord, (topic, partition, offset, key, value, list(headers),
                                                    ts if max_ts is None else max_ts)))
            if h.last_offset + 1 > next_offset:
                next_offset = h.last_offset + 1
    except records.CorruptRecordError as exc:
        error = errors.CorruptMessageError(f"{topic}-{partition} at offset {next_offset}: {exc}")
    return FetchedRecords(tp, fetch_offset, next_offset, out, error)
