"""The Producer's transaction flows, shared by `exactly.Producer` and `exactly.aio.AIOProducer`.

A flow is a generator: it runs the transaction rules (state in `_txn_manager`, records in
`_accumulator`) and yields an I/O effect — `CoordinatorRequest`, `AwaitBatches`,
`AwaitAddPartitions` — whenever it needs the outside world; the driver performs the effect and
sends the outcome back in (`exactly._client.run_flow` blocking, in `Producer._perform`;
`exactly.aio._core.run_flow_async` with `await`, in `AIOProducer._perform`). So both producers
send the same requests in the same order and share every rule.

`TransactionFlows` holds the flows of one producer: flush, init_transactions (the classic form
of the KIP-98 design document, "Public APIs", initTransactions(), with KIP-939's
keepPreparedTxn; and the group-aware form of the KIP-447 draft), send_offsets_to_transaction
(KIP-447 group metadata), commit, abort, and KIP-939's prepare and complete. `group_aware_call`
reads the arguments of the init_transactions() of earlier releases, which took the group-aware
form's partitions as its first argument.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
import logging
import warnings
from typing import Any, Callable, Generator, Iterable, Mapping, NamedTuple, TypeVar, cast

from exactly_wire.clock import SYSTEM_CLOCK, MonotonicClock
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb

from . import errors
from ._accumulator import RecordAccumulator, fail_batches
from ._client import COORDINATOR_GROUP, is_retriable, txn_coordinator_key
from ._two_phase import PreparedTxnState
from ._txn_manager import (FENCING_CODES, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TransactionManager,
                           TransactionManagerState)
from .errors import TransactionAbortedError
from .types import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition

# The flows log as the Producer did before they had a module of their own.
log = logging.getLogger("exactly.producer")

F = TypeVar("F", bound=Callable[..., Any])


# ------------------------------------------------------------ effects

class CoordinatorRequest(NamedTuple):
    """Send `request` to the coordinator of `key` (key_type COORDINATOR_GROUP or
    COORDINATOR_TRANSACTION) with `ClientCore.coordinator_call` semantics; the
    outcome is the response. `stub`: "txn" or "group"; `method`: the RPC name."""

    key: str
    key_type: int
    stub: str
    method: str
    request: Any
    timeout_s: float
    error_code: Callable[[Any], int] = lambda r: r.error_code


class AwaitBatches(NamedTuple):
    """Wait until every batch incomplete now has its outcome; errors.KafkaTimeoutError
    (`what` timed out) at `deadline` (seconds of the producer's clock,
    `MonotonicClock.now_s()`; None: no limit)."""

    deadline: float | None
    what: str


class AwaitAddPartitions(NamedTuple):
    """Wait until no AddPartitionsToTxn is in flight; errors.KafkaTimeoutError at `deadline`."""

    deadline: float


# ------------------------------------------------------------ init_transactions of earlier releases

# init_transactions() as earlier releases declared it: the group-aware form's arguments first.
_EARLIER_INIT = inspect.Signature([
    inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
    for name, default in (("partitions", None), ("group", None), ("generation", None), ("timeout", None),
                          ("keep_prepared_txn", False))])
_GROUP_ARGS = frozenset({"partitions", "group", "generation"})


def _is_timeout(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def group_aware_call(args: tuple, kwargs: Mapping[str, Any], stacklevel: int = 1) -> dict[str, Any] | None:
    """Read the arguments of an init_transactions() call. Returns None for the current
    form, `init_transactions(timeout=None, *, keep_prepared_txn=False)`. For the form of
    earlier releases — `init_transactions(partitions, group, generation, timeout,
    keep_prepared_txn)`, a number first being the timeout — returns the keyword
    arguments of the call that replaces it: `{"timeout", "keep_prepared_txn"}` when no
    group-aware argument was given, else `{"partitions", "group", "generation",
    "timeout"}` for `init_transactions_for_group`, after a DeprecationWarning naming that
    method, attributed to the frame `stacklevel` levels above this function's caller.
    Raises TypeError for arguments neither form takes; ValueError for keep_prepared_txn
    with a group-aware argument."""
    if len(args) <= 1 and (not args or _is_timeout(args[0])) and not _GROUP_ARGS & kwargs.keys():
        return None
    bound = _EARLIER_INIT.bind(*args, **kwargs)
    bound.apply_defaults()
    call = dict(bound.arguments)
    if call["partitions"] is not None and _is_timeout(call["partitions"]):
        call["timeout"] = float(call["partitions"])
        call["partitions"] = None
    if call["partitions"] is None and call["group"] is None and call["generation"] is None:
        return {"timeout": call["timeout"], "keep_prepared_txn": call["keep_prepared_txn"]}
    warnings.warn("init_transactions(partitions, group, generation) is deprecated: call "
                  "init_transactions_for_group(partitions, group, generation, timeout) for the group-aware "
                  "form (KIP-447 draft); init_transactions(timeout) is the classic form",
                  DeprecationWarning, stacklevel=stacklevel + 2)
    if call.pop("keep_prepared_txn"):
        raise ValueError("keep_prepared_txn is for init_transactions(), not the group-aware form")
    return call


def takes_earlier_init_args(init: F) -> F:
    """Decorate a producer's init_transactions(timeout=None, *, keep_prepared_txn=False)
    (sync or async) so that a call in the form of earlier releases still works: it runs
    as `group_aware_call` says, the group-aware one as the producer's
    init_transactions_for_group(). The decorated method keeps its own signature
    (`inspect.signature` follows `__wrapped__`)."""
    if inspect.iscoroutinefunction(init):
        @functools.wraps(init)
        async def init_async(self: Any, *args: Any, **kwargs: Any) -> None:
            call = group_aware_call(args, kwargs)
            if call is None:
                return await init(self, *args, **kwargs)
            if "group" in call:
                return await self.init_transactions_for_group(**call)
            return await init(self, **call)
        return cast(F, init_async)

    @functools.wraps(init)
    def init_sync(self: Any, *args: Any, **kwargs: Any) -> None:
        call = group_aware_call(args, kwargs)
        if call is None:
            return init(self, *args, **kwargs)
        if "group" in call:
            return self.init_transactions_for_group(**call)
        return init(self, **call)
    return cast(F, init_sync)


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
        """`timeout` in seconds, max.block.ms when None."""
        return self.max_block_ms / 1000.0 if timeout is None else timeout

    def flush(self, timeout: float | None) -> Generator:
        """Send every queued record now and wait for their outcomes (`timeout` s, None: no limit)."""
        self.acc.begin_flush()
        try:
            self.sender.wakeup()
            deadline = None if timeout is None else self.clock.now_s() + timeout
            yield AwaitBatches(deadline, f"flush timed out after {timeout} s")
        finally:
            self.acc.end_flush()

    def _txn_call(self, method: str, request: Any, timeout_s: float) -> CoordinatorRequest:
        key, key_type = txn_coordinator_key(self.transactional_id, self.txn.group_id)
        return CoordinatorRequest(key, key_type, "txn", method, request, timeout_s)

    def _group_fields(self) -> dict[str, Any]:
        """consumer_group_id / generation_id of a group-aware producer's transactional
        requests (KIP-447 draft); empty for the others."""
        txn = self.txn
        return {"consumer_group_id": txn.group_id, "generation_id": txn.generation_id} if txn.group_id else {}

    def _init_producer_id(self, timeout_s: float, bump: bool = False,
                          assigned: Iterable[TopicPartition] = (), keep_prepared_txn: bool = False) -> Generator:
        """InitProducerId to the transaction coordinator (step 2 of the data flow);
        `bump` passes the current PID/epoch so the coordinator bumps the epoch (KIP-360);
        a group-aware producer sends its group, generation and `assigned` partitions."""
        txn = self.txn
        req = pb.InitProducerIdRequest(
            transactional_id=self.transactional_id or "",
            transaction_timeout_ms=self.txn_timeout_ms,
            producer_id=txn.producer_id if bump else NO_PRODUCER_ID,
            producer_epoch=txn.producer_epoch if bump else NO_PRODUCER_EPOCH,
            keep_prepared_txn=keep_prepared_txn, **self._group_fields())
        if txn.group_id:
            by_topic: dict[str, list[int]] = collections.defaultdict(list)
            for tp in assigned if not bump else self.assigned:
                by_topic[tp.topic].append(tp.partition)
            req.assigned_partitions.extend(pb.TopicPartitions(topic=t, partitions=sorted(ps))
                                           for t, ps in sorted(by_topic.items()))
        try:
            resp = yield self._txn_call("InitProducerId", req, timeout_s)
        except errors.ExactlyError as exc:
            err = txn.initialize_failed(exc)
            if is_retriable(err):
                raise errors.KafkaTimeoutError(f"InitProducerId did not succeed within {timeout_s} s: {err}") from err
            raise err from None
        if keep_prepared_txn and resp.HasField("ongoing_txn_producer_id"):
            # KIP-939: this producer talks with the new epoch, which fences the previous
            # instance; the kept transaction is known by its own pair.
            txn.restore_prepared(resp.producer_id, resp.producer_epoch, resp.ongoing_txn_producer_id,
                                 resp.ongoing_txn_producer_epoch)
            log.info("producer %s: PID %d epoch %d, kept the prepared transaction of PID %d epoch %d",
                     self.transactional_id, resp.producer_id, resp.producer_epoch, resp.ongoing_txn_producer_id,
                     resp.ongoing_txn_producer_epoch)
            return
        txn.set_producer_id_and_epoch(resp.producer_id, resp.producer_epoch)
        log.info("producer %s: PID %d epoch %d", self.transactional_id, resp.producer_id, resp.producer_epoch)

    def _check_transactional(self, call: str) -> None:
        if self.transactional_id is None:
            raise errors.IllegalStateError(f"{call} needs transactional.id")

    def init(self, timeout: float | None, keep_prepared_txn: bool = False) -> Generator:
        """The classic init_transactions(): PID and a new epoch for the transactional.id."""
        self._check_transactional("init_transactions()")
        self.txn.begin_initialize()
        yield from self._init_producer_id(self.timeout_s(timeout), keep_prepared_txn=keep_prepared_txn)

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
                yield self._txn_call("AddOffsetsToTxn", pb.AddOffsetsToTxnRequest(
                    transactional_id=self.transactional_id, producer_id=txn.producer_id,
                    producer_epoch=txn.producer_epoch, group_id=gm.group_id, **self._group_fields()), timeout_s)
                txn.offsets_added(gm.group_id)
            by_topic: dict[str, list[pb.OffsetCommitPartition]] = collections.defaultdict(list)
            for tp, om in sorted(offsets.items()):
                if isinstance(om, int):
                    om = OffsetAndMetadata(om)
                by_topic[tp.topic].append(pb.OffsetCommitPartition(
                    partition=tp.partition, committed_offset=om.offset, committed_leader_epoch=-1,
                    metadata=om.metadata or ""))
            req = pb.TxnOffsetCommitRequest(
                transactional_id=self.transactional_id, group_id=gm.group_id,
                producer_id=txn.producer_id, producer_epoch=txn.producer_epoch,
                generation_id=gm.generation_id, member_id=gm.member_id or "",
                group_instance_id=gm.group_instance_id or "", group_aware_producer=txn.group_id == gm.group_id,
                topics=[pb.OffsetCommitTopic(name=t, partitions=ps) for t, ps in by_topic.items()])
            yield CoordinatorRequest(
                gm.group_id, COORDINATOR_GROUP, "group", "TxnOffsetCommit", req,
                self._left_s(deadline),
                error_code=lambda r: next((p.error_code for t in r.topics for p in t.partitions
                                           if p.error_code), 0))
        except errors.ExactlyError as exc:
            if is_retriable(exc) and exc.code not in FENCING_CODES:
                raise errors.KafkaTimeoutError(
                    f"send_offsets_to_transaction did not succeed within {timeout_s} s: {exc}") from exc
            raise txn.record_error(exc) from None

    def commit(self, timeout: float | None) -> Generator:
        """Flush, then EndTxn(COMMIT)."""
        _, deadline = yield from self._begin_ending(self.txn.begin_commit, timeout)
        yield from self._finish_transaction(True, deadline)

    def _begin_ending(self, begin: Callable[[], None], timeout: float | None) -> Generator:
        """Enter the commit or prepare state (`begin`), then send every record of the
        transaction; returns (timeout in seconds, deadline on the producer's clock)."""
        timeout_s = self.timeout_s(timeout)
        deadline = self.clock.now_s() + timeout_s
        begin()
        yield from self._flush_transaction(timeout_s, deadline)
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

    def _flush_transaction(self, timeout_s: float, deadline: float) -> Generator:
        """Send every record of the transaction and its pending AddPartitionsToTxn;
        raise the transaction's stored error, if any."""
        txn = self.txn
        try:
            yield from self.flush(timeout_s)
        except errors.KafkaTimeoutError as exc:
            # Records of the transaction are still unacknowledged: it can only be aborted.
            txn.record_error(exc)
            raise
        yield AwaitAddPartitions(deadline)
        txn.raise_if_failed()

    def prepare(self, timeout: float | None) -> Generator:
        """Flush, then PrepareTxn (KIP-939); returns the PreparedTxnState."""
        txn = self.txn
        timeout_s, deadline = yield from self._begin_ending(txn.begin_prepare, timeout)
        req = pb.PrepareTxnRequest(transactional_id=self.transactional_id, producer_id=txn.producer_id,
                                   producer_epoch=txn.producer_epoch, **self._group_fields())
        try:
            yield self._txn_call("PrepareTxn", req, self._left_s(deadline))
        except errors.ExactlyError as exc:
            if is_retriable(exc):
                raise errors.KafkaTimeoutError(f"PrepareTxn did not succeed within {timeout_s:.1f} s: {exc}") from exc
            raise txn.record_error(exc) from None
        txn.transaction_sealed()
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
        req = pb.EndTxnRequest(transactional_id=self.transactional_id, producer_id=txn.producer_id,
                               producer_epoch=txn.producer_epoch, committed=commit, **self._group_fields())
        try:
            return (yield self._txn_call("EndTxn", req, timeout_s))
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


__all__ = ["CoordinatorRequest", "AwaitBatches", "AwaitAddPartitions", "TransactionFlows", "group_aware_call",
           "takes_earlier_init_args"]
