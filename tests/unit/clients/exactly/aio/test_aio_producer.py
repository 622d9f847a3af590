"""exactly.aio's producer and core against the in-process gRPC stand-in of the
producer tests (fake_cluster): the asyncio client drives the synchronous
Producer's rules and flows, so both send the same requests; send_nowait keeps
call order; `async with transaction()` aborts on errors and closes on fencing
(KIP-98 design document, "Error Handling"); the core answers from its caches
without waiting."""
from __future__ import annotations

import asyncio

import pytest
from waiting import wait_for_async

from exactly import ConsumerGroupMetadata, OffsetAndMetadata, Producer, TopicPartition, errors
from exactly._client import COORDINATOR_TRANSACTION, run_flow
from exactly.aio import AIOProducer
from exactly.config import ProducerSchema
from exactly_wire.config import parse
from exactly.aio._core import AIOClientCore, run_flow_async

from sdk_producer.fake_cluster import FakeCluster


@pytest.fixture
def make_fc():
    made = []

    def _make():
        made.append(FakeCluster({"t": 3, "u": 1}))
        return made[-1]

    yield _make
    for fc in made:
        fc.stop()


def conf(fc, **extra):
    return {"bootstrap.servers": fc.address, "retry.backoff.ms": 10, "retry.backoff.max.ms": 50,
            "request.timeout.ms": 5000, "max.block.ms": 5000, **extra}


def _toy_flow(log):
    a = yield "one"
    log.append(a)
    try:
        yield "boom"
    except KeyError as exc:
        log.append(f"caught {exc.args[0]}")
    b = yield "two"
    return a + b


def _outcome(effect):
    if effect == "boom":
        raise KeyError("k")
    return len(effect)


def test_sync_and_async_drivers_run_a_flow_alike():
    sync_log, async_log = [], []
    assert run_flow(_toy_flow(sync_log), _outcome) == 6

    async def perform(effect):
        await asyncio.sleep(0)
        return _outcome(effect)

    assert asyncio.run(run_flow_async(_toy_flow(async_log), perform)) == 6
    assert sync_log == async_log == [3, "caught k"]


GM = ConsumerGroupMetadata("g", -1, "")


def _sync_scenario(fc) -> None:
    p = Producer(conf(fc, **{"transactional.id": "tx"}))
    try:
        p.init_transactions(5)
        p.begin_transaction()
        for i in range(5):
            p.send("t", f"v{i}", key=f"k{i}")
        p.send_offsets_to_transaction({TopicPartition("u", 0): OffsetAndMetadata(7)}, GM, 5)
        p.commit_transaction(5)
        p.begin_transaction()
        for i in range(3):
            p.send("u", f"a{i}")
        p.flush(5)
        p.abort_transaction(5)
    finally:
        p.close(5)


async def _aio_scenario(fc) -> None:
    async with AIOProducer(conf(fc, **{"transactional.id": "tx"})) as p:
        await p.init_transactions(5)
        p.begin_transaction()
        for i in range(5):
            p.send_nowait("t", f"v{i}", key=f"k{i}")
        await p.send_offsets_to_transaction({TopicPartition("u", 0): OffsetAndMetadata(7)}, GM, 5)
        await p.commit_transaction(5)
        p.begin_transaction()
        aborted = [p.send_nowait("u", f"a{i}") for i in range(3)]
        await p.flush(5)
        await p.abort_transaction(5)
        assert all(f.done() and f.exception() is None for f in aborted)


def _summary(fc):
    return (dict(fc.calls), fc.ended, {tp: [(r.key, r.value) for r, _ in fc.records(*tp)] for tp in list(fc.logs)},
            dict(fc.committed_offsets))


def test_aio_producer_sends_the_requests_of_the_sync_producer(make_fc):
    sync_fc, aio_fc = make_fc(), make_fc()
    _sync_scenario(sync_fc)
    asyncio.run(_aio_scenario(aio_fc))
    calls, ended, logs, offsets = _summary(aio_fc)
    assert _summary(sync_fc)[1:] == (ended, logs, offsets)
    for rpc in ("InitProducerId", "AddOffsetsToTxn", "TxnOffsetCommit", "EndTxn"):
        assert calls[rpc] == sync_fc.calls[rpc], rpc
    assert [(tid, committed) for tid, committed, _ in ended] == [("tx", True), ("tx", False)]
    assert offsets == {"g": {("u", 0): 7}}


def test_send_nowait_keeps_call_order_and_flush_completes_every_future(make_fc):
    fc = make_fc()

    async def main():
        async with AIOProducer(conf(fc, **{"linger.ms": 50})) as p:
            # The first calls wait for metadata in a task; later ones queue behind them.
            futures = [p.send_nowait("u", f"v{i}") for i in range(30)]
            await p.flush(5)
            assert all(f.done() for f in futures)
            assert [f.result().offset for f in futures] == list(range(30))
            last = p.send_nowait("u", "last")
            await p.flush(5)  # not `await send`: that would wait out linger.ms in real time
            assert last.result().offset == 30

    asyncio.run(main())
    assert [r.value for r, _ in fc.records("u", 0)] == [f"v{i}".encode() for i in range(30)] + [b"last"]


def test_transaction_context_commits_or_aborts_and_reraises(make_fc):
    fc = make_fc()

    async def main():
        async with AIOProducer(conf(fc, **{"transactional.id": "tx"})) as p:
            await p.init_transactions(5)
            async with p.transaction():
                await p.send("u", "kept")
            with pytest.raises(RuntimeError, match="bad input"):
                async with p.transaction():
                    await p.send("u", "dropped")
                    raise RuntimeError("bad input")
            async with p.transaction():  # still usable after the abort
                await p.send("u", "kept too")

    asyncio.run(main())
    assert [committed for _, committed, _ in fc.ended] == [True, False, True]


def test_transaction_context_closes_the_producer_when_fenced(make_fc):
    fc = make_fc()

    async def main():
        p = AIOProducer(conf(fc, **{"transactional.id": "tx"}))
        await p.init_transactions(5)
        newer = Producer(conf(fc, **{"transactional.id": "tx"}))
        try:
            newer.init_transactions(5)  # a newer epoch: `p` is a zombie
            with pytest.raises(errors.ProducerFencedError):
                async with p.transaction():
                    await p.send("u", "zombie")
        finally:
            newer.close(5)
        with pytest.raises(errors.IllegalStateError, match="closed"):
            p.begin_transaction()
            await p.send("u", "after")
        await p.close()

    asyncio.run(main())
    assert all(tid == "tx" and not committed for tid, committed, _ in fc.ended)


def test_core_answers_from_its_caches_and_refreshes_in_the_background(make_fc):
    fc = make_fc()

    async def main():
        core = AIOClientCore(parse(ProducerSchema, conf(fc)))
        try:
            with pytest.raises(errors.NetworkException):
                core.metadata()  # nothing cached yet: a refresh starts
            md = await wait_for_async(lambda: core._metadata, 5, "the background metadata refresh")
            assert core.metadata(["t"]) is md and md.partitions("t") == [0, 1, 2]
            with pytest.raises(errors.CoordinatorNotAvailableError):
                core.find_coordinator("tx", COORDINATOR_TRANSACTION)
            assert core.background()  # the lookup
            addr = await core.find_coordinator_async("tx", COORDINATOR_TRANSACTION)
            assert core.find_coordinator("tx", COORDINATOR_TRANSACTION) == addr == fc.address
        finally:
            await core.close()
        with pytest.raises(errors.IllegalStateError):
            core.cluster_stub()

    asyncio.run(main())


def test_aio_clients_need_a_running_loop():
    with pytest.raises(RuntimeError):
        AIOProducer({"bootstrap.servers": "127.0.0.1:1"})
