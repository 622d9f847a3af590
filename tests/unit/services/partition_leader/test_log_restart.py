"""Opening a cleanly closed log costs the same whatever its size: the offset index
is checked at its ends and decoded on first use (Kafka's lazily loaded indexes);
an index found out of order then is rebuilt; a crash still scans from the
recovery point."""
from __future__ import annotations

import os
import time

import pytest

from exactly_wire import records
from exactly.testing import MockTime
from services.partition_leader.log import INDEX_ENTRY, RECOVERY_POINT_FILE, Log, LogConfig

from .conftest import NOW_MS, crash, make_batch

INTERVAL = 4096


clock = MockTime(NOW_MS)  # the batches' time, not moved: the active segment never rolls by segment.ms


def append(plog: Log, batch: bytes) -> None:
    buf = bytearray(batch)
    plog.append(buf, records.parse_header(buf))


def sparse_segment(directory, entries: int) -> int:
    """A cleanly closed one-segment log whose offset index has `entries` entries, one
    every INTERVAL bytes (the log file is sparse: only its last batch is written).
    Returns the log end offset."""
    directory.mkdir(parents=True)
    batch = bytearray(make_batch(1, value_size=8))
    last = (entries - 1) * 10 + 9
    records.set_base_offset(batch, last)
    position = (entries - 1) * INTERVAL
    with open(directory / f"{0:020d}.log", "wb") as f:
        f.truncate(position)
        f.seek(position)
        f.write(batch)
    (directory / f"{0:020d}.index").write_bytes(
        b"".join(INDEX_ENTRY.pack(i * 10 + 9, i * INTERVAL) for i in range(entries)))
    (directory / RECOVERY_POINT_FILE).write_text(f"{last + 1} 0 {position + len(batch)}\n")
    return last + 1


def open_cpu_s(directory) -> float:
    """Least CPU time (s) of five `Log.open`s of `directory`."""
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        plog = Log.open(directory)
        best = min(best, time.process_time() - start)
        assert not plog.recovery_scanned
        plog.close()
    return best


def test_a_clean_open_does_not_grow_with_the_offset_index(tmp_path):
    small, large = tmp_path / "small" / "t-0", tmp_path / "large" / "t-0"
    sparse_segment(small, 250)
    end = sparse_segment(large, 250_000)  # a 1 GiB segment's index at 4 KiB per entry
    # Decoding 250,000 entries entry by entry costs tens of ms; reading two of them, ~nothing.
    assert open_cpu_s(large) < 3 * open_cpu_s(small) + 0.002
    plog = Log.open(large)
    assert plog.log_end_offset == end
    # First use decodes the index: a lookup lands on the indexed batch.
    assert plog.active_segment.lookup(end - 1) == (250_000 - 1) * INTERVAL
    assert len(plog.active_segment.index_entries()) == 250_000


def test_a_fetch_from_the_log_end_after_a_clean_open_needs_no_index(tmp_path):
    directory = tmp_path / "t-0"
    plog = Log.open(directory, LogConfig(index_interval_bytes=200), clock)
    for _ in range(40):
        append(plog, make_batch(2))
    plog.close()
    again = Log.open(directory, LogConfig(index_interval_bytes=200), clock)
    assert again.read(80, 1 << 20, 80).records == b""
    assert again.active_segment._index_pending is not None  # noqa: SLF001 - still not decoded
    append(again, make_batch(2))
    assert again.read(80, 1 << 20, 82).first_offset == 80


def closed_log(tmp_path):
    """A cleanly closed log of 30 three-record batches with an index entry every 150
    bytes: (directory, config, its index entries)."""
    directory = tmp_path / "t-0"
    config = LogConfig(index_interval_bytes=150)
    plog = Log.open(directory, config, clock)
    for _ in range(30):
        append(plog, make_batch(3))
    expected = plog.active_segment.index_entries()
    plog.close()
    return directory, config, expected


def test_an_index_out_of_order_is_rebuilt_on_first_use(tmp_path):
    directory, config, expected = closed_log(tmp_path)
    index = directory / f"{0:020d}.index"
    raw = bytearray(index.read_bytes())
    assert len(raw) >= 4 * INDEX_ENTRY.size
    raw[INDEX_ENTRY.size:2 * INDEX_ENTRY.size], raw[2 * INDEX_ENTRY.size:3 * INDEX_ENTRY.size] = \
        raw[2 * INDEX_ENTRY.size:3 * INDEX_ENTRY.size], raw[INDEX_ENTRY.size:2 * INDEX_ENTRY.size]
    index.write_bytes(bytes(raw))  # the last entry is still right: open accepts the file
    again = Log.open(directory, config, clock)
    assert again.log_end_offset == 90 and not again.recovery_scanned
    for offset in (0, 7, 31, 89):
        assert again.read(offset, 1, 90).first_offset == offset - offset % 3
    assert again.active_segment.index_entries() == expected
    assert index.read_bytes() == b"".join(INDEX_ENTRY.pack(o, p) for o, p in expected)


@pytest.mark.parametrize("cut", [1, 40])
def test_a_crash_after_a_clean_open_still_recovers_from_the_recovery_point(tmp_path, cut):
    directory = tmp_path / "t-0"
    config = LogConfig(index_interval_bytes=150)
    plog = Log.open(directory, config, clock)
    for _ in range(20):
        append(plog, make_batch(3))
    plog.close()
    again = Log.open(directory, config, clock)  # index not decoded yet
    for _ in range(10):
        append(again, make_batch(3))  # entries added past the recovery point
    crash(again)
    path = directory / f"{0:020d}.log"
    os.truncate(path, path.stat().st_size - cut)
    third = Log.open(directory, config, clock)
    assert third.recovery_scanned and third.log_end_offset == 87
    entries = third.active_segment.index_entries()
    assert all(p < path.stat().st_size for _, p in entries)
    for offset, position in entries:
        assert records.parse_header(third.active_segment.read_at(position, records.HEADER_SIZE)).last_offset == offset
    assert third.read(50, 1, 87).first_offset == 48


@pytest.mark.parametrize("damage", ["gone", "cut"])
def test_an_index_changed_between_the_open_and_its_first_use_is_rebuilt(tmp_path, damage):
    directory, config, expected = closed_log(tmp_path)
    again = Log.open(directory, config, clock)  # reads 16 bytes of the index
    index = directory / f"{0:020d}.index"
    if damage == "gone":
        index.unlink()
    else:
        os.truncate(index, 2 * INDEX_ENTRY.size)
    assert again.read(31, 1, 90).first_offset == 30
    assert again.active_segment.index_entries() == expected
    append(again, make_batch(3))
    assert again.log_end_offset == 93 and again.read(90, 1, 93).first_offset == 90
