"""The asyncio client core: `CoreBase` (settings, caches, what a failed try
invalidates) with grpc.aio channels.

Two kinds of methods. Coroutines (`call`, `retry`, `metadata_async`,
`find_coordinator_async`, `coordinator_call`, ...) wait for the network. The
synchronous `metadata()`, `find_coordinator()` and `call_future()` never wait: they
answer from the caches (starting a refresh in the background when an answer is
stale or missing) or return an asyncio Task. The latter are what the I/O-free rules
shared with the synchronous clients call (`_sender.SenderCore`, `_fetcher.Fetcher`,
`_consumer_group.GroupMembership`, the Consumer's position logic), so those rules
run unchanged inside the event loop (docs/design.md, "SDK").
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
import os
from typing import Any, Awaitable, Callable, Coroutine, Generator, Iterable, TypeVar

import grpc
import tenacity

from exactly import _fork, errors
from exactly._client import COORDINATOR_ERRORS as _COORDINATOR_ERRORS
from exactly._client import (CoreBase, Metadata, Transport, TransportCheck, bounded_s, call_deadline, channel_options,
                             no_metadata_yet, outcome_of_retries, remaining_s, translate_rpc_error)
from exactly_wire.clock import SYSTEM_CLOCK, MonotonicClock
from exactly_wire.security import secure_aio_channel
from exactly_wire.v1 import exactly_pb2 as pb

log = logging.getLogger(__name__)

T = TypeVar("T")


async def run_flow_async(flow: Generator[Any, Any, T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """Drive a flow (see `exactly._client.run_flow`) in the event loop:
    `await perform(effect)` gives the outcome sent back into the flow, or the
    exception thrown into it. Returns the flow's return value."""
    try:
        effect = next(flow)
        while True:
            try:
                outcome = await perform(effect)
            except BaseException as exc:  # noqa: BLE001 - the flow decides
                effect = flow.throw(exc)
            else:
                effect = flow.send(outcome)
    except StopIteration as stop:
        return stop.value


class AIOClientCore(CoreBase):
    """Channels (grpc.aio), metadata and coordinators of one asyncio client. Must be
    created inside a running event loop (raises RuntimeError otherwise) and used
    from that loop only. Settings: see `exactly._client.CoreBase`."""

    def __init__(self, conf: dict[str, Any], clock: MonotonicClock = SYSTEM_CLOCK, transport: Transport | None = None):
        super().__init__(conf, clock, transport)
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task] = set()
        self._metadata_task: asyncio.Task | None = None
        self._lookups: dict[tuple[int, str], asyncio.Task] = {}

    def _new_channel(self, address: str) -> grpc.aio.Channel:
        if self.transport is not None:
            return self.transport.aio_channel(address)
        if _fork.grpcio_unusable():
            return _fork.AioPureChannel(address, self.security)
        return _fork.note_grpcio_channel(secure_aio_channel(address, self.security, channel_options(self.settings)))

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task:
        """Run `coro` as a task of this client; `close()` cancels it."""
        # A fresh context: a background task is bound by its own timeouts, not by the
        # deadline of the call that happened to start it.
        task = self._loop.create_task(coro, context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def background(self) -> list[asyncio.Task]:
        """The cache refreshes in progress (metadata, coordinator lookups): a waiter
        may wake when one completes."""
        out = [t for t in self._lookups.values() if not t.done()]
        if self._metadata_task is not None and not self._metadata_task.done():
            out.append(self._metadata_task)
        return out

    # ------------------------------------------------------------ calls

    async def call(self, method: Callable, request: Any, timeout_s: float | None = None) -> Any:
        """Invoke a unary grpc.aio stub method and return the response; transport
        failures raise the SDK error of `exactly._client.translate_rpc_error`
        (errors.NetworkException, errors.RequestTimedOutError, ...). `timeout_s`
        defaults to request.timeout.ms."""
        timeout = remaining_s(self.request_timeout_s if timeout_s is None else timeout_s)
        try:
            return await method(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise translate_rpc_error(exc) from None
        except grpc.aio.UsageError as exc:  # channel closed
            raise errors.NetworkException(str(exc)) from None

    def call_future(self, method: Callable, request: Any, timeout_s: float | None = None) -> asyncio.Task:
        """`call` as a Task (done(), result(), exception(), cancel() as the
        concurrent futures of the synchronous core). Cancelling it cancels the RPC."""
        return self.spawn(self.call(method, request, timeout_s))

    async def retry(self, fn: Callable[[], Awaitable[T]], timeout_s: float | None = None,
                    on_retry: Callable[[BaseException], None] | None = None) -> T:
        """`await fn()` until it returns, with the retry policy of `ClientCore.retry`."""
        async def _try() -> T:  # tenacity awaits only coroutine functions; fn may be a lambda
            return await fn()

        timeout = self.retry_timeout_s(timeout_s)
        retried: list[BaseException] = []
        with call_deadline(timeout, self.clock):
            try:
                return await tenacity.AsyncRetrying(sleep=self.clock.sleep_async,
                                                    **self._retry_policy(timeout, on_retry, retried))(_try)
            except errors.RequestTimedOutError as exc:
                raise outcome_of_retries(exc, retried) from None

    # ------------------------------------------------------------ metadata

    async def _fetch_metadata(self) -> Metadata:
        self._metadata = await run_flow_async(self._metadata_flow(), self._perform_metadata)
        return self._metadata

    def _perform_metadata(self, effect: Any) -> Awaitable[Any]:
        if isinstance(effect, TransportCheck):  # plain blocking sockets: off the event loop
            return asyncio.to_thread(self.check_transport, effect.address)
        return self.call(*effect)

    def _refresh(self) -> asyncio.Task:
        task = self._metadata_task
        if task is None or task.done():
            task = self._metadata_task = self.spawn(self._fetch_metadata())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no warning
        return task

    def metadata(self, topics: Iterable[str] | None = None, refresh: bool = False) -> Metadata:
        """The cached metadata, without waiting: when `refresh`, stale or missing one
        of `topics`, a refresh starts in the background and the cached view is
        returned meanwhile. Raises errors.NetworkException (retriable) before the
        first metadata arrived."""
        md = self._metadata
        if not refresh and md is not None and self._fresh(md, topics):
            return md
        previous = self._metadata_task
        self._refresh()
        if md is None:
            raise no_metadata_yet(previous)
        return md

    metadata_nowait = metadata  # the name the I/O-free rules shared with ClientCore use

    def pending_refresh(self) -> asyncio.Task | None:
        """The metadata refresh in progress, if any."""
        task = self._metadata_task
        return task if task is not None and not task.done() else None

    async def metadata_async(self, topics: Iterable[str] | None = None, refresh: bool = False,
                             timeout_s: float | None = None) -> Metadata:
        """`ClientCore.metadata` for the event loop: the cached metadata, fetched
        again (one fetch at a time) when `refresh`, stale or missing one of `topics`.
        Waits at most `timeout_s` (default request.timeout.ms, cut to the enclosing
        `call_deadline`); raises errors.RequestTimedOutError (retriable) after that,
        the fetch going on in the background."""
        md = self._metadata
        if not refresh and md is not None and self._fresh(md, topics):
            return md
        return await self._wait_bounded(self._refresh(), timeout_s, "metadata")

    async def _wait_bounded(self, task: asyncio.Task, timeout_s: float | None, what: str) -> Any:
        """The result of a shared background `task`, waited for at most `timeout_s`
        (see `metadata_async`); the task itself is not cancelled."""
        wait_s = bounded_s(self.request_timeout_s if timeout_s is None else timeout_s)
        try:
            return await asyncio.wait_for(asyncio.shield(task), max(wait_s, 0.001))
        except asyncio.TimeoutError:
            raise errors.RequestTimedOutError(f"{what}: no answer within {wait_s:.1f} s") from None

    async def partitions_for_async(self, topic: str) -> list[int]:
        """`ClientCore.partitions_for`: raises errors.UnknownTopicOrPartitionError."""
        parts = (await self.metadata_async([topic])).partitions(topic)
        if not parts:
            parts = (await self.metadata_async(refresh=True)).partitions(topic)
        if not parts:
            self.named_topic_error(topic, await self.call(self.cluster_stub().Metadata, self.named_request(topic)))
        return self._require_partitions(topic, parts)

    # ------------------------------------------------------------ coordinators

    async def _lookup(self, key: str, key_type: int, timeout_s: float | None) -> str:
        async def _find() -> str:
            resp = await self.call(self.cluster_stub().FindCoordinator,
                                   pb.FindCoordinatorRequest(key=key, key_type=key_type))
            return self._coordinator_address(key, resp)

        addr = await self.retry(_find, timeout_s)
        self._cache_coordinator(key, key_type, addr)
        return addr

    def _start_lookup(self, key: str, key_type: int, timeout_s: float | None) -> asyncio.Task:
        task = self._lookups.get((key_type, key))
        if task is None or task.done():
            task = self._lookups[(key_type, key)] = self.spawn(self._lookup(key, key_type, timeout_s))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    def find_coordinator(self, key: str, key_type: int, timeout_s: float | None = None) -> str:
        """The cached coordinator address, without waiting; otherwise a lookup starts
        in the background and errors.CoordinatorNotAvailableError (retriable) is raised."""
        cached = self.cached_coordinator(key, key_type)
        if cached is not None:
            return cached
        self._start_lookup(key, key_type, timeout_s)
        raise errors.CoordinatorNotAvailableError(f"looking up the coordinator of {key!r}")

    async def find_coordinator_async(self, key: str, key_type: int, timeout_s: float | None = None) -> str:
        """`ClientCore.find_coordinator` for the event loop (one lookup per key at a time)."""
        cached = self.cached_coordinator(key, key_type)
        if cached is not None:
            return cached
        return await self._wait_bounded(self._start_lookup(key, key_type, timeout_s), timeout_s,
                                        f"the coordinator of {key!r}")

    async def coordinator_call(self, key: str, key_type: int, stub_method: Callable[[str], Callable],
                               request: Any, error_code: Callable[[Any], int] = lambda r: r.error_code,
                               timeout_s: float | None = None) -> Any:
        """`ClientCore.coordinator_call` for the event loop."""

        async def _once() -> Any:
            addr = await self.find_coordinator_async(key, key_type, timeout_s)
            try:
                return self._coordinator_outcome(await self.call(stub_method(addr), request), error_code)
            except errors.ExactlyError as exc:
                if exc.code in _COORDINATOR_ERRORS:
                    self.invalidate_coordinator(key, key_type)
                raise

        return await self.retry(_once, timeout_s)

    # ------------------------------------------------------------ lifecycle

    def release_unclosed(self, *steps: Callable[[], None]) -> None:
        """For the `__del__` of an asyncio client collected without close(): run
        `steps` (each stops something, without I/O) and `close()` on this client's event
        loop, from any thread; nothing when the loop is closed."""
        loop = self._loop
        if loop.is_closed():
            return

        def _release() -> None:
            for step in steps:
                step()
            loop.create_task(self.close())

        loop.call_soon_threadsafe(_release)

    async def close(self) -> None:
        """Cancel this client's tasks and close every channel. Idempotent."""
        tasks = [t for t in self._tasks if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        channels = self._take_channels()
        if self.created_in_pid != os.getpid():
            return  # a client of the parent, in a forked child: its channels are the parent's
        for ch in channels:
            await ch.close()



__all__ = ["AIOClientCore", "run_flow_async"]
