"""The gRPC adapter in-process on 127.0.0.1:0, over the coordinator with fakes."""
from __future__ import annotations

import asyncio

import grpc
from txn_coordinator_fakes import Harness, run

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.txn_coordinator.servicer import TxnCoordinatorServicer

E = ErrorCode


async def _serve(h: Harness):
    server = grpc.aio.server()
    pbg.add_TransactionCoordinatorServicer_to_server(TxnCoordinatorServicer(h.coord), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    return server, channel, pbg.TransactionCoordinatorStub(channel)


def test_transaction_over_grpc():
    async def scenario():
        h = Harness()
        await h.elect()
        server, channel, stub = await _serve(h)
        try:
            r = await stub.InitProducerId(pb.InitProducerIdRequest(
                transactional_id="t", transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1))
            assert (r.error_code, r.producer_epoch) == (E.NONE, 0)
            pid, epoch = r.producer_id, r.producer_epoch
            add = await stub.AddPartitionsToTxn(pb.AddPartitionsToTxnRequest(
                transactional_id="t", producer_id=pid, producer_epoch=epoch,
                topics=[pb.TopicPartitions(topic="orders", partitions=[0, 1])]))
            assert [(t.topic, p.partition, p.error_code) for t in add.results for p in t.partitions] == \
                [("orders", 0, E.NONE), ("orders", 1, E.NONE)]
            off = await stub.AddOffsetsToTxn(pb.AddOffsetsToTxnRequest(
                transactional_id="t", producer_id=pid, producer_epoch=epoch, group_id="g"))
            assert off.error_code == E.NONE
            desc = await stub.DescribeTransactions(pb.DescribeTransactionsRequest(transactional_ids=["t", "x"]))
            d, x = desc.transaction_states
            assert (d.error_code, d.state, d.producer_id, d.transaction_timeout_ms) == (E.NONE, "Ongoing", pid, 60000)
            assert {(t.topic, tuple(t.partitions)) for t in d.topics} >= {("orders", (0, 1))}
            assert x.error_code == E.TRANSACTIONAL_ID_NOT_FOUND
            lst = await stub.ListTransactions(pb.ListTransactionsRequest(state_filters=["Ongoing"]))
            assert [(s.transactional_id, s.state) for s in lst.transaction_states] == [("t", "Ongoing")]
            end = await stub.EndTxn(pb.EndTxnRequest(transactional_id="t", producer_id=pid, producer_epoch=epoch,
                                                     committed=True))
            assert end.error_code == E.NONE
            await h.settle()
            again = await stub.EndTxn(pb.EndTxnRequest(transactional_id="t", producer_id=pid,
                                                       producer_epoch=epoch, committed=False))
            assert again.error_code == E.INVALID_TXN_STATE
            bad = await stub.InitProducerId(pb.InitProducerIdRequest(transactional_id="t",
                                                                      transaction_timeout_ms=10**9))
            assert bad.error_code == E.INVALID_TRANSACTION_TIMEOUT
            idem = await stub.InitProducerId(pb.InitProducerIdRequest(producer_id=-1, producer_epoch=-1))
            assert idem.error_code == E.NONE and idem.producer_id != pid
        finally:
            await channel.close()
            await server.stop(None)

    run(scenario())


def test_unset_kip360_fields_do_not_fence():
    async def scenario():
        h = Harness(first_pid=5000)
        await h.elect()
        server, channel, stub = await _serve(h)
        try:
            for expected_epoch in (0, 1):
                r = await stub.InitProducerId(pb.InitProducerIdRequest(transactional_id="t",
                                                                       transaction_timeout_ms=1000))
                assert (r.error_code, r.producer_epoch) == (E.NONE, expected_epoch)
        finally:
            await channel.close()
            await server.stop(None)

    run(scenario())


def test_producer_id_zero_epoch_zero_is_a_real_kip360_pair():
    """PID 0 with epoch 0 is a PID the coordinator hands out; sent as the KIP-360
    current pair it must not read as "absent" (proto3 field presence)."""
    async def scenario():
        h = Harness(first_pid=0)
        await h.elect()
        server, channel, stub = await _serve(h)
        try:
            first = await stub.InitProducerId(pb.InitProducerIdRequest(transactional_id="t",
                                                                       transaction_timeout_ms=1000))
            assert (first.error_code, first.producer_id, first.producer_epoch) == (E.NONE, 0, 0)
            bump = pb.InitProducerIdRequest(transactional_id="t", transaction_timeout_ms=1000, producer_id=0,
                                            producer_epoch=0)
            r = await stub.InitProducerId(bump)
            assert (r.error_code, r.producer_id, r.producer_epoch) == (E.NONE, 0, 1)
            # The same request again is a retry whose answer was lost: the same epoch.
            r = await stub.InitProducerId(bump)
            assert (r.error_code, r.producer_id, r.producer_epoch) == (E.NONE, 0, 1)
        finally:
            await channel.close()
            await server.stop(None)

    run(scenario())


def test_group_aware_init_fields():
    async def scenario():
        h = Harness()
        await h.elect()
        server, channel, stub = await _serve(h)
        try:
            req = pb.InitProducerIdRequest(transactional_id="t", transaction_timeout_ms=1000, producer_id=-1,
                                           producer_epoch=-1, consumer_group_id="g", generation_id=3,
                                           assigned_partitions=[pb.TopicPartitions(topic="in", partitions=[0])])
            assert (await stub.InitProducerId(req)).error_code == E.NONE
            assert h.md("t").group.generation_id == 3
            req.generation_id = 2
            req.transactional_id = "u"
            assert (await stub.InitProducerId(req)).error_code == E.ILLEGAL_GENERATION
        finally:
            await channel.close()
            await server.stop(None)

    asyncio.run(scenario())
