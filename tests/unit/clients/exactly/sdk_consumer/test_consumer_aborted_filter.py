"""read_committed filtering of aborted transactions: the min-heap algorithm of the
design doc "Consumer" section (kip-98-design-document.txt), fed by hand-built
record batches v2 and Fetch ranges served with Kafka's leader semantics."""
from __future__ import annotations

import random
import struct

import pytest

from exactly import errors
from exactly_wire import records
from exactly._fetched import AbortedTransactions, parse_fetched
from exactly.types import TopicPartition

from .logbuilder import PartitionLog

TP = TopicPartition("t", 0)


def read(log: PartitionLog, offset: int = 0, committed: bool = True, state: AbortedTransactions | None = None,
         **fetch_kw):
    data, aborted = log.fetch(offset, **fetch_kw)
    if committed:
        state = state if state is not None else AbortedTransactions()
        state.add(aborted)
    fetched = parse_fetched(TP, data, offset, state if committed else None)
    return fetched


def values(fetched) -> list[bytes]:
    return [r.value for r in fetched.records]


@pytest.fixture
def interleaved() -> PartitionLog:
    """P1 and P2 interleave; P1's first transaction aborts, P2's commits, P2's
    second aborts, P1's second commits; plain records in between."""
    log = PartitionLog()
    log.append([b"p1-a0", b"p1-a1"], pid=1, transactional=True)     # 0-1   aborted
    log.append([b"p2-c0", b"p2-c1"], pid=2, transactional=True)     # 2-3   committed
    log.append([b"p1-a2"], pid=1, transactional=True)               # 4     aborted
    log.marker(1, committed=False)                                  # 5
    log.marker(2, committed=True)                                   # 6
    log.append([b"plain"])                                          # 7
    log.append([b"p2-a0"], pid=2, transactional=True)               # 8     aborted
    log.append([b"p1-c0"], pid=1, transactional=True)               # 9     committed
    log.marker(2, committed=False)                                  # 10
    log.append([b"p1-c1"], pid=1, transactional=True)               # 11    committed
    log.marker(1, committed=True)                                   # 12
    return log


def test_interleaved_producers_read_committed_drops_aborted(interleaved):
    fetched = read(interleaved)
    assert values(fetched) == [b"p2-c0", b"p2-c1", b"plain", b"p1-c0", b"p1-c1"]
    assert [r.offset for r in fetched.records] == [2, 3, 7, 9, 11]
    assert fetched.next_fetch_offset == 13  # past the last marker
    assert fetched.error is None


def test_read_uncommitted_returns_all_data_but_never_control_records(interleaved):
    fetched = read(interleaved, committed=False)
    assert values(fetched) == [b"p1-a0", b"p1-a1", b"p2-c0", b"p2-c1", b"p1-a2", b"plain",
                               b"p2-a0", b"p1-c0", b"p1-c1"]
    assert 5 not in [r.offset for r in fetched.records]
    assert fetched.next_fetch_offset == 13


@pytest.mark.parametrize("start", range(0, 13))
def test_fetch_starting_anywhere_sees_only_committed(interleaved, start):
    expected = {2: b"p2-c0", 3: b"p2-c1", 7: b"plain", 9: b"p1-c0", 11: b"p1-c1"}
    fetched = read(interleaved, offset=start)
    assert [(r.offset, r.value) for r in fetched.records] == [(o, v) for o, v in expected.items() if o >= start]


@pytest.mark.parametrize("batches_per_fetch", [1, 2, 3, 5])
def test_transaction_spanning_fetches(interleaved, batches_per_fetch):
    state = AbortedTransactions()
    offset, got = 0, []
    while offset < interleaved.next_offset:
        fetched = read(interleaved, offset, state=state, max_batches=batches_per_fetch)
        got += values(fetched)
        assert fetched.next_fetch_offset > offset
        offset = fetched.next_fetch_offset
    assert got == [b"p2-c0", b"p2-c1", b"plain", b"p1-c0", b"p1-c1"]
    assert state.aborted_pids == frozenset()


def test_state_carries_over_when_leader_lists_an_aborted_txn_only_once():
    """A leader that lists an aborted transaction only in the response holding its
    first offset: the PID stays aborted in the carried state until its marker."""
    log = PartitionLog()
    log.append([b"x0"], pid=7, transactional=True)   # 0
    log.append([b"x1"], pid=7, transactional=True)   # 1
    log.marker(7, committed=False)                   # 2
    state = AbortedTransactions()
    first = read(log, 0, state=state, max_batches=1)
    assert values(first) == [] and state.aborted_pids == {7}
    data, _ = log.fetch(1)
    second = parse_fetched(TP, data, 1, state)     # no aborted list this time
    assert values(second) == [] and second.next_fetch_offset == 3
    assert state.aborted_pids == frozenset()


def test_repeated_entry_after_its_abort_marker_does_not_drop_next_committed_txn():
    log = PartitionLog()
    log.append([b"a"], pid=3, transactional=True)    # 0
    log.marker(3, committed=False)                   # 1
    log.append([b"b"], pid=3, transactional=True)    # 2
    log.marker(3, committed=True)                    # 3
    state = AbortedTransactions()
    first = read(log, 0, state=state, max_batches=2)
    assert values(first) == [] and first.next_fetch_offset == 2
    data, _ = log.fetch(2)
    state.add([(3, 0)])  # a stale entry: that transaction ended at offset 1
    second = parse_fetched(TP, data, 2, state)
    assert values(second) == [b"b"]


def test_same_pid_aborted_then_committed_in_one_response():
    log = PartitionLog()
    log.append([b"a0", b"a1"], pid=4, transactional=True)
    log.marker(4, committed=False)
    log.append([b"c0"], pid=4, transactional=True)
    log.marker(4, committed=True)
    assert values(read(log)) == [b"c0"]


def test_idempotent_non_transactional_batch_of_aborted_pid_is_kept():
    log = PartitionLog()
    log.append([b"t"], pid=5, transactional=True)    # 0 aborted
    log.append([b"idem"], pid=5, transactional=False)  # 1: not part of the transaction
    log.marker(5, committed=False)
    assert values(read(log)) == [b"idem"]


def test_only_control_and_aborted_batches_advance_position_without_records():
    log = PartitionLog()
    log.append([b"a"], pid=1, transactional=True)
    log.marker(1, committed=False)
    log.marker(9, committed=True)  # a marker of a transaction with no data here
    fetched = read(log)
    assert fetched.records == [] and fetched.next_fetch_offset == 3


def test_records_before_fetch_offset_in_first_batch_are_skipped():
    log = PartitionLog()
    log.append([b"r0", b"r1", b"r2", b"r3"])
    fetched = read(log, offset=2, committed=False)
    assert [r.offset for r in fetched.records] == [2, 3]


def test_lso_bounds_read_committed_even_if_leader_returns_more():
    log = PartitionLog()
    log.append([b"c"], pid=1, transactional=True)    # 0
    log.marker(1, committed=True)                    # 1
    log.append([b"open"], pid=2, transactional=True)  # 2: ongoing, LSO = 2
    log.append([b"plain"])                           # 3
    assert log.lso() == 2
    data, aborted = log.fetch(0)  # a leader ignoring the LSO
    state = AbortedTransactions()
    state.add(aborted)
    fetched = parse_fetched(TP, data, 0, state, last_stable_offset=log.lso())
    assert values(fetched) == [b"c"]
    assert fetched.next_fetch_offset == 2


def test_trailing_partial_batch_is_ignored_and_refetched():
    log = PartitionLog()
    log.append([b"a"])
    log.append([b"b"])
    fetched = read(log, committed=False, cut_bytes=5)
    assert values(fetched) == [b"a"] and fetched.next_fetch_offset == 1


def test_corrupt_batch_returns_records_before_it_then_error():
    log = PartitionLog()
    log.append([b"good"])
    log.append([b"bad"])
    data, _ = log.fetch(0)
    broken = bytearray(data)
    broken[-1] ^= 0xFF  # flips a byte covered by the second batch's CRC
    fetched = parse_fetched(TP, bytes(broken), 0, None)
    assert values(fetched) == [b"good"]
    assert isinstance(fetched.error, errors.CorruptMessageError)
    assert fetched.next_fetch_offset == 1


def test_log_append_time_uses_batch_max_timestamp():
    batch = bytearray(records.encode_batch([(None, b"v", (), 5), (None, b"w", (), 9)]))
    h = records.parse_header(batch)
    struct.pack_into(">hiqq", batch, 21, h.attributes | records.TIMESTAMP_TYPE_BIT,
                     h.last_offset_delta, h.base_timestamp, 777)  # attributes .. maxTimestamp
    struct.pack_into(">I", batch, 17, records.compute_crc(batch, 0, h.size))
    fetched = parse_fetched(TP, bytes(batch), 0, None)
    assert [r.timestamp for r in fetched.records] == [777, 777]


def test_heap_pops_in_first_offset_order():
    state = AbortedTransactions()
    state.add([(2, 10), (1, 4), (3, 20), (1, 4)])  # duplicate ignored
    assert len(state) == 3
    h = records.parse_header(records.encode_batch([(None, b"x", (), 0)], base_offset=12, producer_id=9,
                                                  producer_epoch=0, base_sequence=0, transactional=True))
    assert state.is_aborted(h) is False  # pid 9 is not aborted, but 1 and 2 are now active
    assert state.aborted_pids == {1, 2}
    assert len(state) == 1


def _random_log(rng: random.Random, producers: int, steps: int):
    """A random interleaving of transactional producers and plain appends; returns
    the log and the set of visible (committed or non-transactional) values."""
    log = PartitionLog()
    visible: list[bytes] = []
    pending: dict[int, list[bytes]] = {}
    n = 0
    for _ in range(steps):
        choice = rng.random()
        pid = rng.randrange(1, producers + 1)
        if choice < 0.15:
            vals = [f"plain-{n + i}".encode() for i in range(rng.randint(1, 3))]
            n += len(vals)
            log.append(vals)
            visible += vals  # ordering is checked by offset below
        elif choice < 0.75:
            vals = [f"p{pid}-{n + i}".encode() for i in range(rng.randint(1, 3))]
            n += len(vals)
            log.append(vals, pid=pid, transactional=True)
            pending.setdefault(pid, []).extend(vals)
        elif pid in pending:
            commit = rng.random() < 0.5
            log.marker(pid, committed=commit)
            vals = pending.pop(pid)
            if commit:
                visible += vals
    for pid in list(pending):
        commit = rng.random() < 0.5
        log.marker(pid, committed=commit)
        vals = pending.pop(pid)
        if commit:
            visible += vals
    return log, set(visible)


@pytest.mark.parametrize("seed", range(40))
def test_random_interleavings_match_transaction_outcomes(seed):
    rng = random.Random(seed)
    log, visible = _random_log(rng, producers=rng.randint(1, 4), steps=rng.randint(5, 60))
    state = AbortedTransactions()
    offset, got = rng.randrange(0, 2), []
    if offset:
        # Start after a seek: only what lies at or after the offset is expected.
        visible = {v for e in log.entries if e.last_offset >= offset and not e.control
                   for r in records.decode_records(e.data) if r.offset >= offset and (v := r.value) in visible}
    while offset < log.next_offset:
        fetched = read(log, offset, state=state, max_batches=rng.randint(1, 6))
        got += fetched.records
        assert fetched.next_fetch_offset > offset
        offset = fetched.next_fetch_offset
    assert [r.offset for r in got] == sorted(r.offset for r in got)
    assert {r.value for r in got} == visible
    assert len(got) == len(visible)
