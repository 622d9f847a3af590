"""A machine crash at every point of a partition's writes keeps its aborted-transaction
index as durable as the recovery point says (docs/design.md, "Partition directory",
Durability).

The partition runs in this process on the disk-fault filesystem (tests/faults/diskfs.py,
a real FUSE mount). `fail_after=n` lets the next n changes (writes, truncations, fsyncs,
creates, renames, unlinks) through and fails every later one with EIO, so the writer
stops right there; the filesystem's "crash" then drops everything not fsynced, and the
log is opened again. Each scenario runs with n = 0, 1, 2, ... until it completes
without a failure, so every point between two changes, fsynced or not, is a crash point.

After each crash the reopened log must hold: every ABORT marker below the recovery point
it found has its aborted-index entry (a producer-state snapshot, never taken past the
recovery point, is trusted on open and the marker is not replayed: a missing entry
would stay missing, and read_committed readers would get the aborted records), and
every entry belongs to an ABORT marker of its producer at its offset.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from exactly_wire import records
from faults.diskfs import DiskFaults
from services.partition_leader.log import ABORTED_TXN, Log, LogConfig
from services.partition_leader.partition import AppendResult, Partition, PartitionConfig, ValidatedBatch

pytestmark = pytest.mark.integration

NOW_MS = 1_700_000_000_000
# Three segments' worth of batches at least: rolls are crash points too.
CONFIG = PartitionConfig(LogConfig(segment_bytes=1024, index_interval_bytes=256, flush_messages=1))
REPLICAS = ("a", "b")
# Whole scenarios end within this many changes; a bound so that a scenario that never
# completes fails instead of looping.
MAX_CHANGES = 2000


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    base = tmp_path_factory.mktemp("crash-points")
    d = DiskFaults(base / "backing", base / "mount")
    yield d
    d.close()


def batch(pid: int, seq: int, n: int = 3, txn: bool = True) -> ValidatedBatch:
    """A producer's record batch v2 as Partition.append takes it (the write path's shape
    gate passed it)."""
    checked = ValidatedBatch.check(
        records.encode_batch([(b"k", f"{pid}-{seq + i}".encode() * 20, (), NOW_MS) for i in range(n)],
                             producer_id=pid, producer_epoch=0, base_sequence=seq, transactional=txn))
    assert not isinstance(checked, AppendResult), checked
    return checked


def open_partition(directory: Path, node: str = "a", config: PartitionConfig = CONFIG) -> Partition:
    p = Partition.open("t", 0, directory, config, None, clock_ms=lambda: NOW_MS, monotonic_ms=lambda: 0,
                       local_id=node, single_replica=False)
    if node == "a":
        p.become_leader(0, REPLICAS, REPLICAS, zk_version=0)
    else:
        p.become_follower("a", 0, REPLICAS)
    return p


def drop(p: Partition) -> None:
    """Close the partition's files without flushing anything (the writer died)."""
    for seg in p.log.segments:
        seg.close()


def leader_writes(p: Partition) -> None:
    """Two producers' transactions, the first aborted twice and the second committed,
    with ABORT markers at segment ends and at the log end."""
    for b in (batch(1, 0), batch(2, 0)):
        assert p.append(b).error == 0
    assert p.write_marker(1, 0, committed=False, coordinator_epoch=0).error == 0
    assert p.append(batch(1, 3)).error == 0
    assert p.write_marker(2, 0, committed=True, coordinator_epoch=0).error == 0
    assert p.write_marker(1, 0, committed=False, coordinator_epoch=0).error == 0


def leader_log(directory: Path, first_committed: bool) -> Partition:
    """A leader whose log is `leader_writes`, except that producer 1's first
    transaction ends as `first_committed` says (outside the fault filesystem)."""
    p = Partition.open("t", 0, directory, CONFIG, None, clock_ms=lambda: NOW_MS, monotonic_ms=lambda: 0)
    for b in (batch(1, 0), batch(2, 0)):
        p.append(b)
    p.write_marker(1, 0, committed=first_committed, coordinator_epoch=0)
    p.append(batch(1, 3))
    p.write_marker(2, 0, committed=True, coordinator_epoch=0)
    p.write_marker(1, 0, committed=False, coordinator_epoch=0)
    return p


def batches_from(p: Partition, offset: int) -> bytes:
    """The batches of `p`'s log from `offset` to its end (a read stops at a segment's end)."""
    out = b""
    while offset < p.log_end_offset:
        res = p.log.read(offset, 1 << 20, p.log_end_offset)
        out, offset = out + res.records, res.next_offset
    return out


def check_durable(directory: Path) -> tuple[int, int]:
    """Open the log as a restart would and check the module's two rules. Returns
    (recovery point found, ABORT markers below it)."""
    log = Log.open(directory / "logs" / "t-0", CONFIG.log)
    try:
        markers = {}
        for b in log.batches(log.log_start_offset):
            if b.header.is_control:
                ctype, _ = records.decode_control_record(records.decode_records(b.read(), 0, b.header)[0])
                markers[(b.header.producer_id, b.header.base_offset)] = ctype == records.CONTROL_COMMIT
        flushed = log.flushed_at_open
        covered = [(pid, off) for (pid, off), committed in markers.items() if not committed and off < flushed]
        for pid, off in covered:
            assert log.has_aborted_entry(pid, off), (
                f"ABORT marker of producer {pid} at {off}, below the recovery point {flushed}, lost its "
                f"aborted-index entry: {[e for s in log.segments for e in s.aborted]}")
        for seg in log.segments:
            for e in seg.aborted:
                assert markers.get((e.producer_id, e.last_offset)) is False, (
                    f"aborted-index entry {e} without an ABORT marker of its producer there: {markers}")
        return flushed, len(covered)
    finally:
        for seg in log.segments:
            seg.close()


def every_crash_point(disk: DiskFaults, name: str, setup, writes) -> list[tuple[int, int]]:
    """Run `writes(setup(directory))` in a new directory per n, failing every change
    after the first n, crash, check; until one run completes. Returns check_durable's
    answers, one per crash point."""
    seen = []
    for n in range(MAX_CHANGES):
        directory = disk.mount / f"{name}-{n}-{uuid.uuid4().hex[:6]}"
        p = setup(directory)
        disk.set(fail_after=n)
        try:
            writes(p)
            done = True
        except OSError:
            done = False
        finally:
            disk.clear()
            drop(p)
        disk.crash()
        seen.append(check_durable(directory))
        if done:
            return seen
    raise AssertionError(f"{name} did not complete within {MAX_CHANGES} changes")


def test_a_crash_anywhere_in_a_leaders_markers_keeps_the_aborted_index(disk):
    seen = every_crash_point(disk, "leader", open_partition, leader_writes)
    # Crash points with ABORT markers below the recovery point were reached, with both.
    assert len(seen) > 20 and max(covered for _, covered in seen) == 2, seen


def test_a_crash_anywhere_in_a_followers_appends_and_truncation_keeps_the_aborted_index(disk, tmp_path):
    """The follower copies a leader whose first transaction was aborted, then
    truncates to that ABORT marker, inside a segment (a new leader, whose log has a
    COMMIT there instead), and copies the new leader's tail."""
    old = leader_log(tmp_path / "old", first_committed=False)
    new = leader_log(tmp_path / "new", first_committed=True)
    diverged = 6  # the first marker, in the first segment
    assert old.log.segment_for(diverged) == 0 and len(old.log.segments) > 1
    old_tail, new_tail = batches_from(old, 0), batches_from(new, diverged)

    def writes(p: Partition) -> None:
        p.append_as_follower(old_tail)
        p.truncate_to(diverged)
        p.append_as_follower(new_tail)

    seen = every_crash_point(disk, "follower", lambda d: open_partition(d, "b"), writes)
    assert len(seen) > 20 and max(covered for _, covered in seen) == 2, seen
    for p in (old, new):
        p.close()


def test_an_aborted_index_entry_restored_on_open_is_durable(disk, tmp_path):
    """A log whose .txnindex lost its first entry (the second is there): opening the
    partition replays the marker and puts the entry back in order, rewriting the
    file; a crash right after must not take it away again."""
    directory = disk.mount / f"restored-{uuid.uuid4().hex[:6]}"
    one_segment = PartitionConfig(LogConfig(flush_messages=1))
    p = open_partition(directory, config=one_segment)
    leader_writes(p)
    p.close()
    index = next((directory / "logs" / "t-0").glob("*.txnindex"))
    entries = index.read_bytes()
    assert len(entries) == 2 * ABORTED_TXN.size
    with open(index, "r+b") as f:
        f.write(entries[ABORTED_TXN.size:])
        f.truncate(ABORTED_TXN.size)
        os.fsync(f.fileno())
    again = open_partition(directory, config=one_segment)
    assert index.read_bytes() == entries
    drop(again)
    disk.crash()
    assert check_durable(directory)[1] == 2
