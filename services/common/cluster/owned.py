"""The owned-partition lifecycle both coordinators share (docs/design.md, "Coordinator
ownership").

A coordinator owns some partitions of its internal topic (`TRANSACTION_STATE_TOPIC` or
`CONSUMER_OFFSETS_TOPIC`), as `CoordinatorOwnership` (ownership.py) decides. For each it
keeps an `OwnedPartition`: the partition, the coordinator epoch of the claim, the
claim's writer identity (producer id and epoch, and a retired writer PID to close),
the background tasks working on it, a `loaded` event and a `closed` flag.

`OwnedPartitions` is that lifecycle, a collaborator each coordinator builds with its
own parts (how to make a partition's state, how to load it, how to append a fence
batch) and holds. It implements:

- `on_elected` / `on_resigned`: the callbacks of `CoordinatorOwnership`. Election
  creates the partition (`new_partition`) and starts its main task: the fence of the
  previous owner, then `load`; resignation closes it and cancels its tasks.
- fencing of the previous owner (`fence_previous_owner`): before loading, the fence
  batches of the claim are appended, retried with backoff (tenacity), so that a
  deposed owner can no longer append;
- deposition (`is_fenced`, `deposed`): an append refused because a newer owner
  wrote with a higher writer epoch makes this coordinator stop serving the
  partition at once and call `on_fenced(partition, coordinator_epoch)`
  (`CoordinatorOwnership.fenced`), which resigns the claim;
- the ownership barrier (`confirm_ownership`): before an answer taken from the
  cache alone confirms an outcome to a client, one more fence record at the
  current writer epoch proves that no newer owner has fenced this one (a deposed
  owner that has not noticed yet would otherwise answer from a stale cache);
- the partitions' background tasks (`spawn`) and the retries of their steps
  (`retrying`).
"""
from __future__ import annotations

import asyncio
import logging
import types
from typing import Awaitable, Callable, Coroutine, Generic, TypeVar

from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential_jitter

from exactly_wire.clock import Clock
from exactly_wire.error_codes import ErrorCode

from .ownership import FENCED_APPEND_ERRORS, fence_batch, fence_batches

# Fence-append answers meaning the log has no leader that takes the record.
LEADERLESS_APPEND_ERRORS = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE})

log = logging.getLogger(__name__)


class NotOwner(Exception):
    """This coordinator no longer owns the partition: stop working on it."""


class RetryLater(Exception):
    """A step that must be retried after backoff (`PartitionOwner._retrying`)."""


def code_name(code: int) -> str:
    """The ErrorCode name of `code`, or the number when it is not a known code."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


def _log_retry(state, before: int = 0) -> None:
    """Log a retried step at its 1st, 10th, 100th... retry (not every one);
    `before`: attempts made before this tenacity loop started."""
    n = state.attempt_number + before
    if n == 1 or (n % 10 == 0 and str(n).rstrip("0") == "1"):
        exc = state.outcome.exception() if state.outcome is not None else None
        log.info("retrying (attempt %d): %s", n, exc)


_FIRST_RETRY = types.SimpleNamespace(attempt_number=1)  # what a tenacity wait strategy reads


def first_wait_s(wait: Callable) -> float:
    """The wait (s) tenacity's strategy `wait` gives before the first retry."""
    return wait(_FIRST_RETRY)


class _FirstAttempt:
    """The first attempt of a `FirstTryThenRetrying`: `with attempt:` keeps a
    `retry_on` exception (the step is retried), lets any other through."""

    __slots__ = ("retry_on", "failed")

    def __init__(self, retry_on: type[BaseException]):
        self.retry_on = retry_on
        self.failed: BaseException | None = None

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None and issubclass(exc_type, self.retry_on):
            self.failed = exc
            return True
        return False


class FirstTryThenRetrying:
    """`async for attempt in ...: with attempt: step` as over tenacity's AsyncRetrying,
    whose construction and bookkeeping cost more than a step that succeeds at once
    (the common case, a few times per transaction): the first attempt is a plain one,
    and only when it raises `retry_on` is the tenacity loop built (`make()`), after
    `first_wait_s()` seconds (its backoff for the first retry) on `sleep`, and
    `on_retry(exception)` called."""

    __slots__ = ("_make", "_retry_on", "_first_wait_s", "_sleep", "_on_retry", "_first", "_rest")

    def __init__(self, make: Callable[[], AsyncRetrying], retry_on: type[BaseException],
                 first_wait_s: Callable[[], float], sleep: Callable[[float], Awaitable[None]],
                 on_retry: Callable[[BaseException], None] | None = None):
        self._make, self._retry_on, self._first_wait_s = make, retry_on, first_wait_s
        self._sleep, self._on_retry = sleep, on_retry
        self._first: _FirstAttempt | None = None
        self._rest = None

    def __aiter__(self) -> "FirstTryThenRetrying":
        return self

    async def __anext__(self):
        if self._first is None:
            self._first = _FirstAttempt(self._retry_on)
            return self._first
        if self._rest is None:
            if self._first.failed is None:
                raise StopAsyncIteration
            if self._on_retry is not None:
                self._on_retry(self._first.failed)
            await self._sleep(self._first_wait_s())
            self._rest = self._make().__aiter__()
        return await self._rest.__anext__()


class OwnedPartition:
    """One partition of an internal topic this process owns.

    partition: the partition number; coordinator_epoch: the epoch of the claim.
    producer_id/producer_epoch: the writer identity of the claim (see
    services.common.cluster.ownership), producer_id -1 when batches are written without a
    PID; retired_producer_id: a writer PID the fence also closes, -1 for none.
    tasks: the background tasks working on the partition (cancelled when it is
    dropped). loading: True until the load finished. loaded: event set when the load
    finished, or when the partition was closed first. closed: set once the partition
    was dropped (resigned, deposed or replaced). leaderless: True while the last fence
    append of a (re)load was refused because the log had no leader to take it
    (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE): requests are then answered
    NOT_COORDINATOR rather than COORDINATOR_LOAD_IN_PROGRESS, as Kafka's coordinator
    answers when its broker does not lead the partition, so that clients find the
    owner again instead of waiting on this one (e.g. a coordinator cut off from
    ZooKeeper whose own replica's leadership lapsed).
    """

    def __init__(self, partition: int, coordinator_epoch: int, producer_id: int = -1,
                 producer_epoch: int = -1, retired_producer_id: int = -1):
        self.partition = partition
        self.coordinator_epoch = coordinator_epoch
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.retired_producer_id = retired_producer_id
        self.tasks: set[asyncio.Task] = set()
        self.loading = True
        self.loaded = asyncio.Event()
        self.closed = False
        self.leaderless = False

    @property
    def serving(self) -> bool:
        """Whether the partition answers requests (loaded)."""
        return not self.loading

    def finish_loading(self) -> None:
        """The load finished: the partition serves from now on."""
        self.loading = False
        self.loaded.set()

    def close(self) -> None:
        """Stop the partition (idempotent); wakes the waiters of `loaded`."""
        self.closed = True
        self.loaded.set()


P = TypeVar("P", bound=OwnedPartition)


class OwnedPartitions(Generic[P]):
    """The partitions of `topic` this process owns, and their lifecycle: a
    collaborator each coordinator builds and holds (Kafka's CoordinatorRuntime holds
    its shards the same way), not a base class.

    topic: the internal topic (log messages). new_partition(partition,
    coordinator_epoch, producer_id, producer_epoch, retired_producer_id) -> P: the
    state object of a newly claimed partition. load(part): async, the main task of a
    newly owned partition once the previous owner is fenced (replay, then serve;
    `part.closed` tells it that the ownership ended). append_fence(part, batch): async,
    appends one fence batch, returns an ErrorCode value. dropped(part): called once
    `part` was closed and its tasks cancelled (forget its state; optional).
    wall_clock: wall-clock ms (exactly_wire.clock.Clock) of the fence records' timestamps.
    sleep: async (seconds) -> None, the backoff of retries (injected in tests).
    on_fenced(partition, coordinator_epoch): called on the loop when a newer owner of
    the partition exists (CoordinatorOwnership.fenced). retry_backoff_ms /
    retry_backoff_max_ms: first and largest backoff of retried steps (exponential
    with jitter).
    """

    def __init__(self, topic: str, new_partition: Callable[[int, int, int, int, int], P],
                 load: Callable[[P], Awaitable[None]], append_fence: Callable[[P, bytes], Awaitable[int]], *,
                 wall_clock: Clock, dropped: Callable[[P], None] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 on_fenced: Callable[[int, int], None] | None = None,
                 retry_backoff_ms: int = 20, retry_backoff_max_ms: int = 1_000):
        self.topic = topic
        self.on_fenced = on_fenced
        self._new_partition = new_partition
        self._load = load
        self._append_fence = append_fence
        self._dropped = dropped or (lambda part: None)
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._retry_backoff_ms = retry_backoff_ms
        self._retry_backoff_max_ms = retry_backoff_max_ms
        self._parts: dict[int, P] = {}
        self._tasks: set[asyncio.Task] = set()  # work not tied to one partition

    # ------------------------------------------------------------ lookups
    def get(self, partition: int) -> P | None:
        """The owned partition `partition` (loading, serving or disabled), None when not owned."""
        return self._parts.get(partition)

    def values(self) -> list[P]:
        """Every owned partition, as a list (safe to iterate across awaits)."""
        return list(self._parts.values())

    def owned_partitions(self) -> dict[int, bool]:
        """partition -> True when it serves (False while loading or disabled)."""
        return {p: part.serving for p, part in self._parts.items()}

    def tasks(self) -> list[asyncio.Task]:
        """The background tasks not tied to one partition (`spawn(None, ...)`)."""
        return list(self._tasks)

    # ------------------------------------------------------------ ownership
    async def on_elected(self, partition: int, coordinator_epoch: int, producer_id: int = -1,
                         producer_epoch: int = -1, retired_producer_id: int = -1) -> None:
        """This process now owns `partition` with `coordinator_epoch`: start loading
        it (returns at once; requests get COORDINATOR_LOAD_IN_PROGRESS meanwhile).
        producer_id/producer_epoch: the writer identity of the claim (see
        services.common.cluster.ownership); with producer_id >= 0 the load first appends the
        fence records (closing `retired_producer_id` too, if >= 0), so that a deposed
        owner can no longer append, and every batch of this owner carries it; -1
        writes batches without a PID."""
        old = self._parts.pop(partition, None)
        if old is not None:
            await self._resign(old)
        part = self._new_partition(partition, coordinator_epoch, producer_id, producer_epoch,
                                   retired_producer_id)
        self._parts[partition] = part
        self.spawn(part, self._fence_and_load(part), f"{self.topic}-{partition}-load")

    def restart(self, part: P) -> None:
        """Load `part` again under the same claim (coordinator epoch and writer
        identity), e.g. to learn the outcome of an ambiguous append from the log: its
        state and tasks are dropped and a fresh load starts (fence first, then replay),
        requests get COORDINATOR_LOAD_IN_PROGRESS meanwhile. Synchronous, so one of
        `part`'s own tasks may call it: that task is cancelled at its next await."""
        if not self.owns(part):
            return
        del self._parts[part.partition]
        self._drop(part)
        new = self._new_partition(part.partition, part.coordinator_epoch, part.producer_id, part.producer_epoch,
                                  part.retired_producer_id)
        self._parts[part.partition] = new
        self.spawn(new, self._fence_and_load(new), f"{self.topic}-{part.partition}-reload")

    async def _fence_and_load(self, part: P) -> None:
        """The main task of an owned partition: fence the previous owner, then `load`."""
        try:
            await self.fence_previous_owner(part)
        except NotOwner:
            return
        await self._load(part)

    async def on_resigned(self, partition: int) -> bool:
        """Another coordinator owns `partition` now: stop its work and forget its
        state (requests get NOT_COORDINATOR). Returns once its tasks ended: whether
        it was owned."""
        part = self._parts.pop(partition, None)
        if part is not None:
            await self._resign(part)
        return part is not None

    async def wait_loaded(self, partition: int | None = None, *, timeout_s: float | None = None) -> bool:
        """Wait until `partition` (every owned partition when None) finished loading,
        at most `timeout_s` seconds (None: no limit); an unowned partition does not
        wait. Returns False on timeout (tests and readiness)."""
        if partition is None:
            parts = list(self._parts.values())
        else:
            parts = [self._parts[partition]] if partition in self._parts else []
        try:
            await asyncio.wait_for(asyncio.gather(*(p.loaded.wait() for p in parts)), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        """Drop every owned partition and cancel all background work."""
        parts = list(self._parts.values())
        self._parts.clear()
        for part in parts:
            await self._resign(part)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _resign(self, part: P) -> None:
        """Drop `part` (already removed from the owned partitions) and wait until its
        tasks ended."""
        tasks = self._drop(part)
        current = asyncio.current_task()
        await asyncio.gather(*(t for t in tasks if t is not current), return_exceptions=True)

    def _drop(self, part: P) -> list[asyncio.Task]:
        """Close `part`, cancel its tasks and forget its state; returns the tasks."""
        part.close()
        tasks = list(part.tasks)
        for task in tasks:
            task.cancel()
        part.tasks.clear()
        self._dropped(part)
        return tasks

    def owns(self, part: P) -> bool:
        """Whether `part` is still the current, open ownership of its partition."""
        return not part.closed and self._parts.get(part.partition) is part

    def is_fenced(self, part: P, code: int) -> bool:
        """Whether `code`, the answer to an append written with our writer PID, means
        that a newer owner wrote with a higher writer epoch; then the partition is
        deposed (`deposed`)."""
        if part.producer_id < 0 or code not in FENCED_APPEND_ERRORS:
            return False
        self.deposed(part, f"writes fenced ({code_name(code)})")
        return True

    def deposed(self, part: P, reason: str) -> None:
        """A newer owner of `part` exists: stop serving it at once and tell the
        ownership (`on_fenced`)."""
        log.warning("%s-%d: coordinator epoch %d deposed, %s", self.topic, part.partition,
                    part.coordinator_epoch, reason)
        if self._parts.get(part.partition) is part:
            del self._parts[part.partition]
            self._drop(part)
        if self.on_fenced is not None:
            self.on_fenced(part.partition, part.coordinator_epoch)

    async def fence_previous_owner(self, part: P) -> None:
        """Append the fence records of this claim, each retried until it is in the
        log. Raises NotOwner when the ownership ended or a newer owner already fenced
        us (the partition is then deposed)."""
        if part.producer_id < 0:
            return
        for batch in fence_batches(part.producer_id, part.producer_epoch, part.retired_producer_id,
                                   self._wall_clock()):
            async for attempt in self.retrying():
                with attempt:
                    if not self.owns(part):
                        raise NotOwner()
                    code = await self._append_own_fence(part, batch)
                    if code is None:
                        raise NotOwner()
                    part.leaderless = code in LEADERLESS_APPEND_ERRORS
                    if code != ErrorCode.NONE:
                        raise RetryLater(f"fencing {self.topic}-{part.partition}: {code_name(code)}")

    async def _append_own_fence(self, part: P, batch: bytes) -> int | None:
        """Append one fence batch of this claim. None when the ownership ended
        meanwhile or a newer owner had fenced us (`part` is then deposed), else the
        append's error code."""
        code = await self._append_fence(part, batch)
        if not self.owns(part) or self.is_fenced(part, code):
            return None
        return code

    async def confirm_ownership(self, part: P) -> ErrorCode:
        """The ownership barrier: append a fence record at this claim's writer epoch.
        The new owner fences before it replays and serves, so an accepted barrier means
        no newer owner has served a request yet and the cache holds the latest state;
        a refused one deposes `part`. Returns NONE (still the owner), NOT_COORDINATOR
        (deposed or no longer owned) or COORDINATOR_NOT_AVAILABLE (the log could not
        take the record: retriable). Without a writer identity (producer_id < 0)
        there is nothing to fence and the answer is NONE."""
        if not self.owns(part):
            return ErrorCode.NOT_COORDINATOR
        if part.producer_id < 0:
            return ErrorCode.NONE
        code = await self._append_own_fence(part, fence_batch(part.producer_id, part.producer_epoch,
                                                              self._wall_clock()))
        if code is None:
            return ErrorCode.NOT_COORDINATOR
        if code != ErrorCode.NONE:
            log.warning("%s-%d: ownership barrier not written: %s", self.topic, part.partition, code_name(code))
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return ErrorCode.NONE

    # ------------------------------------------------------------ work
    def retrying(self) -> FirstTryThenRetrying:
        """Retries of a step that raises RetryLater (`retrying`), with this owner's
        sleep and backoff."""
        return retrying(self._sleep, self._retry_backoff_ms, self._retry_backoff_max_ms)

    def spawn(self, part: P | None, coro: Coroutine, name: str) -> asyncio.Task:
        """Run `coro` as a task of `part` (cancelled when it is dropped) or, with
        part None, of the coordinator (cancelled by `stop`). A failure is logged."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        tasks = part.tasks if part is not None else self._tasks
        tasks.add(task)

        def done(t: asyncio.Task) -> None:
            tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("%s failed", name, exc_info=t.exception())
        task.add_done_callback(done)
        return task


def retrying(sleep: Callable[[float], Awaitable[None]], backoff_ms: int, backoff_max_ms: int) -> FirstTryThenRetrying:
    """Retries of a step that raises RetryLater: exponential backoff with jitter from
    `backoff_ms` up to `backoff_max_ms` on `sleep`, forever; other exceptions
    propagate. The first attempt runs without tenacity (FirstTryThenRetrying)."""
    backoff = backoff_ms / 1000
    wait = wait_exponential_jitter(multiplier=backoff, max=backoff_max_ms / 1000, jitter=backoff)

    def later() -> AsyncRetrying:
        return AsyncRetrying(sleep=sleep, retry=retry_if_exception_type(RetryLater), reraise=True,
                             wait=wait, before_sleep=lambda state: _log_retry(state, 1))

    return FirstTryThenRetrying(later, RetryLater, lambda: first_wait_s(wait), sleep,
                                lambda exc: log.info("retrying (attempt 1): %s", exc))


__all__ = ["NotOwner", "RetryLater", "OwnedPartition", "OwnedPartitions", "FirstTryThenRetrying", "code_name",
           "first_wait_s", "retrying"]
