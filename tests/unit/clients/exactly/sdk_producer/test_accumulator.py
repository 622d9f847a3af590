"""Per-partition batching by size and linger, batch framing, retries in order."""
import threading

import pytest

from exactly import errors
from exactly_wire import records
from exactly._accumulator import ProducerBatch, RecordAccumulator
from exactly.types import RecordMetadata, TopicPartition

from exactly.testing import MockTime

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def make(batch_size=16384, linger_ms=5.0, clock=None, **kw):
    clock = MockTime(1000) if clock is None else clock
    return RecordAccumulator(batch_size=batch_size, linger_ms=linger_ms, clock=clock, **kw), clock


def test_batches_close_at_batch_size():
    acc, _ = make(batch_size=300)
    value = b"x" * 50  # ~58 bytes per encoded record, 61-byte header
    results = [acc.append(TP0, 1, None, value) for _ in range(10)]
    new_batches = [r[2] for r in results]
    assert new_batches[0] and new_batches.count(True) >= 2
    batches = []
    while (b := acc.drain(TP0)) is not None:
        batches.append(b)
    assert sum(b.record_count for b in batches) == 10
    assert all(b.size <= 300 for b in batches)
    assert batches[0].record_count == 4  # 61 + 4 * 58 = 293; a fifth would pass 300


def test_record_larger_than_batch_size_gets_its_own_batch():
    acc, _ = make(batch_size=100)
    acc.append(TP0, 1, None, b"a")
    fut, full, new = acc.append(TP0, 1, None, b"y" * 500)
    assert new and full
    assert acc.drain(TP0).record_count == 1
    assert acc.drain(TP0).record_count == 1


def test_linger_decides_readiness():
    acc, clock = make(linger_ms=5)
    acc.append(TP0, 1, b"k", b"v")
    ready, wait = acc.ready()
    assert ready == [] and wait == pytest.approx(5)
    clock.advance(3)
    assert acc.ready() == ([], pytest.approx(2))
    clock.advance(2)
    assert acc.ready()[0] == [TP0]


def test_full_batch_is_ready_before_linger():
    acc, _ = make(batch_size=120, linger_ms=10_000)
    acc.append(TP0, 1, None, b"x" * 40)
    acc.append(TP0, 1, None, b"x" * 40)  # does not fit: second batch
    acc.append(TP1, 1, None, b"x")
    ready, wait = acc.ready()
    assert ready == [TP0] and wait == pytest.approx(10_000)


def test_flush_makes_everything_ready():
    acc, _ = make(linger_ms=10_000)
    acc.append(TP0, 1, None, b"v")
    acc.append(TP1, 1, None, b"v")
    assert acc.ready()[0] == []
    acc.begin_flush()
    assert sorted(acc.ready()[0]) == [TP0, TP1]
    acc.end_flush()
    assert acc.ready()[0] == []


def test_abort_on_new_batch_for_sticky_partitioner():
    acc, _ = make()
    assert acc.append(TP0, 1, None, b"v", abort_on_new_batch=True) is None
    assert acc.append(TP0, 1, None, b"v") is not None
    assert acc.append(TP0, 1, None, b"v", abort_on_new_batch=True) is not None  # joins the open batch
    acc.drain(TP0)
    assert acc.append(TP0, 1, None, b"v", abort_on_new_batch=True) is None


def test_drain_closes_the_batch():
    acc, _ = make()
    acc.append(TP0, 1, None, b"a")
    b = acc.drain(TP0)
    assert b.closed
    _, _, new = acc.append(TP0, 1, None, b"b")
    assert new and acc.drain(TP0) is not b


def test_seal_frames_a_valid_v2_batch_and_is_stable():
    acc, _ = make()
    acc.append(TP0, 1000, b"k1", b"v1", (("h", b"x"),))
    acc.append(TP0, 1003, None, b"v2")
    acc.append(TP0, 1001, b"k3", None)
    b = acc.drain(TP0)
    payload = b.seal(42, 3, 17, True, records.COMPRESSION_NONE)
    h = records.verify_crc(payload)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.record_count) == (42, 3, 17, 3)
    assert h.is_transactional and not h.is_control and h.last_sequence == 19
    assert (h.base_timestamp, h.max_timestamp) == (1000, 1003)
    recs = records.decode_records(payload)
    assert [(r.offset, r.key, r.value, r.timestamp) for r in recs] == [
        (0, b"k1", b"v1", 1000), (1, None, b"v2", 1003), (2, b"k3", None, 1001)]
    assert recs[0].headers == (("h", b"x"),)
    assert b.seal(1, 1, 1, False, records.COMPRESSION_NONE) is payload  # retries resend the same bytes
    assert b.last_sequence == 19


def test_gzip_batch_round_trips():
    acc, _ = make()
    for i in range(20):
        acc.append(TP0, 1, None, b"abc" * 100)
    b = acc.drain(TP0)
    payload = b.seal(-1, -1, -1, False, records.COMPRESSION_GZIP)
    assert len(payload) < b.size
    assert [r.value for r in records.decode_records(payload)] == [b"abc" * 100] * 20


def test_complete_gives_real_offsets_and_fail_gives_the_error():
    acc, _ = make()
    futs = [acc.append(TP0, 500 + i, None, b"v")[0] for i in range(3)]
    b = acc.drain(TP0)
    b.complete(100)
    assert [f.result(0) for f in futs] == [RecordMetadata("t", 0, 100 + i, 500 + i) for i in range(3)]
    futs = [acc.append(TP1, 1, None, b"v")[0] for _ in range(2)]
    b = acc.drain(TP1)
    b.complete(-1, log_append_time_ms=777)
    assert futs[0].result(0).timestamp == 777 and futs[0].result(0).offset == -1
    f = acc.append(TP1, 1, None, b"v")[0]
    b = acc.drain(TP1)
    exc = errors.MessageTooLargeError("no")
    b.fail(exc)
    assert f.exception(0) is exc and b.done.is_set()


def test_record_metadata_reaches_callbacks_and_asyncio_and_is_built_once():
    import asyncio
    acc, _ = make()
    seen = []
    futs = [acc.append(TP0, 10 + i, None, b"v")[0] for i in range(4)]
    futs[2].add_done_callback(lambda f: seen.append(f.result()))
    b = acc.drain(TP0)
    b.complete(40)
    assert seen == [RecordMetadata("t", 0, 42, 12)]
    assert futs[3].result(0) is futs[3].result(0)  # built on first request, then kept

    async def awaited():
        return await asyncio.wrap_future(futs[1])
    assert asyncio.run(awaited()) == RecordMetadata("t", 0, 41, 11)


def test_an_appender_waits_for_a_sender_that_is_behind_but_never_for_long(monkeypatch):
    """With more than QUEUED_BATCHES_BEFORE_YIELD batches queued for the partition, a
    new batch first waits for the sender thread (which the GIL would otherwise starve):
    a drain lets it go on at once; without one it goes on after YIELD_WAIT_S."""
    from exactly import _accumulator
    monkeypatch.setattr(_accumulator, "YIELD_WAIT_S", 30.0)
    # The appending thread's timed wait polls its condition in poll_s slices, and a
    # notify landing just as a slice times out is lost (threading.Condition): long
    # slices keep the drain below far from a slice's end.
    acc, clock = make(batch_size=100, clock=MockTime(poll_s=1.0, runs=True))
    value = b"x" * 60  # one record per batch
    for _ in range(_accumulator.QUEUED_BATCHES_BEFORE_YIELD + 1):
        acc.append(TP0, 1, None, value)
    appended = threading.Event()
    start = clock.now_s()
    threading.Thread(target=lambda: (acc.append(TP0, 1, None, value), appended.set()), daemon=True).start()
    # The appending thread waits for the sender, up to YIELD_WAIT_S (virtual time, which
    # only this thread moves).
    assert clock.wait_for_waiter(lambda deadline: deadline is not None and deadline - start >= 29.9)
    assert not appended.is_set()
    assert acc.drain(TP0) is not None
    assert appended.wait(5)  # the drain let it go on

    monkeypatch.setattr(_accumulator, "YIELD_WAIT_S", 0.01)
    acc.append(TP0, 1, None, value)  # more queued than the threshold: waits 10 ms at most, then goes on
    acc.begin_flush()
    monkeypatch.setattr(_accumulator, "YIELD_WAIT_S", 30.0)
    acc.append(TP0, 1, None, value)  # a flush is waiting for the sender anyway: no wait
    acc.end_flush()


def test_an_appender_on_the_senders_own_loop_never_waits(monkeypatch):
    """exactly.aio's sender is a task on the loop that appends (sender_thread=False):
    a wait there could only hold the sender back, so a new batch behind undrained ones
    opens at once, where a producer with a sender thread would wait for it."""
    from exactly import _accumulator
    monkeypatch.setattr(_accumulator, "YIELD_WAIT_S", 30.0)
    acc, clock = make(batch_size=100, clock=MockTime(poll_s=1.0, runs=True), sender_thread=False)
    value = b"x" * 60  # one record per batch
    start = clock.now_s()
    for _ in range(_accumulator.QUEUED_BATCHES_BEFORE_YIELD + 5):
        acc.append(TP0, 1, None, value)
    assert clock.now_s() - start < 1.0
    assert len(acc.drain_all()) == _accumulator.QUEUED_BATCHES_BEFORE_YIELD + 5


def test_reenqueue_keeps_sequence_order_and_backoff():
    acc, clock = make(linger_ms=0)
    batches = []
    for seq in (0, 1, 2):
        acc.append(TP0, 1, None, b"v")
        b = acc.drain(TP0)
        b.seal(1, 0, seq, False, 0)
        batches.append(b)
    acc.append(TP0, 1, None, b"new")  # not yet drained, no sequence
    acc.reenqueue(batches[2], backoff_ms=50)
    acc.reenqueue(batches[0], backoff_ms=50)
    acc.reenqueue(batches[1], backoff_ms=50)
    assert acc.ready()[0] == []  # head is a retry waiting for its backoff
    clock.advance(50)
    assert acc.ready()[0] == [TP0]
    order = [acc.drain(TP0) for _ in range(4)]
    assert [b.base_sequence for b in order] == [0, 1, 2, -1]
    assert [b.attempts for b in order] == [1, 1, 1, 0]


def test_expired_batches():
    acc, clock = make()
    acc.append(TP0, 1, None, b"v")
    clock.advance(100)
    acc.append(TP1, 1, None, b"v")
    assert acc.expired(clock(), 120) == []
    clock.advance(30)
    out = acc.expired(clock(), 120)
    assert [b.tp for b in out] == [TP0]


def test_buffer_memory_blocks_then_times_out_and_frees_on_completion():
    acc, clock = make(batch_size=100, buffer_memory=200, clock=MockTime(runs=True))
    acc.append(TP0, 1, None, b"x" * 80)
    acc.append(TP1, 1, None, b"x" * 80)
    started = clock.now_s()
    with pytest.raises(errors.KafkaTimeoutError):
        acc.append(TopicPartition("t", 2), 1, None, b"x", max_block_ms=50)
    assert clock.now_s() - started >= 0.05  # waited max.block.ms (virtual time)
    b = acc.drain(TP0)
    waiting, done = threading.Event(), threading.Event()

    class SpaceCondition(threading.Condition):
        def wait(self, timeout=None):
            waiting.set()
            return super().wait(timeout)

    acc._space = SpaceCondition(acc._lock)

    def blocked():
        acc.append(TopicPartition("t", 2), 1, None, b"x", max_block_ms=5000)
        done.set()

    th = threading.Thread(target=blocked)
    th.start()
    assert waiting.wait(5)  # the append blocks on buffer.memory
    assert not done.is_set()
    b.complete(0)
    acc.deallocate(b)
    assert done.wait(5)
    th.join()


def test_closed_accumulator_rejects_appends():
    acc, _ = make()
    acc.close()
    with pytest.raises(errors.IllegalStateError):
        acc.append(TP0, 1, None, b"v")


def test_batch_unseal_allows_a_new_sequence():
    b = ProducerBatch(TP0, 0, 1)
    b.try_append(None, b"v", (), 1, 1000)
    b.seal(1, 0, 5, False, 0)
    b.unseal()
    assert not b.has_sequence and b.payload is None
    p = b.seal(2, 0, 0, False, 0)
    assert records.parse_header(p).producer_id == 2


def test_record_futures_behave_as_concurrent_futures():
    import concurrent.futures as cf

    acc, _ = make()
    futs = [acc.append(TP0, 1, None, b"v")[0] for _ in range(3)]
    assert all(isinstance(f, cf.Future) for f in futs)
    assert futs[0].cancel() is False and not futs[0].cancelled()
    with pytest.raises(cf.TimeoutError):
        futs[0].result(timeout=0)  # not done: refused at once, without waiting on real time
    seen = []
    futs[1].add_done_callback(lambda f: seen.append(f.result().offset))
    results = {}

    def waiter(i):
        results[i] = futs[i].result(timeout=5).offset

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(3)]
    for th in threads:
        th.start()
    b = acc.drain(TP0)
    b.complete(40)
    for th in threads:
        th.join(5)
    assert results == {0: 40, 1: 41, 2: 42} and seen == [41]
    done, not_done = cf.wait(futs, timeout=1)
    assert len(done) == 3 and not not_done
    assert sorted(f.result().offset for f in cf.as_completed(futs, timeout=1)) == [40, 41, 42]
    late = []
    futs[2].add_done_callback(lambda f: late.append(f.done()))
    assert late == [True]


def test_waiting_on_a_pending_sibling_is_not_woken_early():
    acc, _ = make()
    f1 = acc.append(TP0, 1, None, b"a")[0]
    b1 = acc.drain(TP0)
    f2 = acc.append(TP0, 1, None, b"b")[0]  # another batch: another lock
    b1.fail(errors.NetworkException("x"))
    assert isinstance(f1.exception(0), errors.NetworkException)
    assert not f2.done()  # the accumulator completes futures synchronously: nothing can come later


def _two_batches():
    acc, _ = make()
    a = [acc.append(TP0, 1, None, b"a")[0] for _ in range(3)]
    b = [acc.append(TP1, 1, None, b"b")[0] for _ in range(2)]
    return acc.drain(TP0), a, acc.drain(TP1), b


def test_completing_a_batch_visits_only_the_futures_that_are_watched():
    """A batch's futures share one resolution: completing it sets that once, and only
    futures with a callback or a waiter are visited one by one."""
    batch, futs, _, _ = _two_batches()
    calls = []
    futs[1].add_done_callback(calls.append)
    assert batch.resolution.watched == [futs[1]]
    batch.complete(7)
    assert calls == [futs[1]]
    assert [f.done() for f in futs] == [True, True, True]
    assert [f.result(0).offset for f in futs] == [7, 8, 9]
    late = []
    futs[0].add_done_callback(late.append)  # added after completion: runs at once, once
    assert late == [futs[0]] and calls == [futs[1]]
    batch.complete(100)  # a second completion changes nothing
    assert futs[2].result(0).offset == 9 and calls == [futs[1]]


def test_a_failed_batch_fails_every_future_with_its_error():
    batch, futs, _, _ = _two_batches()
    seen = []
    futs[0].add_done_callback(lambda f: seen.append(f.exception()))
    err = errors.NotLeaderOrFollowerError("moved")
    batch.fail(err)
    assert seen == [err]
    assert all(f.exception(0) is err for f in futs)
    with pytest.raises(errors.NotLeaderOrFollowerError):
        futs[2].result(0)


def test_record_futures_work_with_concurrent_futures_wait_and_as_completed():
    import concurrent.futures
    first, a, second, b = _two_batches()
    waiting = threading.Event()
    result = {}

    def waiter():
        waiting.set()
        result["wait"] = concurrent.futures.wait(a + b, timeout=30, return_when=concurrent.futures.FIRST_COMPLETED)

    t = threading.Thread(target=waiter)
    t.start()
    waiting.wait(30)
    second.complete(0)
    t.join(30)
    done, not_done = result["wait"]
    assert done == set(b) and not_done == set(a)
    first.fail(errors.KafkaTimeoutError("expired"))
    assert set(concurrent.futures.as_completed(a + b, timeout=30)) == set(a + b)
    assert concurrent.futures.wait(a, timeout=0, return_when=concurrent.futures.FIRST_EXCEPTION).done == set(a)


def test_a_send_future_is_resolved_only_by_its_producer():
    _, futs, _, _ = _two_batches()
    for attempt in (lambda: futs[0].set_result(None), lambda: futs[0].set_exception(ValueError()),
                    futs[0].set_running_or_notify_cancel):
        with pytest.raises(RuntimeError, match="resolved by its producer"):
            attempt()
    assert not futs[0].cancel() and not futs[0].done()
