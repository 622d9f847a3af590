"""Kafka APIs of a partition leader: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch,
DescribeProducers, DeleteRecords, DescribeLogDirs — adapters over the gRPC servicer (servicer.py), so
no rule of the log is written twice (docs/design.md, "Kafka protocol").

Produce passes the client's record batch bytes through unchanged. A Produce with
acks=0 gets no response, and a retried batch the producer state recognizes gets
NONE with the offsets of the original (DUPLICATE_SEQUENCE_NUMBER in the gRPC API),
as a Kafka broker answers. Fetch sessions (KIP-227) are not kept: every
answer has session id 0, which tells clients to send full fetch requests. Replica
fetches (replica_id >= 0) are refused: replication runs over gRPC between services.
"""
from __future__ import annotations

import shutil
from typing import Any

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb

from services.common.security import authz
from services.common.security.acl import Operation as Op
from services.common.kafka.codec import field
from services.common.kafka.listener import Handler, RequestContext

from .partition import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP

PRODUCE, FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH, DELETE_RECORDS, DESCRIBE_PRODUCERS = 0, 1, 2, 23, 21, 61
DESCRIBE_LOG_DIRS = 35
KAFKA_MAX_TIMESTAMP = -3  # Kafka's ListOffsetsRequest.MAX_TIMESTAMP (KIP-734)


def _kafka_produce_error(code: int) -> int:
    """A retried batch the producer state recognized is answered NONE (with the
    original offsets), as a Kafka broker does; a transaction verification that met a
    transition in progress (CONCURRENT_TRANSACTIONS) becomes NOT_ENOUGH_REPLICAS, the
    retriable error Kafka's own leaders give produce clients for it."""
    if code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
        return ErrorCode.NONE
    if code == ErrorCode.CONCURRENT_TRANSACTIONS:
        return ErrorCode.NOT_ENOUGH_REPLICAS
    return code


def _grpc_timestamp(kafka_timestamp: int) -> int | None:
    """The gRPC ListOffsets timestamp for a Kafka one (see `list_offsets`); None for a
    negative one that is not served."""
    if kafka_timestamp == KAFKA_MAX_TIMESTAMP:
        return MAX_TIMESTAMP
    if kafka_timestamp in (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP) or kafka_timestamp >= 0:
        return kafka_timestamp
    return None


class _Connection:
    """The servicer context of a Kafka-port call, as far as Fetch reads it: the peer
    (`peer()`), whose parked fetches are counted together for User:ANONYMOUS."""

    __slots__ = ("_peer",)

    def __init__(self, peer: str):
        self._peer = peer

    def peer(self) -> str:
        return f"kafka {self._peer}"


class PartitionLeaderApis:
    """`manager`: the process's ReplicaManager (DescribeLogDirs reads its replicas)."""

    def __init__(self, servicer: Any, manager: Any = None):
        self.servicer = servicer
        self.manager = manager

    def handlers(self) -> dict[int, Handler]:
        """API key -> handler; the versions are in services.common.kafka.surface."""
        return {PRODUCE: self.produce, FETCH: self.fetch, LIST_OFFSETS: self.list_offsets,
                OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch, DELETE_RECORDS: self.delete_records,
                DESCRIBE_PRODUCERS: self.describe_producers, DESCRIBE_LOG_DIRS: self.describe_log_dirs}

    async def describe_log_dirs(self, req: Any, version: int, ctx: RequestContext) -> dict:
        """DescribeLogDirs v1-4 (KIP-113, KIP-827): this process's one log directory
        (`<data dir>/logs`) with each replica stored here (leader or follower) asked
        for (topics null: all): partition_size in bytes (its segment files),
        offset_lag = max(0, high watermark - log end offset) as Kafka reports it, and
        the file system's total and usable bytes. Needs Describe on the Cluster
        (CLUSTER_AUTHORIZATION_FAILED at the top otherwise)."""
        if not authz.visible(Op.DESCRIBE, authz.CLUSTER):
            return {"throttle_time": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "results": []}
        asked = field(req, "topics")
        wanted = None if asked is None else {(t.topic, p) for t in asked for p in t.partitions}
        by_topic: dict[str, list[dict]] = {}
        for (topic, partition), p in sorted(self.manager.hosted.replicas.items()):
            if wanted is not None and (topic, partition) not in wanted:
                continue
            by_topic.setdefault(topic, []).append({
                "partition_index": partition, "partition_size": p.log.size_bytes,
                "offset_lag": max(0, p.high_watermark - p.log_end_offset),
                "is_future_key": False})
        directory = self.manager.hosted.data_dir / "logs"
        try:
            usage = shutil.disk_usage(directory)
            total, usable = usage.total, usage.free
        except OSError:
            total = usable = -1
        return {"throttle_time": 0, "error_code": 0, "results": [{
            "error_code": 0, "log_dir": str(directory.resolve()), "total_bytes": total, "usable_bytes": usable,
            "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}]}

    async def produce(self, req: Any, version: int, ctx: RequestContext) -> dict | None:
        acks = field(req, "acks", 1)
        request = pb.ProduceRequest(transactional_id=field(req, "transactional_id") or "", acks=acks,
                                    timeout_ms=field(req, "timeout", 30000),
                                    topics=[pb.TopicProduceData(name=t.name, partitions=[
                                        pb.PartitionProduceData(partition=p.index, records=bytes(p.records or b""))
                                        for p in t.partition_data]) for t in req.topic_data])
        resp = await self.servicer.Produce(request, None)
        if acks == 0:
            return None
        return {"throttle_time": 0, "responses": [
            {"name": t.name, "partition_responses": [
                {"index": p.partition,
                 "error_code": _kafka_produce_error(p.error_code),
                 "base_offset": p.base_offset,
                 "log_append_time": p.log_append_time_ms if p.log_append_time_ms else -1,
                 "log_start_offset": p.log_start_offset, "error_message": p.error_message or None}
                for p in t.partitions]} for t in resp.topics]}

    async def fetch(self, req: Any, version: int, ctx: RequestContext) -> dict:
        if field(req, "replica_id", -1) >= 0:
            return {"throttle_time": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "session_id": 0,
                    "responses": []}
        request = pb.FetchRequest(max_wait_ms=field(req, "max_wait", 0), min_bytes=field(req, "min_bytes", 1),
                                  max_bytes=field(req, "max_bytes", 0),
                                  isolation_level=field(req, "isolation_level", 0),
                                  topics=[pb.FetchTopic(topic=t.topic, partitions=[
                                      pb.FetchPartition(partition=p.partition, fetch_offset=p.fetch_offset,
                                                        partition_max_bytes=p.partition_max_bytes,
                                                        current_leader_epoch=field(p, "current_leader_epoch", -1))
                                      for p in t.partitions]) for t in req.topics])
        resp = await self.servicer.Fetch(request, _Connection(ctx.peer))
        return {"throttle_time": 0, "error_code": resp.error_code, "session_id": 0, "responses": [
            {"topic": t.topic, "partitions": [
                {"partition_index": p.partition, "error_code": p.error_code, "high_watermark": p.high_watermark,
                 "last_stable_offset": p.last_stable_offset, "log_start_offset": p.log_start_offset,
                 "aborted_transactions": [{"producer_id": a.producer_id, "first_offset": a.first_offset}
                                          for a in p.aborted_transactions]
                 if request.isolation_level == 1 else None,
                 "preferred_read_replica": -1, "records": bytes(p.records)}
                for p in t.partitions]} for t in resp.responses]}

    async def list_offsets(self, req: Any, version: int, ctx: RequestContext) -> dict:
        """ListOffsets v1-7 with Kafka's timestamps: -1 latest (the LSO under
        read_committed), -2 earliest, -3 MAX_TIMESTAMP (KIP-734: the offset and
        timestamp of the record with the largest timestamp; the gRPC API's -4, its -3
        being the LSO), >= 0 by time (ms). Another negative timestamp gets
        INVALID_REQUEST."""
        asked = [(t.name, [(p.partition_index, _grpc_timestamp(p.timestamp)) for p in t.partitions])
                 for t in req.topics]
        request = pb.ListOffsetsRequest(isolation_level=field(req, "isolation_level", 0), topics=[
            pb.ListOffsetsTopic(name=name, partitions=[pb.ListOffsetsPartition(partition=p, timestamp=ts)
                                                       for p, ts in parts if ts is not None])
            for name, parts in asked])
        resp = await self.servicer.ListOffsets(request, None)
        answers = iter(p for t in resp.topics for p in t.partitions)
        topics = []
        for name, parts in asked:
            out = []
            for p, ts in parts:
                if ts is None:
                    out.append({"partition_index": p, "error_code": ErrorCode.INVALID_REQUEST, "timestamp": -1,
                                "offset": -1, "leader_epoch": -1})
                    continue
                a = next(answers)
                out.append({"partition_index": a.partition, "error_code": a.error_code, "timestamp": a.timestamp,
                            "offset": a.offset, "leader_epoch": -1})
            topics.append({"name": name, "partitions": out})
        return {"throttle_time": 0, "topics": topics}

    async def offset_for_leader_epoch(self, req: Any, version: int, ctx: RequestContext) -> dict:
        request = pb.OffsetForLeaderEpochRequest(topics=[
            pb.OffsetForLeaderTopic(topic=t.topic, partitions=[
                pb.OffsetForLeaderPartition(partition=p.partition, current_leader_epoch=p.current_leader_epoch,
                                            leader_epoch=p.leader_epoch) for p in t.partitions])
            for t in req.topics])
        resp = await self.servicer.OffsetForLeaderEpoch(request, None)
        return {"throttle_time": 0, "topics": [
            {"topic": t.topic, "partitions": [
                {"error_code": p.error_code, "partition": p.partition, "leader_epoch": p.leader_epoch,
                 "end_offset": p.end_offset} for p in t.partitions]} for t in resp.topics]}

    async def delete_records(self, req: Any, version: int, ctx: RequestContext) -> dict:
        request = pb.DeleteRecordsRequest(timeout_ms=field(req, "timeout", 30000), topics=[
            pb.DeleteRecordsTopic(name=t.name, partitions=[
                pb.DeleteRecordsPartition(partition=p.partition_index, offset=p.offset) for p in t.partitions])
            for t in req.topics])
        resp = await self.servicer.DeleteRecords(request, None)
        return {"throttle_time": 0, "topics": [
            {"name": t.name, "partitions": [
                {"partition_index": p.partition, "low_watermark": p.low_watermark, "error_code": p.error_code}
                for p in t.partitions]} for t in resp.topics]}

    async def describe_producers(self, req: Any, version: int, ctx: RequestContext) -> dict:
        request = pb.DescribeProducersRequest(topics=[pb.TopicPartitions(topic=t.name,
                                                                         partitions=list(t.partition_indexes))
                                                      for t in req.topics])
        resp = await self.servicer.DescribeProducers(request, None)
        return {"throttle_time": 0, "topics": [
            {"name": t.name, "partitions": [
                {"partition_index": p.partition, "error_code": p.error_code,
                 "error_message": p.error_message or None,
                 "active_producers": [{"producer_id": s.producer_id, "producer_epoch": s.producer_epoch,
                                       "last_sequence": s.last_sequence, "last_timestamp": s.last_timestamp,
                                       "coordinator_epoch": s.coordinator_epoch,
                                       "current_txn_start_offset": s.current_txn_start_offset}
                                      for s in p.active_producers]}
                for p in t.partitions]} for t in resp.topics]}
