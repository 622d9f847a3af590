"""AIOProducer: the Producer for asyncio, on grpc.aio.

It runs the synchronous Producer's rules, not a copy of them: a private subclass of
`exactly.Producer` supplies the asyncio core (`AIOClientCore`) and an asyncio
sender task (`AIOSender`, a `SenderCore` driver), so record validation,
partitioning, batching (`RecordAccumulator`), sequence and transaction state
(`TransactionManager`) and the transaction flows (`exactly._txn_flows`: init, send
offsets, commit, abort, prepare, complete: generators of I/O effects) are the
Producer's own; this module only performs their effects with `await`. KIP-98
("Transactional Producer"), KIP-447 and its draft's group-aware
init_transactions_for_group(), as the Producer.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
from typing import Any, AsyncIterator, Callable, Iterable, Mapping

from exactly import errors
from exactly._unclosed import collected, creation_stack
from exactly.producer import Producer, UnknownTopicWait
from exactly._two_phase import PreparedTxnState
from exactly._txn_calls import CoordinatorCall
from exactly._txn_flows import AwaitAddPartitions, AwaitBatches
from exactly._client import Transport
from exactly.config import ProducerSchema
from exactly._sender import SenderCore
from exactly.types import ConsumerGroupMetadata, OffsetAndMetadata, RecordMetadata, TopicPartition

from ._core import AIOClientCore, run_flow_async

log = logging.getLogger(__name__)


def _on_loop(fut: concurrent.futures.Future, out: asyncio.Future | None = None) -> asyncio.Future:
    """An asyncio Future (`out`, or a new one) resolved with `fut`, at once: records
    are resolved on the loop's thread (by the sender task, an abort or close), so
    after `await flush()` every earlier record's future is done (asyncio.wrap_future
    would lag a loop step)."""
    out = asyncio.get_running_loop().create_future() if out is None else out

    def _copy(f: concurrent.futures.Future) -> None:
        if out.done():
            return
        exc = f.exception()
        if exc is None:
            out.set_result(f.result())
        else:
            out.set_exception(exc)

    fut.add_done_callback(_copy)
    return out


class AIOSender(SenderCore):
    """Runs `SenderCore` steps in an asyncio task: after `wakeup()`, after a request
    outcome, or after the delay a step asks for. `wait_until` lets the producer's
    coroutines wait for the effects of the steps (batches completed, partitions
    added, buffer space)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._wake = asyncio.Event()
        self._waiters: list[asyncio.Future] = []
        self._running = True
        self._task: asyncio.Task | None = None
        self._pid_task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = self.core.spawn(self._run())

    def wakeup(self) -> None:
        self._wake.set()

    def _complete(self, fn: Callable[[], None]) -> None:
        self._completions.append(fn)
        self._wake.set()

    def stop(self) -> None:
        self._running = False
        self._wake.set()

    async def join(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the task to end after `stop()`."""
        if self._task is not None:
            await asyncio.wait([self._task], timeout=timeout_s)

    async def _run(self) -> None:
        try:
            while self._running:
                delay = self._step()
                self._notify()
                if not self._wake.is_set() and not self._completions and (delay is None or delay > 0):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), None if delay is None else delay / 1000.0)
                self._wake.clear()
            self._drain_completions()
        finally:
            self._notify()

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def wait_until(self, predicate: Callable[[], bool], deadline: float | None) -> bool:
        """Wait until `predicate()` holds after a sender step, or until `deadline`
        (seconds of the producer's clock, `MonotonicClock.now_s()`; None: no limit). Returns whether it holds."""
        while not predicate():
            remaining = None if deadline is None else deadline - self.clock.now_s()
            if remaining is not None and remaining <= 0:
                return False
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            self.wakeup()
            await asyncio.wait([waiter], timeout=remaining)
        return True

    def _init_idempotent_pid(self, now: float) -> float | None:
        """InitProducerId of an idempotent producer in a task; its outcome arrives as
        a completion (`_on_idempotent_pid`)."""
        if self._pid_task is None:
            self._pid_task = self.core.spawn(self._init_pid(now))
        return None

    async def _init_pid(self, now: float) -> None:
        core = self.core

        async def _once():
            md = await core.metadata_async()
            try:
                addr = self._pick_txn_coordinator(md, now)
            except errors.ExactlyError:
                await core.metadata_async(refresh=True)
                raise
            resp = await core.call(core.txn_stub(addr).InitProducerId, self._idempotent_pid_request())
            errors.check(resp.error_code, resp.error_message or None)
            return resp

        try:
            outcome = (await core.retry(_once, timeout_s=self.config.request_timeout_ms / 1000.0), None)
        except errors.ExactlyError as exc:
            outcome = (None, exc)

        def _done() -> None:
            self._pid_task = None
            self._on_idempotent_pid(*outcome, now)

        self._complete(_done)


class _Producer(Producer):
    """The Producer with asyncio I/O: its blocking methods are not used."""

    def _make_core(self, settings: ProducerSchema, transport: Transport | None) -> AIOClientCore:
        return AIOClientCore(settings, transport=transport)

    def _make_sender(self, *args: Any, **kwargs: Any) -> AIOSender:
        return AIOSender(*args, **kwargs)

    def __del__(self) -> None:
        """Nothing: the AIOProducer that owns it warns and releases it (its `__del__`)."""


class AIOProducer:
    """Sends records, idempotently and in transactions, from asyncio code.

    `conf`: the settings of `exactly.Producer` (Kafka keys: bootstrap.servers,
    transactional.id, enable.idempotence, acks, linger.ms, batch.size,
    transaction.timeout.ms, delivery.timeout.ms, max.block.ms, buffer.memory, ...).
    Create it inside a running event loop (raises RuntimeError otherwise) and use it
    from that loop; raises ValueError for invalid settings.

        async with AIOProducer(conf) as producer:
            await producer.init_transactions()
            async with producer.transaction():
                await producer.send("out", b"v", key=b"k")
    """

    def __init__(self, conf: Mapping[str, Any], *, transport: Transport | None = None):
        # Where, in debug mode (also the event loop's), for the unclosed warning (`__del__`).
        self._created = creation_stack(asyncio.get_running_loop().get_debug())
        self._p = _Producer(conf, transport=transport)
        self._sender: AIOSender = self._p._sender
        # Sends waiting for metadata or buffer space queue their records in call order:
        # each waits for the previous one's `appended` future (the tail).
        self._queued = 0
        self._tail: asyncio.Future | None = None
        self._queueing: set[asyncio.Task] = set()

    # ------------------------------------------------------------ send

    async def send(self, topic: str, value: Any = None, key: Any = None, partition: int | None = None,
                   headers: Any = None, timestamp_ms: int | None = None) -> RecordMetadata:
        """Send one record and return its RecordMetadata (topic, partition, offset,
        timestamp ms) once the leader acknowledged it. Arguments and errors as
        `exactly.Producer.send` (delivery errors are raised here)."""
        return await self.send_nowait(topic, value, key, partition, headers, timestamp_ms)

    def send_nowait(self, topic: str, value: Any = None, key: Any = None, partition: int | None = None,
                    headers: Any = None, timestamp_ms: int | None = None) -> asyncio.Future:
        """Queue one record now and return an asyncio Future of its RecordMetadata.
        Records keep the order of the calls (per partition). When the topic's
        partitions are not known yet or buffer.memory is full, queueing waits (up to
        max.block.ms) in a task. Errors arrive through the future (e.g.
        errors.MessageTooLargeError, errors.IllegalStateError outside a transaction,
        delivery errors), except errors.IllegalStateError when closed and TypeError
        for bad value types (when the record is queued at once), raised here."""
        args = (topic, value, key, partition, headers, timestamp_ms)
        self._p._check_open()
        loop = asyncio.get_running_loop()
        if not self._queued and self._can_queue_now(topic):
            try:
                return _on_loop(self._p.send(*args))
            except TypeError:
                raise
            except Exception as exc:  # noqa: BLE001 - as for a queued send: through the future
                out = loop.create_future()
                out.set_exception(exc)
                return out
        previous, appended, out = self._tail, loop.create_future(), loop.create_future()
        self._tail = appended
        self._queued += 1
        task = loop.create_task(self._send_queued(args, previous, appended, out))
        self._queueing.add(task)
        task.add_done_callback(self._queueing.discard)
        return out

    def _can_queue_now(self, topic: str) -> bool:
        return topic in self._p._topic_cache and self._p._acc.has_space()

    async def _send_queued(self, args: tuple, previous: asyncio.Future | None, appended: asyncio.Future,
                           out: asyncio.Future) -> None:
        """Queue a record once the earlier queued sends did, its topic's partitions
        are known and buffer.memory has room; `out` gets its outcome."""
        try:
            if previous is not None:
                await previous
            deadline = self._p._clock.now_s() + self._p._max_block_ms / 1000.0
            topic = args[0]
            if topic not in self._p._topic_cache:
                core = self._p._core
                unknown = UnknownTopicWait(topic, self._p._max_block_ms, self._p._waits)
                try:
                    await core.retry(lambda: core.partitions_for_async(topic),
                                     timeout_s=self._p._max_block_ms / 1000.0, on_retry=unknown.note)
                except errors.ExactlyError as exc:  # as the sync send()
                    raise unknown.outcome(exc)
                finally:
                    unknown.done()
            if not await self._sender.wait_until(self._p._acc.has_space, deadline):
                raise errors.KafkaTimeoutError(
                    f"buffer.memory ({self._p._acc.buffer_memory} bytes) full for max.block.ms")
            _on_loop(self._p.send(*args), out)
        except asyncio.CancelledError:
            out.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - the caller's future carries it
            if not out.done():
                out.set_exception(exc)
        finally:
            self._queued -= 1
            appended.set_result(None)

    async def partitions_for(self, topic: str) -> list[int]:
        """Partition ids of `topic`. Raises errors.UnknownTopicOrPartitionError."""
        return await self._p._core.partitions_for_async(topic)

    async def flush(self, timeout: float | None = None) -> None:
        """Send every queued record now and wait until each has an outcome; `timeout`
        in seconds (None: no limit). Raises errors.KafkaTimeoutError."""
        await self._drive(self._p._flows.flush(timeout))

    # ------------------------------------------------------------ transactions

    async def init_transactions(self, timeout: float | None = None, *, keep_prepared_txn: bool = False) -> None:
        """As `exactly.Producer.init_transactions`: `await init_transactions(timeout)`
        fences older instances (KIP-98); keep_prepared_txn=True keeps a prepared
        transaction of the id (KIP-939), to decide with `complete_transaction(state)`,
        and fences older instances all the same (a new epoch)."""
        self._p._check_open()
        await self._drive(self._p._flows.init(timeout, keep_prepared_txn))

    async def init_transactions_for_group(self, partitions: Iterable[TopicPartition],
                                          group: str | ConsumerGroupMetadata, generation: int | None = None,
                                          timeout: float | None = None) -> None:
        """As `exactly.Producer.init_transactions_for_group`: the group-aware form of
        the KIP-447 draft, `await init_transactions_for_group(partitions, group_id,
        generation)` (or with `consumer.group_metadata()`), to call after every
        rebalance. `timeout` in seconds (default max.block.ms)."""
        self._p._check_open()
        await self._drive(self._p._flows.init_for_group(partitions, group, generation, timeout))

    def begin_transaction(self) -> None:
        """As `exactly.Producer.begin_transaction` (local, no I/O)."""
        self._p.begin_transaction()

    async def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
                                          group_metadata: ConsumerGroupMetadata | str,
                                          timeout: float | None = None) -> None:
        """As `exactly.Producer.send_offsets_to_transaction` (KIP-447)."""
        self._p._check_open()
        await self._drive(self._p._flows.send_offsets(offsets, group_metadata, timeout))

    async def commit_transaction(self, timeout: float | None = None) -> None:
        """As `exactly.Producer.commit_transaction`."""
        self._p._check_open()
        await self._drive(self._p._flows.commit(timeout))

    async def abort_transaction(self, timeout: float | None = None) -> None:
        """As `exactly.Producer.abort_transaction`."""
        self._p._check_open()
        await self._drive(self._p._flows.abort(timeout))

    async def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """As `exactly.Producer.prepare_transaction` (KIP-939 two-phase commit)."""
        self._p._check_open()
        return await self._drive(self._p._flows.prepare(timeout))

    def prepared_transaction_state(self) -> PreparedTxnState | None:
        """As `exactly.Producer.prepared_transaction_state` (local, no I/O)."""
        return self._p.prepared_transaction_state()

    async def complete_transaction(self, state: PreparedTxnState | str | None, timeout: float | None = None) -> str:
        """As `exactly.Producer.complete_transaction` (KIP-939 completeTransaction):
        commit when `state` is the prepared transaction's, abort otherwise; returns
        "committed", "aborted" or "none"."""
        self._p._check_open()
        return await self._drive(self._p._flows.complete(state, timeout))

    @contextlib.asynccontextmanager
    async def transaction(self, timeout: float | None = None) -> AsyncIterator["AIOProducer"]:
        """`async with producer.transaction():` begins a transaction, commits it when
        the block ends normally, and otherwise aborts it and re-raises the block's
        exception; the same rules as `exactly.Producer.transaction()`
        (`Producer._after_failed_transaction`): a fatal error (fenced, not authorized,
        ...: KIP-98 "Error Handling") closes the producer instead — not a fenced
        group-aware one (KIP-447 draft) — and a commit that timed out with its outcome
        unknown is re-raised as is. `timeout` in seconds for commit/abort (default
        max.block.ms)."""
        self.begin_transaction()
        try:
            yield self
            await self.commit_transaction(timeout)
        except BaseException as exc:
            action = self._p._after_failed_transaction(exc)
            if action == "close":
                log.error("producer %s: fatal error %r; closing", self._p._transactional_id, exc)
                await self.close()
            elif action == "abort":
                try:
                    await self.abort_transaction(timeout)
                except errors.ExactlyError as abort_exc:
                    if self._p._after_failed_transaction(abort_exc) == "close":
                        await self.close()
                    raise abort_exc from exc
            raise

    # ------------------------------------------------------------ effects

    async def _drive(self, flow) -> Any:
        """Run a Producer flow after the records of earlier send_nowait() calls are
        queued (a flush, commit or abort covers them, as in the synchronous Producer)."""
        if self._queued and self._tail is not None:
            await self._tail
        return await run_flow_async(flow, self._perform)

    async def _perform(self, effect: Any) -> Any:
        p = self._p
        if isinstance(effect, CoordinatorCall):
            core = p._core
            return await core.coordinator_call(effect.key, effect.key_type, functools.partial(effect.rpc, core),
                                               effect.request, error_code=effect.error_code,
                                               timeout_s=effect.timeout_s)
        if isinstance(effect, AwaitBatches):
            batches = p._acc.incomplete()
            if not await self._sender.wait_until(lambda: all(b.done.is_set() for b in batches), effect.deadline):
                raise errors.KafkaTimeoutError(effect.what)
            return None
        if isinstance(effect, AwaitAddPartitions):
            if not await self._sender.wait_until(lambda: not p._txn.add_in_flight, effect.deadline):
                raise errors.KafkaTimeoutError("AddPartitionsToTxn still in flight at the timeout")
            return None
        raise TypeError(f"unknown effect {effect!r}")

    # ------------------------------------------------------------ lifecycle

    async def close(self, timeout: float | None = None) -> None:
        """As `exactly.Producer.close`: send queued records (unless a fatal error
        happened), stop the sender task, release connections. Idempotent."""
        p = self._p
        if not p._mark_closed():
            return
        if p._created_in_pid != os.getpid():
            await p._core.close()  # a producer of the parent, in a forked child
            return
        try:
            if not p._txn.is_fatal_state:
                await self.flush(timeout)
        except errors.ExactlyError:
            pass
        finally:
            p._acc.close()
            self._sender.stop()
            await self._sender.join(max(p._settings.request_timeout_ms / 1000.0, 1.0))
            p._fail_unfinished()
            await p._core.close()

    async def __aenter__(self) -> "AIOProducer":
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    def __del__(self) -> None:
        # Unclosed: a ResourceWarning; queued records are not sent (exactly._unclosed).
        p = getattr(self, "_p", None)
        collected(self, p is not None and not getattr(p, "_closed", True), lambda: self._abandon(p))

    def _abandon(self, p: _Producer) -> None:
        """Release what an unclosed producer holds, on its event loop."""
        p._closed = True
        p._core.release_unclosed(p._acc.close, self._sender.stop)


__all__ = ["AIOProducer", "AIOSender"]
