"""The Kafka protocol codec and the consumer-protocol helpers, without a server:
request framing through kio, version-independent responses, error-code mapping."""
from __future__ import annotations

import io
import struct

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v1.response import MetadataResponse as MetadataV1
from kio.schema.request_header.v2.header import RequestHeader
from kio.serial import entity_reader, entity_writer

from exactly_wire.error_codes import ErrorCode
from services.common.kafka import codec
from services.group_coordinator.kafka_api import encode_assignment, encode_subscription, subscribed_topics


def frame(api_key: int, version: int, correlation: int, body) -> bytes:
    out = io.BytesIO()
    entity_writer(RequestHeader)(out, RequestHeader(request_api_key=api_key, request_api_version=version,
                                                    correlation_id=correlation, client_id="t"))
    entity_writer(type(body))(out, body)
    return out.getvalue()


def test_requests_decode_with_their_header_version():
    data = frame(18, 3, 77, ApiVersionsRequest(client_software_name="x", client_software_version="1"))
    assert codec.peek_header(data) == (18, 3, 77)
    header, body = codec.decode_request(data, 18, 3)
    assert header.correlation_id == 77 and body.client_software_name == "x"
    with pytest.raises(codec.ProtocolError):
        codec.peek_header(b"\x00\x01")
    with pytest.raises(codec.ProtocolError):
        codec.decode_request(data[:12], 18, 3)


def test_responses_keep_only_the_fields_of_their_version():
    value = {"throttle_time": 5, "brokers": [{"node_id": 1, "host": "h", "port": 9092, "rack": None}],
             "cluster_id": "c", "controller_id": 1,
             "topics": [{"error_code": 3, "name": "t", "is_internal": False, "partitions": [],
                         "topic_authorized_operations": 0}]}
    v1 = codec.build(MetadataV1, value)  # v1 has no cluster_id, no throttle time
    assert v1.topics[0].error_code.value == 3 and v1.brokers[0].port == 9092
    encoded = codec.encode_response(3, 12, 9, value)
    size, correlation = struct.unpack(">ii", encoded[:8])
    assert size == len(encoded) - 4 and correlation == 9


def test_exactly_only_error_codes_become_unknown_server_error_for_kafka_clients():
    assert codec._convert("error_code", 1001).value == -1
    assert codec._convert("error_code", ErrorCode.PRODUCER_FENCED).value == ErrorCode.PRODUCER_FENCED
    assert codec._convert("timedelta_i32", 1500).total_seconds() == 1.5


def test_missing_fields_take_zero_values():
    built = codec.build(MetadataV1, {"brokers": [{"node_id": 1}]})
    assert built.brokers[0].host == "" and built.topics == ()


def test_missing_nullable_arrays_are_empty_and_encode():
    # CreateTopics v5+ `configs` is `tuple[CreatableTopicConfigs, ...] | None`.
    cls = codec.response_class(19, 7)
    built = codec.build(cls, {"topics": [{"name": "t", "error_code": 0}]})
    assert built.topics[0].configs == ()
    assert codec.build(cls, {"topics": [{"name": "t", "configs": None}]}).topics[0].configs is None
    frame = codec.encode_response(19, 7, 5, {"topics": [{"name": "t", "error_code": 0, "configs": [
        {"name": "retention.ms", "value": "60000", "config_source": 1}]}]})
    assert struct.unpack(">ii", frame[:8]) == (len(frame) - 4, 5)


def test_consumer_protocol_subscription_and_assignment():
    assert subscribed_topics(encode_subscription(["a", "b"])) == ["a", "b"]
    # A v1 subscription (owned partitions after the topics) reads the same topics.
    assert subscribed_topics(struct.pack(">h", 1) + encode_subscription(["x"])[2:] + b"\x00" * 8) == ["x"]
    with pytest.raises(ValueError):
        subscribed_topics(b"\x00")
    raw = encode_assignment([("t", [0, 2])])
    from kio.schema.consumer_protocol_assignment.v0.data import ConsumerProtocolAssignment
    decoded, _ = entity_reader(ConsumerProtocolAssignment)(raw, 2)
    assert [(tp.topic, list(tp.partitions)) for tp in decoded.assigned_partitions] == [("t", [0, 2])]


def test_every_advertised_version_has_request_and_response_schemas():
    """ApiVersions must never advertise a version the listener cannot decode or answer."""
    from services.common.kafka.listener import KafkaListener
    from services.common.kafka.surface import SURFACE
    apis = {**SURFACE, **KafkaListener({}).apis}
    checked = 0
    for key, api in apis.items():
        for version in range(api.min_version, api.max_version + 1):
            assert codec.request_class(key, version).__version__ == version
            assert codec.response_class(key, version).__version__ == version
            checked += 1
    assert len(apis) == 40 and checked > 120, (len(apis), checked)


def _produce_value(error_code: int, message, record_errors=None, append_time=-1):
    partition = {"index": 2, "error_code": error_code, "base_offset": 1 << 40, "log_append_time": append_time,
                 "log_start_offset": 7, "error_message": message}
    if record_errors is not None:
        partition["record_errors"] = record_errors
    return {"throttle_time": 12, "responses": [
        {"name": "tëst", "partition_responses": [partition, {**partition, "index": 3, "error_code": 0}]},
        {"name": "other", "partition_responses": []}]}


HOT_RESPONSES = [
    *((0, v, _produce_value(code, message, errors, append_time)) for v in range(3, 10)
      for code, message, errors, append_time in [
          (0, None, None, -1), (6, "not the leader", [], 1_700_000_000_123),
          (ErrorCode.INVALID_TXN_STATE, "", [{"batch_index": 1, "batch_index_error_message": None},
                                             {"batch_index": 4, "batch_index_error_message": "bad"}], None),
          (1001, None, None, -1)]),  # an Exactly-only code: UNKNOWN_SERVER_ERROR to Kafka clients
    *((24, v, {"throttle_time": t, "results_by_topic_v3_and_below": [
        {"name": "t", "results_by_partition": [{"partition_index": 0, "partition_error_code": code},
                                               {"partition_index": 9, "partition_error_code": 0}]},
        {"name": "ü" * 200, "results_by_partition": []}]}) for v in range(0, 4) for t, code in [(0, 0), (5, 51)]),
    *((26, v, {"throttle_time": t, "error_code": code, "producer_id": 5, "producer_epoch": 1})
      for v in range(0, 5) for t, code in [(0, 0), (30, 47), (0, 1001)]),
]


@pytest.mark.parametrize("api_key,version,value", HOT_RESPONSES)
def test_hot_responses_are_byte_for_byte_what_kio_writes(api_key, version, value):
    assert codec._hot_encoder(api_key, version) is not None
    assert codec.encode_response(api_key, version, 123456, value) == codec._kio_response(api_key, version, 123456,
                                                                                         value)


def test_a_hot_response_missing_a_field_goes_through_kio():
    value = {"error_code": 0}  # no throttle_time: kio's zero value
    assert codec.encode_response(26, 3, 1, value) == codec._kio_response(26, 3, 1, value)
    assert codec._hot_encoder(26, 5) is None and codec._hot_encoder(3, 12) is None
