"""The v2 record codec (exactly_wire.records): what encode_batch writes,
decode_records reads back exactly, whatever the sizes (one-, two- and longer
varints: the decoder's fast paths and its general loop), and a damaged record body
is a CorruptRecordError, never an IndexError or a wrong record. Seeded random cases,
so a failure names its seed."""
from __future__ import annotations

import random

import pytest

from exactly_wire import records

# Value sizes around the varint boundaries: 1 byte below 64, 2 bytes below 8 KiB, 3 above.
SIZES = [0, 1, 63, 64, 65, 127, 128, 1000, 8191, 8192, 8193, 70_000]


def _case(rng: random.Random):
    base_ts = 1_700_000_000_000 + rng.randrange(10 ** 9)
    out = []
    for _ in range(rng.randrange(1, 40)):
        key = None if rng.random() < 0.3 else rng.randbytes(rng.choice(SIZES[:6]))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.choice(SIZES))
        headers = tuple((f"h{j}-" + "x" * rng.choice([0, 70, 200]),
                         None if rng.random() < 0.2 else rng.randbytes(rng.choice(SIZES[:7])))
                        for j in range(rng.choice([0, 0, 1, 3])))
        ts = base_ts + rng.choice([0, 1, 63, 64, 9000, 10 ** 7, -5])
        out.append((key, value, headers, ts))
    return out


@pytest.mark.parametrize("seed", range(60))
def test_decode_reads_back_what_encode_wrote(seed):
    rng = random.Random(seed)
    recs = _case(rng)
    base_offset = rng.choice([0, 5, 2 ** 40])
    batch = records.encode_batch(recs, base_offset=base_offset)
    assert records.validate_records(batch) is None
    got = records.decode_records(batch)
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in got] == \
        [(base_offset + i, k, v, h, ts) for i, (k, v, h, ts) in enumerate(recs)]


@pytest.mark.parametrize("seed", range(40))
def test_a_damaged_body_is_corruption_not_a_crash(seed):
    """Cut the record body short, or overwrite bytes in it (CRC not checked here:
    the decoder itself must hold), and decoding raises CorruptRecordError or, for a
    change that still parses, returns records without raising anything else."""
    rng = random.Random(1000 + seed)
    batch = bytearray(records.encode_batch(_case(rng)))
    h = records.parse_header(batch)
    body_start = records.HEADER_SIZE
    if rng.random() < 0.5:
        cut = rng.randrange(body_start, len(batch))
        damaged = batch[:cut]
        damaged[8:12] = (len(damaged) - records.LOG_OVERHEAD).to_bytes(4, "big")  # batchLength follows the cut
        with pytest.raises(records.CorruptRecordError):
            records.decode_records(bytes(damaged))
    else:
        for _ in range(rng.randrange(1, 6)):
            batch[rng.randrange(body_start, len(batch))] = rng.randrange(256)
        try:
            got = records.decode_records(bytes(batch), 0, h)
        except records.CorruptRecordError:
            return
        assert len(got) == h.record_count


def _single(key: bytes, value: bytes | None, ts: int, producer_id: int = 7, producer_epoch: int = 2) -> bytes:
    return records.encode_batch([(key, value, (), ts)], producer_id=producer_id, producer_epoch=producer_epoch,
                                base_sequence=records.NO_SEQUENCE)


def test_merge_batches_keeps_every_record_in_order_with_its_timestamp():
    big = b"v" * 300  # a record length that needs a two-byte varint
    batches = [_single(b"t1", b"a", 1_000), _single(b"t2", None, 995),
               records.encode_batch([(b"t3", big, (("h", b"x"),), 1_010), (b"t4", b"d", (), 1_020)],
                                    producer_id=7, producer_epoch=2, base_sequence=records.NO_SEQUENCE)]
    merged = records.merge_batches(batches)
    header = records.verify_crc(merged)
    assert records.validate_records(merged, header) is None
    assert (header.record_count, header.last_offset_delta, header.base_timestamp, header.max_timestamp) == \
        (4, 3, 1_000, 1_020)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, records.NO_SEQUENCE)
    got = records.decode_records(merged)
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in got] == [
        (0, b"t1", b"a", (), 1_000), (1, b"t2", None, (), 995), (2, b"t3", big, (("h", b"x"),), 1_010),
        (3, b"t4", b"d", (), 1_020)]


def test_merge_batches_refuses_what_one_batch_cannot_hold():
    a = _single(b"k", b"v", 1)
    assert records.merge_batches([a]) is None
    assert records.merge_batches([a, _single(b"k", b"v", 2, producer_epoch=3)]) is None  # another writer epoch
    assert records.merge_batches([a, records.encode_batch([(b"k", b"v", (), 2)], producer_id=7, producer_epoch=2,
                                                          base_sequence=5)]) is None  # a sequence
    assert records.merge_batches([a, records.encode_control_batch(True, 7, 2, 0, 2)]) is None  # a marker
    assert records.merge_batches([a, records.encode_batch([(b"k", b"v", (), 2)], producer_id=7, producer_epoch=2,
                                                          compression=records.COMPRESSION_GZIP)]) is None
    assert records.merge_batches([a, a[:-1]]) is None  # truncated
    assert records.merge_batches([a, b"not a batch"]) is None
