"""gRPC adapter of the partition leader: exactly.v1.PartitionLeader.

Only translates protobuf messages to calls on the ReplicaManager / Partition domain
objects and back (docs/design.md, "Code conventions"); protocol outcomes are per-partition error codes
(docs/design.md, "Errors"). Runs on grpc.aio: one event loop, synchronous domain calls.

Fetch long-polls (Kafka's delayed fetch): when fewer than `min_bytes` bytes are
available it waits, up to `max_wait_ms`, for an append, marker or high-watermark move
on one of the requested partitions. `min_bytes` 0 counts as 1, since proto3 cannot
tell it from unset; send `max_wait_ms` 0 for an immediate answer. A Fetch with
`replica_id` set is a follower replicating: it reads up to the log end and reports
the follower's log end offset to the leader (see `ReplicaManager.fetch_for_follower`).

Produce (Kafka's delayed produce): acks=1 answers after the local append, acks=-1
(all) once the high watermark passed the batch, with NOT_ENOUGH_REPLICAS_AFTER_APPEND
when the ISR fell below `min.insync.replicas` meanwhile, NOT_LEADER_OR_FOLLOWER when
leadership moved, REQUEST_TIMED_OUT after the request's `timeout_ms`. acks=0 answers
at once. Before appending and before acknowledging (acks != 0), a leader confirms its
leadership lease (`leases.ensure`); a leader that cannot (a deposed or paused one)
answers NOT_LEADER_OR_FOLLOWER. WriteTxnMarkers appends as acks=-1.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Iterable, Protocol

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg

from .metrics import count_fetched, count_produced
from .partition import ACKS_ALL, READ_COMMITTED, Partition
from .replica_manager import ReplicaManager

log = logging.getLogger(__name__)

DEFAULT_FETCH_MAX_BYTES = 52428800  # Kafka's fetch.max.bytes
DEFAULT_PARTITION_MAX_BYTES = 1048576  # Kafka's max.partition.fetch.bytes
VALID_ACKS = (0, 1, -1)
DEFAULT_PRODUCE_TIMEOUT_MS = 30000
MARKER_TIMEOUT_MS = 25000  # below the coordinators' 30 s WriteTxnMarkers deadline

TopicPartition = tuple[str, int]


class Leases(Protocol):
    """Confirms a leader's leadership (see lease.LeaseKeeper)."""

    def ensure(self, p: Partition, deadline: float) -> Awaitable[bool]: ...


class AppendNotifier:
    """Wakes fetches waiting for data on a partition (appends, markers, HW moves)."""

    def __init__(self) -> None:
        self._waiters: dict[TopicPartition, set[asyncio.Future]] = {}

    def notify(self, tp: TopicPartition) -> None:
        for fut in self._waiters.pop(tp, ()):
            if not fut.done():
                fut.set_result(None)

    async def wait(self, tps: Iterable[TopicPartition], timeout_s: float) -> bool:
        """Wait until one of `tps` is notified or `timeout_s` passes; True if notified."""
        fut = asyncio.get_running_loop().create_future()
        tps = list(tps)
        for tp in tps:
            self._waiters.setdefault(tp, set()).add(fut)
        try:
            done, _ = await asyncio.wait({fut}, timeout=timeout_s)
            return bool(done)
        finally:
            for tp in tps:
                waiters = self._waiters.get(tp)
                if waiters is not None:
                    waiters.discard(fut)
                    if not waiters:
                        del self._waiters[tp]


def _guard(what: str, fn: Callable, *args):
    """Run a domain call; an exception (bug, corruption, I/O failure) becomes an error
    code for this partition instead of failing the whole RPC."""
    try:
        return fn(*args), ErrorCode.NONE
    except OSError:
        log.exception("%s failed with an I/O error", what)
        return None, ErrorCode.KAFKA_STORAGE_ERROR
    except Exception:  # noqa: BLE001 - reported as UNKNOWN_SERVER_ERROR, logged with its traceback
        log.exception("%s failed", what)
        return None, ErrorCode.UNKNOWN_SERVER_ERROR


def _counted(resp: pb.FetchResponse) -> pb.FetchResponse:
    """Count the batches a Fetch returns (metrics.py) and pass the response on."""
    for topic in resp.responses:
        for part in topic.partitions:
            count_fetched(topic.topic, part.records)
    return resp


class PartitionLeaderServicer(pbg.PartitionLeaderServicer):
    """Produce, Fetch, ListOffsets, WriteTxnMarkers and OffsetForLeaderEpoch over
    `manager`'s replicas. `leases` confirms leadership before acknowledging writes
    (None: always confirmed)."""

    def __init__(self, manager: ReplicaManager, notifier: AppendNotifier | None = None,
                 leases: Leases | None = None):
        self.manager = manager
        self.notifier = notifier or AppendNotifier()
        self.leases = leases

    async def _confirmed(self, p: Partition, deadline: float) -> bool:
        if self.leases is None or self.manager.lease_valid(p):
            return True
        return await self.leases.ensure(p, deadline)

    async def _await_high_watermark(self, p: Partition, epoch: int, last_offset: int, deadline: float) -> ErrorCode:
        """Wait until the high watermark passes `last_offset` while `p` leads `epoch`."""
        tp = (p.topic, p.partition)
        loop = asyncio.get_running_loop()
        while True:
            if self.manager.replicas.get(tp) is not p or not p.is_leader or p.leader_epoch != epoch:
                return ErrorCode.NOT_LEADER_OR_FOLLOWER
            if p.high_watermark > last_offset:
                return ErrorCode.NONE if len(p.isr) >= p.min_insync_replicas \
                    else ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
            remaining = deadline - loop.time()
            if remaining <= 0:
                return ErrorCode.REQUEST_TIMED_OUT
            await self.notifier.wait((tp,), remaining)

    async def _complete(self, p: Partition, epoch: int, acks: int, last_offset: int, deadline: float) -> ErrorCode:
        """The acknowledgement of an append that succeeded locally."""
        if acks == ACKS_ALL:
            err = await self._await_high_watermark(p, epoch, last_offset, deadline)
            if err != ErrorCode.NONE:
                return err
        if acks != 0 and not (await self._confirmed(p, deadline) and p.leader_epoch == epoch):
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.NONE

    # ------------------------------------------------------------ Produce
    async def Produce(self, request: pb.ProduceRequest, context) -> pb.ProduceResponse:
        resp = pb.ProduceResponse()
        deadline = asyncio.get_running_loop().time() + \
            (request.timeout_ms if request.timeout_ms > 0 else DEFAULT_PRODUCE_TIMEOUT_MS) / 1000
        jobs = []
        for topic in request.topics:
            tresp = resp.topics.add(name=topic.name)
            for part in topic.partitions:
                out = tresp.partitions.add(partition=part.partition, base_offset=-1, log_append_time_ms=-1,
                                           log_start_offset=-1)
                jobs.append(self._produce_one(request.acks, topic.name, part, out, deadline))
        if len(jobs) == 1:
            await jobs[0]
        else:
            await asyncio.gather(*jobs)
        return resp

    async def _produce_one(self, acks: int, topic: str, part: pb.PartitionProduceData,
                           out: pb.PartitionProduceResponse, deadline: float) -> None:
        if acks not in VALID_ACKS:
            out.error_code = ErrorCode.INVALID_REQUIRED_ACKS
            return
        p, err = self.manager.get(topic, part.partition)
        if p is not None and acks != 0 and not self.manager.lease_valid(p) and self.leases is not None:
            if not await self.leases.ensure(p, deadline):
                p, err = None, ErrorCode.NOT_LEADER_OR_FOLLOWER
            else:
                p, err = self.manager.get(topic, part.partition)
        if p is None:
            out.error_code = err
            return
        epoch = p.leader_epoch
        res, err = _guard(f"produce to {topic}-{part.partition}", p.append, part.records, acks)
        if res is None:
            out.error_code = err
            return
        out.error_code, out.base_offset, out.log_start_offset = res.error, res.base_offset, res.log_start_offset
        out.error_message = res.message
        if res.error == ErrorCode.NONE:
            count_produced(topic, part.records)
            self.notifier.notify((topic, part.partition))
        if res.error in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
            err = await self._complete(p, epoch, acks, res.last_offset, deadline)
            if err != ErrorCode.NONE:
                out.error_code, out.error_message = err, ""

    # ------------------------------------------------------------ Fetch
    async def Fetch(self, request: pb.FetchRequest, context) -> pb.FetchResponse:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(request.max_wait_ms, 0) / 1000
        min_bytes = max(request.min_bytes, 1)
        tps = [(t.topic, p.partition) for t in request.topics for p in t.partitions]
        done = (lambda r: r) if request.replica_id else _counted
        while True:
            resp, total, failed = self._fetch_once(request)
            remaining = deadline - loop.time()
            if total >= min_bytes or failed or remaining <= 0:
                return done(resp)
            if not await self.notifier.wait(tps, remaining):
                return done(self._fetch_once(request)[0])

    def _fetch_once(self, request: pb.FetchRequest) -> tuple[pb.FetchResponse, int, bool]:
        budget = request.max_bytes if request.max_bytes > 0 else DEFAULT_FETCH_MAX_BYTES
        total, failed = 0, False
        resp = pb.FetchResponse()
        for topic in request.topics:
            tresp = resp.responses.add(topic=topic.topic)
            for fp in topic.partitions:
                out = tresp.partitions.add(partition=fp.partition, high_watermark=-1, last_stable_offset=-1,
                                           log_start_offset=-1)
                limit = min(fp.partition_max_bytes if fp.partition_max_bytes > 0 else DEFAULT_PARTITION_MAX_BYTES,
                            budget - total)
                if request.replica_id:
                    ok = self._replica_fetch_one(request.replica_id, topic.topic, fp, limit, out)
                    failed = failed or not ok
                    total += len(out.records)
                    continue
                p, err = self.manager.get(topic.topic, fp.partition)
                if p is None:
                    out.error_code, failed = err, True
                    continue
                res, err = _guard(f"fetch from {topic.topic}-{fp.partition}", p.fetch, fp.fetch_offset, limit,
                                  request.isolation_level, fp.current_leader_epoch)
                if res is None:
                    out.error_code, failed = err, True
                    continue
                out.error_code = res.error
                out.high_watermark, out.last_stable_offset = res.high_watermark, res.last_stable_offset
                out.log_start_offset = res.log_start_offset
                if res.error != ErrorCode.NONE:
                    failed = True
                    continue
                out.records = res.records
                total += len(res.records)
                if request.isolation_level == READ_COMMITTED:
                    for pid, first in res.aborted:
                        out.aborted_transactions.add(producer_id=pid, first_offset=first)
        return resp, total, failed

    def _replica_fetch_one(self, replica_id: str, topic: str, fp: pb.FetchPartition, limit: int,
                           out: pb.FetchPartitionResponse) -> bool:
        res, err = _guard(f"replica fetch from {topic}-{fp.partition}", self.manager.fetch_for_follower,
                          topic, fp.partition, replica_id, fp.fetch_offset, limit, fp.current_leader_epoch)
        if res is None:
            out.error_code = err
            return False
        out.error_code = res.error
        out.high_watermark, out.log_start_offset = res.high_watermark, res.log_start_offset
        if res.hw_changed:
            self.notifier.notify((topic, fp.partition))
        if res.error != ErrorCode.NONE:
            return False
        out.records = res.records
        return True

    # ------------------------------------------------------------ ListOffsets
    async def ListOffsets(self, request: pb.ListOffsetsRequest, context) -> pb.ListOffsetsResponse:
        resp = pb.ListOffsetsResponse()
        for topic in request.topics:
            tresp = resp.topics.add(name=topic.name)
            for lp in topic.partitions:
                out = tresp.partitions.add(partition=lp.partition, timestamp=-1, offset=-1)
                p, err = self.manager.get(topic.name, lp.partition)
                if p is None:
                    out.error_code = err
                    continue
                res, err = _guard(f"list offsets of {topic.name}-{lp.partition}", p.list_offset,
                                  lp.timestamp, request.isolation_level)
                if res is None:
                    out.error_code = err
                    continue
                out.error_code, out.offset, out.timestamp = res
        return resp

    # ------------------------------------------------------------ WriteTxnMarkers
    async def WriteTxnMarkers(self, request: pb.WriteTxnMarkersRequest, context) -> pb.WriteTxnMarkersResponse:
        resp = pb.WriteTxnMarkersResponse()
        deadline = asyncio.get_running_loop().time() + MARKER_TIMEOUT_MS / 1000
        jobs = []
        for marker in request.markers:
            mresp = resp.markers.add(producer_id=marker.producer_id)
            for topic in marker.topics:
                tresp = mresp.topics.add(topic=topic.topic)
                for partition in topic.partitions:
                    out = tresp.partitions.add(partition=partition)
                    jobs.append(self._marker_one(marker, topic.topic, partition, out, deadline))
        # Markers for one partition are appended in request order: each job appends
        # before its first wait.
        await asyncio.gather(*jobs)
        return resp

    async def _marker_one(self, marker: pb.WritableTxnMarker, topic: str, partition: int,
                          out: pb.PartitionResult, deadline: float) -> None:
        p, err = self.manager.get(topic, partition)
        if p is not None and not self.manager.lease_valid(p) and self.leases is not None:
            if not await self.leases.ensure(p, deadline):
                p, err = None, ErrorCode.NOT_LEADER_OR_FOLLOWER
            else:
                p, err = self.manager.get(topic, partition)
        if p is None:
            out.error_code = err
            return
        epoch = p.leader_epoch
        res, err = _guard(f"marker on {topic}-{partition}", p.write_marker, marker.producer_id,
                          marker.producer_epoch, marker.committed, marker.coordinator_epoch)
        if res is None:
            out.error_code = err
            return
        out.error_code, out.error_message = res.error, res.message
        if res.error == ErrorCode.NONE:
            self.notifier.notify((topic, partition))
            err = await self._complete(p, epoch, ACKS_ALL, res.offset, deadline)
            if err != ErrorCode.NONE:
                out.error_code, out.error_message = err, ""

    # ------------------------------------------------------------ OffsetForLeaderEpoch
    async def OffsetForLeaderEpoch(self, request: pb.OffsetForLeaderEpochRequest, context
                                   ) -> pb.OffsetForLeaderEpochResponse:
        resp = pb.OffsetForLeaderEpochResponse()
        for topic in request.topics:
            tresp = resp.topics.add(topic=topic.topic)
            for op in topic.partitions:
                res, err = _guard(f"OffsetForLeaderEpoch of {topic.topic}-{op.partition}",
                                  self.manager.end_offset_for_epoch, topic.topic, op.partition, op.leader_epoch,
                                  op.current_leader_epoch)
                if res is None:
                    tresp.partitions.add(partition=op.partition, error_code=err, leader_epoch=-1, end_offset=-1)
                    continue
                code, answer = res
                tresp.partitions.add(partition=op.partition, error_code=code, leader_epoch=answer.epoch,
                                     end_offset=answer.end_offset)
        return resp
