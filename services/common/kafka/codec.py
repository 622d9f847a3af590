"""Kafka protocol messages through `kio` (dataclasses generated from Kafka's own JSON
message schemas, every version): request and response header handling, and a
version-independent way to build responses (docs/design.md, "Kafka protocol").

Handlers work with plain values: they read request fields by name (`field(req, name,
default)`, absent in older versions -> default) and return responses as nested dicts
of plain Python values (ints for error codes and millisecond durations, bytes, lists
of dicts). `build(cls, value)` turns such a dict into the kio entity of the version
asked for, keeping only the fields that version has and converting to kio's types
(ErrorCode, timedelta, UUID, ...).
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import struct
import types
import typing
import uuid
from typing import Any, Callable

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.index import api_key_map
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

API_VERSIONS_KEY = 18
NULL_UUID = uuid.UUID(int=0)


class ProtocolError(ValueError):
    """A frame that cannot be a Kafka request (the connection is closed)."""


@functools.cache
def request_class(api_key: int, version: int) -> type:
    """The kio request dataclass of `api_key` at `version`; KeyError when unknown."""
    module = load_payload_module(api_key, version, EntityType.request)
    return _payload_class(module, "Request")


@functools.cache
def response_class(api_key: int, version: int) -> type:
    module = load_payload_module(api_key, version, EntityType.response)
    return _payload_class(module, "Response")


def _payload_class(module, suffix: str) -> type:
    for name in dir(module):
        obj = getattr(module, name)
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and name.endswith(suffix) and \
                getattr(obj, "__type__", None) in (EntityType.request, EntityType.response):
            return obj
    raise KeyError(module.__name__)


def api_name(api_key: int) -> str:
    return api_key_map.get(api_key, f"api-{api_key}")


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api key, api version, correlation id) of a request frame (without the size
    prefix); ProtocolError when it is too short."""
    if len(frame) < 8:
        raise ProtocolError(f"request of {len(frame)} bytes is shorter than a request header")
    return (int.from_bytes(frame[0:2], "big", signed=True), int.from_bytes(frame[2:4], "big", signed=True),
            int.from_bytes(frame[4:8], "big", signed=True))


def decode_request(frame: bytes, api_key: int, version: int) -> tuple[Any, Any]:
    """(header, request entity) of a frame whose API and version are supported.
    Header v2 for flexible versions, v1 otherwise. Raises ProtocolError when the
    body does not parse."""
    cls = request_class(api_key, version)
    header_cls = RequestHeaderV2 if cls.__flexible__ else RequestHeaderV1
    try:
        header, used = entity_reader(header_cls)(frame, 0)
        body, size = entity_reader(cls)(frame, used)
    except Exception as exc:  # noqa: BLE001 - kio raises assorted errors on malformed input
        raise ProtocolError(f"malformed {api_name(api_key)} v{version} request: {exc!r}") from None
    return header, body


def encode_response(api_key: int, version: int, correlation_id: int, value: dict) -> bytes:
    """A size-prefixed response frame. Response header v1 (tagged fields) for flexible
    versions, except ApiVersions, whose response header is always v0 (KIP-511).
    The responses of every transaction (Produce, AddPartitionsToTxn, EndTxn) are
    written by `_hot_encoder`'s writers, byte for byte what kio writes; the others
    (and a hot one whose dict lacks a field) through kio."""
    hot = _hot_encoder(api_key, version)
    if hot is not None:
        try:
            body = hot(value)
        except KeyError:  # a field left to its default: kio knows it
            pass
        else:
            flexible = version >= _HOT_FLEXIBLE_FROM[api_key]
            header = _I32.pack(correlation_id) + (b"\0" if flexible else b"")
            return _I32.pack(len(header) + len(body)) + header + body
    return _kio_response(api_key, version, correlation_id, value)


def _kio_response(api_key: int, version: int, correlation_id: int, value: dict) -> bytes:
    """`encode_response` through kio, for every API."""
    cls = response_class(api_key, version)
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    if cls.__flexible__ and api_key != API_VERSIONS_KEY:
        entity_writer(ResponseHeaderV1)(out, ResponseHeaderV1(correlation_id=correlation_id))
    else:
        entity_writer(ResponseHeaderV0)(out, ResponseHeaderV0(correlation_id=correlation_id))
    entity_writer(cls)(out, build(cls, value))
    data = bytearray(out.getbuffer())
    data[0:4] = (len(data) - 4).to_bytes(4, "big")
    return bytes(data)


# ------------------------------------------------------------ hot responses
# Kafka's message schemas (clients/src/main/resources/common/message/*Response.json):
# the first flexible version of each hot API, and what each version has.
PRODUCE_KEY, ADD_PARTITIONS_TO_TXN_KEY, END_TXN_KEY = 0, 24, 26
_HOT_FLEXIBLE_FROM = {PRODUCE_KEY: 9, ADD_PARTITIONS_TO_TXN_KEY: 3, END_TXN_KEY: 3}
_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_KAFKA_ERROR_CODES = frozenset(int(e.value) for e in KioErrorCode)


def _error(code: int) -> bytes:
    """An error code as Kafka clients read it: an Exactly-only one is UNKNOWN_SERVER_ERROR (-1), as `_convert`."""
    code = int(code)
    return _I16.pack(code if code in _KAFKA_ERROR_CODES else -1)


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _array_length(n: int, flexible: bool) -> bytes:
    return _uvarint(n + 1) if flexible else _I32.pack(n)


def _string(s: str, flexible: bool) -> bytes:
    data = s.encode()
    return (_uvarint(len(data) + 1) if flexible else _I16.pack(len(data))) + data


def _nullable_string(s: str | None, flexible: bool) -> bytes:
    if s is None:
        return b"\0" if flexible else _I16.pack(-1)
    return _string(s, flexible)


def _produce_response(version: int) -> Callable[[dict], bytes]:
    """ProduceResponse v3-9: log_start_offset from v5, record_errors and
    error_message from v8, flexible from v9; throttle_time_ms last."""
    flexible, start, errors = version >= 9, version >= 5, version >= 8
    tags = b"\0" if flexible else b""

    def encode(value: dict) -> bytes:
        out = [_array_length(len(value["responses"]), flexible)]
        for topic in value["responses"]:
            parts = topic["partition_responses"]
            out += (_string(topic["name"], flexible), _array_length(len(parts), flexible))
            for p in parts:
                append_time = p["log_append_time"]
                out += (_I32.pack(p["index"]), _error(p["error_code"]), _I64.pack(p["base_offset"]),
                        _I64.pack(-1 if append_time is None else append_time))
                if start:
                    out.append(_I64.pack(p["log_start_offset"]))
                if errors:
                    record_errors = p.get("record_errors") or ()
                    out.append(_array_length(len(record_errors), flexible))
                    for e in record_errors:
                        out += (_I32.pack(e["batch_index"]),
                                _nullable_string(e["batch_index_error_message"], flexible), tags)
                    out.append(_nullable_string(p["error_message"], flexible))
                out.append(tags)
            out.append(tags)
        out += (_I32.pack(value["throttle_time"]), tags)
        return b"".join(out)
    return encode


def _add_partitions_to_txn_response(version: int) -> Callable[[dict], bytes]:
    """AddPartitionsToTxnResponse v0-3 (results_by_topic_v3_and_below), flexible from v3."""
    flexible = version >= 3
    tags = b"\0" if flexible else b""

    def encode(value: dict) -> bytes:
        topics = value["results_by_topic_v3_and_below"]
        out = [_I32.pack(value["throttle_time"]), _array_length(len(topics), flexible)]
        for topic in topics:
            parts = topic["results_by_partition"]
            out += (_string(topic["name"], flexible), _array_length(len(parts), flexible))
            for p in parts:
                out += (_I32.pack(p["partition_index"]), _error(p["partition_error_code"]), tags)
            out.append(tags)
        out.append(tags)
        return b"".join(out)
    return encode


def _end_txn_response(version: int) -> Callable[[dict], bytes]:
    """EndTxnResponse v0-4, flexible from v3 (v5's producer id and epoch are not served)."""
    tags = b"\0" if version >= 3 else b""

    def encode(value: dict) -> bytes:
        return _I32.pack(value["throttle_time"]) + _error(value["error_code"]) + tags
    return encode


_HOT_VERSIONS = {PRODUCE_KEY: (range(3, 10), _produce_response),
                 ADD_PARTITIONS_TO_TXN_KEY: (range(0, 4), _add_partitions_to_txn_response),
                 END_TXN_KEY: (range(0, 5), _end_txn_response)}


@functools.cache
def _hot_encoder(api_key: int, version: int) -> Callable[[dict], bytes] | None:
    """The body writer of a hot response (`encode_response`), None for the others.
    A writer raises KeyError for a dict without one of its fields."""
    versions, make = _HOT_VERSIONS.get(api_key, ((), None))
    return make(version) if version in versions else None


def field(entity: Any, name: str, default: Any = None) -> Any:
    """A request field by name; `default` when this version does not have it. kio's
    durations (timedelta) come back as ms, ErrorCode as int, UUIDs as UUID."""
    value = getattr(entity, name, default)
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, KioErrorCode):
        return int(value.value)
    return value


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any, dict, Any], ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else dataclasses.MISSING
        out.append((f.name, hints[f.name], dict(f.metadata), default))
    return tuple(out)


def _element_class(tp: Any) -> type | None:
    """The entity class of a `tuple[X, ...]` (or optional) field, None for primitives."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is not type(None):
                return _element_class(arg)
        return None
    if origin is tuple:
        inner = typing.get_args(tp)[0]
        return inner if dataclasses.is_dataclass(inner) else None
    return tp if dataclasses.is_dataclass(tp) else None


def _convert(kafka_type: str, value: Any) -> Any:
    if value is None:
        return None
    if kafka_type == "error_code":
        try:
            return KioErrorCode(int(value))
        except ValueError:  # an Exactly-only code (e.g. the KIP-447 draft's): Kafka clients see it as unknown
            return KioErrorCode.unknown_server_error
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=int(value))
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(int(value) / 1000, tz=datetime.timezone.utc)
    if kafka_type == "uuid":
        return value if isinstance(value, uuid.UUID) else NULL_UUID
    return value


def build(cls: type, value: dict) -> Any:
    """The kio entity `cls` from a dict of plain values (see the module docstring).
    Missing fields take their schema default, else a zero value of their type (an
    empty array for arrays, nullable ones included). The per-class work (type hints,
    which fields are entities or arrays, each field's conversion) is done once per
    class (`_plan`), so a response costs only its own values."""
    kwargs = {}
    for name, sub, array, convert, zero in _plan(cls):
        if name in value:
            v = value[name]
            if sub is not None and v is not None:
                if array or isinstance(v, (list, tuple)):
                    v = tuple(build(sub, x) if isinstance(x, dict) else x for x in v)
                elif isinstance(v, dict):
                    v = build(sub, v)
            elif convert is not None:
                v = tuple(convert(x) for x in v) if isinstance(v, (list, tuple)) else convert(v)
            kwargs[name] = v
        elif zero is not _HAS_DEFAULT:
            kwargs[name] = build(sub, {}) if zero is _ENTITY_ZERO else zero
    return cls(**kwargs)


_HAS_DEFAULT, _ENTITY_ZERO = object(), object()
# kio field types whose plain values `_convert` changes (others pass as they are).
_CONVERTED_TYPES = frozenset({"error_code", "timedelta_i32", "timedelta_i64", "datetime_i64", "uuid"})


@functools.cache
def _plan(cls: type) -> tuple[tuple[str, type | None, bool, Any, Any], ...]:
    """Per field of `cls`: (name, entity class or None, is an array, converter of a
    plain value or None when it passes as is, zero value: `_HAS_DEFAULT` when the
    schema has a default, `_ENTITY_ZERO` for an entity built empty)."""
    out = []
    for name, tp, meta, default in _fields(cls):
        sub = _element_class(tp)
        kafka_type = meta.get("kafka_type", "")
        convert = functools.partial(_convert, kafka_type) if kafka_type in _CONVERTED_TYPES else None
        if default is not dataclasses.MISSING:
            zero = _HAS_DEFAULT
        elif sub is not None and not _is_array(tp):
            zero = _ENTITY_ZERO
        else:
            zero = _zero(tp, meta, sub)
        out.append((name, sub, _is_array(tp), convert, zero))
    return tuple(out)


def _is_array(tp: Any) -> bool:
    """Whether `tp` is an array field: `tuple[X, ...]`, or `tuple[X, ...] | None` for a
    nullable one (e.g. CreateTopics v5+ `configs`)."""
    origin = typing.get_origin(tp)
    if origin is tuple:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(typing.get_origin(arg) is tuple for arg in typing.get_args(tp))
    return False


def _zero(tp: Any, meta: dict, sub: type | None) -> Any:
    if _is_array(tp):
        return ()
    if sub is not None:
        return build(sub, {})
    kafka_type = meta.get("kafka_type", "")
    if kafka_type == "error_code":
        return KioErrorCode(0)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kafka_type == "uuid":
        return NULL_UUID
    if kafka_type == "string":
        return ""
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "bool":
        return False
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(0, tz=datetime.timezone.utc)
    return 0
