"""WriteTracker (tests/faults/diskfs.py): what a "crash" of the disk-fault filesystem
keeps (the content at each file's last fsync) and drops (everything written since)."""
from __future__ import annotations

import os
from pathlib import Path

from faults.diskfs import WriteTracker


def write(t: WriteTracker, path: Path, offset: int, data: bytes) -> None:
    t.before_write(str(path), offset, len(data))
    with open(path, "r+b" if path.exists() else "wb") as f:
        f.seek(offset)
        f.write(data)


def truncate(t: WriteTracker, path: Path, length: int) -> None:
    t.before_truncate(str(path), length)
    os.truncate(path, length)


def test_appends_after_the_last_fsync_are_dropped(tmp_path):
    t, f = WriteTracker(), tmp_path / "a.log"
    write(t, f, 0, b"hello ")
    t.synced(str(f))
    write(t, f, 6, b"world")
    assert f.read_bytes() == b"hello world"
    assert t.crash() == [str(f)]
    assert f.read_bytes() == b"hello "


def test_overwrites_are_undone_in_reverse_order(tmp_path):
    t, f = WriteTracker(), tmp_path / "a.log"
    f.write_bytes(b"0123456789")  # on disk before tracking: durable
    write(t, f, 2, b"ab")
    write(t, f, 3, b"XYZ")
    write(t, f, 9, b"tail!")
    assert f.read_bytes() == b"01aXYZ678tail!"
    t.crash()
    assert f.read_bytes() == b"0123456789"


def test_a_truncation_since_the_fsync_is_undone(tmp_path):
    t, f = WriteTracker(), tmp_path / "a.log"
    f.write_bytes(b"abcdef")
    truncate(t, f, 2)
    write(t, f, 2, b"ZZ")
    t.crash()
    assert f.read_bytes() == b"abcdef"


def test_fsynced_writes_survive_and_new_files_empty(tmp_path):
    t, f, g = WriteTracker(), tmp_path / "a.log", tmp_path / "new.log"
    write(t, f, 0, b"kept")
    t.synced(str(f))
    t.before_write(str(g), 0, 0)  # created now: durable size 0
    write(t, g, 0, b"lost")
    assert t.pending() == {str(g): 0}  # nothing replaced, only grown
    t.crash()
    assert f.read_bytes() == b"kept" and g.read_bytes() == b""
    assert t.pending() == {}


def test_rename_carries_the_undo_log_and_unlink_forgets_it(tmp_path):
    t, f, g = WriteTracker(), tmp_path / "a.tmp", tmp_path / "a"
    f.write_bytes(b"old")
    write(t, f, 0, b"new")
    os.rename(f, g)
    t.renamed(str(f), str(g))
    h = tmp_path / "gone"
    write(t, h, 0, b"x")
    os.unlink(h)
    t.forget(str(h))
    assert t.crash() == [str(g)]
    assert g.read_bytes() == b"old"
