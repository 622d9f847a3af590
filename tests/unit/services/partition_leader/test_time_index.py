"""ListOffsets by timestamp: the segments' sparse in-memory time index
(`log.TimeIndex`, built from batch headers) and `Log.offset_for_timestamp`,
checked against a brute-force scan of every record."""
from __future__ import annotations

import random
import struct

import crc32c

import pytest

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from services.partition_leader import log as log_module
from services.partition_leader.log import Log, LogConfig, TimeIndex

from .conftest import make_batch, valid


def append(plog: Log, batch: bytes) -> int:
    buf = bytearray(batch)
    return plog.append(buf, records.parse_header(buf)).base_offset


def batch_at(timestamps: list[int], **kw) -> bytes:
    return records.encode_batch([(b"k", b"v" * 30, (), ts) for ts in timestamps], **kw)


def brute_force(plog: Log, timestamp: int, end_offset: int) -> tuple[int, int] | None:
    for b in plog.batches(0):
        h = b.header
        if h.is_control:
            continue
        for r in records.decode_records(b.read(), 0, h):
            if r.timestamp >= timestamp:
                return (r.offset, r.timestamp) if r.offset < end_offset else None
    return None


def header(ts: int, size: int = 100) -> records.BatchHeader:
    h = records.parse_header(batch_at([ts]))
    return h._replace(max_timestamp=ts, batch_length=size - records.LOG_OVERHEAD)


def test_time_index_entries_keep_the_running_maximum_and_move_forward_while_it_is_flat():
    ti = TimeIndex(interval_bytes=150)
    for pos, ts in zip(range(0, 1000, 100), [10, 30, 20, 20, 30, 50, 40, 40, 40, 90]):
        ti.add(pos, header(ts))
    assert ti.max_timestamp == 90
    # An entry after every 2 batches (> 150 bytes), its position moved forward
    # while the running maximum stays flat.
    assert list(zip(ti.prefix_max, ti.positions)) == [(30, 400), (50, 800)]
    assert ti.start_position(91) is None
    assert ti.start_position(5) == 0
    # Nothing before the returned position has a timestamp >= the target.
    tss = [10, 30, 20, 20, 30, 50, 40, 40, 40, 90]
    for target in range(0, 95, 5):
        start = ti.start_position(target)
        if start is None:
            assert max(tss) < target
            continue
        assert all(ts < target for ts in tss[:start // 100])


@pytest.mark.parametrize("seed", range(5))
def test_offset_for_timestamp_matches_a_full_scan(tmp_path, seed):
    rng = random.Random(seed)
    plog = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=1500, index_interval_bytes=200))
    base = 1_000_000
    for _ in range(60):  # timestamps roughly rising, with producers' clocks disagreeing
        base += rng.randint(0, 40)
        append(plog, batch_at([base + rng.randint(-60, 60) for _ in range(rng.randint(1, 4))]))
    assert len(plog.segments) > 3
    end = plog.log_end_offset
    for target in range(999_900, base + 100, 7):
        assert plog.offset_for_timestamp(target, end) == brute_force(plog, target, end), target
    bound = end // 2
    for target in range(999_900, base + 100, 13):
        assert plog.offset_for_timestamp(target, bound) == brute_force(plog, target, bound), target


def test_the_index_is_built_on_first_use_then_extended_from_headers_alone(tmp_path, monkeypatch):
    plog = Log.open(tmp_path / "t-0", LogConfig(index_interval_bytes=100))
    append(plog, batch_at([100, 105]))
    assert plog.active_segment._time_index is None
    assert plog.offset_for_timestamp(101, plog.log_end_offset) == (1, 105)
    assert plog.active_segment._time_index is not None

    def no_decoding(*a, **kw):
        raise AssertionError("the append path decoded records")

    monkeypatch.setattr(log_module.records, "decode_records", no_decoding)
    for ts in (200, 150, 300):
        append(plog, batch_at([ts]))
    monkeypatch.undo()
    assert plog.active_segment.time_index().max_timestamp == 300
    assert plog.offset_for_timestamp(160, plog.log_end_offset) == (2, 200)
    assert plog.offset_for_timestamp(301, plog.log_end_offset) is None


def test_reopen_and_truncation_rebuild_the_index(tmp_path):
    d = tmp_path / "t-0"
    plog = Log.open(d, LogConfig(segment_bytes=600))
    for ts in range(10, 200, 10):
        append(plog, batch_at([ts]))
    assert plog.offset_for_timestamp(95, plog.log_end_offset) == (9, 100)
    plog.truncate_to(5)
    assert plog.offset_for_timestamp(95, plog.log_end_offset) is None
    assert plog.offset_for_timestamp(45, plog.log_end_offset) == (4, 50)
    append(plog, batch_at([500]))
    plog.close()
    plog = Log.open(d, LogConfig(segment_bytes=600))
    assert plog.offset_for_timestamp(95, plog.log_end_offset) == (5, 500)


def test_log_append_time_batches_answer_their_first_offset(tmp_path):
    plog = Log.open(tmp_path / "t-0")
    append(plog, batch_at([1, 2]))
    # LogAppendTime: the batch's max timestamp is every record's timestamp.
    stamped = bytearray(batch_at([3, 4, 5]))
    attrs = struct.unpack_from(">h", stamped, 21)[0]
    struct.pack_into(">h", stamped, 21, attrs | records.TIMESTAMP_TYPE_BIT)
    struct.pack_into(">q", stamped, 35, 7000)
    struct.pack_into(">I", stamped, 17, crc32c.crc32c(bytes(stamped[21:])))
    plog.append(stamped, records.verify_crc(bytes(stamped)))
    assert plog.offset_for_timestamp(6000, plog.log_end_offset) == (2, 7000)


def test_control_batches_never_answer(open_partition):
    p = open_partition()
    assert p.append(valid(make_batch(1, pid=1, seq=0, txn=True, ts=1000))).error == ErrorCode.NONE  # 0
    p.write_marker(1, 0, committed=True, coordinator_epoch=0)  # 1: marker, ts = now
    assert p.list_offset(1001) == (ErrorCode.NONE, -1, -1)
    assert p.list_offset(1000) == (ErrorCode.NONE, 0, 1000)


def test_list_offsets_by_timestamp_is_bounded_by_the_isolation_level(open_partition):
    p = open_partition()
    p.append(valid(make_batch(2, ts=1000)))                               # 0-1
    p.append(valid(make_batch(2, pid=1, seq=0, txn=True, ts=2000)))       # 2-3, open
    p.append(valid(make_batch(1, ts=3000)))                               # 4
    assert p.list_offset(2500) == (ErrorCode.NONE, 4, 3000)
    assert p.list_offset(2500, isolation_level=1) == (ErrorCode.NONE, -1, -1)
    assert p.list_offset(0, isolation_level=1) == (ErrorCode.NONE, 0, 1000)


def brute_force_max(plog: Log) -> tuple[int, int] | None:
    best = None
    for b in plog.batches(plog.log_start_offset):
        if b.header.is_control:
            continue
        for r in records.decode_records(b.read(), 0, b.header):
            if r.offset >= plog.log_start_offset and (best is None or r.timestamp > best[1]):
                best = (r.offset, r.timestamp)
    return best


@pytest.mark.parametrize("seed", range(5))
def test_max_timestamp_offset_matches_a_full_scan(tmp_path, seed):
    rng = random.Random(seed)
    plog = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=1500, index_interval_bytes=200))
    assert plog.max_timestamp_offset() is None
    base = 1_000_000
    for i in range(60):  # clocks disagreeing, and the maximum repeated in later batches
        base += rng.randint(-30, 40)
        append(plog, batch_at([base + rng.randint(-60, 60) for _ in range(rng.randint(1, 4))]))
        if i % 10 == 9:
            assert plog.max_timestamp_offset() == brute_force_max(plog)
    assert len(plog.segments) > 3
    top = brute_force_max(plog)
    append(plog, batch_at([1, top[1], top[1]]))  # ties: the first record holding the maximum answers
    assert plog.max_timestamp_offset() == top
    plog.maybe_increment_log_start_offset(top[0] + 1)
    assert plog.max_timestamp_offset() == brute_force_max(plog) == (plog.log_end_offset - 2, top[1])


def test_max_timestamp_skips_control_batches_and_is_bounded_by_the_isolation_level(open_partition):
    p = open_partition()
    assert p.list_offset(-4) == (ErrorCode.NONE, -1, -1)                # empty
    p.append(valid(make_batch(2, ts=5000)))                                   # 0-1: 5000, 5001
    p.append(valid(make_batch(1, ts=1000)))                                   # 2
    assert p.list_offset(-4) == (ErrorCode.NONE, 1, 5001)
    p.append(valid(make_batch(1, pid=1, seq=0, txn=True, ts=9000)))           # 3, open
    assert p.list_offset(-4) == (ErrorCode.NONE, 3, 9000)
    # Kafka (ReplicaManager's lastFetchableOffset check): the largest is at or above the LSO: no offset.
    assert p.list_offset(-4, isolation_level=1) == (ErrorCode.NONE, -1, -1)
    p.write_marker(1, 0, committed=False, coordinator_epoch=0)         # 4: marker, ts = now (larger)
    assert p.list_offset(-4) == p.list_offset(-4, isolation_level=1) == (ErrorCode.NONE, 3, 9000)
    assert p.list_offset(-3)[:2] == (ErrorCode.NONE, 5)                # -3 stays the LSO
