"""gRPC adapter of the partition leader: exactly.v1.PartitionLeader.

Only translates protobuf messages to calls on the ReplicaManager / Partition domain
objects and back (STYLE.md 6); protocol outcomes are per-partition error codes
(DESIGN.md §5). Runs on grpc.aio: one event loop, synchronous domain calls.

Fetch long-polls (Kafka's delayed fetch): when fewer than `min_bytes` bytes are
available it waits, up to `max_wait_ms`, for an append or marker on one of the
requested partitions. `min_bytes` 0 counts as 1, since proto3 cannot tell it from
unset; send `max_wait_ms` 0 for an immediate answer.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Iterable

from exactly.errors import ErrorCode
from exactly.v1 import exactly_pb2 as pb
from exactly.v1 import exactly_pb2_grpc as pbg

from .metrics import count_fetched, count_produced
from .partition import READ_COMMITTED
from .replica_manager import ReplicaManager

log = logging.getLogger(__name__)

DEFAULT_FETCH_MAX_BYTES = 52428800  # Kafka's fetch.max.bytes
DEFAULT_PARTITION_MAX_BYTES = 1048576  # Kafka's max.partition.fetch.bytes
VALID_ACKS = (0, 1, -1)

TopicPartition = tuple[str, int]


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
    """Produce, Fetch, ListOffsets and WriteTxnMarkers over `manager`'s partitions."""

    def __init__(self, manager: ReplicaManager, notifier: AppendNotifier | None = None):
        self.manager = manager
        self.notifier = notifier or AppendNotifier()

    # ------------------------------------------------------------ Produce
    async def Produce(self, request: pb.ProduceRequest, context) -> pb.ProduceResponse:
        resp = pb.ProduceResponse()
        for topic in request.topics:
            tresp = resp.topics.add(name=topic.name)
            for part in topic.partitions:
                tresp.partitions.append(self._produce_one(request.acks, topic.name, part))
        return resp

    def _produce_one(self, acks: int, topic: str, part: pb.PartitionProduceData) -> pb.PartitionProduceResponse:
        out = pb.PartitionProduceResponse(partition=part.partition, base_offset=-1, log_append_time_ms=-1,
                                          log_start_offset=-1)
        if acks not in VALID_ACKS:
            out.error_code = ErrorCode.INVALID_REQUIRED_ACKS
            return out
        p, err = self.manager.get(topic, part.partition)
        if p is None:
            out.error_code = err
            return out
        res, err = _guard(f"produce to {topic}-{part.partition}", p.append, part.records)
        if res is None:
            out.error_code = err
            return out
        out.error_code, out.base_offset, out.log_start_offset = res.error, res.base_offset, res.log_start_offset
        out.error_message = res.message
        if res.error == ErrorCode.NONE:
            count_produced(topic, part.records)
            self.notifier.notify((topic, part.partition))
        return out

    # ------------------------------------------------------------ Fetch
    async def Fetch(self, request: pb.FetchRequest, context) -> pb.FetchResponse:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(request.max_wait_ms, 0) / 1000
        min_bytes = max(request.min_bytes, 1)
        tps = [(t.topic, p.partition) for t in request.topics for p in t.partitions]
        while True:
            resp, total, failed = self._fetch_once(request)
            remaining = deadline - loop.time()
            if total >= min_bytes or failed or remaining <= 0:
                return _counted(resp)
            if not await self.notifier.wait(tps, remaining):
                return _counted(self._fetch_once(request)[0])

    def _fetch_once(self, request: pb.FetchRequest) -> tuple[pb.FetchResponse, int, bool]:
        budget = request.max_bytes if request.max_bytes > 0 else DEFAULT_FETCH_MAX_BYTES
        total, failed = 0, False
        resp = pb.FetchResponse()
        for topic in request.topics:
            tresp = resp.responses.add(topic=topic.topic)
            for fp in topic.partitions:
                out = tresp.partitions.add(partition=fp.partition, high_watermark=-1, last_stable_offset=-1,
                                           log_start_offset=-1)
                p, err = self.manager.get(topic.topic, fp.partition)
                if p is None:
                    out.error_code, failed = err, True
                    continue
                limit = min(fp.partition_max_bytes if fp.partition_max_bytes > 0 else DEFAULT_PARTITION_MAX_BYTES,
                            budget - total)
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
        for marker in request.markers:
            mresp = resp.markers.add(producer_id=marker.producer_id)
            for topic in marker.topics:
                tresp = mresp.topics.add(topic=topic.topic)
                for partition in topic.partitions:
                    tresp.partitions.append(self._marker_one(marker, topic.topic, partition))
        return resp

    def _marker_one(self, marker: pb.WritableTxnMarker, topic: str, partition: int) -> pb.PartitionResult:
        out = pb.PartitionResult(partition=partition)
        p, err = self.manager.get(topic, partition)
        if p is None:
            out.error_code = err
            return out
        res, err = _guard(f"marker on {topic}-{partition}", p.write_marker, marker.producer_id,
                          marker.producer_epoch, marker.committed, marker.coordinator_epoch)
        if res is None:
            out.error_code = err
            return out
        out.error_code, out.error_message = res.error, res.message
        if res.error == ErrorCode.NONE:
            self.notifier.notify((topic, partition))
        return out
