"""Transaction state machine: the transition table and prepare -> complete
(Kafka's TransactionMetadataTest; design doc "Transaction Log")."""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from exactly_wire.error_codes import ErrorCode
from services.txn_coordinator.state import (MAX_PRODUCER_EPOCH, NO_PARTITIONS, VALID_PREVIOUS, Guard,
                                            GuardNotHeldError, InvalidTransitionError, PendingTransitionError, TransactionMetadata, TransitionMismatchError,
                                            TxnState, TxnStateError, check_transition, is_epoch_exhausted)

S = TxnState
NOW = 1_000_000

# Kafka's TransactionState.validPreviousStates, spelled out independently of the module.
EXPECTED_VALID = {
    (S.EMPTY, S.EMPTY), (S.COMPLETE_COMMIT, S.EMPTY), (S.COMPLETE_ABORT, S.EMPTY),
    (S.EMPTY, S.ONGOING), (S.ONGOING, S.ONGOING), (S.COMPLETE_COMMIT, S.ONGOING), (S.COMPLETE_ABORT, S.ONGOING),
    (S.ONGOING, S.PREPARE_COMMIT),
    (S.ONGOING, S.PREPARE_ABORT), (S.PREPARE_EPOCH_FENCE, S.PREPARE_ABORT),
    (S.PREPARE_COMMIT, S.COMPLETE_COMMIT),
    (S.PREPARE_ABORT, S.COMPLETE_ABORT),
    (S.EMPTY, S.DEAD), (S.COMPLETE_COMMIT, S.DEAD), (S.COMPLETE_ABORT, S.DEAD),
    (S.ONGOING, S.PREPARE_EPOCH_FENCE),
}


@pytest.mark.parametrize("current,target", list(itertools.product(TxnState, TxnState)),
                         ids=lambda s: s.kafka_name)
def test_transition_table(current, target):
    if (current, target) in EXPECTED_VALID:
        check_transition("t", current, target)
        assert current in VALID_PREVIOUS[target]
    else:
        with pytest.raises(InvalidTransitionError):
            check_transition("t", current, target)


def test_every_state_has_an_entry():
    assert set(VALID_PREVIOUS) == set(TxnState)


@pytest.mark.parametrize("state", list(TxnState))
def test_state_names_round_trip(state):
    assert TxnState.from_name(state.kafka_name) is state
    assert TxnState.from_name(state.name) is state
    with pytest.raises(ValueError):
        TxnState.from_name("Bogus")


def md(state=S.EMPTY, epoch=0, partitions=(), start=-1, pid=100):
    return TransactionMetadata("tid", pid, producer_epoch=epoch, txn_timeout_ms=60000, state=state,
                               partitions=partitions, txn_start_timestamp=start, txn_last_update_timestamp=NOW)


def test_increment_epoch_then_complete():
    m = md(epoch=-1)
    t = m.prepare_increment_producer_epoch(30000, None, NOW + 1)
    assert m.pending_state is S.EMPTY and m.producer_epoch == -1  # not applied yet
    assert (t.producer_epoch, t.txn_timeout_ms, t.state) == (0, 30000, S.EMPTY)
    m.complete_transition(t)
    assert (m.producer_epoch, m.txn_timeout_ms, m.pending_state, m.txn_last_update_timestamp) == (0, 30000, None, NOW + 1)


def test_repr_names_a_pending_empty():
    """EMPTY is 0, so a truthiness test would print a pending Empty as no pending state."""
    m = md(epoch=-1)
    assert "pending=None" in repr(m)
    m.prepare_increment_producer_epoch(30000, None, NOW + 1)
    assert m.pending_state is S.EMPTY
    assert "pending=Empty" in repr(m)


def test_transit_is_immutable():
    t = md().prepare_add_partitions([("a", 0)], NOW)
    with pytest.raises(AttributeError):
        t.state = S.DEAD


def test_add_partitions_starts_transaction_once():
    m = md()
    m.complete_transition(m.prepare_add_partitions([("a", 0)], NOW + 5))
    assert m.state is S.ONGOING and m.txn_start_timestamp == NOW + 5
    m.complete_transition(m.prepare_add_partitions([("b", 1)], NOW + 9))
    assert m.partitions == {("a", 0), ("b", 1)} and m.txn_start_timestamp == NOW + 5


@pytest.mark.parametrize("target,final", [(S.PREPARE_COMMIT, S.COMPLETE_COMMIT), (S.PREPARE_ABORT, S.COMPLETE_ABORT)])
def test_prepare_then_complete_clears_partitions(target, final):
    m = md(S.ONGOING, partitions=[("a", 0)], start=NOW)
    m.complete_transition(m.prepare_abort_or_commit(target, NOW + 1))
    assert m.state is target and m.partitions == {("a", 0)}
    t = m.prepare_complete(NOW + 2)
    assert t.state is final and not t.partitions
    m.complete_transition(t)
    assert m.state is final and not m.partitions and m.producer_epoch == 0


def test_pending_transition_blocks_another_prepare():
    m = md(S.ONGOING, partitions=[("a", 0)], start=NOW)
    m.prepare_abort_or_commit(S.PREPARE_COMMIT, NOW)
    with pytest.raises(PendingTransitionError) as exc:
        m.prepare_add_partitions([("b", 0)], NOW)
    assert exc.value.code == ErrorCode.CONCURRENT_TRANSACTIONS
    m.cancel_transition()
    assert m.pending_state is None and m.state is S.ONGOING


@pytest.mark.parametrize("state", [S.EMPTY, S.COMPLETE_COMMIT, S.PREPARE_ABORT])
def test_commit_needs_an_ongoing_transaction(state):
    with pytest.raises(InvalidTransitionError):
        md(state).prepare_abort_or_commit(S.PREPARE_COMMIT, NOW)


def test_complete_needs_matching_pending_state():
    m = md(S.ONGOING, partitions=[("a", 0)], start=NOW)
    t = m.prepare_abort_or_commit(S.PREPARE_COMMIT, NOW)
    m.cancel_transition()
    with pytest.raises(TransitionMismatchError):
        m.complete_transition(t)


# Kafka's TransactionMetadataTest.testTolerateTimeShiftDuring*: the wall clock steps
# back between two transitions (NTP, a failover to a host whose clock is behind); the
# transition completes with the earlier timestamp instead of wedging the id with a
# pending state after its record was appended.
SHIFTED = NOW - 10


def _shift_epoch_bump(m):
    return m.prepare_increment_producer_epoch(30000, None, SHIFTED)


def _shift_pid_rotation(m):
    return m.prepare_producer_id_rotation(101, 30000, SHIFTED, record_last_epoch=True)


def _shift_add_partitions(m):
    return m.prepare_add_partitions([("b", 1)], SHIFTED)


def _shift_prepare_commit(m):
    return m.prepare_abort_or_commit(S.PREPARE_COMMIT, SHIFTED)


def _shift_prepare_abort(m):
    return m.prepare_abort_or_commit(S.PREPARE_ABORT, SHIFTED)


def _shift_fenced_abort(m):
    m.prepare_fence_producer_epoch(SHIFTED)
    return m.prepare_abort_or_commit(S.PREPARE_ABORT, SHIFTED)


def _shift_complete(m):
    return m.prepare_complete(SHIFTED)


def _shift_dead(m):
    return m.prepare_dead(SHIFTED)


@pytest.mark.parametrize("state,partitions,prepare,final", [
    (S.EMPTY, (), _shift_epoch_bump, S.EMPTY),
    (S.COMPLETE_COMMIT, (), _shift_pid_rotation, S.EMPTY),
    (S.EMPTY, (), _shift_add_partitions, S.ONGOING),
    (S.COMPLETE_ABORT, (), _shift_add_partitions, S.ONGOING),
    (S.ONGOING, [("a", 0)], _shift_add_partitions, S.ONGOING),
    (S.ONGOING, [("a", 0)], _shift_prepare_commit, S.PREPARE_COMMIT),
    (S.ONGOING, [("a", 0)], _shift_prepare_abort, S.PREPARE_ABORT),
    (S.ONGOING, [("a", 0)], _shift_fenced_abort, S.PREPARE_ABORT),
    (S.PREPARE_COMMIT, [("a", 0)], _shift_complete, S.COMPLETE_COMMIT),
    (S.PREPARE_ABORT, [("a", 0)], _shift_complete, S.COMPLETE_ABORT),
    (S.COMPLETE_COMMIT, (), _shift_dead, S.DEAD),
], ids=["epoch-bump", "pid-rotation", "add-from-empty", "add-from-complete", "add-to-ongoing", "prepare-commit",
        "prepare-abort", "timeout-abort", "complete-commit", "complete-abort", "dead"])
def test_tolerates_time_shift_during_transition(state, partitions, prepare, final):
    start = NOW if state in (S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT) else -1
    m = md(state, epoch=3, partitions=partitions, start=start)
    t = prepare(m)
    m.complete_transition(t)
    assert m.state is final and m.pending_state is None
    assert m.txn_last_update_timestamp == SHIFTED
    if final is S.ONGOING and state is S.ONGOING:
        assert m.txn_start_timestamp == NOW  # the transaction's start is kept
    elif final is S.ONGOING:
        assert m.txn_start_timestamp == SHIFTED


def test_fence_bumps_epoch_on_abort():
    m = md(S.ONGOING, epoch=4, partitions=[("a", 0)], start=NOW)
    m.prepare_fence_producer_epoch(NOW)
    assert m.pending_state is S.PREPARE_EPOCH_FENCE
    t = m.prepare_abort_or_commit(S.PREPARE_ABORT, NOW)
    assert t.state is S.PREPARE_ABORT and t.producer_epoch == 5 and t.partitions == {("a", 0)}
    m.complete_transition(t)
    assert m.producer_epoch == 5 and m.state is S.PREPARE_ABORT


def test_fence_cannot_commit():
    m = md(S.ONGOING, epoch=4, partitions=[("a", 0)], start=NOW)
    m.prepare_fence_producer_epoch(NOW)
    with pytest.raises(InvalidTransitionError):
        m.prepare_abort_or_commit(S.PREPARE_COMMIT, NOW)


def test_fence_at_max_epoch_keeps_epoch():
    m = md(S.ONGOING, epoch=MAX_PRODUCER_EPOCH, partitions=[("a", 0)], start=NOW)
    m.prepare_fence_producer_epoch(NOW)
    assert m.prepare_abort_or_commit(S.PREPARE_ABORT, NOW).producer_epoch == MAX_PRODUCER_EPOCH


def test_epoch_exhaustion_and_rotation():
    assert not is_epoch_exhausted(MAX_PRODUCER_EPOCH - 2)
    assert is_epoch_exhausted(MAX_PRODUCER_EPOCH - 1)
    m = md(S.COMPLETE_COMMIT, epoch=MAX_PRODUCER_EPOCH - 1)
    with pytest.raises(TxnStateError):
        m.prepare_increment_producer_epoch(60000, None, NOW)
    t = m.prepare_producer_id_rotation(555, 60000, NOW, record_last_epoch=True)
    m.complete_transition(t)
    assert (m.producer_id, m.producer_epoch, m.last_producer_id, m.last_producer_epoch) == \
        (555, 0, 100, MAX_PRODUCER_EPOCH - 1)


def test_pid_change_outside_rotation_is_rejected():
    from dataclasses import replace
    m = md(S.EMPTY, epoch=3)
    t = m.prepare_increment_producer_epoch(60000, None, NOW)
    with pytest.raises(TransitionMismatchError):
        m.complete_transition(replace(t, producer_id=999))


class TestKip360ExpectedEpoch:
    def test_matching_epoch_bumps_and_remembers(self):
        m = md(S.COMPLETE_ABORT, epoch=7)
        t = m.prepare_increment_producer_epoch(60000, 7, NOW)
        assert (t.producer_epoch, t.last_producer_epoch) == (8, 7)

    def test_retry_of_a_bump_returns_same_epoch(self):
        m = md(S.EMPTY, epoch=8)
        m.last_producer_epoch = 7
        t = m.prepare_increment_producer_epoch(60000, 7, NOW)
        assert (t.producer_epoch, t.last_producer_epoch) == (8, 7)

    def test_other_epoch_is_fenced(self):
        m = md(S.EMPTY, epoch=8)
        assert m.prepare_increment_producer_epoch(60000, 3, NOW) == ErrorCode.PRODUCER_FENCED
        assert m.pending_state is None


def test_dead_only_without_transaction():
    with pytest.raises(InvalidTransitionError):
        md(S.ONGOING, partitions=[("a", 0)], start=NOW).prepare_dead(NOW)
    m = md(S.COMPLETE_COMMIT)
    m.complete_transition(m.prepare_dead(NOW))
    assert m.state is S.DEAD


@pytest.mark.parametrize("state", [S.PREPARE_COMMIT, S.PREPARE_ABORT])
def test_the_handover_starts_the_next_transaction_from_prepare(state):
    m = md(state, epoch=4, partitions=[("a", 0), ("a", 1)], start=NOW - 50)
    assert m.record_markers_written(m.snapshot())
    t = m.prepare_next_transaction([("b", 0)], NOW)
    assert (t.state, t.producer_epoch, t.partitions, t.txn_start_timestamp) == (S.ONGOING, 4, {("b", 0)}, NOW)
    with pytest.raises(PendingTransitionError):
        m.prepare_next_transaction([("b", 1)], NOW)
    m.complete_transition(t)
    assert (m.state, m.partitions, m.pending_state) == (S.ONGOING, {("b", 0)}, None)
    # Only the handover takes that step; the table itself keeps Kafka's transitions.
    with pytest.raises(InvalidTransitionError):
        check_transition("t", state, S.ONGOING)


@pytest.mark.parametrize("state", [S.EMPTY, S.ONGOING, S.COMPLETE_COMMIT, S.COMPLETE_ABORT])
def test_the_handover_needs_a_prepared_transaction(state):
    with pytest.raises(InvalidTransitionError):
        md(state, partitions=[("a", 0)] if state is S.ONGOING else (), start=NOW).prepare_next_transaction(
            [("b", 0)], NOW)


def test_a_cancelled_handover_leaves_the_prepared_transaction():
    m = md(S.PREPARE_COMMIT, epoch=4, partitions=[("a", 0)], start=NOW)
    m.record_markers_written(m.snapshot())
    t = m.prepare_next_transaction([("b", 0)], NOW)
    m.cancel_transition()
    assert (m.state, m.partitions) == (S.PREPARE_COMMIT, {("a", 0)})
    m.pending_state = S.ONGOING  # a pending Ongoing that is no handover: Prepare -> Ongoing is refused
    with pytest.raises(InvalidTransitionError):
        m.complete_transition(t)


@pytest.mark.parametrize("state", [S.PREPARE_COMMIT, S.PREPARE_ABORT])
def test_the_state_machine_refuses_the_handover_until_the_markers_are_recorded_as_written(state):
    """The handover's guard is a fact the metadata holds: without
    record_markers_written (or after the fact was forgotten) prepare_next_transaction
    is refused by the machine itself, whatever the caller believes."""
    m = md(state, epoch=4, partitions=[("a", 0)], start=NOW)
    with pytest.raises(GuardNotHeldError):
        m.prepare_next_transaction([("b", 0)], NOW)
    assert (m.state, m.pending_state, m.markers_written) == (state, None, False)
    # The fact is recorded only for this transaction, with nothing pending.
    assert not m.record_markers_written(replace(m.snapshot(), producer_epoch=3))
    other = S.PREPARE_ABORT if state is S.PREPARE_COMMIT else S.PREPARE_COMMIT
    assert not m.record_markers_written(replace(m.snapshot(), state=other))
    with pytest.raises(GuardNotHeldError):
        m.prepare_next_transaction([("b", 0)], NOW)
    assert m.record_markers_written(m.snapshot()) and m.markers_written
    m.complete_transition(m.prepare_next_transaction([("b", 0)], NOW))
    assert (m.state, m.markers_written) == (S.ONGOING, False)


def test_a_pending_guarded_transition_is_refused_once_the_fact_is_gone():
    m = md(S.PREPARE_ABORT, epoch=4, partitions=[("a", 0)], start=NOW)
    m.pending_state = S.ONGOING
    m._pending_guard = Guard.MARKERS_WRITTEN  # as if prepared, but no fact was ever recorded
    with pytest.raises(GuardNotHeldError):
        m.complete_transition(replace(m.snapshot(), state=S.ONGOING, partitions=frozenset({("b", 0)})))
    assert m.state is S.PREPARE_ABORT


def test_a_replayed_record_forgets_nothing_it_should_not_and_records_no_fact():
    m = md(S.PREPARE_COMMIT, epoch=4, partitions=[("a", 0)], start=NOW)
    m.record_markers_written(m.snapshot())
    m.replay(replace(m.snapshot(), state=S.COMPLETE_COMMIT, partitions=frozenset(), txn_last_update_timestamp=NOW + 1))
    assert (m.state, m.partitions, m.markers_written, m.txn_last_update_timestamp) == \
        (S.COMPLETE_COMMIT, set(), False, NOW + 1)


def test_ids_without_a_transaction_share_one_empty_partition_set():
    """Memory per transactional.id: an id with no partition in a transaction holds the
    shared NO_PARTITIONS, not a set of its own; its partitions while a transaction is
    ongoing are exactly those added."""
    md = TransactionMetadata("t", 5, txn_timeout_ms=1000, txn_last_update_timestamp=NOW)
    assert md.partitions is NO_PARTITIONS
    md.complete_transition(md.prepare_increment_producer_epoch(1000, None, NOW))
    assert md.partitions is NO_PARTITIONS
    md.complete_transition(md.prepare_add_partitions([("a", 0), ("b", 1)], NOW))
    assert md.partitions == {("a", 0), ("b", 1)}
    md.complete_transition(md.prepare_abort_or_commit(S.PREPARE_COMMIT, NOW))
    md.complete_transition(md.prepare_complete(NOW))
    assert md.state is S.COMPLETE_COMMIT and md.partitions is NO_PARTITIONS
