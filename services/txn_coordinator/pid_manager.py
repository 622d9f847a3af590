"""Producer id allocation from blocks reserved in ZooKeeper (Kafka's ProducerIdManager).

Design doc "Transaction Coordinator Request Handling": PIDs are unique across the
cluster and never assigned twice. Each coordinator reserves a block of
`block_size` (1000) PIDs by compare-and-set on /exactly/producer_id_block
(`ClusterState.allocate_producer_id_block`) and hands them out in order. The rest
of a block is abandoned on restart, so a PID is never reused across restarts or
coordinators. The next block is fetched in the background when the current one
runs low.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

log = logging.getLogger(__name__)

BLOCK_SIZE = 1000


class ProducerIdAllocationError(Exception):
    """No PID block could be reserved (ZooKeeper unavailable) or the reserved block
    overlaps PIDs already handed out (a corrupt block znode)."""


class ProducerIdManager:
    """Hands out PIDs from reserved blocks.

    allocate_block: async () -> (first_pid, last_pid), inclusive, reserving a fresh
    block (raises on failure). prefetch_ratio: fraction of a block left when the
    next block is reserved in the background.
    """

    def __init__(self, allocate_block: Callable[[], Awaitable[tuple[int, int]]], prefetch_ratio: float = 0.1):
        self._allocate_block = allocate_block
        self._prefetch_ratio = prefetch_ratio
        self._next = 0
        self._last = -1  # current block [next, last]; empty when next > last
        self._block_size = 0
        self._prefetched: tuple[int, int] | None = None
        self._highest_issued = -1
        self._lock = asyncio.Lock()
        self._prefetch_task: asyncio.Task | None = None

    @property
    def remaining(self) -> int:
        """PIDs left in the current block (not counting a prefetched one)."""
        return max(0, self._last - self._next + 1)

    def _exhausted(self) -> bool:
        """Whether no PID is left, after moving on to the prefetched block if the
        current one is used up."""
        if self._next > self._last and self._prefetched is not None:
            self._install(self._prefetched)
            self._prefetched = None
        return self._next > self._last

    def next_pid(self) -> int | None:
        """The next PID of the current block, or None when it is used up (then await
        `ensure_available()`). Never blocks."""
        if self._exhausted():
            return None
        pid = self._next
        self._next += 1
        self._highest_issued = pid
        if self._block_size and self.remaining <= self._block_size * self._prefetch_ratio:
            self._start_prefetch()
        return pid

    def next_pid_in(self, residues: frozenset[int] | set[int], modulus: int) -> int | None:
        """The next PID p of the current block with p % modulus in `residues` (the
        PIDs skipped are never handed out), or None when the block holds no more
        (then await `ensure_available()`; each block holds about size / modulus of
        each residue). Used with producer-id bindings: a PID's binding lives in
        partition PID % n of `TRANSACTION_STATE_TOPIC`. Never blocks."""
        if not residues or modulus <= 0:
            return None
        while True:
            if self._exhausted():
                return None
            start = self._next
            pid = min(start + (r - start) % modulus for r in residues)
            if pid > self._last:
                self._next = self._last + 1
                continue
            self._next = pid
            return self.next_pid()

    async def ensure_available(self) -> None:
        """Reserve a block if none is left (a PID left: returns at once, without
        taking the lock). Raises ProducerIdAllocationError."""
        if self._next <= self._last or self._prefetched is not None:
            return
        async with self._lock:
            if self._next <= self._last or self._prefetched is not None:
                return
            self._install(await self._reserve())

    async def generate(self) -> int:
        """A fresh PID, reserving a block when needed. Raises ProducerIdAllocationError."""
        while True:
            pid = self.next_pid()
            if pid is not None:
                return pid
            await self.ensure_available()

    async def close(self) -> None:
        if self._prefetch_task is not None:
            self._prefetch_task.cancel()

    async def _reserve(self) -> tuple[int, int]:
        try:
            first, last = await self._allocate_block()
        except ProducerIdAllocationError:
            raise
        except Exception as exc:  # noqa: BLE001 - ZooKeeper client errors of any kind
            raise ProducerIdAllocationError(f"cannot reserve a producer id block: {exc!r}") from exc
        if last < first or first <= self._highest_issued or (self._prefetched and first <= self._prefetched[1]):
            raise ProducerIdAllocationError(f"reserved producer id block [{first}, {last}] overlaps PIDs "
                                            f"already issued (up to {self._highest_issued})")
        log.info("reserved producer id block [%d, %d]", first, last)
        return first, last

    def _install(self, block: tuple[int, int]) -> None:
        self._next, self._last = block
        self._block_size = block[1] - block[0] + 1

    def _start_prefetch(self) -> None:
        if self._prefetched is not None or (self._prefetch_task and not self._prefetch_task.done()):
            return
        try:
            self._prefetch_task = asyncio.get_running_loop().create_task(self._prefetch())
        except RuntimeError:
            pass  # no running loop: the next ensure_available() reserves synchronously

    async def _prefetch(self) -> None:
        async with self._lock:
            if self._prefetched is not None:
                return
            try:
                self._prefetched = await self._reserve()
            except ProducerIdAllocationError as exc:
                log.warning("prefetching the next producer id block failed: %s", exc)
