"""Kafka APIs of a transaction coordinator: InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn, ListTransactions, DescribeTransactions — adapters over the
gRPC servicer (servicer.py), so the coordinator's rules are written once
(docs/design.md, "Kafka protocol")."""
from __future__ import annotations

from typing import Any

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb

from services.common.kafka.codec import field
from services.common.kafka.listener import Handler, RequestContext

INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN = 22, 24, 25, 26
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66


class TxnCoordinatorApis:
    def __init__(self, servicer: Any):
        self.servicer = servicer

    def handlers(self) -> dict[int, Handler]:
        """API key -> handler; the versions are in services.common.kafka.surface."""
        return {INIT_PRODUCER_ID: self.init_producer_id, ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn,
                ADD_OFFSETS_TO_TXN: self.add_offsets_to_txn, END_TXN: self.end_txn,
                LIST_TRANSACTIONS: self.list_transactions, DESCRIBE_TRANSACTIONS: self.describe_transactions}

    async def init_producer_id(self, req: Any, version: int, ctx: RequestContext) -> dict:
        """InitProducerId v0-6. v6 (KIP-939): keep_prepared_txn keeps a transaction
        prepared by the SDK's PrepareTxn under a new client-facing epoch, answered with
        the prepared transaction's pair as ongoing_txn_producer_id / _epoch (-1 when
        none was kept). enable2_pc is refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KIP-939's answer where two-phase commit is not enabled for Kafka clients: the
        Kafka protocol cannot seal a transaction (PrepareTxn is an Exactly RPC), so a
        Kafka client's open transaction keeps transaction.timeout.ms."""
        if field(req, "enable2_pc", False):
            return {"throttle_time": 0, "error_code": ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    "producer_id": -1, "producer_epoch": -1}
        request = pb.InitProducerIdRequest(transactional_id=field(req, "transactional_id") or "",
                                           transaction_timeout_ms=field(req, "transaction_timeout", 60000),
                                           keep_prepared_txn=field(req, "keep_prepared_txn", False))
        pid, epoch = field(req, "producer_id", -1), field(req, "producer_epoch", -1)
        if pid >= 0 and epoch >= 0:
            request.producer_id, request.producer_epoch = pid, epoch
        resp = await self.servicer.InitProducerId(request, None)
        ok = resp.error_code == 0
        kept = ok and resp.HasField("ongoing_txn_producer_id")
        return {"throttle_time": resp.throttle_time_ms, "error_code": resp.error_code,
                "producer_id": resp.producer_id if ok else -1, "producer_epoch": resp.producer_epoch if ok else -1,
                "ongoing_txn_producer_id": resp.ongoing_txn_producer_id if kept else -1,
                "ongoing_txn_producer_epoch": resp.ongoing_txn_producer_epoch if kept else -1}

    async def add_partitions_to_txn(self, req: Any, version: int, ctx: RequestContext) -> dict:
        topics = field(req, "v3_and_below_topics", None) or field(req, "topics", ())
        request = pb.AddPartitionsToTxnRequest(
            transactional_id=field(req, "v3_and_below_transactional_id", None) or field(req, "transactional_id", ""),
            producer_id=field(req, "v3_and_below_producer_id", field(req, "producer_id", -1)),
            producer_epoch=field(req, "v3_and_below_producer_epoch", field(req, "producer_epoch", -1)),
            topics=[pb.TopicPartitions(topic=t.name, partitions=list(t.partitions)) for t in topics])
        resp = await self.servicer.AddPartitionsToTxn(request, None)
        return {"throttle_time": 0, "results_by_topic_v3_and_below": [
            {"name": t.topic, "results_by_partition": [
                {"partition_index": p.partition, "partition_error_code": p.error_code} for p in t.partitions]}
            for t in resp.results]}

    async def add_offsets_to_txn(self, req: Any, version: int, ctx: RequestContext) -> dict:
        resp = await self.servicer.AddOffsetsToTxn(pb.AddOffsetsToTxnRequest(
            transactional_id=req.transactional_id, producer_id=req.producer_id, producer_epoch=req.producer_epoch,
            group_id=req.group_id), None)
        return {"throttle_time": 0, "error_code": resp.error_code}

    async def end_txn(self, req: Any, version: int, ctx: RequestContext) -> dict:
        """EndTxn v0-v4 ends the transaction under the producer's epoch (transaction
        version 1). v5 (KIP-890 part 2) is not offered: its clients rely on the
        partition leader adding partitions to the transaction implicitly."""
        resp = await self.servicer.EndTxn(pb.EndTxnRequest(
            transactional_id=req.transactional_id, producer_id=req.producer_id, producer_epoch=req.producer_epoch,
            committed=req.committed, transaction_version=1), None)
        return {"throttle_time": 0, "error_code": resp.error_code,
                "producer_id": resp.producer_id if resp.error_code == 0 else -1,
                "producer_epoch": resp.producer_epoch if resp.error_code == 0 else -1}

    async def list_transactions(self, req: Any, version: int, ctx: RequestContext) -> dict:
        resp = await self.servicer.ListTransactions(pb.ListTransactionsRequest(
            state_filters=list(field(req, "state_filters", ())),
            producer_id_filters=list(field(req, "producer_id_filters", ())),
            duration_filter_ms=max(field(req, "duration_filter", -1) or -1, 0)), None)
        return {"throttle_time": 0, "error_code": resp.error_code, "unknown_state_filters": [],
                "transaction_states": [{"transactional_id": t.transactional_id, "producer_id": t.producer_id,
                                        "transaction_state": t.state} for t in resp.transaction_states]}

    async def describe_transactions(self, req: Any, version: int, ctx: RequestContext) -> dict:
        resp = await self.servicer.DescribeTransactions(pb.DescribeTransactionsRequest(
            transactional_ids=list(req.transactional_ids)), None)
        return {"throttle_time": 0, "transaction_states": [
            {"error_code": d.error_code, "transactional_id": d.transactional_id, "transaction_state": d.state,
             "transaction_timeout": d.transaction_timeout_ms, "transaction_start_time": d.transaction_start_time_ms,
             "producer_id": d.producer_id, "producer_epoch": d.producer_epoch,
             "topics": [{"topic": t.topic, "partitions": list(t.partitions)} for t in d.topics]}
            for d in resp.transaction_states]}
