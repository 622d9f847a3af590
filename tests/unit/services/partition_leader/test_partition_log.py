"""The segment log: append/read, roll, sparse index, aborted-txn index, crash recovery."""
from __future__ import annotations

import os

import pytest

from exactly_wire import records
from services.partition_leader.log import (ABORTED_TXN, INDEX_ENTRY, RECOVERY_POINT_FILE, AbortedTxn,
                                           Log, LogConfig)

from .conftest import crash, make_batch


def append(plog: Log, batch: bytes, epoch: int = -1):
    buf = bytearray(batch)
    return plog.append(buf, records.parse_header(buf), epoch)


def fill(plog: Log, count: int, n: int = 3, value_size: int = 40) -> list[int]:
    return [append(plog, make_batch(n, value_size=value_size)).base_offset for _ in range(count)]


@pytest.fixture
def logdir(tmp_path):
    return tmp_path / "logs" / "t-0"


def test_offsets_are_assigned_and_batches_stored_byte_for_byte(logdir):
    plog = Log.open(logdir)
    original = make_batch(3)
    info0 = append(plog, original, epoch=7)
    info1 = append(plog, make_batch(2))
    assert (info0.base_offset, info0.last_offset, info1.base_offset, info1.last_offset) == (0, 2, 3, 4)
    assert plog.log_end_offset == 5
    data = (logdir / f"{0:020d}.log").read_bytes()
    first = data[:len(original)]
    # Only baseOffset and partitionLeaderEpoch (outside the CRC) may differ.
    assert first[12:16] == (7).to_bytes(4, "big")
    assert first[16:] == original[16:]
    records.verify_crc(first)
    res = plog.read(0, 1 << 20, plog.log_end_offset)
    assert res.records == data and res.first_offset == 0 and res.next_offset == 5


def test_append_writes_from_the_callers_bytes_without_changing_them(logdir):
    """The produce path hands the request's bytes over as they are: the log rewrites
    a copy of the 16-byte prefix and writes the rest from those bytes."""
    plog = Log.open(logdir)
    fill(plog, 2)
    batch = make_batch(4, value_size=300)
    kept = bytes(batch)
    info = plog.append(batch, records.parse_header(batch), 3)
    assert batch == kept and info.base_offset == 6
    data = (logdir / f"{0:020d}.log").read_bytes()
    pos = len(data) - len(batch)
    stored = data[pos:]
    h = records.verify_crc(stored)
    assert (h.base_offset, h.partition_leader_epoch) == (6, 3)
    assert stored[16:] == kept[16:]


def test_short_writes_are_continued_across_buffers(monkeypatch, tmp_path):
    from services.partition_leader import log as log_module
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    real_pwritev, real_pwrite = os.pwritev, os.pwrite
    # At most 3 bytes per call, so every buffer boundary is crossed mid-write.
    monkeypatch.setattr(log_module.os, "pwritev", lambda fd, bufs, pos: real_pwritev(
        fd, [bytes(b"".join(bytes(b) for b in bufs)[:3])], pos))
    monkeypatch.setattr(log_module.os, "pwrite", lambda fd, buf, pos: real_pwrite(fd, bytes(buf)[:3], pos))
    try:
        log_module._write_all(fd, (b"abcde", memoryview(b"fghij")[1:], bytearray(b"klm")), 2)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"\0\0abcdeghijklm"


def test_read_bounds_by_offset_and_bytes_but_returns_at_least_one_batch(logdir):
    plog = Log.open(logdir)
    fill(plog, 4)  # offsets 0..11, 3 per batch
    size = len(make_batch(3))
    res = plog.read(0, 1 << 20, 6)  # upper bound exclusive: batches 0-2 and 3-5
    assert [h.base_offset for _, h in records.iter_batches(res.records)] == [0, 3]
    assert res.next_offset == 6
    res = plog.read(0, size + 10, 100)
    assert len(res.records) == size
    res = plog.read(0, 1, 100)  # smaller than one batch: still one batch
    assert len(res.records) == size
    res = plog.read(4, 1 << 20, 100)  # mid-batch: the batch holding offset 4
    assert res.first_offset == 3
    assert plog.read(12, 100, 100).records == b""
    assert plog.read(0, 100, 2).records == b""  # first batch ends at 2 >= bound


def test_segments_roll_at_segment_bytes_and_are_named_by_base_offset(logdir):
    size = len(make_batch(3))
    plog = Log.open(logdir, LogConfig(segment_bytes=3 * size))
    fill(plog, 10)
    assert [s.base_offset for s in plog.segments] == [0, 9, 18, 27]
    assert sorted(p.name for p in logdir.glob("*.log")) == [f"{b:020d}.log" for b in (0, 9, 18, 27)]
    assert all(s.size <= 3 * size for s in plog.segments)
    # Reads continue into the next segment; one read stays within a segment.
    res = plog.read(9, 1 << 20, plog.log_end_offset)
    assert res.first_offset == 9 and res.next_offset == 18
    assert [b.header.base_offset for b in plog.batches(8)] == list(range(6, 30, 3))
    # Rolling fsyncs the sealed segment: the recovery point moved past it.
    assert plog.recovery_point >= 27


def test_a_batch_larger_than_segment_bytes_gets_its_own_segment(logdir):
    plog = Log.open(logdir, LogConfig(segment_bytes=100))
    fill(plog, 3)
    assert [s.base_offset for s in plog.segments] == [0, 3, 6]


def test_sparse_index_entries_every_interval_bytes(logdir):
    size = len(make_batch(3))
    plog = Log.open(logdir, LogConfig(index_interval_bytes=2 * size))
    fill(plog, 20)
    seg = plog.active_segment
    entries = seg.index_entries()
    assert 0 < len(entries) < 20
    raw = (logdir / f"{0:020d}.index").read_bytes()
    assert len(raw) == len(entries) * INDEX_ENTRY.size
    for (offset, pos), (rel, rpos) in zip(entries, INDEX_ENTRY.iter_unpack(raw)):
        assert (rel, rpos) == (offset, pos)
        h = records.parse_header(seg.read_at(pos, records.HEADER_SIZE))
        assert h.last_offset == offset  # entry = (last offset of the batch, its position)
    for target in range(60):
        pos = seg.lookup(target)
        h = records.parse_header(seg.read_at(pos, records.HEADER_SIZE))
        assert h.base_offset <= target


def test_clean_reopen_trusts_the_files(logdir):
    plog = Log.open(logdir, LogConfig(segment_bytes=1000))
    fill(plog, 12)
    entries = [s.index_entries() for s in plog.segments]
    plog.close()
    again = Log.open(logdir, LogConfig(segment_bytes=1000))
    assert not again.recovery_scanned and again.recovered_bytes == 0
    assert again.log_end_offset == 36
    assert [s.index_entries() for s in again.segments] == entries
    assert append(again, make_batch(1)).base_offset == 36


@pytest.mark.parametrize("cut", [1, 10, 61, 100])
def test_recovery_truncates_a_torn_tail(logdir, cut):
    plog = Log.open(logdir)
    fill(plog, 5)
    crash(plog)
    path = logdir / f"{0:020d}.log"
    os.truncate(path, path.stat().st_size - cut)
    again = Log.open(logdir)
    assert again.recovery_scanned
    assert again.log_end_offset == 12
    assert path.stat().st_size == 4 * len(make_batch(3))
    assert append(again, make_batch(3)).base_offset == 12


def test_recovery_truncates_a_garbled_batch_and_everything_after_it(logdir):
    plog = Log.open(logdir)
    fill(plog, 5)
    crash(plog)
    path = logdir / f"{0:020d}.log"
    data = bytearray(path.read_bytes())
    size = len(make_batch(3))
    data[2 * size + 70] ^= 0xFF  # a record byte of the third batch: CRC mismatch
    path.write_bytes(data)
    again = Log.open(logdir)
    assert again.log_end_offset == 6 and again.recovered_bytes == 3 * size
    assert again.read(0, 1 << 20, 100).next_offset == 6


def test_recovery_drops_trailing_garbage(logdir):
    plog = Log.open(logdir)
    fill(plog, 2)
    crash(plog)
    path = logdir / f"{0:020d}.log"
    with open(path, "ab") as f:
        f.write(os.urandom(500))
    again = Log.open(logdir)
    assert again.log_end_offset == 6 and again.recovered_bytes == 500


def test_recovery_scans_only_after_the_recovery_point(logdir):
    plog = Log.open(logdir)
    fill(plog, 3)
    plog.flush()
    assert (logdir / RECOVERY_POINT_FILE).read_text().split() == ["9", "0", str(3 * len(make_batch(3)))]
    fill(plog, 2)
    crash(plog)
    path = logdir / f"{0:020d}.log"
    data = bytearray(path.read_bytes())
    size = len(make_batch(3))
    data[70] ^= 0xFF  # before the recovery point: flushed data is trusted, not re-verified
    data[4 * size + 70] ^= 0xFF  # after it: detected
    path.write_bytes(data)
    again = Log.open(logdir)
    assert again.log_end_offset == 12
    assert again.recovered_bytes == size


def test_recovery_without_a_recovery_point_scans_everything_and_drops_later_segments(logdir):
    size = len(make_batch(3))
    plog = Log.open(logdir, LogConfig(segment_bytes=2 * size))
    fill(plog, 6)  # segments at 0, 6, 12
    crash(plog)
    (logdir / RECOVERY_POINT_FILE).unlink()
    path = logdir / f"{6:020d}.log"
    data = bytearray(path.read_bytes())
    data[size + 70] ^= 0xFF  # second batch of the middle segment
    path.write_bytes(data)
    again = Log.open(logdir, LogConfig(segment_bytes=2 * size))
    assert [s.base_offset for s in again.segments] == [0, 6]
    assert again.log_end_offset == 9
    assert not (logdir / f"{12:020d}.log").exists()


@pytest.mark.parametrize("damage", ["missing", "garbage", "partial", "beyond_end", "negative_last"])
def test_a_missing_or_bad_index_is_rebuilt(logdir, damage):
    config = LogConfig(segment_bytes=1500, index_interval_bytes=150)
    plog = Log.open(logdir, config)
    fill(plog, 20)
    expected = [s.index_entries() for s in plog.segments]
    assert any(expected[0])
    plog.close()
    index = logdir / f"{0:020d}.index"
    if damage == "missing":
        index.unlink()
    elif damage == "garbage":
        index.write_bytes(os.urandom(len(index.read_bytes())))
    elif damage == "partial":
        index.write_bytes(index.read_bytes()[:-3])
    elif damage == "negative_last":  # as random bytes can give
        index.write_bytes(index.read_bytes()[:-INDEX_ENTRY.size] + INDEX_ENTRY.pack(5, -8))
    else:
        index.write_bytes(index.read_bytes() + INDEX_ENTRY.pack(10_000, 10_000_000))
    again = Log.open(logdir, config)
    assert [s.index_entries() for s in again.segments] == expected
    assert again.log_end_offset == 60
    assert again.read(30, 1 << 20, 60).first_offset == 30 - 30 % 3


def test_aborted_txn_index_is_34_byte_entries_per_segment(logdir):
    plog = Log.open(logdir)
    fill(plog, 3)
    plog.append_aborted(AbortedTxn(7, 0, 5, 3))
    plog.append_aborted(AbortedTxn(8, 3, 8, 9))
    raw = (logdir / f"{0:020d}.txnindex").read_bytes()
    assert ABORTED_TXN.size == 34 and len(raw) == 68
    assert ABORTED_TXN.unpack_from(raw, 34) == (0, 8, 3, 8, 9)
    plog.close()
    again = Log.open(logdir)
    assert again.active_segment.aborted == [AbortedTxn(7, 0, 5, 3), AbortedTxn(8, 3, 8, 9)]
    assert again.has_aborted_entry(8, 8) and not again.has_aborted_entry(8, 5)


def test_a_torn_aborted_txn_entry_is_dropped(logdir):
    plog = Log.open(logdir)
    fill(plog, 3)
    plog.append_aborted(AbortedTxn(7, 0, 5, 3))
    crash(plog)
    path = logdir / f"{0:020d}.txnindex"
    with open(path, "ab") as f:
        f.write(AbortedTxn(8, 3, 8, 9).encode()[:20])
    again = Log.open(logdir)
    assert again.active_segment.aborted == [AbortedTxn(7, 0, 5, 3)]
    assert path.stat().st_size == 34


def test_recovery_drops_aborted_entries_whose_marker_was_lost(logdir):
    plog = Log.open(logdir)
    fill(plog, 3)
    plog.append_aborted(AbortedTxn(7, 0, 8, 9))
    crash(plog)
    path = logdir / f"{0:020d}.log"
    os.truncate(path, path.stat().st_size - 5)
    again = Log.open(logdir)
    assert again.log_end_offset == 6
    assert again.active_segment.aborted == []


def test_collect_aborted_filters_by_range_and_stops_at_the_lso(logdir):
    size = len(make_batch(3))
    plog = Log.open(logdir, LogConfig(segment_bytes=3 * size))
    fill(plog, 9)  # segments at 0, 9, 18
    plog.segments[0].append_aborted(AbortedTxn(1, 0, 2, 3))
    plog.segments[1].append_aborted(AbortedTxn(2, 4, 10, 5))
    plog.segments[1].append_aborted(AbortedTxn(3, 11, 14, 20))
    plog.segments[2].append_aborted(AbortedTxn(4, 19, 22, 23))
    assert plog.collect_aborted(0, 3) == [AbortedTxn(1, 0, 2, 3)]
    assert plog.collect_aborted(3, 12) == [AbortedTxn(2, 4, 10, 5), AbortedTxn(3, 11, 14, 20)]
    # Entry 3's LSO (20) >= upper bound 15: the scan stops before segment 18.
    assert plog.collect_aborted(9, 15) == [AbortedTxn(2, 4, 10, 5), AbortedTxn(3, 11, 14, 20)]
    assert plog.collect_aborted(15, 27) == [AbortedTxn(4, 19, 22, 23)]


def test_flush_messages_moves_the_recovery_point(logdir):
    plog = Log.open(logdir, LogConfig(flush_messages=6))
    fill(plog, 1)
    assert plog.recovery_point == 0
    fill(plog, 1)
    assert plog.recovery_point == 6


def test_truncate_to_a_batch_boundary(logdir):
    size = len(make_batch(3))
    plog = Log.open(logdir, LogConfig(segment_bytes=3 * size))
    fill(plog, 7)
    plog.active_segment.append_aborted(AbortedTxn(1, 18, 19, 20))
    plog.truncate_to(12)
    assert plog.log_end_offset == 12 and [s.base_offset for s in plog.segments] == [0, 9]
    with pytest.raises(ValueError):
        plog.truncate_to(10)
    plog.truncate_to(9)
    assert plog.log_end_offset == 9
    assert append(plog, make_batch(3)).base_offset == 9


def test_an_inconsistent_recovery_point_means_a_full_scan(logdir):
    plog = Log.open(logdir)
    fill(plog, 3)
    plog.close()
    size = (logdir / f"{0:020d}.log").stat().st_size
    (logdir / RECOVERY_POINT_FILE).write_text(f"5 0 {size}\n")  # wrong offset for the end position
    again = Log.open(logdir)
    assert again.recovery_scanned and again.log_end_offset == 9
    (logdir / RECOVERY_POINT_FILE).write_text("4 0 100\n")  # not a batch boundary
    assert Log.open(logdir).log_end_offset == 9
