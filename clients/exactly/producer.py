"""The Producer: batching, idempotence and transactions (KIP-98).

`send()` appends records to per-partition batches (`_accumulator`); a background
sender thread drains them, assigns sequence numbers, adds partitions to the
transaction, and pipelines Produce requests to the partition leaders. The
transaction state lives in `_txn_manager.TransactionManager` (no I/O). The
coordinator round trips of init_transactions, send_offsets_to_transaction,
commit_transaction and abort_transaction run in the calling thread: the flows of
`_txn_flows.TransactionFlows` (shared with `exactly.aio`), whose effects
`Producer._perform` performs blocking.

Follows the KIP-98 design document, "Transactional Producer" (Public APIs, Error
Handling, Added Configurations) and "Data Flow" steps 1-5; KIP-447 for the group
metadata passed with transactional offsets, and the KIP-447 draft for the
group-aware `init_transactions_for_group()`. KIP-939's two-phase commit:
`prepare_transaction()` and `complete_transaction(state)` here, the prepared state and
the completion from any process in `_two_phase` (docs/design.md, "Two-phase commit
with a database").
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import weakref
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, TypeVar

import tenacity

from exactly_wire import records as _rec
from exactly_wire.clock import wall_clock_ms

from . import _fork, errors
from ._unclosed import collected, creation_stack
from ._accumulator import RecordAccumulator, StickyPartitioner, fail_batches, failed_future, partition_for_key
from ._client import ClientCore, Transport, call_deadline, run_flow
from ._sender import Sender, SenderConfig
from ._two_phase import PreparedTxnState
from ._txn_calls import CoordinatorCall
from ._txn_flows import AwaitAddPartitions, AwaitBatches, TransactionFlows
from ._txn_manager import TransactionManager, TransactionManagerState, copy_error, fenced_error
from ._waiting import WaitWarnings
from .config import ProducerSchema, parse
from .consumer import rewind_to_committed
from .errors import ConfigurationError
from .types import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition

log = logging.getLogger(__name__)

T = TypeVar("T")


# Bytes a record adds besides key, value and headers, counting the batch header.
_RECORD_OVERHEAD = _rec.HEADER_SIZE + 32


class _TopicPartitions(NamedTuple):
    ids: list[int]
    tps: list[TopicPartition]
    by_id: dict[int, TopicPartition]


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


class UnknownTopicWait:
    """The outcome of send()'s wait of up to max.block.ms for a topic's metadata
    (Kafka's KafkaProducer.waitOnMetadata): `note` is the retry loop's on_retry;
    `outcome(exc)` is the error to raise when the wait ended with `exc`. A topic the
    cluster said it does not know raises errors.UnknownTopicOrPartitionError, also
    when the deadline passed during the last try (on a slow network, or a machine
    short of CPU) instead of between two tries; other retriable errors become
    errors.KafkaTimeoutError naming the topic; non-retriable ones are raised as they are.
    While it waits, `warnings` (the producer's `_waiting.WaitWarnings`) logs at WARNING,
    rate-limited, what it waits for; `done()` ends that condition."""

    def __init__(self, topic: str, max_block_ms: float, warnings: WaitWarnings | None = None):
        self.topic = topic
        self.max_block_ms = max_block_ms
        self.unknown: errors.UnknownTopicOrPartitionError | None = None
        self.warnings = warnings

    @property
    def key(self) -> str:
        return f"topic:{self.topic}"

    def note(self, exc: BaseException) -> None:
        if isinstance(exc, errors.UnknownTopicOrPartitionError):
            self.unknown = exc
        if self.warnings is not None:
            self.warnings.waiting(self.key, lambda: self.waiting_message(exc))

    def waiting_message(self, exc: BaseException) -> str:
        """What the WARNING says while send() waits on the topic's metadata."""
        head = (f"send() to topic {self.topic!r} waits for its metadata (up to max.block.ms "
                f"{self.max_block_ms:.0f} ms): {type(exc).__name__}: {exc}")
        if isinstance(exc, errors.UnknownTopicOrPartitionError):
            return (head + "; the cluster does not know the topic: create it (AdminClient.create_topics, "
                    "`exactly topics create`) or turn the services' auto.create.topics.enable on")
        return head

    def done(self) -> None:
        if self.warnings is not None:
            self.warnings.resolved(self.key)

    def outcome(self, exc: errors.ExactlyError) -> errors.ExactlyError:
        if not exc.retriable or isinstance(exc, errors.UnknownTopicOrPartitionError):
            return exc
        if self.unknown is not None:
            return self.unknown
        timeout = errors.KafkaTimeoutError(f"no metadata for topic {self.topic!r} within max.block.ms "
                                           f"({self.max_block_ms:.0f} ms): {exc}")
        timeout.__cause__ = exc
        return timeout

def _idempotence(settings: ProducerSchema, sender: SenderConfig) -> bool:
    """Whether the producer is idempotent: enable.idempotence, always with
    transactional.id. Idempotence needs acks=all, max.in.flight.requests.per.connection
    <= 5 and retries > 0; without them it is off when not asked for explicitly (Kafka
    >= 3.0 falls back). Raises ConfigurationError for transactional.id with
    enable.idempotence=false, or for idempotence asked for with a conflicting setting."""
    asked = "enable_idempotence" in settings.model_fields_set
    idempotent = settings.enable_idempotence
    if settings.transactional_id is not None:
        if asked and not idempotent:
            raise ConfigurationError("transactional.id requires enable.idempotence=true",
                                     key="enable.idempotence", value=False, allowed="true with transactional.id")
        idempotent = True
    if not idempotent:
        return False
    conflicts = []
    if sender.acks != -1:
        conflicts.append("acks=all")
    if sender.max_in_flight > 5:
        conflicts.append("max.in.flight.requests.per.connection <= 5")
    if sender.retries < 1:
        conflicts.append("retries > 0")
    if not conflicts:
        return True
    if asked or settings.transactional_id is not None:
        raise ConfigurationError("enable.idempotence=true (also implied by transactional.id) "
                                 "requires " + ", ".join(conflicts),
                                 key="enable.idempotence", value=True, allowed=", ".join(conflicts))
    return False


class Producer:
    """Sends records to topic partitions, optionally idempotently and in transactions.

    `conf`: Kafka keys (values may be str or native types), defined with their
    defaults and allowed values by `config.ProducerSchema` (docs/reference/configuration.md,
    "Producer"): bootstrap.servers (required), transactional.id,
    enable.idempotence, acks, linger.ms, batch.size, compression.type, ...
    `transport`: where its calls go instead of the network (an
    `exactly.testing.MockCluster` in a unit test); None: the cluster of bootstrap.servers.

    Raises errors.ConfigurationError (a ValueError) for an unknown or unsupported
    key, a wrong value, or conflicting settings (e.g. transactional.id with
    enable.idempotence=false). Thread-safe: send() may be called from several threads.
    """

    def __init__(self, conf: Mapping[str, Any], *, transport: Transport | None = None):
        self._created = creation_stack()  # where, in debug mode, for the unclosed warning (`__del__`)
        settings = parse(ProducerSchema, conf)
        self._settings = settings
        self._created_in_pid = os.getpid()  # a forked child must not use it (exactly/_fork.py)
        self._core = self._make_core(settings, transport)
        # Metadata naming an unknown topic asks for its creation, as Kafka's producer does
        # (the services decide: auto.create.topics.enable).
        self._core.allow_auto_create_topics = True
        self._transactional_id: str | None = settings.transactional_id
        sender_config = SenderConfig.from_settings(settings)
        idempotent = _idempotence(settings, sender_config)
        self._max_block_ms = float(settings.max_block_ms)
        self._max_request_size = settings.max_request_size
        self._txn = TransactionManager(self._transactional_id, idempotent, settings.transaction_timeout_ms)
        # One monotonic clock, the core's, for every timer and wait of this producer.
        self._clock = self._core.clock
        # Rate-limited WARNINGs while send() waits for a topic's metadata.
        self._waits = WaitWarnings(log, self._clock)
        self._acc = RecordAccumulator(settings.batch_size, float(settings.linger_ms), settings.buffer_memory,
                                      clock=self._clock)
        self._partitioner = StickyPartitioner()
        self._partitioner_lock = threading.Lock()
        self._topic_cache: dict[str, _TopicPartitions] = {}
        self._close_lock = threading.Lock()
        self._sender = self._make_sender(sender_config, self._acc, self._txn, self._core,
                                         on_metadata_change=_weak_call(self.metadata_changed), clock=self._clock)
        # An appender hands the GIL to a sender thread; exactly.aio's sender is a task on
        # the appending loop, which a wait could only delay.
        self._acc.sender_thread = isinstance(self._sender, threading.Thread)
        # The transaction flows, performed blocking by `_perform` (awaited by exactly.aio).
        self._flows = TransactionFlows(self._transactional_id, self._txn, self._acc, self._sender,
                                       settings.transaction_timeout_ms, self._max_block_ms, self._clock)
        self._closed = False  # set last: a producer whose construction failed has nothing to close
        self._sender.start()

    # The I/O of a producer instance: `exactly.aio` swaps in its grpc.aio core and
    # an asyncio sender task.
    def _make_core(self, settings: ProducerSchema, transport: Transport | None) -> ClientCore:
        return ClientCore(settings, transport=transport)

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
        unknown = UnknownTopicWait(topic, self._max_block_ms, self._waits)
        # Kafka's send(): wait for the topic's metadata up to max.block.ms, in all.
        with call_deadline(max_block_s, self._clock):
            try:
                md = core.metadata([topic], refresh=True) if refresh else core.metadata([topic])
                ids = md.partitions(topic)
                if not ids:
                    ids = core.retry(lambda: core.partitions_for(topic), timeout_s=max_block_s,
                                     on_retry=unknown.note)
            except errors.ExactlyError as exc:
                if not exc.retriable or isinstance(exc, errors.UnknownTopicOrPartitionError):
                    raise unknown.outcome(exc)
                try:
                    ids = core.retry(lambda: core.partitions_for(topic), timeout_s=max_block_s,
                                     on_retry=unknown.note)
                except errors.ExactlyError as last:
                    raise unknown.outcome(last)
            finally:
                unknown.done()
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
        run_flow(self._flows.flush(timeout), self._perform)

    # ------------------------------------------------------------ effects of the transaction flows

    def _await_batches(self, deadline: float | None, timed_out: str) -> None:
        for batch in self._acc.incomplete():
            remaining = None if deadline is None else max(deadline - self._clock.now_s(), 0)
            if not self._clock.wait(batch.done, remaining):
                raise errors.KafkaTimeoutError(timed_out)

    def _perform(self, effect: Any) -> Any:
        """Perform one effect of a `_txn_flows` flow, blocking this thread (exactly.aio's
        AIOProducer awaits them instead); returns its outcome or raises its error."""
        if isinstance(effect, CoordinatorCall):
            core = self._core
            return core.coordinator_call(effect.key, effect.key_type, functools.partial(effect.rpc, core),
                                         effect.request, error_code=effect.error_code, timeout_s=effect.timeout_s)
        if isinstance(effect, AwaitBatches):
            return self._await_batches(effect.deadline, effect.what)
        if isinstance(effect, AwaitAddPartitions):
            return self._wait_add_partitions(effect.deadline)
        raise TypeError(f"unknown effect {effect!r}")

    def _wait_add_partitions(self, deadline: float) -> None:
        while self._txn.add_in_flight:
            if self._clock.now_s() >= deadline:
                raise errors.KafkaTimeoutError("AddPartitionsToTxn still in flight at the timeout")
            self._clock.sleep(0.001)

    # ------------------------------------------------------------ transactions

    def init_transactions(self, timeout: float | None = None, *, keep_prepared_txn: bool = False) -> None:
        """Get this transactional.id's PID and a new epoch from the transaction
        coordinator, fencing older instances and completing (aborting) their open
        transaction. Once, before the first begin_transaction() (KIP-98 design
        document, "Public APIs", initTransactions(); confluent-kafka's
        `init_transactions(timeout)`). `timeout` in seconds (default max.block.ms).

        `keep_prepared_txn=True` (KIP-939 initTransactions(keepPreparedTxn)): a
        transaction of the id that an earlier instance sealed with
        prepare_transaction() is kept instead of aborted; this producer takes it over
        as its own prepared transaction (`prepared_transaction_state()` returns it,
        under the transaction's own PID and epoch) and must decide it with
        `complete_transaction(state)` before beginning another. The epoch is bumped
        all the same: this producer talks with a new epoch, and every earlier
        instance -- its complete_transaction() of the kept transaction included -- gets
        errors.ProducerFencedError. Without such a transaction it behaves as the plain
        form.

        The group-aware form of the KIP-447 draft is `init_transactions_for_group()`.

        Raises errors.IllegalStateError without transactional.id or when called
        twice; errors.KafkaTimeoutError when the coordinator did not answer in time
        (the call may be repeated; PENDING_TRANSACTION is waited on until then);
        errors.InvalidTransactionTimeoutError and other fatal errors."""
        self._check_open()
        run_flow(self._flows.init(timeout, keep_prepared_txn), self._perform)
        self._learn_transaction_version()

    def init_transactions_for_group(self, partitions: Iterable[TopicPartition],
                                    group: str | ConsumerGroupMetadata, generation: int | None = None,
                                    timeout: float | None = None) -> None:
        """The group-aware init_transactions of the KIP-447 draft, for ONE producer
        per process in a consume-transform-produce loop:
        `init_transactions_for_group(partitions, group_id, generation)` or
        `init_transactions_for_group(partitions, consumer.group_metadata())` (the
        generation then comes from the metadata unless given). `partitions`: the input
        partitions (TopicPartition) the consumer group assigned in the rebalance of
        `generation` (an int >= 0). The producer's transactions then live with the
        transaction coordinator of the group, which aborts and fences any open
        transaction of another producer of the group on these partitions and returns
        once those are complete, and refuses later requests of older generations
        (ILLEGAL_GENERATION). Call it in `on_assign` after every rebalance (the
        callback gets the generation as its second argument), and after a
        ProducerFencedError; the producer is never closed on a rebalance. An open
        transaction is dropped (the coordinator aborts it; its unsent records fail
        with TransactionAbortedError). `timeout` in seconds (default max.block.ms).

        Raises ValueError without a group id or a generation >= 0;
        errors.IllegalStateError without transactional.id, for a producer of another
        group, or while a transaction is committing, aborting or prepared;
        errors.KafkaTimeoutError when the coordinator did not answer in time (the call
        may be repeated); errors.IllegalGenerationError for a generation older than
        the coordinator has seen; errors.InvalidTransactionTimeoutError and other
        fatal errors. docs/design.md, "Group-aware transactions (KIP-447 draft)"."""
        self._check_open()
        run_flow(self._flows.init_for_group(partitions, group, generation, timeout), self._perform)
        self._learn_transaction_version()

    def _learn_transaction_version(self) -> None:
        try:
            # The cluster's transaction version decides whether partition leaders add
            # this producer's partitions (KIP-890 part 2); metadata is fetched anyway
            # by the first send.
            self._txn.transaction_version = self._core.metadata().transaction_version
        except errors.ExactlyError as exc:
            log.info("producer %s: no metadata yet (%s); partitions are added explicitly until it comes",
                     self._transactional_id, exc)

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
        run_flow(self._flows.send_offsets(offsets, group_metadata, timeout), self._perform)

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
        run_flow(self._flows.commit(timeout), self._perform)

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """First phase of a two-phase commit (KIP-939 prepareTransaction()): flush the
        transaction's records, then seal it at the transaction coordinator
        (PrepareTxn). The transaction stays open: no record may be sent to it any
        more, and the coordinator never aborts it by itself (not after
        transaction.timeout.ms, nor at any later time: KIP-939).
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
        return run_flow(self._flows.prepare(timeout), self._perform)

    @property
    def transactional_id(self) -> str | None:
        """The producer's transactional.id (None for a non-transactional producer)."""
        return self._transactional_id

    def prepared_transaction_state(self) -> PreparedTxnState | None:
        """The state of this producer's prepared transaction (prepared by it, or kept by
        init_transactions(keep_prepared_txn=True)); None when none is prepared."""
        return self._flows.prepared_state()

    def complete_transaction(self, state: PreparedTxnState | str | None, timeout: float | None = None) -> str:
        """Second phase of KIP-939's two-phase commit (completeTransaction(state)):
        commit this producer's prepared transaction when `state` — the PreparedTxnState
        (or its serialize() string) that the external transaction manager recorded —
        is that transaction's, abort it otherwise (`state` None: nothing recorded).
        Returns "committed", "aborted", or "none" when no transaction is prepared (a
        recovery after the transaction was completed: nothing to do). `timeout` in
        seconds (default max.block.ms).

        Raises errors.ProducerFencedError when a newer instance of the
        transactional.id initialised meanwhile (with keep_prepared_txn=True it decides
        the transaction; without, it aborted it): this producer is then fenced for
        good; errors.KafkaTimeoutError (call again);
        errors.IllegalStateError while a transaction is open but not prepared; other
        errors as commit_transaction() / abort_transaction()."""
        self._check_open()
        return run_flow(self._flows.complete(state, timeout), self._perform)

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
        run_flow(self._flows.abort(timeout), self._perform)

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
        completed with commit_transaction() instead of being run again. An
        errors.UnknownTopicOrPartitionError is not retried: send() waited max.block.ms for
        the topic already.

        `attempts`: tries in all (>= 1). Returns fn's result of the committed
        attempt. Raises a fatal error at once (the producer is closed, fn is not
        called again); the last error when every attempt failed; any non-Kafka
        exception of fn after aborting (not retried: it is a bug, not a fault).
        KIP-98 design document, "Transactional Producer": Error Handling."""
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, not {attempts}")

        def _retriable(exc: BaseException) -> bool:
            # An unknown topic is not transient: send() already waited max.block.ms for it
            # (and a service with auto.create.topics.enable would have created it).
            return isinstance(exc, errors.ExactlyError) and not exc.fatal \
                and (exc.txn_requires_abort or exc.retriable) and not self._closed \
                and not isinstance(exc, errors.UnknownTopicOrPartitionError)

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
            sleep=self._clock.sleep,
            retry=tenacity.retry_if_exception(_retriable),
            wait=tenacity.wait_exponential(multiplier=self._settings.retry_backoff_ms / 1000.0,
                                           max=self._settings.retry_backoff_max_ms / 1000.0)
            + tenacity.wait_random(0, self._settings.retry_backoff_ms / 1000.0 / 5),
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
            self._sender.join(timeout=max(self._settings.request_timeout_ms / 1000.0, 1.0))
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

    def __del__(self) -> None:
        # Unclosed: a ResourceWarning; queued records are not sent (exactly._unclosed).
        collected(self, not getattr(self, "_closed", True), self._abandon)

    def _abandon(self) -> None:
        """Release what an unclosed producer holds, without waiting or I/O."""
        self._closed = True
        self._acc.close()
        self._sender.stop()
        self._core.close()


def _weak_call(method: Callable[[], None]) -> Callable[[], None]:
    """`method` (a bound method) called through a weak reference: the sender thread,
    which runs until the producer is closed, must not keep an unclosed producer alive
    (its `__del__` stops the thread)."""
    ref = weakref.WeakMethod(method)

    def call() -> None:
        bound = ref()
        if bound is not None:
            bound()
    return call


def decide_prepared_transaction(transactional_id: str, conf: Mapping[str, Any] | str, commit: bool,
                                state: PreparedTxnState | str | None = None,
                                timeout: float | None = None) -> PreparedTxnState:
    """An operator's decision of a prepared transaction (KIP-939), which the transaction
    coordinator never takes by itself: a producer of `transactional_id` runs
    init_transactions(keep_prepared_txn=True) -- which fences every instance of the
    id, the application's among them -- and commits the kept transaction when
    commit=True and `state` (the PreparedTxnState, or its serialize() string, that the
    application's database holds) is that transaction's, or aborts it when
    commit=False (`state`, when given, must match too). `conf`: producer settings
    (`config.ProducerSchema`, bootstrap.servers required; transactional.id is set
    here), or the bootstrap.servers string; `timeout` in seconds per call (default
    max.block.ms). Returns the decided transaction's PreparedTxnState.

    Raises ValueError for commit=True without `state`; errors.InvalidTxnStateError
    when no transaction of the id is prepared (its epoch was bumped all the same),
    or when `state` is not the prepared transaction's: nothing is decided then, the
    transaction stays prepared; the producer's errors (ProducerFencedError when
    another instance initialised meanwhile, KafkaTimeoutError)."""
    if isinstance(state, str):
        state = PreparedTxnState.deserialize(state)
    if commit and state is None:
        raise ValueError("committing a prepared transaction needs the state its transaction manager holds")
    settings = {"bootstrap.servers": conf} if isinstance(conf, str) else dict(conf)
    producer = Producer({**settings, "transactional.id": transactional_id})
    try:
        producer.init_transactions(timeout, keep_prepared_txn=True)
        prepared = producer.prepared_transaction_state()
        if prepared is None:
            raise errors.InvalidTxnStateError(f"transactional.id {transactional_id!r} has no prepared transaction")
        if state is not None and tuple(PreparedTxnState(*state)) != tuple(prepared):
            raise errors.InvalidTxnStateError(
                f"the prepared transaction of {transactional_id!r} is {prepared.serialize()!r}, not "
                f"{PreparedTxnState(*state).serialize()!r}: nothing decided, it stays prepared")
        producer.complete_transaction(prepared if commit else None, timeout)
        return prepared
    finally:
        producer.close()


__all__ = ["Producer", "UnknownTopicWait", "decide_prepared_transaction"]
