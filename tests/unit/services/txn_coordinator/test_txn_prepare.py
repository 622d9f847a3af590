"""PrepareTxn: two-phase commit in the spirit of KIP-939 over in-memory fakes. A
sealed transaction stays Ongoing, is never aborted by the coordinator's clock,
survives a reload of the transaction log, is completed by EndTxn with its PID and
epoch, and is aborted by InitProducerId (fencing)."""
from __future__ import annotations

import asyncio

import grpc
from txn_coordinator_fakes import FakeLog, Harness, run

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.txn_coordinator import txn_log
from services.txn_coordinator.servicer import TxnCoordinatorServicer
from services.txn_coordinator.state import TxnState, TxnTransitMetadata

S = TxnState
E = ErrorCode


YEAR_MS = 365 * 86_400_000


def test_prepare_seals_the_ongoing_transaction_and_logs_it():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        assert await h.coord.prepare_txn("t", pid, epoch) == E.NONE
        md = h.md("t")
        assert md.state is S.ONGOING and md.is_prepared and md.prepared_timestamp == h.clock()
        last = h.log.entries()[-1].transit
        assert (last.state, last.prepared_timestamp) == (S.ONGOING, h.clock())
        n = len(h.log.entries())
        assert await h.coord.prepare_txn("t", pid, epoch) == E.NONE  # a retry: nothing logged
        assert len(h.log.entries()) == n
        [d] = h.coord.describe_transactions(["t"])
        assert d.summary.prepared_timestamp == h.clock()

    run(scenario())


def test_prepared_transaction_rejects_new_partitions():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        await h.coord.prepare_txn("t", pid, epoch)
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 1)])
        assert set(res.values()) == {E.INVALID_TXN_STATE}
        assert await h.coord.add_offsets_to_txn("t", pid, epoch, "g") == E.INVALID_TXN_STATE

    run(scenario())


def test_prepared_transaction_is_never_aborted_by_the_coordinator():
    """A participant that voted yes does not decide alone (KIP-939 has no timeout for a
    prepared transaction): neither transaction.timeout.ms nor any other time aborts it."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", timeout_ms=1000)
        await h.coord.prepare_txn("t", pid, epoch)
        assert h.coord.oldest_prepared_age_ms() == 0 and h.coord.prepared_count() == 1
        for _ in range(3):
            h.clock.advance(YEAR_MS)
            assert await h.coord.scans.abort_timed_out_transactions() == 0
        md = h.md("t")
        assert (md.state, md.is_prepared, md.producer_epoch) == (S.ONGOING, True, epoch)
        assert h.coord.oldest_prepared_age_ms() == 3 * YEAR_MS
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE  # still its to decide
        await h.settle()
        assert h.md("t").state is S.COMPLETE_COMMIT
        assert (h.coord.oldest_prepared_age_ms(), h.coord.prepared_count()) == (0, 0)

    run(scenario())


def test_prepared_transaction_completed_with_its_pid_and_epoch():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", partitions=(("orders", 0), ("payments", 1)))
        await h.coord.prepare_txn("t", pid, epoch)
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        await h.settle()
        md = h.md("t")
        assert (md.state, md.prepared_timestamp) == (S.COMPLETE_COMMIT, -1)
        assert {tp for m, tp in h.markers.written_for(pid) if m.committed} == {("orders", 0), ("payments", 1)}
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE  # retried completion
        assert (await h.coord.end_txn("t", pid, epoch, False)).error == E.INVALID_TXN_STATE

    run(scenario())


def test_new_epoch_fences_and_aborts_a_prepared_transaction():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        await h.coord.prepare_txn("t", pid, epoch)
        first = await h.coord.init_producer_id("t", 60000)
        assert first.error == E.CONCURRENT_TRANSACTIONS
        await h.settle()
        again = await h.coord.init_producer_id("t", 60000)
        assert (again.error, again.producer_id, again.producer_epoch) == (E.NONE, pid, epoch + 2)
        assert [m.committed for m, _ in h.markers.written_for(pid)] == [False]
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.PRODUCER_FENCED
        assert await h.coord.prepare_txn("t", pid, epoch) == E.PRODUCER_FENCED

    run(scenario())


def test_prepare_without_a_transaction_starts_an_empty_sealed_one():
    async def scenario():
        h = Harness()
        await h.elect()
        r = await h.coord.init_producer_id("t", 60000)
        assert await h.coord.prepare_txn("t", r.producer_id, r.producer_epoch) == E.NONE
        md = h.md("t")
        assert (md.state, md.partitions, md.txn_start_timestamp) == (S.ONGOING, set(), h.clock())
        assert md.is_prepared
        assert (await h.coord.end_txn("t", r.producer_id, r.producer_epoch, True)).error == E.NONE
        await h.settle()
        assert h.md("t").state is S.COMPLETE_COMMIT
        assert h.markers.written_for(r.producer_id) == []

    run(scenario())


def test_prepare_errors():
    async def scenario():
        h = Harness(clock_sleep=True)
        await h.elect()
        pid, epoch = await h.begin("t")
        assert await h.coord.prepare_txn("t", pid, epoch - 1) == E.PRODUCER_FENCED
        assert await h.coord.prepare_txn("t", pid + 1, epoch) == E.INVALID_PRODUCER_ID_MAPPING
        assert await h.coord.prepare_txn("unknown", pid, epoch) == E.INVALID_PRODUCER_ID_MAPPING
        h.markers.gate = asyncio.Event()  # hold the markers: PrepareCommit stays
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE

        async def after_the_wait(request) -> ErrorCode:
            """`request` waits for the previous transaction (exactly.txn.previous.completion.wait.ms
            on the injected clock) and answers once the clock passed that wait."""
            task = asyncio.create_task(request)
            # The wait sleeps on the fake clock (a real-time wait would never get here).
            await asyncio.wait_for(h.clock.sleeping.wait(), timeout=5)
            assert not task.done()
            h.clock.advance(h.coord.config.txn_previous_completion_wait_ms)
            return await task

        # The previous transaction is completing: retriable, as for AddPartitionsToTxn.
        assert await after_the_wait(h.coord.prepare_txn("t", pid, epoch + 1)) == E.CONCURRENT_TRANSACTIONS
        # the epoch before the bump
        assert await after_the_wait(h.coord.prepare_txn("t", pid, epoch)) == E.PRODUCER_FENCED
        h.markers.gate.set()
        await h.settle()

    run(scenario())


def test_prepare_txn_that_wakes_before_the_handover_add_is_retriable():
    """PrepareTxn of the producer's next transaction and that transaction's first add
    both wait for the previous transaction's markers. Once they are written the
    completion stops for the handover, and PrepareTxn, woken first, still sees
    PrepareCommit: it answers CONCURRENT_TRANSACTIONS, so the producer retries; the
    add then starts the transaction and the retry seals it."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        h.markers.gate = asyncio.Event()  # hold the markers: PrepareCommit stays
        end = await h.coord.end_txn("t", pid, epoch, True)
        assert end.error == E.NONE
        epoch = end.producer_epoch
        await h.markers.held.wait()
        prepare = asyncio.create_task(h.coord.prepare_txn("t", pid, epoch))
        add = asyncio.create_task(h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 1)]))

        async def release() -> None:  # runs once both requests wait for the completion
            assert h.coord.partitions.get(0).completions["t"].waiting == 1
            h.markers.gate.set()
        await asyncio.create_task(release())
        assert await prepare == E.CONCURRENT_TRANSACTIONS
        assert set((await add).values()) == {E.NONE}
        assert await h.coord.prepare_txn("t", pid, epoch) == E.NONE  # the retry
        md = h.md("t")
        assert (md.state, md.partitions, md.is_prepared) == (S.ONGOING, {("orders", 1)}, True)
        await h.settle()

    run(scenario())


def test_prepared_state_survives_reload():
    async def scenario():
        log = FakeLog()
        h = Harness(log=log)
        await h.elect(0, 1)
        pid, epoch = await h.begin("t", timeout_ms=1000)
        await h.coord.prepare_txn("t", pid, epoch)
        prepared_at = h.clock()
        # Another coordinator loads the partition (failover).
        h2 = Harness(log=log)
        h2.clock.set_ms(h.clock() + 5000)
        await h2.elect(0, 2)
        md = h2.md("t")
        assert md.is_prepared and md.prepared_timestamp == prepared_at
        assert await h2.coord.scans.abort_timed_out_transactions() == 0
        assert (await h2.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        await h2.settle()
        assert h2.md("t").state is S.COMPLETE_COMMIT
        assert [m.coordinator_epoch for m, _ in h2.markers.written_for(pid)] == [2]

    run(scenario())


def test_log_value_round_trip_of_the_prepared_timestamp():
    t = TxnTransitMetadata(7, -1, 2, -1, 60000, S.ONGOING, frozenset({("orders", 0)}), 100, 200,
                           prepared_timestamp=150)
    assert txn_log.decode_value(txn_log.encode_value(t)) == t
    plain = TxnTransitMetadata(7, -1, 2, -1, 60000, S.ONGOING, frozenset({("orders", 0)}), 100, 200)
    assert txn_log.decode_value(txn_log.encode_value(plain)).prepared_timestamp == -1


def test_prepare_txn_over_grpc():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        server = grpc.aio.server()
        pbg.add_TransactionCoordinatorServicer_to_server(TxnCoordinatorServicer(h.coord), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = pbg.TransactionCoordinatorStub(channel)
        try:
            desc = await stub.DescribeTransactions(pb.DescribeTransactionsRequest(transactional_ids=["t"]))
            assert desc.transaction_states[0].prepared_time_ms == -1
            r = await stub.PrepareTxn(pb.PrepareTxnRequest(transactional_id="t", producer_id=pid,
                                                           producer_epoch=epoch))
            assert r.error_code == E.NONE
            desc = await stub.DescribeTransactions(pb.DescribeTransactionsRequest(transactional_ids=["t"]))
            d = desc.transaction_states[0]
            assert (d.state, d.prepared_time_ms) == ("PrepareTxn", h.clock())
            assert (d.prepared.prepared_time_ms, d.prepared.producer_id, d.prepared.producer_epoch) == \
                (h.clock(), pid, epoch)
            # Listed as prepared, with its own pair, also once a new instance kept it.
            kept = await stub.InitProducerId(pb.InitProducerIdRequest(transactional_id="t", transaction_timeout_ms=60000,
                                                                      keep_prepared_txn=True))
            for filters, listed in (([], 1), (["PrepareTxn"], 1), (["prepare_txn"], 1), (["Ongoing"], 0)):
                found = (await stub.ListTransactions(pb.ListTransactionsRequest(state_filters=filters)))
                assert len(found.transaction_states) == listed, filters
            [t] = (await stub.ListTransactions(pb.ListTransactionsRequest())).transaction_states
            assert (t.state, t.producer_epoch, t.prepared.prepared_time_ms, t.prepared.producer_id,
                    t.prepared.producer_epoch) == ("PrepareTxn", kept.producer_epoch, h.clock(), pid, epoch)
            bad = await stub.PrepareTxn(pb.PrepareTxnRequest(producer_id=pid, producer_epoch=epoch))
            assert bad.error_code == E.INVALID_REQUEST
        finally:
            await channel.close()
            await server.stop(None)

    run(scenario())


def test_init_with_keep_prepared_txn_keeps_a_prepared_transaction_under_a_new_client_epoch():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        await h.coord.prepare_txn("t", pid, epoch)
        r = await h.coord.init_producer_id("t", 60000, keep_prepared_txn=True)
        assert (r.error, r.producer_id, r.producer_epoch, r.kept_prepared) == (E.NONE, pid, epoch + 1, True)
        assert (r.ongoing_txn_producer_id, r.ongoing_txn_producer_epoch) == (pid, epoch)
        assert h.md("t").is_prepared and h.log.entries()[-1].transit.state is S.ONGOING
        # EndTxn with the new client-facing epoch decides it; the next init bumps as usual.
        assert (await h.coord.end_txn("t", pid, epoch + 1, True)).error == E.NONE
        await h.settle()
        r = await h.coord.init_producer_id("t", 60000, keep_prepared_txn=True)
        assert (r.error, r.kept_prepared) == (E.NONE, False) and r.producer_epoch > epoch + 2

    run(scenario())


def test_init_with_keep_prepared_txn_still_aborts_an_unprepared_transaction():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        r = await h.coord.init_producer_id("t", 60000, keep_prepared_txn=True)
        assert (r.error, r.kept_prepared) == (E.CONCURRENT_TRANSACTIONS, False)
        await h.settle()
        assert h.md("t").state is S.COMPLETE_ABORT

    run(scenario())
