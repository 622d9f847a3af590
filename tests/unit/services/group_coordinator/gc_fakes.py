"""In-memory stand-ins for unit tests of the group coordinator: a partition
leader log reached like services.common.transport.rpc.ClusterClient (the manual clock is
exactly.testing.MockTime)."""
from __future__ import annotations

import asyncio
from collections import defaultdict

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from services.common.settings import GroupCoordinatorSchema, role_settings


def group_settings(conf: dict[str, object]) -> GroupCoordinatorSchema:
    """The group coordinator's settings with the Kafka keys of `conf` set (the
    schema's defaults elsewhere). Raises ConfigurationError for an unknown key."""
    return role_settings(GroupCoordinatorSchema, conf)


class FakeLog:
    """Partitions of one topic as lists of record batches; produce assigns
    offsets, fetch long-polls, markers are appended as control batches. Like the
    partition leader, a transactional batch with an epoch lower than the PID's
    last one is rejected with INVALID_PRODUCER_EPOCH."""

    def __init__(self) -> None:
        self.batches: dict[int, list[bytes]] = defaultdict(list)
        self.end: dict[int, int] = defaultdict(int)
        self.epochs: dict[int, int] = {}
        self.produce_error: ErrorCode | None = None
        self.produced = 0
        self.fetches = 0
        self._changed: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _append(self, partition: int, batch: bytes) -> int:
        h = records.parse_header(batch)
        base = self.end[partition]
        buf = bytearray(batch)
        records.set_base_offset(buf, base)
        self.batches[partition].append(bytes(buf))
        self.end[partition] = base + h.last_offset_delta + 1
        ev = self._event()
        ev.set()
        self._changed = asyncio.Event()
        return base

    async def produce(self, topic, partition, batch, acks=-1, timeout_ms=30000, transactional_id="",
                      consumer_group_id="", verified_from=None):
        if self.produce_error is not None:
            return int(self.produce_error), -1
        h = records.parse_header(batch)
        if h.is_transactional:
            last = self.epochs.get(h.producer_id, -1)
            if h.producer_epoch < last:
                return int(ErrorCode.INVALID_PRODUCER_EPOCH), -1
            self.epochs[h.producer_id] = h.producer_epoch
        self.produced += 1
        return 0, self._append(partition, batch)

    def write_marker(self, partition: int, producer_id: int, committed: bool,
                     producer_epoch: int = 0, coordinator_epoch: int = 0) -> int:
        """What WriteTxnMarkers does on the leader: append a control batch."""
        self.epochs[producer_id] = max(self.epochs.get(producer_id, -1), producer_epoch)
        return self._append(partition, records.encode_control_batch(
            committed, producer_id, producer_epoch, coordinator_epoch, 0))

    def corrupt_append(self, partition: int, batch: bytes) -> None:
        self._append(partition, batch)

    async def fetch(self, topic, partition, offset, max_wait_ms=0, isolation_level=0, max_bytes=1 << 20):
        self.fetches += 1
        if offset >= self.end[partition] and max_wait_ms > 0:
            try:
                await asyncio.wait_for(self._event().wait(), max_wait_ms / 1000)
            except asyncio.TimeoutError:
                pass
        out = bytearray()
        for b in self.batches[partition]:
            h = records.parse_header(b)
            if h.last_offset < offset:
                continue
            if out and len(out) + len(b) > max_bytes:
                break
            out += b
        return pb.FetchPartitionResponse(partition=partition, error_code=0,
                                         high_watermark=self.end[partition], last_stable_offset=self.end[partition],
                                         log_start_offset=0, records=bytes(out))


class Deadlines:
    """Stands in for asyncio.wait_for: records each timeout (seconds) in `seen`;
    with `expire`, times out at once instead of waiting (no real time passes)."""

    def __init__(self, expire: bool = False) -> None:
        self.expire = expire
        self.seen: list[float] = []

    async def __call__(self, aw, timeout: float):
        self.seen.append(timeout)
        if self.expire:
            if asyncio.isfuture(aw):
                aw.cancel()
            else:
                aw.close()
            raise asyncio.TimeoutError
        return await aw
