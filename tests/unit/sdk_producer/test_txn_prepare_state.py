"""The producer's two-phase commit states (KIP-939 style): PREPARED_TRANSACTION is
entered from an open transaction, refuses sends, keeps registering partitions
while flushing, and ends with a commit or abort like an open transaction."""
import pytest

from exactly import errors
from exactly._txn_manager import TransactionManager, TransactionManagerState
from exactly.types import TopicPartition

S = TransactionManagerState
TP0 = TopicPartition("t", 0)


def in_transaction() -> TransactionManager:
    tm = TransactionManager("tx")
    tm.begin_initialize()
    tm.set_producer_id_and_epoch(7, 3)
    tm.begin_transaction()
    return tm


def test_prepare_needs_an_open_transaction():
    tm = TransactionManager("tx")
    tm.begin_initialize()
    tm.set_producer_id_and_epoch(7, 3)
    with pytest.raises(errors.IllegalStateError):
        tm.begin_prepare()
    with pytest.raises(errors.IllegalStateError):
        TransactionManager(None).begin_prepare()


def test_prepared_transaction_refuses_sends_and_retries_are_noticed():
    tm = in_transaction()
    assert tm.begin_prepare() is True
    assert tm.state is S.PREPARED_TRANSACTION
    with pytest.raises(errors.IllegalStateError):
        tm.check_can_send()
    assert tm.begin_prepare() is False  # a retry after a timeout


def test_partitions_queued_before_prepare_are_still_added():
    tm = in_transaction()
    tm.maybe_add_partition(TP0)
    tm.begin_prepare()
    assert tm.take_pending_partitions() == [TP0]
    tm.partitions_add_retry([TP0])
    assert tm.take_pending_partitions() == [TP0]
    tm.partitions_added([TP0])
    assert tm.transaction_started and tm.needs_end_txn


def test_sealed_empty_transaction_still_needs_end_txn():
    tm = in_transaction()
    tm.begin_prepare()
    assert not tm.needs_end_txn
    tm.transaction_sealed()
    assert tm.needs_end_txn
    assert tm.begin_commit() is True
    tm.complete_transaction()
    assert tm.state is S.READY and not tm.sealed


def test_prepared_transaction_can_be_aborted_and_errors_make_it_abortable():
    tm = in_transaction()
    tm.begin_prepare()
    assert tm.begin_abort() is True
    tm = in_transaction()
    tm.begin_prepare()
    tm.record_error(errors.KafkaTimeoutError("flush"))
    assert tm.state is S.ABORTABLE_ERROR
    with pytest.raises(errors.KafkaTimeoutError):
        tm.begin_commit()
    tm = in_transaction()
    tm.begin_prepare()
    tm.record_error(errors.ProducerFencedError("newer epoch"))
    assert tm.state is S.FATAL_ERROR


def test_restore_prepared_holds_a_kept_transaction_as_sealed():
    tm = TransactionManager("tx")
    tm.begin_initialize()
    tm.restore_prepared(9, 4)
    assert (tm.state, tm.producer_id, tm.producer_epoch, tm.sealed) == (S.PREPARED_TRANSACTION, 9, 4, True)
    assert tm.needs_end_txn
    with pytest.raises(errors.IllegalStateError):
        tm.begin_transaction()
    assert tm.begin_commit() is True


def test_prepared_txn_state_serializes_to_a_short_string():
    from exactly import PreparedTransaction, PreparedTxnState
    state = PreparedTxnState("orders:eu-1", 12, 7)
    assert state.serialize() == "12:7:orders:eu-1"
    assert PreparedTxnState.deserialize(state.serialize()) == state
    assert PreparedTransaction is PreparedTxnState
    with pytest.raises(ValueError):
        PreparedTxnState.deserialize("12-7")
