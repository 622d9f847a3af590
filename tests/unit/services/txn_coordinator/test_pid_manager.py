"""PID blocks (design doc "Transaction Coordinator Request Handling": a PID is never
assigned twice; Kafka's ProducerIdManager)."""
from __future__ import annotations

import asyncio

import pytest

from services.txn_coordinator.pid_manager import ProducerIdAllocationError, ProducerIdManager


class Blocks:
    def __init__(self, size=10, start=0):
        self.size, self.next, self.calls = size, start, 0

    async def __call__(self):
        self.calls += 1
        first = self.next
        self.next += self.size
        return first, first + self.size - 1


def test_pids_are_sequential_and_cross_blocks():
    async def scenario():
        blocks = Blocks(size=10)
        m = ProducerIdManager(blocks)
        pids = [await m.generate() for _ in range(25)]
        assert pids == list(range(25))
        assert blocks.calls == 3

    asyncio.run(scenario())


def test_next_pid_without_block_is_none():
    m = ProducerIdManager(Blocks())
    assert m.next_pid() is None


def test_block_is_prefetched_when_low():
    async def scenario():
        blocks = Blocks(size=10)
        m = ProducerIdManager(blocks, prefetch_ratio=0.2)
        for _ in range(8):
            await m.generate()
        await asyncio.sleep(0)
        assert blocks.calls == 2  # the next block is reserved before the current one runs out
        assert [m.next_pid() for _ in range(3)] == [8, 9, 10]

    asyncio.run(scenario())


def test_restarted_manager_never_reuses_pids():
    async def scenario():
        blocks = Blocks(size=1000)
        first = ProducerIdManager(blocks)
        a = [await first.generate() for _ in range(3)]
        second = ProducerIdManager(blocks)  # a restart: the rest of the block is abandoned
        b = [await second.generate() for _ in range(3)]
        assert not set(a) & set(b) and b[0] == 1000

    asyncio.run(scenario())


def test_allocation_failure_is_typed():
    async def broken():
        raise ConnectionError("zookeeper down")

    async def scenario():
        with pytest.raises(ProducerIdAllocationError):
            await ProducerIdManager(broken).generate()

    asyncio.run(scenario())


def test_overlapping_block_is_rejected():
    async def scenario():
        calls = iter([(0, 9), (5, 14)])

        async def alloc():
            return next(calls)

        m = ProducerIdManager(alloc, prefetch_ratio=0)
        for _ in range(10):
            await m.generate()
        with pytest.raises(ProducerIdAllocationError):
            await m.generate()

    asyncio.run(scenario())


def test_a_slow_prefetch_holds_up_no_request_while_pids_are_left():
    """The next block's reservation (a ZooKeeper write) runs in the background: while
    it is under way, InitProducerId's ensure_available() returns at once as long as
    the current block has PIDs left."""
    async def scenario():
        release = asyncio.Event()
        calls = 0

        async def allocate():
            nonlocal calls
            calls += 1
            if calls > 1:
                await release.wait()  # the prefetch's ZooKeeper write hangs
            return (calls - 1) * 10, (calls - 1) * 10 + 9

        m = ProducerIdManager(allocate, prefetch_ratio=0.5)
        await m.ensure_available()
        assert [m.next_pid() for _ in range(5)] == [0, 1, 2, 3, 4]  # 5 left: the prefetch starts
        await asyncio.sleep(0)
        assert calls == 2
        await asyncio.wait_for(m.ensure_available(), 5)
        assert m.next_pid() == 5
        release.set()
        await m.close()

    asyncio.run(scenario())
