"""Hand-off of a `__consumer_offsets` partition between two group coordinators over
one in-memory log that fences writers like a partition leader does: the new owner
appends its fence record before replaying, the deposed owner's plain writes are
refused (it stops serving and reports it), transactional offsets keep the
producer's PID (services.common.cluster.ownership; design doc "Consumer Coordinator
Startup")."""
from __future__ import annotations

import asyncio
import itertools
import zlib

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from services.group_coordinator import log_format
from services.group_coordinator.coordinator import GroupCoordinator
from services.group_coordinator.offsets import FetchedOffset, OffsetAndMetadata

from exactly.testing import MockTime
from .gc_fakes import FakeLog, group_settings

N = 2
WRITER = 300
TP0 = TopicPartition("orders", 0)
TP1 = TopicPartition("orders", 1)


def partition_for(group_id: str) -> int:
    return zlib.crc32(group_id.encode()) % N


class FencingLog(FakeLog):
    """Also rejects a plain batch whose PID was written with a higher epoch."""

    async def produce(self, topic, partition, batch, acks=-1, timeout_ms=30000, transactional_id="",
                      consumer_group_id="", verified_from=None):
        h = records.parse_header(batch)
        if h.producer_id >= 0 and not h.is_transactional:
            if h.producer_epoch < self.epochs.get(h.producer_id, -1):
                return int(ErrorCode.INVALID_PRODUCER_EPOCH), -1
            self.epochs[h.producer_id] = h.producer_epoch
        return await super().produce(topic, partition, batch, acks, timeout_ms)


def coordinator(log: FakeLog) -> tuple[GroupCoordinator, list]:
    ids = itertools.count(1)
    fenced: list = []
    coord = GroupCoordinator(log, partition_for, lambda: {"orders": 2},
                             group_settings({"group.coordinator.tail.max.wait.ms": 5000}), clock=MockTime(), wall_clock=lambda: 1_700_000_000_000,
                             new_member_id=lambda _i: f"member-{next(ids)}",
                             on_fenced=lambda p, e: fenced.append((p, e)))
    return coord, fenced


def test_deposed_group_coordinator_is_fenced_and_the_new_one_has_everything():
    async def body():
        log = FencingLog()
        group = "g"
        p = partition_for(group)
        old, old_fenced = coordinator(log)
        await old.on_elected(p, 0, producer_id=WRITER, producer_epoch=0)
        assert await old.wait_loaded(timeout_s=5)
        first = records.parse_header(log.batches[p][0])
        assert (first.producer_id, first.producer_epoch, first.is_transactional) == (WRITER, 0, False)
        assert await old.commit_offsets(group, -1, "", {TP0: OffsetAndMetadata(7)}) == {TP0: ErrorCode.NONE}
        assert await old.txn_commit_offsets("tx", group, 42, 3, -1, "", {TP1: OffsetAndMetadata(80)}) == \
            {TP1: ErrorCode.NONE}
        plain, txn = (records.parse_header(b) for b in log.batches[p][1:3])
        assert (plain.producer_id, plain.producer_epoch, plain.is_transactional) == (WRITER, 0, False)
        assert (txn.producer_id, txn.producer_epoch, txn.is_transactional) == (42, 3, True)

        new, new_fenced = coordinator(log)
        await new.on_elected(p, 1, producer_id=WRITER, producer_epoch=1)
        assert await new.wait_loaded(timeout_s=5)
        assert await new.fetch_offsets(group, [TP0, TP1], require_stable=True) == (
            ErrorCode.UNSTABLE_OFFSET_COMMIT,
            {TP0: FetchedOffset(7, "", ErrorCode.NONE), TP1: FetchedOffset(-1, "", ErrorCode.UNSTABLE_OFFSET_COMMIT)})

        before = len(log.batches[p])
        assert await old.commit_offsets(group, -1, "", {TP0: OffsetAndMetadata(9)}) == \
            {TP0: ErrorCode.NOT_COORDINATOR}
        assert old_fenced == [(p, 0)]
        assert len(log.batches[p]) == before
        assert old.owned_partitions() == {}  # deposed at once, before the ownership resigns
        assert (await old.fetch_offsets(group, [TP0], False))[0] == ErrorCode.NOT_COORDINATOR

        marker_offset = log.write_marker(p, 42, committed=True, producer_epoch=3, coordinator_epoch=1)
        assert await asyncio.wait_for(new.partitions.get(p).wait_applied(marker_offset), 5)  # the tailer applied it
        assert await new.fetch_offsets(group, [TP0, TP1], require_stable=True) == (
            ErrorCode.NONE, {TP0: FetchedOffset(7, "", ErrorCode.NONE), TP1: FetchedOffset(80, "", ErrorCode.NONE)})
        assert new_fenced == []
        await old.stop()
        await new.stop()

    asyncio.run(asyncio.wait_for(body(), 10))


def test_fence_record_is_skipped_by_the_offsets_log_reader():
    assert log_format.decode_key(b"") is None
    assert log_format.decode_key(None) is None
