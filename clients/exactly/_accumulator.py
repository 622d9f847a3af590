"""Per-partition record batching for the Producer (Kafka's RecordAccumulator).

`send()` appends each record, already encoded as a v2 record, to the open batch
of its partition; the sender thread drains batches that are full (`batch.size`
bytes), old enough (`linger.ms`), or wanted by a flush. A batch is framed
(header, PID, epoch, base sequence, CRC) once, when first drained, and the same
bytes are sent again on retry so the leader can deduplicate them (design doc
"Client-Broker request handling"). Also the default partitioner: murmur2 of the
key as Kafka's, sticky when there is no key (KIP-480).

No I/O here; time comes from an injectable clock (ms).
"""
from __future__ import annotations

import collections
import random
import struct
import threading
from concurrent.futures import Future
from concurrent.futures import _base as _futures_base
from typing import Callable, Iterable, Sequence

from . import errors
from exactly_wire import records as _rec
from exactly_wire.clock import SYSTEM_CLOCK, MonotonicClock
from .types import RecordMetadata, TopicPartition

Headers = Sequence[tuple[str, bytes | None]]


# ---------------------------------------------------------------- partitioner

_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2, seed
    0x9747b28c) as a signed 32-bit int, so keys land on the same partitions as
    with Kafka clients."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK32
    n4 = length >> 2
    if n4:
        for k in struct.unpack_from(f"<{n4}I", data):
            k = (k * _M) & _MASK32
            k ^= k >> 24
            k = (k * _M) & _MASK32
            h = ((h * _M) & _MASK32) ^ k
    rem = length & 3
    tail = n4 << 2
    if rem == 3:
        h ^= data[tail + 2] << 16
    if rem >= 2:
        h ^= data[tail + 1] << 8
    if rem >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """Kafka's default partitioner for keyed records: toPositive(murmur2(key)) % n."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class StickyPartitioner:
    """Keyless records stick to one partition per topic until a new batch would be
    opened there, then move to another partition chosen at random (KIP-480)."""

    def __init__(self, rng: random.Random | None = None):
        self._rng = rng or random.Random()
        self._sticky: dict[str, int] = {}

    def partition(self, topic: str, partitions: Sequence[int]) -> int:
        p = self._sticky.get(topic)
        if p is None or p not in partitions:
            p = partitions[self._rng.randrange(len(partitions))]
            self._sticky[topic] = p
        return p

    def on_new_batch(self, topic: str, partitions: Sequence[int], previous: int) -> int:
        """The sticky partition's batch is closed: pick another (if there is one)."""
        if self._sticky.get(topic) != previous:
            return self._sticky[topic]  # another thread already moved on
        if len(partitions) > 1:
            choices = [p for p in partitions if p != previous]
            p = choices[self._rng.randrange(len(choices))]
        else:
            p = partitions[0]
        self._sticky[topic] = p
        return p


# ---------------------------------------------------------------- batches

class _BatchOutcome:
    """Where the records of a completed batch landed, shared by their futures: a
    record's RecordMetadata is built when its future's result is asked for, so a
    producer that never looks costs no object per record."""

    __slots__ = ("topic", "partition", "base_offset", "timestamps", "append_time_ms")

    def __init__(self, topic: str, partition: int, base_offset: int, timestamps: list[int],
                 append_time_ms: int):
        self.topic = topic
        self.partition = partition
        self.base_offset = base_offset
        self.timestamps = timestamps
        self.append_time_ms = append_time_ms

    def record(self, index: int) -> RecordMetadata:
        ts = self.append_time_ms if self.append_time_ms >= 0 else self.timestamps[index]
        return RecordMetadata(self.topic, self.partition,
                              self.base_offset + index if self.base_offset >= 0 else -1, ts)


class _Resolution:
    """The state of every record future of one batch, set once for all of them
    (`_resolve_all`): pending, then finished with the batch's outcome or its error.
    `watched`: the batch's futures that have a done-callback or a waiter
    (concurrent.futures.wait), the only ones resolution visits one by one."""

    __slots__ = ("state", "outcome", "exception", "watched")

    def __init__(self):
        self.state = _futures_base.PENDING
        self.outcome: _BatchOutcome | None = None
        self.exception: BaseException | None = None
        self.watched: list[RecordFuture] = []


class RecordFuture(Future):
    """The Future returned by send(): a concurrent.futures.Future whose lock and
    state are those of its batch. Its state, result and error are read from the
    batch's `_Resolution`, so completing a batch costs one update, not one per record;
    its waiter and callback lists exist only once asked for (concurrent.futures.wait,
    add_done_callback), which registers the future for resolution. A future per record
    with its own Condition and lists would make send() several times slower (allocation
    and garbage collection). Its result, RecordMetadata, is built on request from the
    batch's outcome (`index`: the record's place in its batch). A record cannot be
    cancelled once sent (cancel() returns False), as in Kafka; set_result() and
    set_exception() raise RuntimeError: the producer resolves these futures."""

    def __init__(self, condition: threading.Condition, resolution: _Resolution, index: int = 0):  # noqa: no super().__init__
        self._condition = condition
        self._resolution = resolution
        self._index = index

    # concurrent.futures.Future's fields, as its methods and module functions use them
    @property
    def _state(self) -> str:
        return self._resolution.state

    @property
    def _exception(self) -> BaseException | None:
        return self._resolution.exception

    @property
    def _result(self) -> _BatchOutcome | None:
        return self._resolution.outcome

    @property
    def _waiters(self) -> list:
        return self._lists()[0]

    @property
    def _done_callbacks(self) -> list:
        return self._lists()[1]

    def _lists(self) -> tuple[list, list]:
        # Read under self._condition (as concurrent.futures does), which _resolve_all holds.
        lists = self.__dict__.get("_watch")
        if lists is None:
            lists = self.__dict__["_watch"] = ([], [])
            self._resolution.watched.append(self)
        return lists

    def cancel(self) -> bool:
        return False

    def set_result(self, result) -> None:
        raise RuntimeError("a send() future is resolved by its producer")

    def set_exception(self, exception) -> None:
        raise RuntimeError("a send() future is resolved by its producer")

    def set_running_or_notify_cancel(self) -> bool:
        raise RuntimeError("a send() future is resolved by its producer")

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """RecordMetadata of the record (waiting up to `timeout` seconds), or raise
        its error, as concurrent.futures.Future.result."""
        metadata = self.__dict__.get("_metadata")
        if metadata is None:  # built on first request, then kept
            metadata = self.__dict__["_metadata"] = super().result(timeout).record(self._index)
        return metadata


def _resolve_all(condition: threading.Condition, resolution: _Resolution,
                 outcome: _BatchOutcome | None, exc: BaseException | None) -> None:
    """Resolve every future of a batch (with the batch's outcome, or `exc`) atomically,
    then run their callbacks."""
    with condition:
        if resolution.state != _futures_base.PENDING:
            return
        resolution.outcome, resolution.exception = outcome, exc
        resolution.state = _futures_base.FINISHED
        watched = list(resolution.watched)
        for fut in watched:
            for waiter in fut._waiters:
                if exc is None:
                    waiter.add_result(fut)
                else:
                    waiter.add_exception(fut)
        condition.notify_all()
    for fut in watched:
        fut._invoke_callbacks()


class ProducerBatch:
    """Records for one partition sent in one produce request.

    Records are appended as encoded bytes with their futures; `seal()` frames
    the batch. Each record's future resolves to RecordMetadata(offset=base_offset
    + i) or fails with the batch's error.
    """

    __slots__ = ("tp", "blobs", "resolution", "timestamps", "size", "base_ts", "created_ms",
                 "closed", "producer_id", "producer_epoch", "base_sequence", "payload",
                 "attempts", "retry_at_ms", "done", "in_flight", "transactional", "error",
                 "sent_in_order", "_condition")

    def __init__(self, tp: TopicPartition, created_ms: float, base_ts: int):
        self.tp = tp
        self._condition = threading.Condition()
        self.blobs: list[bytes] = []
        self.resolution = _Resolution()
        self.timestamps: list[int] = []
        self.size = _rec.HEADER_SIZE
        self.base_ts = base_ts
        self.created_ms = created_ms
        self.closed = False
        self.producer_id = _rec.NO_PRODUCER_ID
        self.producer_epoch = _rec.NO_PRODUCER_EPOCH
        self.base_sequence = _rec.NO_SEQUENCE
        self.payload: bytes | None = None
        self.attempts = 0
        self.retry_at_ms = 0.0
        self.done = threading.Event()
        self.in_flight = False
        self.transactional = False
        self.error: BaseException | None = None
        # Every earlier batch of the partition was acknowledged when this one was sent:
        # an OUT_OF_ORDER_SEQUENCE_NUMBER answer cannot come from reordering then.
        self.sent_in_order = False

    @property
    def record_count(self) -> int:
        return len(self.blobs)

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == _rec.NO_SEQUENCE:
            return _rec.NO_SEQUENCE
        return (self.base_sequence + len(self.blobs) - 1) & 0x7FFFFFFF

    def try_append(self, key: bytes | None, value: bytes | None, headers: Headers,
                   ts: int, batch_size: int) -> Future | None:
        """Append one record; None when the batch is closed or would exceed
        `batch_size` bytes (an empty batch takes any one record)."""
        if self.closed:
            return None
        blob = _rec.encode_record(len(self.blobs), ts - self.base_ts, key, value, headers)
        if self.blobs and self.size + len(blob) > batch_size:
            return None
        fut = RecordFuture(self._condition, self.resolution, len(self.blobs))
        self.blobs.append(blob)
        self.timestamps.append(ts)
        self.size += len(blob)
        return fut

    def is_full(self, batch_size: int) -> bool:
        return self.closed or self.size >= batch_size

    def seal(self, producer_id: int, producer_epoch: int, base_sequence: int,
             transactional: bool, compression: int) -> bytes:
        """Frame the records into a v2 batch with the given PID/epoch/sequence; later
        calls return the same bytes (retries must be byte-identical)."""
        self.closed = True
        if self.payload is None:
            self.producer_id = producer_id
            self.producer_epoch = producer_epoch
            self.base_sequence = base_sequence
            self.transactional = transactional
            max_ts = max(self.timestamps)
            self.payload = _rec.build_batch(
                b"".join(self.blobs), len(self.blobs), self.base_ts, max_ts, len(self.blobs) - 1,
                producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence,
                transactional=transactional, compression=compression)
        return self.payload

    def unseal(self) -> None:
        """Drop the framing and sequence so the batch is sent again under a new
        PID/epoch (only for batches the leader rejected without writing)."""
        self.payload = None
        self.producer_id = _rec.NO_PRODUCER_ID
        self.producer_epoch = _rec.NO_PRODUCER_EPOCH
        self.base_sequence = _rec.NO_SEQUENCE

    @property
    def has_sequence(self) -> bool:
        return self.base_sequence != _rec.NO_SEQUENCE

    def complete(self, base_offset: int, log_append_time_ms: int = -1) -> None:
        """Resolve every record's future with its RecordMetadata."""
        if self.done.is_set():
            return
        topic, partition = self.tp
        _resolve_all(self._condition, self.resolution,
                     _BatchOutcome(topic, partition, base_offset, self.timestamps, log_append_time_ms), None)
        self.done.set()

    def fail(self, exc: BaseException) -> None:
        """Fail every record's future with `exc` (one shared instance)."""
        if self.done.is_set():
            return
        self.error = exc
        _resolve_all(self._condition, self.resolution, None, exc)
        self.done.set()

    def __repr__(self) -> str:
        return (f"ProducerBatch({self.tp.topic}-{self.tp.partition}, records={len(self.blobs)}, "
                f"bytes={self.size}, seq={self.base_sequence}, attempts={self.attempts})")


# RecordAccumulator.append: with more batches than this queued for a partition, an
# appender opening a new batch first waits (at most YIELD_WAIT_S seconds) for the
# sender thread to drain or complete one. 0: a full batch is handed over before the
# next one fills, so the leader writes it meanwhile (with 2, a producer committing
# every 10 ms sent its transaction's two 256 KB batches only once commit_transaction()
# let go of the GIL, and waited 5.4 ms p50 for them there; with 0, 0.49-0.50 x the
# plain rate became 0.70-0.78 x on the benchmark machine).
QUEUED_BATCHES_BEFORE_YIELD = 0
YIELD_WAIT_S = 0.005


class RecordAccumulator:
    """Batches per partition, bounded by `buffer_memory` bytes in total.

    `batch_size` (bytes) closes a batch; `linger_ms` is how long a non-full batch
    waits for more records. `clock`: the producer's monotonic clock (`clock()` ms;
    its `wait` bounds the max.block.ms wait for buffer space). `sender_thread`: the
    sender runs on a thread of its own, which an appender hands the GIL to (`append`);
    False for a sender on the appender's own event loop, which a wait could only delay.
    Thread-safe.
    """

    def __init__(self, batch_size: int = 16384, linger_ms: float = 5,
                 buffer_memory: int = 32 * 1024 * 1024, clock: MonotonicClock = SYSTEM_CLOCK,
                 sender_thread: bool = True):
        self.sender_thread = sender_thread
        self.batch_size = batch_size
        self.linger_ms = linger_ms
        self.buffer_memory = buffer_memory
        self.clock = clock
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._queues: dict[TopicPartition, collections.deque[ProducerBatch]] = {}
        self._incomplete: set[ProducerBatch] = set()
        self._buffered = 0
        self._flushes = 0
        self.closed = False

    # ------------------------------------------------------------ append

    def append(self, tp: TopicPartition, ts: int, key: bytes | None, value: bytes | None,
               headers: Headers = (), abort_on_new_batch: bool = False,
               max_block_ms: float = 60000) -> tuple[Future, bool, bool] | None:
        """Append a record to the open batch of `tp`, opening a new batch if needed.
        Returns (future, batch_is_full, new_batch_created); None if a new batch was
        needed and `abort_on_new_batch` (the sticky partitioner then moves on).
        Blocks up to `max_block_ms` while the buffer is full, then raises
        errors.KafkaTimeoutError; raises errors.IllegalStateError once closed."""
        with self._lock:
            if self.closed:
                raise errors.IllegalStateError("producer is closed")
            dq = self._queues.get(tp)
            if dq is None:
                dq = self._queues[tp] = collections.deque()
            if dq:
                last = dq[-1]
                before = last.size
                fut = last.try_append(key, value, headers, ts, self.batch_size)
                if fut is not None:
                    self._buffered += last.size - before
                    return fut, last.size >= self.batch_size, False
                last.closed = True
            if abort_on_new_batch:
                return None
            if len(dq) > QUEUED_BATCHES_BEFORE_YIELD and self.sender_thread and not self._flushes:
                # Full batches wait unsent: the sender thread is behind. A thread that
                # appends in a tight loop keeps the GIL, and the sender would get it only
                # once per switch interval (5 ms), so records pile up unsent while the
                # connection idles (after every commit, as the transaction refills).
                # Hand over: wait until the sender drains or completes a batch.
                self.clock.wait(self._space, YIELD_WAIT_S)
                if self.closed:
                    raise errors.IllegalStateError("producer is closed")
            self._wait_for_space(max_block_ms)
            batch = ProducerBatch(tp, self.clock(), ts)
            fut = batch.try_append(key, value, headers, ts, self.batch_size)
            dq.append(batch)
            self._incomplete.add(batch)
            self._buffered += batch.size
            return fut, batch.is_full(self.batch_size) or len(dq) > 1, True

    def has_space(self) -> bool:
        """Whether a new batch may be opened without waiting for buffer.memory."""
        return self._buffered < self.buffer_memory

    def _wait_for_space(self, max_block_ms: float) -> None:
        if self._buffered < self.buffer_memory:
            return
        deadline = self.clock.now_s() + max_block_ms / 1000.0
        while self._buffered >= self.buffer_memory and not self.closed:
            remaining = deadline - self.clock.now_s()
            if remaining <= 0:
                raise errors.KafkaTimeoutError(
                    f"buffer.memory ({self.buffer_memory} bytes) full for max.block.ms ({max_block_ms:.0f} ms)")
            self.clock.wait(self._space, remaining)
        if self.closed:
            raise errors.IllegalStateError("producer is closed")

    # ------------------------------------------------------------ drain

    def ready(self, now: float | None = None, eager: Callable[[TopicPartition], bool] | None = None
              ) -> tuple[list[TopicPartition], float | None]:
        """Partitions whose head batch may be sent now (full, lingered long enough,
        flushing or closing, `eager(tp)` true, and past any retry backoff), and the ms
        until the next batch becomes ready (None: no batch waits)."""
        now = self.clock() if now is None else now
        ready: list[TopicPartition] = []
        wait: float | None = None
        with self._lock:
            force = self._flushes > 0 or self.closed
            for tp, dq in self._queues.items():
                if not dq:
                    continue
                head = dq[0]
                if head.attempts:
                    due = head.retry_at_ms
                elif force or len(dq) > 1 or head.is_full(self.batch_size) or (eager is not None and eager(tp)):
                    due = now
                else:
                    due = head.created_ms + self.linger_ms
                if due <= now:
                    ready.append(tp)
                else:
                    wait = due - now if wait is None else min(wait, due - now)
        return ready, wait

    def peek(self, tp: TopicPartition) -> ProducerBatch | None:
        with self._lock:
            dq = self._queues.get(tp)
            return dq[0] if dq else None

    def drain(self, tp: TopicPartition) -> ProducerBatch | None:
        """Remove and close the head batch of `tp` (for sending)."""
        with self._lock:
            dq = self._queues.get(tp)
            if not dq:
                return None
            batch = dq.popleft()
            batch.closed = True
            self._space.notify_all()  # an appender yielding to the sender may go on
            return batch

    def reenqueue(self, batch: ProducerBatch, backoff_ms: float, now: float | None = None) -> None:
        """Put a batch back for a retry after `backoff_ms`, before any batch with a
        higher (or no) sequence, so retries keep the partition's order."""
        now = self.clock() if now is None else now
        batch.attempts += 1
        batch.retry_at_ms = now + backoff_ms
        with self._lock:
            dq = self._queues.setdefault(batch.tp, collections.deque())
            i = 0
            if batch.has_sequence:
                while i < len(dq) and dq[i].has_sequence and _seq_before(dq[i].base_sequence, batch.base_sequence):
                    i += 1
            else:
                while i < len(dq) and dq[i].attempts:
                    i += 1
            dq.insert(i, batch)

    def deallocate(self, batch: ProducerBatch) -> None:
        """The batch is complete (acknowledged or failed): free its buffer space."""
        with self._lock:
            if batch in self._incomplete:
                self._incomplete.discard(batch)
                self._buffered -= batch.size
                self._space.notify_all()

    # ------------------------------------------------------------ bulk operations

    def expired(self, now: float, delivery_timeout_ms: float) -> list[ProducerBatch]:
        """Remove and return queued (not in-flight) batches older than delivery.timeout.ms."""
        out = []
        with self._lock:
            for dq in self._queues.values():
                while dq and now - dq[0].created_ms >= delivery_timeout_ms:
                    out.append(dq.popleft())
        return out

    def drain_all(self) -> list[ProducerBatch]:
        """Remove and return every queued batch (abort, fatal error, close)."""
        with self._lock:
            out = [b for dq in self._queues.values() for b in dq]
            for dq in self._queues.values():
                dq.clear()
            return out

    def has_queued(self) -> bool:
        with self._lock:
            return any(self._queues.values())

    def incomplete(self) -> list[ProducerBatch]:
        with self._lock:
            return list(self._incomplete)

    def begin_flush(self) -> None:
        with self._lock:
            self._flushes += 1

    def end_flush(self) -> None:
        with self._lock:
            self._flushes -= 1

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._space.notify_all()


def _seq_before(a: int, b: int) -> bool:
    """a precedes b in int32 sequence space (wrapping)."""
    return a != b and ((b - a) & 0x7FFFFFFF) < (1 << 30)


def fail_batches(batches: Iterable[ProducerBatch], exc: BaseException, acc: RecordAccumulator) -> None:
    """Fail every record of `batches` with `exc` and give their memory back to `acc`."""
    for b in batches:
        b.fail(exc)
        acc.deallocate(b)


def failed_future(exc: BaseException) -> Future:
    """A Future that already failed with `exc`."""
    f: Future = Future()
    f.set_exception(exc)
    return f


__all__ = ["murmur2", "partition_for_key", "StickyPartitioner", "ProducerBatch", "RecordFuture",
           "RecordAccumulator", "fail_batches", "failed_future"]
