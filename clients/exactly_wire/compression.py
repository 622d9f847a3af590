"""Record-batch compression, Kafka's `compression.type`: the records of a batch v2
are compressed as one blob, and the attributes' bits 0-2 name the codec.

    0 none, 1 gzip (RFC 1952), 2 snappy (xerial-framed blocks, as Kafka's Java client
    writes them; raw snappy is read too), 3 lz4 (LZ4 frame), 4 zstd (zstd frame)

The codecs come from `cramjam` (gzip from the standard library). Partition leaders
never decompress: they store batches as the producer sent them. Decoding a blob that
is not valid for its codec raises CompressionError.
"""
from __future__ import annotations

import gzip
import struct
import zlib

import cramjam

NONE = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4

# compression.type value -> codec id
BY_NAME = {"none": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}
CODECS = frozenset(BY_NAME.values())

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)  # version 1, compatible with 1
_XERIAL_BLOCK = 32 * 1024
_INT32 = struct.Struct(">i")


class CompressionError(ValueError):
    """A compressed blob that its codec cannot decode, or an unknown codec id."""


def codec_for(name: str) -> int:
    """The codec id of a `compression.type` value (none, gzip, snappy, lz4, zstd; any
    case). Raises ValueError naming the allowed values."""
    try:
        return BY_NAME[str(name).strip().lower()]
    except KeyError:
        raise ValueError(f"compression.type must be one of {', '.join(BY_NAME)}, not {name!r}") from None


def compress(codec: int, data: bytes) -> bytes:
    """`data` compressed with `codec` (an id above). Raises CompressionError for an
    unknown id."""
    if codec == NONE:
        return data
    if codec == GZIP:
        return gzip.compress(data, compresslevel=1)
    if codec == SNAPPY:
        parts = [_XERIAL_HEADER]
        for start in range(0, len(data), _XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(data[start:start + _XERIAL_BLOCK]))
            parts.append(_INT32.pack(len(block)))
            parts.append(block)
        return b"".join(parts)
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise CompressionError(f"unknown compression codec {codec}")


def decompress(codec: int, data: bytes) -> bytes:
    """The original bytes of `data` compressed with `codec`. Raises CompressionError."""
    try:
        if codec == NONE:
            return data
        if codec == GZIP:
            return gzip.decompress(data)
        if codec == SNAPPY:
            return _snappy_decompress(data)
        if codec == LZ4:
            return bytes(cramjam.lz4.decompress(data))
        if codec == ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except CompressionError:
        raise
    except (OSError, EOFError, ValueError, zlib.error, cramjam.DecompressionError, struct.error) as exc:
        raise CompressionError(f"{_name(codec)}: {exc}") from exc
    raise CompressionError(f"unknown compression codec {codec}")


def _snappy_decompress(data: bytes) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    out, pos = [], len(_XERIAL_HEADER)
    while pos < len(data):
        (size,) = _INT32.unpack_from(data, pos)
        pos += _INT32.size
        if size < 0 or pos + size > len(data):
            raise CompressionError("snappy: truncated xerial block")
        out.append(bytes(cramjam.snappy.decompress_raw(data[pos:pos + size])))
        pos += size
    return b"".join(out)


def _name(codec: int) -> str:
    return next((n for n, c in BY_NAME.items() if c == codec), str(codec))


__all__ = ["NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD", "BY_NAME", "CODECS", "CompressionError", "codec_for",
           "compress", "decompress"]
