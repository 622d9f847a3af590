"""The sink's commits topic (pure): the transaction-aware view built from raw
record batches (markers included), the commit decision (a replayed micro-batch is
not committed twice) and the recovery plan (roll forward what a decision lists,
abort the rest)."""
from exactly_wire import records
from exactly.spark._commit_log import (CommitLogState, Decision, TaskRecord, already_committed,
                                       recovery_plan)

Q = "query-1"


class Log:
    """Builds a commits-topic partition as raw batches, feeds them to a state."""

    def __init__(self):
        self.batches: list[bytes] = []
        self.offset = 0

    def _add(self, batch: bytes) -> None:
        buf = bytearray(batch)
        records.set_base_offset(buf, self.offset)
        self.offset = records.parse_header(buf).last_offset + 1
        self.batches.append(bytes(buf))

    def task(self, pid: int, batch_id: int, write: str, partition: int = 0, rows: int = 10) -> None:
        key, value, headers = TaskRecord(Q, batch_id, write, f"spark-{Q}-{partition}-0", partition, 0,
                                         rows).encode()
        self._add(records.encode_batch([(key, value, headers, 0)], producer_id=pid, producer_epoch=0,
                                       base_sequence=0, transactional=True))

    def marker(self, pid: int, commit: bool) -> None:
        self._add(records.encode_control_batch(commit, pid, 0, 1, 0))

    def decision(self, batch_id: int, write: str, txns) -> None:
        key, value, headers = Decision(Q, batch_id, write, tuple(txns)).encode()
        self._add(records.encode_batch([(key, value, headers, 0)]))

    def other(self) -> None:
        self._add(records.encode_batch([(b"k", b"not json", (), 0)]))

    def feed(self, state: CommitLogState, start: int = 0) -> CommitLogState:
        for raw in self.batches[start:]:
            h = records.parse_header(raw)
            state.apply(h, records.decode_records(raw, 0, h))
        return state


def test_task_records_follow_their_transaction_markers():
    log = Log()
    log.task(1, 0, "w0", partition=0)
    log.task(2, 0, "w0", partition=1, rows=5)
    log.other()
    log.marker(1, commit=True)
    log.task(3, 1, "w1")  # still open
    log.marker(2, commit=False)
    state = log.feed(CommitLogState())
    assert state.committed_batch == {Q: 0}
    out = state.outcomes[(Q, 0, "w0")]
    assert (out.committed, out.aborted, out.committed_rows, out.aborted_rows) == (1, 1, 10, 5)
    assert [t.batch_id for t in state.open_records(Q)] == [1]
    assert state.next_offset == log.offset


def test_feeding_again_from_an_earlier_offset_changes_nothing():
    log = Log()
    log.task(1, 0, "w0")
    log.marker(1, commit=True)
    state = log.feed(CommitLogState())
    log.task(2, 1, "w1")
    log.marker(2, commit=True)
    log.feed(state, start=0)  # overlapping read
    assert state.outcomes[(Q, 0, "w0")].committed == 1
    assert state.outcomes[(Q, 1, "w1")].committed == 1


def test_decisions_are_commit_points():
    log = Log()
    t0, t1 = ("spark-q-0-0", 7, 3), ("spark-q-1-0", 8, 3)
    log.decision(4, "w4", [t0, t1])
    state = log.feed(CommitLogState())
    assert state.decided_batch == {Q: 4} and state.is_decided(Q, t0)
    assert not state.is_decided(Q, ("spark-q-0-0", 7, 2))  # another epoch: another transaction
    assert state.last_batch(Q) == 4 and state.last_batch("other") == -1


def test_commit_decision_skips_a_replayed_batch():
    log = Log()
    state = log.feed(CommitLogState())
    assert not already_committed(state, Q, 0)
    log.task(1, 0, "w0")
    log.marker(1, commit=True)
    log.feed(state)
    assert already_committed(state, Q, 0)          # a replay of batch 0
    assert not already_committed(state, Q, 1)      # the next batch
    log.decision(1, "w1", [("t", 2, 0)])           # decided, no marker yet (driver crashed)
    log.feed(state)
    assert already_committed(state, Q, 1)


def test_an_aborted_batch_is_not_committed():
    log = Log()
    log.task(1, 5, "w5")
    log.marker(1, commit=False)
    state = log.feed(CommitLogState())
    assert not already_committed(state, Q, 5)


def test_recovery_rolls_forward_decided_and_aborts_the_rest():
    decided, zombie, current = ("spark-q-0-0", 7, 3), ("spark-q-1-1", 9, 0), ("spark-q-1-0", 8, 4)
    log = Log()
    log.decision(3, "w3", [decided, ("spark-q-1-0", 8, 3)])
    state = log.feed(CommitLogState())
    plan = recovery_plan(state, Q, [current, zombie, decided], keep=[current])
    assert plan == [(decided, True), (zombie, False)]
    assert recovery_plan(state, "another-query", [decided]) == [(decided, False)]


def test_decided_transactions_that_ended_aborted_are_reported_lost():
    log = Log()
    log.task(7, 3, "w3", partition=0)
    log.task(8, 3, "w3", partition=1)
    log.decision(3, "w3", [(f"spark-{Q}-0-0", 7, 0), (f"spark-{Q}-1-0", 8, 0)])
    log.marker(7, commit=True)
    state = log.feed(CommitLogState())
    assert state.lost(Q) == []
    log.marker(8, commit=False)  # e.g. aborted by an operator's abort-prepared
    log.feed(state)
    assert state.lost(Q) == [(f"spark-{Q}-1-0", 8, 0)]
    assert state.fates[(f"spark-{Q}-0-0", 7, 0)] is True
