"""The request handling of the transaction coordinator (design doc "Transaction
Coordinator Request Handling").

InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, PrepareTxn, and
VerifyProducerId of the producer-id bindings. Each request checks, prepares its
transition (no `await` between the checks and the prepare, so a second request sees
the pending transition and gets CONCURRENT_TRANSACTIONS), then appends it to the log
(`store.TxnStore.append`).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from exactly_wire.clock import Clock, monotonic_ms, wall_clock_ms
from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from services.common.after_answer import after_answer
from services.common.cluster import features
from services.common.protocol import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from services.common.settings import TxnCoordinatorSchema, key_of
from services.common.security.pid_binding import refusal, refusal_code

from . import metrics, txn_log
from .pid_manager import ProducerIdAllocationError, ProducerIdManager
from .ports import EndTxnResult, InitProducerIdResult, MarkerWriter, Topology
from .state import COMPLETED_STATES, GroupAssignment, TransactionMetadata, TxnState, TxnTransitMetadata

if TYPE_CHECKING:
    from .completion import Completions
    from .group_txn import GroupTxn
    from .partition import TxnPartition
    from .store import TxnStore

log = logging.getLogger(__name__)


# What `_prepare_init` decided (InitProducerId): a tagged union matched with `match`.
@dataclass(frozen=True)
class InitAnswer:
    """Answer the request with `result` now (an error)."""

    result: InitProducerIdResult


@dataclass(frozen=True)
class InitNeedsProducerIds:
    """No producer id is left in the reserved block: reserve one, then prepare again."""


@dataclass(frozen=True)
class InitFencesOngoing:
    """The id's previous producer has a transaction ongoing: abort it with an epoch
    bump first (the answer is CONCURRENT_TRANSACTIONS until it completed)."""

    part: TxnPartition
    md: TransactionMetadata


@dataclass(frozen=True)
class InitAppends:
    """`transit` (the epoch bump or PID rotation, or the kept prepared transaction
    under a new client-facing epoch) is pending on `md`: append it."""

    part: TxnPartition
    md: TransactionMetadata
    transit: TxnTransitMetadata


InitStep = InitAnswer | InitNeedsProducerIds | InitFencesOngoing | InitAppends


class TxnRequests:
    """The request handlers of the coordinator.

    store: the transaction metadata (store.TxnStore: lookup, append, bindings, the
    owned partitions' ownership barrier); completions: completion.Completions (the
    wait for the previous transaction, the handover, the completion of an EndTxn,
    the fencing abort); groups: group_txn.GroupTxn (the KIP-447 draft's hooks);
    pids: the producer-id blocks (pid_manager.ProducerIdManager); topology:
    ports.Topology; config: the parsed settings (TxnCoordinatorSchema); clock:
    wall-clock ms; monotonic: ms of a monotonic clock (a binding's last use);
    bind_producer_ids (on with the authorizer): every producer id is issued bound to
    a principal, the binding written to partition producer id % n of the log first
    (docs/design.md, "Producer-id bindings")."""

    def __init__(self, store: TxnStore, completions: Completions, groups: GroupTxn, pids: ProducerIdManager,
                 topology: Topology, config: TxnCoordinatorSchema | None = None, clock: Clock = wall_clock_ms,
                 monotonic: Clock = monotonic_ms, bind_producer_ids: bool = False,
                 markers: MarkerWriter | None = None):
        self._store = store
        self._completions = completions
        self._markers = markers  # for partitions_added (None: leaders verify by asking)
        self._groups = groups
        self._pids = pids
        self._topology = topology
        self.config = config or TxnCoordinatorSchema()
        self._clock = clock
        self._monotonic = monotonic
        self.bind_producer_ids = bind_producer_ids
        self._next_binding_partition = 0
        # (principal, transactional) -> InitProducerIds in flight that add a binding (`_reserving`).
        self._binding_reservations: Counter[tuple[str, bool]] = Counter()

    async def init_producer_id(self, transactional_id: str | None, transaction_timeout_ms: int,
                               expected: tuple[int, int] | None = None,
                               group: GroupAssignment | None = None, principal: str = "",
                               keep_prepared_txn: bool = False) -> InitProducerIdResult:
        """InitProducerId (design doc "Transaction Coordinator Request Handling", InitPid).

        transactional_id None/"": a fresh PID with epoch 0 (idempotent producer).
        Otherwise: transaction_timeout_ms must be in (0, transaction.max.timeout.ms]
        (INVALID_TRANSACTION_TIMEOUT); expected = (producer_id, producer_epoch) of
        KIP-360 or None; group: KIP-447 draft group-aware init, see `GroupTxn.init`
        (ILLEGAL_GENERATION, PENDING_TRANSACTION, INVALID_GROUP_ID).
        An ongoing transaction of the id (also one sealed by PrepareTxn: the
        keepPreparedTxn=false behaviour of KIP-939) is aborted with a bumped epoch first and the
        answer is CONCURRENT_TRANSACTIONS until it completed; a prepared one ->
        CONCURRENT_TRANSACTIONS. Then the epoch is bumped (a new PID with epoch 0 when
        the epoch is exhausted) and the record appended.
        keep_prepared_txn (KIP-939 keepPreparedTxn=true, classic form only): a transaction
        sealed by PrepareTxn is kept open instead (`TransactionMetadata.prepare_keep_prepared`):
        the client-facing epoch is bumped and appended, which fences every earlier
        instance (its EndTxn of the prepared transaction among its requests:
        PRODUCER_FENCED), and the answer is NONE with the new client-facing PID and
        epoch plus the prepared transaction's own pair as ongoing_txn_producer_id /
        _epoch, so the caller compares that pair with what its external transaction
        manager recorded and completes the transaction with EndTxn under its own
        epoch. An ongoing transaction that is not prepared is still aborted (it cannot
        have been recorded anywhere).
        Other errors: NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
        COORDINATOR_NOT_AVAILABLE, PRODUCER_FENCED (KIP-360 mismatch).

        With bind_producer_ids the producer id handed out is bound to `principal`
        (and the transactional.id) in the log before the answer: an idempotent
        producer gets a producer id of a partition this coordinator owns
        (NOT_COORDINATOR when it owns none that is loaded), a transactional one a
        producer id of its transactional.id's partition."""
        if not transactional_id and self.bind_producer_ids:
            over, new = self._over_binding_cap(principal, "")
            if over is not None:
                return over
            with self._reserving(principal, "", new):
                return await self._init_bound_idempotent(principal)
        if not transactional_id:
            try:
                return InitProducerIdResult(ErrorCode.NONE, await self._pids.generate(), 0)
            except ProducerIdAllocationError as exc:
                return InitProducerIdResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, message=str(exc))
        if not 0 < transaction_timeout_ms <= self.config.max_timeout_ms:
            return InitProducerIdResult(
                ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                message=f"transaction.timeout.ms {transaction_timeout_ms} not in (0, "
                        f"{self.config.max_timeout_ms}] (transaction.max.timeout.ms)")
        if "\0" in transactional_id:
            return InitProducerIdResult(ErrorCode.INVALID_REQUEST, message="transactional.id holds a NUL character")
        over, new = self._over_binding_cap(principal, transactional_id) if self.bind_producer_ids else (None, False)
        if over is not None:
            return over
        with self._reserving(principal, transactional_id, new):
            return await self._init_transactional(transactional_id, transaction_timeout_ms, expected, group, principal,
                                                  keep_prepared_txn)

    async def _init_transactional(self, transactional_id: str, transaction_timeout_ms: int,
                                  expected: tuple[int, int] | None, group: GroupAssignment | None, principal: str,
                                  keep_prepared_txn: bool) -> InitProducerIdResult:
        """InitProducerId of a transactional producer (see `init_producer_id`), its
        arguments checked."""
        group_id = ""
        if group is not None:
            blocked = await self._groups.init(transactional_id, group)
            if blocked is not None:
                return blocked
            group_id = group.group_id
        while True:
            try:
                await self._pids.ensure_available()
            except ProducerIdAllocationError as exc:
                return InitProducerIdResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, message=str(exc))
            match self._prepare_init(transactional_id, transaction_timeout_ms, expected, group_id,
                                     keep_prepared_txn and group is None):
                case InitNeedsProducerIds():
                    continue
                case InitAnswer(result):
                    return result
                case InitFencesOngoing(part, md):
                    err = await self._completions.fence_and_abort(part, md)
                    return InitProducerIdResult(err or ErrorCode.CONCURRENT_TRANSACTIONS,
                                                message="aborting the ongoing transaction of the previous producer")
                case InitAppends(part, md, transit):
                    break
        bindings = None
        if self.bind_producer_ids:
            wanted = txn_log.ProducerIdBinding(principal, transactional_id, self._clock())
            current = part.bindings.get(transit.producer_id)
            if current is None or (current.principal, current.transactional_id) != (principal, transactional_id):
                bindings = [(transit.producer_id, wanted)]  # written before the transition, in its append
            else:
                part.binding_used[transit.producer_id] = self._monotonic()
        err = await self._store.append(part, md, transit, bindings=bindings)
        if err:
            return InitProducerIdResult(err)
        if transit.state is TxnState.ONGOING:  # a kept prepared transaction (KIP-939)
            return InitProducerIdResult(ErrorCode.NONE, transit.producer_id, transit.producer_epoch,
                                        ongoing_txn_producer_id=transit.ongoing_txn_producer_id,
                                        ongoing_txn_producer_epoch=transit.ongoing_txn_producer_epoch)
        return InitProducerIdResult(ErrorCode.NONE, transit.producer_id, transit.producer_epoch)

    async def _init_bound_idempotent(self, principal: str) -> InitProducerIdResult:
        """InitProducerId of an idempotent producer with bind_producer_ids: a fresh
        producer id p with p % n a loaded partition this coordinator owns, bound to
        `principal` by a record in partition p % n before it is handed out."""
        n = self._topology.txn_partition_count()
        if n <= 0:
            return InitProducerIdResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, message=f"no {TRANSACTION_STATE_TOPIC} yet")
        while True:
            serving = sorted(part.partition for part in self._store.serving() if part.partition < n)
            if not serving:
                return InitProducerIdResult(ErrorCode.NOT_COORDINATOR,
                                            message=f"this coordinator owns no loaded {TRANSACTION_STATE_TOPIC} partition")
            # One residue at a time, in turn: the bindings spread over the owned partitions.
            self._next_binding_partition = (self._next_binding_partition + 1) % len(serving)
            pid = self._pids.next_pid_in({serving[self._next_binding_partition]}, n)
            if pid is not None:
                break
            try:
                await self._pids.ensure_available()
            except ProducerIdAllocationError as exc:
                return InitProducerIdResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, message=str(exc))
        part = self._store.owned.get(pid % n)
        if part is None or not part.serving:
            return InitProducerIdResult(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        err = await self._store.append_bindings(part, [(pid, txn_log.ProducerIdBinding(principal, "", self._clock()))])
        if err:
            return InitProducerIdResult(err, message="the producer id could not be bound; retry")
        return InitProducerIdResult(ErrorCode.NONE, pid, 0)

    def _over_binding_cap(self, principal: str, transactional_id: str) -> tuple[InitProducerIdResult | None, bool]:
        """(the POLICY_VIOLATION answer when a new binding would take `principal` past
        exactly.producer.ids.max.per.principal (idempotent, `transactional_id` "") or
        a new transactional.id past exactly.transactional.ids.max.per.principal, on this
        coordinator (its loaded partitions and the InitProducerIds in flight), else
        None; whether the call adds one to what the principal holds: not for a
        transactional.id it already holds)."""
        parts = self._store.serving()
        if not transactional_id:
            cap, setting = (self.config.producer_ids_max_per_principal,
                            key_of(TxnCoordinatorSchema, "producer_ids_max_per_principal"))
            held = sum(p.held.idempotent.get(principal, 0) for p in parts)
            what = "idempotent producer ids"
        else:
            cap, setting = (self.config.transactional_ids_max_per_principal,
                            key_of(TxnCoordinatorSchema, "transactional_ids_max_per_principal"))
            if any(p.held.holds(principal, transactional_id) for p in parts):
                return None, False
            held = sum(p.held.transactional_ids(principal) for p in parts)
            what = "transactional ids"
        held += self._binding_reservations[(principal, bool(transactional_id))]
        if cap <= 0 or held < cap:
            return None, True
        metrics.INIT_PRODUCER_ID_OVER_CAP.inc()
        return InitProducerIdResult(ErrorCode.POLICY_VIOLATION, message=(
            f"{principal} holds {held} {what} at this transaction coordinator, the most {setting} allows ({cap}); "
            f"retry once some have expired")), True

    @contextlib.contextmanager
    def _reserving(self, principal: str, transactional_id: str, new: bool):
        """Count an InitProducerId in flight that adds to what `principal` holds (`new`)
        against its cap until it ends, so concurrent ones cannot each pass at the last
        free place."""
        if not new:
            yield
            return
        key = (principal, bool(transactional_id))
        self._binding_reservations[key] += 1
        try:
            yield
        finally:
            self._binding_reservations[key] -= 1
            if self._binding_reservations[key] <= 0:
                del self._binding_reservations[key]

    def verify_producer_id(self, producer_id: int, principal: str, transactional_id: str,
                           transactional: bool) -> tuple[ErrorCode, str]:
        """VerifyProducerId: whether `producer_id` is bound to `principal` (and, for a
        transactional batch, to `transactional_id`), from the bindings of partition
        producer_id % n. A binding found counts as a use (it expires
        producer.id.expiration.ms / transactional.id.expiration.ms after its last
        use). Returns (NONE, ""), (the refusal code, why) — never issued, expired,
        another principal's or another transactional.id's (`pid_binding.refusal`) — or
        NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE (ask again).
        Below metadata.version 2 an idempotent producer id bound to no one is refused
        with CLUSTER_AUTHORIZATION_FAILED, not UNKNOWN_PRODUCER_ID: a partition leader
        of a version before it takes that answer for a failure to check and has the
        producer retry until its delivery timeout."""
        n = self._topology.txn_partition_count()
        if n <= 0 or producer_id < 0:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE if n <= 0 else self._unbound_code(transactional), \
                f"producer id {producer_id} was not issued by a transaction coordinator of this cluster"
        part = self._store.owned.get(producer_id % n)
        if part is None or part.error is not None:
            return ErrorCode.NOT_COORDINATOR, ""
        if part.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ""
        binding = part.bindings.get(producer_id)
        refused = refusal(binding, producer_id, principal, transactional_id, transactional)
        if refused is not None:
            code, why = refused
            return (self._unbound_code(transactional) if code == ErrorCode.UNKNOWN_PRODUCER_ID else code), why
        part.binding_used[producer_id] = self._monotonic()
        return ErrorCode.NONE, ""

    def _unbound_code(self, transactional: bool) -> ErrorCode:
        """VerifyProducerId's answer for a producer id bound to no one at the finalized
        metadata.version (see verify_producer_id)."""
        answers_unknown = self._topology.metadata_version() >= features.FORMATS["inter-service-protocol"].level_of(2)
        return refusal_code(transactional, bound=not answers_unknown)

    def _new_pid(self, part: TxnPartition) -> int | None:
        """The next producer id for a transactional.id of `part` (None: reserve a
        block first); with bind_producer_ids one whose binding lives in `part`."""
        if self.bind_producer_ids:
            return self._pids.next_pid_in({part.partition}, self._topology.txn_partition_count())
        return self._pids.next_pid()

    def _prepare_init(self, tid: str, timeout_ms: int, expected: tuple[int, int] | None, group_id: str,
                      keep_prepared: bool = False) -> InitStep:
        """The synchronous part of InitProducerId (no `await` between the checks and
        the prepare): what to do next, as an `InitStep`."""
        err, part, md = self._store.metadata(tid, group_id)
        if err:
            return InitAnswer(InitProducerIdResult(err))
        now = self._clock()
        if md is None:
            pid = self._new_pid(part)
            if pid is None:
                return InitNeedsProducerIds()
            md = TransactionMetadata(tid, pid, txn_timeout_ms=timeout_ms, txn_last_update_timestamp=now,
                                     group=self._groups.recorded_assignment(part, group_id, tid))
            self._store.add(part, md)
        if md.pending_transition_in_progress:
            return InitAnswer(InitProducerIdResult(ErrorCode.CONCURRENT_TRANSACTIONS))
        if expected is not None and not md.is_valid_producer_id(*expected):
            return InitAnswer(InitProducerIdResult(ErrorCode.PRODUCER_FENCED,
                                                   message=f"producer id {expected[0]} epoch {expected[1]} is not current"))
        state = md.state
        if state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            self._completions.nudge(part, tid)  # its Complete record now, not after a handover wait
            return InitAnswer(InitProducerIdResult(ErrorCode.CONCURRENT_TRANSACTIONS,
                                                   message="the previous transaction is completing"))
        if state is TxnState.ONGOING and keep_prepared and md.is_prepared and \
                features.write_version("txn-log-value", self._topology.metadata_version()) \
                < txn_log.KEPT_TXN_VALUE_VERSION:
            # Below metadata.version 2, as versions before it did: the transaction is
            # kept under its own pair and nothing is appended (records of value version
            # 0 only, which every process of the cluster reads); the previous instance
            # is not fenced until the level is raised.
            kept = md.prepared_producer
            log.info("InitProducerId for %r keeps its prepared transaction (PID %d epoch %d)", tid, *kept)
            return InitAnswer(InitProducerIdResult(ErrorCode.NONE, *kept, ongoing_txn_producer_id=kept[0],
                                                   ongoing_txn_producer_epoch=kept[1]))
        if state is TxnState.ONGOING and keep_prepared and md.is_prepared:
            rotate_to = None
            if md.is_producer_epoch_exhausted:
                rotate_to = self._new_pid(part)
                if rotate_to is None:
                    return InitNeedsProducerIds()
            transit = md.prepare_keep_prepared(timeout_ms, now, rotate_to)
            log.info("InitProducerId for %r keeps its prepared transaction (PID %d epoch %d) and fences the "
                     "previous instance: PID %d epoch %d", tid, transit.ongoing_txn_producer_id,
                     transit.ongoing_txn_producer_epoch, transit.producer_id, transit.producer_epoch)
            return InitAppends(part, md, transit)
        if state is TxnState.ONGOING:
            return InitFencesOngoing(part, md)
        if state not in COMPLETED_STATES:
            log.error("InitProducerId for %r in unexpected state %s", tid, state.kafka_name)
            return InitAnswer(InitProducerIdResult(ErrorCode.UNKNOWN_SERVER_ERROR))
        # With bindings a producer id must live in its transactional.id's partition; one
        # issued before bindings were on is replaced, as an exhausted one is.
        misplaced = self.bind_producer_ids and md.producer_epoch >= 0 and \
            md.producer_id % max(self._topology.txn_partition_count(), 1) != part.partition
        if misplaced or (md.is_producer_epoch_exhausted and (expected is None or expected[1] == md.producer_epoch)):
            new_pid = self._new_pid(part)
            if new_pid is None:
                return InitNeedsProducerIds()
            transit = md.prepare_producer_id_rotation(new_pid, timeout_ms, now, expected is not None)
        else:
            transit = md.prepare_increment_producer_epoch(timeout_ms, expected[1] if expected else None, now)
            if isinstance(transit, ErrorCode):
                return InitAnswer(InitProducerIdResult(transit))
        return InitAppends(part, md, transit)

    def _check_producer(self, tid: str, producer_id: int, producer_epoch: int, group_id: str = "",
                        generation_id: int = -1
                        ) -> tuple[ErrorCode, TxnPartition | None, TransactionMetadata | None]:
        err, part = self._store.lookup(tid, group_id)
        if err:
            return err, None, None
        md = part.txns.get(tid)
        err = ErrorCode.INVALID_PRODUCER_ID_MAPPING if md is None else md.check_producer(producer_id, producer_epoch)
        if err:
            return err, None, None
        if group_id:
            err = self._groups.check_generation(part, md, group_id, generation_id)
            if err:
                return err, None, None
        if md.pending_transition_in_progress:
            return ErrorCode.CONCURRENT_TRANSACTIONS, None, None
        return ErrorCode.NONE, part, md

    async def add_partitions_to_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                    partitions: Iterable[TopicPartition], verify_only: bool = False,
                                    group_id: str = "", generation_id: int = -1
                                    ) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn: add (topic, partition) pairs to the transaction, starting
        it (state Ongoing, timer started) with the first. Returns one ErrorCode per
        partition, the same for all: NONE, UNKNOWN_TOPIC_OR_PARTITION (some partition
        does not exist; none is added), INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED,
        CONCURRENT_TRANSACTIONS (pending change or a completing transaction),
        NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE.

        verify_only (KIP-890 part 1, asked by a partition leader before it accepts a
        producer's first transactional batch, and by the group coordinator before a
        TxnOffsetCommit): nothing is appended; per partition NONE when the id's
        transaction is Ongoing with this PID and epoch, not sealed or completing, and
        holds the partition, else INVALID_TXN_STATE; INVALID_PRODUCER_ID_MAPPING,
        PRODUCER_FENCED and the coordinator errors as above.

        group_id / generation_id (KIP-447 draft): a group-aware producer's group (its
        state lives on the group's partition) and the generation it initialised with;
        ILLEGAL_GENERATION for another or an outdated one (not checked on
        verify_only, whose askers know no generation)."""
        wanted = frozenset(partitions)
        if not wanted:
            return {}
        if verify_only:
            return self._verify(transactional_id, producer_id, producer_epoch, wanted, group_id)
        missing = [tp for tp in wanted if not self._topology.partition_exists(*tp)]
        if missing:
            return {tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION for tp in wanted}
        err = await self._add_partitions(transactional_id, producer_id, producer_epoch, wanted, group_id,
                                         generation_id)
        if err == ErrorCode.NONE:
            self._tell_leaders(transactional_id, group_id, wanted)
        return {tp: err for tp in wanted}

    def _tell_leaders(self, tid: str, group_id: str, added: frozenset[TopicPartition]) -> None:
        """After a transaction version 1 producer's AddPartitionsToTxn was appended, and
        before it is answered: its partitions' leaders learn that they are in its
        transaction (MarkerWriter.partitions_added), so that its first batch on each
        needs no verification call. Transaction version 2 producers' partitions are
        added by the leaders themselves (implicit adds), and the internal topics'
        verification is the group coordinator's."""
        if self._markers is None:
            return
        err, part = self._store.lookup(tid, group_id)
        md = part.txns.get(tid) if part is not None and not err else None
        if md is None or md.transaction_version >= 2 or md.state is not TxnState.ONGOING:
            return
        data = [tp for tp in added if tp[0] not in (TRANSACTION_STATE_TOPIC, CONSUMER_OFFSETS_TOPIC)]
        if data:
            self._markers.partitions_added(tid, md.producer_id, md.producer_epoch, part.coordinator_epoch, data)

    def _verify(self, tid: str, producer_id: int, producer_epoch: int,
                wanted: frozenset[TopicPartition], group_id: str = "") -> dict[TopicPartition, ErrorCode]:
        err, part = self._store.lookup(tid, group_id)
        if err:
            return {tp: err for tp in wanted}
        md = part.txns.get(tid)
        err = ErrorCode.INVALID_PRODUCER_ID_MAPPING if md is None else md.check_producer(producer_id, producer_epoch)
        if err:
            return {tp: err for tp in wanted}
        # Being ended or fenced right now (e.g. an epoch fence whose bump is not yet
        # written): CONCURRENT_TRANSACTIONS, retriable, as Kafka answers; the retry sees
        # the outcome (the new epoch: PRODUCER_FENCED) instead of a misleading INVALID_TXN_STATE.
        return {tp: md.verify_partition(tp) for tp in wanted}

    async def add_offsets_to_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                 group_id: str, consumer_group_id: str = "", generation_id: int = -1) -> ErrorCode:
        """AddOffsetsToTxn: add the `CONSUMER_OFFSETS_TOPIC` partition of `group_id`
        (crc32(group_id) % offsets.topic.num.partitions) to the transaction, so that it
        gets the marker. Errors as `add_partitions_to_txn` (COORDINATOR_NOT_AVAILABLE
        while `CONSUMER_OFFSETS_TOPIC` does not exist; INVALID_REQUEST for an empty group).
        consumer_group_id / generation_id: a group-aware producer's, as there."""
        if not group_id:
            return ErrorCode.INVALID_REQUEST
        partition = self._topology.offsets_partition_for(group_id)
        if partition < 0:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return await self._add_partitions(transactional_id, producer_id, producer_epoch,
                                          frozenset({(CONSUMER_OFFSETS_TOPIC, partition)}), consumer_group_id, generation_id)

    async def _add_partitions(self, tid: str, producer_id: int, producer_epoch: int,
                              wanted: frozenset[TopicPartition], group_id: str = "",
                              generation_id: int = -1) -> ErrorCode:
        try:
            await self._completions.wait_previous(tid, group_id, handover=True)
            return await self._add_partitions_now(tid, producer_id, producer_epoch, wanted, group_id, generation_id)
        finally:
            self._completions.resume(tid, group_id)

    async def _add_partitions_now(self, tid: str, producer_id: int, producer_epoch: int,
                                  wanted: frozenset[TopicPartition], group_id: str, generation_id: int) -> ErrorCode:
        err, part, md = self._check_producer(tid, producer_id, producer_epoch, group_id, generation_id)
        if err:
            return err
        if md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return await self._completions.hand_over(part, md, wanted)
        answer = md.add_partitions_check(wanted)
        if answer is not None:
            return answer
        transit = md.prepare_add_partitions(wanted, self._clock())
        return await self._store.append(part, md, transit)

    async def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                      committed: bool, group_id: str = "", generation_id: int = -1,
                      transaction_version: int = 2) -> EndTxnResult:
        """EndTxn: commit (committed=True) or abort the ongoing transaction.

        Ongoing (also sealed by PrepareTxn; then the request may come from any process
        holding the PID and epoch): PrepareCommit/PrepareAbort is appended to the log
        under the next producer epoch (KIP-890 part 2: the markers carry it, so late
        batches and late duplicate markers of this transaction are fenced), the markers
        and the Complete record follow in the background; answers NONE with the PID and
        the bumped epoch, which the producer uses from now on, once the Prepare record
        is written (after waiting up to exactly.txn.end.completion.wait.ms for the
        completion). A retry (the same request, from before the bump) after
        completion: same command -> NONE, the other -> INVALID_TXN_STATE; while
        completing (also while a record of the transaction is being appended): same
        command -> CONCURRENT_TRANSACTIONS, the other -> INVALID_TXN_STATE. No
        transaction (Empty) -> INVALID_TXN_STATE. Also
        INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED (another epoch),
        CONCURRENT_TRANSACTIONS, NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
        COORDINATOR_NOT_AVAILABLE (design doc "Transaction Coordinator Request
        Handling", EndTxn). group_id / generation_id: a group-aware producer's, as in
        add_partitions_to_txn (ILLEGAL_GENERATION). transaction_version 1 (a Kafka
        client with EndTxn below v5): no epoch bump; the transaction ends, and the
        markers are written, under the producer's current epoch. An answer from the
        cache for the current epoch without an ongoing transaction (none to end, or a
        version-1 retry) first passes the ownership barrier
        (OwnedPartitions.confirm_ownership): NOT_COORDINATOR when this owner was
        deposed, COORDINATOR_NOT_AVAILABLE when the barrier could not be written."""
        err, part = self._store.lookup(transactional_id, group_id)
        md = part.txns.get(transactional_id) if part is not None else None
        if md is not None and md.is_end_txn_retry(producer_id, producer_epoch):
            outcome = self._end_txn_outcome(md, committed)
            if md.pending_transition_in_progress and outcome.error == ErrorCode.NONE:
                # A retry while the transaction's next record is appended (its epoch is
                # the one before the bump, not a fencing one): answered once it is written.
                return EndTxnResult(ErrorCode.CONCURRENT_TRANSACTIONS)
            return outcome
        for confirmed in (False, True):
            err, part, md = self._check_producer(transactional_id, producer_id, producer_epoch, group_id,
                                                 generation_id)
            if err:
                return EndTxnResult(err)
            if md.state is TxnState.ONGOING:
                return await self._end_ongoing(part, md, committed, transaction_version)
            if confirmed:
                break
            # Nothing ongoing in the cache under the producer's current epoch. Either
            # there is no transaction, or this owner was deposed without noticing yet
            # and the producer's transaction lives with the new owner (a Kafka client's
            # retry without an epoch bump looks the same). The cache answers only once
            # the ownership barrier shows it is current; a stale owner answers
            # NOT_COORDINATOR, so the producer finds the new owner instead of being told
            # that a transaction the new owner still holds open was committed.
            err = await self._store.owned.confirm_ownership(part)
            if err:
                return EndTxnResult(err)
        return self._end_txn_outcome(md, committed)

    async def _end_ongoing(self, part: TxnPartition, md: TransactionMetadata, committed: bool,
                           transaction_version: int) -> EndTxnResult:
        """EndTxn of an ongoing transaction: append Prepare*, start the completion."""
        started = time.monotonic()
        target = TxnState.PREPARE_COMMIT if committed else TxnState.PREPARE_ABORT
        bump = transaction_version != 1
        transit = md.prepare_abort_or_commit(target, self._clock(), bump_epoch=bump,
                                             transaction_version=2 if bump else 1)
        completions: list[asyncio.Task] = []

        def start() -> None:
            completions.append(self._completions.start(part, md, transit, from_client=True, started=started))

        waits = self.config.txn_end_completion_wait_ms > 0
        # The markers after the answer (services.common.after_answer), unless the answer
        # waits for them.
        err = await self._store.append(part, md, transit, start if waits else lambda: after_answer(start))
        if err:
            return EndTxnResult(err)
        if waits:
            await self._completions.wait(completions, self.config.txn_end_completion_wait_ms)
        return EndTxnResult(ErrorCode.NONE, transit.producer_id, transit.producer_epoch)

    @staticmethod
    def _end_txn_outcome(md: TransactionMetadata, committed: bool) -> EndTxnResult:
        """The answer to an EndTxn when no transaction is ongoing (`md.end_txn_outcome`)."""
        err = md.end_txn_outcome(committed)
        return EndTxnResult(err, md.producer_id, md.producer_epoch) if err == ErrorCode.NONE else EndTxnResult(err)

    async def prepare_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          group_id: str = "", generation_id: int = -1) -> ErrorCode:
        """PrepareTxn: two-phase commit in the spirit of KIP-939. Seals the ongoing
        transaction: it stays Ongoing (its data below the LSO stays undecided), later
        AddPartitionsToTxn / AddOffsetsToTxn get INVALID_TXN_STATE, and the coordinator
        never aborts it by itself (no transaction.timeout.ms, nor any other time: its
        transaction manager or an operator decides). The prepared timestamp is appended
        to the transaction log, so it survives coordinator restart and failover. EndTxn
        with the same PID and epoch, from any process, completes it; InitProducerId of the
        transactional.id aborts it with an epoch bump (fencing), as for any ongoing
        transaction, or, with keep_prepared_txn, keeps it under a new client-facing epoch.

        Answers NONE (also when already prepared: a retry); without a transaction in
        progress an empty one is started and sealed. Like AddPartitionsToTxn it first
        waits for the producer's previous transaction to complete, and answers
        CONCURRENT_TRANSACTIONS (retriable) while that one is still PrepareCommit /
        PrepareAbort: the wait ran out, or a handover add of the next transaction
        woke with this request and takes over after it. INVALID_PRODUCER_ID_MAPPING,
        PRODUCER_FENCED (another epoch), NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
        COORDINATOR_NOT_AVAILABLE as EndTxn; ILLEGAL_GENERATION (group-aware)."""
        await self._completions.wait_previous(transactional_id, group_id)
        err, part, md = self._check_producer(transactional_id, producer_id, producer_epoch, group_id,
                                             generation_id)
        if err:
            return err
        if md.is_prepared:
            return ErrorCode.NONE
        if md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS  # the previous transaction is still completing
        if md.state not in COMPLETED_STATES and md.state is not TxnState.ONGOING:
            return ErrorCode.INVALID_TXN_STATE
        if md.state in COMPLETED_STATES and md.is_producer_epoch_exhausted:
            return ErrorCode.INVALID_PRODUCER_EPOCH  # as AddPartitionsToTxn: InitProducerId first
        return await self._store.append(part, md, md.prepare_mark_prepared(self._clock()))

