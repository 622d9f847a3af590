"""init_transactions(timeout=None, keep_prepared_txn=False) is the classic call only
(confluent-kafka's init_transactions(timeout), Java's initTransactions()); the
group-aware form of the KIP-447 draft is init_transactions_for_group(partitions, group,
generation, timeout) on Producer and AIOProducer. The call of earlier releases with the
partitions first is refused with a TypeError naming the group-aware method. Against
exactly.testing.MockCluster."""
from __future__ import annotations

import asyncio
import inspect
import warnings

import pytest

from exactly import ConsumerGroupMetadata, OffsetAndMetadata, Producer, TopicPartition, errors
from exactly.aio import AIOProducer
from exactly.aio import producer as aio_producer
from exactly.aio._core import AIOClientCore
from exactly_wire.error_codes import ErrorCode

from exactly.testing import MockCluster, MockTime

from .clocked import on_clock

TP = TopicPartition("u", 0)
GM = ConsumerGroupMetadata("g", 3, "member-1")
NEW_METHOD = "init_transactions_for_group"


@pytest.fixture
def fc():
    with MockCluster({"t": 3, "u": 1}) as cluster:
        yield cluster


def conf(fc, tid, **extra):
    return {"bootstrap.servers": fc.bootstrap_servers, "retry.backoff.ms": 10, "retry.backoff.max.ms": 50,
            "request.timeout.ms": 5000, "max.block.ms": 5000, "transactional.id": tid, **extra}


def init_requests(fc):
    return fc.requests_of("InitProducerId")


@pytest.fixture
def clock():
    return MockTime(runs=True)


@pytest.fixture
def make(fc):
    made = []

    def _make(tid, clock=None):
        """A producer of `tid`; on `clock` (a MockTime: for calls that wait out a
        timeout) when given, else on real time."""
        made.append((Producer if clock is None else on_clock(Producer, clock))(conf(fc, tid), transport=fc))
        return made[-1]

    yield _make
    for p in made:
        p.close(timeout=5)


def _fields(req):
    """An InitProducerId request without its transactional.id."""
    return (req.consumer_group_id, req.generation_id, req.transaction_timeout_ms, req.keep_prepared_txn,
            [(tps.topic, list(tps.partitions)) for tps in req.assigned_partitions])


def test_a_group_aware_producer_sends_its_group_and_commits_records_and_offsets(fc, make):
    p = make("tx-b")
    p.init_transactions_for_group([TP], GM)
    assert _fields(init_requests(fc)[0]) == ("g", 3, 60000, False, [("u", [0])])
    assert (p._txn.group_id, p._txn.generation_id, p._flows.assigned) == ("g", 3, [TP])
    p.begin_transaction()
    p.send("u", b"v").result(5)
    # The group has no members in the cluster: its generation is 0.
    p.send_offsets_to_transaction({TP: OffsetAndMetadata(4)}, ConsumerGroupMetadata("g", 0, ""), 5)
    p.commit_transaction(5)
    assert [(t.transactional_id, t.committed, t.partitions) for t in fc.completed_transactions] == \
        [("tx-b", True, frozenset({("u", 0), ("__consumer_offsets", 0)}))]
    assert fc.committed_offsets("g")[("u", 0)] == 4


@pytest.mark.parametrize("call", [
    lambda p: p.init_transactions(),
    lambda p: p.init_transactions(5),
    lambda p: p.init_transactions(5.0),
    lambda p: p.init_transactions(None),
    lambda p: p.init_transactions(timeout=5),
    lambda p: p.init_transactions(5, keep_prepared_txn=True),
    lambda p: p.init_transactions(timeout=5, keep_prepared_txn=False),
    lambda p: p.init_transactions_for_group([TP], "g", 3),
    lambda p: p.init_transactions_for_group([TP], GM, timeout=5),
    lambda p: p.init_transactions_for_group(partitions=[TP], group="g", generation=3, timeout=5),
], ids=["none", "int", "float", "None", "keyword", "keep-prepared", "keywords", "group", "group-metadata",
        "group-keywords"])
def test_the_current_forms_do_not_warn(fc, make, call):
    p = make("tx-w")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        call(p)
    req = init_requests(fc)[-1]
    assert req.transactional_id == "tx-w" and req.producer_id == -1


def test_the_classic_form_sends_no_group(fc, make):
    p = make("tx-c")
    p.init_transactions(5)
    assert _fields(init_requests(fc)[0]) == ("", 0, 60000, False, [])  # no group fields set
    assert p._txn.group_id is None


def test_the_signatures_are_the_current_ones():
    for cls in (Producer, AIOProducer):
        assert list(inspect.signature(cls.init_transactions).parameters) == ["self", "timeout", "keep_prepared_txn"]
        assert list(inspect.signature(cls.init_transactions_for_group).parameters) == \
            ["self", "partitions", "group", "generation", "timeout"]
    assert inspect.iscoroutinefunction(AIOProducer.init_transactions)


def test_the_earlier_call_is_refused_naming_the_group_method(fc, make):
    p = make("tx-e")
    with pytest.raises(TypeError, match=NEW_METHOD):
        p.init_transactions([TP])  # the partitions where the timeout goes
    with pytest.raises(TypeError):
        p.init_transactions([TP], "g", 3)
    with pytest.raises(TypeError):
        p.init_transactions(partitions=[TP], group="g", generation=3)
    with pytest.raises(TypeError):
        p.init_transactions(5, bogus=1)
    with pytest.raises(ValueError, match="generation >= 0"):
        p.init_transactions_for_group([TP], "g")
    with pytest.raises(ValueError, match="needs a consumer group"):
        p.init_transactions_for_group([TP], None, 3)
    assert init_requests(fc) == []
    plain = Producer({"bootstrap.servers": fc.bootstrap_servers}, transport=fc)
    try:
        with pytest.raises(errors.IllegalStateError, match="transactional.id"):
            plain.init_transactions_for_group([TP], "g", 3)
        with pytest.raises(errors.IllegalStateError, match="transactional.id"):
            plain.init_transactions(5)
    finally:
        plain.close(5)


def _timed(call, clock):
    """Seconds (on the producer's virtual clock) until `call()` raised KafkaTimeoutError."""
    start = clock.now_s()
    with pytest.raises(errors.KafkaTimeoutError):
        call()
    return clock.now_s() - start


@pytest.mark.parametrize("call", [
    lambda p: p.init_transactions(0.3),
    lambda p: p.init_transactions(timeout=0.3),
    lambda p: p.init_transactions_for_group([TP], "g", 3, timeout=0.3),
], ids=["positional", "keyword", "group"])
def test_a_timeout_is_honoured(fc, make, clock, call):
    # The coordinator stays loading: only the timeout (0.3 s, not max.block.ms = 5 s) ends the call.
    # It returns up to one backoff (retry.backoff.max.ms 50 + jitter) before 0.3 s: no try
    # would start after the deadline. Virtual time: the backoffs take no real time.
    fc.fail_next("InitProducerId", *[ErrorCode.COORDINATOR_LOAD_IN_PROGRESS] * 10000)
    p = make("tx-t", clock)
    elapsed = _timed(lambda: call(p), clock)
    assert 0.3 - 0.07 <= elapsed < 2.5, elapsed
    assert len(init_requests(fc)) >= 2, "retried until the timeout"


# ---------------------------------------------------------------- asyncio


def test_aio_forms_and_their_timeout(fc, clock, monkeypatch):
    def clocked(settings, transport=None):  # the third producer's core: on the virtual clock
        core = AIOClientCore(settings, transport=transport)
        core.clock = clock
        return core

    async def scenario():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            async with AIOProducer(conf(fc, "tx-a0"), transport=fc) as p:
                with pytest.raises(TypeError, match=NEW_METHOD):
                    await p.init_transactions([TP])
            async with AIOProducer(conf(fc, "tx-a1"), transport=fc) as p:
                await p.init_transactions(5)
            async with AIOProducer(conf(fc, "tx-a2"), transport=fc) as p:
                await p.init_transactions(timeout=5)
            fc.fail_next("InitProducerId", *[ErrorCode.COORDINATOR_LOAD_IN_PROGRESS] * 10000)
            monkeypatch.setattr(aio_producer, "AIOClientCore", clocked)
            async with AIOProducer(conf(fc, "tx-a3"), transport=fc) as p:
                for call in (lambda: p.init_transactions(0.3),
                             lambda: p.init_transactions_for_group([TP], "g", 3, timeout=0.3)):
                    start = clock.now_s()
                    with pytest.raises(errors.KafkaTimeoutError):
                        await call()
                    assert 0.3 - 0.07 <= clock.now_s() - start < 2.5

    asyncio.run(scenario())
