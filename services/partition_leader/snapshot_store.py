"""Producer-state snapshots of all partitions of one process, in one RocksDB.

The design doc ("PID Snapshots") names snapshot files by the log offset they were
taken at; here each snapshot is one RocksDB value keyed by (topic, partition,
offset): utf-8 topic, a 0 byte, partition int32 and offset int64, big-endian, so the
snapshots of a partition are contiguous and sorted by offset. Values are opaque
bytes (`ProducerStateManager.encode_snapshot`: versioned, CRC32C-checked).

Opened with `Options(raw_mode=True)` (bytes keys and values), via rocksdict.
"""
from __future__ import annotations

import struct
from pathlib import Path

from rocksdict import Options, Rdict, WriteOptions

_PARTITION = struct.Struct(">i")
_OFFSET = struct.Struct(">q")


def _prefix(topic: str, partition: int) -> bytes:
    return topic.encode() + b"\x00" + _PARTITION.pack(partition)


class SnapshotStore:
    """Snapshots keyed by (topic, partition, offset). Not thread-safe by contract
    (one event loop uses it), although RocksDB itself is."""

    def __init__(self, path: Path):
        path.mkdir(parents=True, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self.path = path
        self._db = Rdict(str(path), options=opts)
        self._sync = WriteOptions()
        self._sync.sync = True

    def close(self) -> None:
        """Flush memtables and close the database."""
        self._db.flush()
        self._db.close()

    def put(self, topic: str, partition: int, offset: int, value: bytes, sync: bool = False) -> None:
        """Store the snapshot taken at log `offset`; `sync` waits for the WAL fsync."""
        key = _prefix(topic, partition) + _OFFSET.pack(offset)
        if sync:
            self._db.put(key, value, self._sync)
        else:
            self._db[key] = value

    def get(self, topic: str, partition: int, offset: int) -> bytes | None:
        return self._db.get(_prefix(topic, partition) + _OFFSET.pack(offset))

    def offsets(self, topic: str, partition: int) -> list[int]:
        """Offsets of the stored snapshots of a partition, ascending."""
        prefix = _prefix(topic, partition)
        out = []
        for key in self._db.keys(from_key=prefix):
            if not key.startswith(prefix) or len(key) != len(prefix) + _OFFSET.size:
                break
            out.append(_OFFSET.unpack_from(key, len(prefix))[0])
        return out

    def delete(self, topic: str, partition: int, offset: int) -> None:
        del self._db[_prefix(topic, partition) + _OFFSET.pack(offset)]
