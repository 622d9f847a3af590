"""AIOConsumer: the Consumer for asyncio, on grpc.aio.

Like AIOProducer it runs the synchronous client's rules rather than a copy: a
private subclass of `exactly.Consumer` supplies the asyncio core and a group
membership that heartbeats from a task, so subscriptions and positions
(`_consumer_state`), fetching and the read_committed filter (`_fetcher`), the
group protocol (`_consumer_group.GroupMembership`) and the Consumer's flows (poll,
position, commit, committed, close: generators of I/O effects) are the Consumer's
own; this module performs their effects with `await`. KIP-98 design document,
"Consumer"; KIP-447.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
from typing import Any, Iterable, Mapping

import tenacity

from exactly import errors
from exactly._unclosed import collected, creation_stack
from exactly._client import COORDINATOR_GROUP, Rpc, Transport, bounded_s, call_deadline
from exactly.config import ConsumerSchema
from exactly._consumer_group import (_RETRY_CODES, FETCH_COMMITTED_RETRY_CODES, GroupMembership, offset_commit_rpc,
                                     offset_fetch_rpc)
from exactly.consumer import CommitOffsets, Consumer, FetchCommitted, LeaveGroup, Rebalance, WaitForResponses
from exactly.types import ConsumerGroupMetadata, ConsumerRecord, OffsetAndMetadata, TopicPartition

from ._core import AIOClientCore, run_flow_async

log = logging.getLogger(__name__)


class AIOGroupMembership(GroupMembership):
    """GroupMembership whose heartbeats run in a task and whose blocking requests
    (offset commit and fetch, LeaveGroup) are coroutines (`*_aio`); the protocol's
    rules are GroupMembership's."""

    _core: AIOClientCore

    def start_heartbeat(self) -> None:
        if self._hb_thread is None:
            self._hb_thread = self._core.spawn(self._heartbeat_loop_aio())

    async def _heartbeat_loop_aio(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_ms / 1000.0)
            try:
                await self.heartbeat_once_aio()
            except Exception:  # noqa: BLE001 - the task must survive anything
                log.exception("group %s: heartbeat failed", self.group_id)

    async def heartbeat_once_aio(self):
        """`GroupMembership.heartbeat_once` in the event loop."""
        req = self.heartbeat_request()
        if req is None:
            return None
        if self.poll_interval_exceeded():
            await self.leave_aio()
            return None
        core = self._core
        try:
            addr = await core.find_coordinator_async(self.group_id, COORDINATOR_GROUP, self._backoff_max_ms / 1000)
            resp = await core.call(core.group_stub(addr).Heartbeat, req, timeout_s=self.heartbeat_timeout_s)
        except errors.ExactlyError as exc:
            self.coordinator_dead(exc)
            return None
        return self.on_heartbeat(req, resp.error_code)

    async def leave_aio(self) -> None:
        """`GroupMembership.leave` in the event loop (best effort)."""
        req = self.forget_membership()
        if req is None:
            return
        core = self._core
        try:
            addr = await core.find_coordinator_async(self.group_id, COORDINATOR_GROUP, self._backoff_max_ms / 1000)
            await core.call(core.group_stub(addr).LeaveGroup, req)
        except errors.ExactlyError as exc:
            log.debug("group %s: LeaveGroup failed: %r", self.group_id, exc)

    async def close_aio(self) -> None:
        """Stop heartbeating and leave the group."""
        if self._hb_thread is not None:
            self._hb_thread.cancel()
        await self.leave_aio()

    async def _request_aio(self, rpc: Rpc, request, timeout_s: float, outcome):
        addr = await self._core.find_coordinator_async(self.group_id, COORDINATOR_GROUP, timeout_s)
        try:
            resp = await self._core.call(rpc(self._core, addr), request())
        except errors.ExactlyError as exc:
            self.request_failed(exc)
            raise
        return outcome(resp)

    async def commit_sync_aio(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], managed: bool,
                              timeout_s: float) -> None:
        """`GroupMembership.commit_sync` in the event loop."""
        if not offsets:
            return
        timeout_s = bounded_s(timeout_s)
        with call_deadline(timeout_s, self._core.clock):
            await tenacity.AsyncRetrying(sleep=self._core.clock.sleep_async,
                                         **self._retry_policy(timeout_s, _RETRY_CODES))(
                self._request_aio, offset_commit_rpc, lambda: self._commit_request(offsets, managed), timeout_s,
                self._commit_outcome)

    async def fetch_committed_aio(self, partitions: Iterable[TopicPartition], require_stable: bool,
                                  timeout_s: float) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """`GroupMembership.fetch_committed` in the event loop."""
        wanted = sorted(set(partitions))
        if not wanted:
            return {}
        timeout_s = bounded_s(timeout_s)
        with call_deadline(timeout_s, self._core.clock):
            return await tenacity.AsyncRetrying(sleep=self._core.clock.sleep_async,
                                                **self._retry_policy(timeout_s, FETCH_COMMITTED_RETRY_CODES))(
                self._request_aio, offset_fetch_rpc, lambda: self.offset_fetch_request(wanted, require_stable),
                timeout_s, lambda resp: self.offset_fetch_outcome(resp, wanted))


class _Consumer(Consumer):
    """The Consumer with asyncio I/O: its blocking methods are not used."""

    def _make_core(self, settings: ConsumerSchema, transport: Transport | None) -> AIOClientCore:
        return AIOClientCore(settings, transport=transport)

    def _make_membership(self, core: AIOClientCore, group_id: str, **settings: Any) -> AIOGroupMembership:
        return AIOGroupMembership(core, group_id, **settings)

    def __del__(self) -> None:
        """Nothing: the AIOConsumer that owns it warns and releases it (its `__del__`)."""


class AIOConsumer:
    """Consumes records from asyncio code.

    `conf`: the settings of `exactly.Consumer` (bootstrap.servers, group.id,
    isolation.level, enable.auto.commit, auto.offset.reset, max.poll.records,
    session.timeout.ms, ...). Create it inside a running event loop (raises
    RuntimeError otherwise) and use it from that loop; raises ValueError for
    invalid settings. Rebalance callbacks are plain functions of a list of
    TopicPartition.

        async with AIOConsumer(conf) as consumer:
            await consumer.subscribe(["purchases"])
            async for record in consumer:
                ...
    """

    def __init__(self, conf: Mapping[str, Any], *, transport: Transport | None = None):
        # Where, in debug mode (also the event loop's), for the unclosed warning (`__del__`).
        self._created = creation_stack(asyncio.get_running_loop().get_debug())
        self._c = _Consumer(conf, transport=transport)
        self._core: AIOClientCore = self._c._core
        self._pending: collections.deque[ConsumerRecord] = collections.deque()

    # ------------------------------------------------------------ subscription

    async def subscribe(self, topics: Iterable[str] | str, on_assign: Rebalance | None = None,
                        on_revoke: Rebalance | None = None) -> None:
        """As `exactly.Consumer.subscribe` (the join happens in `poll`)."""
        self._c.subscribe(topics, on_assign, on_revoke)

    async def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """As `exactly.Consumer.assign`."""
        self._c.assign(partitions)

    def assignment(self) -> set[TopicPartition]:
        return self._c.assignment()

    # ------------------------------------------------------------ polling

    async def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[ConsumerRecord]:
        """As `exactly.Consumer.poll`: up to `max_records` records (default
        max.poll.records), waiting up to `timeout` seconds for some."""
        self._c._check_open()
        if self._core._metadata is None:
            started = self._core.clock.now_s()
            try:
                await self._core.metadata_async(timeout_s=max(timeout, 0.0))
            except errors.ExactlyError as exc:  # no cluster yet: poll as the sync client, until its timeout
                if not exc.retriable:
                    raise
                log.debug("poll: no metadata yet: %r", exc)
            timeout = max(timeout - (self._core.clock.now_s() - started), 0.0)
        return await self._drive(self._c._poll_flow(timeout, max_records))

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None
                      ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """`poll` grouped by partition (aiokafka's shape); `timeout_ms` in ms."""
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        for r in await self.poll(timeout_ms / 1000.0, max_records):
            out.setdefault(TopicPartition(r.topic, r.partition), []).append(r)
        return out

    def __aiter__(self) -> "AIOConsumer":
        return self

    async def __anext__(self) -> ConsumerRecord:
        """The next record (polling as long as needed); ends when the consumer is closed."""
        while not self._pending:
            if self._c._closed:
                raise StopAsyncIteration
            self._pending.extend(await self.poll(1.0))
        return self._pending.popleft()

    # ------------------------------------------------------------ positions and offsets

    async def position(self, tp: TopicPartition, timeout: float | None = None) -> int:
        """As `exactly.Consumer.position`."""
        self._c._check_open()
        return await self._drive(self._c._position_flow(tp, timeout))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """As `exactly.Consumer.seek`."""
        self._drop_pending([tp])
        self._c.seek(tp, offset)

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        partitions = None if partitions is None else list(partitions)
        self._drop_pending(partitions)
        self._c.seek_to_beginning(partitions)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        partitions = None if partitions is None else list(partitions)
        self._drop_pending(partitions)
        self._c.seek_to_end(partitions)

    def _drop_pending(self, partitions: list[TopicPartition] | None) -> None:
        """Records buffered for iteration of partitions that are sought elsewhere."""
        if partitions is None:
            self._pending.clear()
            return
        tps = {TopicPartition(*tp) for tp in partitions}
        self._pending = collections.deque(r for r in self._pending if (r.topic, r.partition) not in tps)

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None,
                     timeout: float | None = None) -> None:
        """As `exactly.Consumer.commit`."""
        self._c._check_open()
        await self._drive(self._c._commit_flow(offsets, timeout))

    async def committed(self, partitions: Iterable[TopicPartition],
                        timeout: float | None = None) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """As `exactly.Consumer.committed`."""
        self._c._check_open()
        return await self._drive(self._c._committed_flow(partitions, timeout))

    def group_metadata(self) -> ConsumerGroupMetadata:
        """As `exactly.Consumer.group_metadata` (for send_offsets_to_transaction)."""
        return self._c.group_metadata()

    # ------------------------------------------------------------ effects

    async def _drive(self, flow) -> Any:
        return await run_flow_async(flow, self._perform)

    async def _perform(self, effect: Any) -> Any:
        c = self._c
        if isinstance(effect, WaitForResponses):
            waiting = c._requests_in_flight() + self._core.background()
            if waiting:
                await asyncio.wait(waiting, timeout=effect.timeout_s, return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(effect.timeout_s)
            c._fetcher.handle_completed()
            return None
        if isinstance(effect, CommitOffsets):
            return await c._group.commit_sync_aio(effect.offsets, effect.managed, effect.timeout_s)
        if isinstance(effect, FetchCommitted):
            return await c._group.fetch_committed_aio(effect.partitions, effect.require_stable, effect.timeout_s)
        if isinstance(effect, LeaveGroup):
            return await c._group.close_aio()
        raise TypeError(f"unknown effect {effect!r}")

    # ------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        """As `exactly.Consumer.close`: commit positions (auto commit), call on_revoke,
        leave the group, close connections. Idempotent."""
        c = self._c
        if c._closed:
            return
        if c._created_in_pid != os.getpid():
            c._closed = True  # a consumer of the parent, in a forked child
            await self._core.close()
            return
        try:
            await self._drive(c._close_flow())
        finally:
            c._release()
            self._pending.clear()
            await self._core.close()

    async def __aenter__(self) -> "AIOConsumer":
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    def __del__(self) -> None:
        # Unclosed: a ResourceWarning; nothing is committed, no LeaveGroup sent (exactly._unclosed).
        c = getattr(self, "_c", None)
        collected(self, c is not None and not getattr(c, "_closed", True), lambda: self._abandon(c))

    def _abandon(self, c: _Consumer) -> None:
        """Release what an unclosed consumer holds, on its event loop."""
        c._release()
        self._core.release_unclosed()


__all__ = ["AIOConsumer", "AIOGroupMembership"]
