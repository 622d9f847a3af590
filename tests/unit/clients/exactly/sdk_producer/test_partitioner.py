"""Default partitioner: Kafka's murmur2 for keys, sticky for keyless records (KIP-480)."""
import os
import random

import pytest

from exactly._accumulator import StickyPartitioner, murmur2, partition_for_key

# org.apache.kafka.common.utils.UtilsTest#testMurmur2
KAFKA_KNOWN = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("data,expected", sorted(KAFKA_KNOWN.items()))
def test_murmur2_matches_kafka_known_values(data, expected):
    assert murmur2(data) == expected


def test_murmur2_matches_kafka_python_for_all_tail_lengths():
    kp = pytest.importorskip("kafka.partitioner.default")
    rng = random.Random(7)
    for n in list(range(0, 40)) + [255, 1024]:
        for _ in range(10):
            data = bytes(rng.randrange(256) for _ in range(n))
            assert murmur2(data) & 0x7FFFFFFF == kp.murmur2(data) & 0x7FFFFFFF


def test_partition_for_key_matches_kafka_default_partitioner():
    kp = pytest.importorskip("kafka.partitioner.default")
    parts = list(range(12))
    for i in range(500):
        key = f"order-{i}".encode()
        # kafka-python's DefaultPartitioner.partition: all_partitions[(murmur2(key) & 0x7fffffff) % n]
        assert partition_for_key(key, 12) == parts[(kp.murmur2(key) & 0x7FFFFFFF) % len(parts)]


def test_partition_for_key_is_non_negative():
    for _ in range(200):
        assert 0 <= partition_for_key(os.urandom(9), 7) < 7


def test_sticky_partitioner_sticks_until_new_batch():
    sp = StickyPartitioner(random.Random(1))
    parts = [0, 1, 2, 3]
    first = sp.partition("t", parts)
    assert all(sp.partition("t", parts) == first for _ in range(10))
    nxt = sp.on_new_batch("t", parts, first)
    assert nxt != first and sp.partition("t", parts) == nxt
    # a second caller reporting the old partition does not move it again
    assert sp.on_new_batch("t", parts, first) == nxt


def test_sticky_partitioner_single_partition():
    sp = StickyPartitioner()
    assert sp.partition("t", [0]) == 0
    assert sp.on_new_batch("t", [0], 0) == 0
