"""Transaction states and the per-transactional.id metadata of the coordinator.

Follows Kafka's `TransactionState.java` / `TransactionMetadata.java` and the design
doc sections "Transaction Coordinator" and "Transaction Log": the transition table
(`TRANSITION_TABLE`) lists, per target state, its valid previous states (Kafka's
`validPreviousStates`, as `VALID_PREVIOUS`) and one guarded row, the handover
(`Guard.MARKERS_WRITTEN`), whose guard is a fact the metadata holds itself (recorded
by `record_markers_written`, the one call of the id's completion into the machine,
forgotten by the next transition); every transition passes the one check
(`check_transition`) and the state changes only in the table's apply function
(`_apply`);
a change is made in three steps — `prepare_*()` returns an immutable
`TxnTransitMetadata` and marks the metadata as pending, the coordinator appends the
transit to the transaction log, then `complete_transition(transit)` re-checks the
invariants and applies it (or `cancel_transition()` when the append failed).

While a transition is pending, requests for the transactional.id are answered with
CONCURRENT_TRANSACTIONS by the coordinator; calling `prepare_*()` then is a bug and
raises `PendingTransitionError`.

Timestamps are milliseconds since the epoch; the caller passes them (injected clock).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable

from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# Producer epochs are int16 in record batches.
MAX_PRODUCER_EPOCH = 32767


class TxnState(enum.IntEnum):
    """Transaction states with Kafka's numeric ids (stored in the transaction log)."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """Kafka's name of the state ("Empty", "PrepareCommit", ...), as answered by
        ListTransactions / DescribeTransactions."""
        return _KAFKA_NAMES[self]

    @classmethod
    def from_name(cls, name: str) -> "TxnState":
        """Parse "PrepareCommit", "PREPARE_COMMIT" or "prepare_commit". Raises
        ValueError for an unknown name."""
        for state in cls:
            if name in (state.kafka_name, state.name) or name.upper() == state.name:
                return state
        raise ValueError(f"unknown transaction state {name!r}")


_KAFKA_NAMES = {
    TxnState.EMPTY: "Empty",
    TxnState.ONGOING: "Ongoing",
    TxnState.PREPARE_COMMIT: "PrepareCommit",
    TxnState.PREPARE_ABORT: "PrepareAbort",
    TxnState.COMPLETE_COMMIT: "CompleteCommit",
    TxnState.COMPLETE_ABORT: "CompleteAbort",
    TxnState.DEAD: "Dead",
    TxnState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}

class Guard(enum.Enum):
    """A condition a row of the transition table needs besides the current state: a
    fact `TransactionMetadata` records and checks itself before it takes the row
    (`check_transition` names the row, `TransactionMetadata.holds` the fact)."""

    # The handover: every marker of the PrepareCommit / PrepareAbort transaction is
    # written (recorded by TransactionMetadata.record_markers_written; no record of the
    # log says so) and the first add of the producer's next transaction takes over.
    MARKERS_WRITTEN = "every marker of the prepared transaction is written"


@dataclass(frozen=True)
class TransitionRow:
    """A row of the transition table: `target` may follow any state of `previous`,
    when `guard` (None: none) holds."""

    previous: frozenset[TxnState]
    target: TxnState
    guard: Guard | None = None


S = TxnState
# Kafka's TransactionState.validPreviousStates, plus the handover (guarded).
TRANSITION_TABLE: tuple[TransitionRow, ...] = (
    TransitionRow(frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}), S.EMPTY),
    TransitionRow(frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}), S.ONGOING),
    TransitionRow(frozenset({S.ONGOING}), S.PREPARE_COMMIT),
    TransitionRow(frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}), S.PREPARE_ABORT),
    TransitionRow(frozenset({S.PREPARE_COMMIT}), S.COMPLETE_COMMIT),
    TransitionRow(frozenset({S.PREPARE_ABORT}), S.COMPLETE_ABORT),
    TransitionRow(frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}), S.DEAD),
    TransitionRow(frozenset({S.ONGOING}), S.PREPARE_EPOCH_FENCE),
    # The handover (TransactionMetadata.prepare_next_transaction): one Ongoing record
    # completes the prepared transaction and starts the next.
    TransitionRow(frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT}), S.ONGOING, Guard.MARKERS_WRITTEN),
)
del S

# The unguarded rows by target (Kafka's validPreviousStates).
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    target: frozenset().union(*(r.previous for r in TRANSITION_TABLE if r.target is target and r.guard is None))
    for target in TxnState
}

# States in which no transaction is in progress.
COMPLETED_STATES = frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})


class TxnStateError(Exception):
    """A broken invariant of the transaction state machine (a bug or a corrupt log),
    never an expected protocol outcome."""


class InvalidTransitionError(TxnStateError):
    """A transition whose target does not list the current state as valid previous."""

    def __init__(self, transactional_id: str, current: TxnState, target: TxnState):
        super().__init__(f"transactional.id {transactional_id!r}: invalid transition "
                         f"{current.kafka_name} -> {target.kafka_name}")
        self.current = current
        self.target = target


class PendingTransitionError(TxnStateError):
    """prepare_*() called while another transition is pending (the coordinator
    answers CONCURRENT_TRANSACTIONS before getting here)."""

    code = ErrorCode.CONCURRENT_TRANSACTIONS


class GuardNotHeldError(InvalidTransitionError):
    """A transition along a guarded row whose guard the metadata has not recorded
    (e.g. the handover before every marker is recorded as written)."""

    def __init__(self, transactional_id: str, current: TxnState, target: TxnState, guard: "Guard"):
        TxnStateError.__init__(self, f"transactional.id {transactional_id!r}: {current.kafka_name} -> "
                                     f"{target.kafka_name} needs that {guard.value}, which is not recorded")
        self.current = current
        self.target = target
        self.guard = guard


class TransitionMismatchError(TxnStateError):
    """complete_transition() with a transit that does not match the metadata."""


def check_transition(transactional_id: str, current: TxnState, target: TxnState,
                     guard: Guard | None = None) -> TransitionRow:
    """The one check of the transition table (`TRANSITION_TABLE`): returns the row
    that takes `current` to `target` under `guard` (None: an unguarded row; a guard:
    only the row with that guard), else raises InvalidTransitionError."""
    for row in TRANSITION_TABLE:
        if row.target is target and row.guard is guard and current in row.previous:
            return row
    raise InvalidTransitionError(transactional_id, current, target)


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka keeps one epoch in reserve for the fencing bump of a timed-out or
    re-initialised transaction: at MAX-1 the next InitProducerId rotates the PID."""
    return epoch >= MAX_PRODUCER_EPOCH - 1


@dataclass(frozen=True)
class GroupAssignment:
    """KIP-447 draft: the consumer group, generation and assigned input partitions
    passed to a group-aware InitProducerId."""

    group_id: str
    generation_id: int
    partitions: frozenset[TopicPartition] = frozenset()


@dataclass(frozen=True)
class TxnTransitMetadata:
    """Immutable target of a transition: the values appended to the transaction log
    (design doc "Transaction Log") and applied by `complete_transition`."""

    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    txn_timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    txn_start_timestamp: int
    txn_last_update_timestamp: int
    # Two-phase commit (KIP-939 style): when PrepareTxn sealed the Ongoing
    # transaction, ms; -1 when not prepared.
    prepared_timestamp: int = -1
    # How the client ends transactions (KIP-890 part 2): 2, every EndTxn bumps the
    # epoch and the markers carry the next one; 1 (Kafka clients with EndTxn below
    # v5), the epoch stays and the markers carry the transaction's own.
    transaction_version: int = 2
    # KIP-939's OngoingTxnProducerId / OngoingTxnProducerEpoch: the (PID, epoch) of a
    # prepared transaction kept by InitProducerId(keepPreparedTxn=true), whose data
    # carries them, while producer_id / producer_epoch are the client-facing pair the
    # new instance talks with; -1 / -1 when no transaction is kept (the transaction's
    # pair is then the client-facing one).
    ongoing_txn_producer_id: int = NO_PRODUCER_ID
    ongoing_txn_producer_epoch: int = NO_PRODUCER_EPOCH

    def marker_producer(self) -> tuple[int, int]:
        """(PID, epoch) the markers of this PrepareCommit / PrepareAbort transit
        carry: its own pair (the epoch after the end-of-transaction bump), or, for a
        kept prepared transaction whose client-facing PID was rotated, the
        transaction's PID with the epoch after its data's, so that the markers end
        the transaction and fence its late batches on every partition (KIP-890 part 2)."""
        pid = self.ongoing_txn_producer_id
        if pid < 0 or pid == self.producer_id:
            return self.producer_id, self.producer_epoch
        return pid, min(self.ongoing_txn_producer_epoch + 1, MAX_PRODUCER_EPOCH)


NO_PARTITIONS: frozenset[TopicPartition] = frozenset()


def _partition_set(partitions: Iterable[TopicPartition]) -> frozenset[TopicPartition]:
    """`partitions` as a frozenset, the shared NO_PARTITIONS when empty: most
    transactional ids have no transaction ongoing, and an empty set of each would cost
    216 bytes per id."""
    fs = partitions if isinstance(partitions, frozenset) else frozenset(partitions)
    return fs or NO_PARTITIONS


class TransactionMetadata:
    """In-memory state of one transactional.id (Kafka's TransactionMetadata).

    Fields: producer_id / producer_epoch (current PID and epoch), last_producer_id /
    last_producer_epoch (previous ones, kept to recognise retries of an epoch bump or
    PID rotation), txn_timeout_ms, state, partitions (frozenset of (topic, partition) in the
    transaction), txn_start_timestamp (ms, -1 when none), txn_last_update_timestamp
    (ms), pending_state (target of the transition in flight, or None), group (the KIP-447
    draft group assignment of a group-aware producer: its own log record, kept here by the
    coordinator, not by transitions),
    prepared_timestamp (ms when PrepareTxn sealed the Ongoing transaction, -1: not prepared),
    transaction_version (of the last EndTxn, see TxnTransitMetadata),
    ongoing_txn_producer_id / ongoing_txn_producer_epoch (KIP-939: the pair of a prepared
    transaction kept by InitProducerId(keepPreparedTxn=true), while producer_id /
    producer_epoch are the client-facing pair; -1 when none is kept; see
    `prepared_producer`).

    The timestamps above are wall-clock ms, written to the transaction log. The
    coordinator owning the transactional.id measures the timeouts on its monotonic
    clock instead (docs/design.md, "Clocks"): started_monotonic_ms,
    prepared_monotonic_ms and updated_monotonic_ms (ms of that clock, None: not seen
    by this process yet) are when it applied the transition that set
    txn_start_timestamp, prepared_timestamp and txn_last_update_timestamp, or loaded
    the transactional.id; they are never written.
    """

    __slots__ = ("transactional_id", "producer_id", "last_producer_id", "producer_epoch",
                 "last_producer_epoch", "txn_timeout_ms", "_state", "partitions",
                 "txn_start_timestamp", "txn_last_update_timestamp", "pending_state",
                 "group", "_fence_epoch", "prepared_timestamp", "transaction_version", "_pending_guard",
                 "_markers_written",
                 "started_monotonic_ms", "prepared_monotonic_ms", "updated_monotonic_ms",
                 "ongoing_txn_producer_id", "ongoing_txn_producer_epoch")

    def __init__(self, transactional_id: str, producer_id: int, *, last_producer_id: int = NO_PRODUCER_ID,
                 producer_epoch: int = NO_PRODUCER_EPOCH, last_producer_epoch: int = NO_PRODUCER_EPOCH,
                 txn_timeout_ms: int, state: TxnState = TxnState.EMPTY,
                 partitions: Iterable[TopicPartition] = (), txn_start_timestamp: int = -1,
                 txn_last_update_timestamp: int, group: GroupAssignment | None = None,
                 prepared_timestamp: int = -1, transaction_version: int = 2,
                 ongoing_txn_producer_id: int = NO_PRODUCER_ID, ongoing_txn_producer_epoch: int = NO_PRODUCER_EPOCH):
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.last_producer_id = last_producer_id
        self.producer_epoch = producer_epoch
        self.last_producer_epoch = last_producer_epoch
        self.txn_timeout_ms = txn_timeout_ms
        self._state = state  # from here on changed only by _apply (the transition table)
        self.partitions: frozenset[TopicPartition] = _partition_set(partitions)
        self.txn_start_timestamp = txn_start_timestamp
        self.txn_last_update_timestamp = txn_last_update_timestamp
        self.pending_state: TxnState | None = None
        self.group = group
        self._fence_epoch: int | None = None
        self.prepared_timestamp = prepared_timestamp
        self.transaction_version = transaction_version
        self.ongoing_txn_producer_id = ongoing_txn_producer_id
        self.ongoing_txn_producer_epoch = ongoing_txn_producer_epoch
        self._pending_guard: Guard | None = None  # the guard of the pending transition's row
        # Guard.MARKERS_WRITTEN holds: every marker of this PrepareCommit / PrepareAbort
        # transaction is written (record_markers_written); forgotten by every transition.
        self._markers_written = False
        self.started_monotonic_ms: int | None = None
        self.prepared_monotonic_ms: int | None = None
        self.updated_monotonic_ms: int | None = None

    @classmethod
    def from_transit(cls, transactional_id: str, transit: TxnTransitMetadata,
                     group: GroupAssignment | None = None) -> "TransactionMetadata":
        """Materialise a record read back from the transaction log (coordinator
        startup), with `group`, the id's KIP-447 draft group assignment (its own record)."""
        return cls(transactional_id, transit.producer_id, last_producer_id=transit.last_producer_id, group=group,
                   producer_epoch=transit.producer_epoch, last_producer_epoch=transit.last_producer_epoch,
                   txn_timeout_ms=transit.txn_timeout_ms, state=transit.state,
                   partitions=transit.partitions, txn_start_timestamp=transit.txn_start_timestamp,
                   txn_last_update_timestamp=transit.txn_last_update_timestamp,
                   prepared_timestamp=transit.prepared_timestamp, transaction_version=transit.transaction_version,
                   ongoing_txn_producer_id=transit.ongoing_txn_producer_id,
                   ongoing_txn_producer_epoch=transit.ongoing_txn_producer_epoch)

    def __repr__(self) -> str:
        return (f"TransactionMetadata({self.transactional_id!r}, pid={self.producer_id}, "
                f"epoch={self.producer_epoch}, state={self.state.kafka_name}, "
                f"pending={None if self.pending_state is None else self.pending_state.kafka_name}, "
                f"partitions={sorted(self.partitions)}"
                + (f", ongoing_txn=({self.ongoing_txn_producer_id}, {self.ongoing_txn_producer_epoch})"
                   if self.ongoing_txn_producer_id >= 0 else "") + ")")

    # ------------------------------------------------------------ queries
    @property
    def state(self) -> TxnState:
        """The current state; read-only: it changes only by `complete_transition`,
        through a row of `TRANSITION_TABLE`."""
        return self._state

    @property
    def pending_transition_in_progress(self) -> bool:
        return self.pending_state is not None

    @property
    def is_prepared(self) -> bool:
        """An Ongoing transaction sealed by PrepareTxn (two-phase commit)."""
        return self.state is TxnState.ONGOING and self.prepared_timestamp >= 0

    @property
    def prepared_producer(self) -> tuple[int, int] | None:
        """(PID, epoch) of the prepared transaction -- its data's, which its markers
        end and which the client's PreparedTxnState names (KIP-939's
        OngoingTxnProducerId / OngoingTxnProducerEpoch once a new instance kept it);
        None when no transaction is prepared."""
        if not self.is_prepared:
            return None
        if self.ongoing_txn_producer_id >= 0:
            return self.ongoing_txn_producer_id, self.ongoing_txn_producer_epoch
        return self.producer_id, self.producer_epoch

    @property
    def is_producer_epoch_exhausted(self) -> bool:
        return is_epoch_exhausted(self.producer_epoch)

    def is_valid_producer_id(self, producer_id: int, producer_epoch: int) -> bool:
        """KIP-360 (Kafka's isValidProducerId): an InitProducerId naming its current
        (producer_id, producer_epoch) may re-initialise the id when the id is new, the
        PID matches, or it is the previous PID retried after a rotation."""
        return (self.producer_epoch == NO_PRODUCER_EPOCH or producer_id == self.producer_id
                or (producer_id == self.last_producer_id and is_epoch_exhausted(producer_epoch)))

    def check_producer(self, producer_id: int, producer_epoch: int) -> ErrorCode:
        """Whether a request of (producer_id, producer_epoch) is this id's current
        producer: INVALID_PRODUCER_ID_MAPPING for another PID, PRODUCER_FENCED for
        another epoch (an older instance, fenced), else NONE."""
        if producer_id != self.producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if producer_epoch != self.producer_epoch:
            return ErrorCode.PRODUCER_FENCED
        return ErrorCode.NONE

    def add_partitions_check(self, wanted: frozenset[TopicPartition]) -> ErrorCode | None:
        """AddPartitionsToTxn / AddOffsetsToTxn of the current producer (outside the
        handover): INVALID_TXN_STATE when the transaction is sealed by PrepareTxn;
        INVALID_PRODUCER_EPOCH between transactions at an exhausted epoch (every
        transaction ends under the next epoch, so none may start at the last ones:
        InitProducerId rotates the PID first); NONE when the ongoing transaction holds
        every partition of `wanted` already; None when the add is to be prepared
        (`prepare_add_partitions`)."""
        if self.is_prepared:
            return ErrorCode.INVALID_TXN_STATE
        if self.state in COMPLETED_STATES and self.is_producer_epoch_exhausted:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if self.state is TxnState.ONGOING and wanted <= self.partitions:
            return ErrorCode.NONE
        return None

    def verify_partition(self, tp: TopicPartition) -> ErrorCode:
        """KIP-890 verification of the current producer's write to `tp`: NONE when the
        transaction is Ongoing, not sealed by PrepareTxn, and holds `tp`;
        CONCURRENT_TRANSACTIONS while it is being ended or fenced (asking again sees the
        outcome); else INVALID_TXN_STATE."""
        if self.pending_state is not None and self.pending_state is not TxnState.ONGOING:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if self.state is not TxnState.ONGOING or self.is_prepared or tp not in self.partitions:
            return ErrorCode.INVALID_TXN_STATE
        return ErrorCode.NONE

    def end_txn_outcome(self, committed: bool) -> ErrorCode:
        """The answer to an EndTxn when no transaction is ongoing: a retry of the end
        that completed (NONE: answer with the current PID and epoch) or is completing
        (CONCURRENT_TRANSACTIONS), else INVALID_TXN_STATE (the other command, or no
        transaction)."""
        if self.state is (TxnState.COMPLETE_COMMIT if committed else TxnState.COMPLETE_ABORT):
            return ErrorCode.NONE
        if self.state is (TxnState.PREPARE_COMMIT if committed else TxnState.PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS
        return ErrorCode.INVALID_TXN_STATE

    @property
    def markers_written(self) -> bool:
        """Whether every marker of this PrepareCommit / PrepareAbort transaction is
        recorded as written (`record_markers_written`): the fact the handover's row
        (Guard.MARKERS_WRITTEN) needs."""
        return self._markers_written

    def holds(self, guard: Guard) -> bool:
        """Whether the fact `guard` names is recorded here."""
        if guard is Guard.MARKERS_WRITTEN:
            return self._markers_written
        raise ValueError(f"unknown guard {guard!r}")

    def record_markers_written(self, prepared: TxnTransitMetadata) -> bool:
        """Record that every marker of the prepared transaction `prepared` (its
        PrepareCommit / PrepareAbort transit) is written: the one call of the id's
        completion into the machine's facts (completion.Completion.markers_done).
        Recorded, and True, only while this is still that transaction (its state,
        PID and epoch) with nothing pending; else nothing is recorded and False. The
        fact holds until the next transition is applied (the handover's Ongoing
        record, or the Complete record); a transaction loaded from the log has it
        not (no record says so)."""
        if (self.state not in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT) or self.state is not prepared.state
                or self.pending_transition_in_progress
                or (self.producer_id, self.producer_epoch) != (prepared.producer_id, prepared.producer_epoch)):
            return False
        self._markers_written = True
        return True

    def snapshot(self) -> TxnTransitMetadata:
        """The current values as a transit (no state change)."""
        return TxnTransitMetadata(self.producer_id, self.last_producer_id, self.producer_epoch,
                                  self.last_producer_epoch, self.txn_timeout_ms, self.state,
                                  frozenset(self.partitions), self.txn_start_timestamp,
                                  self.txn_last_update_timestamp, self.prepared_timestamp,
                                  self.transaction_version, self.ongoing_txn_producer_id,
                                  self.ongoing_txn_producer_epoch)

    # ------------------------------------------------------------ prepare
    def _prepare_transition_to(self, target: TxnState, now_ms: int, guard: Guard | None = None,
                               **changes) -> TxnTransitMetadata:
        if self.pending_state is not None:
            raise PendingTransitionError(
                f"transactional.id {self.transactional_id!r}: preparing {target.kafka_name} while "
                f"{self.pending_state.kafka_name} is pending")
        self._check_row(target, guard)
        epoch = changes.get("producer_epoch", self.producer_epoch)
        if not NO_PRODUCER_EPOCH <= epoch <= MAX_PRODUCER_EPOCH:
            raise TxnStateError(f"producer epoch {epoch} out of range")
        if target in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT, TxnState.DEAD):
            changes.setdefault("prepared_timestamp", -1)  # no transaction left to be prepared
            changes.setdefault("ongoing_txn_producer_id", NO_PRODUCER_ID)  # nor kept
            changes.setdefault("ongoing_txn_producer_epoch", NO_PRODUCER_EPOCH)
        # The current values with the changes, built once (not a snapshot, then a copy).
        values = {"producer_id": self.producer_id, "last_producer_id": self.last_producer_id,
                  "producer_epoch": self.producer_epoch, "last_producer_epoch": self.last_producer_epoch,
                  "txn_timeout_ms": self.txn_timeout_ms, "partitions": self.partitions,
                  "txn_start_timestamp": self.txn_start_timestamp, "prepared_timestamp": self.prepared_timestamp,
                  "transaction_version": self.transaction_version,
                  "ongoing_txn_producer_id": self.ongoing_txn_producer_id,
                  "ongoing_txn_producer_epoch": self.ongoing_txn_producer_epoch}
        values.update(changes)
        values["state"], values["txn_last_update_timestamp"] = target, now_ms
        values["partitions"] = _partition_set(values["partitions"])
        transit = TxnTransitMetadata(**values)
        self.pending_state = target
        self._pending_guard = guard
        return transit

    def prepare_increment_producer_epoch(self, new_txn_timeout_ms: int, expected_producer_epoch: int | None,
                                         now_ms: int) -> TxnTransitMetadata | ErrorCode:
        """InitProducerId on a transactional.id without a transaction in progress:
        the next epoch of the same PID, state Empty, no partitions.

        expected_producer_epoch (KIP-360, None when the client sent none): equal to the
        current epoch -> bump and remember the current one as last epoch; equal to the
        last epoch -> retry of a bump whose answer was lost: same epoch again; other ->
        PRODUCER_FENCED (returned, not raised). Raises TxnStateError when the epoch is
        exhausted (the caller rotates the PID instead)."""
        if self.is_producer_epoch_exhausted:
            raise TxnStateError(f"cannot bump exhausted epoch {self.producer_epoch} of "
                                f"{self.transactional_id!r}; rotate the producer id")
        bumped = self.producer_epoch + 1
        if expected_producer_epoch is None:
            epoch, last_epoch = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_producer_epoch == self.producer_epoch:
            epoch, last_epoch = bumped, self.producer_epoch
        elif expected_producer_epoch == self.last_producer_epoch:
            epoch, last_epoch = self.producer_epoch, self.last_producer_epoch
        else:
            return ErrorCode.PRODUCER_FENCED
        return self._prepare_transition_to(TxnState.EMPTY, now_ms, producer_epoch=epoch,
                                           last_producer_epoch=last_epoch, txn_timeout_ms=new_txn_timeout_ms,
                                           partitions=frozenset(), txn_start_timestamp=-1)

    def prepare_producer_id_rotation(self, new_producer_id: int, new_txn_timeout_ms: int, now_ms: int,
                                     record_last_epoch: bool) -> TxnTransitMetadata:
        """InitProducerId when the epoch is exhausted: a new PID with epoch 0, state
        Empty. The old PID (and, if `record_last_epoch`, its epoch) are kept as last_*
        so a retried request is recognised."""
        if new_producer_id < 0:
            raise TxnStateError(f"cannot rotate to invalid producer id {new_producer_id}")
        return self._prepare_transition_to(
            TxnState.EMPTY, now_ms, producer_id=new_producer_id, last_producer_id=self.producer_id,
            producer_epoch=0,
            last_producer_epoch=self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
            txn_timeout_ms=new_txn_timeout_ms, partitions=frozenset(), txn_start_timestamp=-1)

    def prepare_fence_producer_epoch(self, now_ms: int) -> TxnTransitMetadata:
        """First step of aborting an ongoing transaction on behalf of a new producer
        instance or the timeout (design doc "Coordinator-side Transaction Expiration":
        "void the PID by bumping up the epoch"). Only sets the in-memory pending state
        PrepareEpochFence; it is never appended: `prepare_abort_or_commit(PREPARE_ABORT)`
        follows at once and carries the bumped epoch. At the maximum epoch the abort
        keeps the epoch (cannot happen after an InitProducerId, which rotates at MAX-1)."""
        epoch = self.producer_epoch if self.producer_epoch >= MAX_PRODUCER_EPOCH else self.producer_epoch + 1
        transit = self._prepare_transition_to(TxnState.PREPARE_EPOCH_FENCE, now_ms, producer_epoch=epoch,
                                              last_producer_epoch=NO_PRODUCER_EPOCH)
        self._fence_epoch = epoch
        return transit

    def prepare_add_partitions(self, added: Iterable[TopicPartition], now_ms: int) -> TxnTransitMetadata:
        """AddPartitionsToTxn / AddOffsetsToTxn: state Ongoing with the union of the
        partitions; the transaction (and its timeout) starts with the first partition."""
        start = now_ms if self.state in COMPLETED_STATES else self.txn_start_timestamp
        return self._prepare_transition_to(TxnState.ONGOING, now_ms,
                                           partitions=frozenset(self.partitions) | frozenset(added),
                                           txn_start_timestamp=start)

    def prepare_next_transaction(self, added: Iterable[TopicPartition], now_ms: int) -> TxnTransitMetadata:
        """The handover: the first AddPartitionsToTxn / AddOffsetsToTxn of the
        producer's next transaction while the previous one is PrepareCommit or
        PrepareAbort and every marker of it is written. One Ongoing record then
        completes the previous transaction and starts the next, instead of a Complete
        record followed by an Ongoing one: a loader takes the last record of an id,
        and the markers were written before it was appended (docs/design.md,
        "Prepare -> append -> complete"). Same PID and epoch; the partitions are
        `added` alone; the transaction (and its timeout) starts at now_ms. The row of
        `TRANSITION_TABLE` guarded by Guard.MARKERS_WRITTEN, which this metadata
        checks itself: the completion must have recorded every marker as written
        (`record_markers_written`; no record of the log says so). Raises
        GuardNotHeldError when it has not, PendingTransitionError while another
        transition is pending, InvalidTransitionError outside PrepareCommit /
        PrepareAbort."""
        return self._prepare_transition_to(TxnState.ONGOING, now_ms, Guard.MARKERS_WRITTEN,
                                           partitions=frozenset(added), txn_start_timestamp=now_ms,
                                           prepared_timestamp=-1, ongoing_txn_producer_id=NO_PRODUCER_ID,
                                           ongoing_txn_producer_epoch=NO_PRODUCER_EPOCH)

    def prepare_mark_prepared(self, now_ms: int) -> TxnTransitMetadata:
        """PrepareTxn (two-phase commit in the spirit of KIP-939): seal the Ongoing
        transaction, which stays Ongoing with `prepared_timestamp` = now_ms until an
        EndTxn (from any process, with the same PID and epoch) completes it. Without a
        transaction in progress (Empty / Complete*), an empty transaction is started
        and sealed, so that the later EndTxn has a transaction to complete."""
        start = now_ms if self.state in COMPLETED_STATES else self.txn_start_timestamp
        return self._prepare_transition_to(TxnState.ONGOING, now_ms, txn_start_timestamp=start,
                                           prepared_timestamp=now_ms)

    def prepare_keep_prepared(self, new_txn_timeout_ms: int, now_ms: int,
                              new_producer_id: int | None = None) -> TxnTransitMetadata:
        """KIP-939 InitProducerId(keepPreparedTxn=true) on a prepared transaction: the
        transaction stays open, sealed and unchanged, its (PID, epoch) kept as
        ongoing_txn_producer_id / _epoch for its markers and for the comparison with
        the PreparedTxnState an external transaction manager holds; the
        client-facing pair moves to the next epoch, "so that we can fence requests
        from previous incarnations" (KIP-939): every request of an earlier instance,
        its EndTxn among them, is then PRODUCER_FENCED. last_producer_epoch is
        cleared, so that no earlier epoch is ever taken for the retry of an EndTxn
        (`is_end_txn_retry`), also after an EndTxn of transaction version 1, which
        does not bump. When the client-facing epoch is exhausted (its EndTxn could not
        bump it once more), the client-facing PID rotates to `new_producer_id` with
        epoch 0, the old one kept as last_producer_id.
        Raises TxnStateError when no transaction is prepared, or at an exhausted epoch
        without `new_producer_id`; PendingTransitionError while a transition is pending."""
        kept = self.prepared_producer
        if kept is None:
            raise TxnStateError(f"transactional.id {self.transactional_id!r} has no prepared transaction to keep")
        if self.is_producer_epoch_exhausted:
            if new_producer_id is None or new_producer_id < 0:
                raise TxnStateError(f"cannot bump exhausted epoch {self.producer_epoch} of "
                                    f"{self.transactional_id!r}; rotate the producer id")
            client = {"producer_id": new_producer_id, "last_producer_id": self.producer_id, "producer_epoch": 0}
        else:
            client = {"producer_epoch": self.producer_epoch + 1}
        client["last_producer_epoch"] = NO_PRODUCER_EPOCH
        return self._prepare_transition_to(TxnState.ONGOING, now_ms, txn_timeout_ms=new_txn_timeout_ms,
                                           ongoing_txn_producer_id=kept[0], ongoing_txn_producer_epoch=kept[1],
                                           **client)

    def prepare_abort_or_commit(self, target: TxnState, now_ms: int, bump_epoch: bool = False,
                                transaction_version: int | None = None) -> TxnTransitMetadata:
        """EndTxn (or an abort by the coordinator): PrepareCommit or PrepareAbort with
        the partitions of the transaction. After `prepare_fence_producer_epoch` only
        PrepareAbort is allowed, and it carries the fencing epoch.

        bump_epoch (a client's EndTxn; Kafka's KIP-890 part 2): the transaction ends
        under the next producer epoch, e+1, with e kept as last_producer_epoch so a
        retried EndTxn is recognised. The markers carry e+1, so a late batch or a late
        duplicate marker of this transaction is fenced on every partition, and the
        producer's next transaction runs at e+1. Raises TxnStateError when the epoch
        is exhausted (the coordinator refuses to start transactions there).
        transaction_version: recorded with the transition (None: unchanged); the
        markers are written with it."""
        if target not in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            raise TxnStateError(f"prepare_abort_or_commit to {target.kafka_name}")
        changes = {}
        if self.pending_state is TxnState.PREPARE_EPOCH_FENCE:
            check_transition(self.transactional_id, TxnState.PREPARE_EPOCH_FENCE, target)
            changes = {"producer_epoch": self._fence_epoch, "last_producer_epoch": NO_PRODUCER_EPOCH}
            self.pending_state = None
        elif bump_epoch:
            if self.producer_epoch >= MAX_PRODUCER_EPOCH:
                raise TxnStateError(f"cannot bump exhausted epoch {self.producer_epoch} of {self.transactional_id!r}")
            changes = {"producer_epoch": self.producer_epoch + 1, "last_producer_epoch": self.producer_epoch}
        if transaction_version is not None:
            changes["transaction_version"] = transaction_version
        return self._prepare_transition_to(target, now_ms, **changes)

    def is_end_txn_retry(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether an EndTxn with (producer_id, producer_epoch) is a retry of the
        client's EndTxn that moved this transaction to Prepare*/Complete* under the
        next epoch (KIP-890 part 2)."""
        return (producer_id == self.producer_id and producer_epoch >= 0
                and producer_epoch == self.last_producer_epoch and self.producer_epoch == producer_epoch + 1
                and self.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT,
                                   TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT))

    def prepare_complete(self, now_ms: int) -> TxnTransitMetadata:
        """After all markers are written: CompleteCommit / CompleteAbort, partitions
        cleared (design doc "Transaction Coordinator Startup", step 2 of commit)."""
        if self.state is TxnState.PREPARE_COMMIT:
            target = TxnState.COMPLETE_COMMIT
        elif self.state is TxnState.PREPARE_ABORT:
            target = TxnState.COMPLETE_ABORT
        else:
            raise InvalidTransitionError(self.transactional_id, self.state, TxnState.COMPLETE_COMMIT)
        return self._prepare_transition_to(target, now_ms, partitions=frozenset())

    def prepare_dead(self, now_ms: int) -> TxnTransitMetadata:
        """transactional.id expiration: the tombstone is appended, then the entry is
        removed from the cache."""
        return self._prepare_transition_to(TxnState.DEAD, now_ms, partitions=frozenset())

    # ------------------------------------------------------------ complete
    def cancel_transition(self) -> None:
        """Forget the pending transition (its log append failed)."""
        self.pending_state = None
        self._fence_epoch = None
        self._pending_guard = None

    def complete_transition(self, transit: TxnTransitMetadata) -> None:
        """Apply a transit after its record was appended to the transaction log.

        Re-checks what Kafka's completeTransitionTo checks: the pending state matches,
        the PID is unchanged (except by a rotation to Empty), the epoch never
        decreases, and the state-specific invariants. Raises TransitionMismatchError /
        InvalidTransitionError on a violation (a bug).

        Wall-clock time may step backwards between two transitions (an NTP step, a
        failover to a host whose clock is behind): the transit's timestamps are taken as
        they are, never checked against the stored ones, so a completed append always
        completes the transition (Kafka's TransactionMetadataTest
        testTolerateTimeShiftDuring*; docs/design.md, "Transactions")."""
        target = transit.state
        if self.pending_state is not target:
            raise TransitionMismatchError(
                f"transactional.id {self.transactional_id!r}: completing {target.kafka_name} but pending is "
                f"{self.pending_state.kafka_name if self.pending_state else None}")
        row = self._check_row(target, self._pending_guard)
        handover = row.guard is Guard.MARKERS_WRITTEN
        rotated = transit.producer_id != self.producer_id
        kept = target is TxnState.ONGOING and transit.ongoing_txn_producer_id >= 0 and (
            transit.producer_id, transit.producer_epoch) != (self.producer_id, self.producer_epoch)
        if rotated and not ((target is TxnState.EMPTY or kept) and transit.last_producer_id == self.producer_id):
            self._mismatch(transit, "producer id changed outside a rotation")
        if not rotated and transit.producer_epoch < self.producer_epoch:
            self._mismatch(transit, "producer epoch goes backwards")
        if kept:
            self._check_kept(transit, rotated)
        elif target is TxnState.ONGOING:
            if transit.producer_epoch != self.producer_epoch or not (handover or transit.partitions >= self.partitions):
                self._mismatch(transit, "ongoing transaction lost partitions or changed epoch")
            if self.state is TxnState.ONGOING and transit.txn_start_timestamp != self.txn_start_timestamp:
                self._mismatch(transit, "start timestamp of an ongoing transaction changed")
            if not handover and (transit.ongoing_txn_producer_id, transit.ongoing_txn_producer_epoch) != (
                    self.ongoing_txn_producer_id, self.ongoing_txn_producer_epoch):
                self._mismatch(transit, "the kept transaction's producer changed")
        elif target in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            if (transit.partitions != frozenset(self.partitions) or transit.txn_timeout_ms != self.txn_timeout_ms
                    or transit.txn_start_timestamp != self.txn_start_timestamp
                    or (transit.ongoing_txn_producer_id, transit.ongoing_txn_producer_epoch)
                    != (self.ongoing_txn_producer_id, self.ongoing_txn_producer_epoch)):
                self._mismatch(transit, "prepared transaction differs from the ongoing one")
            if target is TxnState.PREPARE_COMMIT and transit.producer_epoch not in (self.producer_epoch,
                                                                                  self.producer_epoch + 1):
                self._mismatch(transit, "commit with another epoch than the transaction's or the next")
        elif target in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT, TxnState.DEAD):
            if transit.producer_epoch != self.producer_epoch or transit.partitions:
                self._mismatch(transit, "completion changed the epoch or kept partitions")
        elif target is TxnState.EMPTY:
            if transit.partitions:
                self._mismatch(transit, "empty state with partitions")
        else:
            self._mismatch(transit, "PrepareEpochFence is never completed")
        self._apply(row.target, transit)

    def _check_row(self, target: TxnState, guard: Guard | None) -> TransitionRow:
        """The row of the table taking this metadata to `target` under `guard`, whose
        fact must be recorded here (`holds`). Raises InvalidTransitionError,
        GuardNotHeldError."""
        row = check_transition(self.transactional_id, self.state, target, guard)
        if guard is not None and not self.holds(guard):
            raise GuardNotHeldError(self.transactional_id, self.state, target, guard)
        return row

    def _check_kept(self, transit: TxnTransitMetadata, rotated: bool) -> None:
        """The invariants of `prepare_keep_prepared`: the same sealed transaction, its
        pair kept, the client-facing pair one epoch on (or rotated to epoch 0)."""
        if (not self.is_prepared or transit.prepared_timestamp != self.prepared_timestamp
                or transit.partitions != self.partitions or transit.txn_start_timestamp != self.txn_start_timestamp
                or (transit.ongoing_txn_producer_id, transit.ongoing_txn_producer_epoch) != self.prepared_producer):
            self._mismatch(transit, "keeping a prepared transaction changed it")
        if transit.producer_epoch != (0 if rotated else self.producer_epoch + 1):
            self._mismatch(transit, "keeping a prepared transaction did not take the next client-facing epoch")

    def replay(self, transit: TxnTransitMetadata) -> None:
        """Take a record of this transactional.id read back from the log (a load:
        `partition.TxnPartition.replay`). The last record of an id wins ("Transaction
        Coordinator Startup" 1.b), so its values are taken as they are, without the
        checks of `complete_transition`: the log holds what the previous owner acted
        on, as Kafka's loader takes it. Through the same apply function as a
        completed transition. Raises TxnStateError while a transition is pending (a
        loaded metadata never has one)."""
        if self.pending_state is not None:
            raise TxnStateError(f"transactional.id {self.transactional_id!r}: replaying a record while "
                                f"{self.pending_state.kafka_name} is pending")
        self._apply(transit.state, transit)

    def _apply(self, target: TxnState, transit: TxnTransitMetadata) -> None:
        """The table's apply function, the only place the state changes: take the
        state `target` (a row checked by `complete_transition`, or a record read back
        by `replay`) with the values of `transit`."""
        self.producer_id = transit.producer_id
        self.last_producer_id = transit.last_producer_id
        self.producer_epoch = transit.producer_epoch
        self.last_producer_epoch = transit.last_producer_epoch
        self.txn_timeout_ms = transit.txn_timeout_ms
        self._state = target
        self.partitions = _partition_set(transit.partitions)
        self.txn_start_timestamp = transit.txn_start_timestamp
        self.txn_last_update_timestamp = transit.txn_last_update_timestamp
        self.prepared_timestamp = transit.prepared_timestamp
        self.transaction_version = transit.transaction_version
        self.ongoing_txn_producer_id = transit.ongoing_txn_producer_id
        self.ongoing_txn_producer_epoch = transit.ongoing_txn_producer_epoch
        self.pending_state = None
        self._fence_epoch = None
        self._pending_guard = None
        self._markers_written = False  # a fact of the state just left

    def _mismatch(self, transit: TxnTransitMetadata, why: str) -> None:
        raise TransitionMismatchError(f"transactional.id {self.transactional_id!r}: {why}: {self!r} -> {transit!r}")


# The state ListTransactions / DescribeTransactions name for an Ongoing transaction
# sealed by PrepareTxn (KIP-939's prepared state; not a state of the state machine).
PREPARED_STATE_NAME = "PrepareTxn"


def listed_state_names(names: Iterable[str]) -> set[str]:
    """The listed state names (`TxnStateSummary.state_name`) that ListTransactions'
    state filters `names` select: Kafka's names in any spelling `TxnState.from_name`
    reads, and PREPARED_STATE_NAME ("PrepareTxn", "PREPARE_TXN", any case); unknown
    names select nothing."""
    out = set()
    for name in names:
        if name.replace("_", "").lower() == PREPARED_STATE_NAME.lower():
            out.add(PREPARED_STATE_NAME)
            continue
        try:
            out.add(TxnState.from_name(name).kafka_name)
        except ValueError:
            pass
    return out


@dataclass
class TxnStateSummary:
    """A read-only view for ListTransactions / DescribeTransactions. prepared_producer:
    (PID, epoch) of a prepared transaction (`TransactionMetadata.prepared_producer`),
    None when none is prepared."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: TxnState
    txn_timeout_ms: int
    txn_start_timestamp: int
    partitions: list[TopicPartition] = field(default_factory=list)
    prepared_timestamp: int = -1  # ms; -1: not prepared
    prepared_producer: tuple[int, int] | None = None

    @property
    def state_name(self) -> str:
        """The state as listed: PREPARED_STATE_NAME for a prepared transaction, else
        Kafka's name of the state."""
        return PREPARED_STATE_NAME if self.prepared_producer is not None else self.state.kafka_name

    @classmethod
    def of(cls, md: TransactionMetadata) -> "TxnStateSummary":
        return cls(md.transactional_id, md.producer_id, md.producer_epoch, md.state, md.txn_timeout_ms,
                   md.txn_start_timestamp, sorted(md.partitions), md.prepared_timestamp, md.prepared_producer)
