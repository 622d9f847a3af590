"""exactly.aio's producer and core against exactly.testing.MockCluster: the asyncio
client drives the synchronous
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

from exactly.testing import MockCluster


@pytest.fixture
def make_fc():
    made = []

    def _make():
        made.append(MockCluster({"t": 3, "u": 1}))
        return made[-1]

    yield _make
    for fc in made:
        fc.close()


def conf(fc, **extra):
    return {"bootstrap.servers": fc.bootstrap_servers, "retry.backoff.ms": 10, "retry.backoff.max.ms": 50,
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
    p = Producer(conf(fc, **{"transactional.id": "tx"}), transport=fc)
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
    async with AIOProducer(conf(fc, **{"transactional.id": "tx"}), transport=fc) as p:
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
    """The calls of each transaction coordinator RPC, the completed transactions, every
    partition's records (committed or not), the group's committed offsets."""
    return ({rpc: len(fc.requests_of(rpc)) for rpc in ("InitProducerId", "AddOffsetsToTxn", "TxnOffsetCommit",
                                                       "EndTxn")},
            [(t.transactional_id, t.committed, t.partitions) for t in fc.completed_transactions],
            {(t, p): [(r.key, r.value) for r in fc.records(t, p, "read_uncommitted")]
             for t, n in (("t", 3), ("u", 1)) for p in range(n)},
            fc.committed_offsets("g"))


def test_aio_producer_sends_the_requests_of_the_sync_producer(make_fc):
    sync_fc, aio_fc = make_fc(), make_fc()
    _sync_scenario(sync_fc)
    asyncio.run(_aio_scenario(aio_fc))
    calls, ended, logs, offsets = _summary(aio_fc)
    assert _summary(sync_fc) == (calls, ended, logs, offsets)
    assert [(tid, committed) for tid, committed, _ in ended] == [("tx", True), ("tx", False)]
    assert offsets == {("u", 0): 7}


def test_send_nowait_keeps_call_order_and_flush_completes_every_future(make_fc):
    fc = make_fc()

    async def main():
        async with AIOProducer(conf(fc, **{"linger.ms": 50}), transport=fc) as p:
            # The first calls wait for metadata in a task; later ones queue behind them.
            futures = [p.send_nowait("u", f"v{i}") for i in range(30)]
            await p.flush(5)
            assert all(f.done() for f in futures)
            assert [f.result().offset for f in futures] == list(range(30))
            last = p.send_nowait("u", "last")
            await p.flush(5)  # not `await send`: that would wait out linger.ms in real time
            assert last.result().offset == 30

    asyncio.run(main())
    assert [r.value for r in fc.records("u", 0)] == [f"v{i}".encode() for i in range(30)] + [b"last"]


def test_only_a_producer_with_a_sender_thread_hands_it_the_gil(make_fc, monkeypatch):
    """The sync Producer's appender waits for its sender thread when a full batch waits
    unsent; exactly.aio's sender is a task on the appending loop, so its appends never
    wait: with a 30 s hand-over, 40 records in batches of one still arrive at once."""
    from exactly import _accumulator
    monkeypatch.setattr(_accumulator, "YIELD_WAIT_S", 30.0)
    fc = make_fc()
    sync = Producer(conf(fc), transport=fc)
    try:
        assert sync._acc.sender_thread
    finally:
        sync.close(5)

    async def main():
        async with AIOProducer(conf(fc, **{"batch.size": 1, "linger.ms": 0}), transport=fc) as p:
            assert not p._p._acc.sender_thread
            await p.send("u", "first")  # metadata known: the rest append at once
            loop = asyncio.get_running_loop()
            started = loop.time()
            futures = [p.send_nowait("u", f"v{i}") for i in range(40)]
            await p.flush(10)
            assert loop.time() - started < 25  # one hand-over would have held the loop 30 s
            assert [f.result().offset for f in futures] == list(range(1, 41))

    asyncio.run(main())


def test_transaction_context_commits_or_aborts_and_reraises(make_fc):
    fc = make_fc()

    async def main():
        async with AIOProducer(conf(fc, **{"transactional.id": "tx"}), transport=fc) as p:
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
    assert [t.committed for t in fc.completed_transactions] == [True, False, True]


def test_transaction_context_closes_the_producer_when_fenced(make_fc):
    fc = make_fc()

    async def main():
        p = AIOProducer(conf(fc, **{"transactional.id": "tx"}), transport=fc)
        await p.init_transactions(5)
        newer = Producer(conf(fc, **{"transactional.id": "tx"}), transport=fc)
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
    assert all(t.transactional_id == "tx" and not t.committed for t in fc.completed_transactions)


def test_core_answers_from_its_caches_and_refreshes_in_the_background(make_fc):
    fc = make_fc()

    async def main():
        core = AIOClientCore(parse(ProducerSchema, conf(fc)), transport=fc)
        try:
            with pytest.raises(errors.NetworkException):
                core.metadata()  # nothing cached yet: a refresh starts
            md = await wait_for_async(lambda: core._metadata, 5, "the background metadata refresh")
            assert core.metadata(["t"]) is md and md.partitions("t") == [0, 1, 2]
            with pytest.raises(errors.CoordinatorNotAvailableError):
                core.find_coordinator("tx", COORDINATOR_TRANSACTION)
            assert core.background()  # the lookup
            addr = await core.find_coordinator_async("tx", COORDINATOR_TRANSACTION)
            assert core.find_coordinator("tx", COORDINATOR_TRANSACTION) == addr == fc.address_of("txn-coordinator")
        finally:
            await core.close()
        with pytest.raises(errors.IllegalStateError):
            core.cluster_stub()

    asyncio.run(main())


def test_aio_clients_need_a_running_loop():
    with pytest.raises(RuntimeError):
        AIOProducer({"bootstrap.servers": "127.0.0.1:1"})
