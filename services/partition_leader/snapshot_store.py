"""Producer-state snapshots of all partitions of one process, in one RocksDB.

The design doc ("PID Snapshots") names snapshot files by the log offset they were
taken at; here each snapshot is one RocksDB value keyed by (topic, partition,
offset): utf-8 topic, a 0 byte, partition int32 and offset int64, big-endian, so the
snapshots of a partition are contiguous and sorted by offset. Values are opaque
bytes (`ProducerStateManager.encode_snapshot`: versioned, CRC32C-checked).

Opened with `Options(raw_mode=True)` (bytes keys and values), via rocksdict.
RocksDB's I/O errors (status "IO error: ...", e.g. EIO or ENOSPC on the data
directory) are raised as OSError(EIO), so that they take the log directory offline
like any other write error (docs/design.md, "Disk faults").
"""
from __future__ import annotations

import errno
import functools
import struct
from pathlib import Path

from rocksdict import Options, Rdict, WriteOptions

_PARTITION = struct.Struct(">i")
_OFFSET = struct.Struct(">q")


def _io_errors(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except OSError:
            raise
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's status text
            if "IO error" in str(exc) or "No space left" in str(exc):
                raise OSError(errno.EIO, f"producer-state store: {exc}") from exc
            raise
    return call


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

    @_io_errors
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

    @_io_errors
    def delete(self, topic: str, partition: int, offset: int) -> None:
        del self._db[_prefix(topic, partition) + _OFFSET.pack(offset)]
