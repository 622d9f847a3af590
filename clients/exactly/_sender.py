"""The producer's sender thread (Kafka's `Sender`): drains ready batches from the
record accumulator, keeps the transaction's partitions registered with the
transaction coordinator (AddPartitionsToTxn), gets the PID of an idempotent producer,
sends Produce requests (one per leader, several leaders at once) and handles their
outcomes: retries with backoff, sequence bookkeeping, delivery timeouts, metadata
refreshes.

Its collaborators are explicit: the `RecordAccumulator` (batches), the
`TransactionManager` (PID, epoch, sequences, transaction state; pure), the
`ClientCore` (metadata, coordinators, gRPC stubs), a `SenderConfig` of the
producer's settings and a monotonic clock in ms (`exactly_wire.clock.monotonic_ms`).
Outcomes are processed on this thread only.
"""
from __future__ import annotations

import abc
import collections
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

from exactly_wire import compression
from exactly_wire import records as _rec
from exactly_wire.clock import SYSTEM_CLOCK, MonotonicClock
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb

from . import errors
from ._accumulator import ProducerBatch, RecordAccumulator, fail_batches, failed_future
from ._client import (COORDINATOR_ERRORS, METADATA_ERRORS, ClientCore, CoreBase, Metadata, txn_coordinator_key,
                      is_retriable)
from .config import ProducerSchema
from ._txn_manager import FENCING_CODES, TransactionManager, TransactionManagerState
from .errors import TransactionAbortedError
from .types import TopicPartition

log = logging.getLogger(__name__)

# Transport outcomes of a request that may have been applied by the coordinator.
AMBIGUOUS_CODES = frozenset({ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT})

# Kafka retries AddPartitionsToTxn quickly on CONCURRENT_TRANSACTIONS: the previous
# transaction's markers are usually written within a few ms.
ADD_PARTITIONS_RETRY_MS = 20


@dataclass(frozen=True)
class SenderConfig:
    """The producer settings the sender uses (Kafka's names in parentheses), built
    from the producer's parsed settings by `from_settings`:
    transactional_id (`transactional.id`, None: none), acks (`acks`: 0, 1, -1),
    request_timeout_ms (`request.timeout.ms`), delivery_timeout_ms
    (`delivery.timeout.ms`), retries (`retries`), backoff_ms / backoff_max_ms
    (`retry.backoff.ms` / `retry.backoff.max.ms`), max_in_flight
    (`max.in.flight.requests.per.connection`), compression (record batch
    compression id), txn_timeout_ms (`transaction.timeout.ms`)."""

    transactional_id: str | None
    acks: int
    request_timeout_ms: int
    delivery_timeout_ms: float
    retries: int
    backoff_ms: float
    backoff_max_ms: float
    max_in_flight: int
    compression: int
    txn_timeout_ms: int

    @classmethod
    def from_settings(cls, settings: ProducerSchema) -> "SenderConfig":
        """The sender's part of a producer's parsed settings (acks "all" is -1; the
        compression.type name becomes its record batch codec id)."""
        return cls(transactional_id=settings.transactional_id,
                   acks=-1 if settings.acks == "all" else int(settings.acks),
                   request_timeout_ms=settings.request_timeout_ms,
                   delivery_timeout_ms=float(settings.delivery_timeout_ms), retries=settings.retries,
                   backoff_ms=float(settings.retry_backoff_ms), backoff_max_ms=float(settings.retry_backoff_max_ms),
                   max_in_flight=settings.max_in_flight_requests_per_connection,
                   compression=compression.codec_for(settings.compression_type),
                   txn_timeout_ms=settings.transaction_timeout_ms)


def txn_coordinator_addresses(md: Metadata) -> list[str]:
    """Addresses of the live transaction coordinators in `md`, sorted (an idempotent
    producer without transactional.id asks any of them for a PID)."""
    return sorted(n.address for n in md.nodes.values() if n.role == "txn_coordinator")


class SenderCore(abc.ABC):
    """The sender's rules, shared by the sender thread (`Sender`) and the asyncio
    sender of `exactly.aio`: one `_run_once` step drains ready batches, keeps the
    transaction's partitions registered, sends Produce requests (one per leader,
    as request futures: several leaders at once) and handles their outcomes.
    A driver runs `_run_once` again after `wakeup()`, after an outcome arrives
    (`_complete`) or after the delay `_run_once` returns (ms, None: until woken).
    The core's `metadata()`, `find_coordinator()` and `call_future()` must not wait
    for the network longer than a step may take (the asyncio core answers from its
    caches and refreshes them in the background). Outcomes are processed by the
    driver's one thread or task only."""

    def __init__(self, config: SenderConfig, accumulator: RecordAccumulator, txn: TransactionManager,
                 core: CoreBase, on_metadata_change: Callable[[], None] = lambda: None,
                 clock: MonotonicClock = SYSTEM_CLOCK):
        self.on_metadata_change = on_metadata_change
        self.config = config
        self.acc = accumulator
        self.txn = txn
        self.core = core
        self.clock = clock
        self._completions: collections.deque = collections.deque()
        self._in_flight: dict[TopicPartition, int] = collections.defaultdict(int)
        self._in_flight_total = 0
        self._need_metadata = False
        self._metadata_at = 0.0
        self._add_retry_at = 0.0
        self._pid_retry_at = 0.0
        self._reset_pid = False
        self._last_metadata: Metadata | None = None
        # Quota throttling (KIP-219): leader -> clock ms until which nothing is sent to it;
        # the largest throttle_time_ms seen (Kafka's produce-throttle-time-max).
        self.throttled_until: dict[str, float] = {}
        self.throttle_time_ms_max = 0
        self._throttle_wake: float | None = None

    # ------------------------------------------------------------ driver hooks

    @abc.abstractmethod
    def wakeup(self) -> None:
        """Run the next step now (new batches, a flush, an abort)."""

    @abc.abstractmethod
    def _complete(self, fn: Callable[[], None]) -> None:
        """Queue an outcome handler for the driver's thread/task and wake it."""

    def _step(self) -> float | None:
        """One step, guarded: a failing step is a bug to log, not a reason to stop."""
        try:
            return self._run_once()
        except Exception:  # noqa: BLE001 - keep sending; the error is a bug to log
            log.exception("producer sender iteration failed")
            return self.config.backoff_ms

    def _drain_completions(self) -> None:
        """Outcomes that arrived while stopping."""
        while self._completions:
            try:
                self._completions.popleft()()
            except Exception:  # noqa: BLE001
                log.exception("producer completion failed")

    def _run_once(self) -> float | None:
        txn, acc = self.txn, self.acc
        while self._completions:
            self._completions.popleft()()
        now = self.clock()
        if txn.has_error or txn.state is TransactionManagerState.ABORTING_TRANSACTION:
            err = txn.last_error if txn.has_error else TransactionAbortedError("transaction aborted")
            queued = acc.drain_all()
            if queued:
                fail_batches(queued, err, acc)
            return None
        if txn.idempotent and not txn.is_transactional:
            wait = self._maybe_init_idempotent(now)
            if wait is not None:
                return wait
        if txn.is_transactional and now >= self._add_retry_at:
            tps = txn.take_pending_partitions()
            if tps:
                self._send_add_partitions(tps)
        delay = self._expire(now)
        # Implicit adds: a transaction's first batch to a partition goes without
        # lingering, so its leader's AddPartitionsToTxn overlaps the filling of the
        # next batches, which follow it in order.
        ready, wait = acc.ready(now, txn.not_yet_sent if txn.implicit_add else None)
        if ready:
            self._throttle_wake = None
            sent_any = self._send_ready(ready, now)
            if sent_any:
                wait = 0  # more batches may be ready for the same partitions
            elif self._throttle_wake is not None:  # a throttled leader's partitions: wait out its throttle
                wait = self._throttle_wake - now if wait is None else min(wait, self._throttle_wake - now)
        if self._need_metadata:
            wait = self._refresh_metadata(now, wait)
        if delay is not None:
            wait = delay if wait is None else min(wait, delay)
        if txn.is_transactional and txn.has_pending_partitions() and not txn.add_in_flight:
            retry_in = max(self._add_retry_at - now, 0)
            wait = retry_in if wait is None else min(wait, retry_in)
        return wait

    def _expire(self, now: float) -> float | None:
        for batch in self.acc.expired(now, self.config.delivery_timeout_ms):
            exc = errors.KafkaTimeoutError(
                f"{batch.record_count} record(s) for {batch.tp.topic}-{batch.tp.partition} expired: "
                f"delivery.timeout.ms ({self.config.delivery_timeout_ms:.0f} ms) passed")
            self._fail(batch, exc)
        return None

    def _refresh_metadata(self, now: float, wait: float | None) -> float | None:
        due = self._metadata_at + self.config.backoff_ms
        if now < due:
            return due - now if wait is None else min(wait, due - now)
        self._metadata_at = now
        self._need_metadata = False
        try:
            self.core.metadata(refresh=True)
        except errors.ExactlyError as exc:
            log.debug("metadata refresh failed: %s", exc)
            self._need_metadata = True
        return 0

    # ------------------------------------------------------------ PID for idempotence

    def _maybe_init_idempotent(self, now: float) -> float | None:
        """Non-transactional idempotent producer: get (or renew) the PID before
        draining. Returns a delay to wait instead of sending, or None."""
        txn, acc = self.txn, self.acc
        if self._reset_pid or txn.sequences_unresolved:
            if self._in_flight_total:
                return None  # wait for in-flight batches, then reset
            self._reset_pid = False
            txn.reset_producer_id()
            for b in acc.drain_all():  # re-frame queued batches under the new PID
                b.unseal()
                acc.reenqueue(b, 0, now)
        if txn.has_producer_id:
            return None
        if not acc.has_queued():
            return None
        if now < self._pid_retry_at:
            return self._pid_retry_at - now
        if txn.state is TransactionManagerState.UNINITIALIZED:
            txn.begin_initialize()
        return self._init_idempotent_pid(now)

    def _idempotent_pid_request(self) -> pb.InitProducerIdRequest:
        return pb.InitProducerIdRequest(transactional_id="", producer_id=-1, producer_epoch=-1,
                                        transaction_timeout_ms=self.config.txn_timeout_ms)

    def _pick_txn_coordinator(self, md: Metadata, now: float) -> str:
        """A live transaction coordinator to ask for a PID; raises the retriable
        errors.CoordinatorNotAvailableError when none is live."""
        addrs = txn_coordinator_addresses(md)
        if not addrs:
            raise errors.CoordinatorNotAvailableError("no transaction coordinator is live")
        return addrs[int(now) % len(addrs)]

    def _init_idempotent_pid(self, now: float) -> float | None:
        """I/O of `_maybe_init_idempotent`: InitProducerId (retried for up to
        request.timeout.ms), then `_on_idempotent_pid`. Blocks this thread."""
        core = self.core

        def _once():
            md = core.metadata()
            try:
                addr = self._pick_txn_coordinator(md, now)
            except errors.ExactlyError:
                core.metadata(refresh=True)
                raise
            resp = core.call(core.txn_stub(addr).InitProducerId, self._idempotent_pid_request())
            errors.check(resp.error_code, resp.error_message or None)
            return resp

        try:
            resp = core.retry(_once, timeout_s=self.config.request_timeout_ms / 1000.0)
        except errors.ExactlyError as exc:
            return self._on_idempotent_pid(None, exc, now)
        return self._on_idempotent_pid(resp, None, now)

    def _on_idempotent_pid(self, resp: pb.InitProducerIdResponse | None, exc: BaseException | None,
                           now: float) -> float | None:
        """Outcome of an idempotent producer's InitProducerId: adopt the PID, or fail
        queued batches on a fatal error, or retry after retry.backoff.max.ms."""
        txn = self.txn
        if exc is None:
            txn.set_producer_id_and_epoch(resp.producer_id, resp.producer_epoch)
            return None
        err = txn.initialize_failed(exc)
        log.warning("InitProducerId failed: %s", err)
        if txn.is_fatal_state:
            fail_batches(self.acc.drain_all(), err, self.acc)
            return None
        self._pid_retry_at = now + self.config.backoff_max_ms
        return self.config.backoff_max_ms

    # ------------------------------------------------------------ AddPartitionsToTxn

    def _send_add_partitions(self, tps: list[TopicPartition]) -> None:
        txn, core = self.txn, self.core
        try:
            addr = core.find_coordinator(*txn_coordinator_key(self.config.transactional_id, txn.group_id))
        except errors.ExactlyError as exc:
            self._add_failed(tps, exc)
            return
        by_topic: dict[str, list[int]] = collections.defaultdict(list)
        for tp in tps:
            by_topic[tp.topic].append(tp.partition)
        req = pb.AddPartitionsToTxnRequest(
            transactional_id=self.config.transactional_id, producer_id=txn.producer_id,
            producer_epoch=txn.producer_epoch, consumer_group_id=txn.group_id or "",
            generation_id=txn.generation_id if txn.group_id else 0,
            topics=[pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()])
        try:
            fut = core.call_future(core.txn_stub(addr).AddPartitionsToTxn, req)
        except errors.ExactlyError as exc:  # client closed
            fut = failed_future(exc)
        fut.add_done_callback(lambda f: self._complete(lambda: self._on_add_partitions(tps, f)))

    def _on_add_partitions(self, tps: list[TopicPartition], fut: Future) -> None:
        txn = self.txn
        exc = fut.exception()
        if exc is not None:
            self._add_failed(tps, exc)
            return
        codes = {TopicPartition(t.topic, r.partition): r.error_code
                 for t in fut.result().results for r in t.partitions}
        ok = [tp for tp in tps if codes.get(tp) == ErrorCode.NONE]
        txn.partitions_added(ok)
        failed = [tp for tp in tps if codes.get(tp) != ErrorCode.NONE]
        if failed:
            # OPERATION_NOT_ATTEMPTED marks partitions skipped because another one
            # failed: the other partition's error decides (retry when none other).
            worst: errors.ExactlyError = errors.CoordinatorLoadInProgressError("AddPartitionsToTxn not attempted")
            for tp in failed:
                code = codes.get(tp, ErrorCode.UNKNOWN_SERVER_ERROR)
                if code == ErrorCode.OPERATION_NOT_ATTEMPTED:
                    continue
                err = errors.for_code(code, f"AddPartitionsToTxn {tp.topic}-{tp.partition}")
                if worst.retriable:
                    worst = err
            self._add_failed(failed, worst)
        self.wakeup()

    def _add_failed(self, tps: list[TopicPartition], exc: BaseException) -> None:
        txn = self.txn
        if is_retriable(exc):
            if isinstance(exc, errors.ExactlyError) and exc.code in COORDINATOR_ERRORS:
                self.core.invalidate_coordinator(*txn_coordinator_key(self.config.transactional_id, txn.group_id))
            backoff = ADD_PARTITIONS_RETRY_MS if getattr(exc, "code", None) == ErrorCode.CONCURRENT_TRANSACTIONS \
                else self.config.backoff_ms
            self._add_retry_at = self.clock() + backoff
            # Without an answer from the coordinator the request may have been applied.
            ambiguous = not isinstance(exc, errors.ExactlyError) or exc.code in AMBIGUOUS_CODES
            txn.partitions_add_retry(tps, ambiguous)
            return
        err = txn.partitions_add_failed(tps, exc)
        log.warning("AddPartitionsToTxn failed: %r", err)
        fail_batches(self.acc.drain_all(), err, self.acc)

    # ------------------------------------------------------------ Produce

    def _send_ready(self, ready: list[TopicPartition], now: float) -> bool:
        txn, acc, core = self.txn, self.acc, self.core
        try:
            md = core.metadata()
        except errors.ExactlyError:
            self._need_metadata = True
            return False
        if md is not self._last_metadata:
            self._last_metadata = md
            self.on_metadata_change()
        if txn.idempotent and not txn.has_producer_id:
            return False
        if txn.idempotent and not txn.is_transactional and (self._reset_pid or txn.sequences_unresolved):
            return False  # the PID is about to be replaced
        by_leader: dict[str, list[ProducerBatch]] = collections.defaultdict(list)
        for tp in ready:
            if not txn.is_partition_added(tp):
                continue
            n = self._in_flight[tp]
            if n >= self.config.max_in_flight:
                continue
            head = acc.peek(tp)
            if head is None or (head.attempts and n):
                continue  # a retried batch goes alone, after the earlier ones resolved
            leader = md.leader(tp.topic, tp.partition)
            if leader is None:
                self._need_metadata = True
                continue
            until = self.throttled_until.get(leader, 0.0)
            if until > now:  # the leader throttled this client (KIP-219): send after its throttle time
                self._throttle_wake = until if self._throttle_wake is None else min(self._throttle_wake, until)
                continue
            batch = acc.drain(tp)
            if batch is None:
                continue
            if batch.payload is None:
                seq = txn.sequence_for(tp, batch.record_count) if txn.idempotent else _rec.NO_SEQUENCE
                batch.seal(txn.producer_id, txn.producer_epoch, seq, txn.is_transactional, self.config.compression)
            batch.sent_in_order = batch.has_sequence and n == 0 and \
                txn.is_next_expected(tp, batch.base_sequence)
            batch.in_flight = True
            txn.partition_sent(tp)
            self._in_flight[tp] = n + 1
            self._in_flight_total += 1
            by_leader[leader].append(batch)
        for leader, batches in by_leader.items():
            self._send_produce(leader, batches)
        return bool(by_leader)

    def _send_produce(self, leader: str, batches: list[ProducerBatch]) -> None:
        core = self.core
        by_topic: dict[str, list[pb.PartitionProduceData]] = collections.defaultdict(list)
        for b in batches:
            by_topic[b.tp.topic].append(pb.PartitionProduceData(partition=b.tp.partition, records=b.payload))
        req = pb.ProduceRequest(transactional_id=self.config.transactional_id or "", acks=self.config.acks,
                                consumer_group_id=self.txn.group_id or "",
                                add_partitions_to_txn=self.txn.implicit_add,
                                timeout_ms=self.config.request_timeout_ms,
                                topics=[pb.TopicProduceData(name=t, partitions=ps) for t, ps in by_topic.items()])
        try:
            fut = core.call_future(core.leader_stub(leader).Produce, req)
        except errors.ExactlyError as exc:
            fut = failed_future(exc)
        fut.add_done_callback(lambda f: self._complete(lambda: self._on_produce(batches, f, leader)))

    def _on_produce(self, batches: list[ProducerBatch], fut: Future, leader: str = "") -> None:
        exc = fut.exception()
        if exc is not None:
            for b in batches:
                self._on_batch_error(b, exc)
            return
        throttle_ms = fut.result().throttle_time_ms
        if throttle_ms > 0:
            # A quota exceeded (docs/design.md, "Quotas"): nothing more to this leader for
            # throttle_ms, as Kafka's producer backs off (KIP-219).
            self.throttle_time_ms_max = max(self.throttle_time_ms_max, throttle_ms)
            self.throttled_until[leader] = max(self.throttled_until.get(leader, 0.0), self.clock() + throttle_ms)
        results = {(t.name, r.partition): r for t in fut.result().topics for r in t.partitions}
        for b in batches:
            r = results.get(b.tp)
            if r is None:
                self._on_batch_error(b, errors.UnknownServerError(
                    f"no produce result for {b.tp.topic}-{b.tp.partition}"))
            elif r.error_code in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
                # DUPLICATE_SEQUENCE_NUMBER: an earlier try was written (design doc
                # "Error Handling"): success.
                self._done_in_flight(b)
                self.txn.partition_written(b.tp)
                if b.has_sequence:
                    self.txn.ack(b.tp, b.last_sequence)
                b.complete(r.base_offset, r.log_append_time_ms if r.log_append_time_ms > 0 else -1)
                self.acc.deallocate(b)
            else:
                self._on_batch_error(b, errors.for_code(r.error_code, r.error_message or None))

    def _done_in_flight(self, b: ProducerBatch) -> None:
        if b.in_flight:
            b.in_flight = False
            self._in_flight[b.tp] -= 1
            self._in_flight_total -= 1

    def _retry(self, b: ProducerBatch, backoff: bool = True) -> None:
        delay = min(self.config.backoff_ms * (2 ** min(b.attempts, 16)), self.config.backoff_max_ms) if backoff else 0
        self.acc.reenqueue(b, delay)

    def _on_batch_error(self, b: ProducerBatch, exc: BaseException) -> None:
        txn = self.txn
        self._done_in_flight(b)
        code = exc.code if isinstance(exc, errors.ExactlyError) else None
        now = self.clock()
        can_retry = b.attempts < self.config.retries and now - b.created_ms < self.config.delivery_timeout_ms
        if code in FENCING_CODES:
            self._fail(b, txn.record_error(exc), sequenced=False)
            return
        if b.has_sequence and txn.acknowledged_through(b.tp, b.producer_id, b.producer_epoch, b.last_sequence):
            # A later batch of this PID and epoch was acknowledged before this one's
            # answer came (the leader answers requests concurrently; this one's answer
            # was held, e.g. confirming its leadership): the leader appended this batch
            # before that one, so it is written. Sent again it would be a duplicate
            # older than the leader's last 5 batches, refused OUT_OF_ORDER_SEQUENCE_NUMBER
            # for ever. Its offset is unknown (-1).
            txn.partition_written(b.tp)
            b.complete(-1, -1)
            self.acc.deallocate(b)
            return
        if txn.idempotent and not txn.is_transactional and \
                code in (ErrorCode.UNKNOWN_PRODUCER_ID, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER) and \
                (self._reset_pid or code == ErrorCode.UNKNOWN_PRODUCER_ID) and can_retry:
            # The leader has no state for this PID (or the PID is being replaced):
            # it did not write the batch; send it again under a new PID.
            self._reset_pid = True
            b.unseal()
            self._retry(b)
            return
        if code in (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.UNKNOWN_PRODUCER_ID) and b.has_sequence and \
                not b.sent_in_order and can_retry:
            # Sent while an earlier batch of the partition was unresolved: the leader
            # may have seen them in another order (a later batch before the producer's
            # first one: UNKNOWN_PRODUCER_ID). Retry in sequence order, at once
            # (retried batches go one at a time, so the order is restored).
            self._retry(b, backoff=False)
            return
        if is_retriable(exc) and can_retry and not txn.has_error:
            if code in METADATA_ERRORS:
                self._need_metadata = True
            self._retry(b)
            return
        self._fail(b, exc)

    def _fail(self, b: ProducerBatch, exc: BaseException, sequenced: bool = True) -> None:
        txn = self.txn
        if sequenced and b.has_sequence:
            # The leader's next sequence is now unknown (or has a gap): later batches
            # need a new epoch / PID.
            txn.sequences_unresolved = True
        # Transactional: any failure aborts the transaction; otherwise only fatal codes matter.
        err = txn.record_error(exc)
        self._done_in_flight(b)
        b.fail(err)
        self.acc.deallocate(b)


class Sender(SenderCore, threading.Thread):
    """The sender thread of the synchronous Producer: runs `SenderCore` steps, waiting
    on a condition between them. Outcomes are processed on this thread only."""

    def __init__(self, config: SenderConfig, accumulator: RecordAccumulator, txn: TransactionManager,
                 core: ClientCore, on_metadata_change: Callable[[], None] = lambda: None,
                 clock: MonotonicClock = SYSTEM_CLOCK):
        threading.Thread.__init__(self, name="exactly-producer-sender", daemon=True)
        SenderCore.__init__(self, config, accumulator, txn, core, on_metadata_change, clock)
        self._cond = threading.Condition()
        self._woken = False
        self._running = True

    def wakeup(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._running = False
            self._cond.notify()

    def _complete(self, fn) -> None:
        self._completions.append(fn)
        with self._cond:
            self._cond.notify()

    def run(self) -> None:
        while True:
            delay = self._step()
            with self._cond:
                if not self._running:
                    break
                if not self._woken and not self._completions and (delay is None or delay > 0):
                    self.clock.wait(self._cond, None if delay is None else delay / 1000.0)
                self._woken = False
        self._drain_completions()


__all__ = ["Sender", "SenderCore", "SenderConfig", "ADD_PARTITIONS_RETRY_MS", "txn_coordinator_addresses"]
