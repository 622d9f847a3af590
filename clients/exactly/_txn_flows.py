"""The Producer's transaction flows, shared by `exactly.Producer` and `exactly.aio.AIOProducer`.

A flow is a generator: it runs the transaction rules (state in `_txn_manager`, records in
`_accumulator`) and yields an I/O effect — a coordinator request (a `_txn_calls.CoordinatorCall`,
one class per RPC), `AwaitBatches`, `AwaitAddPartitions` — whenever it needs the outside world;
the driver performs the effect and sends the outcome back in (`exactly._client.run_flow`
blocking, in `Producer._perform`; `exactly.aio._core.run_flow_async` with `await`, in
`AIOProducer._perform`). So both producers send the same requests in the same order and share
every rule.

`TransactionFlows` holds the flows of one producer: flush, init_transactions (the classic form
of the KIP-98 design document, "Public APIs", initTransactions(), with KIP-939's
keepPreparedTxn; and the group-aware form of the KIP-447 draft), send_offsets_to_transaction
(KIP-447 group metadata), commit, abort, and KIP-939's prepare and complete.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Generator, Iterable, Mapping, NamedTuple

from exactly_wire.clock import SYSTEM_CLOCK, MonotonicClock
from exactly_wire.error_codes import ErrorCode

from . import errors
from ._accumulator import RecordAccumulator, fail_batches
from ._client import is_retriable
from ._two_phase import PreparedTxnState
from ._txn_calls import AddOffsetsToTxn, EndTxn, InitProducerId, PrepareTxn, TxnOffsetCommit
from ._txn_manager import FENCING_CODES, TransactionManager, TransactionManagerState
from .errors import TransactionAbortedError
from .types import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition


# ------------------------------------------------------------ effects

class AwaitBatches(NamedTuple):
    """Wait until every batch incomplete now has its outcome; errors.KafkaTimeoutError
    (`what` timed out) at `deadline` (seconds of the producer's clock,
    `MonotonicClock.now_s()`; None: no limit)."""

    deadline: float | None
    what: str


class AwaitAddPartitions(NamedTuple):
    """Wait until no AddPartitionsToTxn is in flight; errors.KafkaTimeoutError at `deadline`."""

    deadline: float


# ------------------------------------------------------------ flows

@dataclasses.dataclass
class TransactionFlows:
    """The flows of one producer (generators of the effects above): `transactional_id`,
    its `TransactionManager`, `RecordAccumulator` and sender (whose `wakeup()` makes it
    send now), `txn_timeout_ms` (transaction.timeout.ms) and `max_block_ms`
    (max.block.ms, the default of every `timeout`); `clock`: the producer's monotonic
    clock, which deadlines are on; `assigned`: a group-aware
    producer's input partitions. Each flow raises what the Producer method of its name
    documents."""

    transactional_id: str | None
    txn: TransactionManager
    acc: RecordAccumulator
    sender: Any
    txn_timeout_ms: int
    max_block_ms: float
    clock: MonotonicClock = SYSTEM_CLOCK
    assigned: list[TopicPartition] = dataclasses.field(default_factory=list)

    def _left_s(self, deadline: float) -> float:
        """Seconds left until `deadline` (on the producer's clock), at least 1 ms: a
        request sent at the deadline still gets a (short) timeout of its own."""
        return max(deadline - self.clock.now_s(), 0.001)

    def timeout_s(self, timeout: float | None) -> float:
        """`timeout` in seconds, max.block.ms when None. Raises TypeError for anything
        but a number or None (the group-aware form's partitions given to
        init_transactions(), as earlier releases took them, among others)."""
        if timeout is None:
            return self.max_block_ms / 1000.0
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be seconds (a number) or None, not {type(timeout).__name__}; the "
                            "group-aware form is init_transactions_for_group(partitions, group, generation)")
        return float(timeout)

    def flush(self, timeout: float | None) -> Generator:
        """Send every queued record now and wait for their outcomes (`timeout` s, None: no limit)."""
        self.acc.begin_flush()
        try:
            self.sender.wakeup()
            deadline = None if timeout is None else self.clock.now_s() + timeout
            yield AwaitBatches(deadline, f"flush timed out after {timeout} s")
        finally:
            self.acc.end_flush()

    def _init_producer_id(self, timeout_s: float, bump: bool = False,
                          assigned: Iterable[TopicPartition] = (), keep_prepared_txn: bool = False) -> Generator:
        """InitProducerId (`_txn_calls.InitProducerId`); a bumping one of a group-aware
        producer sends the partitions it was assigned last."""
        txn = self.txn
        call = InitProducerId(self.transactional_id, txn, self.txn_timeout_ms, timeout_s, bump,
                              self.assigned if bump else assigned, keep_prepared_txn)
        try:
            resp = yield call
        except errors.ExactlyError as exc:
            err = txn.initialize_failed(exc)
            if is_retriable(err):
                raise errors.KafkaTimeoutError(f"InitProducerId did not succeed within {timeout_s} s: {err}") from err
            raise err from None
        call.outcome(resp)

    def _check_transactional(self, call: str) -> None:
        if self.transactional_id is None:
            raise errors.IllegalStateError(f"{call} needs transactional.id")

    def init(self, timeout: float | None, keep_prepared_txn: bool = False) -> Generator:
        """The classic init_transactions(): PID and a new epoch for the transactional.id."""
        self._check_transactional("init_transactions()")
        timeout_s = self.timeout_s(timeout)
        self.txn.begin_initialize()
        yield from self._init_producer_id(timeout_s, keep_prepared_txn=keep_prepared_txn)

    def init_for_group(self, partitions: Iterable[TopicPartition] | None, group: str | ConsumerGroupMetadata | None,
                       generation: int | None, timeout: float | None) -> Generator:
        """The group-aware init_transactions_for_group() of the KIP-447 draft: an open
        transaction is dropped, then InitProducerId with group, generation and partitions."""
        self._check_transactional("init_transactions_for_group()")
        if group is None:
            raise ValueError("the group-aware init_transactions_for_group() needs a consumer group")
        if isinstance(group, ConsumerGroupMetadata):
            group_id = group.group_id
            generation = group.generation_id if generation is None else generation
        else:
            group_id = str(group)
        if not group_id or generation is None or generation < 0:
            raise ValueError("the group-aware init_transactions_for_group() needs a group id and a generation >= 0")
        assigned = sorted(TopicPartition(*tp) for tp in (partitions or ()))
        timeout_s = self.timeout_s(timeout)
        deadline = self.clock.now_s() + timeout_s
        # An open transaction is dropped: unsent records fail, those in flight finish;
        # the coordinator aborts the transaction itself.
        dropped = self.acc.drain_all()
        fail_batches(dropped, TransactionAbortedError("transaction dropped by init_transactions_for_group()"),
                     self.acc)
        self.sender.wakeup()
        yield AwaitBatches(deadline, f"init_transactions_for_group timed out after {timeout_s} s")
        yield AwaitAddPartitions(deadline)
        self.txn.begin_group_initialize(group_id, int(generation))
        self.assigned = assigned
        yield from self._init_producer_id(self._left_s(deadline), assigned=assigned)

    def send_offsets(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
                     group_metadata: ConsumerGroupMetadata | str, timeout: float | None) -> Generator:
        """AddOffsetsToTxn (once per group per transaction), then TxnOffsetCommit (KIP-447)."""
        txn = self.txn
        txn.check_in_transaction("send_offsets_to_transaction()")
        gm = ConsumerGroupMetadata(group_metadata) if isinstance(group_metadata, str) else group_metadata
        if not offsets:
            return
        timeout_s = self.timeout_s(timeout)
        deadline = self.clock.now_s() + timeout_s
        try:
            if txn.needs_add_offsets(gm.group_id):
                add = AddOffsetsToTxn(self.transactional_id, txn, gm.group_id, timeout_s)
                add.outcome((yield add))
            yield TxnOffsetCommit(self.transactional_id, txn, gm, offsets, self._left_s(deadline))
        except errors.ExactlyError as exc:
            if is_retriable(exc) and exc.code not in FENCING_CODES:
                raise errors.KafkaTimeoutError(
                    f"send_offsets_to_transaction did not succeed within {timeout_s} s: {exc}") from exc
            raise txn.record_error(exc) from None

    def commit(self, timeout: float | None) -> Generator:
        """Flush, then EndTxn(COMMIT). A flush that times out leaves the commit in
        progress (the records may still be acknowledged): commit_transaction() may be
        called again and goes on waiting, as Kafka's commitTransaction() after a
        TimeoutException."""
        _, deadline = yield from self._begin_ending(self.txn.begin_commit, timeout, abort_on_timeout=False)
        yield from self._finish_transaction(True, deadline)

    def _begin_ending(self, begin: Callable[[], None], timeout: float | None,
                      abort_on_timeout: bool = True) -> Generator:
        """Enter the commit or prepare state (`begin`), then send every record of the
        transaction; returns (timeout in seconds, deadline on the producer's clock)."""
        timeout_s = self.timeout_s(timeout)
        deadline = self.clock.now_s() + timeout_s
        begin()
        yield from self._flush_transaction(timeout_s, deadline, abort_on_timeout)
        return timeout_s, deadline

    def _finish_transaction(self, commit: bool, deadline: float) -> Generator:
        """EndTxn (when the coordinator has a transaction), adopt the epoch it ends
        under, and rotate the PID when that epoch is exhausted (KIP-890 part 2)."""
        txn = self.txn
        resp = (yield from self._end_txn(commit, self._left_s(deadline))) \
            if txn.needs_end_txn else None
        if resp is not None and resp.HasField("producer_epoch") and resp.producer_epoch >= 0:
            txn.complete_transaction(resp.producer_id, resp.producer_epoch)
        elif not commit and (txn.sequences_unresolved or (txn.implicit_add and txn.only_maybe_started)):
            # Nothing was ended under a new epoch, but some batch of the aborted
            # transaction may or may not be in the log: a new epoch restarts sequences
            # so later batches are not rejected (KIP-360). With implicit adds, a batch
            # still on its way could make its leader add its partition to this epoch's
            # next transaction: the new epoch fences that add (KIP-890 part 2).
            txn.transition_to(TransactionManagerState.INITIALIZING)
            yield from self._init_producer_id(self._left_s(deadline), bump=True)
            return
        else:
            txn.complete_transaction()
        if txn.epoch_exhausted:
            txn.transition_to(TransactionManagerState.INITIALIZING)
            yield from self._init_producer_id(self._left_s(deadline), bump=True)

    def _flush_transaction(self, timeout_s: float, deadline: float, abort_on_timeout: bool = True) -> Generator:
        """Send every record of the transaction and its pending AddPartitionsToTxn;
        raise the transaction's stored error, if any. A flush that times out raises
        KafkaTimeoutError; with `abort_on_timeout` (prepare) the transaction can then
        only be aborted, without it (commit) the commit stays in progress."""
        txn = self.txn
        try:
            yield from self.flush(timeout_s)
        except errors.KafkaTimeoutError as exc:
            if abort_on_timeout:
                # Records of the transaction are still unacknowledged: it can only be aborted.
                txn.record_error(exc)
            raise
        yield AwaitAddPartitions(deadline)
        txn.raise_if_failed()

    def prepare(self, timeout: float | None) -> Generator:
        """Flush, then PrepareTxn (KIP-939); returns the PreparedTxnState."""
        txn = self.txn
        timeout_s, deadline = yield from self._begin_ending(txn.begin_prepare, timeout)
        call = PrepareTxn(self.transactional_id, txn, self._left_s(deadline))
        try:
            resp = yield call
        except errors.ExactlyError as exc:
            if is_retriable(exc):
                raise errors.KafkaTimeoutError(f"PrepareTxn did not succeed within {timeout_s:.1f} s: {exc}") from exc
            raise txn.record_error(exc) from None
        call.outcome(resp)
        return PreparedTxnState(self.transactional_id, txn.producer_id, txn.producer_epoch)

    def prepared_state(self) -> PreparedTxnState | None:
        """The prepared transaction's state (its own PID and epoch, also when it was
        kept by init_transactions(keep_prepared_txn=True) and this producer talks with
        a newer epoch); None when none is prepared (no I/O)."""
        txn = self.txn
        prepared = txn.prepared_producer
        if txn.state is not TransactionManagerState.PREPARED_TRANSACTION or not txn.sealed or prepared is None:
            return None
        return PreparedTxnState(self.transactional_id, *prepared)

    def complete(self, state: PreparedTxnState | str | None, timeout: float | None) -> Generator:
        """KIP-939 completeTransaction(state): commit when `state` is the prepared
        transaction's (its own PID and epoch), abort otherwise, with EndTxn under this
        producer's epoch; returns "committed", "aborted" or "none"."""
        txn = self.txn
        if isinstance(state, str):
            state = PreparedTxnState.deserialize(state)
        txn.raise_if_fatal()  # a fenced producer stays fenced: ProducerFencedError, not "nothing prepared"
        mine = self.prepared_state()
        if mine is None:
            if txn.state in (TransactionManagerState.COMMITTING_TRANSACTION,
                             TransactionManagerState.ABORTING_TRANSACTION):
                # A retry after a timeout: finish the decision already taken.
                committing = txn.state is TransactionManagerState.COMMITTING_TRANSACTION
                yield from (self.commit(timeout) if committing else self.abort(timeout))
                return "committed" if committing else "aborted"
            if txn.state is TransactionManagerState.READY:
                return "none"
            raise errors.IllegalStateError(f"no prepared transaction to complete (state {txn.state.name})")
        if state is not None and tuple(PreparedTxnState(*state)) == tuple(mine):
            yield from self.commit(timeout)
            return "committed"
        yield from self.abort(timeout)
        return "aborted"

    def abort(self, timeout: float | None) -> Generator:
        """Drop unsent records, wait for those in flight, then EndTxn(ABORT)."""
        txn = self.txn
        timeout_s = self.timeout_s(timeout)
        deadline = self.clock.now_s() + timeout_s
        txn.begin_abort()
        dropped = self.acc.drain_all()
        if any(b.has_sequence for b in dropped):
            txn.sequences_unresolved = True  # sent before, outcome unknown
        fail_batches(dropped, TransactionAbortedError("transaction aborted before the record was sent"),
                     self.acc)
        self.sender.wakeup()
        yield AwaitBatches(deadline, f"abort_transaction timed out after {timeout_s} s")
        yield AwaitAddPartitions(deadline)
        txn.raise_if_fatal()
        yield from self._finish_transaction(False, deadline)

    def _end_txn(self, commit: bool, timeout_s: float) -> Generator:
        """EndTxn; returns the response (its PID and epoch are the ones the producer
        continues with), or None when there was nothing to abort."""
        txn = self.txn
        try:
            return (yield EndTxn(self.transactional_id, txn, commit, timeout_s))
        except errors.ExactlyError as exc:
            if is_retriable(exc):
                raise errors.KafkaTimeoutError(
                    f"EndTxn({'commit' if commit else 'abort'}) did not succeed within {timeout_s:.1f} s: {exc}"
                ) from exc
            if not commit and exc.code == ErrorCode.INVALID_TXN_STATE and txn.only_maybe_started:
                # Sent only because an AddPartitionsToTxn went unanswered: the
                # coordinator never started the transaction, so there is nothing to abort.
                return None
            if not commit and exc.code == ErrorCode.INVALID_PRODUCER_ID_MAPPING:
                # The coordinator no longer knows this PID (design doc "Error Handling",
                # InvalidPidMapping): nothing to abort; get a new mapping.
                txn.sequences_unresolved = True
                return None
            err = txn.record_error(exc)
            if not commit and txn.state is TransactionManagerState.ABORTING_TRANSACTION:
                txn.transition_to(TransactionManagerState.ABORTABLE_ERROR, err)
            raise err from None


__all__ = ["AwaitBatches", "AwaitAddPartitions", "TransactionFlows"]
