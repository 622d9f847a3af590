"""Input validation rules (services.common.transport.limits, the record framing check of
exactly_wire.records, the request guard's status mapping): pure functions, no
processes (docs/design.md, "Input validation and limits")."""
from __future__ import annotations

import struct

import crc32c
import grpc
import pytest
from kazoo.exceptions import ConnectionLoss

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from services.common.transport import limits
from services.common.transport.guard import status_for
from services.common.topic_config import validate_topic_configs


@pytest.mark.parametrize("name", ["a", "topic-1", "with.dot", "with_underscore", "A" * 249, "..a", "_x"])
def test_legal_topic_names(name):
    assert limits.validate_topic_name(name) is None


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "a/b", "a b", "é", "a\nb", "../x", "a\x00", "*"])
def test_illegal_topic_names(name):
    code, message = limits.validate_topic_name(name)
    assert code == ErrorCode.INVALID_TOPIC_EXCEPTION and message


def test_reserved_prefix_only_for_internal_topics():
    assert limits.validate_topic_name("__consumer_offsets")[0] == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert limits.validate_topic_name("__consumer_offsets", internal=True) is None


def test_dot_and_underscore_collide():
    code, message = limits.validate_topic_name("a_b", existing=["a.b", "c"])
    assert code == ErrorCode.INVALID_TOPIC_EXCEPTION and "a.b" in message
    assert limits.validate_topic_name("a.b", existing=["a.b"]) is None  # itself: TOPIC_ALREADY_EXISTS later
    assert limits.validate_topic_name("a-b", existing=["a.b", "a_c"]) is None


@pytest.mark.parametrize("count", [0, -1, -(1 << 31), 10001, 999_999, (1 << 31) - 1])
def test_partition_counts_out_of_range(count):
    assert limits.validate_partition_count("t", count, 0, {})[0] == ErrorCode.INVALID_PARTITIONS


def test_partition_limits_are_settings():
    assert limits.validate_partition_count("t", 10000, 0, {}) is None
    assert limits.validate_partition_count("t", 11, 0, {"max.partitions.per.topic": "10"})[0] == \
        ErrorCode.INVALID_PARTITIONS
    code, message = limits.validate_partition_count("t", 5, 96, {"max.partitions": "100"})
    assert code == ErrorCode.POLICY_VIOLATION and "101" in message
    assert limits.validate_partition_count("t", 4, 96, {"max.partitions": "100"}) is None


def test_replication_factor_against_live_leaders():
    assert limits.validate_replication_factor(3, 3) is None
    for rf, live in ((4, 3), (0, 3), (-1, 3), ((1 << 31) - 1, 3), (1, 0)):
        assert limits.validate_replication_factor(rf, live)[0] == ErrorCode.INVALID_REPLICATION_FACTOR


def test_batch_size_and_producer_epoch():
    assert limits.validate_batch_size(1048588, limits.DEFAULT_MESSAGE_MAX_BYTES) is None
    assert limits.validate_batch_size(1048589, limits.DEFAULT_MESSAGE_MAX_BYTES)[0] == ErrorCode.MESSAGE_TOO_LARGE
    assert limits.validate_producer_epoch(32767) is None
    for epoch in (-1, 32768, (1 << 31) - 1):
        assert limits.validate_producer_epoch(epoch)[0] == ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize("configs, ok", [
    ({"retention.ms": "-1"}, True), ({"retention.ms": "-2"}, False), ({"segment.bytes": "0"}, False),
    ({"segment.bytes": "1024"}, True), ({"min.insync.replicas": "0"}, False),
    ({"retention.bytes": "99999999999999999999"}, False), ({"max.message.bytes": "1000"}, True),
    ({"max.message.bytes": "-5"}, False), ({"flush.messages": "0"}, False), ({"segment.ms": "nan"}, False),
])
def test_topic_config_values_are_range_checked(configs, ok):
    assert (validate_topic_configs(configs) is None) == ok


def _batch(n: int = 3) -> bytearray:
    return bytearray(records.encode_batch([(b"k", b"v%d" % i, (("h", b"x"),), 1000 + i) for i in range(n)]))


def _recrc(b: bytearray) -> bytearray:
    struct.pack_into(">I", b, 17, crc32c.crc32c(bytes(b[21:])))
    return b


def test_record_framing_of_a_sound_batch():
    assert records.validate_records(_batch()) is None
    assert records.validate_records(records.encode_control_batch(True, 1, 0, 0, 1000)) is None


@pytest.mark.parametrize("count", [0, -1, 2, 4, 1000, (1 << 31) - 1])
def test_lying_record_count_is_refused(count):
    b = _batch(3)
    struct.pack_into(">i", b, 57, count)
    struct.pack_into(">i", b, 23, count - 1)
    assert records.validate_records(_recrc(b)) is not None


def test_lying_record_length_and_offset_delta_are_refused():
    b = _batch(1)
    b[records.HEADER_SIZE] = 0x7E  # record length varint 63: past the end
    assert "does not fit" in records.validate_records(_recrc(b))
    one = records.encode_record(5, 0, b"k", b"v")  # offset delta 5 in a one-record batch
    b = records.build_batch(one, 1, 0, 0, 0)
    assert "offset delta" in records.validate_records(b)


def test_guard_maps_exceptions_to_specific_statuses():
    assert status_for(ValueError("x")) == (grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_REQUEST)
    assert status_for(struct.error("x"))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert status_for(KeyError("x"))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert status_for(ConnectionLoss())[0] == grpc.StatusCode.UNAVAILABLE
    assert status_for(OSError(5, "EIO")) == (grpc.StatusCode.UNAVAILABLE, ErrorCode.KAFKA_STORAGE_ERROR)
    assert status_for(MemoryError())[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_for(RuntimeError("bug"))[0] == grpc.StatusCode.INVALID_ARGUMENT
