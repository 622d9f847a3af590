"""A partition: produce validation, markers, LSO, aborted index, fetch, list offsets,
producer-state snapshots and recovery after a crash."""
from __future__ import annotations

import os
import struct

import crc32c
import pytest

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from services.partition_leader.log import AbortedTxn, LogConfig
from services.partition_leader.partition import ValidatedBatch, PartitionConfig
from services.partition_leader.producer_state import entries_equal

from .conftest import crash, make_batch, valid

PID = 4242


def offsets_in(data: bytes) -> list[int]:
    return [h.base_offset for _, h in records.iter_batches(data)]


def log_bytes(p) -> bytes:
    return b"".join(s.read_at(0, s.size) for s in p.log.segments)


# ---------------------------------------------------------------- produce validation

def test_corrupt_crc_is_rejected_and_the_log_is_unchanged(open_partition):
    p = open_partition()
    p.append(valid(make_batch(2)))
    before = log_bytes(p)
    bad = bytearray(make_batch(2))
    bad[-1] ^= 0xFF
    res = ValidatedBatch.check(bytes(bad))
    assert res.error == ErrorCode.CORRUPT_MESSAGE
    assert log_bytes(p) == before and p.log_end_offset == 2
    assert p.append(valid(make_batch(1))).base_offset == 2


@pytest.mark.parametrize("batch", [b"", b"\x00" * 30, make_batch(2)[:-5]], ids=["empty", "short", "truncated"])
def test_malformed_batches_are_corrupt(open_partition, batch):
    p = open_partition()
    assert ValidatedBatch.check(batch).error == ErrorCode.CORRUPT_MESSAGE
    assert p.log_end_offset == 0


def test_control_batches_from_clients_are_rejected(open_partition):
    p = open_partition()
    marker = records.encode_control_batch(True, PID, 0, 0, 1)
    assert ValidatedBatch.check(marker).error == ErrorCode.INVALID_REQUEST
    assert p.log_end_offset == 0


def test_more_than_one_batch_is_rejected():
    assert ValidatedBatch.check(make_batch(1) + make_batch(1)).error == ErrorCode.INVALID_REQUEST


def test_transactional_batch_without_pid_is_rejected():
    assert ValidatedBatch.check(make_batch(1, txn=True)).error == ErrorCode.INVALID_REQUEST


def test_the_sequence_of_a_batch_without_pid_is_ignored(open_partition):
    # aiokafka's plain producer sends producer id -1 with base sequence 0, as Kafka's
    # LogValidator allows: no producer state, every such batch appended.
    p = open_partition()
    assert [p.append(valid(make_batch(2, pid=-1, epoch=-1, seq=0))).base_offset for _ in range(3)] == [0, 2, 4]
    assert p.active_producers() == []


def test_a_retried_batch_is_not_appended_again(open_partition):
    p = open_partition()
    first = p.append(valid(make_batch(3, pid=PID, seq=0)))
    p.append(valid(make_batch(3, pid=PID, seq=3)))
    before = log_bytes(p)
    retry = p.append(valid(make_batch(3, pid=PID, seq=0)))
    assert retry.error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER and retry.base_offset == first.base_offset == 0
    assert log_bytes(p) == before
    gap = p.append(valid(make_batch(1, pid=PID, seq=9)))
    assert gap.error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and p.log_end_offset == 6


def test_leader_epoch_is_stamped_into_batches(open_partition):
    p = open_partition(leader_epoch=3)
    p.append(valid(make_batch(1)))
    assert records.parse_header(p.fetch(0, 1 << 20).records).partition_leader_epoch == 3


# ---------------------------------------------------------------- markers and LSO

def test_lso_holds_at_the_first_open_transaction(open_partition):
    p = open_partition()
    p.append(valid(make_batch(2)))  # 0-1
    p.append(valid(make_batch(2, pid=1, seq=0, txn=True)))  # 2-3
    p.append(valid(make_batch(2)))  # 4-5
    assert (p.high_watermark, p.last_stable_offset) == (6, 2)
    committed = p.fetch(0, 1 << 20, isolation_level=1)
    assert offsets_in(committed.records) == [0]
    assert committed.last_stable_offset == 2 and committed.high_watermark == 6
    assert offsets_in(p.fetch(0, 1 << 20, isolation_level=0).records) == [0, 2, 4]
    res = p.write_marker(1, 0, committed=True, coordinator_epoch=0)
    assert res.error == ErrorCode.NONE and res.offset == 6
    assert p.last_stable_offset == p.high_watermark == 7
    assert offsets_in(p.fetch(0, 1 << 20, isolation_level=1).records) == [0, 2, 4, 6]
    assert p.fetch(0, 1 << 20, isolation_level=1).aborted == ()


def test_abort_writes_an_index_entry_with_the_lso_before_completion(open_partition):
    p = open_partition()
    p.append(valid(make_batch(2, pid=1, seq=0, txn=True)))  # 0-1, txn of pid 1
    p.append(valid(make_batch(2, pid=2, seq=0, txn=True)))  # 2-3, txn of pid 2
    p.append(valid(make_batch(2, pid=1, seq=2, txn=True)))  # 4-5
    assert p.write_marker(1, 0, committed=False, coordinator_epoch=0).offset == 6
    # pid 2's transaction (first offset 2) still holds the LSO.
    assert p.log.active_segment.aborted == [AbortedTxn(1, 0, 6, 2)]
    assert p.last_stable_offset == 2
    assert p.write_marker(2, 0, committed=False, coordinator_epoch=0).offset == 7
    assert p.log.active_segment.aborted[-1] == AbortedTxn(2, 2, 7, 8)
    res = p.fetch(0, 1 << 20, isolation_level=1)
    assert offsets_in(res.records) == [0, 2, 4, 6, 7]
    assert sorted(res.aborted) == [(1, 0), (2, 2)]
    assert p.fetch(7, 1 << 20, isolation_level=1).aborted == ((2, 2),)
    assert p.fetch(0, 1 << 20, isolation_level=0).aborted == ()


def test_markers_are_control_batches_with_kafka_types(open_partition):
    p = open_partition()
    p.append(valid(make_batch(1, pid=1, seq=0, txn=True)))
    p.write_marker(1, 0, committed=False, coordinator_epoch=7)
    p.write_marker(1, 0, committed=True, coordinator_epoch=7)
    data = p.fetch(1, 1 << 20).records
    types = []
    for pos, h in records.iter_batches(data):
        assert h.is_control and h.is_transactional and h.producer_id == 1
        types.append(records.decode_control_record(records.decode_records(data, pos, h)[0]))
    assert types == [(records.CONTROL_ABORT, 7), (records.CONTROL_COMMIT, 7)]


def test_marker_without_an_ongoing_transaction_is_still_written(open_partition):
    p = open_partition()
    p.append(valid(make_batch(1, pid=1, seq=0, txn=True)))
    assert p.write_marker(1, 0, True, 0).error == ErrorCode.NONE
    retry = p.write_marker(1, 0, True, 0)
    assert retry.error == ErrorCode.NONE and retry.offset == 2
    assert p.write_marker(99, 0, False, 0).error == ErrorCode.NONE  # unknown PID
    assert p.log.active_segment.aborted[-1] == AbortedTxn(99, 3, 3, 4)


def test_marker_coordinator_epoch_minus_one_is_an_admin_abort(open_partition):
    """KIP-664's abort of a producer that never had a marker here carries coordinator
    epoch -1 (what DescribeProducers reports); below that is malformed."""
    p = open_partition()
    p.append(valid(make_batch(1, pid=7, epoch=3, seq=0, txn=True)))
    assert p.write_marker(7, 3, False, -2).error == ErrorCode.INVALID_REQUEST
    assert p.write_marker(7, 3, False, -1).error == ErrorCode.NONE
    assert p.last_stable_offset == p.high_watermark


def test_marker_fencing_and_epoch_bump(open_partition):
    p = open_partition()
    p.append(valid(make_batch(1, pid=1, epoch=0, seq=0, txn=True)))
    assert p.write_marker(1, 0, True, coordinator_epoch=3).error == ErrorCode.NONE
    assert p.write_marker(1, 0, True, coordinator_epoch=2).error == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    p.append(valid(make_batch(1, pid=1, epoch=0, seq=1, txn=True)))
    assert p.write_marker(1, 1, False, coordinator_epoch=3).error == ErrorCode.NONE  # bump to epoch 1
    end = p.log_end_offset
    assert p.write_marker(1, 0, False, coordinator_epoch=3).error == ErrorCode.INVALID_PRODUCER_EPOCH
    assert p.append(valid(make_batch(1, pid=1, epoch=0, seq=2, txn=True))).error == ErrorCode.INVALID_PRODUCER_EPOCH
    assert p.log_end_offset == end


def test_internal_topics_accept_transactional_batches_without_sequence(open_partition):
    p = open_partition("__consumer_offsets", 3)
    assert p.append(valid(make_batch(1, pid=5, epoch=2, seq=-1, txn=True))).error == ErrorCode.NONE
    assert p.last_stable_offset == 0
    assert p.write_marker(5, 2, True, 0).error == ErrorCode.NONE
    assert p.last_stable_offset == 2
    assert p.append(valid(make_batch(1, pid=5, epoch=1, seq=-1, txn=True))).error == ErrorCode.INVALID_PRODUCER_EPOCH
    normal = open_partition("orders", 0)
    assert normal.append(valid(make_batch(1, pid=5, epoch=2, seq=-1))).error == ErrorCode.INVALID_REQUEST


# ---------------------------------------------------------------- fetch and list offsets

def test_fetch_offsets_out_of_range(open_partition):
    p = open_partition()
    p.append(valid(make_batch(3)))
    assert p.fetch(4, 100).error == ErrorCode.OFFSET_OUT_OF_RANGE
    assert p.fetch(-1, 100).error == ErrorCode.OFFSET_OUT_OF_RANGE
    at_end = p.fetch(3, 100)
    assert at_end.error == ErrorCode.NONE and at_end.records == b"" and at_end.high_watermark == 3


def test_fetch_checks_the_leader_epoch(open_partition):
    p = open_partition(leader_epoch=5)
    assert p.fetch(0, 100, current_leader_epoch=4).error == ErrorCode.FENCED_LEADER_EPOCH
    assert p.fetch(0, 100, current_leader_epoch=6).error == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert p.fetch(0, 100, current_leader_epoch=5).error == ErrorCode.NONE
    assert p.fetch(0, 100, current_leader_epoch=-1).error == ErrorCode.NONE


def test_list_offsets(open_partition):
    p = open_partition()
    p.append(valid(make_batch(2, ts=1000)))  # 0-1: ts 1000, 1001
    p.append(valid(make_batch(2, pid=1, seq=0, txn=True, ts=2000)))  # 2-3
    assert p.list_offset(-2)[:2] == (ErrorCode.NONE, 0)
    assert p.list_offset(-1)[:2] == (ErrorCode.NONE, 4)
    assert p.list_offset(-1, isolation_level=1)[:2] == (ErrorCode.NONE, 2)
    assert p.list_offset(-3)[:2] == (ErrorCode.NONE, 2)
    assert p.list_offset(1001) == (ErrorCode.NONE, 1, 1001)
    assert p.list_offset(1500) == (ErrorCode.NONE, 2, 2000)
    assert p.list_offset(1500, isolation_level=1) == (ErrorCode.NONE, -1, -1)
    assert p.list_offset(-7)[0] == ErrorCode.INVALID_REQUEST


# ---------------------------------------------------------------- snapshots and recovery

def produce_some(p, pid: int, count: int, seq: int = 0, n: int = 2, txn: bool = False) -> int:
    for _ in range(count):
        assert p.append(valid(make_batch(n, pid=pid, seq=seq, txn=txn))).error == ErrorCode.NONE
        seq += n
    return seq


def test_snapshot_on_close_and_reload(open_partition, store):
    p = open_partition()
    produce_some(p, 1, 4)
    produce_some(p, 2, 3, txn=True)
    p.write_marker(3, 0, True, 9)
    state = list(p.producers.producers.values())
    end = p.log_end_offset
    p.close()
    assert store.offsets("t", 0) == [end]
    again = open_partition()
    assert again.snapshot_loaded_from == end
    assert entries_equal(again.producers.producers.values(), state)
    assert again.last_stable_offset == 8  # pid 2's transaction is still open


def test_crash_replays_the_log_after_the_snapshot(open_partition, store):
    p = open_partition()
    seq = produce_some(p, 1, 3)
    p.take_snapshot()
    snap = p.log_end_offset
    seq = produce_some(p, 1, 3, seq=seq)
    produce_some(p, 2, 1, txn=True)
    state = list(p.producers.producers.values())
    crash(p)
    again = open_partition()
    assert again.snapshot_loaded_from == snap
    assert entries_equal(again.producers.producers.values(), state)
    retry = again.append(valid(make_batch(2, pid=1, seq=seq - 2)))
    assert retry.error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER and retry.base_offset == 10


def test_a_lost_tail_invalidates_newer_snapshots(open_partition, store):
    p = open_partition()
    produce_some(p, 1, 2)  # seq 0-3, offsets 0-3
    p.take_snapshot()
    produce_some(p, 1, 1, seq=4)  # offsets 4-5
    p.take_snapshot()
    crash(p)
    path = p.log.active_segment.log_path
    os.truncate(path, path.stat().st_size - 10)  # the last batch is torn
    again = open_partition()
    assert again.log_end_offset == 4
    assert again.snapshot_loaded_from == 4 and store.offsets("t", 0) == [4]
    # The lost batch is not a duplicate: it may be sent again and lands at offset 4.
    res = again.append(valid(make_batch(2, pid=1, seq=4)))
    assert res.error == ErrorCode.NONE and res.base_offset == 4


def test_a_corrupt_snapshot_falls_back_to_an_older_one_then_a_full_scan(open_partition, store):
    p = open_partition()
    seq = produce_some(p, 1, 2)
    p.take_snapshot()
    seq = produce_some(p, 1, 2, seq=seq)
    p.take_snapshot()
    seq = produce_some(p, 1, 1, seq=seq)
    state = list(p.producers.producers.values())
    crash(p)
    first, second = store.offsets("t", 0)
    damaged = bytearray(store.get("t", 0, second))
    damaged[-1] ^= 0xFF
    store.put("t", 0, second, bytes(damaged))
    again = open_partition()
    assert again.snapshot_loaded_from == first
    assert entries_equal(again.producers.producers.values(), state)
    crash(again)
    store.put("t", 0, first, b"\x00\x01garbage")
    third = open_partition()
    assert third.snapshot_loaded_from == 0  # full log scan
    assert entries_equal(third.producers.producers.values(), state)


def test_only_a_few_snapshots_are_kept(open_partition, store):
    p = open_partition(config=PartitionConfig(LogConfig(), snapshots_retained=2))
    for i in range(5):
        p.append(valid(make_batch(1)))
        assert p.take_snapshot()
    assert not p.take_snapshot()  # the log end did not move
    assert store.offsets("t", 0) == [4, 5]


def test_periodic_snapshot_needs_the_interval_and_progress(open_partition, store, clock):
    p = open_partition(config=PartitionConfig(LogConfig(), snapshot_interval_ms=1000))
    p.append(valid(make_batch(1)))
    assert not p.maybe_snapshot()
    clock.advance(1000)
    assert p.maybe_snapshot()
    clock.advance(1000)
    assert not p.maybe_snapshot()
    p.append(valid(make_batch(1)))
    assert not p.maybe_snapshot()
    clock.advance(1000)
    assert p.maybe_snapshot() and store.offsets("t", 0) == [1, 2]


def test_a_missing_aborted_entry_is_restored_on_replay(open_partition):
    p = open_partition()
    p.append(valid(make_batch(1, pid=1, seq=0, txn=True)))
    p.append(valid(make_batch(1, pid=2, seq=0, txn=True)))
    p.write_marker(1, 0, False, 0)
    crash(p)
    p.log.active_segment.txn_index_path.write_bytes(b"")  # crash between marker and index write
    again = open_partition()
    assert again.log.active_segment.aborted == [AbortedTxn(1, 0, 2, 1)]
    assert again.last_stable_offset == 1


def test_aborted_entries_lost_in_a_machine_crash_are_rebuilt_below_a_snapshot(open_partition, store):
    """A machine crash after the ABORT marker reached the disk but before its
    aborted-index entry did, with a producer-state snapshot taken after the marker and
    never covered by a flush: recovery drops the snapshot (it is past the recovery
    point) and rebuilds the entry from the marker, so read_committed still skips the
    aborted records."""
    p = open_partition()
    p.append(valid(make_batch(1, pid=1, seq=0, txn=True)))
    p.append(valid(make_batch(1, pid=2, seq=0)))
    p.write_marker(1, 0, False, 0)
    p.append(valid(make_batch(1, pid=2, seq=1)))
    entries = list(p.log.active_segment.aborted)
    assert [(e.producer_id, e.first_offset, e.last_offset) for e in entries] == [(1, 0, 2)]
    end = p.log_end_offset
    # A snapshot written without the log being flushed (what the store may hold after
    # a crash), then the index entry lost with the page cache.
    store.put("t", 0, end, p.producers.encode_snapshot(), sync=True)
    assert p.log.recovery_point < end
    crash(p)
    p.log.active_segment.txn_index_path.write_bytes(b"")
    again = open_partition()
    assert store.offsets("t", 0) == [] and again.snapshot_loaded_from == 0  # replayed from the start
    assert again.log.active_segment.aborted == entries
    assert again.fetch(0, 1 << 30, isolation_level=1).aborted == ((1, 0),)


def test_a_snapshot_is_taken_only_at_a_flushed_offset(open_partition, store):
    p = open_partition()
    p.append(valid(make_batch(1, pid=1, seq=0, txn=True)))
    p.write_marker(1, 0, False, 0)
    assert p.log.recovery_point < p.log_end_offset
    assert p.take_snapshot()
    assert store.offsets("t", 0) == [p.log_end_offset] and p.log.recovery_point == p.log_end_offset
    crash(p)
    again = open_partition()
    assert again.snapshot_loaded_from == 2  # trusted: the log was flushed up to it


def test_a_restored_aborted_entry_keeps_the_index_in_marker_order(open_partition):
    p = open_partition()
    for pid in (1, 2):
        p.append(valid(make_batch(1, pid=pid, seq=0, txn=True)))
    p.write_marker(1, 0, False, 0)
    p.write_marker(2, 0, False, 0)
    entries = list(p.log.active_segment.aborted)
    crash(p)
    path = p.log.active_segment.txn_index_path
    path.write_bytes(entries[1].encode())  # only the later entry reached the disk
    again = open_partition()
    assert again.log.active_segment.aborted == entries
    assert path.read_bytes() == b"".join(e.encode() for e in entries)


def test_transactions_survive_a_crash_across_segment_rolls(open_partition):
    p = open_partition()
    for i in range(30):
        p.append(valid(make_batch(2, pid=1, seq=2 * i, txn=True)))
        p.append(valid(make_batch(2, pid=2, seq=2 * i)))
    p.write_marker(1, 0, False, 0)
    assert len(p.log.segments) > 2
    aborted = [e for s in p.log.segments for e in s.aborted]
    crash(p)
    again = open_partition()
    assert [e for s in again.log.segments for e in s.aborted] == aborted
    res = again.fetch(0, 1 << 30, isolation_level=1)
    assert res.aborted == ((1, 0),)


def test_pids_expire_after_the_configured_idle_time(open_partition, clock):
    p = open_partition(config=PartitionConfig(LogConfig(), producer_id_expiration_ms=60_000))
    p.append(valid(make_batch(1, pid=1, seq=0, ts=clock())))
    p.append(valid(make_batch(1, pid=2, seq=0, ts=clock(), txn=True)))
    clock.advance(60_000)
    assert p.expire_producers() == [1]
    assert p.append(valid(make_batch(1, pid=1, seq=1, ts=clock()))).error == ErrorCode.UNKNOWN_PRODUCER_ID


def test_settings_resolution():
    cfg = PartitionConfig.from_settings({"log.segment.bytes": "5000", "index.interval.bytes": "100",
                                         "producer.id.expiration.ms": "10"},
                                        {"segment.bytes": "7000"})
    assert cfg.log.segment_bytes == 7000 and cfg.log.index_interval_bytes == 100
    assert cfg.producer_id_expiration_ms == 10 and cfg.snapshot_interval_ms == 30000
    assert PartitionConfig.from_settings({"log.segment.bytes": "5000"}).log.segment_bytes == 5000
    with pytest.raises(ValueError, match="segment.bytes"):
        PartitionConfig.from_settings({}, {"segment.bytes": "big"})


@pytest.mark.parametrize("codec", [records.COMPRESSION_SNAPPY, records.COMPRESSION_LZ4, records.COMPRESSION_ZSTD])
def test_compressed_batches_are_stored_as_sent(open_partition, codec):
    p = open_partition()
    batch = records.encode_batch([(b"k", b"v" * 300, (), 1)], compression=codec)
    assert p.append(valid(batch)).error == ErrorCode.NONE
    stored = log_bytes(p)
    assert stored[16:] == batch[16:]  # byte for byte but the base offset and leader epoch the leader sets


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_an_unknown_compression_codec_is_refused_and_the_log_is_unchanged(open_partition, codec):
    p = open_partition()
    buf = bytearray(records.encode_batch([(b"k", b"v", (), 1)]))
    buf[22] = (buf[22] & ~records.COMPRESSION_MASK) | codec  # attributes (int16 at 21; low byte), fresh CRC
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    res = ValidatedBatch.check(bytes(buf))
    assert res.error == ErrorCode.INVALID_REQUEST and "compression" in res.message
    assert p.log_end_offset == 0
