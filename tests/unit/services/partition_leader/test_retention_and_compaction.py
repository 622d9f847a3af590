"""Retention, DeleteRecords and compaction of one partition, on real files and a real
RocksDB snapshot store (the cleaner's worker code runs inline)."""
from __future__ import annotations

import asyncio

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from services.partition_leader.cleaner import LogCleaner
from services.partition_leader.log import LogConfig
from services.partition_leader.partition import Partition, PartitionConfig

from .conftest import NOW_MS, crash, make_batch, valid

DAY = 86_400_000


def keyed(pairs, *, pid=-1, epoch=0, seq=-1, txn=False, ts=NOW_MS) -> bytes:
    """A batch of (key, value) records; value None is a tombstone."""
    return records.encode_batch([(k, v, (), ts) for k, v in pairs], producer_id=pid, producer_epoch=epoch,
                                base_sequence=seq, transactional=txn)


def read_all(p: Partition, isolation: int = 0) -> list[records.Record]:
    """Every record a consumer reads from the log start (aborted ones filtered under
    read_committed, as the SDK does with the aborted list)."""
    out = []
    offset = p.log_start_offset
    bound = p.last_stable_offset if isolation else p.high_watermark
    while offset < bound:
        res = p.fetch(offset, 1 << 20, isolation)
        assert res.error == ErrorCode.NONE
        if not res.records:
            break
        aborted = {pid: first for pid, first in res.aborted}
        for _pos, h in records.iter_batches(res.records):
            offset = h.last_offset + 1
            if h.is_control:
                aborted.pop(h.producer_id, None) if aborted.get(h.producer_id, 1 << 62) <= h.base_offset else None
                continue
            if h.is_transactional and aborted.get(h.producer_id, 1 << 62) <= h.base_offset:
                continue
            out.extend(r for r in records.decode_records(res.records, _pos, h) if r.offset >= p.log_start_offset)
    return out


def run(cleaner: LogCleaner):
    return asyncio.run(cleaner.run_once())


def cleaner_for(p: Partition, clock) -> LogCleaner:
    return LogCleaner(lambda: [p], lambda q: True, clock_ms=clock, monotonic_ms=clock)


def config(**kw) -> PartitionConfig:
    log_kw = {k: kw.pop(k) for k in ("segment_bytes", "segment_ms") if k in kw}
    return PartitionConfig(LogConfig(segment_bytes=log_kw.get("segment_bytes", 1024), index_interval_bytes=256,
                                     segment_ms=log_kw.get("segment_ms", 7 * DAY)), **kw)


# ---------------------------------------------------------------- retention
def test_time_retention_deletes_old_segments_below_the_high_watermark(open_partition, clock):
    p = open_partition(config=config(retention_ms=DAY))
    for i in range(30):
        p.append(valid(make_batch(3, ts=clock() - 2 * DAY)))
    assert len(p.log.segments) > 3
    size_before = p.log.size_bytes
    active_base = p.log.segments[-1].base_offset
    freed, _ = run(cleaner_for(p, clock))
    assert freed > 0 and p.log.size_bytes == size_before - freed
    # Everything but the active segment went; the log start offset moved to it.
    assert len(p.log.segments) == 1 and p.log_start_offset == active_base
    assert p.fetch(0, 1 << 20).error == ErrorCode.OFFSET_OUT_OF_RANGE
    assert p.fetch(active_base, 1 << 20).records


def test_retention_never_passes_the_high_watermark_or_an_open_transaction(open_partition, clock):
    p = open_partition(config=config(retention_ms=DAY))
    p.append(valid(make_batch(3, ts=clock() - 2 * DAY)))
    first_txn = p.append(valid(make_batch(3, pid=7, seq=0, txn=True, ts=clock() - 2 * DAY))).base_offset
    for i in range(30):
        p.append(valid(make_batch(3, ts=clock() - 2 * DAY)))
    assert len(p.log.segments) > 3
    run(cleaner_for(p, clock))
    # The open transaction's first batch (and everything after) stays.
    assert p.log_start_offset <= first_txn
    assert p.last_stable_offset == first_txn
    p.write_marker(7, 0, committed=False, coordinator_epoch=0)
    run(cleaner_for(p, clock))
    assert p.log_start_offset > first_txn


def test_size_retention_keeps_at_most_retention_bytes(open_partition, clock):
    p = open_partition(config=config(retention_bytes=3000))
    for i in range(40):
        p.append(valid(make_batch(3)))
    run(cleaner_for(p, clock))
    assert p.log.size_bytes <= 3000 + 1024
    assert p.log.size_bytes >= 3000 - 1024


def test_delete_records_moves_the_log_start_and_survives_a_restart(open_partition, clock, tmp_path, store):
    p = open_partition(config=config(retention_ms=-1))
    for i in range(30):
        p.append(valid(make_batch(3, pid=3, seq=3 * i)))
    assert p.delete_records(p.high_watermark + 1) == (ErrorCode.OFFSET_OUT_OF_RANGE, 0)
    assert p.delete_records(40) == (ErrorCode.NONE, 40)
    assert p.delete_records(10) == (ErrorCode.NONE, 40)  # never back
    p.delete_old_segments()
    assert p.log.segments[0].base_offset <= 40 < p.log.segments[0].next_offset
    res = p.fetch(40, 1 << 20)
    assert res.log_start_offset == 40 and res.records
    assert p.fetch(39, 1 << 20).error == ErrorCode.OFFSET_OUT_OF_RANGE
    assert p.list_offset(-2) == (ErrorCode.NONE, 40, -1)
    crash(p)
    again = Partition.open("t", 0, tmp_path, config(retention_ms=-1), store, clock_ms=clock, monotonic_ms=clock)
    assert again.log_start_offset == 40
    # The producer whose early batches are gone is still known: a retry is a duplicate.
    dup = again.append(valid(make_batch(3, pid=3, seq=87)))
    assert dup.error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
    assert again.append(valid(make_batch(3, pid=3, seq=90))).error == ErrorCode.NONE


def test_producer_with_an_open_transaction_survives_deleted_segments_and_a_restart(open_partition, clock,
                                                                                   tmp_path, store):
    cfg = config(retention_ms=DAY, producer_id_expiration_ms=7 * DAY)
    p = open_partition(config=cfg)
    p.append(valid(make_batch(3, pid=5, seq=0, ts=clock() - 2 * DAY)))
    for i in range(30):
        p.append(valid(make_batch(3, ts=clock() - 2 * DAY)))
    start = p.append(valid(make_batch(2, pid=9, seq=0, txn=True))).base_offset
    p.append(valid(make_batch(3)))
    run(cleaner_for(p, clock))
    assert p.log_start_offset > 0
    p.close()
    again = Partition.open("t", 0, tmp_path, cfg, store, clock_ms=clock, monotonic_ms=clock)
    assert again.last_stable_offset == start  # the open transaction is remembered
    assert 5 in again.producers.producers  # so is the producer whose batches were deleted
    assert again.append(valid(make_batch(3, pid=5, seq=0))).error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER


def test_segment_ms_rolls_the_active_segment(open_partition, clock):
    p = open_partition(config=config(segment_bytes=1 << 20, segment_ms=1000))
    p.append(valid(make_batch(2)))
    clock.advance(1001)
    p.append(valid(make_batch(2)))
    assert [s.base_offset for s in p.log.segments] == [0, 2]


def test_follower_below_the_leader_log_start_starts_there(open_partition):
    p = open_partition(single_replica=False)
    p.become_follower("other", 1, ("other", "local"))
    p.append_as_follower(records.encode_batch([(b"k", b"v", (), NOW_MS)], partition_leader_epoch=1))
    p.truncate_fully_and_start_at(50)
    assert (p.log_start_offset, p.log_end_offset, p.high_watermark) == (50, 50, 50)
    batch = bytearray(records.encode_batch([(b"k", b"v", (), NOW_MS)], partition_leader_epoch=1))
    records.set_base_offset(batch, 50)
    assert p.append_as_follower(bytes(batch)) == 1 and p.log_end_offset == 51


# ---------------------------------------------------------------- compaction
def fill_keyed(p: Partition, rounds: int, keys: int = 5, ts: int = NOW_MS) -> None:
    for r in range(rounds):
        for k in range(keys):
            p.append(valid(keyed([(b"key-%d" % k, b"v%d-%d" % (r, k) + b"x" * 60)], ts=ts)))


def test_compaction_keeps_the_latest_record_per_key(open_partition, clock):
    p = open_partition(config=config(cleanup_policy=frozenset({"compact"})))
    fill_keyed(p, 40)
    before = p.log.size_bytes
    latest_before = {r.key: r.value for r in read_all(p)}
    _, saved = run(cleaner_for(p, clock))
    assert saved > 0 and p.log.size_bytes < before / 3
    after = read_all(p)
    assert {r.key: r.value for r in after} == latest_before
    # Offsets only get gaps: they still increase, and the log end did not move.
    offsets = [r.offset for r in after]
    assert offsets == sorted(offsets) and p.log_end_offset == 200
    assert len(after) <= 5 + 20  # the compacted part holds one per key; the active segment the rest


def test_compaction_drops_tombstones_only_after_delete_retention(open_partition, clock, tmp_path, store):
    cfg = config(cleanup_policy=frozenset({"compact"}), delete_retention_ms=DAY)
    p = open_partition(config=cfg)
    fill_keyed(p, 10)
    p.append(valid(keyed([(b"key-0", None)])))  # tombstone
    fill_keyed(p, 10, keys=0)
    for _ in range(20):
        p.append(valid(keyed([(b"other", b"y" * 80)])))
    cleaner = cleaner_for(p, clock)
    run(cleaner)
    keys = [r.key for r in read_all(p)]
    assert b"key-0" in keys  # the tombstone itself stays within delete.retention.ms
    assert [r.value for r in read_all(p) if r.key == b"key-0"] == [None]
    clock.advance(DAY + 1)
    run(cleaner)
    assert b"key-0" not in [r.key for r in read_all(p)]
    # The compacted log reopens after a crash (offset gaps are valid).
    end, kept = p.log_end_offset, [(r.offset, r.key, r.value) for r in read_all(p)]
    crash(p)
    again = Partition.open("t", 0, tmp_path, cfg, store, clock_ms=clock, monotonic_ms=clock)
    assert again.log_end_offset == end
    assert [(r.offset, r.key, r.value) for r in read_all(again)] == kept


def test_compaction_removes_aborted_data_and_keeps_committed_with_its_marker(open_partition, clock):
    p = open_partition(config=config(cleanup_policy=frozenset({"compact"}), delete_retention_ms=0))
    # pid 1 commits key a=1; pid 2 aborts key a=2 (which must never shadow a=1).
    p.append(valid(keyed([(b"a", b"1")], pid=1, seq=0, txn=True)))
    p.append(valid(keyed([(b"a", b"2")], pid=2, seq=0, txn=True)))
    p.write_marker(1, 0, committed=True, coordinator_epoch=0)
    p.write_marker(2, 0, committed=False, coordinator_epoch=0)
    for i in range(40):
        p.append(valid(keyed([(b"filler-%d" % (i % 3), b"z" * 60)])))
    clock.advance(1)
    run(cleaner_for(p, clock))
    kept = read_all(p, isolation=1)
    assert [r.value for r in kept if r.key == b"a"] == [b"1"]
    batches = [b.header for b in p.log.batches(0)]
    controls = [h for h in batches if h.is_control]
    # The COMMIT marker of pid 1 stays (its record survives); pid 2's data and marker are gone.
    assert [h.producer_id for h in controls] == [1]
    assert not any(h.producer_id == 2 for h in batches)
    assert p.fetch(0, 1 << 20, isolation_level=1).aborted == ()


def test_compaction_waits_for_open_transactions(open_partition, clock):
    p = open_partition(config=config(cleanup_policy=frozenset({"compact"})))
    fill_keyed(p, 5)
    first = p.append(valid(keyed([(b"key-1", b"in-txn")], pid=4, seq=0, txn=True))).base_offset
    fill_keyed(p, 30)
    run(cleaner_for(p, clock))
    # Nothing at or after the open transaction's first offset was cleaned.
    assert any(b.header.base_offset == first for b in p.log.batches(0))
    assert p.last_stable_offset == first


def test_compaction_survives_a_crash_between_swap_steps(open_partition, clock, tmp_path, store):
    cfg = config(cleanup_policy=frozenset({"compact"}))
    p = open_partition(config=cfg)
    fill_keyed(p, 30)
    expected = {r.key: r.value for r in read_all(p)}
    # A crash after the cleaned file became a .swap but before the old segments went.
    segs = p.cleanable_segments()
    cleaned = p.log.cleaned_path(segs[0].base_offset)
    cleaned.write_bytes(b"".join(bytes(b.read()) for b in p.log.batches(0, segs[-1].next_offset)))
    swap = p.log.dir / f"{segs[0].base_offset:020d}-{segs[-1].next_offset:020d}.swap"
    cleaned.rename(swap)
    crash(p)
    again = Partition.open("t", 0, tmp_path, cfg, store, clock_ms=clock, monotonic_ms=clock)
    assert {r.key: r.value for r in read_all(again)} == expected
    assert not list(again.log.dir.glob("*.swap"))
    # An unfinished .cleaned file is dropped on open.
    stray = again.log.cleaned_path(0)
    stray.write_bytes(b"garbage")
    crash(again)
    third = Partition.open("t", 0, tmp_path, cfg, store, clock_ms=clock, monotonic_ms=clock)
    assert not stray.exists() and {r.key: r.value for r in read_all(third)} == expected
