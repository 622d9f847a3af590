"""The restart benchmark's partition (bench/recovery.py `build_partition`) holds what
the leader itself would have written: every batch passes a full recovery scan
(CRC32C, offsets), and the producer state rebuilt from the log by a leader is the
snapshot the builder stored, also when a partition is grown from one size to the
next."""
from __future__ import annotations

from bench.recovery import _delete_snapshots, build_partition
from exactly_wire import records
from services.partition_leader.log import RECOVERY_POINT_FILE, Log
from services.partition_leader.partition import Partition, PartitionConfig
from services.partition_leader.snapshot_store import SnapshotStore

TOPIC = "bench-restart"


def test_the_built_partition_is_what_a_scan_rebuilds(tmp_path):
    first = build_partition(tmp_path, TOPIC, 7_000, 300)
    grown = build_partition(tmp_path, TOPIC, 20_000, 300)
    assert (first["log_end_offset"], grown["log_end_offset"], grown["appended"]) == (7_000, 20_000, 13_000)
    store = SnapshotStore(tmp_path / "producer-state")
    built = store.get(TOPIC, 0, 20_000)
    store.close()
    directory = tmp_path / "logs" / f"{TOPIC}-0"
    (directory / RECOVERY_POINT_FILE).unlink()  # check every batch's CRC32C and offsets
    plog = Log.open(directory)
    assert plog.recovery_scanned and plog.recovered_bytes == 0 and plog.log_end_offset == 20_000
    seqs = {}
    for b in plog.batches(0):
        h = b.header
        assert h.record_count == 1 and h.producer_epoch == 0 and records.decode_records(b.read())[0].value == \
            b"v%09d" % h.base_offset
        assert h.base_sequence == seqs.get(h.producer_id, -1) + 1
        seqs[h.producer_id] = h.base_sequence
    assert len(seqs) == 300
    plog.close()
    _delete_snapshots(tmp_path, TOPIC)
    store = SnapshotStore(tmp_path / "producer-state")
    p = Partition.open(TOPIC, 0, tmp_path, PartitionConfig(), store, single_replica=False, leader_epoch=-1)
    assert p.snapshot_loaded_from is None and p.producers.encode_snapshot() == built
    p.log.close()
    store.close()
