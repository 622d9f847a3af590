"""A disk-fault filesystem for tests: a FUSE passthrough (mfusepy over libfuse 3) of a
backing directory, mounted over a service's data directory, whose faults are switched
at run time over a Unix socket.

Faults (`DiskFaults.set(...)` from the test, one JSON line per command):

    eio: ["read", "write", "fsync"]   those operations fail with EIO
    enospc: true                      writes (and creates) fail with ENOSPC
    fsync_delay_ms: 500               every fsync waits this long first
    fail_after: 12                    the next 12 changes (writes, truncations, fsyncs,
                                      creates, renames, unlinks) succeed, every later one
                                      fails with EIO: the writer stops at that point, as
                                      at a power cut (then "crash" it)
    crash                             drop every write not yet fsynced (as LazyFS does)
    clear                             no faults

"crash" models the loss of the page cache at a power failure: each file goes back to
its content at its last fsync (`WriteTracker`: an undo log of the bytes each write or
truncate replaced since then). Directory entries (creates, renames, unlinks) are
kept: only file contents are rolled back. The service must be stopped (SIGKILL) before
the crash and started after it, as after a real power loss. `paths` limits `eio` and
`enospc` to files whose path (relative to the mount) starts with one of the given
prefixes (e.g. ["logs/"]), all files otherwise.

The mount uses direct_io and no attribute caching, so nothing read after a crash or
during a fault comes from the kernel's own cache. The filesystem runs as its own
process (`python -m tests.faults.diskfs BACKING MOUNT SOCKET`); `DiskFaults` starts it,
waits for the mount, and on `close()` (also at interpreter exit) stops it and unmounts
(`fusermount3 -u`, lazily when busy). The process unmounts itself when its parent
dies.
"""
from __future__ import annotations

import atexit
import errno
import json
import os
import socket
import subprocess
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path


# ------------------------------------------------------------------ write tracking
class WriteTracker:
    """Undo log of the writes to each file since its last fsync (pure logic over real
    files; no FUSE). Call `before_write(path, offset, length)` and
    `before_truncate(path, length)` before the change reaches the backing file,
    `synced(path)` after an fsync succeeded, `forget(path)` on unlink, `renamed(old,
    new)` on rename, and `crash()` to put every file back to its state at its last
    fsync. Paths are absolute paths of backing files. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        # path -> (size at the last fsync, [(offset, bytes replaced)] in write order)
        self._undo: dict[str, tuple[int, list[tuple[int, bytes]]]] = {}

    def _entry(self, path: str) -> tuple[int, list[tuple[int, bytes]]]:
        e = self._undo.get(path)
        if e is None:
            try:
                size = os.path.getsize(path)
            except FileNotFoundError:
                size = 0
            e = self._undo[path] = (size, [])
        return e

    def before_write(self, path: str, offset: int, length: int) -> None:
        """Remember the bytes [offset, offset + length) of `path` hold now (only the
        part inside the file; bytes past the end are cut by the size at sync)."""
        with self._lock:
            durable_size, undo = self._entry(path)
            try:
                size = os.path.getsize(path)
            except FileNotFoundError:
                size = 0
            end = min(offset + length, size, durable_size)
            if end > offset:
                with open(path, "rb") as f:
                    f.seek(offset)
                    undo.append((offset, f.read(end - offset)))

    def before_truncate(self, path: str, length: int) -> None:
        """Remember the bytes a truncation to `length` removes (those the last fsync
        made durable)."""
        with self._lock:
            durable_size, undo = self._entry(path)
            if length < durable_size:
                with open(path, "rb") as f:
                    f.seek(length)
                    undo.append((length, f.read(durable_size - length)))

    def synced(self, path: str) -> None:
        with self._lock:
            self._undo.pop(path, None)

    def forget(self, path: str) -> None:
        with self._lock:
            self._undo.pop(path, None)

    def renamed(self, old: str, new: str) -> None:
        with self._lock:
            self._undo.pop(new, None)
            e = self._undo.pop(old, None)
            if e is not None:
                self._undo[new] = e

    def pending(self) -> dict[str, int]:
        """Path -> number of undo records (writes not yet fsynced that replaced bytes)."""
        with self._lock:
            return {p: len(u) for p, (_, u) in self._undo.items()}

    def crash(self) -> list[str]:
        """Undo every change since each file's last fsync; returns the paths rolled back."""
        with self._lock:
            rolled = []
            for path, (durable_size, undo) in self._undo.items():
                try:
                    fd = os.open(path, os.O_WRONLY)
                except FileNotFoundError:
                    continue
                try:
                    for offset, data in reversed(undo):
                        os.pwrite(fd, data, offset)
                    os.ftruncate(fd, durable_size)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                rolled.append(path)
            self._undo.clear()
            return rolled


# ------------------------------------------------------------------ the filesystem
def _operations(backing: str, tracker: WriteTracker, faults: dict):
    import mfusepy as fuse
    budget_lock = threading.Lock()

    def fail(kind: str, rel: str) -> None:
        """kind: read, write, fsync, create, or unlink (renames, unlinks and rmdirs,
        which only `fail_after` fails)."""
        prefixes = faults.get("paths")
        if prefixes and not any(rel.lstrip("/").startswith(p) for p in prefixes):
            return
        if kind in faults.get("eio", ()):
            raise fuse.FuseOSError(errno.EIO)
        if kind in ("write", "create") and faults.get("enospc"):
            raise fuse.FuseOSError(errno.ENOSPC)
        if kind != "read" and "fail_after" in faults:
            with budget_lock:
                if faults["fail_after"] <= 0:
                    raise fuse.FuseOSError(errno.EIO)
                faults["fail_after"] -= 1

    class Passthrough(fuse.Operations):
        use_ns = True

        def _full(self, path: str) -> str:
            return os.path.join(backing, path.lstrip("/"))

        def _os(self, fn, *args):
            try:
                return fn(*args)
            except OSError as exc:
                raise fuse.FuseOSError(exc.errno) from None

        def access(self, path, amode):
            if not os.access(self._full(path), amode):
                raise fuse.FuseOSError(errno.EACCES)
            return 0

        def getattr(self, path, fh=None):
            st = self._os(os.lstat, self._full(path))
            return {k: getattr(st, k) for k in ("st_atime_ns", "st_ctime_ns", "st_gid", "st_mode", "st_mtime_ns",
                                               "st_nlink", "st_size", "st_uid", "st_ino", "st_blocks")}

        def readdir(self, path, fh):
            return [".", ".."] + self._os(os.listdir, self._full(path))

        def readlink(self, path):
            return self._os(os.readlink, self._full(path))

        def mkdir(self, path, mode):
            fail("create", path)
            return self._os(os.mkdir, self._full(path), mode)

        def rmdir(self, path):
            fail("unlink", path)
            return self._os(os.rmdir, self._full(path))

        def unlink(self, path):
            fail("unlink", path)
            full = self._full(path)
            self._os(os.unlink, full)
            tracker.forget(full)
            return 0

        def rename(self, old, new):
            fail("unlink", new)
            self._os(os.rename, self._full(old), self._full(new))
            tracker.renamed(self._full(old), self._full(new))
            return 0

        def link(self, target, source):
            return self._os(os.link, self._full(source), self._full(target))

        def symlink(self, target, source):
            return self._os(os.symlink, source, self._full(target))

        def chmod(self, path, mode):
            return self._os(os.chmod, self._full(path), mode)

        def chown(self, path, uid, gid):
            return self._os(os.chown, self._full(path), uid, gid)

        def utimens(self, path, times=None):
            return self._os(os.utime, self._full(path), None) if times is None else \
                self._os(os.utime, self._full(path), ns=times)

        def statfs(self, path):
            st = os.statvfs(self._full(path))
            return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                               "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

        def open(self, path, flags):
            if flags & os.O_TRUNC:
                tracker.before_truncate(self._full(path), 0)
            return self._os(os.open, self._full(path), flags & ~os.O_APPEND)

        def create(self, path, mode, fi=None):
            fail("create", path)
            full = self._full(path)
            if os.path.exists(full):
                tracker.before_truncate(full, 0)
            fd = self._os(os.open, full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            os.close(fd)
            fd = self._os(os.open, full, os.O_RDWR)
            tracker.before_write(full, 0, 0)  # durable size: 0 (the file did not exist)
            return fd

        def read(self, path, size, offset, fh):
            fail("read", path)
            return self._os(os.pread, fh, size, offset)

        def write(self, path, data, offset, fh):
            fail("write", path)
            tracker.before_write(self._full(path), offset, len(data))
            return self._os(os.pwrite, fh, data, offset)

        def truncate(self, path, length, fh=None):
            fail("write", path)
            full = self._full(path)
            tracker.before_truncate(full, length)
            return self._os(os.truncate, full, length) if fh is None else self._os(os.ftruncate, fh, length)

        def flush(self, path, fh):
            return 0

        def release(self, path, fh):
            self._os(os.close, fh)
            return 0

        def fsync(self, path, datasync, fh):
            delay = faults.get("fsync_delay_ms", 0)
            if delay:
                time.sleep(delay / 1000)
            fail("fsync", path)
            self._os(os.fsync, fh)
            tracker.synced(self._full(path))
            return 0

        def fsyncdir(self, path, datasync, fh):
            fail("fsync", path)
            return 0

    return Passthrough()


def _serve_control(sock_path: str, tracker: WriteTracker, faults: dict) -> None:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(4)
    while True:
        conn, _ = srv.accept()
        with conn, conn.makefile("rwb") as f:
            for line in f:
                cmd = json.loads(line)
                reply: dict = {"ok": True}
                if cmd.get("op") == "clear":
                    faults.clear()
                elif cmd.get("op") == "crash":
                    reply["rolled_back"] = len(tracker.crash())
                elif cmd.get("op") == "set":
                    faults.update(cmd.get("faults", {}))
                elif cmd.get("op") == "pending":
                    reply["pending"] = tracker.pending()
                f.write(json.dumps(reply).encode() + b"\n")
                f.flush()


def main(argv: list[str]) -> None:
    """`python -m tests.faults.diskfs BACKING MOUNT SOCKET`: mount and serve until
    unmounted, SIGTERM/SIGINT, or the parent process exits."""
    import mfusepy as fuse
    backing, mount, sock_path = (os.path.abspath(a) for a in argv[:3])
    tracker, faults = WriteTracker(), {}
    parent = os.getppid()
    threading.Thread(target=_serve_control, args=(sock_path, tracker, faults), daemon=True).start()

    def watch_parent():
        while os.getppid() == parent:
            time.sleep(0.5)
        subprocess.run(["fusermount3", "-u", "-z", mount], check=False)

    threading.Thread(target=watch_parent, daemon=True).start()
    fuse.FUSE(_operations(backing, tracker, faults), mount, foreground=True, direct_io=True, attr_timeout=0,
              entry_timeout=0, negative_timeout=0, default_permissions=True, allow_other=False)


# ------------------------------------------------------------------ the test side
class DiskFaults:
    """Mounts the fault filesystem over `mount` (created if missing), backed by
    `backing`, and switches its faults. Use as a context manager or call `close()`.
    Raises RuntimeError when the mount does not appear within `timeout_s` (s)."""

    def __init__(self, backing: Path, mount: Path, timeout_s: float = 15.0):
        self.backing, self.mount = Path(backing), Path(mount)
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(parents=True, exist_ok=True)
        # A short directory of its own: a Unix socket's path is limited to 107 bytes,
        # which a deep test directory exceeds.
        self._sock_dir = tempfile.mkdtemp(prefix="diskfs-")
        self.sock_path = os.path.join(self._sock_dir, "control.sock")
        root = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.faults.diskfs", str(self.backing),
                                      str(self.mount), self.sock_path], cwd=root,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        atexit.register(self.close)
        deadline = time.monotonic() + timeout_s
        while not (os.path.ismount(self.mount) and os.path.exists(self.sock_path)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = b"" if self.proc.poll() is None else self.proc.stderr.read()
                self.close()
                raise RuntimeError(f"diskfs did not mount {self.mount}: {err.decode(errors='replace')[-2000:]}")
            time.sleep(0.05)

    def _call(self, cmd: dict, timeout_s: float = 30.0) -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(self.sock_path)
            s.sendall(json.dumps(cmd).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    raise RuntimeError("diskfs control connection closed")
                buf += chunk
        return json.loads(buf)

    def set(self, **faults) -> None:
        """Switch faults on (see the module docstring): eio=[...], enospc=True,
        fsync_delay_ms=N, fail_after=N, paths=[prefixes]."""
        self._call({"op": "set", "faults": faults})

    def clear(self) -> None:
        self._call({"op": "clear"})

    def crash(self) -> int:
        """Drop every write not yet fsynced; returns the number of files rolled back."""
        return self._call({"op": "crash"})["rolled_back"]

    def pending(self) -> dict[str, int]:
        return self._call({"op": "pending"})["pending"]

    def close(self) -> None:
        """Stop the filesystem and unmount (idempotent)."""
        unmounted = False
        if self.proc.poll() is None:
            unmounted = subprocess.run(["fusermount3", "-u", str(self.mount)], check=False,
                                       capture_output=True).returncode == 0
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if not unmounted:
            # Busy, or its process gone (os.path.ismount is False on such a dead mount).
            subprocess.run(["fusermount3", "-u", "-z", str(self.mount)], check=False, capture_output=True)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        shutil.rmtree(self._sock_dir, ignore_errors=True)

    def __enter__(self) -> "DiskFaults":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def under_faults(cluster, name: str) -> DiskFaults:
    """Put the data directory of service `name` of a started DevCluster on the fault
    filesystem: stop it (SIGTERM), move its data directory to `<name>-backing`, mount
    over the old path and start it again. The caller closes the DiskFaults after
    killing the service."""
    cluster.stop(name)
    data = cluster.dir / name
    backing = cluster.dir / f"{name}-backing"
    os.rename(data, backing)
    disk = DiskFaults(backing, data)
    try:
        cluster.restart(name)
    except BaseException:
        cluster.kill(name)
        disk.close()
        raise
    return disk


if __name__ == "__main__":
    main(sys.argv[1:])
