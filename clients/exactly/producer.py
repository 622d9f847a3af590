"""The Producer: batching, idempotence and transactions (KIP-98).

`send()` appends records to per-partition batches (`_accumulator`); a background
sender thread drains them, assigns sequence numbers, adds partitions to the
transaction, and pipelines Produce requests to the partition leaders. The
transaction state lives in `_txn_manager.TransactionManager` (no I/O). The
coordinator round trips of init_transactions, send_offsets_to_transaction,
commit_transaction and abort_transaction run in the calling thread.

Follows the KIP-98 design document, "Transactional Producer" (Public APIs, Error
Handling, Added Configurations) and "Data Flow" steps 1-5; KIP-447 for the group
metadata passed with transactional offsets.

Two-phase commit, KIP-939: `Producer.prepare_transaction()` flushes and seals the
open transaction at the coordinator (PrepareTxn) and returns a `PreparedTxnState`
(transactional.id, PID, epoch); any process may then decide its outcome with
`complete_transaction(prepared, conf, commit=...)` (EndTxn with that PID and epoch).
A prepared transaction is not aborted after transaction.timeout.ms but after the
coordinator's transaction.prepared.max.ms (default 1 hour); a new producer instance
calling init_transactions() with the same transactional.id aborts it (KIP-939's
keepPreparedTxn=false), while `init_transactions(keep_prepared_txn=True)` keeps it, and
`Producer.complete_transaction(state)` then commits it when `state` (read back from
the external transaction manager, e.g. a database) is the prepared one and aborts it
otherwise (docs/design.md, "Two-phase commit with a database").
"""
from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Generator, Iterable, Iterator, Mapping, NamedTuple, TypeVar

import tenacity

from exactly_wire import compression
from exactly_wire import records as _rec
from exactly_wire.clock import wall_clock_ms
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb

from . import _fork, errors
from ._accumulator import RecordAccumulator, StickyPartitioner, fail_batches, failed_future, partition_for_key
from ._client import (COORDINATOR_GROUP, COORDINATOR_TRANSACTION, ClientCore, call_deadline, is_retriable, run_flow,
                      txn_coordinator_key)
from ._sender import Sender, SenderConfig
from ._txn_manager import (FENCING_CODES, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TransactionManager, TransactionManagerState,
                           copy_error, fenced_error, normalize)
from .config import ProducerSchema, parse
from .errors import ConfigurationError, TransactionAbortedError
from .types import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition

log = logging.getLogger(__name__)

_INT32_MAX = 2147483647

T = TypeVar("T")


# Bytes a record adds besides key, value and headers, counting the batch header.
_RECORD_OVERHEAD = _rec.HEADER_SIZE + 32


class _TopicPartitions(NamedTuple):
    ids: list[int]
    tps: list[TopicPartition]
    by_id: dict[int, TopicPartition]


class PreparedTxnState(NamedTuple):
    """KIP-939's PreparedTxnState: a transaction sealed by
    `Producer.prepare_transaction()`, to be completed by `Producer.complete_transaction()`
    or `exactly.complete_transaction()`: its transactional.id, producer id (PID) and
    producer epoch. Plain values (picklable, JSON-friendly); `serialize()` gives a
    short string ("<pid>:<epoch>:<transactional.id>") that `deserialize` reads back."""

    transactional_id: str
    producer_id: int
    epoch: int

    def serialize(self) -> str:
        """The state as "<producer id>:<epoch>:<transactional.id>"."""
        return f"{self.producer_id}:{self.epoch}:{self.transactional_id}"

    @classmethod
    def deserialize(cls, text: str) -> "PreparedTxnState":
        """Read back `serialize()`'s string. Raises ValueError for any other text."""
        try:
            pid, epoch, tid = str(text).split(":", 2)
            return cls(tid, int(pid), int(epoch))
        except ValueError:
            raise ValueError(f"not a serialized PreparedTxnState: {text!r}") from None


# The name this SDK used before KIP-939's (the Spark sink's two-phase commit).
PreparedTransaction = PreparedTxnState


# I/O effects yielded by the transaction flows of the Producer (see `run_flow` in
# exactly._client): the Producer performs them blocking, exactly.aio awaits them.
class CoordinatorRequest(NamedTuple):
    """Send `request` to the coordinator of `key` (key_type COORDINATOR_GROUP or
    COORDINATOR_TRANSACTION) with `ClientCore.coordinator_call` semantics; the
    outcome is the response. `stub`: "txn" or "group"; `method`: the RPC name."""

    key: str
    key_type: int
    stub: str
    method: str
    request: Any
    timeout_s: float
    error_code: Callable[[Any], int] = lambda r: r.error_code


class AwaitBatches(NamedTuple):
    """Wait until every batch incomplete now has its outcome; errors.KafkaTimeoutError
    (`what` timed out) at `deadline` (time.monotonic() seconds, None: no limit)."""

    deadline: float | None
    what: str


class AwaitAddPartitions(NamedTuple):
    """Wait until no AddPartitionsToTxn is in flight; errors.KafkaTimeoutError at `deadline`."""

    deadline: float


def _to_bytes(v: Any, what: str) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"{what} must be bytes, str or None, not {type(v).__name__}")


def _headers(h: Any) -> tuple[tuple[str, bytes | None], ...]:
    if not h:
        return ()
    items = h.items() if isinstance(h, Mapping) else h
    out = []
    for k, v in items:
        if not isinstance(k, str):
            raise TypeError(f"header keys must be str, not {type(k).__name__}")
        out.append((k, _to_bytes(v, "header value")))
    return tuple(out)


class Producer:
    """Sends records to topic partitions, optionally idempotently and in transactions.

    `conf`: Kafka keys (values may be str or native types), defined with their
    defaults and allowed values by `config.ProducerSchema` (the README's "Producer
    configuration" table): bootstrap.servers (required), transactional.id,
    enable.idempotence, acks, linger.ms, batch.size, compression.type, ...

    Raises errors.ConfigurationError (a ValueError) for an unknown or unsupported
    key, a wrong value, or conflicting settings (e.g. transactional.id with
    enable.idempotence=false). Thread-safe: send() may be called from several threads.
    """

    def __init__(self, conf: Mapping[str, Any]):
        given = {k for k, v in conf.items() if v is not None}
        cfg = parse(ProducerSchema, conf)
        self._created_in_pid = os.getpid()  # a forked child must not use it (exactly/_fork.py)
        self._core = self._make_core(cfg.as_dict())
        self._transactional_id: str | None = cfg.transactional_id
        idem_set = "enable.idempotence" in given
        idempotent = cfg.enable_idempotence
        acks_set = "acks" in given
        self._acks = -1 if cfg.acks == "all" else int(cfg.acks)
        self._max_in_flight = cfg.max_in_flight_requests_per_connection
        self._retries = cfg.retries
        if self._transactional_id is not None:
            if idem_set and not idempotent:
                raise ConfigurationError("transactional.id requires enable.idempotence=true",
                                         key="enable.idempotence", value=False, allowed="true with transactional.id")
            idempotent = True
        if idempotent:
            conflicts = []
            if self._acks != -1:
                conflicts.append("acks=all")
            if self._max_in_flight > 5:
                conflicts.append("max.in.flight.requests.per.connection <= 5")
            if self._retries < 1:
                conflicts.append("retries > 0")
            if conflicts:
                if idem_set or self._transactional_id is not None:
                    raise ConfigurationError("enable.idempotence=true (also implied by transactional.id) "
                                             "requires " + ", ".join(conflicts),
                                             key="enable.idempotence", value=True, allowed=", ".join(conflicts))
                idempotent = False  # not asked for explicitly: Kafka >= 3.0 falls back
        elif not acks_set:
            self._acks = -1
        self._linger_ms = float(cfg.linger_ms)
        self._batch_size = cfg.batch_size
        self._request_timeout_ms = self._core.request_timeout_ms
        self._delivery_timeout_ms = float(cfg.delivery_timeout_ms)
        self._max_block_ms = float(cfg.max_block_ms)
        self._max_request_size = cfg.max_request_size
        self._backoff_ms = float(self._core.retry_backoff_ms)
        self._backoff_max_ms = float(self._core.retry_backoff_max_ms)
        self._compression = compression.codec_for(cfg.compression_type)
        self._txn_timeout_ms = cfg.transaction_timeout_ms
        self._txn = TransactionManager(self._transactional_id, idempotent, self._txn_timeout_ms)
        self._acc = RecordAccumulator(self._batch_size, self._linger_ms, cfg.buffer_memory)
        self._partitioner = StickyPartitioner()
        self._partitioner_lock = threading.Lock()
        self._topic_cache: dict[str, _TopicPartitions] = {}
        self._assigned: list[TopicPartition] = []  # a group-aware producer's input partitions
        self._closed = False
        self._close_lock = threading.Lock()
        self._sender = self._make_sender(
            SenderConfig(transactional_id=self._transactional_id, acks=self._acks,
                         request_timeout_ms=self._request_timeout_ms, delivery_timeout_ms=self._delivery_timeout_ms,
                         retries=self._retries, backoff_ms=self._backoff_ms, backoff_max_ms=self._backoff_max_ms,
                         max_in_flight=self._max_in_flight, compression=self._compression,
                         txn_timeout_ms=self._txn_timeout_ms),
            self._acc, self._txn, self._core, on_metadata_change=self.metadata_changed)
        self._sender.start()

    # The I/O of a producer instance: `exactly.aio` swaps in its grpc.aio core and
    # an asyncio sender task.
    def _make_core(self, conf: dict[str, Any]) -> ClientCore:
        return ClientCore(conf)

    def _make_sender(self, *args: Any, **kwargs: Any) -> Sender:
        return Sender(*args, **kwargs)

    # ------------------------------------------------------------ send

    def send(self, topic: str, value: Any = None, key: Any = None, partition: int | None = None,
             headers: Any = None, timestamp_ms: int | None = None) -> Future:
        """Queue one record and return a concurrent.futures.Future of its
        RecordMetadata (topic, partition, real log offset, timestamp ms).

        `value`/`key`: bytes, str (utf-8) or None. `headers`: [(str, bytes|str|None)]
        or a dict. `partition`: explicit partition, else murmur2(key) % partitions
        as Kafka's default partitioner, or a sticky partition for keyless records.
        `timestamp_ms`: create time, default now.

        Raises errors.IllegalStateError when closed, or (transactional producer)
        outside begin_transaction()/commit; TypeError for bad value types;
        errors.MessageTooLargeError above max.request.size;
        errors.UnknownTopicOrPartitionError if the topic stays unknown for
        max.block.ms. Delivery errors (including errors.ProducerFencedError when
        another producer with the same transactional.id took over, and the stored
        error once the transaction is in an error state) arrive through the future.
        Design doc: "Public APIs", send().
        """
        if self._closed or self._created_in_pid != os.getpid():
            self._check_open()
        txn = self._txn
        if txn.state is not TransactionManagerState.IN_TRANSACTION and (txn.is_transactional or txn.has_error):
            if txn.has_error and txn.last_error is not None:
                return failed_future(copy_error(txn.last_error))
            txn.check_can_send()
        key_b = key if key is None or type(key) is bytes else _to_bytes(key, "key")
        value_b = value if value is None or type(value) is bytes else _to_bytes(value, "value")
        if headers:
            hdrs = _headers(headers)
            size = sum(len(k) + (len(v) if v else 0) + 8 for k, v in hdrs)
        else:
            hdrs, size = (), 0
        size += _RECORD_OVERHEAD + (len(key_b) if key_b else 0) + (len(value_b) if value_b else 0)
        if size > self._max_request_size:
            raise errors.MessageTooLargeError(
                f"record of about {size} bytes exceeds max.request.size ({self._max_request_size} bytes)")
        ts = wall_clock_ms() if timestamp_ms is None else int(timestamp_ms)
        cached = self._topic_cache.get(topic) or self._cache_topic(topic)
        sticky = False
        if partition is not None:
            tp = cached.by_id.get(partition)
            if tp is None:
                cached = self._cache_topic(topic, refresh=True)
                tp = cached.by_id.get(partition)
                if tp is None:
                    raise errors.UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {partition}")
        elif key_b is not None:
            tp = cached.tps[partition_for_key(key_b, len(cached.tps))]
        else:
            with self._partitioner_lock:
                tp = cached.by_id[self._partitioner.partition(topic, cached.ids)]
            sticky = True
        if txn.is_transactional:
            txn.maybe_add_partition(tp)
        res = self._acc.append(tp, ts, key_b, value_b, hdrs, abort_on_new_batch=sticky,
                               max_block_ms=self._max_block_ms)
        if res is None:
            with self._partitioner_lock:
                tp = cached.by_id[self._partitioner.on_new_batch(topic, cached.ids, tp.partition)]
            if txn.is_transactional:
                txn.maybe_add_partition(tp)
            res = self._acc.append(tp, ts, key_b, value_b, hdrs, max_block_ms=self._max_block_ms)
        fut, full, new_batch = res
        if full or new_batch:
            self._sender.wakeup()
        return fut

    def _cache_topic(self, topic: str, refresh: bool = False) -> "_TopicPartitions":
        """Partitions of `topic` from metadata (waiting up to max.block.ms for an
        unknown topic); cached until the sender sees new metadata."""
        core = self._core
        max_block_s = self._max_block_ms / 1000.0
        # Kafka's send(): wait for the topic's metadata up to max.block.ms, in all.
        with call_deadline(max_block_s):
            try:
                md = core.metadata([topic], refresh=True) if refresh else core.metadata([topic])
                ids = md.partitions(topic)
                if not ids:
                    ids = core.retry(lambda: core.partitions_for(topic), timeout_s=max_block_s)
            except errors.ExactlyError as exc:
                if not exc.retriable or isinstance(exc, errors.UnknownTopicOrPartitionError):
                    raise
                try:
                    ids = core.retry(lambda: core.partitions_for(topic), timeout_s=max_block_s)
                except errors.ExactlyError as last:
                    if not last.retriable or isinstance(last, errors.UnknownTopicOrPartitionError):
                        raise
                    raise errors.KafkaTimeoutError(f"no metadata for topic {topic!r} within max.block.ms "
                                                   f"({self._max_block_ms:.0f} ms): {last}") from last
        tps = [TopicPartition(topic, p) for p in ids]
        cached = _TopicPartitions(ids, tps, dict(zip(ids, tps)))
        self._topic_cache = {**self._topic_cache, topic: cached}  # rebinding: readers need no lock
        return cached

    def metadata_changed(self) -> None:
        """New cluster metadata: partition lists are looked up again on the next send."""
        self._topic_cache = {}

    def partitions_for(self, topic: str) -> list[int]:
        """Partition ids of `topic`. Raises errors.UnknownTopicOrPartitionError."""
        return list(self._cache_topic(topic).ids)

    def flush(self, timeout: float | None = None) -> None:
        """Send every queued record now (ignoring linger.ms) and wait until each has
        an outcome. `timeout` in seconds (None: no limit). Raises
        errors.KafkaTimeoutError when records are still pending at the timeout.
        Record errors are reported through their futures, not here."""
        _fork.check_process(self._created_in_pid, "producer")
        run_flow(self._flush_flow(timeout), self._perform)

    def _flush_flow(self, timeout: float | None) -> Generator:
        self._acc.begin_flush()
        try:
            self._sender.wakeup()
            deadline = None if timeout is None else time.monotonic() + timeout
            yield AwaitBatches(deadline, f"flush timed out after {timeout} s")
        finally:
            self._acc.end_flush()

    def _await_batches(self, deadline: float | None, timed_out: str) -> None:
        for batch in self._acc.incomplete():
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
            if not batch.done.wait(remaining):
                raise errors.KafkaTimeoutError(timed_out)

    def _perform(self, effect: Any) -> Any:
        """Perform one effect of a transaction flow, blocking this thread."""
        if isinstance(effect, CoordinatorRequest):
            core = self._core
            stub = core.txn_stub if effect.stub == "txn" else core.group_stub
            return core.coordinator_call(effect.key, effect.key_type, lambda addr: getattr(stub(addr), effect.method),
                                         effect.request, error_code=effect.error_code, timeout_s=effect.timeout_s)
        if isinstance(effect, AwaitBatches):
            return self._await_batches(effect.deadline, effect.what)
        if isinstance(effect, AwaitAddPartitions):
            return self._wait_add_partitions(effect.deadline)
        raise TypeError(f"unknown effect {effect!r}")

    # ------------------------------------------------------------ transactions

    def _timeout_s(self, timeout: float | None) -> float:
        return self._max_block_ms / 1000.0 if timeout is None else timeout

    def _txn_call(self, method: str, request: Any, timeout_s: float) -> CoordinatorRequest:
        key, key_type = txn_coordinator_key(self._transactional_id, self._txn.group_id)
        return CoordinatorRequest(key, key_type, "txn", method, request, timeout_s)

    def _group_fields(self) -> dict[str, Any]:
        """consumer_group_id / generation_id of a group-aware producer's transactional
        requests (KIP-447 draft); empty for the others."""
        txn = self._txn
        return {"consumer_group_id": txn.group_id, "generation_id": txn.generation_id} if txn.group_id else {}

    def _init_producer_id(self, timeout_s: float, bump: bool = False,
                          assigned: Iterable[TopicPartition] = (), keep_prepared_txn: bool = False) -> Generator:
        """InitProducerId to the transaction coordinator (step 2 of the data flow);
        `bump` passes the current PID/epoch so the coordinator bumps the epoch (KIP-360);
        a group-aware producer sends its group, generation and `assigned` partitions."""
        txn = self._txn
        req = pb.InitProducerIdRequest(
            transactional_id=self._transactional_id or "",
            transaction_timeout_ms=self._txn_timeout_ms,
            producer_id=txn.producer_id if bump else NO_PRODUCER_ID,
            producer_epoch=txn.producer_epoch if bump else NO_PRODUCER_EPOCH,
            keep_prepared_txn=keep_prepared_txn, **self._group_fields())
        if txn.group_id:
            by_topic: dict[str, list[int]] = collections.defaultdict(list)
            for tp in assigned if not bump else self._assigned:
                by_topic[tp.topic].append(tp.partition)
            req.assigned_partitions.extend(pb.TopicPartitions(topic=t, partitions=sorted(ps))
                                           for t, ps in sorted(by_topic.items()))
        try:
            resp = yield self._txn_call("InitProducerId", req, timeout_s)
        except errors.ExactlyError as exc:
            err = txn.initialize_failed(exc)
            if is_retriable(err):
                raise errors.KafkaTimeoutError(f"InitProducerId did not succeed within {timeout_s} s: {err}") from err
            raise err from None
        if keep_prepared_txn and resp.HasField("ongoing_txn_producer_id"):
            txn.restore_prepared(resp.ongoing_txn_producer_id, resp.ongoing_txn_producer_epoch)
            log.info("producer %s: kept the prepared transaction of PID %d epoch %d", self._transactional_id,
                     resp.ongoing_txn_producer_id, resp.ongoing_txn_producer_epoch)
            return
        txn.set_producer_id_and_epoch(resp.producer_id, resp.producer_epoch)
        log.info("producer %s: PID %d epoch %d", self._transactional_id, resp.producer_id, resp.producer_epoch)

    def init_transactions(self, partitions: Iterable[TopicPartition] | float | None = None,
                          group: str | ConsumerGroupMetadata | None = None, generation: int | None = None,
                          timeout: float | None = None, keep_prepared_txn: bool = False) -> None:
        """Get this transactional.id's PID and a new epoch from the transaction
        coordinator, fencing older instances and completing (aborting) their open
        transaction. `timeout` in seconds (default max.block.ms).

        `keep_prepared_txn=True` (KIP-939 initTransactions(keepPreparedTxn), classic
        form only): a transaction of the id that an earlier instance sealed with
        prepare_transaction() is kept instead of aborted; this producer takes it over
        as its own prepared transaction (`prepared_transaction_state()` returns it) and
        must decide it with `complete_transaction(state)` before beginning another.
        Without such a transaction it behaves as the plain form.

        `init_transactions()` (or `init_transactions(timeout)`): once, before the first
        begin_transaction() (KIP-98 design document, "Public APIs", initTransactions()).

        `init_transactions(partitions, group_id, generation)` or
        `init_transactions(partitions, consumer.group_metadata())`: the group-aware form
        of the KIP-447 draft, for ONE producer per process in a consume-transform-produce
        loop. `partitions`: the input partitions the consumer group assigned in the
        rebalance of `generation`. The producer's transactions then live with the
        transaction coordinator of the group, which aborts and fences any open
        transaction of another producer of the group on these partitions and returns
        once those are complete, and refuses later requests of older generations
        (ILLEGAL_GENERATION). Call it in `on_assign` after every rebalance (the
        callback gets the generation as its second argument), and after a
        ProducerFencedError; the producer is never closed on a rebalance. An open
        transaction is dropped (the coordinator aborts it).

        Raises errors.IllegalStateError without transactional.id, when the classic
        form is called twice, or for a group-aware call on a producer of another
        group; errors.KafkaTimeoutError when the coordinator did not answer in time
        (the call may be repeated; PENDING_TRANSACTION is waited on until then);
        errors.IllegalGenerationError for a generation older than the coordinator
        has seen; errors.InvalidTransactionTimeoutError and other fatal errors."""
        self._check_open()
        run_flow(self._init_transactions_flow(partitions, group, generation, timeout, keep_prepared_txn),
                 self._perform)
        try:
            # The cluster's transaction version decides whether partition leaders add
            # this producer's partitions (KIP-890 part 2); metadata is fetched anyway
            # by the first send.
            self._txn.transaction_version = self._core.metadata().transaction_version
        except errors.ExactlyError as exc:
            log.info("producer %s: no metadata yet (%s); partitions are added explicitly until it comes",
                     self._transactional_id, exc)

    def _init_transactions_flow(self, partitions: Iterable[TopicPartition] | float | None = None,
                                group: str | ConsumerGroupMetadata | None = None, generation: int | None = None,
                                timeout: float | None = None, keep_prepared_txn: bool = False) -> Generator:
        if isinstance(partitions, (int, float)) and not isinstance(partitions, bool):
            partitions, timeout = None, float(partitions)
        if self._transactional_id is None:
            raise errors.IllegalStateError("init_transactions() needs transactional.id")
        if group is None:
            if partitions is not None or generation is not None:
                raise ValueError("the group-aware init_transactions() needs a consumer group")
            self._txn.begin_initialize()
            yield from self._init_producer_id(self._timeout_s(timeout), keep_prepared_txn=keep_prepared_txn)
            return
        if keep_prepared_txn:
            raise ValueError("keep_prepared_txn is for the classic init_transactions(), not the group-aware form")
        if isinstance(group, ConsumerGroupMetadata):
            group_id = group.group_id
            generation = group.generation_id if generation is None else generation
        else:
            group_id = str(group)
        if not group_id or generation is None or generation < 0:
            raise ValueError("the group-aware init_transactions() needs a group id and a generation >= 0")
        assigned = sorted(TopicPartition(*tp) for tp in (partitions or ()))
        timeout_s = self._timeout_s(timeout)
        deadline = time.monotonic() + timeout_s
        # An open transaction is dropped: unsent records fail, those in flight finish;
        # the coordinator aborts the transaction itself.
        dropped = self._acc.drain_all()
        fail_batches(dropped, TransactionAbortedError("transaction dropped by init_transactions()"), self._acc)
        self._sender.wakeup()
        yield AwaitBatches(deadline, f"init_transactions timed out after {timeout_s} s")
        yield AwaitAddPartitions(deadline)
        self._txn.begin_group_initialize(group_id, int(generation))
        self._assigned = assigned
        yield from self._init_producer_id(max(deadline - time.monotonic(), 0.001), assigned=assigned)

    def begin_transaction(self) -> None:
        """Start a transaction (local; the coordinator hears of it with the first
        partition or offsets added). Raises errors.IllegalStateError when not
        initialized or a transaction is open, or the stored error after a fatal or
        abortable error. Design doc: "Public APIs", beginTransaction()."""
        self._check_open()
        md = self._core.cached_metadata()
        if md is not None:
            self._txn.transaction_version = md.transaction_version
        self._txn.begin_transaction()

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
                                    group_metadata: ConsumerGroupMetadata | str,
                                    timeout: float | None = None) -> None:
        """Commit consumed `offsets` (TopicPartition -> OffsetAndMetadata of the next
        record to read) as part of the transaction: AddOffsetsToTxn to the
        transaction coordinator (once per group per transaction), then
        TxnOffsetCommit to the group coordinator with the consumer's group
        metadata (group id, generation, member id), which rejects a stale
        generation (KIP-447). The offsets become visible only when the transaction
        commits. `timeout` in seconds (default max.block.ms).

        Raises errors.ProducerFencedError (fatal) when a newer producer instance
        exists; errors.IllegalGenerationError / UnknownMemberIdError (the
        transaction must be aborted); errors.KafkaTimeoutError; errors.IllegalStateError
        outside a transaction. Design doc: "Public APIs", sendOffsetsToTransaction();
        data flow 4.3 and 4.4."""
        self._check_open()
        run_flow(self._send_offsets_flow(offsets, group_metadata, timeout), self._perform)

    def _send_offsets_flow(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
                           group_metadata: ConsumerGroupMetadata | str, timeout: float | None) -> Generator:
        txn = self._txn
        txn.check_in_transaction("send_offsets_to_transaction()")
        gm = ConsumerGroupMetadata(group_metadata) if isinstance(group_metadata, str) else group_metadata
        if not offsets:
            return
        timeout_s = self._timeout_s(timeout)
        deadline = time.monotonic() + timeout_s
        try:
            if txn.needs_add_offsets(gm.group_id):
                yield self._txn_call("AddOffsetsToTxn", pb.AddOffsetsToTxnRequest(
                    transactional_id=self._transactional_id, producer_id=txn.producer_id,
                    producer_epoch=txn.producer_epoch, group_id=gm.group_id, **self._group_fields()), timeout_s)
                txn.offsets_added(gm.group_id)
            by_topic: dict[str, list[pb.OffsetCommitPartition]] = collections.defaultdict(list)
            for tp, om in sorted(offsets.items()):
                if isinstance(om, int):
                    om = OffsetAndMetadata(om)
                by_topic[tp.topic].append(pb.OffsetCommitPartition(
                    partition=tp.partition, committed_offset=om.offset, committed_leader_epoch=-1,
                    metadata=om.metadata or ""))
            req = pb.TxnOffsetCommitRequest(
                transactional_id=self._transactional_id, group_id=gm.group_id,
                producer_id=txn.producer_id, producer_epoch=txn.producer_epoch,
                generation_id=gm.generation_id, member_id=gm.member_id or "",
                group_instance_id=gm.group_instance_id or "", group_aware_producer=txn.group_id == gm.group_id,
                topics=[pb.OffsetCommitTopic(name=t, partitions=ps) for t, ps in by_topic.items()])
            yield CoordinatorRequest(
                gm.group_id, COORDINATOR_GROUP, "group", "TxnOffsetCommit", req,
                max(deadline - time.monotonic(), 0.001),
                error_code=lambda r: next((p.error_code for t in r.topics for p in t.partitions
                                           if p.error_code), 0))
        except errors.ExactlyError as exc:
            if is_retriable(exc) and exc.code not in FENCING_CODES:
                raise errors.KafkaTimeoutError(
                    f"send_offsets_to_transaction did not succeed within {timeout_s} s: {exc}") from exc
            raise txn.record_error(exc) from None

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush, then EndTxn(COMMIT) and wait for the coordinator's answer; the
        transaction's records and offsets become visible to read_committed
        consumers. `timeout` in seconds (default max.block.ms).

        Raises errors.ProducerFencedError (fatal); the stored error when the
        transaction hit an abortable error (call abort_transaction()); any fatal
        error; errors.KafkaTimeoutError (commit_transaction() may be called again);
        errors.IllegalStateError without an open transaction.
        Design doc: "Public APIs", commitTransaction(); data flow 5.1."""
        self._check_open()
        run_flow(self._commit_flow(timeout), self._perform)

    def _commit_flow(self, timeout: float | None) -> Generator:
        txn = self._txn
        timeout_s = self._timeout_s(timeout)
        deadline = time.monotonic() + timeout_s
        txn.begin_commit()
        yield from self._flush_transaction(timeout_s, deadline)
        yield from self._finish_transaction(True, deadline)

    def _finish_transaction(self, commit: bool, deadline: float) -> Generator:
        """EndTxn (when the coordinator has a transaction), adopt the epoch it ends
        under, and rotate the PID when that epoch is exhausted (KIP-890 part 2)."""
        txn = self._txn
        resp = (yield from self._end_txn(commit, max(deadline - time.monotonic(), 0.001))) \
            if txn.needs_end_txn else None
        if resp is not None and resp.HasField("producer_epoch") and resp.producer_epoch >= 0:
            txn.complete_transaction(resp.producer_id, resp.producer_epoch)
        elif not commit and (txn.sequences_unresolved or (txn.implicit_add and txn.only_maybe_started)):
            # Nothing was ended under a new epoch, but some batch of the aborted
            # transaction may or may not be in the log: a new epoch restarts sequences
            # so later batches are not rejected (KIP-360). With implicit adds, a batch
            # still on its way could make its leader add its partition to this epoch's
            # next transaction: the new epoch fences that add (KIP-890 part 2).
            txn.transition_to(TransactionManagerState.INITIALIZING)
            yield from self._init_producer_id(max(deadline - time.monotonic(), 0.001), bump=True)
            return
        else:
            txn.complete_transaction()
        if txn.epoch_exhausted:
            txn.transition_to(TransactionManagerState.INITIALIZING)
            yield from self._init_producer_id(max(deadline - time.monotonic(), 0.001), bump=True)

    def _flush_transaction(self, timeout_s: float, deadline: float) -> Generator:
        """Send every record of the transaction and its pending AddPartitionsToTxn;
        raise the transaction's stored error, if any."""
        txn = self._txn
        try:
            yield from self._flush_flow(timeout_s)
        except errors.KafkaTimeoutError as exc:
            # Records of the transaction are still unacknowledged: it can only be aborted.
            txn.record_error(exc)
            raise
        yield AwaitAddPartitions(deadline)
        txn.raise_if_failed()

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """First phase of a two-phase commit (KIP-939 prepareTransaction()): flush the
        transaction's records, then seal it at the transaction coordinator
        (PrepareTxn). The transaction stays open: no record may be sent to it any
        more, and the coordinator no longer aborts it after transaction.timeout.ms
        but after transaction.prepared.max.ms (coordinator setting, default 1 hour).
        Returns PreparedTxnState(transactional_id, producer_id, epoch); the second
        phase is `complete_transaction(state)` (or commit_transaction() /
        abort_transaction()) on this producer, or on a producer of the same
        transactional.id initialised with keep_prepared_txn=True after a crash, or
        `exactly.complete_transaction(prepared, conf, commit=...)` from any process. close() leaves
        a prepared transaction open. A transaction without records is prepared too
        (the coordinator keeps an empty sealed transaction). `timeout` in seconds
        (default max.block.ms).

        Raises errors.ProducerFencedError (fatal); the stored error after an
        abortable error (call abort_transaction()); errors.KafkaTimeoutError (records
        unacknowledged: the transaction must be aborted; or PrepareTxn unanswered:
        prepare_transaction() may be called again); errors.IllegalStateError without
        an open transaction."""
        self._check_open()
        return run_flow(self._prepare_flow(timeout), self._perform)

    def _prepare_flow(self, timeout: float | None) -> Generator:
        txn = self._txn
        timeout_s = self._timeout_s(timeout)
        deadline = time.monotonic() + timeout_s
        txn.begin_prepare()
        yield from self._flush_transaction(timeout_s, deadline)
        req = pb.PrepareTxnRequest(transactional_id=self._transactional_id, producer_id=txn.producer_id,
                                   producer_epoch=txn.producer_epoch, **self._group_fields())
        try:
            yield self._txn_call("PrepareTxn", req, max(deadline - time.monotonic(), 0.001))
        except errors.ExactlyError as exc:
            if is_retriable(exc):
                raise errors.KafkaTimeoutError(f"PrepareTxn did not succeed within {timeout_s:.1f} s: {exc}") from exc
            raise txn.record_error(exc) from None
        txn.transaction_sealed()
        return PreparedTxnState(self._transactional_id, txn.producer_id, txn.producer_epoch)

    @property
    def transactional_id(self) -> str | None:
        """The producer's transactional.id (None for a non-transactional producer)."""
        return self._transactional_id

    def prepared_transaction_state(self) -> PreparedTxnState | None:
        """The state of this producer's prepared transaction (prepared by it, or kept by
        init_transactions(keep_prepared_txn=True)); None when none is prepared."""
        txn = self._txn
        if txn.state is not TransactionManagerState.PREPARED_TRANSACTION or not txn.sealed:
            return None
        return PreparedTxnState(self._transactional_id, txn.producer_id, txn.producer_epoch)

    def complete_transaction(self, state: PreparedTxnState | str | None, timeout: float | None = None) -> str:
        """Second phase of KIP-939's two-phase commit (completeTransaction(state)):
        commit this producer's prepared transaction when `state` — the PreparedTxnState
        (or its serialize() string) that the external transaction manager recorded —
        is that transaction's, abort it otherwise (`state` None: nothing recorded).
        Returns "committed", "aborted", or "none" when no transaction is prepared (a
        recovery after the transaction was completed: nothing to do). `timeout` in
        seconds (default max.block.ms).

        Raises errors.ProducerFencedError when the coordinator ended the transaction
        meanwhile (transaction.prepared.max.ms passed, or a newer instance of the
        transactional.id aborted it); errors.KafkaTimeoutError (call again);
        errors.IllegalStateError while a transaction is open but not prepared; other
        errors as commit_transaction() / abort_transaction()."""
        self._check_open()
        return run_flow(self._complete_flow(state, timeout), self._perform)

    def _complete_flow(self, state: PreparedTxnState | str | None, timeout: float | None) -> Generator:
        txn = self._txn
        if isinstance(state, str):
            state = PreparedTxnState.deserialize(state)
        mine = self.prepared_transaction_state()
        if mine is None:
            if txn.state in (TransactionManagerState.COMMITTING_TRANSACTION,
                             TransactionManagerState.ABORTING_TRANSACTION):
                # A retry after a timeout: finish the decision already taken.
                committing = txn.state is TransactionManagerState.COMMITTING_TRANSACTION
                yield from (self._commit_flow(timeout) if committing else self._abort_flow(timeout))
                return "committed" if committing else "aborted"
            if txn.state is TransactionManagerState.READY:
                return "none"
            raise errors.IllegalStateError(f"no prepared transaction to complete (state {txn.state.name})")
        if state is not None and tuple(PreparedTxnState(*state)) == tuple(mine):
            yield from self._commit_flow(timeout)
            return "committed"
        yield from self._abort_flow(timeout)
        return "aborted"

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Drop unsent records of the transaction (their futures fail with
        TransactionAbortedError), wait for in-flight ones, then EndTxn(ABORT).
        Allowed after an abortable error. `timeout` in seconds (default
        max.block.ms).

        Raises errors.ProducerFencedError and other fatal errors;
        errors.KafkaTimeoutError (abort_transaction() may be called again);
        errors.IllegalStateError without an open transaction.
        Design doc: "Public APIs", abortTransaction(); data flow 5.1."""
        self._check_open()
        run_flow(self._abort_flow(timeout), self._perform)

    def _abort_flow(self, timeout: float | None) -> Generator:
        txn = self._txn
        timeout_s = self._timeout_s(timeout)
        deadline = time.monotonic() + timeout_s
        txn.begin_abort()
        dropped = self._acc.drain_all()
        if any(b.has_sequence for b in dropped):
            txn.sequences_unresolved = True  # sent before, outcome unknown
        fail_batches(dropped, TransactionAbortedError("transaction aborted before the record was sent"),
                     self._acc)
        self._sender.wakeup()
        yield AwaitBatches(deadline, f"abort_transaction timed out after {timeout_s} s")
        yield AwaitAddPartitions(deadline)
        txn.raise_if_fatal()
        yield from self._finish_transaction(False, deadline)

    def _wait_add_partitions(self, deadline: float) -> None:
        while self._txn.add_in_flight:
            if time.monotonic() >= deadline:
                raise errors.KafkaTimeoutError("AddPartitionsToTxn still in flight at the timeout")
            time.sleep(0.001)

    def _end_txn(self, commit: bool, timeout_s: float) -> Generator:
        """EndTxn; returns the response (its PID and epoch are the ones the producer
        continues with), or None when there was nothing to abort."""
        txn = self._txn
        req = pb.EndTxnRequest(transactional_id=self._transactional_id, producer_id=txn.producer_id,
                               producer_epoch=txn.producer_epoch, committed=commit, **self._group_fields())
        try:
            return (yield self._txn_call("EndTxn", req, timeout_s))
        except errors.ExactlyError as exc:
            if is_retriable(exc):
                raise errors.KafkaTimeoutError(
                    f"EndTxn({'commit' if commit else 'abort'}) did not succeed within {timeout_s:.1f} s: {exc}"
                ) from exc
            if not commit and exc.code == ErrorCode.INVALID_TXN_STATE and txn.only_maybe_started:
                # Sent only because an AddPartitionsToTxn went unanswered: the
                # coordinator never started the transaction, so there is nothing to abort.
                return None
            if not commit and exc.code == ErrorCode.INVALID_PRODUCER_ID_MAPPING:
                # The coordinator no longer knows this PID (design doc "Error Handling",
                # InvalidPidMapping): nothing to abort; get a new mapping.
                txn.sequences_unresolved = True
                return None
            err = txn.record_error(exc)
            if not commit and txn.state is TransactionManagerState.ABORTING_TRANSACTION:
                txn.transition_to(TransactionManagerState.ABORTABLE_ERROR, err)
            raise err from None

    # ------------------------------------------------------------ transaction helpers

    @contextlib.contextmanager
    def transaction(self, timeout: float | None = None) -> Iterator["Producer"]:
        """`with producer.transaction(): ...` — begin a transaction, commit it when
        the block ends normally, abort it when the block raises.

        On an exception from the block (or from the commit): a fatal error
        (`exc.fatal`: fenced, not authorized, ...) closes the producer and is
        re-raised, as the KIP-98 design document ("Error Handling") requires of a
        zombie; any other exception aborts the transaction (abort_transaction()) and
        is re-raised, so the caller can rewind its input and try again. A
        KafkaTimeoutError of the commit itself is re-raised without an abort: the
        outcome is not known yet, and only commit_transaction() may be called again.
        `timeout` in seconds for the commit and the abort (default max.block.ms).
        Yields the producer. Raises errors.IllegalStateError when a transaction is
        already open or init_transactions() was not called."""
        self.begin_transaction()
        try:
            yield self
            self.commit_transaction(timeout)
        except BaseException as exc:
            action = self._after_failed_transaction(exc)
            if action == "close":
                self.close(timeout=0)
            elif action == "abort":
                try:
                    self.abort_transaction(timeout)
                except errors.ExactlyError as abort_exc:
                    if self._after_failed_transaction(abort_exc) == "close":
                        self.close(timeout=0)
                    raise abort_exc from exc
            raise

    def _after_failed_transaction(self, exc: BaseException) -> str:
        """What `transaction()` (sync and asyncio) does when its block or its commit
        raised `exc`: "close" on a fatal error (KIP-98 "Error Handling") — except a
        group-aware producer that was fenced, which the next group-aware
        init_transactions() recovers (KIP-447 draft): "keep"; "keep" for a commit that
        timed out with its outcome unknown (only commit_transaction() may follow);
        "abort" otherwise."""
        if isinstance(exc, errors.ExactlyError) and exc.fatal:
            return "keep" if self._txn.group_id and fenced_error(exc) else "close"
        if isinstance(exc, errors.KafkaTimeoutError) and \
                self._txn.state is TransactionManagerState.COMMITTING_TRANSACTION:
            return "keep"
        return "abort"

    def run_in_transaction(self, fn: Callable[["Producer"], T], attempts: int = 5,
                           consumer: Any = None, timeout: float | None = None) -> T:
        """Run `fn(producer)` inside a transaction and commit it, retrying the whole
        transaction after abortable and retriable failures — the loop every
        exactly-once application otherwise writes by hand.

        Each attempt is `with self.transaction(timeout): result = fn(self)`. After a
        failed attempt that is not fatal, the transaction has been aborted;
        `consumer` (an exactly.Consumer, optional) is then rewound to its committed
        offsets (the beginning of a partition without one) so records read in the
        aborted attempt are read again, and the next attempt starts after a backoff
        (retry.backoff.ms doubling up to retry.backoff.max.ms, with jitter). `fn`
        must therefore read its input inside the call (e.g. `consumer.poll()`), and
        send its offsets with send_offsets_to_transaction. A commit that timed out is
        completed with commit_transaction() instead of being run again.

        `attempts`: tries in all (>= 1). Returns fn's result of the committed
        attempt. Raises a fatal error at once (the producer is closed, fn is not
        called again); the last error when every attempt failed; any non-Kafka
        exception of fn after aborting (not retried: it is a bug, not a fault).
        KIP-98 design document, "Transactional Producer": Error Handling."""
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, not {attempts}")

        def _retriable(exc: BaseException) -> bool:
            return isinstance(exc, errors.ExactlyError) and not exc.fatal \
                and (exc.txn_requires_abort or exc.retriable) and not self._closed

        def _attempt() -> T:
            if self._txn.state is TransactionManagerState.COMMITTING_TRANSACTION:
                self.commit_transaction(timeout)  # the previous attempt's commit timed out
                return outcome.pop()
            outcome.clear()
            with self.transaction(timeout):
                outcome.append(fn(self))
            return outcome.pop()

        def _before_sleep(state: tenacity.RetryCallState) -> None:
            log.info("transaction attempt %d failed (%r); retrying", state.attempt_number, state.outcome.exception())
            if consumer is not None and self._txn.state is not TransactionManagerState.COMMITTING_TRANSACTION:
                rewind_to_committed(consumer)

        outcome: list[T] = []
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_retriable),
            wait=tenacity.wait_exponential(multiplier=self._backoff_ms / 1000.0, max=self._backoff_max_ms / 1000.0)
            + tenacity.wait_random(0, self._backoff_ms / 1000.0 / 5),
            stop=tenacity.stop_after_attempt(attempts),
            before_sleep=_before_sleep,
            reraise=True,
        )
        return retrying(_attempt)

    # ------------------------------------------------------------ lifecycle

    def _check_open(self) -> None:
        """Raise errors.IllegalStateError when closed, or in a forked child of the
        process that created this producer."""
        _fork.check_process(self._created_in_pid, "producer")
        if self._closed:
            raise errors.IllegalStateError("producer is closed")

    def close(self, timeout: float | None = None) -> None:
        """Send queued records (unless the producer hit a fatal error), stop the
        sender thread and release connections. `timeout` in seconds for the flush
        (None: no limit); records still pending then fail with
        errors.IllegalStateError. An open transaction is not committed (the
        coordinator aborts it after transaction.timeout.ms). Idempotent. In a forked
        child, a producer of the parent is only marked closed (its sender stayed in
        the parent)."""
        if not self._mark_closed():
            return
        if self._created_in_pid != os.getpid():
            self._core.close()
            return
        try:
            if not self._txn.is_fatal_state:
                self.flush(timeout)
        except errors.ExactlyError:
            pass
        finally:
            self._acc.close()
            self._sender.stop()
            self._sender.join(timeout=max(self._request_timeout_ms / 1000.0, 1.0))
            self._fail_unfinished()
            self._core.close()

    def _mark_closed(self) -> bool:
        """Start closing; False when closing already started."""
        with self._close_lock:
            if self._closed:
                return False
            self._closed = True
            return True

    def _fail_unfinished(self) -> None:
        """After the sender stopped: records without an outcome fail with IllegalStateError."""
        closed = errors.IllegalStateError("producer closed before the record was delivered")
        fail_batches(self._acc.drain_all(), closed, self._acc)
        fail_batches(self._acc.incomplete(), closed, self._acc)

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def rewind_to_committed(consumer: Any) -> None:
    """Seek every partition assigned to `consumer` back to its committed offset (the
    beginning when nothing is committed), so records of an aborted transaction are
    consumed again. Raises what Consumer.committed raises."""
    parts = list(consumer.assignment())
    if not parts:
        return
    committed = consumer.committed(parts)
    for tp in parts:
        om = committed.get(tp)
        if om is None:
            consumer.seek_to_beginning([tp])
        else:
            consumer.seek(tp, om.offset)


def complete_transaction(prepared: PreparedTxnState | tuple[str, int, int], conf: Mapping[str, Any] | str,
                         commit: bool = True, timeout: float | None = None) -> None:
    """Second phase of a two-phase commit: commit (commit=True) or abort the
    transaction sealed by `Producer.prepare_transaction()`, from any process, with
    EndTxn carrying its PID and epoch. `prepared`: a PreparedTxnState or a
    (transactional_id, producer_id, epoch) tuple; `conf`: producer settings
    (`config.ProducerSchema`, bootstrap.servers required), or the bootstrap.servers
    string itself; `timeout` in
    seconds (default request.timeout.ms). Idempotent: completing again with the same
    decision succeeds. Returns once the coordinator has logged the decision; the
    transaction markers follow within milliseconds (the coordinator rolls them forward
    after a failover).

    Raises errors.ProducerFencedError when the transactional.id has a newer epoch
    (a new producer instance or transaction.prepared.max.ms aborted it);
    errors.InvalidTxnStateError when it was completed the other way, or has no
    transaction; errors.InvalidProducerIdMappingError for an unknown PID;
    errors.KafkaTimeoutError when the coordinator does not answer in time (call again).
    """
    tid, pid, epoch = prepared
    settings = {"bootstrap.servers": conf} if isinstance(conf, str) else dict(conf)
    core = ClientCore(parse(ProducerSchema, settings).as_dict())
    try:
        timeout_s = core.request_timeout_s if timeout is None else timeout
        req = pb.EndTxnRequest(transactional_id=tid, producer_id=int(pid), producer_epoch=int(epoch),
                               committed=bool(commit))
        try:
            core.coordinator_call(tid, COORDINATOR_TRANSACTION, lambda addr: core.txn_stub(addr).EndTxn, req,
                                  timeout_s=timeout_s)
        except errors.ExactlyError as exc:
            if is_retriable(exc):
                raise errors.KafkaTimeoutError(
                    f"EndTxn({'commit' if commit else 'abort'}) of {tid!r} did not succeed within "
                    f"{timeout_s:.1f} s: {exc}") from exc
            raise normalize(exc) from None
    finally:
        core.close()


__all__ = ["Producer", "PreparedTxnState", "PreparedTransaction", "complete_transaction", "TransactionAbortedError"]
