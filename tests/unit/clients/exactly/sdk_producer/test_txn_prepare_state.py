"""The producer's two-phase commit states (KIP-939 style): PREPARED_TRANSACTION is
entered from an open transaction, refuses sends, keeps registering partitions
while flushing, and ends with a commit or abort like an open transaction."""
import pytest

from exactly import PreparedTxnState, errors
from exactly._accumulator import RecordAccumulator
from exactly._client import run_flow
from exactly._txn_calls import CoordinatorCall
from exactly._txn_flows import TransactionFlows
from exactly._txn_manager import TransactionManager, TransactionManagerState
from exactly.types import TopicPartition
from exactly_wire.v1 import exactly_pb2 as pb

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
    tm.restore_prepared(9, 5, 9, 4)
    assert (tm.state, tm.producer_id, tm.producer_epoch, tm.sealed) == (S.PREPARED_TRANSACTION, 9, 5, True)
    assert tm.prepared_producer == (9, 4)
    assert tm.needs_end_txn
    with pytest.raises(errors.IllegalStateError):
        tm.begin_transaction()
    assert tm.begin_commit() is True


class _Sender:
    def wakeup(self) -> None:
        pass


def _drive(flow, answers: dict[str, object], sent: list):
    """Run a producer flow, answering each coordinator request by the name of its class
    (the RPC's) from `answers` (and every wait at once); (name, request) go to `sent`."""
    def perform(effect):
        if isinstance(effect, CoordinatorCall):
            name = type(effect).__name__
            sent.append((name, effect.request))
            return answers[name]
        return None
    return run_flow(flow, perform)


def test_kept_transaction_is_named_by_its_own_pair_and_completed_under_the_new_epoch():
    """KIP-939: InitProducerId(keepPreparedTxn) answers the new client-facing pair and the
    prepared transaction's own; complete_transaction(state) compares `state` with the
    latter and ends the transaction with EndTxn under the former."""
    flows = TransactionFlows("tx", TransactionManager("tx"), RecordAccumulator(), _Sender(), 60000, 5000)
    sent: list = []
    init = pb.InitProducerIdResponse(producer_id=9, producer_epoch=5, ongoing_txn_producer_id=9,
                                     ongoing_txn_producer_epoch=4)
    _drive(flows.init(5, keep_prepared_txn=True), {"InitProducerId": init}, sent)
    assert flows.prepared_state() == PreparedTxnState("tx", 9, 4)
    assert (flows.txn.producer_id, flows.txn.producer_epoch) == (9, 5)
    end = pb.EndTxnResponse(producer_id=9, producer_epoch=6)
    assert _drive(flows.complete(PreparedTxnState("tx", 9, 4).serialize(), 5), {"EndTxn": end}, sent) == \
        "committed"
    method, req = sent[-1]
    assert (method, req.producer_id, req.producer_epoch, req.committed) == ("EndTxn", 9, 5, True)
    assert (flows.txn.state, flows.txn.producer_epoch, flows.prepared_state()) == (S.READY, 6, None)


def test_kept_transaction_whose_state_the_manager_lacks_is_aborted_under_the_new_epoch():
    flows = TransactionFlows("tx", TransactionManager("tx"), RecordAccumulator(), _Sender(), 60000, 5000)
    sent: list = []
    init = pb.InitProducerIdResponse(producer_id=9, producer_epoch=5, ongoing_txn_producer_id=9,
                                     ongoing_txn_producer_epoch=4)
    _drive(flows.init(5, keep_prepared_txn=True), {"InitProducerId": init}, sent)
    # The new instance's own pair is not the prepared transaction's: not a match.
    end = pb.EndTxnResponse(producer_id=9, producer_epoch=6)
    assert _drive(flows.complete(PreparedTxnState("tx", 9, 5), 5), {"EndTxn": end}, sent) == "aborted"
    method, req = sent[-1]
    assert (method, req.producer_epoch, req.committed) == ("EndTxn", 5, False)


def test_prepared_txn_state_serializes_to_a_short_string():
    from exactly import PreparedTransaction, PreparedTxnState
    state = PreparedTxnState("orders:eu-1", 12, 7)
    assert state.serialize() == "12:7:orders:eu-1"
    assert PreparedTxnState.deserialize(state.serialize()) == state
    assert PreparedTransaction is PreparedTxnState
    with pytest.raises(ValueError):
        PreparedTxnState.deserialize("12-7")
