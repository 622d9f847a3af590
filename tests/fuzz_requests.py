"""Hostile request generator for the fuzz test (tests/integration/test_fuzz.py).

Pure and seeded: everything comes from the protobuf descriptors of
`exactly_wire.v1` (every unary RPC of every service, every field of its request
message, recursively), so a new RPC or field is fuzzed without editing anything here.
Field values are drawn by type, with a bias given by the field's name:

- integers: plausible values (small, -1, 0) or extremes (int32/int64 min and max,
  huge counts such as 999,999 or 2^31-1 partitions), negative sizes and offsets;
- strings: names from the pools given (the topics, groups and transactional ids
  the cluster knows, so requests reach real state) or hostile ones (empty, 10,000
  characters, '.', '..', control characters, non-ASCII, a '.'/'_' twin of a pool name);
- `records` bytes: a valid record batch v2 (idempotent, transactional or plain)
  or a mutation of one: flipped bytes, truncation, a lying batch length or record
  count (CRC recomputed so the lie passes the checksum), control and transactional
  bits set by a client, extreme producer ids, epochs and sequences, an unknown
  compression codec, two batches in one, random bytes, or an oversized batch;
- repeated fields: none, a few, or occasionally many elements.

`generate(method, rng, pools)` returns one request message; `raw_garbage(rng)` a
byte string that is usually not a valid protobuf encoding at all. Nothing here
talks to the network.
"""
from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from typing import Callable

import crc32c
from google.protobuf import descriptor as _d
from google.protobuf import message as _message

from exactly_wire import records
from exactly_wire.v1 import exactly_pb2 as pb

INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
UINT32 = (0, (1 << 32) - 1)
UINT64 = (0, (1 << 64) - 1)

_INT_RANGES = {
    _d.FieldDescriptor.TYPE_INT32: INT32, _d.FieldDescriptor.TYPE_SINT32: INT32,
    _d.FieldDescriptor.TYPE_SFIXED32: INT32, _d.FieldDescriptor.TYPE_INT64: INT64,
    _d.FieldDescriptor.TYPE_SINT64: INT64, _d.FieldDescriptor.TYPE_SFIXED64: INT64,
    _d.FieldDescriptor.TYPE_UINT32: UINT32, _d.FieldDescriptor.TYPE_FIXED32: UINT32,
    _d.FieldDescriptor.TYPE_UINT64: UINT64, _d.FieldDescriptor.TYPE_FIXED64: UINT64,
}
_HOSTILE_INTS = (0, -1, 1, 2, -2, 127, 128, 32767, 32768, -32768, 65535, 999_999, 1_000_000,
                 (1 << 31) - 1, -(1 << 31), (1 << 31) - 2, (1 << 63) - 1, -(1 << 63), 1 << 40)
_HOSTILE_STRINGS = ("", ".", "..", " ", "a" * 250, "x" * 10_000, "\x00", "topic\nname", "é-ü", "☃",
                    "__consumer_offsets", "__transaction_state", "../../etc", "a/b", "a b", "*", "-1")


@dataclass
class Pools:
    """Names the generator draws from, so requests reach real state: `topics` the
    cluster has (any RPC may name them), `groups`, `transactional_ids`, `producer_ids`
    (known to the cluster or not), `node_ids`; `scratch_topics` the only topics
    named by `destructive` RPCs (legitimate admin operations that delete or rewrite
    data, such as DeleteTopics: hostile input must not change the log, but a
    well-formed DeleteTopics of a topic is an authorized operation, not hostile input)."""

    topics: list[str] = field(default_factory=list)
    scratch_topics: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    scratch_groups: list[str] = field(default_factory=list)
    transactional_ids: list[str] = field(default_factory=list)
    producer_ids: list[int] = field(default_factory=list)
    node_ids: list[str] = field(default_factory=list)
    destructive: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Rpc:
    """One unary RPC: `service` (e.g. "PartitionLeader"), `name` (e.g. "Produce"),
    request and response message classes; `path` is the gRPC method path."""

    service: str
    name: str
    request: type
    response: type

    @property
    def path(self) -> str:
        return f"/{pb.DESCRIPTOR.package}.{self.service}/{self.name}"


def rpcs(file=pb.DESCRIPTOR) -> list[Rpc]:
    """Every unary RPC of every service in `file` (exactly.v1), sorted by path."""
    out = []
    for service in file.services_by_name.values():
        for m in service.methods:
            if m.client_streaming or m.server_streaming:
                continue
            out.append(Rpc(service.name, m.name, _class(m.input_type), _class(m.output_type)))
    return sorted(out, key=lambda r: r.path)


def _class(desc: _d.Descriptor) -> type:
    return getattr(pb, desc.name)


MESSAGE_BUDGET = 8 << 20  # bytes of `bytes` fields per request (oversized ones included)


class _Gen:
    def __init__(self, rng: random.Random, pools: Pools, destructive: bool):
        self.rng = rng
        self.pools = pools
        self.destructive = destructive
        self.budget = MESSAGE_BUDGET

    # ------------------------------------------------------------ scalars
    def integer(self, f: _d.FieldDescriptor) -> int:
        lo, hi = _INT_RANGES.get(f.type, INT64)
        r = self.rng.random()
        name = f.name
        if name == "producer_id" and self.pools.producer_ids and r < 0.5:
            return self.rng.choice(self.pools.producer_ids)
        if r < 0.45:
            v = self.rng.choice((0, 1, -1, 2, 3, 5))
            if name in ("max_wait_ms", "timeout_ms", "session_timeout_ms", "rebalance_timeout_ms"):
                v = self.rng.choice((0, 10, 100, 1000))
        elif r < 0.85:
            v = self.rng.choice(_HOSTILE_INTS)
        else:
            v = self.rng.randint(lo, hi)
        return max(lo, min(hi, v))

    def string(self, f: _d.FieldDescriptor) -> str:
        name = f.name
        r = self.rng.random()
        pool: list[str] = []
        if "topic" in name or name in ("name", "resource_name"):
            pool = self.pools.scratch_topics if self.destructive else self.pools.topics + self.pools.scratch_topics
        elif "group" in name and "instance" not in name:
            pool = self.pools.scratch_groups if self.destructive else self.pools.groups + self.pools.scratch_groups
        elif name in ("transactional_id", "key"):
            pool = self.pools.transactional_ids + self.pools.groups
        elif name in ("replica_id", "node_id", "leader_id"):
            pool = self.pools.node_ids
        if pool and r < 0.6:
            s = self.rng.choice(pool)
            if self.rng.random() < 0.1:  # a '.'/'_' twin of a real name
                s = s.replace(".", "\0").replace("_", ".").replace("\0", "_") if ("." in s or "_" in s) \
                    else s + "_x"
            return s
        if r < 0.85:
            return self.rng.choice(_HOSTILE_STRINGS)
        return "".join(chr(self.rng.choice((self.rng.randint(32, 126), self.rng.randint(0, 0x2FFF))))
                       for _ in range(self.rng.randint(0, 40))).replace("\ud800", "")

    def raw_bytes(self) -> bytes:
        n = self.rng.choice((0, 1, 12, 60, 61, 100, 4096))
        return self.rng.randbytes(n)

    # ------------------------------------------------------------ messages
    def fill(self, msg: _message.Message, depth: int = 0) -> None:
        for f in msg.DESCRIPTOR.fields:
            if self.rng.random() < 0.15:
                continue  # left unset
            if f.is_repeated:
                if f.message_type is not None and f.message_type.GetOptions().map_entry:
                    self._fill_map(getattr(msg, f.name), f)
                    continue
                count = self.rng.choice((0, 1, 1, 2, 3)) if self.rng.random() < 0.95 else self.rng.choice((50, 500))
                if depth >= 3:
                    count = min(count, 2)
                container = getattr(msg, f.name)
                for _ in range(count):
                    if f.message_type is not None:
                        self.fill(container.add(), depth + 1)
                    else:
                        container.append(self.scalar(f))
            elif f.message_type is not None:
                if depth < 4:
                    self.fill(getattr(msg, f.name), depth + 1)
            else:
                setattr(msg, f.name, self.scalar(f))

    def _fill_map(self, container, f: _d.FieldDescriptor) -> None:
        value_field = f.message_type.fields_by_name["value"]
        for _ in range(self.rng.choice((0, 1, 2))):
            key = self.rng.choice(("cleanup.policy", "retention.ms", "segment.bytes", "min.insync.replicas",
                                   "max.message.bytes", "unknown.key", "", "x" * 300))
            if self.destructive or self.rng.random() < 0.7:
                value = self.scalar(value_field) if value_field.type == _d.FieldDescriptor.TYPE_STRING else ""
                if self.rng.random() < 0.5:
                    value = self.rng.choice(("-1", "0", "1", "99999999999999999999", "compact", "nan", "1e9", ""))
                container[key] = value

    def scalar(self, f: _d.FieldDescriptor):
        t = f.type
        if t == _d.FieldDescriptor.TYPE_BOOL:
            return self.rng.random() < 0.5
        if t == _d.FieldDescriptor.TYPE_STRING:
            return self.string(f)
        if t == _d.FieldDescriptor.TYPE_BYTES:
            value = self.batch() if f.name == "records" else self.raw_bytes()
            if len(value) > self.budget:
                value = value[:self.rng.randint(0, max(self.budget, 0))]  # a truncated batch
            self.budget -= len(value)
            return value
        if t in (_d.FieldDescriptor.TYPE_DOUBLE, _d.FieldDescriptor.TYPE_FLOAT):
            return self.rng.choice((0.0, -1.0, 1e308, float("inf"), float("nan")))
        if t == _d.FieldDescriptor.TYPE_ENUM:
            return self.rng.choice([v.number for v in f.enum_type.values] + [999])
        return self.integer(f)

    # ------------------------------------------------------------ record batches
    def batch(self) -> bytes:
        """A valid record batch v2 or a hostile mutation of one."""
        rng = self.rng
        pid = rng.choice(self.pools.producer_ids or [-1]) if rng.random() < 0.5 else rng.choice(
            (-1, 0, 1, 12345, (1 << 63) - 1))
        transactional = pid >= 0 and rng.random() < 0.4
        n = rng.choice((1, 1, 2, 5))
        recs = [(None if rng.random() < 0.3 else b"k%d" % i, b"fuzz-%d" % i, (), 1_700_000_000_000 + i)
                for i in range(n)]
        batch = bytearray(records.encode_batch(recs, producer_id=pid,
                                               producer_epoch=0 if pid >= 0 else -1,
                                               base_sequence=rng.choice((0, 0, 1, 5)) if pid >= 0 else -1,
                                               transactional=transactional))
        mutations: list[Callable[[bytearray], bytearray | bytes]] = [
            lambda b: b,  # valid
            _flip_byte(rng), _truncate(rng), _lying_length(rng), _lying_count(rng),
            _set_attributes(rng, records.CONTROL_BIT), _set_attributes(rng, records.TRANSACTIONAL_BIT),
            _set_attributes(rng, 0x07),  # compression codec 7 does not exist
            _header_field(rng, 43, ">q", (-2, 0, 1 << 40, (1 << 63) - 1)),  # producer id
            _header_field(rng, 51, ">h", (-2, -32768, 32767, 1)),  # producer epoch
            _header_field(rng, 53, ">i", (-2, (1 << 31) - 1, 1 << 30, 7)),  # base sequence
            _header_field(rng, 23, ">i", (-1, (1 << 31) - 1, 1000)),  # last offset delta
            _header_field(rng, 0, ">q", (-1, (1 << 62), 17)),  # base offset (the leader rewrites it)
            lambda b: bytes(b) + bytes(b),  # two batches
            lambda b: rng.randbytes(rng.choice((0, 1, 61, 200))),
        ]
        if self.budget > 3_100_000:
            mutations.append(_oversized(rng))
        return bytes(rng.choice(mutations)(batch))


def _recrc(b: bytearray) -> bytearray:
    if len(b) >= records.HEADER_SIZE:
        struct.pack_into(">I", b, 17, crc32c.crc32c(bytes(b[21:])))
    return b


def _flip_byte(rng: random.Random):
    def f(b: bytearray) -> bytearray:
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
        if rng.random() < 0.5:
            _recrc(b)  # a corruption the checksum does not catch
        return b
    return f


def _truncate(rng: random.Random):
    return lambda b: b[:rng.randrange(len(b))]


def _lying_length(rng: random.Random):
    def f(b: bytearray) -> bytearray:
        struct.pack_into(">i", b, 8, rng.choice((-1, 0, 48, len(b), (1 << 31) - 1)))
        return b
    return f


def _lying_count(rng: random.Random):
    def f(b: bytearray) -> bytearray:
        count = rng.choice((0, -1, 2, 1000, (1 << 31) - 1))
        struct.pack_into(">i", b, 57, count)
        if rng.random() < 0.5:
            struct.pack_into(">i", b, 23, count - 1 if count > -(1 << 31) else 0)  # consistent lie
        return _recrc(b)
    return f


def _set_attributes(rng: random.Random, bits: int):
    def f(b: bytearray) -> bytearray:
        (attrs,) = struct.unpack_from(">h", b, 21)
        struct.pack_into(">h", b, 21, attrs | bits)
        return _recrc(b)
    return f


def _header_field(rng: random.Random, offset: int, fmt: str, values: tuple[int, ...]):
    def f(b: bytearray) -> bytearray:
        struct.pack_into(fmt, b, offset, rng.choice(values))
        return _recrc(b)
    return f


def _oversized(rng: random.Random):
    def f(b: bytearray) -> bytes:
        big = rng.choice((1_100_000, 3_000_000))
        return records.encode_batch([(None, b"x" * big, (), 1_700_000_000_000)])
    return f


# Claims only a service makes, with which a ClusterAction holder is trusted as it is with
# WriteTxnMarkers (which ends any transaction): that the group coordinator verified a
# transactional offset commit (ProduceRequest.transaction_verified_from), and that
# partitions are in a producer's transaction (PartitionLeader/TxnPartitionsAdded). On the
# fuzz's cluster, without authentication, the hostile caller holds ClusterAction as well,
# and a forged claim that happens to match a forged batch opens a transaction no
# coordinator knows. So the generator sends them as no service would: the claim left out,
# and notices about a transactional.id no producer has (their parsing and checks still run).
NO_SUCH_TRANSACTIONAL_ID = "fuzz-no-producer-has-this-id"


def generate(rpc: Rpc, rng: random.Random, pools: Pools) -> _message.Message:
    """One request for `rpc`, every field drawn as the module docstring says (service
    claims aside: see NO_SUCH_TRANSACTIONAL_ID)."""
    msg = rpc.request()
    _Gen(rng, pools, rpc.name in pools.destructive).fill(msg)
    if isinstance(msg, pb.ProduceRequest):
        msg.ClearField("transaction_verified_from")
    elif isinstance(msg, pb.TxnPartitionsAddedRequest):
        msg.transactional_id = NO_SUCH_TRANSACTIONAL_ID
    return msg


def raw_garbage(rng: random.Random) -> bytes:
    """Bytes that are mostly not a valid protobuf encoding (bad tags, wire types,
    lengths past the end)."""
    kind = rng.random()
    if kind < 0.3:
        return rng.randbytes(rng.randint(1, 64))
    if kind < 0.6:
        return bytes([0x0A, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F]) + rng.randbytes(4)  # length 4 GiB
    if kind < 0.8:
        return bytes([0x07]) + rng.randbytes(8)  # wire type 7 does not exist
    return bytes([0x08]) + b"\xff" * 11  # varint longer than 10 bytes


__all__ = ["Pools", "Rpc", "rpcs", "generate", "raw_garbage"]
