"""The commits topic of the `exactly` sink: its records, a transaction-aware view
of one of its partitions, and the driver's commit and recovery decisions. Pure
logic (no I/O); `_io.scan_commit_log` feeds it the partition's raw batches.

Two kinds of records, both keyed by the streaming query id (so all of a query's
records land in one partition, in order):

* a task record, written by every write task inside its own transaction, just
  before the transaction is prepared: query id, micro-batch id, write id (one per
  planning of a micro-batch, so a replay has a new one), transactional.id, Spark
  partition and attempt, rows written. It becomes visible to
  read_committed readers atomically with the task's rows, so the last committed
  micro-batch of a query can be read next to its data.
* a decision, written by the driver (idempotent producer, not transactional)
  after it decided to commit a micro-batch and before it completes the first
  transaction: query id, micro-batch id, write id and the (transactional.id, PID,
  epoch) of every transaction it commits. It is the commit point of the micro-batch:
  after a driver crash the remaining prepared transactions of a decision are rolled
  forward, every other open transaction of the query is aborted.

Header `exactly.spark` tells the kinds apart (b"task" / b"decision"); values are
JSON.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable

from exactly_wire import records as _rec

KIND_HEADER = "exactly.spark"
KIND_TASK = b"task"
KIND_DECISION = b"decision"

TxnRef = tuple[str, int, int]  # (transactional.id, producer id, producer epoch)


@dataclass(frozen=True)
class TaskRecord:
    """The record a write task adds to its own transaction."""

    query_id: str
    batch_id: int
    write_id: str
    transactional_id: str
    partition_id: int
    attempt: int
    rows: int

    def encode(self) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
        """(key, value, headers) to send."""
        value = {"query": self.query_id, "batch": self.batch_id, "write": self.write_id,
                 "transactional_id": self.transactional_id, "partition": self.partition_id,
                 "attempt": self.attempt, "rows": self.rows}
        return self.query_id.encode(), json.dumps(value, sort_keys=True).encode(), [(KIND_HEADER, KIND_TASK)]

    @classmethod
    def decode(cls, value: bytes) -> "TaskRecord":
        """Raises ValueError / KeyError for a malformed value."""
        d = json.loads(value)
        return cls(str(d["query"]), int(d["batch"]), str(d["write"]), str(d["transactional_id"]),
                   int(d["partition"]), int(d["attempt"]), int(d["rows"]))


@dataclass(frozen=True)
class Decision:
    """The driver's decision to commit the transactions `txns` of a micro-batch."""

    query_id: str
    batch_id: int
    write_id: str
    txns: tuple[TxnRef, ...]

    def encode(self) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
        value = {"query": self.query_id, "batch": self.batch_id, "write": self.write_id,
                 "transactions": [list(t) for t in self.txns]}
        return self.query_id.encode(), json.dumps(value, sort_keys=True).encode(), [(KIND_HEADER, KIND_DECISION)]

    @classmethod
    def decode(cls, value: bytes) -> "Decision":
        d = json.loads(value)
        txns = tuple((str(t[0]), int(t[1]), int(t[2])) for t in d["transactions"])
        return cls(str(d["query"]), int(d["batch"]), str(d["write"]), txns)


def _kind(rec: _rec.Record) -> bytes | None:
    for k, v in rec.headers:
        if k == KIND_HEADER:
            return v
    return None


@dataclass
class BatchOutcome:
    """Task records of one (query, micro-batch, write id) by the fate of their
    transaction: committed, aborted, or still open."""

    committed: int = 0
    aborted: int = 0
    committed_rows: int = 0
    aborted_rows: int = 0


@dataclass
class CommitLogState:
    """A transaction-aware view of one commits-topic partition, built by feeding it
    the partition's record batches in offset order (`apply`), control batches
    included: a task record is open until a COMMIT or ABORT marker of its PID
    follows. `next_offset` is where reading continues."""

    next_offset: int = 0
    committed_batch: dict[str, int] = field(default_factory=dict)
    decided_batch: dict[str, int] = field(default_factory=dict)
    decided_txns: dict[str, dict[TxnRef, tuple[int, str]]] = field(default_factory=dict)
    outcomes: dict[tuple[str, int, str], BatchOutcome] = field(default_factory=dict)
    # Fate of each task's transaction seen ending: (transactional.id, PID, epoch) -> committed.
    fates: dict[TxnRef, bool] = field(default_factory=dict)
    _last_decision: dict[str, Decision] = field(default_factory=dict)
    _open: dict[int, list[tuple[TaskRecord, int]]] = field(default_factory=dict)

    def apply(self, header: _rec.BatchHeader, batch_records: Iterable[_rec.Record]) -> None:
        """Feed one record batch (its header and decoded records). Batches wholly
        before `next_offset` are ignored, so overlapping reads are harmless."""
        if header.last_offset < self.next_offset:
            return
        if header.is_control:
            recs = list(batch_records)
            committed = bool(recs) and _rec.decode_control_record(recs[0])[0] == _rec.CONTROL_COMMIT
            for task, epoch in self._open.pop(header.producer_id, []):
                self.fates[(task.transactional_id, header.producer_id, epoch)] = committed
                out = self.outcomes.setdefault((task.query_id, task.batch_id, task.write_id), BatchOutcome())
                if committed:
                    out.committed += 1
                    out.committed_rows += task.rows
                    if task.batch_id > self.committed_batch.get(task.query_id, -1):
                        self.committed_batch[task.query_id] = task.batch_id
                else:
                    out.aborted += 1
                    out.aborted_rows += task.rows
        else:
            for rec in batch_records:
                if rec.offset < self.next_offset or rec.value is None:
                    continue
                kind = _kind(rec)
                try:
                    if kind == KIND_TASK and header.is_transactional:
                        self._open.setdefault(header.producer_id, []).append(
                            (TaskRecord.decode(rec.value), header.producer_epoch))
                    elif kind == KIND_DECISION and not header.is_transactional:
                        self._add_decision(Decision.decode(rec.value))
                except (ValueError, KeyError, TypeError, IndexError):
                    continue  # not ours: ignore
        self.next_offset = header.last_offset + 1

    def _add_decision(self, d: Decision) -> None:
        if d.batch_id > self.decided_batch.get(d.query_id, -1):
            self.decided_batch[d.query_id] = d.batch_id
            self._last_decision[d.query_id] = d
        txns = self.decided_txns.setdefault(d.query_id, {})
        for t in d.txns:
            txns[t] = (d.batch_id, d.write_id)

    def last_batch(self, query_id: str) -> int:
        """The last micro-batch of the query known to be committed: the largest batch
        id of a decision or of a committed task record; -1 when none."""
        return max(self.committed_batch.get(query_id, -1), self.decided_batch.get(query_id, -1))

    def open_records(self, query_id: str) -> list[TaskRecord]:
        return [t for recs in self._open.values() for t, _ in recs if t.query_id == query_id]

    def lost(self, query_id: str) -> list[TxnRef]:
        """Transactions of the query's last decided micro-batch that ended aborted
        although the decision committed them (e.g. an operator aborted them while the
        driver was down): their rows are lost and the caller must fail."""
        d = self._last_decision.get(query_id)
        return [] if d is None else [t for t in d.txns if self.fates.get(t) is False]

    def is_decided(self, query_id: str, txn: TxnRef) -> bool:
        return txn in self.decided_txns.get(query_id, {})


def already_committed(state: CommitLogState, query_id: str, batch_id: int) -> bool:
    """The commit decision: micro-batch `batch_id` of the query was committed before
    (by an earlier run of the query, before a driver restart made Spark replay it)
    when a decision or a committed task record with a batch id >= `batch_id` exists.
    Spark runs micro-batches in order, so a later batch implies this one. Then the
    replay's transactions must be aborted, not committed a second time."""
    return state.last_batch(query_id) >= batch_id


def recovery_plan(state: CommitLogState, query_id: str, ongoing: Iterable[TxnRef],
                  keep: Iterable[TxnRef] = ()) -> list[tuple[TxnRef, bool]]:
    """What to do with the query's ongoing transactions `ongoing` (prepared or not)
    left by a crashed driver or a failed task attempt, except those in `keep` (the
    micro-batch being committed now): roll forward (True) those listed in a
    decision, abort (False) the others. Sorted by transactional.id."""
    kept = set(keep)
    return [(t, state.is_decided(query_id, t)) for t in sorted(set(ongoing)) if t not in kept]


__all__ = ["TaskRecord", "Decision", "CommitLogState", "BatchOutcome", "already_committed", "recovery_plan",
           "KIND_HEADER", "KIND_TASK", "KIND_DECISION", "TxnRef"]
