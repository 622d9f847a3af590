"""Request serving over the replicas this process hosts (`replicas.HostedReplicas`):
Produce, WriteTxnMarkers, Fetch (consumers' and followers'), OffsetForLeaderEpoch and
DeleteRecords (docs/design.md, "Partition leader modules").

Replica fetches (`fetch_for_follower`) and OffsetForLeaderEpoch
(`end_offset_for_epoch`) go to the leader replica. Not thread-safe: the service
calls it from its event loop only.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Hashable, NamedTuple, Sequence

from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from services.common.protocol import marker_leader_deadline_s

from .leader_epoch import UNDEFINED_EPOCH, UNDEFINED_OFFSET, EpochEndOffset
from .partition import READ_COMMITTED, AppendResult, FetchResult, MarkerResult, ReplicaFetchResult
from .produce import MarkerEntry, ProduceContext, ProduceEntry, ProducePipeline
from .purgatory import BYTES_OF, HIGH_WATERMARK, LAST_STABLE, LOG_END, Watch
from .replicas import ClusterView, HostedReplicas, Leases, guarded, positions

__all__ = ["ClusterView", "FetchEntry", "Leases", "MarkerEntry", "ProduceEntry", "ReplicaManager", "TopicPartition",
           "guarded", "positions"]

DEFAULT_FETCH_MAX_BYTES = 52428800  # Kafka's fetch.max.bytes
DEFAULT_PARTITION_MAX_BYTES = 1048576  # Kafka's max.partition.fetch.bytes

# Keys of `ReplicaManager.fetch_wakeups`: who fetched (Kafka's fetcherType) ...
CONSUMER, FOLLOWER = "consumer", "follower"
# ... and how a parked fetch left the purgatory: woken and answered, woken and parked
# again (still short of min_bytes), or answered at its deadline.
COMPLETED, PARKED_AGAIN, EXPIRED = "completed", "parked_again", "expired"
# Consumer reads kept for fetches asking the same again while the partition is unchanged
# (the fetches one append wakes at one offset are answered from one read).
RECENT_READS = 16


class FetchEntry(NamedTuple):
    """One partition of a Fetch: where to read and at most how many bytes (0: Kafka's
    max.partition.fetch.bytes default); current_leader_epoch -1 skips the epoch check."""

    topic: str
    partition: int
    fetch_offset: int
    max_bytes: int = 0
    current_leader_epoch: int = -1


class ReplicaManager:
    """The requests a partition leader process serves (Kafka's ReplicaManager), over
    the replicas it hosts: `hosted` (replicas.HostedReplicas), which it has rather
    than is -- their lifecycle, leases, ISR and periodic work stay there."""

    def __init__(self, hosted: HostedReplicas):
        self.hosted = hosted
        self.write_path = ProducePipeline(hosted)  # the write path (produce.py)
        # (CONSUMER | FOLLOWER, COMPLETED | PARKED_AGAIN | EXPIRED) -> parked fetches
        # that left the purgatory so (metrics: exactly_fetch_wakeups_total).
        self.fetch_wakeups: Counter[tuple[str, str]] = Counter()
        # (what was read, the partition's state then) -> FetchResult; see `_read_consumer`.
        self._recent_reads: OrderedDict[tuple, object] = OrderedDict()
        self.consumer_reads = 0  # reads of a log for consumer fetches (a shared one counted once)

    # ------------------------------------------------------------ requests
    def delete_records(self, topic: str, partition: int, offset: int) -> tuple[ErrorCode, int, str]:
        """DeleteRecords on a partition led here: (error, log start offset, message).
        Moves the log start offset (`Partition.delete_records`) and deletes the
        segments wholly below it right away. Errors: those of `get`;
        INVALID_TOPIC_EXCEPTION for an internal topic (compaction keeps them small);
        OFFSET_OUT_OF_RANGE above the high watermark."""
        if self.hosted.is_internal(topic):
            return ErrorCode.INVALID_TOPIC_EXCEPTION, -1, f"records of the internal topic {topic} cannot be deleted"
        p, err = self.hosted.get(topic, partition)
        if p is None:
            return err, -1, ""
        res, err = self.hosted.guarded(f"DeleteRecords on {topic}-{partition}", p.delete_records, offset)
        if res is None:
            return err, -1, ""
        code, low = res
        if code != ErrorCode.NONE:
            return code, low, (f"offset {offset} is above the high watermark {p.high_watermark}"
                               if code == ErrorCode.OFFSET_OUT_OF_RANGE else "")
        self.hosted.guarded(f"deleting segments of {topic}-{partition}", p.delete_old_segments)
        self.hosted.purgatory.notify((topic, partition))
        return ErrorCode.NONE, p.log_start_offset, ""

    def fetch_for_follower(self, topic: str, partition: int, replica_id: str, offset: int, max_bytes: int,
                           current_leader_epoch: int = -1) -> ReplicaFetchResult:
        """A follower's fetch (see `Partition.fetch_for_follower`); asks for an ISR
        update (`on_isr_update`) when the follower caught up outside the ISR.
        UNKNOWN_TOPIC_OR_PARTITION / NOT_LEADER_OR_FOLLOWER when not led here."""
        p, err = self.hosted.leader_replica(topic, partition)
        if p is None:
            return ReplicaFetchResult(err)
        res = p.fetch_for_follower(replica_id, offset, max_bytes, current_leader_epoch)
        if res.error == ErrorCode.NONE and self.hosted.on_isr_update is not None and \
                p.isr_expand_candidate(replica_id, self.hosted.max_lag_ms) is not None:
            self.hosted.on_isr_update((topic, partition))
        return res

    def end_offset_for_epoch(self, topic: str, partition: int, leader_epoch: int,
                             current_leader_epoch: int = -1) -> tuple[ErrorCode, EpochEndOffset]:
        """OffsetForLeaderEpoch (see `Partition.end_offset_for_epoch`)."""
        p, err = self.hosted.leader_replica(topic, partition)
        if p is None:
            return err, EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET)
        return p.end_offset_for_epoch(leader_epoch, current_leader_epoch)

    def note_txn_partition_added(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                 coordinator_epoch: int, topic: str, partition: int, leader_epoch: int,
                                 offset: int) -> bool:
        """TxnPartitionsAdded for one partition (see ProducerStateManager.note_added):
        noted only on a replica led here in `leader_epoch` whose log reaches `offset`, for
        a PID whose markers came from no later coordinator epoch and whose latest marker
        here is the one right before `offset` (the position names this log's own marker:
        not one of a deleted topic of the same name, nor one that a later marker
        superseded). Returns whether it was noted; a notice not noted costs the producer's
        first batch a verification call."""
        p, _ = self.hosted.leader_replica(topic, partition)
        if p is None or p.leader_epoch != leader_epoch or not 0 <= offset <= p.log.log_end_offset \
                or producer_id < 0 or p.producers.internal:
            return False
        entry = p.producers.entry(producer_id)
        if entry is not None and entry.coordinator_epoch > coordinator_epoch:
            return False
        if not p.producers.latest_marker_before(producer_id, offset):
            return False
        p.producers.note_added(transactional_id, producer_id, producer_epoch, offset)
        return True

    async def append_records(self, ctx: ProduceContext, entries: Sequence[ProduceEntry]) -> list[AppendResult]:
        """Produce (design doc "Client-Broker request handling", produce; Kafka's
        ReplicaManager.appendRecords): append each entry's batch to the partition led
        here and acknowledge it by `ctx.acks`: 0 at once, 1 after the local append, -1
        (all) once the high watermark passed it, through the gates of produce.py, in
        order (validate, authorize, leader and size, writer claim, verify, append,
        acks). `ctx` (produce.ProduceContext, built by the adapter: `client` for
        Produce, `coordinator` for CoordinatorProduce) bounds the whole request by its
        deadline and carries the request's facts. Before appending and before
        acknowledging (acks != 0) the leader confirms its lease. A client may not write
        internal topics and a coordinator writes only internal topics (Kafka's
        internal-topics-allowed appends): INVALID_TOPIC_EXCEPTION otherwise, so a client
        can never forge a coordinator's record. With a verifier, a client batch that
        would start its producer's transaction on a partition is appended only after
        the coordinator of `ctx.transactional_id` confirmed the partition is in that
        transaction (KIP-890 part 1; INVALID_TXN_STATE without a transactional.id or
        when it is not, INVALID_PRODUCER_EPOCH for another epoch), or, with `ctx.add`
        (KIP-890 part 2), added it (TxnVerifier.add); `ctx.consumer_group_id` names a
        group-aware producer's group, whose coordinator holds its transaction (KIP-447
        draft); `ctx.verified_from` (a coordinator's): the group coordinator verified
        this transactional offset commit when it had applied the partition up to that
        offset, and the transaction coordinator is asked again only if a marker of the
        producer was appended since (Kafka's verificationGuards). With `pid_bindings`
        set (authorizer on), a client's idempotent or transactional batch is appended
        only when its producer id is bound to `ctx.principal` (and, transactional, to
        its transactional.id): otherwise TRANSACTIONAL_ID_AUTHORIZATION_FAILED or
        CLUSTER_AUTHORIZATION_FAILED before the producer state is touched
        (services/common/security/pid_binding.py; NOT_ENOUGH_REPLICAS while the binding
        cannot be checked). Returns one AppendResult per entry, in order:
        INVALID_REQUIRED_ACKS, INVALID_TOPIC_EXCEPTION, the refusals of
        `partition.check_batch_shape` (a malformed batch reaches no coordinator),
        MESSAGE_TOO_LARGE, the errors of `get()` and `Partition.append`, and after a
        local append NOT_ENOUGH_REPLICAS_AFTER_APPEND, NOT_LEADER_OR_FOLLOWER or
        REQUEST_TIMED_OUT (offsets kept)."""
        return await self.write_path.append(ctx, entries)

    async def write_markers(self, markers: Sequence[MarkerEntry],
                            arrival_s: float | None = None) -> list[list[MarkerResult]]:
        """WriteTxnMarkers (design doc "Coordinator-Broker request handling"): append
        each marker to each of its partitions led here (see `Partition.write_marker`)
        and acknowledge as acks=all. Markers of one partition are appended in request
        order (each append happens before its first wait). A marker that could not be
        appended within MARKER_LEADER_DEADLINE_MS of the request's arrival
        (`arrival_s`, monotonic s, before any interceptor held the request; default
        now) -- waiting for the leadership lease, or for ZooKeeper on
        `CONSUMER_OFFSETS_TOPIC` -- is not appended at all and answers REQUEST_TIMED_OUT:
        the coordinator may have given up on the request and written the marker
        again, and under transaction version 1 (no epoch bump) a marker applied that
        late could end the producer's next transaction (services/common/protocol.py).
        Returns, per marker, one MarkerResult per partition in order."""
        arrived = self.hosted.monotonic_s() if arrival_s is None else arrival_s
        return await self.write_path.write_markers(markers, marker_leader_deadline_s(arrived))

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
        (docs/design.md, "Tunnel and fetch limits"); a high-watermark move alone
        wakes no follower. Each parked fetch that leaves the purgatory is counted in
        `fetch_wakeups` (CONSUMER | FOLLOWER, COMPLETED | PARKED_AGAIN | EXPIRED)."""
        if not replica_id:
            max_wait_ms = min(max_wait_ms, self.hosted.fetch_max_wait_ms)
        deadline = self.hosted.monotonic_s() + max(max_wait_ms, 0) / 1000
        min_bytes = max(min_bytes, 1)
        bound = LOG_END if replica_id else LAST_STABLE if isolation_level == READ_COMMITTED else HIGH_WATERMARK
        fetcher = FOLLOWER if replica_id else CONSUMER
        woken = False
        while True:
            results, total, failed = self._read_once(entries, max_bytes, isolation_level, replica_id)
            done = total >= min_bytes or failed or self.hosted.monotonic_s() >= deadline
            if woken:
                self.fetch_wakeups[fetcher, COMPLETED if done else PARKED_AGAIN] += 1
            if done:
                return results
            # What was readable has been read: wait for the position to pass where it is now,
            # a consumer for the bytes it still needs.
            need = min_bytes - total
            parked = None if replica_id else self._byte_positions(entries, bound)
            while True:
                watches = self._watches(entries, bound, parked, need)
                woken = await self.hosted.purgatory.wait(watches, deadline, None if replica_id else owner)
                if not woken:
                    if self.hosted.monotonic_s() >= deadline:
                        self.fetch_wakeups[fetcher, EXPIRED] += 1
                    return self._read_once(entries, max_bytes, isolation_level, replica_id)[0]
                gained = self._bytes_since(entries, bound, parked)
                if gained is None or gained >= need:
                    break
                # A partition passed its share of the bytes but all together did not: wait
                # again for the rest, without reading.
                self.fetch_wakeups[fetcher, PARKED_AGAIN] += 1
                need -= gained
                parked = self._byte_positions(entries, bound)

    def _byte_positions(self, entries: Sequence[FetchEntry], bound: str) -> list[tuple[object, int, int]] | None:
        """Where a consumer fetch parks in each entry's partition: (the partition, its
        leader epoch, the byte position (byte_marks.ByteMarks) at `bound`, or at the
        fetch offset when that is beyond); None when one is not known (the fetch then
        waits by offset)."""
        out = []
        for e in entries:
            p = self.hosted.serving.get((e.topic, e.partition))
            at = None if p is None or not p.is_leader else \
                p.byte_marks.at(max(e.fetch_offset, self._position(e, bound)))
            if at is None:
                return None
            out.append((p, p.leader_epoch, at))
        return out

    def _watches(self, entries: Sequence[FetchEntry], bound: str, parked: list[tuple[object, int, int]] | None,
                 need: int) -> list[Watch]:
        """What a parked fetch waits for: with byte positions, each partition's byte
        position passing its parked one by a share of the `need` bytes (ceil(need / n):
        when the n partitions together gained `need`, one of them gained its share);
        else each partition's `bound` passing the offset read up to."""
        if parked is None:
            return [Watch((e.topic, e.partition), bound, max(e.fetch_offset, self._position(e, bound)))
                    for e in entries]
        share = -(-need // len(entries))
        return [Watch((e.topic, e.partition), BYTES_OF[bound], at + share - 1)
                for e, (_, _, at) in zip(entries, parked)]

    def _bytes_since(self, entries: Sequence[FetchEntry], bound: str,
                     parked: list[tuple[object, int, int]] | None) -> int | None:
        """Bytes the entries' partitions gained at `bound` since `parked`; None when
        that is not known (not waiting by bytes, or a partition closed, replaced, no
        longer led or in another leader epoch): the fetch reads again, and gets its error."""
        if parked is None:
            return None
        gained = 0
        for e, (was, epoch, at) in zip(entries, parked):
            p = self.hosted.serving.get((e.topic, e.partition))
            if p is not was or not p.is_leader or p.leader_epoch != epoch:
                return None
            now = p.byte_marks.at(self._position(e, bound))
            if now is None:
                return None
            gained += max(now - at, 0)
        return gained

    def _read_consumer(self, e: FetchEntry, limit: int, isolation_level: int) -> FetchResult:
        """A consumer's read of one partition (`Partition.fetch`), from the recent reads
        when the same was read from this very replica while it was as it is now (its log
        end, high watermark, log start, leader epoch and bytes appended unchanged): the
        fetches an append wakes at one offset are answered from one read, not one read
        each. The replica object is part of the key: a topic deleted and created again
        under its name (or a partition closed and opened again) is another replica, whose
        log may have the same offsets and sizes but other records and other aborted
        transactions."""
        p, err = self.hosted.get(e.topic, e.partition)
        if p is None:
            return FetchResult(err)
        key = (p, e.fetch_offset, limit, isolation_level, e.current_leader_epoch,
               p.log_end_offset, p.high_watermark, p.log_start_offset, p.leader_epoch, p.byte_marks.total)
        res = self._recent_reads.get(key)
        if res is not None:
            self._recent_reads.move_to_end(key)
            return res
        res, err = self.hosted.guarded(f"fetch from {e.topic}-{e.partition}", p.fetch, e.fetch_offset, limit,
                                 isolation_level, e.current_leader_epoch)
        if res is None:
            return FetchResult(err)
        self.consumer_reads += 1
        if isolation_level != READ_COMMITTED and res.aborted:
            res = res._replace(aborted=())
        if res.error == ErrorCode.NONE:
            self._recent_reads[key] = res
            if len(self._recent_reads) > RECENT_READS:
                self._recent_reads.popitem(last=False)
        return res

    def _position(self, e: FetchEntry, bound: str) -> int:
        """Position `bound` (purgatory.LOG_END, ...) of the partition of `e` (-1: not here)."""
        p = self.hosted.serving.get((e.topic, e.partition))
        return -1 if p is None else positions(p)[bound]

    def _read_once(self, entries: Sequence[FetchEntry], max_bytes: int, isolation_level: int,
                   replica_id: str) -> tuple[list, int, bool]:
        budget = max_bytes if max_bytes > 0 else DEFAULT_FETCH_MAX_BYTES
        total, failed = 0, False
        results: list = []
        for e in entries:
            limit = min(e.max_bytes if e.max_bytes > 0 else DEFAULT_PARTITION_MAX_BYTES, budget - total)
            if replica_id:
                res, err = self.hosted.guarded(f"replica fetch from {e.topic}-{e.partition}", self.fetch_for_follower,
                                   e.topic, e.partition, replica_id, e.fetch_offset, limit, e.current_leader_epoch)
                if res is None:
                    res = ReplicaFetchResult(err)
                if res.hw_changed:
                    leader = self.hosted.serving.get((e.topic, e.partition))
                    # Wake the consumers and acks=all produces the new high watermark lets
                    # through. Not the other followers: a follower's fetch completes on bytes
                    # past its offset only (Kafka's DelayedFetch), so woken it would read
                    # nothing and park again; it learns the high watermark from its next answer.
                    self.hosted.purgatory.notify((e.topic, e.partition), None if leader is None else positions(leader))
            else:
                res = self._read_consumer(e, limit, isolation_level)
            results.append(res)
            if res.error != ErrorCode.NONE:
                failed = True
            else:
                total += len(res.records)
        return results, total, failed
