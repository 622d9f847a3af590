"""Helpers for the partition leader's unit tests: batch builders, the clocks
(exactly.testing.MockTime), a validated batch for Partition.append and a Produce
through a ReplicaManager."""
from __future__ import annotations


import pytest

from exactly.testing import MockTime
from exactly_wire import records
from services.partition_leader.log import LogConfig
from services.partition_leader.partition import AppendResult, Partition, PartitionConfig, ValidatedBatch
from services.partition_leader.produce import NOT_VERIFIED, ProduceContext, produce_deadline
from services.partition_leader.snapshot_store import SnapshotStore

NOW_MS = 1_700_000_000_000


def make_batch(n: int = 3, *, pid: int = -1, epoch: int = 0, seq: int = -1, txn: bool = False,
               ts: int = NOW_MS, value_size: int = 40, key: bytes = b"k") -> bytes:
    """A record batch v2 of `n` records as a client would send it (base offset 0)."""
    return records.encode_batch([(key, bytes([65 + i % 26]) * value_size, (), ts + i) for i in range(n)],
                                producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                                transactional=txn)


def valid(buf: bytes) -> ValidatedBatch:
    """`buf` as the validated batch Partition.append takes (the write path's first
    gate passed it); fails the test when the batch would be refused."""
    batch = ValidatedBatch.check(buf)
    assert not isinstance(batch, AppendResult), batch
    return batch


def append_records(manager, acks: int, entries, timeout_ms: int = 0, *, origin: str = "client",
                   transactional_id: str = "", consumer_group_id: str = "", principal: str | None = None,
                   add_partitions: bool = False, verified_from: int = NOT_VERIFIED):
    """`manager.append_records` of `entries` with the context a servicer builds for a
    Produce (origin "client") or a CoordinatorProduce ("coordinator") of these fields."""
    deadline = produce_deadline(manager.hosted.monotonic_s(), timeout_ms)
    if origin == "client":
        ctx = ProduceContext.client(acks, deadline, transactional_id, consumer_group_id, principal, add_partitions)
    else:
        ctx = ProduceContext.coordinator(acks, deadline, transactional_id, consumer_group_id, verified_from)
    return manager.append_records(ctx, entries)


def header(batch: bytes, base_offset: int | None = None) -> records.BatchHeader:
    h = records.parse_header(batch)
    return h if base_offset is None else h._replace(base_offset=base_offset)


@pytest.fixture
def now() -> MockTime:
    """Monotonic time moved by hand, read in seconds (`now.now_s`: a ReplicaManager's
    `monotonic_s`, a Purgatory's clock), from 100 s."""
    return MockTime(100_000)


@pytest.fixture
def clock() -> MockTime:
    """The wall clock (ms) moved by hand, from NOW_MS."""
    return MockTime(NOW_MS)


@pytest.fixture
def store(tmp_path):
    s = SnapshotStore(tmp_path / "producer-state")
    yield s
    s.close()


@pytest.fixture
def small_config() -> PartitionConfig:
    return PartitionConfig(LogConfig(segment_bytes=2048, index_interval_bytes=256))


@pytest.fixture
def open_partition(tmp_path, store, clock, small_config):
    """open_partition(topic="t", partition=0, **kw) -> Partition in tmp_path."""
    def _open(topic: str = "t", partition: int = 0, config: PartitionConfig | None = None, **kw) -> Partition:
        return Partition.open(topic, partition, tmp_path, config or small_config, store, clock_ms=clock,
                              monotonic_ms=kw.pop("monotonic_ms", clock), **kw)
    return _open


def crash(partition_or_log) -> None:
    """Drop a log's file descriptors without flushing or recording a recovery point,
    as a SIGKILL would (the page cache keeps what was written)."""
    plog = getattr(partition_or_log, "log", partition_or_log)
    for seg in plog.segments:
        seg.close()
