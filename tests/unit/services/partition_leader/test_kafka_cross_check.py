"""Segment files written by the log decode with kafka-python's DefaultRecordBatch, an
independent implementation of record batch v2 (docs/design.md, "Wire and storage format": control type ABORT=0,
COMMIT=1 as Apache Kafka)."""
from __future__ import annotations

import struct
import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python's own imports
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
    from kafka.record.memory_records import MemoryRecords

from exactly_wire import records

from .conftest import make_batch, valid


def test_segment_file_decodes_with_kafka_python(open_partition):
    p = open_partition(leader_epoch=2)
    p.append(valid(make_batch(3, key=b"plain")))  # 0-2
    p.append(valid(make_batch(2, pid=7, epoch=1, seq=0, txn=True, key=b"txn")))  # 3-4
    p.write_marker(7, 1, committed=True, coordinator_epoch=4)  # 5
    p.append(valid(make_batch(1, pid=7, epoch=1, seq=2, txn=True, key=b"txn")))  # 6
    p.write_marker(7, 1, committed=False, coordinator_epoch=4)  # 7
    p.append(valid(records.encode_batch([(b"g", b"z" * 500, (("h", b"v"),), 5)], compression=records.COMPRESSION_GZIP)))
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


CODECS = [records.COMPRESSION_GZIP, records.COMPRESSION_SNAPPY, records.COMPRESSION_LZ4, records.COMPRESSION_ZSTD]


@pytest.mark.parametrize("codec", CODECS, ids=["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_decode_with_kafka_python(codec):
    """Every codec the SDK writes decodes with kafka-python's own decoder (python-snappy,
    lz4 and zstandard under it), beyond one snappy block (32 KiB) too."""
    recs = [(f"k{i}".encode(), (f"value {i} " * 900).encode(), (("h", b"v"),), 1000 + i) for i in range(12)]
    batch = records.encode_batch(recs, producer_id=7, producer_epoch=0, base_sequence=0, compression=codec)
    assert records.parse_header(batch).compression == codec
    decoded = DefaultRecordBatch(batch)
    assert decoded.validate_crc() and decoded.compression_type == codec
    assert [(r.key, r.value, r.headers, r.timestamp) for r in decoded] == \
        [(k, v, [("h", b"v")], ts) for k, v, _, ts in recs]


@pytest.mark.parametrize("codec", CODECS, ids=["gzip", "snappy", "lz4", "zstd"])
def test_kafka_python_compressed_batches_decode_here(codec):
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(5):
        builder.append(i, timestamp=2000 + i, key=f"k{i}".encode(), value=b"x" * 3000, headers=[])
    batch = bytes(builder.build())
    h = records.verify_crc(bytearray(batch))
    assert h.compression == codec
    assert [(r.key, r.value) for r in records.decode_records(batch, 0, h)] == \
        [(f"k{i}".encode(), b"x" * 3000) for i in range(5)]


def test_a_corrupt_compressed_blob_is_a_corrupt_record():
    batch = bytearray(records.encode_batch([(b"k", b"v" * 100, (), 1)], compression=records.COMPRESSION_ZSTD))
    batch[records.HEADER_SIZE + 4] ^= 0xFF
    with pytest.raises(records.CorruptRecordError):
        records.decode_records(bytes(batch))
