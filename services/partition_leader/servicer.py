"""gRPC adapter of the partition leader: exactly.v1.PartitionLeader.

Only translates protobuf messages to calls on the ReplicaManager / Partition domain
objects and back (docs/design.md, "Code conventions"); protocol outcomes are
per-partition error codes (docs/design.md, "Errors"). Runs on grpc.aio: one event
loop, domain calls on it.

The waiting lives in the domain (`ReplicaManager.append_records`, `write_markers`,
`fetch_messages` and `purgatory.Purgatory`, Kafka's delayed produce and delayed
fetch): acks=all waits for the high watermark, writes wait for leadership
confirmation (leases), and a Fetch with fewer than `min_bytes` bytes long-polls up to
`max_wait_ms`. Here `min_bytes` 0 counts as 1, since proto3 cannot tell it from
unset; send `max_wait_ms` 0 for an immediate answer. A Fetch with `replica_id` set
is a follower replicating (see `ReplicaManager.fetch_for_follower`).
"""
from __future__ import annotations

import logging

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg

from services.common.protocol import REQUEST_ARRIVAL_S
from services.common.security.auth import ANONYMOUS, current_principal

from .metrics import count_fetched
from .partition import READ_COMMITTED
from .produce import NOT_VERIFIED, ProduceContext, produce_deadline
from .replica_manager import FetchEntry, MarkerEntry, ProduceEntry, ReplicaManager, guarded

log = logging.getLogger(__name__)


def fetch_owner(context) -> str:
    """Whose parked Fetches a Fetch counts among (`exactly.fetch.max.parked.per.principal`):
    the caller's principal, or for User:ANONYMOUS its connection (`context.peer()`)."""
    principal = current_principal.get()
    peer = context.peer() if principal == ANONYMOUS and context is not None else None
    return f"connection {peer}" if peer else principal


class PartitionLeaderServicer(pbg.PartitionLeaderServicer):
    """Produce, Fetch, ListOffsets, WriteTxnMarkers, OffsetForLeaderEpoch and
    DescribeProducers and DeleteRecords over `manager`'s replicas."""

    def __init__(self, manager: ReplicaManager):
        self.manager = manager

    # ------------------------------------------------------------ Produce
    async def Produce(self, request: pb.ProduceRequest, context) -> pb.ProduceResponse:
        deadline = produce_deadline(self.manager.hosted.monotonic_s(), request.timeout_ms)
        ctx = ProduceContext.client(request.acks, deadline, request.transactional_id, request.consumer_group_id,
                                    current_principal.get(), request.add_partitions_to_txn)
        return await self._produce(request, ctx)

    async def CoordinatorProduce(self, request: pb.ProduceRequest, context) -> pb.ProduceResponse:
        deadline = produce_deadline(self.manager.hosted.monotonic_s(), request.timeout_ms)
        verified_from = request.transaction_verified_from if request.HasField("transaction_verified_from") \
            else NOT_VERIFIED
        ctx = ProduceContext.coordinator(request.acks, deadline, request.transactional_id, request.consumer_group_id,
                                         verified_from)
        return await self._produce(request, ctx)

    async def _produce(self, request: pb.ProduceRequest, ctx: ProduceContext) -> pb.ProduceResponse:
        entries = [ProduceEntry(topic.name, part.partition, part.records)
                   for topic in request.topics for part in topic.partitions]
        results = iter(await self.manager.append_records(ctx, entries))
        resp = pb.ProduceResponse()
        for topic in request.topics:
            tresp = resp.topics.add(name=topic.name)
            for part in topic.partitions:
                res = next(results)
                tresp.partitions.add(partition=part.partition, error_code=res.error, error_message=res.message,
                                     base_offset=res.base_offset, log_append_time_ms=-1,
                                     log_start_offset=res.log_start_offset)
        return resp

    # ------------------------------------------------------------ Fetch
    async def Fetch(self, request: pb.FetchRequest, context) -> pb.FetchResponse:
        entries = [FetchEntry(t.topic, p.partition, p.fetch_offset, p.partition_max_bytes, p.current_leader_epoch)
                   for t in request.topics for p in t.partitions]
        results = iter(await self.manager.fetch_messages(
            entries, max_wait_ms=request.max_wait_ms, min_bytes=request.min_bytes, max_bytes=request.max_bytes,
            isolation_level=request.isolation_level, replica_id=request.replica_id, owner=fetch_owner(context)))
        resp = pb.FetchResponse()
        for topic in request.topics:
            tresp = resp.responses.add(topic=topic.topic)
            for fp in topic.partitions:
                res = next(results)
                out = tresp.partitions.add(partition=fp.partition, error_code=res.error,
                                           high_watermark=res.high_watermark,
                                           last_stable_offset=getattr(res, "last_stable_offset", -1),
                                           log_start_offset=res.log_start_offset)
                if res.error != ErrorCode.NONE:
                    continue
                out.records = res.records
                if not request.replica_id:
                    count_fetched(topic.topic, res.records)
                    if request.isolation_level == READ_COMMITTED:
                        for pid, first in res.aborted:
                            out.aborted_transactions.add(producer_id=pid, first_offset=first)
        return resp

    # ------------------------------------------------------------ ListOffsets
    async def ListOffsets(self, request: pb.ListOffsetsRequest, context) -> pb.ListOffsetsResponse:
        resp = pb.ListOffsetsResponse()
        for topic in request.topics:
            tresp = resp.topics.add(name=topic.name)
            for lp in topic.partitions:
                out = tresp.partitions.add(partition=lp.partition, timestamp=-1, offset=-1)
                p, err = self.manager.hosted.get(topic.name, lp.partition)
                if p is None:
                    out.error_code = err
                    continue
                res, err = guarded(f"list offsets of {topic.name}-{lp.partition}", p.list_offset,
                                  lp.timestamp, request.isolation_level)
                if res is None:
                    out.error_code = err
                    continue
                out.error_code, out.offset, out.timestamp = res
        return resp

    # ------------------------------------------------------------ WriteTxnMarkers
    async def WriteTxnMarkers(self, request: pb.WriteTxnMarkersRequest, context) -> pb.WriteTxnMarkersResponse:
        markers = [MarkerEntry(m.producer_id, m.producer_epoch, m.committed, m.coordinator_epoch,
                               tuple((t.topic, p) for t in m.topics for p in t.partitions), m.transaction_version)
                   for m in request.markers]
        results = iter(await self.manager.write_markers(markers, REQUEST_ARRIVAL_S.get()))
        resp = pb.WriteTxnMarkersResponse()
        for marker in request.markers:
            per_partition = iter(next(results))
            mresp = resp.markers.add(producer_id=marker.producer_id)
            for topic in marker.topics:
                tresp = mresp.topics.add(topic=topic.topic)
                positions = None
                for partition in topic.partitions:
                    res = next(per_partition)
                    tresp.partitions.add(partition=partition, error_code=res.error, error_message=res.message)
                    if marker.transaction_version < 2 and res.error == ErrorCode.NONE and res.offset >= 0:
                        # Where a TxnPartitionsAdded of the producer's next transactions
                        # verifies its first batch here: after this marker.
                        if positions is None:
                            positions = mresp.verifiable_from.add(topic=topic.topic)
                        positions.partitions.add(partition=partition, leader_epoch=res.leader_epoch,
                                                 offset=res.offset + 1)
        return resp

    # ------------------------------------------------------------ TxnPartitionsAdded
    async def TxnPartitionsAdded(self, request: pb.TxnPartitionsAddedRequest, context
                                 ) -> pb.TxnPartitionsAddedResponse:
        """A transaction coordinator's notice (one way on the tunnel): these partitions
        are in the producer's ongoing transaction (see the proto and
        ProducerStateManager.note_added)."""
        for topic in request.topics:
            for pos in topic.partitions:
                self.manager.note_txn_partition_added(
                    request.transactional_id, request.producer_id, request.producer_epoch,
                    request.coordinator_epoch, topic.topic, pos.partition, pos.leader_epoch, pos.offset)
        return pb.TxnPartitionsAddedResponse()

    # ------------------------------------------------------------ OffsetForLeaderEpoch
    async def OffsetForLeaderEpoch(self, request: pb.OffsetForLeaderEpochRequest, context
                                   ) -> pb.OffsetForLeaderEpochResponse:
        resp = pb.OffsetForLeaderEpochResponse()
        for topic in request.topics:
            tresp = resp.topics.add(topic=topic.topic)
            for op in topic.partitions:
                res, err = guarded(f"OffsetForLeaderEpoch of {topic.topic}-{op.partition}",
                                  self.manager.end_offset_for_epoch, topic.topic, op.partition, op.leader_epoch,
                                  op.current_leader_epoch)
                if res is None:
                    tresp.partitions.add(partition=op.partition, error_code=err, leader_epoch=-1, end_offset=-1)
                    continue
                code, answer = res
                tresp.partitions.add(partition=op.partition, error_code=code, leader_epoch=answer.epoch,
                                     end_offset=answer.end_offset)
        return resp

    # ------------------------------------------------------------ DescribeProducers
    async def DescribeProducers(self, request: pb.DescribeProducersRequest, context) -> pb.DescribeProducersResponse:
        resp = pb.DescribeProducersResponse()
        for topic in request.topics:
            tresp = resp.topics.add(name=topic.topic)
            for partition in topic.partitions:
                out = tresp.partitions.add(partition=partition)
                p, err = self.manager.hosted.get(topic.topic, partition)
                if p is None:
                    out.error_code = err
                    continue
                for e in p.active_producers():
                    out.active_producers.add(producer_id=e.producer_id, producer_epoch=e.producer_epoch,
                                             last_sequence=e.last_seq, last_timestamp=e.last_timestamp,
                                             coordinator_epoch=e.coordinator_epoch,
                                             current_txn_start_offset=e.current_txn_first_offset)
        return resp

    # ------------------------------------------------------------ DeleteRecords
    async def DeleteRecords(self, request: pb.DeleteRecordsRequest, context) -> pb.DeleteRecordsResponse:
        resp = pb.DeleteRecordsResponse()
        for topic in request.topics:
            tresp = resp.topics.add(name=topic.name)
            for part in topic.partitions:
                err, low, msg = self.manager.delete_records(topic.name, part.partition, part.offset)
                tresp.partitions.add(partition=part.partition, low_watermark=low, error_code=err, error_message=msg)
        return resp
