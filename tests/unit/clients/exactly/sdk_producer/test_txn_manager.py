"""The producer's transaction state machine and sequence bookkeeping (pure).
KIP-98 design document, "Transactional Producer": Public APIs and Error Handling."""
import itertools

import pytest

from exactly import errors
from exactly_wire.error_codes import FATAL
from exactly._txn_manager import (ERROR_STATES, VALID_PREVIOUS, InvalidTransitionError,
                                  TransactionManager, TransactionManagerState, next_sequence)
from exactly.types import TopicPartition

S = TransactionManagerState
TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def manager_in(state: TransactionManagerState, transactional: bool = True) -> TransactionManager:
    tm = TransactionManager("tx" if transactional else None)
    tm.state = state
    if state in ERROR_STATES:
        tm.last_error = errors.for_code(errors.ErrorCode.UNKNOWN_SERVER_ERROR, "earlier")
    return tm


def ready_manager() -> TransactionManager:
    tm = TransactionManager("tx")
    tm.begin_initialize()
    tm.set_producer_id_and_epoch(7, 3)
    return tm


@pytest.mark.parametrize("source,target", list(itertools.product(TransactionManagerState, TransactionManagerState)))
def test_transition_table_is_the_only_rule(source, target):
    tm = manager_in(source)
    err = errors.KafkaTimeoutError("cause") if target in ERROR_STATES else None
    if source in VALID_PREVIOUS[target]:
        tm.transition_to(target, err)
        assert tm.state is target
    else:
        with pytest.raises(InvalidTransitionError):
            tm.transition_to(target, err)
        assert tm.state is source


def test_invalid_transition_is_a_typed_error_not_an_assert():
    assert issubclass(InvalidTransitionError, errors.IllegalStateError)


@pytest.mark.parametrize("target", sorted(ERROR_STATES, key=lambda s: s.name))
def test_error_states_require_their_cause(target):
    tm = manager_in(S.IN_TRANSACTION)
    with pytest.raises(ValueError):
        tm.transition_to(target)
    cause = errors.KafkaTimeoutError("x")
    tm.transition_to(target, cause)
    assert tm.last_error is cause


def test_non_error_state_rejects_an_error():
    tm = manager_in(S.READY)
    with pytest.raises(ValueError):
        tm.transition_to(S.IN_TRANSACTION, errors.KafkaTimeoutError("x"))


def test_fatal_is_terminal():
    """Only a group-aware re-initialisation leaves FATAL_ERROR (KIP-447 draft: after a
    ProducerFencedError), through begin_group_initialize."""
    tm = manager_in(S.FATAL_ERROR)
    for target in TransactionManagerState:
        if target in (S.FATAL_ERROR, S.INITIALIZING):
            continue
        with pytest.raises(InvalidTransitionError):
            tm.transition_to(target, errors.KafkaTimeoutError("x") if target in ERROR_STATES else None)


def test_abortable_error_keeps_first_cause():
    tm = manager_in(S.IN_TRANSACTION)
    first = errors.MessageTooLargeError("first")
    tm.transition_to(S.ABORTABLE_ERROR, first)
    tm.transition_to(S.ABORTABLE_ERROR, errors.KafkaTimeoutError("second"))
    assert tm.last_error is first


def test_init_then_transaction_lifecycle():
    tm = TransactionManager("tx")
    assert tm.state is S.UNINITIALIZED
    tm.begin_initialize()
    assert tm.state is S.INITIALIZING
    tm.set_producer_id_and_epoch(11, 0)
    assert (tm.state, tm.producer_id, tm.producer_epoch) == (S.READY, 11, 0)
    tm.begin_transaction()
    assert tm.state is S.IN_TRANSACTION
    assert tm.begin_commit() is True
    assert tm.begin_commit() is False  # a retry after a timeout
    tm.complete_transaction()
    assert tm.state is S.READY
    tm.begin_transaction()
    assert tm.begin_abort() is True
    tm.complete_transaction()
    assert tm.state is S.READY


def test_init_twice_is_illegal():
    tm = ready_manager()
    with pytest.raises(errors.IllegalStateError):
        tm.begin_initialize()


def test_init_failure_retriable_allows_retry_fatal_does_not():
    tm = TransactionManager("tx")
    tm.begin_initialize()
    err = tm.initialize_failed(errors.CoordinatorNotAvailableError())
    assert tm.state is S.UNINITIALIZED and isinstance(err, errors.CoordinatorNotAvailableError)
    tm.begin_initialize()
    tm.initialize_failed(errors.InvalidTransactionTimeoutError())
    assert tm.state is S.FATAL_ERROR
    with pytest.raises(errors.InvalidTransactionTimeoutError):
        tm.begin_initialize()


def test_begin_transaction_checks():
    tm = TransactionManager("tx")
    with pytest.raises(errors.IllegalStateError):
        tm.begin_transaction()  # not initialized
    tm = ready_manager()
    tm.begin_transaction()
    with pytest.raises(errors.IllegalStateError):
        tm.begin_transaction()  # already in a transaction
    with pytest.raises(errors.IllegalStateError):
        TransactionManager(None).begin_transaction()  # not transactional


def test_send_needs_a_transaction_for_a_transactional_producer():
    tm = ready_manager()
    with pytest.raises(errors.IllegalStateError):
        tm.check_can_send()
    tm.begin_transaction()
    tm.check_can_send()
    idem = TransactionManager(None)
    idem.check_can_send()  # the sender gets the PID itself


@pytest.mark.parametrize("code", [errors.ErrorCode.PRODUCER_FENCED, errors.ErrorCode.INVALID_PRODUCER_EPOCH])
def test_fencing_is_fatal_and_raised_as_producer_fenced(code):
    tm = ready_manager()
    tm.begin_transaction()
    err = tm.record_error(errors.for_code(code))
    assert isinstance(err, errors.ProducerFencedError)
    assert tm.state is S.FATAL_ERROR
    for call in (tm.begin_transaction, tm.begin_commit, tm.begin_abort, tm.check_can_send,
                 lambda: tm.check_in_transaction("send_offsets_to_transaction()")):
        with pytest.raises(errors.ProducerFencedError):
            call()


@pytest.mark.parametrize("code", sorted(FATAL))
def test_fatal_codes(code):
    tm = ready_manager()
    tm.begin_transaction()
    tm.record_error(errors.for_code(code))
    assert tm.state is S.FATAL_ERROR


@pytest.mark.parametrize("exc", [errors.MessageTooLargeError(), errors.IllegalGenerationError(),
                                 errors.UnknownMemberIdError(), errors.KafkaTimeoutError("delivery timeout"),
                                 errors.TopicAuthorizationFailedError()])
def test_other_errors_are_abortable(exc):
    tm = ready_manager()
    tm.begin_transaction()
    tm.record_error(exc)
    assert tm.state is S.ABORTABLE_ERROR
    with pytest.raises(type(exc)):
        tm.begin_commit()
    with pytest.raises(type(exc)):
        tm.check_can_send()
    assert tm.begin_abort() is True  # the way out of an abortable error
    tm.complete_transaction()
    tm.begin_transaction()


def test_raise_if_failed_raises_a_fresh_copy_with_the_cause():
    tm = ready_manager()
    tm.begin_transaction()
    cause = errors.MessageTooLargeError("too big")
    tm.record_error(cause)
    with pytest.raises(errors.MessageTooLargeError) as info:
        tm.raise_if_failed()
    assert info.value is not cause and info.value.__cause__ is cause and str(info.value) == "too big"


def test_non_transactional_errors_only_matter_when_fatal():
    tm = TransactionManager(None)
    tm.begin_initialize()
    tm.set_producer_id_and_epoch(1, 0)
    tm.record_error(errors.MessageTooLargeError())
    assert tm.state is S.READY
    tm.record_error(errors.OutOfOrderSequenceNumberError())  # KIP-360: not fatal
    assert tm.state is S.READY
    tm.record_error(errors.ProducerFencedError())
    assert tm.state is S.FATAL_ERROR


def test_out_of_order_sequence_aborts_the_transaction():
    tm = ready_manager()
    tm.begin_transaction()
    tm.record_error(errors.OutOfOrderSequenceNumberError())
    assert tm.state is S.ABORTABLE_ERROR


def test_a_completed_transaction_continues_under_the_epoch_end_txn_answered():
    tm = ready_manager()
    tm.begin_transaction()
    tm.maybe_add_partition(TP0)
    assert tm.sequence_for(TP0, 3) == 0
    tm.begin_commit()
    tm.complete_transaction(tm.producer_id, tm.producer_epoch + 1)
    assert tm.state is S.READY and tm.sequence_for(TP0, 1) == 0  # a new epoch restarts sequences
    assert not tm.epoch_exhausted
    tm.begin_transaction()
    tm.begin_commit()
    tm.complete_transaction(tm.producer_id, 32766)
    assert tm.epoch_exhausted  # InitProducerId must rotate the PID before the next transaction


def test_partitions_are_added_once_per_transaction():
    tm = ready_manager()
    tm.begin_transaction()
    assert not tm.transaction_started
    tm.maybe_add_partition(TP0)
    tm.maybe_add_partition(TP1)
    tm.maybe_add_partition(TP0)
    assert not tm.is_partition_added(TP0)
    taken = tm.take_pending_partitions()
    assert taken == [TP0, TP1] and tm.add_in_flight
    assert tm.take_pending_partitions() == []  # one AddPartitionsToTxn at a time
    tm.maybe_add_partition(TP0)  # already being added: not pending again
    assert not tm.has_pending_partitions()
    tm.partitions_add_retry([TP1])
    tm.partitions_added([TP0])
    assert tm.is_partition_added(TP0) and not tm.is_partition_added(TP1)
    assert tm.take_pending_partitions() == [TP1]
    tm.partitions_added([TP1])
    assert tm.transaction_started
    tm.begin_commit()
    tm.complete_transaction()
    tm.begin_transaction()
    assert not tm.is_partition_added(TP0) and not tm.transaction_started


def test_offsets_group_added_once_per_transaction():
    tm = ready_manager()
    tm.begin_transaction()
    assert tm.needs_add_offsets("g")
    tm.offsets_added("g")
    assert not tm.needs_add_offsets("g") and tm.transaction_started
    tm.begin_abort()
    tm.complete_transaction()
    tm.begin_transaction()
    assert tm.needs_add_offsets("g")


def test_sequences_per_partition_and_reset_on_new_epoch():
    tm = ready_manager()
    assert tm.sequence_for(TP0, 3) == 0
    assert tm.sequence_for(TP0, 2) == 3
    assert tm.sequence_for(TP1, 4) == 0
    assert tm.next_sequence_of(TP0) == 5
    tm.ack(TP0, 2)
    assert tm.is_next_expected(TP0, 3) and not tm.is_next_expected(TP0, 5)
    tm.ack(TP0, 4)
    tm.ack(TP0, 2)  # a late duplicate does not move it back
    assert tm.last_acked_sequence(TP0) == 4
    tm.begin_transaction()
    tm.begin_abort()
    tm.transition_to(S.INITIALIZING)
    tm.set_producer_id_and_epoch(7, 4)
    assert tm.sequence_for(TP0, 1) == 0 and tm.last_acked_sequence(TP0) == -1


def test_sequence_wraps_at_int32_max():
    tm = ready_manager()
    tm._next_seq[TP0] = 2**31 - 2
    assert tm.sequence_for(TP0, 3) == 2**31 - 2
    assert tm.next_sequence_of(TP0) == 1
    assert next_sequence(2**31 - 1, 1) == 0
    tm.ack(TP0, 2**31 - 1)
    assert tm.is_next_expected(TP0, 0)


def test_idempotent_producer_reset_pid():
    tm = TransactionManager(None)
    tm.begin_initialize()
    tm.set_producer_id_and_epoch(5, 0)
    tm.sequence_for(TP0, 10)
    tm.reset_producer_id()
    assert tm.state is S.UNINITIALIZED and not tm.has_producer_id
    tm.begin_initialize()
    tm.set_producer_id_and_epoch(6, 0)
    assert tm.sequence_for(TP0, 1) == 0
    with pytest.raises(errors.IllegalStateError):
        ready_manager().reset_producer_id()


def test_transactional_requires_idempotence():
    with pytest.raises(ValueError):
        TransactionManager("tx", idempotent=False)
    plain = TransactionManager(None, idempotent=False)
    assert plain.state is S.READY and not plain.has_producer_id


def test_group_aware_initialization_after_being_fenced_or_inside_a_transaction():
    tm = TransactionManager("tid")
    tm.begin_group_initialize("g", 3)
    tm.set_producer_id_and_epoch(5, 0)
    tm.begin_transaction()
    tm.maybe_add_partition(TP0)
    # A rebalance: the open transaction is dropped, the generation is the new one.
    tm.begin_group_initialize("g", 4)
    assert (tm.state, tm.generation_id, tm.group_id, tm.has_pending_partitions()) == \
        (S.INITIALIZING, 4, "g", False)
    tm.set_producer_id_and_epoch(5, 1)
    # Fenced by another member's init: recoverable by the group-aware init only.
    tm.transition_to(S.FATAL_ERROR, errors.ProducerFencedError("fenced"))
    with pytest.raises(errors.ProducerFencedError):
        tm.begin_transaction()
    tm.begin_group_initialize("g", 5)
    assert tm.state is S.INITIALIZING and tm.last_error is None
    with pytest.raises(errors.IllegalStateError, match="group 'g'"):
        tm.begin_group_initialize("other", 6)


def test_group_aware_initialization_does_not_hide_other_fatal_errors():
    tm = TransactionManager("tid")
    tm.begin_group_initialize("g", 1)
    tm.transition_to(S.FATAL_ERROR, errors.TransactionalIdAuthorizationFailedError("no"))
    with pytest.raises(errors.TransactionalIdAuthorizationFailedError):
        tm.begin_group_initialize("g", 2)
