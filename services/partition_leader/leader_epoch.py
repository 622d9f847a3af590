"""The leader-epoch cache of one partition replica (KIP-101; Kafka's `LeaderEpochFileCache`).

Each entry maps a leader epoch to the first offset written in that epoch. Entries
are strictly increasing in both epoch and start offset. A leader adds
(its epoch, its log end offset) when it takes over; a follower adds one when it
appends a replicated batch whose partitionLeaderEpoch is newer than its latest.

`end_offset_for(epoch)` answers OffsetForLeaderEpoch: the largest known epoch <= the
asked one and the offset where it ended (the next epoch's start offset, or the log end
offset for the latest epoch). A follower truncates its log to where its own epochs and
the leader's agree (see `replication.truncation_offset`).

Persisted as `leader-epoch-checkpoint` in the partition directory, in Kafka's
checkpoint format: a version line ("0"), a count line, then one "epoch start_offset"
line per entry; replaced atomically (write, fsync, rename) on every change. A
missing or unreadable file is rebuilt from the partitionLeaderEpoch of the log's
batches.

Not thread-safe: one owner (the partition) calls it.
"""
from __future__ import annotations

import bisect
import logging
import os
from pathlib import Path
from typing import Iterable, NamedTuple

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "leader-epoch-checkpoint"
CHECKPOINT_VERSION = 0
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class EpochEntry(NamedTuple):
    """Leader epoch and the offset of its first batch."""

    epoch: int
    start_offset: int


class EpochEndOffset(NamedTuple):
    """Answer of `end_offset_for`: (epoch, end offset); UNDEFINED_EPOCH when no known
    epoch is <= the asked one (end offset then is the earliest epoch's start offset, or
    UNDEFINED_OFFSET with no entries at all)."""

    epoch: int
    end_offset: int


class LeaderEpochCache:
    """Epoch -> start offset entries of one log, optionally persisted in `directory`."""

    def __init__(self, directory: Path | None = None, entries: Iterable[EpochEntry] = ()):
        self.dir = directory
        self._entries: list[EpochEntry] = list(entries)

    # ------------------------------------------------------------ persistence
    @classmethod
    def load(cls, directory: Path) -> "LeaderEpochCache | None":
        """Read `directory/leader-epoch-checkpoint`; None when missing or malformed
        (the caller rebuilds from the log)."""
        path = directory / CHECKPOINT_FILE
        try:
            lines = path.read_text().split("\n")
        except FileNotFoundError:
            return None
        try:
            if int(lines[0]) != CHECKPOINT_VERSION:
                raise ValueError(f"unknown version {lines[0]!r}")
            count = int(lines[1])
            entries = []
            for line in lines[2:2 + count]:
                epoch, start = (int(x) for x in line.split())
                entries.append(EpochEntry(epoch, start))
            if len(entries) != count or not _increasing(entries):
                raise ValueError("entries missing or out of order")
        except (ValueError, IndexError) as exc:
            log.warning("%s: unreadable (%s); rebuilding from the log", path, exc)
            return None
        return cls(directory, entries)

    def flush(self) -> None:
        """Write the checkpoint file atomically (no-op without a directory)."""
        if self.dir is None:
            return
        body = "%d\n%d\n" % (CHECKPOINT_VERSION, len(self._entries)) + \
            "".join("%d %d\n" % e for e in self._entries)
        tmp = self.dir / (CHECKPOINT_FILE + ".tmp")
        with open(tmp, "w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / CHECKPOINT_FILE)

    # ------------------------------------------------------------ queries
    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        """The newest epoch, UNDEFINED_EPOCH (-1) when empty."""
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    def start_offset_of(self, epoch: int) -> int | None:
        """Start offset of exactly `epoch`, or None."""
        for e in self._entries:
            if e.epoch == epoch:
                return e.start_offset
        return None

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> EpochEndOffset:
        """Largest epoch <= `requested_epoch` and its end offset: the start offset of
        the next epoch, or `log_end_offset` when it is the latest epoch (KIP-101
        OffsetForLeaderEpoch, KIP-279 semantics). (UNDEFINED_EPOCH, start of the
        earliest epoch) when every known epoch is newer; (UNDEFINED_EPOCH,
        UNDEFINED_OFFSET) when empty or requested_epoch is undefined."""
        if requested_epoch == UNDEFINED_EPOCH or not self._entries:
            return EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET)
        epochs = [e.epoch for e in self._entries]
        i = bisect.bisect_right(epochs, requested_epoch)  # entries[i] is the first newer epoch
        if i == 0:
            return EpochEndOffset(UNDEFINED_EPOCH, self._entries[0].start_offset)
        floor = self._entries[i - 1]
        end = self._entries[i].start_offset if i < len(self._entries) else log_end_offset
        return EpochEndOffset(floor.epoch, end)

    # ------------------------------------------------------------ updates
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset`. Ignored (False) when epoch is
        not newer than the latest; entries starting at or after `start_offset` are
        dropped first (they belonged to a tail since truncated). Persists on change."""
        if epoch < 0 or (self._entries and epoch <= self._entries[-1].epoch):
            return False
        while self._entries and self._entries[-1].start_offset >= start_offset:
            self._entries.pop()
        self._entries.append(EpochEntry(epoch, start_offset))
        self.flush()
        return True

    def truncate_from_end(self, end_offset: int) -> bool:
        """Drop the entries starting at or after `end_offset` (the log was truncated
        there). Returns whether anything changed; persists on change."""
        keep = [e for e in self._entries if e.start_offset < end_offset]
        if len(keep) == len(self._entries):
            return False
        self._entries = keep
        self.flush()
        return True

    def clear(self) -> None:
        self._entries = []
        self.flush()


def _increasing(entries: list[EpochEntry]) -> bool:
    return all(a.epoch < b.epoch and a.start_offset < b.start_offset for a, b in zip(entries, entries[1:]))
