"""OffsetsLog (services/group_coordinator/offsets_log.py) driven directly over an
in-memory __consumer_offsets partition: appends answered once the tailer applied
them, offset writes in flight, the deadline of the wait, closing, fencing of our
writer, replay to the high watermark, and the kick that cuts the tailer's long
poll short. Deadlines and backoff go through injected fakes: no real sleeps."""
from __future__ import annotations

import asyncio

from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from exactly_wire.v1 import exactly_pb2 as pb
from services.group_coordinator import log_format
from services.group_coordinator.offsets import OffsetAndMetadata
from services.group_coordinator.offsets_log import OffsetsLog
from services.group_coordinator.state import OffsetsPartitionState

from exactly.testing import MockTime
from .gc_fakes import Deadlines, FakeLog, group_settings

P = 0
TP0 = TopicPartition("orders", 0)
TP1 = TopicPartition("orders", 1)
WALL = 1_700_000_000_000


def run(coro, timeout=10):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def offsets_log(client, **kw) -> OffsetsLog:
    kw.setdefault("clock", MockTime())
    kw.setdefault("wall_clock", lambda: WALL)
    conf = {"group.coordinator.tail.max.wait.ms": 5000, **kw.pop("conf", {})}
    return OffsetsLog(client, OffsetsPartitionState(P), config=group_settings(conf), **kw)


async def tailing(olog: OffsetsLog) -> asyncio.Task:
    await olog.replay()
    return asyncio.ensure_future(olog.tail())


async def stop(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


class GatedLog(FakeLog):
    """Holds every produce until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.producing = asyncio.Event()

    async def produce(self, *args, **kwargs):
        self.producing.set()
        await self.release.wait()
        return await super().produce(*args, **kwargs)


def test_a_write_is_answered_once_the_tailer_applied_it():
    async def body():
        log = FakeLog()
        olog = offsets_log(log)
        tailer = await tailing(olog)
        assert await olog.write_offsets("g", {TP0: OffsetAndMetadata(5, "m")}) == {TP0: ErrorCode.NONE}
        # answered only after the record is in the materialised state
        assert olog.state.next_offset == log.end[P]
        assert olog.state.offsets.fetch("g", [TP0], False)[TP0].offset == 5
        await stop(tailer)

    run(body())


def test_partitions_are_in_flight_while_their_write_is_appended():
    async def body():
        log = GatedLog()
        olog = offsets_log(log)
        tailer = await tailing(olog)
        write = asyncio.ensure_future(olog.write_offsets("g", {TP0: OffsetAndMetadata(1)}))
        await log.producing.wait()
        assert olog.in_flight("g", TP0)
        assert not olog.in_flight("g", TP1) and not olog.in_flight("other", TP0)
        log.release.set()
        assert await write == {TP0: ErrorCode.NONE}
        assert not olog.in_flight("g", TP0)
        assert not olog.inflight  # no zero counts left behind
        await stop(tailer)

    run(body())


def test_the_wait_for_the_tailer_has_the_commit_timeout_as_deadline():
    async def body():
        deadlines = Deadlines(expire=True)
        log = FakeLog()
        olog = offsets_log(log, conf={"offsets.commit.timeout.ms": 1234}, wait_for=deadlines)  # no tailer runs
        assert await olog.write_offsets("g", {TP0: OffsetAndMetadata(1)}) == {TP0: ErrorCode.REQUEST_TIMED_OUT}
        assert deadlines.seen == [1.234]
        assert log.produced == 1 and not olog.inflight
        olog.close()
        assert await olog.until_applied(0, 1000) == ErrorCode.NOT_COORDINATOR  # closed: not a time-out

    run(body())


def test_closing_answers_the_waiting_writes_not_coordinator():
    async def body():
        log = FakeLog()
        olog = offsets_log(log)  # no tailer: the write waits for it
        write = asyncio.ensure_future(olog.write_offsets("g", {TP0: OffsetAndMetadata(1)}))
        while not olog._applied_waiters:
            await asyncio.sleep(0)
        olog.close()
        assert await write == {TP0: ErrorCode.NOT_COORDINATOR}
        assert (await olog.wait_applied(0)) is False

    run(body())


def test_no_append_once_the_partition_is_not_ours():
    async def body():
        log = FakeLog()
        olog = offsets_log(log, owns=lambda: False)
        assert await olog.write_offsets("g", {TP0: OffsetAndMetadata(1)}) == {TP0: ErrorCode.NOT_COORDINATOR}
        assert log.produced == 0 and not log.batches[P]

    run(body())


def test_a_refused_batch_of_our_writer_reports_the_fence():
    async def body():
        seen = []

        def fenced(code):
            seen.append(code)
            return True

        log = FakeLog()
        log.produce_error = ErrorCode.INVALID_PRODUCER_EPOCH
        olog = offsets_log(log, producer_id=300, producer_epoch=1, fenced=fenced)
        # a plain batch carries our writer PID: a newer owner fenced us
        assert await olog.write_offsets("g", {TP0: OffsetAndMetadata(1)}) == {TP0: ErrorCode.NOT_COORDINATOR}
        assert seen == [ErrorCode.INVALID_PRODUCER_EPOCH]
        # a transactional batch carries the producer's PID: its epoch error is its own
        assert await olog.write_offsets("g", {TP0: OffsetAndMetadata(1)}, producer_id=42, producer_epoch=3) == \
            {TP0: ErrorCode.INVALID_PRODUCER_EPOCH}
        assert seen == [ErrorCode.INVALID_PRODUCER_EPOCH]

    run(body())


def test_append_errors_as_the_committer_sees_them_and_oversized_metadata():
    async def body():
        log = FakeLog()
        olog = offsets_log(log, conf={"offset.metadata.max.bytes": 4})
        assert await olog.write_offsets("g", {TP0: OffsetAndMetadata(1, "12345")}) == \
            {TP0: ErrorCode.OFFSET_METADATA_TOO_LARGE}
        assert log.produced == 0
        log.produce_error = ErrorCode.NOT_ENOUGH_REPLICAS
        assert await olog.write_offsets("g", {TP0: OffsetAndMetadata(1, "1234"), TP1: OffsetAndMetadata(2, "x" * 9)}) \
            == {TP0: ErrorCode.COORDINATOR_NOT_AVAILABLE, TP1: ErrorCode.OFFSET_METADATA_TOO_LARGE}
        log.produce_error = ErrorCode.MESSAGE_TOO_LARGE
        assert await olog.append_tombstones("g", [TP0]) == ErrorCode.INVALID_COMMIT_OFFSET_SIZE

    run(body())


class FlakyLog(FakeLog):
    """The first `failures` fetches raise (a leader restarting)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def fetch(self, *args, **kwargs):
        if self.failures:
            self.failures -= 1
            raise ConnectionError("leader restarting")
        return await super().fetch(*args, **kwargs)


def test_replay_reaches_the_high_watermark_and_backs_off_on_failed_fetches():
    async def body():
        log = FlakyLog(failures=2)
        for i in range(3):
            log.corrupt_append(P, log_format.offsets_batch("g", {TP0: OffsetAndMetadata(i)}, WALL))
        slept = []

        async def sleep(seconds):
            slept.append(seconds)

        olog = offsets_log(log, sleep=sleep, conf={"offsets.load.buffer.size": 1})  # one batch per fetch
        await olog.replay()
        assert olog.state.next_offset == log.end[P] == 3
        assert olog.state.offsets.fetch("g", [TP0], False)[TP0].offset == 2
        assert slept == [0.1, 0.1]

    run(body())


def test_replay_continues_from_the_log_start_when_the_offset_was_deleted():
    class TruncatedLog(FakeLog):
        async def fetch(self, topic, partition, offset, *args, **kwargs):
            if offset < 10:
                return pb.FetchPartitionResponse(partition=partition, error_code=int(ErrorCode.OFFSET_OUT_OF_RANGE),
                                                 high_watermark=10, log_start_offset=10)
            return pb.FetchPartitionResponse(partition=partition, high_watermark=10, log_start_offset=10)

    async def body():
        olog = offsets_log(TruncatedLog())
        await olog.replay()
        assert olog.state.next_offset == 10

    run(body())


class DeafLog(FakeLog):
    """A long poll that does not notice appends: it returns only after max_wait_ms."""

    async def fetch(self, topic, partition, offset, max_wait_ms=0, isolation_level=0, max_bytes=1 << 20):
        if max_wait_ms > 0 and offset >= self.end[partition]:
            await asyncio.Event().wait()  # cancelled by the kick (or the test)
        return await super().fetch(topic, partition, offset, 0, isolation_level, max_bytes)


def test_our_own_append_kicks_the_tailer_out_of_its_long_poll():
    async def body():
        log = DeafLog()
        olog = offsets_log(log, conf={"group.coordinator.tail.max.wait.ms": 600_000})
        tailer = await tailing(olog)
        for i in range(3):
            assert await olog.write_offsets("g", {TP0: OffsetAndMetadata(i)}) == {TP0: ErrorCode.NONE}
        assert olog.state.offsets.fetch("g", [TP0], False)[TP0].offset == 2
        await stop(tailer)

    run(body())


def test_store_locks_are_per_group():
    async def body():
        olog = offsets_log(FakeLog())
        assert olog.store_lock("a") is olog.store_lock("a")
        assert olog.store_lock("a") is not olog.store_lock("b")

    run(body())
