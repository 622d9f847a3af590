"""Kafka record batch format v2 (magic 2): encode, validate and decode.

Layout (docs/design.md, "Wire and storage format"; Kafka's DefaultRecordBatch), big-endian:

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8
    crc uint32 (CRC32C of attributes..end) | attributes int16 | lastOffsetDelta int32
    baseTimestamp int64 | maxTimestamp int64 | producerId int64 | producerEpoch int16
    baseSequence int32 | recordCount int32 | records...

Attributes: bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), bit 3 timestamp type,
bit 4 transactional, bit 5 control. A control batch holds one record whose key is
`version:int16, type:int16` (ABORT=0, COMMIT=1) and whose value is
`version:int16, coordinator_epoch:int32`.

This module is shared by the SDK and the services (one copy). The partition
leader only uses `parse_header`, `verify_crc` and `set_base_offset` on the
produce path; record decoding is for consumers and coordinators.
"""
from __future__ import annotations

import struct
from typing import Iterator, NamedTuple, Sequence

import crc32c as _crc32c

from . import compression as compression_codecs

MAGIC = 2
HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength
# Offsets of fields inside a batch
_CRC_OFFSET = 17
_ATTR_OFFSET = 21

COMPRESSION_MASK = 0x07
COMPRESSION_NONE = compression_codecs.NONE
COMPRESSION_GZIP = compression_codecs.GZIP
COMPRESSION_SNAPPY = compression_codecs.SNAPPY
COMPRESSION_LZ4 = compression_codecs.LZ4
COMPRESSION_ZSTD = compression_codecs.ZSTD
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20

CONTROL_ABORT = 0
CONTROL_COMMIT = 1

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")


class CorruptRecordError(ValueError):
    """A batch is malformed: bad length, magic, CRC or record encoding."""


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch on the wire / in the log."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK


class Record(NamedTuple):
    """One decoded record (a tuple: cheap to build for every record a consumer reads)."""

    offset: int
    timestamp: int  # ms
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def parse_header(buf: bytes | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the 61-byte header at `pos`. Raises CorruptRecordError when the buffer
    is too short, the magic is not 2, or batchLength is inconsistent."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptRecordError(f"record batch truncated: {len(buf) - pos} bytes < header {HEADER_SIZE}")
    h = BatchHeader._make(_HEADER.unpack_from(buf, pos))
    if h.magic != MAGIC:
        raise CorruptRecordError(f"unsupported record batch magic {h.magic}")
    if h.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptRecordError(f"batch length {h.batch_length} smaller than header")
    return h


def compute_crc(buf: bytes | memoryview, pos: int, size: int) -> int:
    return _crc32c.crc32c(memoryview(buf)[pos + _ATTR_OFFSET: pos + size])


def verify_crc(buf: bytes | memoryview, pos: int = 0, header: BatchHeader | None = None) -> BatchHeader:
    """Parse and check the batch at `pos` (length fits the buffer, CRC32C matches).
    Returns its header; raises CorruptRecordError otherwise."""
    h = header or parse_header(buf, pos)
    if pos + h.size > len(buf):
        raise CorruptRecordError(f"record batch truncated: needs {h.size} bytes, has {len(buf) - pos}")
    if compute_crc(buf, pos, h.size) != h.crc:
        raise CorruptRecordError("record batch CRC32C mismatch")
    return h


def set_base_offset(batch: bytearray, base_offset: int, pos: int = 0) -> None:
    """Rewrite baseOffset in place (not covered by the CRC)."""
    struct.pack_into(">q", batch, pos, base_offset)


def set_partition_leader_epoch(batch: bytearray, epoch: int, pos: int = 0) -> None:
    """Rewrite partitionLeaderEpoch in place (not covered by the CRC)."""
    struct.pack_into(">i", batch, pos + 12, epoch)


def iter_batches(buf: bytes | memoryview, verify: bool = False) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each whole batch in `buf`; a trailing partial
    batch is ignored (Fetch may cut at a byte limit). With verify=True, check CRCs."""
    pos, end = 0, len(buf)
    while end - pos >= HEADER_SIZE:
        h = parse_header(buf, pos)
        if pos + h.size > end:
            break
        if verify:
            verify_crc(buf, pos, h)
        yield pos, h
        pos += h.size


# ---------------------------------------------------------------- varints

def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _write_varint(out: bytearray, n: int) -> None:
    v = _zigzag(n) & 0xFFFFFFFFFFFFFFFF
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


_SMALL_VARINT = [bytes([(_zigzag(i) & 0x7F) | (0x80 if _zigzag(i) >= 0x80 else 0)]) +
                 (bytes([_zigzag(i) >> 7]) if _zigzag(i) >= 0x80 else b"")
                 for i in range(0, 8192)]


def _varint_bytes(n: int) -> bytes:
    if 0 <= n < 8192:
        return _SMALL_VARINT[n]
    out = bytearray()
    _write_varint(out, n)
    return bytes(out)


def _read_varint(buf, pos: int) -> tuple[int, int]:
    """(zigzag-decoded varint at `pos`, the position after it). One- and two-byte
    varints (every length below 8 KiB) take the fast paths."""
    try:
        b = buf[pos]
    except IndexError:
        raise CorruptRecordError("varint runs past the end of the batch") from None
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    if pos + 1 < len(buf):
        c = buf[pos + 1]
        if c < 0x80:
            u = (b & 0x7F) | (c << 7)
            return (u >> 1) ^ -(u & 1), pos + 2
    shift = 0
    result = 0
    while True:
        if pos >= len(buf):
            raise CorruptRecordError("varint runs past the end of the batch")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise CorruptRecordError("varint too long")
    return (result >> 1) ^ -(result & 1), pos


_MINUS_ONE = _varint_bytes(-1)
_ZERO = _varint_bytes(0)


def encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None,
                  value: bytes | None, headers: Sequence[tuple[str, bytes | None]] = ()) -> bytes:
    """One record (length-prefixed) of a v2 batch. The length is computed from the
    parts, so key and value are copied once (into the returned bytes)."""
    ts = _varint_bytes(timestamp_delta)
    od = _varint_bytes(offset_delta)
    if key is None:
        kl, key = _MINUS_ONE, b""
    else:
        kl = _varint_bytes(len(key))
    if value is None:
        vl, value = _MINUS_ONE, b""
    else:
        vl = _varint_bytes(len(value))
    hb = _encode_headers(headers) if headers else _ZERO
    n = 1 + len(ts) + len(od) + len(kl) + len(key) + len(vl) + len(value) + len(hb)
    return b"".join((_varint_bytes(n), b"\x00", ts, od, kl, key, vl, value, hb))


def _encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    parts = [_varint_bytes(len(headers))]
    for hk, hv in headers:
        hkb = hk.encode()
        parts.append(_varint_bytes(len(hkb)))
        parts.append(hkb)
        if hv is None:
            parts.append(_MINUS_ONE)
        else:
            parts.append(_varint_bytes(len(hv)))
            parts.append(hv)
    return b"".join(parts)


def build_batch(records_blob: bytes, record_count: int, base_timestamp: int, max_timestamp: int,
                last_offset_delta: int, *, base_offset: int = 0, producer_id: int = NO_PRODUCER_ID,
                producer_epoch: int = NO_PRODUCER_EPOCH, base_sequence: int = NO_SEQUENCE,
                transactional: bool = False, control: bool = False,
                compression: int = COMPRESSION_NONE, partition_leader_epoch: int = -1) -> bytes:
    """Frame already-encoded records (concatenated `encode_record` outputs) into a
    batch and compute its CRC32C. `compression`: a codec id of
    `exactly_wire.compression` (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd); ValueError
    for another."""
    if compression not in compression_codecs.CODECS:
        raise ValueError(f"unsupported compression type {compression}")
    records_blob = compression_codecs.compress(compression, records_blob)
    attributes = compression | (TRANSACTIONAL_BIT if transactional else 0) | (CONTROL_BIT if control else 0)
    batch_length = HEADER_SIZE - LOG_OVERHEAD + len(records_blob)
    header = bytearray(_HEADER.pack(base_offset, batch_length, partition_leader_epoch, MAGIC, 0,
                                    attributes, last_offset_delta, base_timestamp, max_timestamp,
                                    producer_id, producer_epoch, base_sequence, record_count))
    crc = _crc32c.crc32c(records_blob, _crc32c.crc32c(memoryview(header)[_ATTR_OFFSET:]))
    struct.pack_into(">I", header, _CRC_OFFSET, crc)
    return bytes(header) + records_blob


def encode_batch(records: Sequence[tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]], int]],
                 **kwargs) -> bytes:
    """Encode `records` as (key, value, headers, timestamp_ms) into one batch.
    Keyword arguments as `build_batch` (producer_id, base_sequence, transactional, ...)."""
    if not records:
        raise ValueError("a record batch holds at least one record")
    base_ts = records[0][3]
    max_ts = base_ts
    blobs = []
    for i, (key, value, headers, ts) in enumerate(records):
        if ts > max_ts:
            max_ts = ts
        blobs.append(encode_record(i, ts - base_ts, key, value, headers))
    return build_batch(b"".join(blobs), len(records), base_ts, max_ts, len(records) - 1, **kwargs)


def encode_control_batch(committed: bool, producer_id: int, producer_epoch: int,
                         coordinator_epoch: int, timestamp_ms: int, base_offset: int = 0) -> bytes:
    """A transaction marker: a transactional control batch with one record."""
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if committed else CONTROL_ABORT)
    value = _CONTROL_VALUE.pack(0, coordinator_epoch)
    return encode_batch([(key, value, (), timestamp_ms)], base_offset=base_offset,
                        producer_id=producer_id, producer_epoch=producer_epoch,
                        base_sequence=NO_SEQUENCE, transactional=True, control=True)


def decode_control_record(record: Record) -> tuple[int, int]:
    """(control type, coordinator epoch) of a control batch's record."""
    if record.key is None or len(record.key) < 4:
        raise CorruptRecordError("control record key too short")
    _, ctype = _CONTROL_KEY.unpack_from(record.key)
    epoch = -1
    if record.value is not None and len(record.value) >= 6:
        _, epoch = _CONTROL_VALUE.unpack_from(record.value)
    return ctype, epoch


MIN_RECORD_SIZE = 7  # length, attributes, timestamp delta, offset delta, key, value, header count


def validate_records(buf: bytes | bytearray | memoryview, header: BatchHeader | None = None,
                     pos: int = 0) -> str | None:
    """Check the framing of the records of the batch at `pos` without building them
    (Kafka's LogValidator, for the partition leader's produce path): exactly
    `record_count` records, offset deltas 0..count-1 in order, every length and
    varint inside its record and the last record ending at the batch's end, no
    negative lengths other than -1 (null). Returns None when sound, else what is
    wrong. Of a compressed batch only the record count (at least 1) is checked: its
    records are not decompressed on the produce path."""
    h = header or parse_header(buf, pos)
    body_len = h.size - HEADER_SIZE
    if h.record_count < 1 or (h.compression == COMPRESSION_NONE and
                              h.record_count * MIN_RECORD_SIZE > body_len):
        return f"record count {h.record_count} does not fit {body_len} bytes of records"
    if h.compression != COMPRESSION_NONE:
        return None
    # Walked in place (no copy of the records) when the batch is bytes or a bytearray.
    body = buf if isinstance(buf, (bytes, bytearray)) else bytes(buf)
    p = pos + HEADER_SIZE
    limit = pos + h.size
    if len(body) < limit:
        return f"the batch is {len(body) - pos} bytes, its header says {h.size}"
    read = _read_varint
    try:
        for i in range(h.record_count):
            b = body[p]  # IndexError past the end: caught below
            if b < 0x80:
                length, p = (b >> 1) ^ -(b & 1), p + 1
            elif body[p + 1] < 0x80:  # two bytes: records below 8 KiB
                u = (b & 0x7F) | (body[p + 1] << 7)
                length, p = (u >> 1) ^ -(u & 1), p + 2
            else:
                length, p = read(body, p)
            end = p + length
            if length < MIN_RECORD_SIZE - 1 or end > limit:
                return f"record {i}: length {length} does not fit the batch"
            p += 1  # attributes
            b = body[p]
            if b < 0x80:
                p += 1  # timestamp delta
            else:
                _, p = read(body, p)
            b = body[p]
            delta, p = ((b >> 1) ^ -(b & 1), p + 1) if b < 0x80 else read(body, p)
            if delta != i:
                return f"record {i} has offset delta {delta}"
            for _field in ("key", "value"):
                b = body[p]
                if b < 0x80:
                    n, p = (b >> 1) ^ -(b & 1), p + 1
                elif body[p + 1] < 0x80:
                    u = (b & 0x7F) | (body[p + 1] << 7)
                    n, p = (u >> 1) ^ -(u & 1), p + 2
                else:
                    n, p = read(body, p)
                if n < -1:
                    return f"record {i}: {_field} length {n}"
                if n > 0:
                    p += n
            b = body[p]
            headers, p = ((b >> 1) ^ -(b & 1), p + 1) if b < 0x80 else read(body, p)
            if headers < 0 or headers > length:
                return f"record {i}: {headers} headers"
            for _h in range(headers):
                n, p = read(body, p)
                if n < 0:
                    return f"record {i}: header key length {n}"
                p += n
                n, p = read(body, p)
                if n < -1:
                    return f"record {i}: header value length {n}"
                p += max(n, 0)
                if p > end:
                    break
            if p != end:
                return f"record {i}: length {length} does not match its fields"
    except CorruptRecordError as exc:
        return str(exc)
    except IndexError:
        return "a record runs past the end of the batch"
    if p != limit:
        return f"{limit - p} bytes after the last of {h.record_count} records"
    return None


def decode_records(buf: bytes | memoryview, pos: int = 0, header: BatchHeader | None = None) -> list[Record]:
    """Decode the records of the batch at `pos`. Raises CorruptRecordError."""
    h = header or parse_header(buf, pos)
    body = bytes(memoryview(buf)[pos + HEADER_SIZE: pos + h.size])
    try:
        body = compression_codecs.decompress(h.compression, body)
    except compression_codecs.CompressionError as exc:
        raise CorruptRecordError(str(exc)) from exc
    out: list[Record] = []
    append = out.append
    read = _read_varint
    new = tuple.__new__  # Record(...) without the Python-level __new__ of a NamedTuple
    base_offset, base_ts = h.base_offset, h.base_timestamp
    p = 0
    n = len(body)
    try:
        for _ in range(h.record_count):
            b = body[p]
            if b < 0x80:
                length, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                length, p = read(body, p)
            end = p + length
            if end > n:
                raise CorruptRecordError("record runs past the end of the batch")
            p += 1  # attributes
            b = body[p]
            if b < 0x80:
                ts_delta, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                ts_delta, p = read(body, p)
            b = body[p]
            if b < 0x80:
                off_delta, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                off_delta, p = read(body, p)
            b = body[p]
            if b < 0x80:
                klen, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                klen, p = read(body, p)
            if klen < 0:
                key = None
            else:
                key = body[p:p + klen]
                p += klen
            vlen, p = read(body, p)
            if vlen < 0:
                value = None
            else:
                value = body[p:p + vlen]
                p += vlen
            if body[p] == 0:  # no headers (the varint 0)
                headers: tuple = ()
                p += 1
            else:
                hcount, p = read(body, p)
                hl = []
                for _h in range(hcount):
                    hklen, p = read(body, p)
                    hk = body[p:p + hklen].decode()
                    p += hklen
                    hvlen, p = read(body, p)
                    hv = None if hvlen < 0 else body[p:p + hvlen]
                    p += max(hvlen, 0)
                    hl.append((hk, hv))
                headers = tuple(hl)
            if p != end:
                raise CorruptRecordError("record length does not match its fields")
            append(new(Record, (base_offset + off_delta, base_ts + ts_delta, key, value, headers)))
    except (IndexError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(str(exc)) from exc
    return out


def merge_batches(batches: Sequence[bytes]) -> bytes | None:
    """One batch holding the records of `batches`, in order (offset deltas renumbered
    0.., timestamps kept: each record's timestamp delta is taken from the first
    batch's base timestamp), with their producer id and epoch and no sequence.
    Group commit uses it to turn many single-record appends of one writer into one
    append. Returns None when they cannot be merged: fewer than two, a compressed,
    transactional or control batch, a batch with a sequence, differing producer ids or
    epochs, or one that does not parse (the caller then sends them as they are).
    Record bytes are copied, not re-encoded: only each record's length, timestamp
    delta and offset delta are rewritten (Kafka protocol, "Record Batch", v2)."""
    if len(batches) < 2:
        return None
    parts: list[bytes] = []
    count = 0
    first: BatchHeader | None = None
    max_ts = 0
    try:
        for batch in batches:
            h = parse_header(batch)
            if h.attributes or h.base_sequence != NO_SEQUENCE or h.size != len(batch):
                return None
            if first is None:
                first, max_ts = h, h.max_timestamp
            elif (h.producer_id, h.producer_epoch) != (first.producer_id, first.producer_epoch):
                return None
            max_ts = max(max_ts, h.max_timestamp)
            shift = h.base_timestamp - first.base_timestamp
            p = HEADER_SIZE
            for _ in range(h.record_count):
                length, p = _read_varint(batch, p)
                end = p + length
                if length < 3 or end > len(batch):
                    return None
                ts_delta, q = _read_varint(batch, p + 1)  # after the attributes byte
                _, q = _read_varint(batch, q)  # the old offset delta
                ts = _varint_bytes(ts_delta + shift)
                od = _varint_bytes(count)
                parts.append(b"".join((_varint_bytes(1 + len(ts) + len(od) + end - q), batch[p:p + 1], ts, od,
                                       batch[q:end])))
                count += 1
                p = end
            if p != len(batch):
                return None
    except CorruptRecordError:
        return None
    return build_batch(b"".join(parts), count, first.base_timestamp, max_ts, count - 1,
                       producer_id=first.producer_id, producer_epoch=first.producer_epoch)
