"""One owned `CONSUMER_CONSUMER_OFFSETS_TOPIC` partition as this group coordinator sees it: the
log it appends to, the tailer that applies the log to the materialised state, and
the waits of writes until the tailer has applied them (docs/design.md, "Consumer
groups and offsets", "Offsets").

`OffsetsLog` owns what serves that: the partition's state
(state.OffsetsPartitionState), the tailer's kick, the futures waiting for an
offset to be applied, the per-group store locks (group metadata records and
tombstones of one group are appended in order), the offset writes in flight
(require_stable sees them) and the last transactional committer of each
partition (KIP-447 draft). No ownership logic of its own: whether this process
still owns the partition and whether an append was fenced are asked through the
injected `owns` and `fenced` callables (services.common.cluster.owned.PartitionOwner).

Seeds: KIP-98 design document, "Consumer Coordinator Startup" (replay from offset
0, then tail; pending transactional offsets wait for their marker).
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections import Counter
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Protocol, TypeVar

from exactly_wire import records
from exactly_wire.clock import Clock
from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from services.common.cluster.owned import code_name
from services.common.protocol import CONSUMER_OFFSETS_TOPIC, INTERNAL_APPEND_TIMEOUT_MS
from services.common.settings import GroupCoordinatorSchema

from . import log_format
from .offsets import OffsetAndMetadata
from .state import OffsetsPartitionState

log = logging.getLogger(__name__)

READ_UNCOMMITTED = 0

T = TypeVar("T")
WaitFor = Callable[[Awaitable[T], float], Awaitable[T]]


class LogClient(Protocol):
    """What the coordinator needs from services.common.transport.rpc.ClusterClient."""

    async def produce(self, topic: str, partition: int, batch: bytes, acks: int = -1,
                      timeout_ms: int = INTERNAL_APPEND_TIMEOUT_MS, transactional_id: str = "",
                      consumer_group_id: str = "", verified_from: int | None = None) -> tuple[int, int]: ...

    async def fetch(self, topic: str, partition: int, offset: int, max_wait_ms: int = 0,
                    isolation_level: int = 0, max_bytes: int = 1 << 20) -> Any: ...


# Kafka GroupMetadataManager.storeOffsets: append errors as the committer sees them.
OFFSET_APPEND_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.LEADER_NOT_AVAILABLE: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NETWORK_EXCEPTION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.INVALID_FETCH_SIZE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
}

# Kafka GroupMetadataManager.storeGroup: append errors as joining members see them.
GROUP_APPEND_ERRORS = {
    **OFFSET_APPEND_ERRORS,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.REBALANCE_IN_PROGRESS,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.INVALID_FETCH_SIZE: ErrorCode.UNKNOWN_SERVER_ERROR,
}


def _as_code(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


@dataclass(eq=False)
class OffsetsLog:
    """The `CONSUMER_CONSUMER_OFFSETS_TOPIC` partition `state.partition` as this coordinator sees it.

    client: LogClient (produce, fetch); state: the partition's materialised
    OffsetsPartitionState (`next_offset` is the next offset to apply);
    producer_id/producer_epoch: the writer identity of this owner's plain batches
    (producer_id -1: none); owns() -> whether the partition is still this
    coordinator's; fenced(code) -> whether an error code of an append written with
    our writer PID means a newer owner fenced us (the partition is then deposed).
    config: the parsed settings (services.common.settings.GroupCoordinatorSchema;
    its defaults when None): offsets.commit.timeout.ms, how long an append and the
    wait for the tailer may take; offsets.load.buffer.size, bytes per fetch;
    group.coordinator.tail.max.wait.ms, long poll of the tailer's fetches;
    offset.metadata.max.bytes. clock: monotonic ms
    passed to the state when applying; wall_clock: wall-clock ms (commit
    timestamps); sleep: async (seconds) -> None, backoff after a failed fetch;
    wait_for: asyncio.wait_for's shape, the deadline of waits (injected in tests).
    """

    client: LogClient
    state: OffsetsPartitionState
    _: KW_ONLY
    clock: Clock
    wall_clock: Clock
    producer_id: int = -1
    producer_epoch: int = -1
    owns: Callable[[], bool] = lambda: True
    fenced: Callable[[int], bool] = lambda _code: False
    config: GroupCoordinatorSchema = field(default_factory=GroupCoordinatorSchema)
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    wait_for: WaitFor = asyncio.wait_for

    def __post_init__(self) -> None:
        self.partition = self.state.partition
        self.closed = False
        # set when a write of ours was appended: the tailer fetches at once
        self.kick = asyncio.Event()
        self._seq = itertools.count()
        self._applied_waiters: list[tuple[int, int, asyncio.Future]] = []
        # group id -> lock ordering the appends of that group's records
        self.store_locks: dict[str, asyncio.Lock] = {}
        # (group, partition) -> offset commit writes in flight (require_stable sees them)
        self.inflight: Counter[tuple[str, TopicPartition]] = Counter()
        # group id -> partition -> (transactional.id, generation) of the last
        # transactional offset commit (KIP-447 draft compatibility fencing: ownership in
        # that generation, group.concurrent_commits; forgotten with the group or the
        # offset; in memory: after a failover the generation and assignment checks,
        # rebuilt from the log, still hold).
        self.committers: dict[str, dict[TopicPartition, tuple[str, int]]] = {}

    @property
    def writer(self) -> tuple[int, int]:
        """(producer id, producer epoch) of our plain batches (log_format.NO_WRITER: none)."""
        return (self.producer_id, self.producer_epoch) if self.producer_id >= 0 else log_format.NO_WRITER

    def store_lock(self, group_id: str) -> asyncio.Lock:
        """The lock that orders the appends of `group_id`'s group metadata records
        and tombstones."""
        return self.store_locks.setdefault(group_id, asyncio.Lock())

    def in_flight(self, group_id: str, tp: TopicPartition) -> bool:
        """Whether an offset commit of `group_id` for `tp` is being appended."""
        return self.inflight.get((group_id, tp), 0) > 0

    # ------------------------------------------------------------ applied offsets

    def wait_applied(self, last_offset: int) -> asyncio.Future:
        """Future resolved True once the tailer applied `last_offset`, False if the
        partition is closed first."""
        fut = asyncio.get_running_loop().create_future()
        if self.closed:
            fut.set_result(False)
        elif self.state.next_offset > last_offset:
            fut.set_result(True)
        else:
            heapq.heappush(self._applied_waiters, (last_offset, next(self._seq), fut))
        return fut

    async def until_applied(self, last_offset: int, timeout_ms: int) -> ErrorCode:
        """Wait at most `timeout_ms` until the tailer applied `last_offset`: NONE,
        NOT_COORDINATOR (the partition was closed first) or REQUEST_TIMED_OUT."""
        try:
            applied = await self.wait_for(self.wait_applied(last_offset), timeout_ms / 1000)
        except asyncio.TimeoutError:
            return ErrorCode.NOT_COORDINATOR if self.closed else ErrorCode.REQUEST_TIMED_OUT
        return ErrorCode.NONE if applied else ErrorCode.NOT_COORDINATOR

    def notify_applied(self) -> None:
        """Resolve the waiters whose offset the state has applied."""
        while self._applied_waiters and self._applied_waiters[0][0] < self.state.next_offset:
            _, _, fut = heapq.heappop(self._applied_waiters)
            if not fut.done():
                fut.set_result(True)

    def close(self) -> None:
        """Stop the partition (idempotent): pending `wait_applied` futures resolve False."""
        self.closed = True
        for _, _, fut in self._applied_waiters:
            if not fut.done():
                fut.set_result(False)
        self._applied_waiters.clear()

    # ------------------------------------------------------------ replay and tail

    async def replay(self) -> None:
        """Apply the partition from `state.next_offset` up to the high watermark
        (read_uncommitted fetches without waiting); failed fetches are retried after
        100 ms of `sleep`. Returns once the state reached the high watermark."""
        while True:
            resp = await self._fetch(max_wait_ms=0)
            if not self._handle_fetch(resp, loading=True):
                await self.sleep(0.1)
                continue
            if self.state.next_offset >= resp.high_watermark:
                return
            if not resp.records:
                await self.sleep(0.01)

    async def tail(self) -> None:
        """Keep applying new batches (long poll of group.coordinator.tail.max.wait.ms, cut short by
        `kick`); never returns (cancel it)."""
        while True:
            self.kick.clear()
            fetch = asyncio.ensure_future(self._fetch(self.config.tail_max_wait_ms))
            kicked = asyncio.ensure_future(self.kick.wait())
            try:
                done, _ = await asyncio.wait({fetch, kicked}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                fetch.cancel()
                raise
            finally:
                kicked.cancel()
            if fetch not in done:
                # A write of ours was appended: fetch again now rather than wait
                # for the long poll to notice.
                fetch.cancel()
                await asyncio.gather(fetch, return_exceptions=True)
                continue
            if not self._handle_fetch(fetch.result(), loading=False):
                await self.sleep(0.1)

    async def _fetch(self, max_wait_ms: int) -> Any | None:
        try:
            return await self.client.fetch(CONSUMER_OFFSETS_TOPIC, self.partition, self.state.next_offset,
                                           max_wait_ms=max_wait_ms, isolation_level=READ_UNCOMMITTED,
                                           max_bytes=self.config.offsets_load_buffer_size)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - keep tailing; the leader may be restarting
            log.exception("%s-%d: fetch failed", CONSUMER_OFFSETS_TOPIC, self.partition)
            return None

    def _handle_fetch(self, resp: Any | None, loading: bool) -> bool:
        """Apply a fetch response; False when it carried an error (retry later)."""
        if resp is None:
            return False
        code = resp.error_code
        if code == ErrorCode.OFFSET_OUT_OF_RANGE and resp.log_start_offset > self.state.next_offset:
            log.warning("%s-%d: offset %d below the log start %d; continuing from there",
                        CONSUMER_OFFSETS_TOPIC, self.partition, self.state.next_offset, resp.log_start_offset)
            self.state.next_offset = resp.log_start_offset
            return True
        if code != ErrorCode.NONE:
            log.debug("%s-%d: fetch error %s", CONSUMER_OFFSETS_TOPIC, self.partition, code_name(code))
            return False
        if resp.records:
            self.state.apply_all(resp.records, self.clock(), loading)
            self.notify_applied()
        return True

    # ------------------------------------------------------------ appends

    async def append_fence(self, batch: bytes) -> int:
        """Append one fence batch (acks=all); returns the leader's error code value."""
        code, _ = await self.client.produce(CONSUMER_OFFSETS_TOPIC, self.partition, batch, acks=-1,
                                            timeout_ms=self.config.offsets_commit_timeout_ms)
        return code

    async def append(self, batch: bytes, transactional_id: str = "", consumer_group_id: str = "",
                     verified_from: int | None = None) -> ErrorCode:
        """Append `batch` to the partition and wait until the tailer applied it (a
        transactional batch names its producer's transactional.id, and group for a
        group-aware producer, for the leader's verification; `verified_from`: the
        coordinator verified it itself, see GroupCoordinator.txn_commit_offsets). Returns the partition
        leader's error code, NOT_COORDINATOR if the partition was resigned meanwhile
        (or our writer was fenced), REQUEST_TIMED_OUT after offsets.commit.timeout.ms."""
        if not self.owns():
            return ErrorCode.NOT_COORDINATOR
        code, base_offset = await self.client.produce(CONSUMER_OFFSETS_TOPIC, self.partition, batch, acks=-1,
                                                      timeout_ms=self.config.offsets_commit_timeout_ms,
                                                      transactional_id=transactional_id,
                                                      consumer_group_id=consumer_group_id,
                                                      verified_from=verified_from)
        if code != ErrorCode.NONE:
            if records.parse_header(batch).producer_id == self.producer_id and self.fenced(code):
                return ErrorCode.NOT_COORDINATOR
            return _as_code(code)
        last_offset = base_offset + records.parse_header(batch).last_offset_delta
        self.kick.set()
        return await self.until_applied(last_offset, self.config.offsets_commit_timeout_ms)

    async def write_offsets(self, group_id: str, offsets: Mapping[TopicPartition, OffsetAndMetadata],
                            producer_id: int = records.NO_PRODUCER_ID,
                            producer_epoch: int = records.NO_PRODUCER_EPOCH, transactional_id: str = "",
                            consumer_group_id: str = "", verified_from: int | None = None
                            ) -> dict[TopicPartition, ErrorCode]:
        """Append the offset commits of `group_id` in one batch (transactional when
        producer_id >= 0) stamped with the wall clock; the partitions are in flight
        until the append is answered. Per partition: NONE once applied,
        OFFSET_METADATA_TOO_LARGE (not written), or the append's error as the
        committer sees it (OFFSET_APPEND_ERRORS)."""
        results: dict[TopicPartition, ErrorCode] = {}
        valid: dict[TopicPartition, OffsetAndMetadata] = {}
        now = self.wall_clock()
        for tp, value in offsets.items():
            tp = TopicPartition(*tp)
            if len(value.metadata.encode()) > self.config.offset_metadata_max_bytes:
                results[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                valid[tp] = OffsetAndMetadata(value.offset, value.metadata, value.leader_epoch, now)
        if not valid:
            return results
        batch = log_format.offsets_batch(group_id, valid, now, producer_id, producer_epoch, self.writer)
        keys = [(group_id, tp) for tp in valid]
        self.inflight.update(keys)
        try:
            raw = await self.append(batch, transactional_id, consumer_group_id, verified_from)
        finally:
            self.inflight.subtract(keys)
            for k in keys:
                if self.inflight[k] <= 0:
                    del self.inflight[k]
        code = OFFSET_APPEND_ERRORS.get(raw, raw)
        for tp in valid:
            results[tp] = code
        return results

    async def append_tombstones(self, group_id: str, partitions: list[TopicPartition],
                                group_too: bool = True) -> ErrorCode:
        """Append tombstones of `group_id`'s committed offsets of `partitions` (and
        of its group metadata with group_too) in one batch; returns the append's
        error as the committer sees it (OFFSET_APPEND_ERRORS)."""
        raw = await self.append(log_format.tombstones_batch(group_id, partitions, self.wall_clock(),
                                                            self.writer, group_too=group_too))
        return OFFSET_APPEND_ERRORS.get(raw, raw)


__all__ = ["GROUP_APPEND_ERRORS", "LogClient", "OFFSET_APPEND_ERRORS", "CONSUMER_OFFSETS_TOPIC", "OffsetsLog",
           "READ_UNCOMMITTED"]
