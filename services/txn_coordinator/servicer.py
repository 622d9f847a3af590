"""gRPC adapter of the TransactionCoordinator service (exactly.v1): protobuf
messages <-> `TransactionCoordinator` calls. No logic here (docs/design.md, "Code conventions")."""
from __future__ import annotations

import asyncio
import functools
import logging
from collections import defaultdict
from typing import Iterable

from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.common.security import authz
from services.common.security.acl import Operation as Op, Resource, ResourceType
from services.common.security.auth import current_principal
from services.common.security.pid_binding import RatePerPrincipal

from . import metrics
from .coordinator import TransactionCoordinator
from .state import GroupAssignment, TxnStateSummary

log = logging.getLogger(__name__)


def _partitions(topics: Iterable[pb.TopicPartitions]) -> list[TopicPartition]:
    return [(t.topic, p) for t in topics for p in t.partitions]


def _topics(partitions: Iterable[TopicPartition]) -> list[pb.TopicPartitions]:
    by_topic: dict[str, list[int]] = defaultdict(list)
    for topic, partition in sorted(partitions):
        by_topic[topic].append(partition)
    return [pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]


def _prepared(s: TxnStateSummary) -> pb.PreparedTransaction | None:
    """The PreparedTransaction of a listed transaction; None when it is not prepared."""
    if s.prepared_producer is None:
        return None
    return pb.PreparedTransaction(prepared_time_ms=s.prepared_timestamp, producer_id=s.prepared_producer[0],
                                  producer_epoch=s.prepared_producer[1])


def _rpc(name: str):
    """Shield the coordinator's work from the cancellation of a gRPC call whose
    client went away (a half-done state change must finish). A call from the Kafka
    port (kafka_api.py, `context` None) runs in its connection's task, which a
    client that goes away does not cancel, so it runs without the shield's task;
    every append it makes is shielded all the same (TxnStore.shielded). RPC latency
    and error codes are recorded by services.common.metrics for every method."""
    def wrap(fn):
        @functools.wraps(fn)
        async def handler(self, request, context):
            if context is None:
                return await fn(self, request, context)
            return await asyncio.shield(fn(self, request, context))
        return handler
    return wrap


class TxnCoordinatorServicer(pbg.TransactionCoordinatorServicer):
    """rate: with the authorizer on, the InitProducerId calls each principal may make
    (exactly.producer.ids.rate); the coordinator then binds every producer id it
    hands out (docs/design.md, "Producer-id bindings")."""

    def __init__(self, coordinator: TransactionCoordinator, rate: RatePerPrincipal | None = None):
        self._coordinator = coordinator
        self._rate = rate

    @_rpc("InitProducerId")
    async def InitProducerId(self, request: pb.InitProducerIdRequest, context) -> pb.InitProducerIdResponse:
        # KIP-360 fields: unset or -1 means "no current PID"; (0, 0) is a real pair.
        expected = None
        if request.HasField("producer_id") and request.HasField("producer_epoch") and \
                request.producer_id >= 0 and request.producer_epoch >= 0:
            expected = (request.producer_id, request.producer_epoch)
        group = None
        if request.consumer_group_id:
            group = GroupAssignment(request.consumer_group_id, request.generation_id,
                                    frozenset(_partitions(request.assigned_partitions)))
        principal = request.principal or current_principal.get() or ""
        if self._rate is not None:
            wait_ms = self._rate.acquire(principal)
            if wait_ms > 0:
                metrics.INIT_PRODUCER_ID_THROTTLED.inc()
                return pb.InitProducerIdResponse(
                    error_code=ErrorCode.THROTTLING_QUOTA_EXCEEDED, throttle_time_ms=wait_ms,
                    error_message=f"{principal} is above exactly.producer.ids.rate; retry in {wait_ms} ms",
                    producer_id=-1, producer_epoch=-1)
        r = await self._coordinator.init_producer_id(request.transactional_id, request.transaction_timeout_ms,
                                                     expected, group, principal,
                                                     keep_prepared_txn=request.keep_prepared_txn)
        resp = pb.InitProducerIdResponse(error_code=r.error, error_message=r.message,
                                         producer_id=r.producer_id, producer_epoch=r.producer_epoch)
        if r.kept_prepared:
            resp.ongoing_txn_producer_id = r.ongoing_txn_producer_id
            resp.ongoing_txn_producer_epoch = r.ongoing_txn_producer_epoch
        return resp

    @_rpc("VerifyProducerId")
    async def VerifyProducerId(self, request: pb.VerifyProducerIdRequest, context
                               ) -> pb.VerifyProducerIdResponse:
        code, why = self._coordinator.verify_producer_id(request.producer_id, request.principal,
                                                         request.transactional_id, request.transactional)
        return pb.VerifyProducerIdResponse(error_code=code, error_message=why)

    @_rpc("AddPartitionsToTxn")
    async def AddPartitionsToTxn(self, request: pb.AddPartitionsToTxnRequest, context
                                 ) -> pb.AddPartitionsToTxnResponse:
        wanted = _partitions(request.topics)
        if not request.transactional_id:
            results = {tp: ErrorCode.INVALID_REQUEST for tp in wanted}
        else:
            results = await self._coordinator.add_partitions_to_txn(
                request.transactional_id, request.producer_id, request.producer_epoch, wanted,
                verify_only=request.verify_only, group_id=request.consumer_group_id,
                generation_id=request.generation_id)
        by_topic: dict[str, list[pb.PartitionResult]] = defaultdict(list)
        for (topic, partition), code in sorted(results.items()):
            by_topic[topic].append(pb.PartitionResult(partition=partition, error_code=code))
        return pb.AddPartitionsToTxnResponse(results=[pb.TopicResult(topic=t, partitions=ps)
                                                      for t, ps in by_topic.items()])

    @_rpc("AddOffsetsToTxn")
    async def AddOffsetsToTxn(self, request: pb.AddOffsetsToTxnRequest, context) -> pb.AddOffsetsToTxnResponse:
        if not request.transactional_id:
            return pb.AddOffsetsToTxnResponse(error_code=ErrorCode.INVALID_REQUEST)
        code = await self._coordinator.add_offsets_to_txn(request.transactional_id, request.producer_id,
                                                          request.producer_epoch, request.group_id,
                                                          request.consumer_group_id, request.generation_id)
        return pb.AddOffsetsToTxnResponse(error_code=code)

    @_rpc("EndTxn")
    async def EndTxn(self, request: pb.EndTxnRequest, context) -> pb.EndTxnResponse:
        if not request.transactional_id:
            return pb.EndTxnResponse(error_code=ErrorCode.INVALID_REQUEST)
        r = await self._coordinator.end_txn(request.transactional_id, request.producer_id,
                                            request.producer_epoch, request.committed,
                                            request.consumer_group_id, request.generation_id,
                                            transaction_version=request.transaction_version or 2)
        return pb.EndTxnResponse(error_code=r.error, producer_id=r.producer_id, producer_epoch=r.producer_epoch)

    @_rpc("PrepareTxn")
    async def PrepareTxn(self, request: pb.PrepareTxnRequest, context) -> pb.PrepareTxnResponse:
        if not request.transactional_id:
            return pb.PrepareTxnResponse(error_code=ErrorCode.INVALID_REQUEST)
        code = await self._coordinator.prepare_txn(request.transactional_id, request.producer_id,
                                                   request.producer_epoch, request.consumer_group_id,
                                                   request.generation_id)
        return pb.PrepareTxnResponse(error_code=code)

    @_rpc("ListTransactions")
    async def ListTransactions(self, request: pb.ListTransactionsRequest, context) -> pb.ListTransactionsResponse:
        code, listing = self._coordinator.list_transactions(request.state_filters, request.producer_id_filters,
                                                            request.duration_filter_ms)
        return pb.ListTransactionsResponse(error_code=code, transaction_states=[
            pb.TransactionListing(transactional_id=s.transactional_id, producer_id=s.producer_id,
                                  state=s.state_name, transaction_start_time_ms=s.txn_start_timestamp,
                                  producer_epoch=s.producer_epoch, prepared=_prepared(s)) for s in listing
            if authz.visible(Op.DESCRIBE, Resource(ResourceType.TRANSACTIONAL_ID, s.transactional_id))])

    @_rpc("DescribeTransactions")
    async def DescribeTransactions(self, request: pb.DescribeTransactionsRequest, context
                                   ) -> pb.DescribeTransactionsResponse:
        out = []
        for d in self._coordinator.describe_transactions(request.transactional_ids):
            desc = pb.TransactionDescription(error_code=d.error, transactional_id=d.transactional_id)
            if d.summary is not None:
                s = d.summary
                desc.state = s.state_name
                desc.transaction_timeout_ms = s.txn_timeout_ms
                desc.transaction_start_time_ms = s.txn_start_timestamp
                desc.producer_id = s.producer_id
                desc.producer_epoch = s.producer_epoch
                # Only the topics the caller may Describe, as Kafka's DescribeTransactions answers.
                desc.topics.extend(_topics(tp for tp in s.partitions
                                           if authz.visible(Op.DESCRIBE, Resource(ResourceType.TOPIC, tp[0]))))
                desc.prepared_time_ms = s.prepared_timestamp
                if s.prepared_producer is not None:
                    desc.prepared.CopyFrom(_prepared(s))
            out.append(desc)
        return pb.DescribeTransactionsResponse(transaction_states=out)
