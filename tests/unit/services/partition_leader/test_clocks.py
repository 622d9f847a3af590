"""A partition's durations count on its monotonic clock; a wall clock stepped
forwards or backwards (an NTP step, a host with a wrong clock) neither keeps a
dead follower in the ISR, nor stops producer-state snapshots, nor lets time-based
retention delete fresh data (docs/design.md, "Clocks")."""
from __future__ import annotations

import asyncio

from exactly_wire.error_codes import ErrorCode
from services.partition_leader.cleaner import LogCleaner
from services.partition_leader.log import LogConfig
from services.partition_leader.partition import Partition, PartitionConfig
from services.partition_leader.snapshot_store import SnapshotStore

from exactly.testing import MockTime

from .conftest import NOW_MS, make_batch, valid

TEN_MINUTES_MS = 600_000
REPLICAS = ("a", "b")


def test_follower_that_stopped_leaves_the_isr_after_a_backward_step(tmp_path):
    wall, mono = MockTime(NOW_MS), MockTime(5_000)
    store = SnapshotStore(tmp_path / "producer-state")
    config = PartitionConfig(LogConfig(segment_bytes=2048, index_interval_bytes=256), min_insync_replicas=1)
    p = Partition.open("t", 0, tmp_path, config, store, clock_ms=wall, monotonic_ms=mono, local_id="a",
                       single_replica=False)
    try:
        p.become_leader(0, REPLICAS, REPLICAS, zk_version=0)
        assert p.append(valid(make_batch(3)), -1).error == ErrorCode.NONE
        assert p.fetch_for_follower("b", p.log_end_offset, 1 << 20, 0).error == ErrorCode.NONE  # caught up
        wall.advance(-TEN_MINUTES_MS)  # the leader's wall clock steps back; b stops fetching
        assert p.isr_shrink_candidate(10_000) is None
        mono.advance(10_001)
        wall.advance(10_001)
        assert p.isr_shrink_candidate(10_000) == ("a",)
    finally:
        p.log.close()
        store.close()


def test_forward_step_does_not_shrink_a_fetching_follower_out(tmp_path):
    wall, mono = MockTime(NOW_MS), MockTime(5_000)
    store = SnapshotStore(tmp_path / "producer-state")
    p = Partition.open("t", 0, tmp_path, PartitionConfig(), store, clock_ms=wall, monotonic_ms=mono,
                       local_id="a", single_replica=False)
    try:
        p.become_leader(0, REPLICAS, REPLICAS, zk_version=0)
        p.fetch_for_follower("b", p.log_end_offset, 1 << 20, 0)
        wall.advance(TEN_MINUTES_MS)
        mono.advance(100)
        assert p.isr_shrink_candidate(10_000) is None
    finally:
        p.log.close()
        store.close()


def test_snapshot_interval_survives_a_backward_step(open_partition, clock):
    mono = MockTime(5_000)
    p = open_partition(config=PartitionConfig(snapshot_interval_ms=1000), monotonic_ms=mono)
    p.append(valid(make_batch(3, pid=3, seq=0)))
    clock.advance(-TEN_MINUTES_MS)
    mono.advance(1000)
    assert p.maybe_snapshot()


def _fresh_segments(open_partition, wall: MockTime, mono: MockTime) -> Partition:
    """A partition (retention.ms 60 s) with closed segments of data stamped `wall` now."""
    p = open_partition(config=PartitionConfig(LogConfig(segment_bytes=1024, index_interval_bytes=256),
                                              retention_ms=60_000), monotonic_ms=mono)
    for _ in range(30):
        assert p.append(valid(make_batch(3, ts=wall()))).error == ErrorCode.NONE
    assert len(p.log.segments) > 3
    return p


def test_forward_step_deletes_no_fresh_data(open_partition, clock):
    mono = MockTime(5_000)
    p = _fresh_segments(open_partition, clock, mono)
    segments = len(p.log.segments)
    clock.advance(TEN_MINUTES_MS)  # the data is seconds old, the node's wall clock says 10 minutes
    cleaner = LogCleaner(lambda: [p], lambda q: True, clock_ms=clock, monotonic_ms=mono)
    assert asyncio.run(cleaner.run_once())[0] == 0
    assert len(p.log.segments) == segments and p.log_start_offset == 0
    assert p.retention_now_ms() == NOW_MS
    # Once retention.ms has passed for real, the old segments go.
    mono.advance(60_010)
    clock.advance(60_010)
    assert asyncio.run(cleaner.run_once())[0] > 0
    assert len(p.log.segments) == 1


def test_retention_follows_the_wall_clock_when_it_is_not_ahead(open_partition, clock):
    mono = MockTime(5_000)
    p = _fresh_segments(open_partition, clock, mono)
    clock.advance(-TEN_MINUTES_MS)  # backwards: kept longer, as in Kafka
    mono.advance(60_001)
    assert p.retention_now_ms() == NOW_MS - TEN_MINUTES_MS
    assert p.deletable_segments() == 0
