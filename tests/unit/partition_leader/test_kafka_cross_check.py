"""Segment files written by the log decode with kafka-python's DefaultRecordBatch, an
independent implementation of record batch v2 (docs/design.md, "Wire and storage format": control type ABORT=0,
COMMIT=1 as Apache Kafka)."""
from __future__ import annotations

import struct
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python's own imports
    from kafka.record.default_records import DefaultRecordBatch
    from kafka.record.memory_records import MemoryRecords

from exactly_wire import records

from .conftest import make_batch


def test_segment_file_decodes_with_kafka_python(open_partition):
    p = open_partition(leader_epoch=2)
    p.append(make_batch(3, key=b"plain"))  # 0-2
    p.append(make_batch(2, pid=7, epoch=1, seq=0, txn=True, key=b"txn"))  # 3-4
    p.write_marker(7, 1, committed=True, coordinator_epoch=4)  # 5
    p.append(make_batch(1, pid=7, epoch=1, seq=2, txn=True, key=b"txn"))  # 6
    p.write_marker(7, 1, committed=False, coordinator_epoch=4)  # 7
    p.append(records.encode_batch([(b"g", b"z" * 500, (("h", b"v"),), 5)], compression=records.COMPRESSION_GZIP))
    data = p.log.active_segment.log_path.read_bytes()

    mem = MemoryRecords(data)
    seen = []
    while mem.has_next():
        batch = mem.next_batch()
        assert isinstance(batch, DefaultRecordBatch)
        assert batch.validate_crc()
        assert batch.leader_epoch == 2
        recs = list(batch)
        seen.append((batch.base_offset, batch.is_transactional, batch.is_control_batch, batch.producer_id))
        if batch.is_control_batch:
            assert len(recs) == 1
            version, ctype = struct.unpack(">hh", recs[0].key)
            _, coordinator_epoch = struct.unpack(">hi", recs[0].value)
            seen[-1] += (ctype, coordinator_epoch)
        else:
            assert [r.offset for r in recs] == list(range(batch.base_offset, batch.base_offset + len(recs)))
            assert batch.last_offset == recs[-1].offset
    assert seen == [
        (0, False, False, -1),
        (3, True, False, 7),
        (5, True, True, 7, 1, 4),  # COMMIT = 1
        (6, True, False, 7),
        (7, True, True, 7, 0, 4),  # ABORT = 0
        (8, False, False, -1),
    ]
    last_pos, _ = list(records.iter_batches(data))[-1]
    rec = next(iter(DefaultRecordBatch(data[last_pos:])))
    assert (rec.key, rec.value, rec.headers) == (b"g", b"z" * 500, [("h", b"v")])
