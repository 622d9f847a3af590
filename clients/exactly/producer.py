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

Two-phase commit, in the spirit of KIP-939: `Producer.prepare_transaction()` flushes
and seals the open transaction at the coordinator (PrepareTxn) and returns a
`PreparedTransaction` (transactional.id, PID, epoch); any process may then decide
its outcome with `complete_transaction(prepared, conf, commit=...)` (EndTxn with that
PID and epoch). A prepared transaction is not aborted after transaction.timeout.ms
but after the coordinator's transaction.prepared.max.ms (default 1 hour); a new
producer instance calling init_transactions() with the same transactional.id aborts
it (fencing: KIP-939's keepPreparedTxn=false behaviour).
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Generator, Mapping, NamedTuple

from exactly_wire import compression
from exactly_wire import records as _rec
from exactly_wire.clock import wall_clock_ms
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb

from . import errors
from ._accumulator import RecordAccumulator, StickyPartitioner, fail_batches, failed_future, partition_for_key
from ._client import COORDINATOR_GROUP, COORDINATOR_TRANSACTION, ClientCore, is_retriable, run_flow
from ._sender import Sender, SenderConfig
from ._txn_manager import (FENCING_CODES, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TransactionManager, TransactionManagerState,
                           copy_error, normalize)
from .errors import TransactionAbortedError
from .types import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition

log = logging.getLogger(__name__)

_INT32_MAX = 2147483647


# Bytes a record adds besides key, value and headers, counting the batch header.
_RECORD_OVERHEAD = _rec.HEADER_SIZE + 32


class _TopicPartitions(NamedTuple):
    ids: list[int]
    tps: list[TopicPartition]
    by_id: dict[int, TopicPartition]


class PreparedTransaction(NamedTuple):
    """A transaction sealed by `Producer.prepare_transaction()`, to be completed by
    `complete_transaction()` from any process: its transactional.id, producer id
    (PID) and producer epoch. Plain values (picklable, JSON-friendly)."""

    transactional_id: str
    producer_id: int
    epoch: int


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


def _as_bool(v: Any) -> bool:
    if isinstance(v, str):
        if v.strip().lower() in ("true", "1", "yes"):
            return True
        if v.strip().lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"not a boolean: {v!r}")
    return bool(v)


def _as_acks(v: Any) -> int:
    s = str(v).strip().lower()
    if s in ("all", "-1"):
        return -1
    if s in ("0", "1"):
        return int(s)
    raise ValueError(f"acks must be 0, 1 or all, not {v!r}")


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

    `conf` (Kafka keys; values may be str or native types):
      bootstrap.servers        "host:port,host:port" (required)
      transactional.id         enables transactions (init_transactions first)
      enable.idempotence       default True (PID + sequences; needs acks=all)
      acks                     0 | 1 | all (default all)
      linger.ms                ms a non-full batch waits for more records (default 5)
      batch.size               bytes per partition batch (default 16384)
      transaction.timeout.ms   ms before the coordinator aborts an open transaction (60000)
      retries                  tries per batch after the first (default 2147483647)
      max.in.flight.requests.per.connection  batches in flight per partition (5; 1-5 with idempotence)
      request.timeout.ms       ms per request (30000)
      delivery.timeout.ms      ms a record may take from send() to its outcome (120000)
      compression.type         none | gzip | snappy | lz4 | zstd
      max.block.ms             ms send()/init_transactions() may block (60000)
      buffer.memory            bytes of unsent records before send() blocks (33554432)
      max.request.size         largest record batch in bytes (1048576)
      retry.backoff.ms / retry.backoff.max.ms   backoff between retries (100 / 1000)

    Raises ValueError for invalid or conflicting settings (e.g. transactional.id with
    enable.idempotence=false). Thread-safe: send() may be called from several threads.
    """

    def __init__(self, conf: Mapping[str, Any]):
        conf = dict(conf)
        self._core = self._make_core(conf)
        tid = conf.get("transactional.id") or None
        self._transactional_id: str | None = str(tid) if tid is not None else None
        idem_set = "enable.idempotence" in conf
        idempotent = _as_bool(conf.get("enable.idempotence", True))
        acks_set = "acks" in conf
        self._acks = _as_acks(conf.get("acks", "all"))
        self._max_in_flight = int(conf.get("max.in.flight.requests.per.connection", 5))
        self._retries = int(conf.get("retries", _INT32_MAX))
        if self._max_in_flight < 1:
            raise ValueError("max.in.flight.requests.per.connection must be >= 1")
        if self._transactional_id is not None:
            if idem_set and not idempotent:
                raise ValueError("transactional.id requires enable.idempotence=true")
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
                    raise ValueError("idempotence requires " + ", ".join(conflicts))
                idempotent = False  # not asked for explicitly: Kafka >= 3.0 falls back
        elif not acks_set:
            self._acks = -1
        self._linger_ms = float(conf.get("linger.ms", 5))
        self._batch_size = max(int(conf.get("batch.size", 16384)), 1)
        self._request_timeout_ms = self._core.request_timeout_ms
        self._delivery_timeout_ms = float(conf.get("delivery.timeout.ms", 120000))
        self._max_block_ms = float(conf.get("max.block.ms", 60000))
        self._max_request_size = int(conf.get("max.request.size", 1048576))
        self._backoff_ms = float(self._core.retry_backoff_ms)
        self._backoff_max_ms = float(self._core.retry_backoff_max_ms)
        self._compression = compression.codec_for(conf.get("compression.type", "none"))
        self._txn_timeout_ms = int(conf.get("transaction.timeout.ms", 60000))
        self._txn = TransactionManager(self._transactional_id, idempotent, self._txn_timeout_ms)
        self._acc = RecordAccumulator(self._batch_size, self._linger_ms,
                                      int(conf.get("buffer.memory", 32 * 1024 * 1024)))
        self._partitioner = StickyPartitioner()
        self._partitioner_lock = threading.Lock()
        self._topic_cache: dict[str, _TopicPartitions] = {}
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
        if self._closed:
            raise errors.IllegalStateError("producer is closed")
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
        md = core.metadata([topic], refresh=True) if refresh else core.metadata([topic])
        ids = md.partitions(topic)
        if not ids:
            ids = core.retry(lambda: core.partitions_for(topic), timeout_s=self._max_block_ms / 1000.0)
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
        return CoordinatorRequest(self._transactional_id, COORDINATOR_TRANSACTION, "txn", method, request, timeout_s)

    def _init_producer_id(self, timeout_s: float, bump: bool = False) -> Generator:
        """InitProducerId to the transaction coordinator (step 2 of the data flow);
        `bump` passes the current PID/epoch so the coordinator bumps the epoch (KIP-360)."""
        txn = self._txn
        req = pb.InitProducerIdRequest(
            transactional_id=self._transactional_id or "",
            transaction_timeout_ms=self._txn_timeout_ms,
            producer_id=txn.producer_id if bump else NO_PRODUCER_ID,
            producer_epoch=txn.producer_epoch if bump else NO_PRODUCER_EPOCH)
        try:
            resp = yield self._txn_call("InitProducerId", req, timeout_s)
        except errors.ExactlyError as exc:
            err = txn.initialize_failed(exc)
            if is_retriable(err):
                raise errors.KafkaTimeoutError(f"InitProducerId did not succeed within {timeout_s} s: {err}") from err
            raise err from None
        txn.set_producer_id_and_epoch(resp.producer_id, resp.producer_epoch)
        log.info("producer %s: PID %d epoch %d", self._transactional_id, resp.producer_id, resp.producer_epoch)

    def init_transactions(self, timeout: float | None = None) -> None:
        """Get this transactional.id's PID and a new epoch from the transaction
        coordinator, fencing older instances and completing (aborting) their open
        transaction. Call once, before the first begin_transaction().
        `timeout` in seconds (default max.block.ms).

        Raises errors.IllegalStateError without transactional.id or when called
        twice; errors.KafkaTimeoutError when the coordinator did not answer in time
        (the call may be repeated); errors.InvalidTransactionTimeoutError and other
        fatal errors. Design doc: "Public APIs", initTransactions()."""
        self._check_open()
        run_flow(self._init_transactions_flow(timeout), self._perform)

    def _init_transactions_flow(self, timeout: float | None) -> Generator:
        if self._transactional_id is None:
            raise errors.IllegalStateError("init_transactions() needs transactional.id")
        self._txn.begin_initialize()
        yield from self._init_producer_id(self._timeout_s(timeout))

    def begin_transaction(self) -> None:
        """Start a transaction (local; the coordinator hears of it with the first
        partition or offsets added). Raises errors.IllegalStateError when not
        initialized or a transaction is open, or the stored error after a fatal or
        abortable error. Design doc: "Public APIs", beginTransaction()."""
        self._check_open()
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
                    producer_epoch=txn.producer_epoch, group_id=gm.group_id), timeout_s)
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
                group_instance_id=gm.group_instance_id or "",
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
        elif txn.sequences_unresolved and not commit:
            # Nothing was ended under a new epoch, but some batch of the aborted
            # transaction may or may not be in the log: a new epoch restarts sequences
            # so later batches are not rejected (KIP-360).
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

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTransaction:
        """First phase of a two-phase commit (in the spirit of KIP-939): flush the
        transaction's records, then seal it at the transaction coordinator
        (PrepareTxn). The transaction stays open: no record may be sent to it any
        more, and the coordinator no longer aborts it after transaction.timeout.ms
        but after transaction.prepared.max.ms (coordinator setting, default 1 hour).
        Returns PreparedTransaction(transactional_id, producer_id, epoch); the second
        phase is `complete_transaction(prepared, conf, commit=...)` from any process,
        or commit_transaction() / abort_transaction() on this producer. close() leaves
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
                                   producer_epoch=txn.producer_epoch)
        try:
            yield self._txn_call("PrepareTxn", req, max(deadline - time.monotonic(), 0.001))
        except errors.ExactlyError as exc:
            if is_retriable(exc):
                raise errors.KafkaTimeoutError(f"PrepareTxn did not succeed within {timeout_s:.1f} s: {exc}") from exc
            raise txn.record_error(exc) from None
        txn.transaction_sealed()
        return PreparedTransaction(self._transactional_id, txn.producer_id, txn.producer_epoch)

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
                               producer_epoch=txn.producer_epoch, committed=commit)
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

    # ------------------------------------------------------------ lifecycle

    def _check_open(self) -> None:
        if self._closed:
            raise errors.IllegalStateError("producer is closed")

    def close(self, timeout: float | None = None) -> None:
        """Send queued records (unless the producer hit a fatal error), stop the
        sender thread and release connections. `timeout` in seconds for the flush
        (None: no limit); records still pending then fail with
        errors.IllegalStateError. An open transaction is not committed (the
        coordinator aborts it after transaction.timeout.ms). Idempotent."""
        if not self._mark_closed():
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


def complete_transaction(prepared: PreparedTransaction | tuple[str, int, int], conf: Mapping[str, Any] | str,
                         commit: bool = True, timeout: float | None = None) -> None:
    """Second phase of a two-phase commit: commit (commit=True) or abort the
    transaction sealed by `Producer.prepare_transaction()`, from any process, with
    EndTxn carrying its PID and epoch. `prepared`: a PreparedTransaction or a
    (transactional_id, producer_id, epoch) tuple; `conf`: client settings with
    bootstrap.servers (and optionally request.timeout.ms, retry.backoff.ms,
    retry.backoff.max.ms), or the bootstrap.servers string itself; `timeout` in
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
    core = ClientCore(settings)
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


__all__ = ["Producer", "PreparedTransaction", "complete_transaction", "TransactionAbortedError"]
