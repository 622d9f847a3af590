"""Producer state: sequence rules (design doc "Client-Broker request handling" plus
Kafka >= 1.0), last-5-batch dedup, epoch fencing, markers, LSO, snapshots, expiration."""
from __future__ import annotations

import pytest

from exactly_wire.error_codes import ErrorCode
from services.partition_leader.producer_state import (INT32_MAX, ProducerStateManager, SnapshotError,
                                                      decode_snapshot, entries_equal, in_sequence)

from .conftest import NOW_MS, header, make_batch

PID = 1000


class Driver:
    """Feeds batches through check -> append -> on_append like the partition does."""

    def __init__(self, state: ProducerStateManager):
        self.state = state
        self.next_offset = 0

    def produce(self, n: int = 3, **kw):
        h = header(make_batch(n, **kw))
        check = self.state.check_append(h)
        if check.error == ErrorCode.NONE:
            h = h._replace(base_offset=self.next_offset)
            self.state.on_append(h)
            self.next_offset = h.last_offset + 1
            return check, h.base_offset
        return check, None

    def marker(self, pid: int, epoch: int, committed: bool, coordinator_epoch: int = 0):
        check = self.state.check_marker(pid, epoch, coordinator_epoch)
        if check.error != ErrorCode.NONE:
            return check.error, None
        offset = self.next_offset
        self.next_offset += 1
        return ErrorCode.NONE, self.state.complete_marker(pid, epoch, coordinator_epoch, offset, NOW_MS, committed)


@pytest.fixture
def state(clock):
    return ProducerStateManager(clock_ms=clock)


@pytest.fixture
def drive(state):
    return Driver(state)


def test_in_sequence_wraps_at_int32_max():
    assert in_sequence(4, 5)
    assert not in_sequence(4, 6) and not in_sequence(4, 4)
    assert in_sequence(INT32_MAX, 0)
    assert in_sequence(-1, 0)


# (description, setup batches as (epoch, seq, n), probe (epoch, seq, n), expected error)
SEQUENCE_CASES = [
    ("unknown pid starts at 0", [], (0, 0, 3), ErrorCode.NONE),
    ("unknown pid with a non-zero sequence", [], (0, 5, 3), ErrorCode.UNKNOWN_PRODUCER_ID),
    ("next in sequence", [(0, 0, 3)], (0, 3, 2), ErrorCode.NONE),
    ("gap", [(0, 0, 3)], (0, 4, 1), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    ("exact retry of the last batch", [(0, 0, 3)], (0, 0, 3), ErrorCode.DUPLICATE_SEQUENCE_NUMBER),
    ("overlapping but not equal", [(0, 0, 3)], (0, 1, 3), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    ("older epoch", [(2, 0, 3)], (1, 3, 1), ErrorCode.INVALID_PRODUCER_EPOCH),
    ("older epoch retrying a batch", [(2, 0, 3)], (1, 0, 3), ErrorCode.INVALID_PRODUCER_EPOCH),
    ("newer epoch starts at 0", [(0, 0, 3)], (1, 0, 1), ErrorCode.NONE),
    ("newer epoch not at 0", [(0, 0, 3)], (1, 3, 1), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    ("same sequences under a new epoch are not duplicates", [(0, 0, 3)], (1, 0, 3), ErrorCode.NONE),
    ("wrap past int32 max", [(0, 0, INT32_MAX), (0, INT32_MAX, 1)], (0, 0, 1), ErrorCode.NONE),
    ("no wrap to 1", [(0, 0, INT32_MAX), (0, INT32_MAX, 1)], (0, 1, 1), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
]


@pytest.mark.parametrize("setup,probe,expected", [c[1:] for c in SEQUENCE_CASES],
                         ids=[c[0] for c in SEQUENCE_CASES])
def test_sequence_rules(state, setup, probe, expected):
    for epoch, seq, n in setup:
        h = header(make_batch(1, pid=PID, epoch=epoch, seq=seq))._replace(last_offset_delta=n - 1)
        assert state.check_append(h).error == ErrorCode.NONE
        state.on_append(h._replace(base_offset=state.map_end_offset))
    epoch, seq, n = probe
    h = header(make_batch(1, pid=PID, epoch=epoch, seq=seq))._replace(last_offset_delta=n - 1)
    assert state.check_append(h).error == expected


def test_a_batch_spanning_the_wrap_ends_at_the_right_sequence(drive, state):
    drive.produce(1, pid=PID, seq=0)
    assert drive.produce(1, pid=PID, seq=1)[0].error == ErrorCode.NONE
    h = header(make_batch(1, pid=PID, seq=2))._replace(last_offset_delta=INT32_MAX - 2)
    state.on_append(h._replace(base_offset=10))
    assert state.entry(PID).last_seq == INT32_MAX
    check, _ = drive.produce(3, pid=PID, seq=0)
    assert check.error == ErrorCode.NONE and state.entry(PID).last_seq == 2


def test_the_last_five_batches_deduplicate_with_their_original_offsets(drive):
    offsets = [drive.produce(2, pid=PID, seq=2 * i)[1] for i in range(6)]
    assert offsets == [0, 2, 4, 6, 8, 10]
    for i in range(1, 6):  # five in flight: each retry finds its batch
        check, _ = drive.produce(2, pid=PID, seq=2 * i)
        assert check.error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
        assert check.duplicate.first_offset == offsets[i]
        assert (check.duplicate.first_seq, check.duplicate.last_seq) == (2 * i, 2 * i + 1)
    # The sixth-newest fell out of the cache: a plain out-of-order error.
    assert drive.produce(2, pid=PID, seq=0)[0].error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert drive.next_offset == 12


def test_no_sequence_is_rejected_on_normal_topics(drive):
    assert drive.produce(1, pid=PID, seq=-1)[0].error == ErrorCode.INVALID_REQUEST


def test_no_sequence_on_internal_topics_keeps_fencing_and_transactions(clock):
    state = ProducerStateManager(internal=True, clock_ms=clock)
    drive = Driver(state)
    check, offset = drive.produce(1, pid=PID, epoch=3, seq=-1, txn=True)
    assert check.error == ErrorCode.NONE
    # No sequence: the same batch again is a new write, not a duplicate.
    assert drive.produce(1, pid=PID, epoch=3, seq=-1, txn=True)[0].error == ErrorCode.NONE
    assert state.entry(PID).batches == type(state.entry(PID).batches)()
    assert state.first_unstable_offset == offset == 0
    assert drive.produce(1, pid=PID, epoch=2, seq=-1, txn=True)[0].error == ErrorCode.INVALID_PRODUCER_EPOCH
    assert drive.marker(PID, 3, committed=True)[0] == ErrorCode.NONE
    assert state.first_unstable_offset is None


def test_non_transactional_write_during_a_transaction_is_rejected(drive):
    drive.produce(1, pid=PID, seq=0, txn=True)
    assert drive.produce(1, pid=PID, seq=1)[0].error == ErrorCode.INVALID_TXN_STATE


def test_ongoing_transactions_are_ordered_by_first_offset(drive, state):
    drive.produce(2, pid=1, seq=0, txn=True)  # 0-1
    drive.produce(2, pid=2, seq=0, txn=True)  # 2-3
    drive.produce(2, pid=1, seq=2, txn=True)  # 4-5 (same txn)
    drive.produce(2, pid=3, seq=0, txn=True)  # 6-7
    assert list(state.ongoing.items()) == [(0, 1), (2, 2), (6, 3)]
    assert state.first_unstable_offset == 0
    assert state.lso_excluding(1, default=99) == 2
    assert state.lso_excluding(2, default=99) == 0
    _, done = drive.marker(1, 0, committed=False)
    assert (done.producer_id, done.first_offset, done.last_offset, done.is_aborted) == (1, 0, 8, True)
    assert state.first_unstable_offset == 2
    drive.marker(2, 0, committed=True)
    drive.marker(3, 0, committed=True)
    assert state.first_unstable_offset is None
    assert state.lso_excluding(3, default=99) == 99


def test_marker_fencing(drive, state):
    drive.produce(1, pid=PID, epoch=1, seq=0, txn=True)
    assert drive.marker(PID, 1, True, coordinator_epoch=5)[0] == ErrorCode.NONE
    assert state.entry(PID).coordinator_epoch == 5
    assert drive.marker(PID, 1, True, coordinator_epoch=4)[0] == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert drive.marker(PID, 0, True, coordinator_epoch=5)[0] == ErrorCode.INVALID_PRODUCER_EPOCH
    # Retried marker: no ongoing transaction, still succeeds and spans only itself.
    err, done = drive.marker(PID, 1, True, coordinator_epoch=5)
    assert err == ErrorCode.NONE and done.first_offset == done.last_offset


def test_a_marker_with_a_newer_epoch_fences_the_old_producer(drive, state):
    drive.produce(3, pid=PID, epoch=0, seq=0, txn=True)
    err, done = drive.marker(PID, 1, committed=False)  # coordinator aborted on timeout, bumped the epoch
    assert err == ErrorCode.NONE and done.is_aborted and done.first_offset == 0
    assert state.entry(PID).producer_epoch == 1
    assert drive.produce(1, pid=PID, epoch=0, seq=3, txn=True)[0].error == ErrorCode.INVALID_PRODUCER_EPOCH
    # The new epoch restarts at sequence 0.
    assert drive.produce(1, pid=PID, epoch=1, seq=3, txn=True)[0].error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert drive.produce(1, pid=PID, epoch=1, seq=0, txn=True)[0].error == ErrorCode.NONE


def test_a_marker_for_an_unknown_pid_creates_its_entry(drive, state):
    err, done = drive.marker(77, 4, committed=True, coordinator_epoch=2)
    assert err == ErrorCode.NONE and done.first_offset == 0
    entry = state.entry(77)
    assert (entry.producer_epoch, entry.coordinator_epoch, entry.current_txn_first_offset) == (4, 2, -1)
    assert drive.produce(1, pid=77, epoch=4, seq=1)[0].error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert drive.produce(1, pid=77, epoch=4, seq=0)[0].error == ErrorCode.NONE


def test_snapshot_round_trip(drive, state, clock):
    for pid in (1, 2, 3):
        for i in range(7):
            drive.produce(2, pid=pid, epoch=pid, seq=2 * i, txn=pid == 2)
    drive.marker(3, 3, committed=True, coordinator_epoch=9)
    data = state.encode_snapshot()
    again = ProducerStateManager(clock_ms=clock)
    again.load_snapshot(data, drive.next_offset)
    assert entries_equal(again.producers.values(), state.producers.values())
    assert again.ongoing == state.ongoing and again.map_end_offset == drive.next_offset
    assert len(again.entry(1).batches) == 5


def test_a_snapshot_keeps_the_transactions_whose_marker_is_not_replicated(drive, state, clock):
    """A marker the high watermark has not passed keeps its transaction unstable
    after a restart from a snapshot taken past the marker: the LSO stays at the
    transaction's first offset instead of jumping to the high watermark (from where a
    failover to a replica without the marker would move it back)."""
    drive.produce(2, pid=PID, seq=0, txn=True)  # 0-1
    drive.marker(PID, 0, committed=True)  # 2
    drive.produce(1, pid=PID + 1, seq=0)  # 3
    assert state.first_unstable_offset_at(2) == 0
    again = ProducerStateManager(clock_ms=clock)
    again.load_snapshot(state.encode_snapshot(), drive.next_offset)
    assert again.unreplicated == {0: 2}
    assert again.first_unstable_offset_at(2) == 0
    assert again.first_unstable_offset_at(3) is None and again.unreplicated == {}


def test_a_version_1_snapshot_still_loads(drive, state, clock):
    import struct

    import crc32c
    drive.produce(2, pid=PID, seq=0, txn=True)
    data = state.encode_snapshot()
    assert struct.unpack_from(">h", data)[0] == 2
    body = data[6:-4]  # without the unreplicated count (0)
    v1 = struct.pack(">hI", 1, crc32c.crc32c(body)) + body
    again = ProducerStateManager(clock_ms=clock)
    again.load_snapshot(v1, drive.next_offset)
    assert entries_equal(again.producers.values(), state.producers.values())
    assert again.ongoing == {0: PID} and again.unreplicated == {}


@pytest.mark.parametrize("damage", ["flip", "truncate", "version", "empty"])
def test_a_damaged_snapshot_is_rejected_and_leaves_state_unchanged(drive, state, clock, damage):
    drive.produce(2, pid=1, seq=0)
    data = bytearray(state.encode_snapshot())
    if damage == "flip":
        data[-3] ^= 0x01
    elif damage == "truncate":
        data = data[:-4]
    elif damage == "version":
        data[1] = 9
    else:
        data = bytearray()
    with pytest.raises(SnapshotError):
        decode_snapshot(bytes(data))
    other = ProducerStateManager(clock_ms=clock)
    Driver(other).produce(1, pid=5, seq=0)
    with pytest.raises(SnapshotError):
        other.load_snapshot(bytes(data), 10)
    assert list(other.producers) == [5]


def test_idle_pids_expire_unless_in_a_transaction(clock):
    state = ProducerStateManager(expiration_ms=1000, clock_ms=clock)
    drive = Driver(state)
    drive.produce(1, pid=1, seq=0, ts=clock())
    drive.produce(1, pid=2, seq=0, ts=clock(), txn=True)
    clock.advance(500)
    drive.produce(1, pid=3, seq=0, ts=clock())
    assert state.expire() == []
    clock.advance(500)
    assert state.expire() == [1]
    clock.advance(500)
    assert state.expire() == [3]
    assert list(state.producers) == [2]
    # An expired PID is unknown again: continuing its sequence is refused.
    assert drive.produce(1, pid=1, seq=1)[0].error == ErrorCode.UNKNOWN_PRODUCER_ID
    drive.marker(2, 0, committed=True)
    clock.advance(1000)
    assert state.expire() == [2]


def test_a_coordinator_writer_pid_on_an_internal_topic_never_expires(clock):
    """The writer PID of a coordinator fences deposed owners by its epoch; forgetting it
    after a quiet period would let a deposed owner write again."""
    state = ProducerStateManager(internal=True, expiration_ms=1000, clock_ms=clock)
    drive = Driver(state)
    drive.produce(1, pid=9, epoch=4, seq=-1, ts=clock())
    clock.advance(10_000)
    assert state.expire() == [] and state.entry(9).producer_epoch == 4
    stale = drive.produce(1, pid=9, epoch=3, seq=-1, ts=clock())[0]
    assert stale.error == ErrorCode.INVALID_PRODUCER_EPOCH


def test_replay_rebuilds_the_same_state(drive, state, clock):
    batches = []
    for i in range(4):
        h = header(make_batch(2, pid=1, seq=2 * i, txn=True), drive.next_offset)
        state.on_append(h)
        drive.next_offset = h.last_offset + 1
        batches.append((h, None))
    h = header(make_batch(1, pid=1, epoch=0), drive.next_offset)._replace(attributes=0x30, base_sequence=-1)
    state.complete_marker(1, 0, 3, h.base_offset, h.max_timestamp, committed=True)
    batches.append((h, (True, 3)))
    replayed = ProducerStateManager(clock_ms=clock)
    for h, control in batches:
        replayed.replay_batch(h, control)
    assert entries_equal(replayed.producers.values(), state.producers.values())
    assert replayed.ongoing == {} and replayed.map_end_offset == h.base_offset + 1


def test_a_stale_duplicate_marker_cannot_end_the_next_transaction(drive, state):
    """KIP-890 part 2: T1 (epoch 0) ends with markers at epoch 1; T2 runs at epoch 1. A
    delayed duplicate of T1's COMMIT marker (epoch 1) arriving after T2's first batch
    is refused, so T2's partial data is not committed (no torn transaction)."""
    drive.produce(1, pid=PID, epoch=0, seq=0, txn=True)
    assert state.check_marker(PID, 1, 0, transaction_version=2).error == ErrorCode.NONE
    state.complete_marker(PID, 1, 0, drive.next_offset, NOW_MS, committed=True)
    drive.next_offset += 1
    check, offset = drive.produce(1, pid=PID, epoch=1, seq=0, txn=True)  # T2 starts at epoch 1
    assert check.error == ErrorCode.NONE and state.ongoing == {offset: PID}
    stale = state.check_marker(PID, 1, 0, transaction_version=2)
    assert stale.error == ErrorCode.INVALID_PRODUCER_EPOCH and "stale marker" in stale.message
    assert state.ongoing == {offset: PID}
    assert state.check_marker(PID, 2, 0, transaction_version=2).error == ErrorCode.NONE  # T2's own marker


def test_a_late_batch_of_a_finished_transaction_is_fenced(drive, state):
    drive.produce(1, pid=PID, epoch=0, seq=0, txn=True)
    state.complete_marker(PID, 1, 0, drive.next_offset, NOW_MS, committed=False)  # aborted under epoch 1
    drive.next_offset += 1
    late, offset = drive.produce(1, pid=PID, epoch=0, seq=1, txn=True)  # a retry delayed in the network
    assert late.error == ErrorCode.INVALID_PRODUCER_EPOCH and offset is None
    assert state.ongoing == {}


# ------------------------------------------------------------ verification guards (KIP-890)

def _guarded_marker(state: ProducerStateManager, epoch: int, transaction_version: int, offset: int = 50) -> None:
    assert state.check_marker(PID, epoch, 0, transaction_version).error == ErrorCode.NONE
    state.complete_marker(PID, epoch, 0, offset, NOW_MS, True, transaction_version)


def _verified_first_batch(epoch: int):
    return header(make_batch(1, pid=PID, epoch=epoch, seq=0, txn=True))


@pytest.mark.parametrize("marker_epoch, transaction_version, refused", [
    # The previous transaction (epoch 4) committed under epoch 5, its marker arriving while
    # the next transaction's (epoch 5) add was verified: it ends an earlier transaction.
    (5, 2, None),
    (4, 2, None),   # a delayed duplicate of an older marker
    # The verified transaction itself ended: an abort bumped past it (the epoch refuses it
    # first), or a version 1 marker, which carries the transaction's own epoch.
    (6, 2, ErrorCode.INVALID_PRODUCER_EPOCH),
    (5, 1, ErrorCode.INVALID_TXN_STATE),
    (5, 0, ErrorCode.INVALID_TXN_STATE),
])
def test_a_marker_drops_the_guard_only_when_it_may_end_the_verified_transaction(
        state, marker_epoch, transaction_version, refused):
    h = _verified_first_batch(5)
    guard = state.verification_guard(PID, 5)
    _guarded_marker(state, marker_epoch, transaction_version)
    assert (PID in state.verification_guards) is (refused is None)
    check = state.check_append(h, guard)
    assert check.error == (refused or ErrorCode.NONE), check
    if refused == ErrorCode.INVALID_TXN_STATE:
        assert "ended while its batch was being verified" in check.message


def test_a_guard_shared_by_verifications_keeps_the_lowest_epoch(state):
    """Two verifications in flight for one PID share a guard: it stands only through
    markers that end a transaction before both (a marker at epoch 5 may end one that ran
    at epoch 4)."""
    at5 = state.verification_guard(PID, 5)
    at4 = state.verification_guard(PID, 4)
    assert at4 is at5 and at5.producer_epoch == 4
    assert state.verification_guard(PID, 6).producer_epoch == 4
    _guarded_marker(state, 5, 2)
    assert PID not in state.verification_guards
    assert state.check_append(_verified_first_batch(5), at5).error == ErrorCode.INVALID_TXN_STATE


def test_a_guard_dropped_by_a_marker_is_replaced_by_a_new_verification(state):
    old = state.verification_guard(PID, 5)
    _guarded_marker(state, 6, 2)
    new = state.verification_guard(PID, 6)
    assert new is not old and new.producer_epoch == 6
    assert state.check_append(_verified_first_batch(6), new).error == ErrorCode.NONE


# ------------------------------------------------------------ TxnPartitionsAdded notices
def test_a_noted_add_verifies_until_a_marker_of_the_pid_is_appended_at_or_above_its_offset(state, drive):
    """A notice stands as the verification of the PID's first batch at its epoch and id,
    like an answered question whose guard no marker dropped: any marker of the PID at or
    above the notice's offset (the transaction it spoke of ended here) undoes it."""
    drive.marker(PID, 0, True)          # the previous transaction's marker, offset 0
    state.note_added("t", PID, 0, 1)    # the coordinator's notice: from the offset after it
    assert state.added_verifies("t", PID, 0)
    assert not state.added_verifies("other", PID, 0)   # another transactional.id: asked
    assert not state.added_verifies("t", PID, 1)       # another epoch: asked
    assert not state.added_verifies("t", PID + 1, 0)   # another PID: asked
    drive.marker(PID, 0, False)         # the transaction ended (offset 1): the notice is spent
    assert not state.added_verifies("t", PID, 0) and PID not in state.added


def test_a_notice_that_arrives_after_the_marker_it_should_precede_does_not_verify(state, drive):
    """A delayed notice of a transaction that already ended here (its marker was appended
    at or above the notice's offset) is refused: the batch is asked about instead."""
    drive.marker(PID, 0, True)          # offset 0
    drive.marker(PID, 0, True)          # the noticed transaction's own marker, offset 1
    state.note_added("t", PID, 0, 1)    # its notice, from offset 1, arrives late
    assert not state.added_verifies("t", PID, 0)


def test_a_notice_below_what_the_state_knows_of_markers_does_not_verify(state):
    """Producer state loaded from a snapshot knows markers only from its offset on: a
    notice from before that may hide a marker, so it is not trusted."""
    state.markers_known_from = 10
    state.note_added("t", PID, 0, 5)
    assert not state.added_verifies("t", PID, 0)
    state.note_added("t", PID, 0, 10)
    assert state.added_verifies("t", PID, 0)


def test_notices_are_bounded_and_expire_with_their_pid(state, drive, clock):
    from services.partition_leader import producer_state
    for pid in range(producer_state.MAX_ADDED_NOTICES + 5):
        state.note_added("t", pid, 0, 0)
    assert len(state.added) == producer_state.MAX_ADDED_NOTICES and 0 not in state.added
    drive.produce(1, pid=PID, epoch=0, seq=0)
    state.note_added("t", PID, 0, 0)
    clock.advance(state.expiration_ms)
    assert PID in state.expire() and PID not in state.added
