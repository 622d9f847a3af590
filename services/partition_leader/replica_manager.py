"""Request serving over the replicas this process hosts (`replicas.HostedReplicas`):
Produce, WriteTxnMarkers, Fetch (consumers' and followers'), OffsetForLeaderEpoch and
DeleteRecords (docs/design.md, "Partition leader modules").

Replica fetches (`fetch_for_follower`) and OffsetForLeaderEpoch
(`end_offset_for_epoch`) go to the leader replica. Not thread-safe: the service
calls it from its event loop only.
"""
from __future__ import annotations

import asyncio
import sys
from typing import Hashable, NamedTuple, Sequence

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition

from services.common.ownership import RETIRED_WRITER_EPOCH

from .leader_epoch import UNDEFINED_EPOCH, UNDEFINED_OFFSET, EpochEndOffset
from .partition import ACKS_ALL, READ_COMMITTED, AppendResult, FetchResult, MarkerResult, Partition, ReplicaFetchResult
from .purgatory import HIGH_WATERMARK, LAST_STABLE, LOG_END, Watch
from .replicas import ClusterView, HostedReplicas, Leases, guarded, positions

__all__ = ["ClusterView", "FetchEntry", "Leases", "MarkerEntry", "ProduceEntry", "ReplicaManager", "TopicPartition",
           "guarded", "positions"]

DEFAULT_FETCH_MAX_BYTES = 52428800  # Kafka's fetch.max.bytes
DEFAULT_PARTITION_MAX_BYTES = 1048576  # Kafka's max.partition.fetch.bytes
VALID_ACKS = (0, 1, -1)
DEFAULT_PRODUCE_TIMEOUT_MS = 30000
MARKER_TIMEOUT_MS = 25000  # below the coordinators' 30 s WriteTxnMarkers deadline


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


class FetchEntry(NamedTuple):
    """One partition of a Fetch: where to read and at most how many bytes (0: Kafka's
    max.partition.fetch.bytes default); current_leader_epoch -1 skips the epoch check."""

    topic: str
    partition: int
    fetch_offset: int
    max_bytes: int = 0
    current_leader_epoch: int = -1


OFFSETS_TOPIC = "__consumer_offsets"


def _is_transactional(batch: bytes) -> bool:
    try:
        return records.parse_header(batch).is_transactional
    except records.CorruptRecordError:
        return False  # Partition.append answers CORRUPT_MESSAGE


def _backed(claim: tuple[int, int, int], producer_id: int, producer_epoch: int) -> bool:
    writer, epoch, retired = claim
    return (producer_id == writer and producer_epoch <= epoch) or \
        (producer_id == retired and producer_epoch == RETIRED_WRITER_EPOCH)


class ReplicaManager(HostedReplicas):
    """The requests a partition leader process serves, over its hosted replicas
    (constructor: see `HostedReplicas`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # (topic, partition, producer id) -> lock ordering that producer's appends there.
        self._producer_locks: dict[tuple[str, int, int], asyncio.Lock] = {}
        # Coordinator claims on internal partitions: (writer id, writer epoch, retired writer id).
        self._claims: dict[TopicPartition, tuple[int, int, int]] = {}

    # ------------------------------------------------------------ requests
    def delete_records(self, topic: str, partition: int, offset: int) -> tuple[ErrorCode, int, str]:
        """DeleteRecords on a partition led here: (error, log start offset, message).
        Moves the log start offset (`Partition.delete_records`) and deletes the
        segments wholly below it right away. Errors: those of `get`;
        INVALID_TOPIC_EXCEPTION for an internal topic (compaction keeps them small);
        OFFSET_OUT_OF_RANGE above the high watermark."""
        if self.is_internal(topic):
            return ErrorCode.INVALID_TOPIC_EXCEPTION, -1, f"records of the internal topic {topic} cannot be deleted"
        p, err = self.get(topic, partition)
        if p is None:
            return err, -1, ""
        res, err = self._guarded(f"DeleteRecords on {topic}-{partition}", p.delete_records, offset)
        if res is None:
            return err, -1, ""
        code, low = res
        if code != ErrorCode.NONE:
            return code, low, (f"offset {offset} is above the high watermark {p.high_watermark}"
                               if code == ErrorCode.OFFSET_OUT_OF_RANGE else "")
        self._guarded(f"deleting segments of {topic}-{partition}", p.delete_old_segments)
        self.purgatory.notify((topic, partition))
        return ErrorCode.NONE, p.log_start_offset, ""

    def fetch_for_follower(self, topic: str, partition: int, replica_id: str, offset: int, max_bytes: int,
                           current_leader_epoch: int = -1) -> ReplicaFetchResult:
        """A follower's fetch (see `Partition.fetch_for_follower`); asks for an ISR
        update (`on_isr_update`) when the follower caught up outside the ISR.
        UNKNOWN_TOPIC_OR_PARTITION / NOT_LEADER_OR_FOLLOWER when not led here."""
        p, err = self.leader_replica(topic, partition)
        if p is None:
            return ReplicaFetchResult(err)
        res = p.fetch_for_follower(replica_id, offset, max_bytes, current_leader_epoch)
        if res.error == ErrorCode.NONE and self.on_isr_update is not None and \
                p.isr_expand_candidate(replica_id, self.max_lag_ms) is not None:
            self.on_isr_update((topic, partition))
        return res

    def end_offset_for_epoch(self, topic: str, partition: int, leader_epoch: int,
                             current_leader_epoch: int = -1) -> tuple[ErrorCode, EpochEndOffset]:
        """OffsetForLeaderEpoch (see `Partition.end_offset_for_epoch`)."""
        p, err = self.leader_replica(topic, partition)
        if p is None:
            return err, EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET)
        return p.end_offset_for_epoch(leader_epoch, current_leader_epoch)

    # ------------------------------------------------------------ delayed produce and fetch
    async def _await_high_watermark(self, p: Partition, epoch: int, last_offset: int, deadline: float) -> ErrorCode:
        """Kafka's DelayedProduce: wait until the high watermark passes `last_offset`
        while `p` leads `epoch`. NONE, NOT_ENOUGH_REPLICAS_AFTER_APPEND (the ISR fell
        below min.insync.replicas meanwhile), NOT_LEADER_OR_FOLLOWER (leadership
        moved), REQUEST_TIMED_OUT (deadline)."""
        tp = (p.topic, p.partition)
        while True:
            if not self.serves(p) or not p.is_leader or p.leader_epoch != epoch:
                return ErrorCode.NOT_LEADER_OR_FOLLOWER
            if p.high_watermark > last_offset:
                return ErrorCode.NONE if len(p.isr) >= p.min_insync_replicas \
                    else ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
            if not await self.purgatory.wait((Watch(tp, HIGH_WATERMARK, last_offset),), deadline) \
                    and self.purgatory.clock() >= deadline:
                return ErrorCode.REQUEST_TIMED_OUT

    async def _complete(self, p: Partition, epoch: int, acks: int, last_offset: int, deadline: float) -> ErrorCode:
        """The acknowledgement of an append that succeeded locally: acks=all waits
        for the high watermark; acks 1 and all confirm leadership of `epoch` (acks=all
        not while ZooKeeper is unreachable, `_isr_vouches`)."""
        if acks == ACKS_ALL:
            err = await self._await_high_watermark(p, epoch, last_offset, deadline)
            if err != ErrorCode.NONE:
                return err
            if self.isr_vouches(p, True) and p.leader_epoch == epoch:
                return ErrorCode.NONE
        if acks != 0 and not (await self.confirmed(p, deadline) and p.leader_epoch == epoch):
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.NONE

    async def append_records(self, acks: int, entries: Sequence[ProduceEntry],
                             timeout_ms: int = DEFAULT_PRODUCE_TIMEOUT_MS, *,
                             origin: str = "client", transactional_id: str = "",
                             consumer_group_id: str = "", principal: str | None = None,
                             add_partitions: bool = False) -> list[AppendResult]:
        """Produce (design doc "Client-Broker request handling", produce; Kafka's
        ReplicaManager.appendRecords): append each entry's batch to the partition led
        here and acknowledge it by `acks`: 0 at once, 1 after the local append, -1
        (all) once the high watermark passed it. Before appending and before
        acknowledging (acks != 0) the leader confirms its lease. timeout_ms (<= 0:
        30000) bounds the whole request. origin "client" (Produce) may not write
        internal topics, "coordinator" (CoordinatorProduce) writes only internal
        topics (Kafka's internal-topics-allowed appends): INVALID_TOPIC_EXCEPTION
        otherwise, so a client can never forge a coordinator's record. With a
        verifier, a client batch that would start its producer's transaction on a
        partition is appended only after the coordinator of `transactional_id`
        confirmed the partition is in that transaction (KIP-890 part 1;
        INVALID_TXN_STATE without transactional_id or when it is not,
        INVALID_PRODUCER_EPOCH for another epoch); `consumer_group_id` names a
        group-aware producer's group, whose coordinator holds its transaction (KIP-447
        draft). `add_partitions` (KIP-890 part 2, a producer of transaction version
        2 that sent no AddPartitionsToTxn): instead of verifying, the leader adds the
        partition to the producer's transaction at its coordinator (TxnVerifier.add),
        INVALID_PRODUCER_EPOCH when the coordinator holds another epoch (a late batch
        of an ended transaction); not for a group-aware producer, which adds its
        partitions itself. With `pid_bindings` set (authorizer on), a client's idempotent or
        transactional batch is appended only when its producer id is bound to
        `principal` (and, transactional, to `transactional_id`): otherwise
        TRANSACTIONAL_ID_AUTHORIZATION_FAILED or CLUSTER_AUTHORIZATION_FAILED before the
        producer state is touched (services/common/pid_binding.py; NOT_ENOUGH_REPLICAS
        while the binding cannot be checked). Returns one
        AppendResult per entry, in order: INVALID_REQUIRED_ACKS,
        INVALID_TOPIC_EXCEPTION, the errors of `get()` and `Partition.append`,
        and after a local append NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        NOT_LEADER_OR_FOLLOWER or REQUEST_TIMED_OUT (offsets kept)."""
        deadline = self.monotonic_s() + (timeout_ms if timeout_ms > 0 else DEFAULT_PRODUCE_TIMEOUT_MS) / 1000
        if origin not in ("client", "coordinator"):
            raise ValueError(f"unknown append origin {origin!r}")
        add = add_partitions and not consumer_group_id and origin == "client"
        jobs = [self._append_one(acks, e, deadline, origin == "coordinator", transactional_id, consumer_group_id,
                                 principal, add) for e in entries]
        if len(jobs) == 1:
            return [await jobs[0]]
        return list(await asyncio.gather(*jobs))

    async def _append_one(self, acks: int, e: ProduceEntry, deadline: float, internal_only: bool,
                          transactional_id: str = "", consumer_group_id: str = "",
                          principal: str | None = None, add: bool = False) -> AppendResult:
        """One entry of a Produce. The batches of one producer on one partition are
        appended in the order their requests arrived: a batch waiting for its
        transaction to be verified (KIP-890) holds back the producer's next ones, which
        would otherwise overtake it (a Kafka broker reads one request per connection at
        a time; gRPC runs a client's pipelined requests side by side)."""
        try:
            pid = records.parse_header(e.records).producer_id
        except records.CorruptRecordError:
            pid = -1
        if pid < 0:
            appended = await self._append_ordered(acks, e, deadline, internal_only, transactional_id,
                                                  consumer_group_id, add)
        elif (refused := await self._unbound(e, pid, internal_only, transactional_id, principal,
                                             deadline)) is not None:
            return refused
        else:
            key = (e.topic, e.partition, pid)
            lock = self._producer_locks.get(key)
            if lock is None:
                lock = self._producer_locks[key] = asyncio.Lock()
            try:
                async with lock:  # acquired in arrival order: an uncontended acquire does not yield
                    appended = await self._append_ordered(acks, e, deadline, internal_only, transactional_id,
                                                          consumer_group_id, add)
            finally:
                if not lock.locked() and not getattr(lock, "_waiters", None) and \
                        self._producer_locks.get(key) is lock:
                    del self._producer_locks[key]
        if isinstance(appended, AppendResult):
            return appended
        res, p, epoch = appended  # appended here: acknowledge by acks, outside the producer's order
        err = await self._complete(p, epoch, acks, res.last_offset, deadline)
        return res if err == ErrorCode.NONE else res._replace(error=err, message="")

    async def _append_ordered(self, acks: int, e: ProduceEntry, deadline: float, internal_only: bool,
                              transactional_id: str = "", consumer_group_id: str = "", add: bool = False
                              ) -> AppendResult | tuple[AppendResult, Partition, int]:
        """Checks, verification and the local append: an AppendResult when done (an
        error), or (result, partition, leader epoch) to acknowledge by acks."""
        if acks not in VALID_ACKS:
            return AppendResult(ErrorCode.INVALID_REQUIRED_ACKS)
        if self.is_internal(e.topic) != internal_only:
            why = (f"{e.topic} is an internal topic: only its coordinators write it" if not internal_only
                   else f"{e.topic} is not an internal topic")
            return AppendResult(ErrorCode.INVALID_TOPIC_EXCEPTION, message=why)
        p, err = await self.leader_for_write(e.topic, e.partition, deadline, confirm=acks != 0,
                                              hw_gated=acks == ACKS_ALL)
        if p is None:
            return AppendResult(err)
        guard = None
        if internal_only and e.topic != OFFSETS_TOPIC and _is_transactional(e.records):
            return AppendResult(ErrorCode.INVALID_RECORD, message=f"{e.topic} holds no transactional batches")
        if internal_only and not await self._writer_backed(e):
            return AppendResult(ErrorCode.INVALID_PRODUCER_EPOCH,
                                message=f"the writer id and epoch of this batch are not those of the coordinator "
                                        f"claim on {e.topic}-{e.partition}")
        # An implicit add (KIP-890 part 2) may wait at the coordinator while the
        # producer's previous transaction completes; that transaction's marker then
        # arrives here during the add and makes its guard stale. Adding again (at once
        # NONE when the partition is in the transaction; fenced when the transaction
        # was aborted and the epoch bumped meanwhile) settles which transaction the
        # batch belongs to.
        for _ in range(3 if add else 1):
            if self.verifier is not None and (add or self.verify_transactions):
                guard, refused = await self._verify(p, e, transactional_id, deadline, consumer_group_id,
                                                    internal_only, add)
                if refused is not None:
                    return refused
                p, err = self.get(e.topic, e.partition)  # leadership may have moved meanwhile
                if p is None:
                    return AppendResult(err)
            epoch = p.leader_epoch
            res, err = self._guarded(f"produce to {e.topic}-{e.partition}", p.append, e.records, acks, guard)
            if res is None:
                return AppendResult(err)
            if not (guard is not None and res.error == ErrorCode.INVALID_TXN_STATE and
                    p.producers.verification_guards.get(records.parse_header(e.records).producer_id) is not guard):
                break
        if res.error == ErrorCode.NONE:
            self.on_appended(e.topic, e.records)
            self.purgatory.notify((e.topic, e.partition), positions(p))
        if res.error in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
            return res, p, epoch
        return res

    async def _internal_marker_refused(self, m: MarkerEntry, topic: str, partition: int) -> MarkerResult | None:
        """`__transaction_state` holds no transactions, so no markers; on
        `__consumer_offsets` a marker may not name a coordinator's writer id (a marker
        bumps its producer's epoch, which would fence the owning coordinator)."""
        if topic != OFFSETS_TOPIC:
            return MarkerResult(ErrorCode.INVALID_REQUEST, message=f"{topic} holds no transactions")
        writer_claim = getattr(self.cluster, "writer_claim", None)
        if writer_claim is None:
            return None
        claim = self._claims.get((topic, partition))  # kept current by _writer_backed
        if claim is None:
            claim = self._claims[(topic, partition)] = await asyncio.to_thread(writer_claim, topic, partition)
        writer, _epoch, retired = claim
        if m.producer_id in (writer, retired):
            return MarkerResult(ErrorCode.INVALID_REQUEST,
                                message=f"producer id {m.producer_id} is the coordinator's writer id of {topic}-{partition}")
        return None

    async def _unbound(self, e: ProduceEntry, producer_id: int, internal_only: bool, transactional_id: str,
                       principal: str | None, deadline: float) -> AppendResult | None:
        """The refusal of a client's batch whose producer id is not bound to the caller
        (services/common/pid_binding.py; NOT_ENOUGH_REPLICAS when its binding could not
        be checked by `deadline`, monotonic seconds); None when it is, or when bindings
        are off."""
        if self.pid_bindings is None or internal_only:
            return None
        transactional = _is_transactional(e.records)
        code, why = await self.pid_bindings.check(producer_id, principal or "", transactional_id, transactional,
                                                  deadline)
        if code == ErrorCode.NONE:
            return None
        return AppendResult(code, message=why)

    async def _writer_backed(self, e: ProduceEntry) -> bool:
        """A coordinator's plain batch with a writer id must carry the writer id of the
        ZooKeeper claim on the partition, at most its writer epoch, or the retired
        writer id at the closing epoch (docs/design.md, "Coordinator ownership"): a
        forged batch cannot bump the writer epoch and fence the real owner. The claim
        is cached and read again when a batch goes past it (a new owner's fence)."""
        try:
            h = records.parse_header(e.records)
        except records.CorruptRecordError:
            return True  # refused by the partition with CORRUPT_MESSAGE
        if h.producer_id < 0 or h.is_transactional:
            return True  # no writer id; transactional offset commits are verified (KIP-890)
        key = (e.topic, e.partition)
        claim = self._claims.get(key)
        if claim is None or not _backed(claim, h.producer_id, h.producer_epoch):
            writer_claim = getattr(self.cluster, "writer_claim", None)
            if writer_claim is None:
                return True  # a cluster view without claims (tools, tests)
            claim = await asyncio.to_thread(writer_claim, e.topic, e.partition)
            self._claims[key] = claim
        return _backed(claim, h.producer_id, h.producer_epoch)

    async def _verify(self, p: Partition, e: ProduceEntry, transactional_id: str, deadline: float,
                      consumer_group_id: str = "", internal: bool = False, add: bool = False
                      ) -> tuple[object | None, AppendResult | None]:
        """(guard, None) when the batch may be appended (guard None: it starts no
        transaction), or (None, refusal). `internal`: a coordinator's append (a
        transactional offset commit to `__consumer_offsets` is verified like a
        client's batch, so a forged one cannot open a transaction that no
        transaction coordinator will ever end)."""
        try:
            h = records.parse_header(e.records)
        except records.CorruptRecordError:
            return None, None  # Partition.append answers CORRUPT_MESSAGE
        if not p.producers.needs_verification(h, include_internal=internal):
            return None, None
        if not transactional_id:
            return None, AppendResult(ErrorCode.INVALID_TXN_STATE, message=(
                f"transactional batch of producer {h.producer_id} without a transactional.id: "
                "no coordinator knows its transaction"))
        guard = p.producers.verification_guard(h.producer_id)
        if add:
            code = await self.verifier.add(transactional_id, h.producer_id, h.producer_epoch, e.topic, e.partition,
                                           deadline)
        else:
            code = await self.verifier.verify(transactional_id, h.producer_id, h.producer_epoch, e.topic,
                                              e.partition, deadline, consumer_group_id)
        if code != ErrorCode.NONE:
            what = "could not add" if add else "does not have"
            return None, AppendResult(code, message=(
                f"the coordinator of {transactional_id!r} {what} {e.topic}-{e.partition} in the ongoing "
                f"transaction of producer {h.producer_id} epoch {h.producer_epoch}"))
        return guard, None

    async def write_markers(self, markers: Sequence[MarkerEntry],
                            timeout_ms: int = MARKER_TIMEOUT_MS) -> list[list[MarkerResult]]:
        """WriteTxnMarkers (design doc "Coordinator-Broker request handling"): append
        each marker to each of its partitions led here (see `Partition.write_marker`)
        and acknowledge as acks=all. Markers of one partition are appended in request
        order (each append happens before its first wait). A marker that could not be
        appended within `timeout_ms` of the request's arrival (waiting for the
        leadership lease, or for ZooKeeper on `__consumer_offsets`) is not appended
        at all and answers REQUEST_TIMED_OUT: the coordinator may have given up on the
        request and written the marker again, and under transaction version 1 (no
        epoch bump) a marker applied that late could end the producer's next
        transaction. Returns, per marker, one MarkerResult per partition in order."""
        deadline = self.monotonic_s() + timeout_ms / 1000
        jobs = [self._marker_one(m, topic, partition, deadline) for m in markers for topic, partition in m.partitions]
        flat = list(await asyncio.gather(*jobs))
        out, i = [], 0
        for m in markers:
            out.append(flat[i:i + len(m.partitions)])
            i += len(m.partitions)
        return out

    async def _marker_one(self, m: MarkerEntry, topic: str, partition: int, deadline: float) -> MarkerResult:
        if self.is_internal(topic):
            refused = await self._internal_marker_refused(m, topic, partition)
            if refused is not None:
                return refused
        p, err = await self.leader_for_write(topic, partition, deadline, confirm=True, hw_gated=True)
        if p is None:
            return MarkerResult(err)
        if self.monotonic_s() >= deadline:
            return MarkerResult(ErrorCode.REQUEST_TIMED_OUT, message=(
                f"marker for producer {m.producer_id} epoch {m.producer_epoch} on {topic}-{partition} not "
                "appended: the request's deadline passed first"))
        epoch = p.leader_epoch
        res, err = self._guarded(f"marker on {topic}-{partition}", p.write_marker, m.producer_id, m.producer_epoch,
                           m.committed, m.coordinator_epoch, m.transaction_version)
        if res is None:
            return MarkerResult(err)
        if res.error == ErrorCode.NONE:
            self.purgatory.notify((topic, partition), positions(p))
            err = await self._complete(p, epoch, ACKS_ALL, res.offset, deadline)
            if err != ErrorCode.NONE:
                res = res._replace(error=err, message="")
        return res

    async def fetch_messages(self, entries: Sequence[FetchEntry], *, max_wait_ms: int = 0, min_bytes: int = 1,
                             max_bytes: int = 0, isolation_level: int = 0, replica_id: str = "",
                             owner: Hashable | None = None) -> list[FetchResult | ReplicaFetchResult]:
        """Fetch (design doc "Client-Broker request handling", fetch; Kafka's
        ReplicaManager.fetchMessages with DelayedFetch): read every entry once; when
        fewer than `min_bytes` (at least 1) bytes came back and no partition failed,
        wait up to `max_wait_ms` for an append, marker or high-watermark move on one
        of them and read again. max_bytes (0: 52428800) bounds the whole answer,
        each entry's max_bytes its partition. With `replica_id` the fetch is a
        follower's (`fetch_for_follower`, ReplicaFetchResult per entry); otherwise
        a consumer's at `isolation_level` (FetchResult per entry).

        A consumer's wait is cut to `fetch.max.wait.ms`, and parks only while
        `owner` (the principal, or the connection for User:ANONYMOUS; None: not
        counted) has fewer than `exactly.fetch.max.parked.per.principal` parked
        fetches; beyond that it is answered at once. The wait wakes when a position
        passes an entry's offset: the log end for a follower, the high watermark
        (read_uncommitted) or the last stable offset (read_committed) for a consumer
        (docs/design.md, "Tunnel and fetch limits")."""
        if not replica_id:
            max_wait_ms = min(max_wait_ms, self.fetch_max_wait_ms)
        deadline = self.monotonic_s() + max(max_wait_ms, 0) / 1000
        min_bytes = max(min_bytes, 1)
        bound = LOG_END if replica_id else LAST_STABLE if isolation_level == READ_COMMITTED else HIGH_WATERMARK
        while True:
            results, total, failed = self._read_once(entries, max_bytes, isolation_level, replica_id)
            if total >= min_bytes or failed or self.monotonic_s() >= deadline:
                return results
            # What was readable has been read: wait for the position to pass where it is now.
            watches = [Watch((e.topic, e.partition), bound, max(e.fetch_offset, self._position(e, bound)))
                       for e in entries]
            if not await self.purgatory.wait(watches, deadline, None if replica_id else owner):
                return self._read_once(entries, max_bytes, isolation_level, replica_id)[0]

    def _position(self, e: FetchEntry, bound: str) -> int:
        """Position `bound` (purgatory.LOG_END, ...) of the partition of `e` (-1: not here)."""
        p = self.serving.get((e.topic, e.partition))
        return -1 if p is None else positions(p)[bound]

    def _read_once(self, entries: Sequence[FetchEntry], max_bytes: int, isolation_level: int,
                   replica_id: str) -> tuple[list, int, bool]:
        budget = max_bytes if max_bytes > 0 else DEFAULT_FETCH_MAX_BYTES
        total, failed = 0, False
        results: list = []
        for e in entries:
            limit = min(e.max_bytes if e.max_bytes > 0 else DEFAULT_PARTITION_MAX_BYTES, budget - total)
            if replica_id:
                res, err = self._guarded(f"replica fetch from {e.topic}-{e.partition}", self.fetch_for_follower,
                                   e.topic, e.partition, replica_id, e.fetch_offset, limit, e.current_leader_epoch)
                if res is None:
                    res = ReplicaFetchResult(err)
                if res.hw_changed:
                    leader = self.serving.get((e.topic, e.partition))
                    # The followers learn the new high watermark from their next answer: wake
                    # them (LOG_END past every offset), and the consumers it lets read.
                    self.purgatory.notify((e.topic, e.partition), None if leader is None else
                                          {**positions(leader), LOG_END: sys.maxsize})
            else:
                p, err = self.get(e.topic, e.partition)
                res = None
                if p is not None:
                    res, err = self._guarded(f"fetch from {e.topic}-{e.partition}", p.fetch, e.fetch_offset, limit,
                                       isolation_level, e.current_leader_epoch)
                if res is None:
                    res = FetchResult(err)
                elif isolation_level != READ_COMMITTED and res.aborted:
                    res = res._replace(aborted=())
            results.append(res)
            if res.error != ErrorCode.NONE:
                failed = True
            else:
                total += len(res.records)
        return results, total, failed
