"""A private PostgreSQL server (Debian's `postgresql` package) for development and tests.

`PostgresServer(data_dir).start()` creates a database cluster in `data_dir` with
initdb (trust authentication, loopback only), starts it on a free port with pg_ctl
and waits until it accepts connections; `dsn` is then its libpq connection string
("postgresql://postgres@127.0.0.1:PORT/postgres"). PostgreSQL refuses to run as root:
when this process is root, the server runs as the `postgres` OS user (created by the
package) and the data directory is owned by it, so `data_dir` must be on a path that
user can reach — `private_data_dir()` makes one under the system's temporary
directory. Used by `exactly-dev up --postgres`, the test fixtures and the demo.
"""
from __future__ import annotations

import glob
import os
import pathlib
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

from .ports import free_port

SERVER_USER = "postgres"


class PostgresServerError(RuntimeError):
    """initdb or the server failed (the message names the log file)."""


def bin_dir() -> pathlib.Path:
    """The directory of initdb / pg_ctl / postgres: the newest /usr/lib/postgresql/*/bin
    (Debian), else the one of `initdb` on PATH. Raises PostgresServerError when the
    server is not installed (scripts/setup.sh installs Debian's `postgresql`)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return pathlib.Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return pathlib.Path(initdb).resolve().parent
    raise PostgresServerError("PostgreSQL server not installed (apt-get install postgresql; make setup does it)")


def _run_as() -> pwd.struct_passwd | None:
    """The OS user the server runs as when this process is root; None otherwise."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise PostgresServerError(f"running as root, and there is no {SERVER_USER!r} user to run PostgreSQL as "
                                  "(Debian's postgresql package creates it)") from None


def private_data_dir(prefix: str = "exactly-pg-") -> pathlib.Path:
    """A new empty directory (mode 0700) for a data directory, under the temporary
    directory, owned by the user the server will run as."""
    path = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    user = _run_as()
    if user is not None:
        os.chown(path, user.pw_uid, user.pw_gid)
    return path


class PostgresServer:
    """One PostgreSQL server with its data directory `data_dir` (created by initdb on
    the first start); initdb's and pg_ctl's output go to `log_path` (default
    data_dir/../<name>.log), the server's own log to data_dir/server.log (written by
    the server's OS user)."""

    def __init__(self, data_dir: str | os.PathLike, port: int | None = None,
                 log_path: str | os.PathLike | None = None):
        self.data_dir = pathlib.Path(data_dir)
        self.port = port
        self._own_log = log_path is None
        self.log_path = pathlib.Path(log_path) if log_path else self.data_dir.parent / f"{self.data_dir.name}.log"
        self._bin = bin_dir()
        self._user = _run_as()

    @property
    def server_log(self) -> pathlib.Path:
        """The server's own log file."""
        return self.data_dir / "server.log"

    @property
    def dsn(self) -> str:
        """The libpq connection string of the server's `postgres` database."""
        return f"postgresql://{SERVER_USER}@127.0.0.1:{self.port}/postgres"

    def _cmd(self, *args: str, check: bool = True, timeout_s: float = 120) -> subprocess.CompletedProcess:
        # As the server's own user (PostgreSQL refuses to run as root), without root's groups.
        as_user = {} if self._user is None else {"user": self._user.pw_uid, "group": self._user.pw_gid,
                                                 "extra_groups": []}
        with open(self.log_path, "ab") as log:
            proc = subprocess.run(list(args), stdout=log, stderr=subprocess.STDOUT, **as_user,
                                  cwd="/", timeout=timeout_s, env={**os.environ, "LC_ALL": "C.UTF-8"})
        if check and proc.returncode != 0:
            raise PostgresServerError(f"{pathlib.Path(args[0]).name} exited with {proc.returncode}; "
                                      f"see {self.log_path} and {self.server_log}")
        return proc

    def _owned(self, path: pathlib.Path) -> None:
        if self._user is not None:
            os.chown(path, self._user.pw_uid, self._user.pw_gid)

    def start(self, timeout_s: float = 60.0) -> None:
        """initdb when the data directory is empty, then start the server (on a free
        port unless one was given) and wait until it accepts connections. Raises
        PostgresServerError."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._owned(self.data_dir)
        self.log_path.touch()
        self._owned(self.log_path)
        if not (self.data_dir / "PG_VERSION").exists():
            self._cmd(str(self._bin / "initdb"), "-D", str(self.data_dir), "-U", SERVER_USER, "--auth=trust",
                      "-E", "UTF8", "--no-sync")
        if self.port is None:
            self.port = free_port()
        # Sockets in the data directory (not /var/run/postgresql); TCP on loopback only.
        opts = f"-p {self.port} -k {self.data_dir} -c listen_addresses=127.0.0.1 -c max_connections=50 " \
               f"-c fsync=on -c max_prepared_transactions=0"
        self._cmd(str(self._bin / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.server_log), "-o", opts,
                  "-w", "-t", str(int(timeout_s)), "start", timeout_s=timeout_s + 10)
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until the server accepts connections (pg_isready); PostgresServerError at the timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            proc = subprocess.run([str(self._bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port),
                                   "-U", SERVER_USER, "-t", "2"], capture_output=True, timeout=10)
            if proc.returncode == 0:
                return
            time.sleep(0.1)
        raise PostgresServerError(f"PostgreSQL on port {self.port} not ready within {timeout_s} s; "
                                  f"see {self.server_log}")

    @property
    def pid(self) -> int | None:
        """The postmaster's pid (from postmaster.pid), None when it is not running."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def stop(self, mode: str = "fast", timeout_s: float = 60.0) -> None:
        """pg_ctl stop (`mode` "smart", "fast" or "immediate": the last is a crash
        stop, recovered from the WAL at the next start). Nothing when not running."""
        if self.pid is None:
            return
        self._cmd(str(self._bin / "pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "-t",
                  str(int(timeout_s)), "stop", check=False, timeout_s=timeout_s + 10)

    def kill(self) -> None:
        """SIGKILL the postmaster (its backends end once they notice), as a crash."""
        pid = self.pid
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while self.pid is not None and time.monotonic() < deadline:
                time.sleep(0.05)

    def restart(self, timeout_s: float = 60.0) -> None:
        """Stop (fast) and start again on the same port."""
        self.stop("fast", timeout_s)
        self.start(timeout_s)

    def remove(self) -> None:
        """Stop the server and delete its data directory (and its log file, unless one
        was given)."""
        self.stop("immediate")
        shutil.rmtree(self.data_dir, ignore_errors=True)
        if self._own_log:
            self.log_path.unlink(missing_ok=True)


__all__ = ["PostgresServer", "PostgresServerError", "private_data_dir", "bin_dir"]
