"""The write path of a partition leader: Produce and CoordinatorProduce as a pipeline
of named gates, and WriteTxnMarkers (docs/design.md, "Partition leader modules";
Kafka's ReplicaManager.appendRecords with DelayedProduce).

The adapter (a servicer) builds one frozen `ProduceContext` per request
(`ProduceContext.client` or `.coordinator`) and passes it with the entries
(`ReplicaManager.append_records(ctx, entries)`). Each entry becomes a `ProduceBatch`
at the first gate, and every later gate has one shape: `gate(ctx, batch) ->
AppendResult | None`, the refusal or nothing. In this order:

1. `validate`: the request and the batch alone — required acks, internal topic vs
   origin, the batch's shape (`partition.ValidatedBatch.check`: CRC32C, framing, record
   count, control bit, codec, producer epoch range, a transactional batch needs a
   producer id). It returns the `ProduceBatch` (or the refusal). Nothing else is
   asked before these pass, so a malformed batch never reaches a transaction
   coordinator.
2. `authorize`: with the authorizer on, the producer id must be bound to the caller
   (services/common/security/pid_binding.py).
3. Under the producer's lock (one producer's batches on one partition go in arrival
   order): the leader replica, its lease confirmed (`leader`, which sets the
   batch's replica), and `check_size`, the batch's size (`max.message.bytes`);
4. `writer_claim`: a coordinator's plain batch with a writer id must carry the
   ZooKeeper claim's writer id (docs/design.md, "Coordinator ownership");
5. `verify`: a batch that would start its producer's transaction on the partition
   (`verification_guard` not None) is confirmed (KIP-890 part 1) or added (part 2)
   at the transaction coordinator — or, for a coordinator's transactional offset
   commit the group coordinator verified, taken as verified
   (`ProduceContext.verified_from`, Kafka's verificationGuards);
6. append: `Partition.append` of the validated batch, with the verification guard;
7. `await_acks`: acks=all waits for the high watermark, acks 1 and all confirm the
   lease (outside the producer's lock).

Not thread-safe: runs on the service's event loop.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition

from services.common.transport import limits
from services.common.cluster.ownership import RETIRED_WRITER_EPOCH
from services.common.cluster.state import ZOOKEEPER_ERRORS
from services.common.protocol import CONSUMER_OFFSETS_TOPIC

from .partition import ACKS_ALL, AppendResult, MarkerResult, Partition, ValidatedBatch
from .purgatory import HIGH_WATERMARK, Watch
from .replicas import HostedReplicas, positions

log = logging.getLogger(__name__)

VALID_ACKS = (0, 1, -1)
# How long the writer-claim gate waits for ZooKeeper without a lease length (ms).
CLAIM_READ_TIMEOUT_MS = 5000
DEFAULT_PRODUCE_TIMEOUT_MS = 30000
NOT_VERIFIED = -1


class ProduceEntry(NamedTuple):
    """One partition's data of a Produce: a single record batch v2, raw bytes."""

    topic: str
    partition: int
    records: bytes


class MarkerEntry(NamedTuple):
    """One transaction marker of a WriteTxnMarkers for `partitions` ((topic, partition) pairs)."""

    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int
    partitions: tuple[TopicPartition, ...]
    transaction_version: int = 1  # 2: ends the transaction under the next epoch (KIP-890 part 2)


@dataclass(frozen=True, slots=True)
class ProduceContext:
    """What every gate of one Produce needs, built once per request by the adapter
    (`client` / `coordinator`).

    acks: 0, 1 or -1 (all); deadline: monotonic seconds bounding the whole request
    (`produce_deadline`); internal_only: a coordinator's CoordinatorProduce (writes
    only internal topics) rather than a client's Produce (never internal topics);
    transactional_id: the producer's, for verification; consumer_group_id: a
    group-aware producer's group (KIP-447 draft); principal: the caller, for
    producer-id bindings; add: KIP-890 part 2 implicit add instead of verification;
    verified_from: NOT_VERIFIED (-1), or, on a coordinator's transactional offset
    commit, the offset up to which the group coordinator had applied the partition
    when it verified the transaction itself."""

    acks: int
    deadline: float
    internal_only: bool = False
    transactional_id: str = ""
    consumer_group_id: str = ""
    principal: str | None = None
    add: bool = False
    verified_from: int = NOT_VERIFIED

    @classmethod
    def client(cls, acks: int, deadline: float, transactional_id: str = "", consumer_group_id: str = "",
               principal: str | None = None, add_partitions: bool = False) -> ProduceContext:
        """A client's Produce (never an internal topic). add_partitions (KIP-890 part
        2, a producer of transaction version 2 that sent no AddPartitionsToTxn): the
        leader adds the partition to the producer's transaction instead of verifying
        it; not for a group-aware producer (`consumer_group_id`), which adds its
        partitions itself."""
        return cls(acks, deadline, False, transactional_id, consumer_group_id, principal,
                   add_partitions and not consumer_group_id)

    @classmethod
    def coordinator(cls, acks: int, deadline: float, transactional_id: str = "", consumer_group_id: str = "",
                    verified_from: int = NOT_VERIFIED) -> ProduceContext:
        """A coordinator's CoordinatorProduce (internal topics only; Kafka's
        internal-topics-allowed appends); verified_from as the class says."""
        return cls(acks, deadline, True, transactional_id, consumer_group_id, None, False, verified_from)


def produce_deadline(now_s: float, timeout_ms: int) -> float:
    """The monotonic s a Produce with `timeout_ms` (<= 0: DEFAULT_PRODUCE_TIMEOUT_MS)
    that arrived at `now_s` ends at."""
    return now_s + (timeout_ms if timeout_ms > 0 else DEFAULT_PRODUCE_TIMEOUT_MS) / 1000


@dataclass(frozen=True, slots=True)
class ProduceBatch:
    """One entry of a Produce once `validate` passed it: its partition (topic,
    partition), the validated batch (partition.ValidatedBatch: bytes and header), and
    the leader replica it goes to (None until the `leader` gate found it)."""

    topic: str
    partition: int
    batch: ValidatedBatch
    replica: Partition | None = None

    @property
    def header(self) -> records.BatchHeader:
        return self.batch.header

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def on(self, replica: Partition) -> "ProduceBatch":
        """This entry bound to `replica` (dataclasses.replace without its per-call
        field introspection: once or twice per batch on the write path)."""
        return ProduceBatch(self.topic, self.partition, self.batch, replica)


def _claim_unread(tp: TopicPartition, exc: BaseException) -> str:
    """The message of a write refused because ZooKeeper did not answer the claim read."""
    return f"the coordinator claim on {tp[0]}-{tp[1]} could not be read from ZooKeeper: {exc!r}"


def _backed(claim: tuple[int, int, int], producer_id: int, producer_epoch: int) -> bool:
    writer, epoch, retired = claim
    return (producer_id == writer and producer_epoch <= epoch) or \
        (producer_id == retired and producer_epoch == RETIRED_WRITER_EPOCH)


class ProducePipeline:
    """Appends client and coordinator batches, and markers, to the replicas `hosted`
    leads (its verifier, pid bindings, leases and purgatory are read at call time)."""

    def __init__(self, hosted: HostedReplicas):
        self.hosted = hosted
        # (topic, partition, producer id) -> lock ordering that producer's appends there.
        self._producer_locks: dict[tuple[str, int, int], asyncio.Lock] = {}
        # Coordinator claims on internal partitions: (writer id, writer epoch, retired writer id).
        self._claims: dict[TopicPartition, tuple[int, int, int]] = {}

    async def append(self, ctx: ProduceContext, entries: Sequence[ProduceEntry]) -> list[AppendResult]:
        """Every entry through the gates (see the module docstring), side by side;
        one AppendResult per entry, in order."""
        jobs = [self._append_one(ctx, e) for e in entries]
        if len(jobs) == 1:
            return [await jobs[0]]
        return list(await asyncio.gather(*jobs))

    async def _append_one(self, ctx: ProduceContext, e: ProduceEntry) -> AppendResult:
        """One entry of a Produce. The batches of one producer on one partition are
        appended in the order their requests arrived: a batch waiting for its
        transaction to be verified (KIP-890) holds back the producer's next ones, which
        would otherwise overtake it (a Kafka broker reads one request per connection at
        a time; gRPC runs a client's pipelined requests side by side)."""
        b = self.validate(ctx, e)
        if isinstance(b, AppendResult):
            return b
        if b.header.producer_id < 0:
            appended = await self._append_ordered(ctx, b)
        else:
            key = (b.topic, b.partition, b.header.producer_id)
            lock = self._producer_locks.get(key)
            if lock is None:
                lock = self._producer_locks[key] = asyncio.Lock()
            try:
                # Acquired in arrival order (an uncontended acquire does not yield), before
                # the authorization's await: a first batch whose producer-id binding is
                # being looked up is not overtaken by the next one (which the leader would
                # then refuse as out of sequence).
                async with lock:
                    refused = await self.authorize(ctx, b)
                    appended = refused if refused is not None else await self._append_ordered(ctx, b)
            finally:
                if not lock.locked() and not getattr(lock, "_waiters", None) and \
                        self._producer_locks.get(key) is lock:
                    del self._producer_locks[key]
        if isinstance(appended, AppendResult):
            return appended
        res, p, epoch = appended  # appended here: acknowledge by acks, outside the producer's order
        err = await self.await_acks(p, epoch, ctx.acks, res.last_offset, ctx.deadline)
        return res if err == ErrorCode.NONE else res._replace(error=err, message="")

    # ------------------------------------------------------------ gates
    def validate(self, ctx: ProduceContext, e: ProduceEntry) -> ProduceBatch | AppendResult:
        """Gate 1, no I/O: the entry as a ProduceBatch, or the refusal:
        INVALID_REQUIRED_ACKS, INVALID_TOPIC_EXCEPTION (internal topic vs origin), the
        refusals of `ValidatedBatch.check`, INVALID_RECORD for a transactional batch on
        an internal topic other than the offsets topic."""
        if ctx.acks not in VALID_ACKS:
            return AppendResult(ErrorCode.INVALID_REQUIRED_ACKS)
        if self.hosted.is_internal(e.topic) != ctx.internal_only:
            why = (f"{e.topic} is an internal topic: only its coordinators write it" if not ctx.internal_only
                   else f"{e.topic} is not an internal topic")
            return AppendResult(ErrorCode.INVALID_TOPIC_EXCEPTION, message=why)
        batch = ValidatedBatch.check(e.records)
        if isinstance(batch, AppendResult):
            return batch
        if ctx.internal_only and e.topic != CONSUMER_OFFSETS_TOPIC and batch.header.is_transactional:
            return AppendResult(ErrorCode.INVALID_RECORD, message=f"{e.topic} holds no transactional batches")
        return ProduceBatch(e.topic, e.partition, batch)

    async def authorize(self, ctx: ProduceContext, b: ProduceBatch) -> AppendResult | None:
        """Gate 2: the refusal of a client's batch whose producer id is not bound to the
        caller (services/common/security/pid_binding.py; TRANSACTIONAL_ID_AUTHORIZATION_FAILED or
        CLUSTER_AUTHORIZATION_FAILED, NOT_ENOUGH_REPLICAS when its binding could not be
        checked by the deadline); None when it is, or when bindings are off."""
        bindings = self.hosted.pid_bindings
        if bindings is None or ctx.internal_only:
            return None
        h = b.header
        code, why = await bindings.check(h.producer_id, ctx.principal or "", ctx.transactional_id,
                                         h.is_transactional, ctx.deadline)
        if code == ErrorCode.NONE:
            return None
        return AppendResult(code, message=why)

    async def leader(self, ctx: ProduceContext, b: ProduceBatch) -> ProduceBatch | AppendResult:
        """Gate 3: `b` with the replica of its partition led here, its leadership
        confirmed when acks != 0 (`HostedReplicas.leader_for_write`), or the refusal
        (the errors of `HostedReplicas.get`, NOT_LEADER_OR_FOLLOWER)."""
        p, err = await self.hosted.leader_for_write(b.topic, b.partition, ctx.deadline, confirm=ctx.acks != 0,
                                                    hw_gated=ctx.acks == ACKS_ALL)
        return AppendResult(err) if p is None else b.on(p)

    async def check_size(self, ctx: ProduceContext, b: ProduceBatch) -> AppendResult | None:
        """Gate 3, after `leader`: MESSAGE_TOO_LARGE above the partition's
        `max.message.bytes` (the one size check of the batch)."""
        too_big = limits.validate_batch_size(len(b.batch.data), b.replica.config.max_message_bytes)
        return None if too_big is None else AppendResult(too_big[0], message=too_big[1])

    async def writer_claim(self, ctx: ProduceContext, b: ProduceBatch) -> AppendResult | None:
        """Gate 4: a coordinator's plain batch with a writer id must carry the writer id
        of the ZooKeeper claim on the partition, at most its writer epoch, or the retired
        writer id at the closing epoch (docs/design.md, "Coordinator ownership"): a
        forged batch cannot bump the writer epoch and fence the real owner
        (INVALID_PRODUCER_EPOCH). The claim is cached and read again when a batch goes
        past it (a new owner's fence)."""
        h = b.header
        if not ctx.internal_only or h.producer_id < 0 or h.is_transactional:
            return None  # no writer id; transactional offset commits are verified (KIP-890)
        cached = self._claims.get(b.tp)
        try:
            claim = await self._claim(b.tp, cached is not None and _backed(cached, h.producer_id, h.producer_epoch),
                                      ctx.deadline)
        except ZOOKEEPER_ERRORS as exc:
            # Not appended. Answered as a leader that cannot confirm its leadership: the
            # coordinator takes it as an outcome unknown and loads the partition again
            # (a fence that is refused so makes it answer NOT_COORDINATOR, and clients
            # find the partition's new owner).
            return AppendResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, message=_claim_unread(b.tp, exc))
        if claim is None or _backed(claim, h.producer_id, h.producer_epoch):
            return None
        return AppendResult(ErrorCode.INVALID_PRODUCER_EPOCH,
                            message=f"the writer id and epoch of this batch are not those of the coordinator "
                                    f"claim on {b.topic}-{b.partition}")

    def verification_guard(self, ctx: ProduceContext, b: ProduceBatch) -> object | None:
        """The producer's verification guard on the replica when `b` would start its
        producer's transaction there and must be verified (`verify`); None when it
        needs no verification (or no verifier is set)."""
        hosted = self.hosted
        if hosted.verifier is None or not (ctx.add or hosted.verify_transactions):
            return None
        producers = b.replica.producers
        if not producers.needs_verification(b.header, include_internal=ctx.internal_only):
            return None
        return producers.verification_guard(b.header.producer_id, b.header.producer_epoch)

    async def verify(self, ctx: ProduceContext, b: ProduceBatch) -> AppendResult | None:
        """Gate 5, for a batch with a `verification_guard`: None when it may be
        appended, or the refusal: INVALID_TXN_STATE without a transactional.id or when
        the coordinator does not hold the partition in the producer's transaction,
        INVALID_PRODUCER_EPOCH for another epoch, NOT_ENOUGH_REPLICAS when no
        coordinator answered by the deadline. A coordinator's transactional offset
        commit is verified like a client's batch, so a forged one cannot open a
        transaction that no transaction coordinator will ever end — unless the group
        coordinator verified it already (`ctx.verified_from`) and no marker of the
        producer was appended here since (`ProducerStateManager.marker_since`): then
        that verification stands (Kafka's verificationGuards) and the transaction
        coordinator is not asked again."""
        h = b.header
        if not ctx.transactional_id:
            return AppendResult(ErrorCode.INVALID_TXN_STATE, message=(
                f"transactional batch of producer {h.producer_id} without a transactional.id: "
                "no coordinator knows its transaction"))
        if ctx.internal_only and ctx.verified_from >= 0 and \
                not b.replica.producers.marker_since(h.producer_id, ctx.verified_from):
            return None
        if not ctx.add:
            if b.replica.producers.added_verifies(ctx.transactional_id, h.producer_id, h.producer_epoch):
                # The coordinator said so when it appended the add (TxnPartitionsAdded),
                # and no marker of the producer was appended here since.
                self.hosted.on_verified("noted")
                return None
            self.hosted.on_verified("asked")
        verifier = self.hosted.verifier
        if ctx.add:
            code = await verifier.add(ctx.transactional_id, h.producer_id, h.producer_epoch, b.topic, b.partition,
                                      ctx.deadline)
        else:
            code = await verifier.verify(ctx.transactional_id, h.producer_id, h.producer_epoch, b.topic,
                                         b.partition, ctx.deadline, ctx.consumer_group_id)
        if code == ErrorCode.NONE:
            return None
        what = "could not add" if ctx.add else "does not have"
        return AppendResult(code, message=(
            f"the coordinator of {ctx.transactional_id!r} {what} {b.topic}-{b.partition} in the ongoing "
            f"transaction of producer {h.producer_id} epoch {h.producer_epoch}"))

    async def _append_ordered(self, ctx: ProduceContext, b: ProduceBatch
                              ) -> AppendResult | tuple[AppendResult, Partition, int]:
        """Gates 3-5 (leader and size, writer claim, verification), then the local
        append: an AppendResult when done (an error), or (result, replica, leader
        epoch) to acknowledge by acks."""
        hosted = self.hosted
        b = await self.leader(ctx, b)
        if isinstance(b, AppendResult):
            return b
        for gate in (self.check_size, self.writer_claim):
            refused = await gate(ctx, b)
            if refused is not None:
                return refused
        # An implicit add (KIP-890 part 2) may wait at the coordinator while the
        # producer's previous transaction completes; that transaction's marker then
        # arrives here during the add. Under transaction version 2 it leaves the guard
        # standing (it ends an earlier transaction: VerificationGuard); a marker that
        # may end the batch's own transaction (version 1) makes it stale, and adding
        # again (at once NONE when the partition is in the transaction; fenced when the
        # transaction was aborted and the epoch bumped meanwhile) settles which
        # transaction the batch belongs to.
        for _ in range(3 if ctx.add else 1):
            guard = self.verification_guard(ctx, b)
            if guard is not None:
                refused = await self.verify(ctx, b)
                if refused is not None:
                    return refused
                p, err = hosted.get(b.topic, b.partition)  # leadership may have moved meanwhile
                if p is None:
                    return AppendResult(err)
                b = b.on(p)
            p = b.replica
            epoch = p.leader_epoch
            res, err = hosted.guarded(f"produce to {b.topic}-{b.partition}", p.append, b.batch, ctx.acks, guard)
            if res is None:
                return AppendResult(err)
            if not (guard is not None and res.error == ErrorCode.INVALID_TXN_STATE and
                    p.producers.verification_guards.get(b.header.producer_id) is not guard):
                break
        if res.error == ErrorCode.NONE:
            hosted.on_appended(b.topic, b.batch.data)
            hosted.purgatory.notify(b.tp, positions(p))
        if res.error in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
            return res, p, epoch
        return res

    async def _claim(self, tp: TopicPartition, current: bool, deadline: float) -> tuple[int, int, int] | None:
        """The coordinator claim on internal partition `tp` (None: a cluster view
        without claims, tools and tests); read from ZooKeeper unless cached and `current`,
        waiting for ZooKeeper until `deadline` (monotonic s) and at most a leadership
        lease's length: a coordinator cut off from ZooKeeper must not hold its appends
        (one at a time per partition, the group commit's) until the connection returns.
        Raises ZOOKEEPER_ERRORS when ZooKeeper does not answer."""
        claim = self._claims.get(tp)
        if claim is not None and current:
            return claim
        writer_claim = getattr(self.hosted.cluster, "writer_claim", None)
        if writer_claim is None:
            return None
        lease_s = (self.hosted.lease_ms or CLAIM_READ_TIMEOUT_MS) / 1000
        timeout_s = max(min(deadline - self.hosted.monotonic_s(), lease_s), 0.001)
        claim = self._claims[tp] = await asyncio.to_thread(writer_claim, tp[0], tp[1], timeout_s)
        return claim

    async def _await_high_watermark(self, p: Partition, epoch: int, last_offset: int, deadline: float) -> ErrorCode:
        """Kafka's DelayedProduce: wait until the high watermark passes `last_offset`
        while `p` leads `epoch`. NONE, NOT_ENOUGH_REPLICAS_AFTER_APPEND (the ISR fell
        below min.insync.replicas meanwhile), NOT_LEADER_OR_FOLLOWER (leadership
        moved, or the replica stopped serving, or no lease confirmed it for
        `replica.lag.time.max.ms` while waiting), REQUEST_TIMED_OUT (deadline).

        Without a valid lease (ZooKeeper unreachable from here: `isr_vouches`) the
        wait is bounded by `replica.lag.time.max.ms`: while ZooKeeper is down for every
        process the followers go on fetching and the high watermark moves at once, but
        when only this process is cut off they follow a newer leader and never
        acknowledge, and the writer (a coordinator appending to its own log) must learn
        that well before its request deadline."""
        tp = (p.topic, p.partition)
        hosted = self.hosted
        purgatory = hosted.purgatory
        unconfirmed_until: float | None = None
        while True:
            if not hosted.serves(p) or not p.is_leader or p.leader_epoch != epoch:
                return ErrorCode.NOT_LEADER_OR_FOLLOWER
            if p.high_watermark > last_offset:
                return ErrorCode.NONE if len(p.isr) >= p.min_insync_replicas \
                    else ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
            wait_until = deadline
            if hosted.lease_ms is not None and not hosted.lease_valid(p):
                now = purgatory.clock()
                if unconfirmed_until is None:
                    unconfirmed_until = now + hosted.max_lag_ms / 1000
                if now >= unconfirmed_until:
                    return ErrorCode.NOT_LEADER_OR_FOLLOWER
                wait_until = min(deadline, unconfirmed_until)
            else:
                unconfirmed_until = None
            if not await purgatory.wait((Watch(tp, HIGH_WATERMARK, last_offset),), wait_until) \
                    and purgatory.clock() >= deadline:
                return ErrorCode.REQUEST_TIMED_OUT

    async def await_acks(self, p: Partition, epoch: int, acks: int, last_offset: int, deadline: float) -> ErrorCode:
        """Gate 7, the acknowledgement of an append that succeeded locally: acks=all
        waits for the high watermark; acks 1 and all confirm leadership of `epoch`
        (acks=all not while ZooKeeper is unreachable, `HostedReplicas.isr_vouches`, also
        when the connection is found SUSPENDED during the confirmation)."""
        if acks == ACKS_ALL:
            err = await self._await_high_watermark(p, epoch, last_offset, deadline)
            if err != ErrorCode.NONE:
                return err
        if acks != 0 and not (await self.hosted.confirmed(p, deadline, hw_gated=acks == ACKS_ALL)
                              and p.leader_epoch == epoch):
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.NONE

    # ------------------------------------------------------------ markers
    async def write_markers(self, markers: Sequence[MarkerEntry], deadline: float) -> list[list[MarkerResult]]:
        """WriteTxnMarkers (see `ReplicaManager.write_markers`); deadline: monotonic s."""
        jobs = [self._marker_one(m, topic, partition, deadline) for m in markers for topic, partition in m.partitions]
        flat = [await jobs[0]] if len(jobs) == 1 else list(await asyncio.gather(*jobs))
        out, i = [], 0
        for m in markers:
            out.append(flat[i:i + len(m.partitions)])
            i += len(m.partitions)
        return out

    async def _internal_marker_refused(self, m: MarkerEntry, topic: str, partition: int,
                                       deadline: float) -> MarkerResult | None:
        """`TRANSACTION_STATE_TOPIC` holds no transactions, so no markers; on
        `CONSUMER_CONSUMER_OFFSETS_TOPIC` a marker may not name a coordinator's writer id (a marker
        bumps its producer's epoch, which would fence the owning coordinator). A claim
        ZooKeeper does not answer for (none cached) refuses the marker NOT_LEADER_OR_FOLLOWER,
        retriable."""
        if topic != CONSUMER_OFFSETS_TOPIC:
            return MarkerResult(ErrorCode.INVALID_REQUEST, message=f"{topic} holds no transactions")
        try:
            claim = await self._claim((topic, partition), True, deadline)  # kept current by writer_claim
        except ZOOKEEPER_ERRORS as exc:
            return MarkerResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, message=_claim_unread((topic, partition), exc))
        if claim is None:
            return None
        writer, _epoch, retired = claim
        if m.producer_id in (writer, retired):
            return MarkerResult(ErrorCode.INVALID_REQUEST,
                                message=f"producer id {m.producer_id} is the coordinator's writer id of {topic}-{partition}")
        return None

    async def _marker_one(self, m: MarkerEntry, topic: str, partition: int, deadline: float) -> MarkerResult:
        hosted = self.hosted
        if hosted.is_internal(topic):
            refused = await self._internal_marker_refused(m, topic, partition, deadline)
            if refused is not None:
                return refused
        p, err = await hosted.leader_for_write(topic, partition, deadline, confirm=True, hw_gated=True)
        if p is None:
            return MarkerResult(err)
        if hosted.monotonic_s() >= deadline:
            return MarkerResult(ErrorCode.REQUEST_TIMED_OUT, message=(
                f"marker for producer {m.producer_id} epoch {m.producer_epoch} on {topic}-{partition} not "
                "appended: the request's deadline passed first"))
        epoch = p.leader_epoch
        res, err = hosted.guarded(f"marker on {topic}-{partition}", p.write_marker, m.producer_id,
                                   m.producer_epoch, m.committed, m.coordinator_epoch, m.transaction_version)
        if res is None:
            return MarkerResult(err)
        if res.error == ErrorCode.NONE:
            hosted.purgatory.notify((topic, partition), positions(p))
            err = await self.await_acks(p, epoch, ACKS_ALL, res.offset, deadline)
            if err != ErrorCode.NONE:
                res = res._replace(error=err, message="")
        return res
