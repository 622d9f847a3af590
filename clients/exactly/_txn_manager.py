"""Producer-side transaction state: PID/epoch, per-partition sequences, the
partitions and groups of the current transaction, and the state machine.

Pure logic, no I/O: the Producer and its sender thread perform the RPCs and
report outcomes here. Valid transitions are one table checked in one place; error
states keep their cause in `last_error` (docs/design.md, "Code conventions" and
"The client's transaction manager").
Fatal vs abortable errors follow the KIP-98 design document, "Transactional
Producer" / "Error Handling". Methods are atomic (an internal lock), because the
user's threads and the sender thread both report here.

Two-phase commit (in the spirit of KIP-939): `begin_prepare` moves an open transaction
to PREPARED_TRANSACTION while the producer flushes and seals it with PrepareTxn; from
there it is committed or aborted by this producer or by another process
(`exactly.complete_transaction`).
"""
from __future__ import annotations

import enum
import threading
from typing import Iterable

from . import errors
from exactly_wire.error_codes import FATAL, ErrorCode
from .types import TopicPartition

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
_INT32_MAX = 0x7FFFFFFF


class TransactionManagerState(enum.Enum):
    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    COMMITTING_TRANSACTION = "COMMITTING_TRANSACTION"
    PREPARED_TRANSACTION = "PREPARED_TRANSACTION"
    ABORTING_TRANSACTION = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"


S = TransactionManagerState

# For each state, the states it may be entered from (Kafka's TransactionManager.State).
VALID_PREVIOUS: dict[TransactionManagerState, frozenset[TransactionManagerState]] = {
    # READY: an idempotent producer drops its PID to get a new one;
    # INITIALIZING: InitProducerId failed or timed out and may be tried again.
    S.UNINITIALIZED: frozenset({S.READY, S.INITIALIZING}),
    # ABORTING_TRANSACTION: the epoch is bumped after an abort that left sequences unknown.
    # READY, IN_TRANSACTION, ABORTABLE_ERROR, FATAL_ERROR: a group-aware producer
    # initialises again after every rebalance and after being fenced (KIP-447 draft).
    S.INITIALIZING: frozenset({S.UNINITIALIZED, S.COMMITTING_TRANSACTION, S.ABORTING_TRANSACTION, S.READY,
                               S.IN_TRANSACTION, S.ABORTABLE_ERROR, S.FATAL_ERROR}),
    S.READY: frozenset({S.INITIALIZING, S.COMMITTING_TRANSACTION, S.ABORTING_TRANSACTION}),
    S.IN_TRANSACTION: frozenset({S.READY}),
    S.PREPARED_TRANSACTION: frozenset({S.IN_TRANSACTION}),
    S.COMMITTING_TRANSACTION: frozenset({S.IN_TRANSACTION, S.PREPARED_TRANSACTION}),
    S.ABORTING_TRANSACTION: frozenset({S.IN_TRANSACTION, S.ABORTABLE_ERROR, S.PREPARED_TRANSACTION}),
    S.ABORTABLE_ERROR: frozenset({S.IN_TRANSACTION, S.COMMITTING_TRANSACTION, S.ABORTABLE_ERROR,
                                  S.ABORTING_TRANSACTION, S.INITIALIZING, S.PREPARED_TRANSACTION}),
    S.FATAL_ERROR: frozenset(TransactionManagerState),
}

ERROR_STATES = frozenset({S.ABORTABLE_ERROR, S.FATAL_ERROR})

FENCING_CODES = frozenset({ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH})

# From this epoch on the coordinator starts no transaction (each transaction ends
# under the next epoch, and the int16 epoch must not overflow): Kafka's MAX - 1.
EXHAUSTED_PRODUCER_EPOCH = 32766


class InvalidTransitionError(errors.IllegalStateError):
    """A transition not allowed by VALID_PREVIOUS (a bug or a misuse of the API)."""


def fenced(cause: BaseException | str | None = None) -> errors.ExactlyError:
    """A ProducerFencedError for either fencing code (INVALID_PRODUCER_EPOCH from a
    partition leader, PRODUCER_FENCED from a coordinator): users catch one class."""
    msg = "producer fenced: another instance with the same transactional.id has a newer epoch"
    if cause is not None:
        msg = f"{msg} ({cause})"
    return errors.ProducerFencedError(msg)


def fenced_error(exc: BaseException | None) -> bool:
    """Whether `exc` is a fencing error (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH)."""
    return isinstance(exc, errors.ExactlyError) and exc.code in FENCING_CODES


def is_fatal(exc: BaseException) -> bool:
    return isinstance(exc, errors.ExactlyError) and exc.code in FATAL


def normalize(exc: BaseException) -> BaseException:
    """Map both fencing codes to ProducerFencedError; other errors unchanged."""
    if isinstance(exc, errors.ExactlyError) and exc.code in FENCING_CODES \
            and not getattr(exc, "_normalized", False):
        out = fenced(f"{exc.code.name}: {exc.message}" if exc.message != exc.code.name else exc.code.name)
        out._normalized = True
        out.__cause__ = exc
        return out
    return exc


def copy_error(exc: BaseException) -> BaseException:
    """A fresh instance of a stored error to raise again (keeps class and message)."""
    if isinstance(exc, errors.ExactlyError):
        new = type(exc)(exc.message)
        if getattr(exc, "_normalized", False):
            new._normalized = True
    else:
        try:
            new = type(exc)(*exc.args)
        except Exception:  # noqa: BLE001 - odd constructor: fall back to the generic error
            new = errors.ExactlyError(str(exc))
    new.__cause__ = exc
    return new


def next_sequence(seq: int, count: int) -> int:
    """Sequences are int32 and wrap to 0 after 2**31-1, as in Kafka."""
    return (seq + count) & _INT32_MAX


class TransactionManager:
    """State of one producer's PID, sequences and transaction.

    `transactional_id` None means a non-transactional producer; `idempotent`
    False means no PID at all (then the manager stays READY and only checks
    nothing). Thread-safe.
    """

    def __init__(self, transactional_id: str | None = None, idempotent: bool = True,
                 transaction_timeout_ms: int = 60000):
        if transactional_id is not None and not idempotent:
            raise ValueError("a transactional producer must be idempotent")
        self.transactional_id = transactional_id
        self.idempotent = idempotent
        self.transaction_timeout_ms = transaction_timeout_ms
        self._lock = threading.RLock()
        self.state = S.UNINITIALIZED if idempotent else S.READY
        self.last_error: BaseException | None = None
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self._next_seq: dict[TopicPartition, int] = {}
        self._last_acked: dict[TopicPartition, int] = {}
        # Transaction membership: partitions known to the coordinator, partitions
        # waiting for AddPartitionsToTxn, and those in an AddPartitionsToTxn in flight.
        self._added: set[TopicPartition] = set()
        self._pending: set[TopicPartition] = set()
        self._adding: set[TopicPartition] = set()
        # Partitions whose AddPartitionsToTxn may have been applied although no answer
        # said so (a timeout, a lost connection): the coordinator may hold a transaction.
        self._maybe_added: set[TopicPartition] = set()
        self._groups: set[str] = set()
        # Some batch with an assigned sequence ended without a known outcome, so the
        # leader's next expected sequence is unknown: a new epoch (or PID) is needed.
        self.sequences_unresolved = False
        # PrepareTxn succeeded for the current transaction: EndTxn is due even when
        # nothing was added (the coordinator then holds an empty sealed transaction).
        self.sealed = False
        # (PID, epoch) of the sealed transaction, which its PreparedTxnState names: the
        # pair it was prepared under, or, for a transaction kept by
        # init_transactions(keep_prepared_txn=True), its own pair while this producer
        # talks with the newer client-facing one (KIP-939); None when none is sealed.
        self.prepared_producer: tuple[int, int] | None = None
        # KIP-447 draft: the consumer group and generation of a group-aware producer
        # (None / -1 otherwise), set by begin_group_initialize.
        self.group_id: str | None = None
        self.generation_id = -1
        # The cluster's transaction version (Metadata; set by the producer) and whether
        # the current transaction lets partition leaders add its partitions (KIP-890
        # part 2: no AddPartitionsToTxn; fixed at begin_transaction). A group-aware
        # producer adds its partitions itself (the leader knows no generation).
        self.transaction_version = 0
        self.implicit_add = False

    # ------------------------------------------------------------ state machine

    @property
    def is_transactional(self) -> bool:
        return self.transactional_id is not None

    def transition_to(self, target: TransactionManagerState, error: BaseException | None = None) -> None:
        """Move to `target`, checked against VALID_PREVIOUS. Error states require
        `error` (kept as last_error); other states must not get one. Raises
        InvalidTransitionError (an errors.IllegalStateError)."""
        with self._lock:
            if target in ERROR_STATES:
                if error is None:
                    raise ValueError(f"transition to {target.name} needs the error that caused it")
            elif error is not None:
                raise ValueError(f"{target.name} is not an error state")
            if self.state not in VALID_PREVIOUS[target]:
                raise InvalidTransitionError(
                    f"invalid transaction state transition {self.state.name} -> {target.name}")
            if target is S.ABORTABLE_ERROR and self.state is S.ABORTABLE_ERROR:
                return  # keep the first cause
            self.state = target
            if error is not None:
                self.last_error = error
            elif target is S.READY:
                self.last_error = None

    def raise_if_failed(self) -> None:
        """Raise (a copy of) last_error when in ABORTABLE_ERROR or FATAL_ERROR."""
        with self._lock:
            if self.state in ERROR_STATES and self.last_error is not None:
                raise copy_error(self.last_error)

    def raise_if_fatal(self) -> None:
        with self._lock:
            if self.state is S.FATAL_ERROR and self.last_error is not None:
                raise copy_error(self.last_error)

    def _require_transactional(self, what: str) -> None:
        if not self.is_transactional:
            raise errors.IllegalStateError(f"{what} needs a transactional producer (set transactional.id)")

    def record_error(self, exc: BaseException) -> BaseException:
        """Record a failure reported by a request: fatal codes move to FATAL_ERROR;
        other non-retriable errors abort the current transaction (ABORTABLE_ERROR)
        when there is one. Returns the normalized error (fencing -> ProducerFencedError)."""
        exc = normalize(exc)
        with self._lock:
            if self.state is S.FATAL_ERROR:
                return exc
            if is_fatal(exc):
                self.transition_to(S.FATAL_ERROR, exc)
            elif self.is_transactional and self.state in (
                    S.IN_TRANSACTION, S.COMMITTING_TRANSACTION, S.PREPARED_TRANSACTION, S.ABORTABLE_ERROR):
                self.transition_to(S.ABORTABLE_ERROR, exc)
            return exc

    @property
    def has_error(self) -> bool:
        return self.state in ERROR_STATES

    @property
    def is_fatal_state(self) -> bool:
        return self.state is S.FATAL_ERROR

    # ------------------------------------------------------------ PID / epoch

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID

    def begin_initialize(self) -> None:
        """init_transactions() (or the first send of an idempotent producer)."""
        with self._lock:
            self.raise_if_fatal()
            if self.is_transactional and self.state is not S.UNINITIALIZED \
                    and self.state is not S.ABORTING_TRANSACTION:
                raise errors.IllegalStateError(
                    f"init_transactions() may be called once, not in state {self.state.name}")
            self.transition_to(S.INITIALIZING)

    def begin_group_initialize(self, group_id: str, generation_id: int) -> None:
        """Group-aware init_transactions_for_group (KIP-447 draft): allowed before the first
        init, between transactions, inside a transaction (which is dropped: the
        coordinator aborts it) and after being fenced (ProducerFencedError) — "it is
        safe to call after receiving a ProducerFencedException". Any other fatal error
        is raised; so is a committing or aborting transaction (finish it first)."""
        with self._lock:
            self._require_transactional("init_transactions()")
            if self.state is S.FATAL_ERROR and not fenced_error(self.last_error):
                self.raise_if_fatal()
            if self.state in (S.COMMITTING_TRANSACTION, S.ABORTING_TRANSACTION, S.PREPARED_TRANSACTION):
                raise errors.IllegalStateError(
                    f"init_transactions() while the transaction is {self.state.name}; complete it first")
            if self.group_id is not None and self.group_id != group_id:
                raise errors.IllegalStateError(
                    f"the producer belongs to group {self.group_id!r}, not {group_id!r}")
            self.transition_to(S.INITIALIZING)
            self.last_error = None
            self._clear_transaction()
            self.group_id = group_id
            self.generation_id = generation_id

    def initialize_failed(self, exc: BaseException) -> BaseException:
        """InitProducerId did not succeed: fatal errors stay, others allow a retry."""
        with self._lock:
            exc = normalize(exc)
            if is_fatal(exc):
                self.transition_to(S.FATAL_ERROR, exc)
            elif self.state is S.INITIALIZING:
                self.transition_to(S.UNINITIALIZED)
            return exc

    def set_producer_id_and_epoch(self, producer_id: int, producer_epoch: int) -> None:
        """InitProducerId succeeded: a new PID or epoch restarts every sequence at 0."""
        with self._lock:
            self.producer_id = producer_id
            self.producer_epoch = producer_epoch
            self._next_seq.clear()
            self._last_acked.clear()
            self.sequences_unresolved = False
            self.transition_to(S.READY)

    def reset_producer_id(self) -> None:
        """Idempotent (non-transactional) producer: forget the PID so the sender gets
        a new one (after UNKNOWN_PRODUCER_ID or unresolved sequences)."""
        with self._lock:
            if self.is_transactional:
                raise errors.IllegalStateError("a transactional producer bumps its epoch instead")
            if self.state is S.READY:
                self.transition_to(S.UNINITIALIZED)
            self.producer_id = NO_PRODUCER_ID
            self.producer_epoch = NO_PRODUCER_EPOCH

    # ------------------------------------------------------------ sequences

    def sequence_for(self, tp: TopicPartition, record_count: int) -> int:
        """Assign the base sequence of a batch of `record_count` records to `tp` and
        advance the partition's next sequence (done when the batch is drained)."""
        with self._lock:
            seq = self._next_seq.get(tp, 0)
            self._next_seq[tp] = next_sequence(seq, record_count)
            return seq

    def next_sequence_of(self, tp: TopicPartition) -> int:
        with self._lock:
            return self._next_seq.get(tp, 0)

    def ack(self, tp: TopicPartition, last_sequence: int) -> None:
        """A batch ending at `last_sequence` was acknowledged (or was a duplicate)."""
        with self._lock:
            prev = self._last_acked.get(tp, -1)
            if prev < 0 or next_sequence(last_sequence, -prev) < (1 << 30):
                self._last_acked[tp] = last_sequence

    def acknowledged_through(self, tp: TopicPartition, producer_id: int, producer_epoch: int,
                             last_sequence: int) -> bool:
        """Whether a batch of `tp` sealed under (`producer_id`, `producer_epoch`) and
        ending at `last_sequence` is known to be in the log: that PID and epoch are the
        current ones and a batch ending at or after `last_sequence` was acknowledged. A
        partition leader appends a PID's batches of one epoch only in sequence (KIP-98
        design document, "Idempotent Producer Guarantees"), so a later batch's
        acknowledgement means every earlier one was appended before it."""
        with self._lock:
            if (producer_id, producer_epoch) != (self.producer_id, self.producer_epoch):
                return False
            prev = self._last_acked.get(tp, -1)
            return prev >= 0 and next_sequence(prev, -last_sequence) < (1 << 30)

    def last_acked_sequence(self, tp: TopicPartition) -> int:
        """Last acknowledged sequence of `tp` under the current PID/epoch, -1 if none."""
        with self._lock:
            return self._last_acked.get(tp, -1)

    def is_next_expected(self, tp: TopicPartition, base_sequence: int) -> bool:
        """True when every batch before `base_sequence` was acknowledged: an
        OUT_OF_ORDER_SEQUENCE_NUMBER for such a batch is real, not a reordering."""
        with self._lock:
            return next_sequence(self._last_acked.get(tp, -1), 1) == base_sequence

    # ------------------------------------------------------------ transaction

    def begin_transaction(self) -> None:
        """beginTransaction(): local only; the coordinator learns of the transaction
        with the first AddPartitionsToTxn / AddOffsetsToTxn."""
        with self._lock:
            self._require_transactional("begin_transaction()")
            self.raise_if_failed()
            if self.state is S.IN_TRANSACTION:
                raise errors.IllegalStateError("a transaction is already in progress")
            if self.state is not S.READY:
                raise errors.IllegalStateError(
                    f"begin_transaction() needs init_transactions() first (state {self.state.name})")
            self.transition_to(S.IN_TRANSACTION)
            self._clear_transaction()
            self.implicit_add = self.transaction_version >= 2 and self.group_id is None

    def _clear_transaction(self) -> None:
        self._added.clear()
        self._pending.clear()
        self._adding.clear()
        self._maybe_added.clear()
        self._groups.clear()
        self.sealed = False
        self.prepared_producer = None

    def check_can_send(self) -> None:
        """Raise when a record may not be appended now: IllegalStateError outside a
        transaction (transactional producer) or the stored error in an error state."""
        state = self.state
        if state is S.IN_TRANSACTION or (not self.is_transactional and state is not S.FATAL_ERROR):
            return
        with self._lock:
            self.raise_if_failed()
            if self.is_transactional and self.state is not S.IN_TRANSACTION:
                if self.state in (S.UNINITIALIZED, S.INITIALIZING):
                    raise errors.IllegalStateError("call init_transactions() before sending")
                raise errors.IllegalStateError(
                    f"cannot send outside a transaction (state {self.state.name}); call begin_transaction()")

    def maybe_add_partition(self, tp: TopicPartition) -> None:
        """Note that the transaction writes to `tp` (AddPartitionsToTxn pending; with
        implicit adds the leader adds it: see partition_sent)."""
        if tp in self._added or not self.is_transactional or self.implicit_add:
            return
        with self._lock:
            if tp not in self._added and tp not in self._adding:
                self._pending.add(tp)

    def is_partition_added(self, tp: TopicPartition) -> bool:
        """Whether batches for `tp` may be sent (with implicit adds: always)."""
        return not self.is_transactional or self.implicit_add or tp in self._added

    def partition_sent(self, tp: TopicPartition) -> None:
        """Implicit adds: a batch for `tp` is on its way, so its leader may add `tp` to
        the transaction (an abort must then end it, or bump the epoch)."""
        if self.implicit_add and tp not in self._added:
            with self._lock:
                self._maybe_added.add(tp)

    def not_yet_sent(self, tp: TopicPartition) -> bool:
        """Implicit adds: no batch for `tp` was sent in this transaction yet."""
        return tp not in self._maybe_added and tp not in self._added

    def partition_written(self, tp: TopicPartition) -> None:
        """Implicit adds: a batch for `tp` was written, so `tp` is in the transaction."""
        if self.implicit_add and tp not in self._added:
            with self._lock:
                self._added.add(tp)

    def has_pending_partitions(self) -> bool:
        return bool(self._pending)

    @property
    def add_in_flight(self) -> bool:
        return bool(self._adding)

    def take_pending_partitions(self) -> list[TopicPartition]:
        """Partitions for the next AddPartitionsToTxn (none while one is in flight,
        or outside IN_TRANSACTION / COMMITTING_TRANSACTION)."""
        with self._lock:
            if self._adding or not self._pending or \
                    self.state not in (S.IN_TRANSACTION, S.COMMITTING_TRANSACTION, S.PREPARED_TRANSACTION):
                return []
            tps = sorted(self._pending)
            self._adding.update(tps)
            self._pending.clear()
            return tps

    def partitions_added(self, tps: Iterable[TopicPartition]) -> None:
        with self._lock:
            for tp in tps:
                self._adding.discard(tp)
                self._added.add(tp)

    def partitions_add_retry(self, tps: Iterable[TopicPartition], ambiguous: bool = False) -> None:
        """AddPartitionsToTxn must be sent again for `tps` (retriable error).
        ambiguous: the request may have been applied (no answer came back), so an abort
        must still end the transaction at the coordinator."""
        with self._lock:
            for tp in tps:
                self._adding.discard(tp)
                if ambiguous:
                    self._maybe_added.add(tp)
                if self.state in (S.IN_TRANSACTION, S.COMMITTING_TRANSACTION, S.PREPARED_TRANSACTION):
                    self._pending.add(tp)

    def partitions_add_failed(self, tps: Iterable[TopicPartition], exc: BaseException) -> BaseException:
        with self._lock:
            for tp in tps:
                self._adding.discard(tp)
            return self.record_error(exc)

    def needs_add_offsets(self, group_id: str) -> bool:
        return group_id not in self._groups

    def offsets_added(self, group_id: str) -> None:
        with self._lock:
            self._groups.add(group_id)

    @property
    def transaction_started(self) -> bool:
        """True when the coordinator knows of the transaction (something was added)."""
        return bool(self._added or self._groups or self._adding)

    def check_in_transaction(self, what: str) -> None:
        with self._lock:
            self._require_transactional(what)
            self.raise_if_failed()
            if self.state is not S.IN_TRANSACTION:
                raise errors.IllegalStateError(f"{what} needs an ongoing transaction (state {self.state.name})")

    def begin_prepare(self) -> bool:
        """prepare_transaction(): IN_TRANSACTION -> PREPARED_TRANSACTION (sends are
        refused from now on). Returns False when already prepared or preparing (a
        retry after a timeout). Raises the stored error in an error state,
        errors.IllegalStateError without an open transaction."""
        with self._lock:
            self._require_transactional("prepare_transaction()")
            self.raise_if_failed()
            if self.state is S.PREPARED_TRANSACTION:
                return False
            if self.state is not S.IN_TRANSACTION:
                raise errors.IllegalStateError(f"no transaction to prepare (state {self.state.name})")
            self.transition_to(S.PREPARED_TRANSACTION)
            return True

    def restore_prepared(self, producer_id: int, producer_epoch: int, prepared_producer_id: int,
                         prepared_producer_epoch: int) -> None:
        """init_transactions(keep_prepared_txn=True) found a prepared transaction of
        the transactional.id (KIP-939): talk with the new client-facing
        (producer_id, producer_epoch) InitProducerId answered -- the epoch that fences
        the previous instance -- and hold the transaction, whose own pair is
        (prepared_producer_id, prepared_producer_epoch), as this producer's prepared,
        sealed transaction (READY -> PREPARED_TRANSACTION)."""
        with self._lock:
            self.set_producer_id_and_epoch(producer_id, producer_epoch)
            self._clear_transaction()
            self.transition_to(S.IN_TRANSACTION)
            self.transition_to(S.PREPARED_TRANSACTION)
            self.sealed = True
            self.prepared_producer = (prepared_producer_id, prepared_producer_epoch)

    def transaction_sealed(self) -> None:
        """PrepareTxn succeeded: the coordinator holds the transaction, under the
        current PID and epoch, until EndTxn."""
        with self._lock:
            self.sealed = True
            self.prepared_producer = (self.producer_id, self.producer_epoch)

    @property
    def needs_end_txn(self) -> bool:
        """Whether the coordinator has a transaction to end (something was added, or
        it was sealed by PrepareTxn)."""
        return self.transaction_started or self.sealed or bool(self._maybe_added)

    @property
    def only_maybe_started(self) -> bool:
        """Whether the transaction may exist at the coordinator only through an
        AddPartitionsToTxn whose outcome is unknown (nothing was confirmed added)."""
        return bool(self._maybe_added) and not (self.transaction_started or self.sealed)

    def begin_commit(self) -> bool:
        """commitTransaction(), also of a prepared transaction. Returns False when a
        commit is already in progress (a retry after a timeout). Raises the stored
        error in an error state."""
        with self._lock:
            self._require_transactional("commit_transaction()")
            self.raise_if_failed()
            if self.state is S.COMMITTING_TRANSACTION:
                return False
            if self.state not in (S.IN_TRANSACTION, S.PREPARED_TRANSACTION):
                raise errors.IllegalStateError(f"no transaction to commit (state {self.state.name})")
            self.transition_to(S.COMMITTING_TRANSACTION)
            return True

    def begin_abort(self) -> bool:
        """abortTransaction(): allowed in a transaction (also a prepared one) or after an abortable error.
        Returns False when an abort is already in progress. Raises a fatal error."""
        with self._lock:
            self._require_transactional("abort_transaction()")
            self.raise_if_fatal()
            if self.state is S.ABORTING_TRANSACTION:
                return False
            if self.state is S.COMMITTING_TRANSACTION:
                raise errors.IllegalStateError("the previous commit_transaction() timed out and must be called "
                                               "again: its transaction is being committed")
            if self.state not in (S.IN_TRANSACTION, S.ABORTABLE_ERROR, S.PREPARED_TRANSACTION):
                raise errors.IllegalStateError(f"no transaction to abort (state {self.state.name})")
            self.transition_to(S.ABORTING_TRANSACTION)
            self._pending.clear()
            return True

    def complete_transaction(self, producer_id: int = NO_PRODUCER_ID,
                             producer_epoch: int = NO_PRODUCER_EPOCH) -> None:
        """EndTxn succeeded (or there was nothing to end): back to READY. With the PID
        and epoch EndTxn answered (KIP-890 part 2: every transaction ends under the
        next epoch), the producer continues with them and every sequence restarts at 0;
        the same PID and epoch keep the sequences (nothing new was issued)."""
        with self._lock:
            if producer_epoch >= 0 and producer_id >= 0 and \
                    (producer_id, producer_epoch) != (self.producer_id, self.producer_epoch):
                self.producer_id = producer_id
                self.producer_epoch = producer_epoch
                self._next_seq.clear()
                self._last_acked.clear()
                self.sequences_unresolved = False
            self.transition_to(S.READY)
            self._clear_transaction()

    @property
    def epoch_exhausted(self) -> bool:
        """Whether the epoch is too high to run another transaction (each one ends
        under the next epoch): InitProducerId must rotate the PID first."""
        return self.producer_epoch >= EXHAUSTED_PRODUCER_EPOCH


__all__ = ["TransactionManagerState", "VALID_PREVIOUS", "ERROR_STATES", "FENCING_CODES",
           "TransactionManager", "InvalidTransitionError", "fenced", "is_fatal", "normalize",
           "copy_error", "next_sequence", "NO_PRODUCER_ID", "NO_PRODUCER_EPOCH"]
