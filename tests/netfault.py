"""Network partitions on loopback for the integration and system tests: cut one
service process of a dev cluster off from ZooKeeper, from its peers, or from
everything, while it keeps running; then heal (docs/design.md, "Failure model").

    with netfault.cut(cluster, "pl-0", netfault.ZOOKEEPER) as fault:
        ...                   # pl-0 runs on; ZooKeeper and pl-0 no longer hear each other
    # healed here, on every exit path

Modes (`cut(cluster, name, mode)`):

- ZOOKEEPER: the victim and the ZooKeeper server exchange no packet any more, on its
  open connections and on new ones (kazoo's reconnects); clients and the other
  services still reach the victim, and it reaches them.
- PEERS: the victim and the other service processes of the cluster exchange no
  packet (replica fetches, markers, internal-topic appends, in both directions); the
  victim keeps its ZooKeeper session and its clients.
- ALL: the victim exchanges packets with nobody but itself (ZooKeeper, peers and
  clients); unlike SIGSTOP, it keeps running and sees its own timeouts.

Packets are DROPped, not rejected: the victim and the others see silence, as in a
real partition, and find out through their own timeouts (a ZooKeeper session expires
after `zookeeper.session.timeout.ms`).

How. All processes run on 127.0.0.1 and every loopback packet passes the output hook
once, so each cut is one nftables base chain on that hook, in the table
`inet exactly_faults_<pid of the test process>` (removing the table removes every
rule). A packet belongs to one side of the cut either by its socket or by its ports:

- sockets that exist at the cut: read from /proc/<pid>/fd and /proc/<pid>/net/tcp{,6};
  the connections between the two sides are dropped by their (source port,
  destination port) pairs, in both directions, and each side's listening ports are
  known;
- sockets created later (reconnects, new channels): every process of either side is
  moved into its own cgroup v2 (`exactly_faults_<pid>/p<process pid>`) before the
  sockets are read, so a later socket carries that cgroup; `socket cgroupv2` then
  drops its packets to the other side's listening ports. A new connection never gets
  past its SYN, so no reply on it needs matching.

Clean-up: `Partition.heal()` (also on `__exit__`) deletes the cut's chain; once no
cut is left the table is deleted and the processes go back to their own cgroups.
`heal_all()` runs at interpreter exit and from the `network_faults` fixture; tables
and cgroups left by a test process that died (SIGKILL) are removed by
`remove_stale()`, which the fixture calls first. Every step that cannot be done
(no `nft`, not root, no cgroup v2) raises NetFaultError: partition tests fail, they
are never skipped (scripts/setup.sh installs nftables).
"""
from __future__ import annotations

import atexit
import errno
import itertools
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import pytest

from exactly_tools.devcluster import DevCluster, pid_alive

ZOOKEEPER, PEERS, ALL = "zookeeper", "peers", "all"
MODES = (ZOOKEEPER, PEERS, ALL)

TABLE_PREFIX = "exactly_faults_"
CGROUP_ROOT = "/sys/fs/cgroup"  # nft names cgroup v2 paths relative to this directory
TCP_LISTEN = 0x0A
TCP_TIME_WAIT = 0x06


class NetFaultError(RuntimeError):
    """A network fault could not be set up or removed (nft missing or failing, not
    root, no cgroup v2, unknown service)."""


# ---------------------------------------------------------------- environment

def require_nft() -> str:
    """Path of the `nft` binary after checking that it can list the ruleset; raises
    NetFaultError otherwise (the tests must not silently skip)."""
    nft = shutil.which("nft")
    if nft is None:
        raise NetFaultError("the network-partition tests need `nft` (Debian package nftables; "
                            "`make setup` installs it)")
    if os.geteuid() != 0:
        raise NetFaultError("the network-partition tests must run as root (nftables rules, cgroups)")
    _nft("list tables")
    return nft


def _nft(script: str) -> str:
    """Run an nft script (several commands, one transaction); returns stdout."""
    nft = shutil.which("nft")
    if nft is None:
        raise NetFaultError("`nft` not found (Debian package nftables)")
    proc = subprocess.run([nft, "-f", "-"], input=script, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise NetFaultError(f"nft failed ({proc.returncode}): {proc.stderr.strip()}\nscript:\n{script}")
    return proc.stdout


def _cgroup2_mount() -> str:
    """Mount point of the cgroup v2 hierarchy; it must be /sys/fs/cgroup or below it,
    where nft resolves `socket cgroupv2` paths."""
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "cgroup2":
                mount = parts[1]
                if mount == CGROUP_ROOT or mount.startswith(CGROUP_ROOT + "/"):
                    return mount
    raise NetFaultError(f"no cgroup v2 hierarchy mounted at or below {CGROUP_ROOT}")


def _own_cgroup(pid: int) -> str:
    """The cgroup v2 path of `pid` ("/" for the root)."""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].strip() or "/"
    return "/"


def _move(pid: int, cgroup_dir: str) -> bool:
    """Move process `pid` (all its threads) into `cgroup_dir`; False if it is gone."""
    try:
        with open(os.path.join(cgroup_dir, "cgroup.procs"), "w") as f:
            f.write(str(pid))
        return True
    except ProcessLookupError:
        return False
    except OSError as exc:
        if exc.errno == errno.ESRCH or not pid_alive(pid):
            return False
        raise NetFaultError(f"cannot move process {pid} into {cgroup_dir}: {exc}") from exc


# ---------------------------------------------------------------- sockets

@dataclass
class Sockets:
    """The TCP sockets of some processes: listening ports and connections as
    (local port, remote port) pairs."""

    listening: set[int] = field(default_factory=set)
    connections: set[tuple[int, int]] = field(default_factory=set)


def _parse_tcp(path: str) -> dict[int, tuple[int, int, int]]:
    """inode -> (local port, remote port, state) from a /proc/net/tcp{,6} file."""
    out: dict[int, tuple[int, int, int]] = {}
    try:
        with open(path) as f:
            next(f, None)
            for line in f:
                cols = line.split()
                if len(cols) < 10:
                    continue
                inode = int(cols[9])
                if inode == 0:
                    continue
                out[inode] = (int(cols[1].rsplit(":", 1)[1], 16), int(cols[2].rsplit(":", 1)[1], 16),
                              int(cols[3], 16))
    except FileNotFoundError:
        pass
    return out


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        m = re.fullmatch(r"socket:\[(\d+)\]", target)
        if m:
            inodes.add(int(m.group(1)))
    return inodes


def sockets_of(pids: list[int]) -> Sockets:
    """The TCP sockets (IPv4 and IPv6) open in processes `pids` right now."""
    out = Sockets()
    for pid in pids:
        table = {**_parse_tcp(f"/proc/{pid}/net/tcp"), **_parse_tcp(f"/proc/{pid}/net/tcp6")}
        for inode in _socket_inodes(pid):
            if inode not in table:
                continue
            local, remote, state = table[inode]
            if state == TCP_LISTEN:
                out.listening.add(local)
            elif state != TCP_TIME_WAIT:
                out.connections.add((local, remote))
    return out


def listener_pid(port: int) -> int:
    """Pid of the process listening on TCP `port` on this host; NetFaultError if none."""
    inodes = {inode for inode, (local, _, state) in {**_parse_tcp("/proc/net/tcp"),
                                                      **_parse_tcp("/proc/net/tcp6")}.items()
              if local == port and state == TCP_LISTEN}
    if inodes:
        for entry in os.listdir("/proc"):
            if entry.isdigit() and _socket_inodes(int(entry)) & inodes:
                return int(entry)
    raise NetFaultError(f"no process listens on port {port}")


def _between(a: Sockets, b: Sockets) -> set[tuple[int, int]]:
    """(source port, destination port) of every packet direction of the connections
    between side a and side b: a's connections to b's listening ports or to b's
    sockets, and the other way round."""
    pairs = set()
    for (local, remote) in a.connections:
        if remote in b.listening or (remote, local) in b.connections:
            pairs |= {(local, remote), (remote, local)}
    for (local, remote) in b.connections:
        if remote in a.listening or (remote, local) in a.connections:
            pairs |= {(local, remote), (remote, local)}
    return pairs


# ---------------------------------------------------------------- the faults

def _set(items) -> str:
    return "{ " + ", ".join(str(i) for i in sorted(items)) + " }"


def _pairs(pairs) -> str:
    return "{ " + ", ".join(f"{s} . {d}" for s, d in sorted(pairs)) + " }"


class _Registry:
    """This process's active cuts, its nft table and the cgroups it made."""

    def __init__(self):
        self.lock = threading.RLock()
        self.table = f"{TABLE_PREFIX}{os.getpid()}"
        self.active: dict[str, "Partition"] = {}
        self.cgroups: dict[int, tuple[str, str]] = {}  # pid -> (our cgroup dir, its own cgroup path)
        self.users: dict[int, int] = {}  # pid -> active cuts that involve it
        self.counter = itertools.count(1)
        self._mount = ""

    @property
    def mount(self) -> str:
        if not self._mount:
            self._mount = _cgroup2_mount()
        return self._mount

    @property
    def base(self) -> str:
        return os.path.join(self.mount, self.table)

    def cgroup_name(self, pid: int) -> str:
        """The path nft resolves (relative to /sys/fs/cgroup) of pid's cgroup."""
        return os.path.relpath(os.path.join(self.base, f"p{pid}"), CGROUP_ROOT)

    def enter(self, pids: list[int]) -> list[int]:
        """Move `pids` into cgroups of their own (once); returns those still alive."""
        os.makedirs(self.base, exist_ok=True)
        alive: list[int] = []
        try:
            for pid in pids:
                if pid not in self.cgroups:
                    try:
                        own = _own_cgroup(pid)
                    except FileNotFoundError:
                        continue  # exited
                    d = os.path.join(self.base, f"p{pid}")
                    os.makedirs(d, exist_ok=True)
                    if not _move(pid, d):
                        os.rmdir(d)
                        continue
                    self.cgroups[pid] = (d, own)
                self.users[pid] = self.users.get(pid, 0) + 1
                alive.append(pid)
        except BaseException:
            self.leave(alive)
            raise
        return alive

    def leave(self, pids: list[int]) -> None:
        """Undo `enter` for `pids`: a process no cut involves any more goes back to
        its own cgroup, and ours is removed."""
        for pid in pids:
            self.users[pid] = self.users.get(pid, 1) - 1
            if self.users[pid] > 0:
                continue
            del self.users[pid]
            d, own = self.cgroups.pop(pid)
            _move(pid, os.path.join(self.mount, own.lstrip("/")))
            _rmdir_when_empty(d)
        if not self.cgroups:
            _rmdir_when_empty(self.base)


def _rmdir_when_empty(d: str, timeout_s: float = 5.0) -> None:
    """rmdir a cgroup directory; an exiting process may keep it busy for a moment."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.rmdir(d)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise NetFaultError(f"cannot remove cgroup {d}: {exc}") from exc
            time.sleep(0.05)


_registry = _Registry()


class Partition:
    """One active cut (see the module docstring); `heal()` removes it (idempotent).
    A context manager: healed on exit, whatever happened inside."""

    def __init__(self, victim: str, mode: str, chain: str, pids: list[int]):
        self.victim = victim
        self.mode = mode
        self.chain = chain
        self._pids = pids
        self.started = time.monotonic()
        self.healed_at: float | None = None

    @property
    def active(self) -> bool:
        return self.healed_at is None

    def heal(self) -> None:
        """Remove the cut: packets flow again (connections the victim or the others
        gave up on meanwhile are re-established by them). Raises NetFaultError if the
        rules could not be removed."""
        with _registry.lock:
            if not self.active:
                return
            self.healed_at = time.monotonic()
            _registry.active.pop(self.chain, None)
            try:
                if _registry.active:
                    _nft(f"flush chain inet {_registry.table} {self.chain}\n"
                         f"delete chain inet {_registry.table} {self.chain}\n")
                else:
                    _delete_table(_registry.table)
            finally:
                _registry.leave(self._pids)

    def __enter__(self) -> "Partition":
        return self

    def __exit__(self, *exc) -> None:
        self.heal()

    def __repr__(self) -> str:
        return f"Partition({self.victim!r}, {self.mode!r}, {'active' if self.active else 'healed'})"


def _delete_table(table: str) -> None:
    if f"table inet {table}" in _nft("list tables"):
        _nft(f"delete table inet {table}\n")


def cut(cluster: DevCluster, name: str, mode: str) -> Partition:
    """Cut service `name` of `cluster` off, in `mode` (ZOOKEEPER, PEERS or ALL; see the
    module docstring), now. Returns the Partition to heal (or use it as a context
    manager). Raises NetFaultError (nothing left behind) if the cut cannot be made,
    e.g. the service is not running."""
    if mode not in MODES:
        raise NetFaultError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
    svc = cluster.services.get(name)
    if svc is None or not pid_alive(svc.pid):
        raise NetFaultError(f"service {name!r} is not running")
    require_nft()
    if mode == ZOOKEEPER:
        servers = cluster.zookeeper.split("/", 1)[0].split(",")  # "host:port[,host:port][/chroot]"
        others = sorted({listener_pid(int(hp.rsplit(":", 1)[1])) for hp in servers})
    elif mode == PEERS:
        others = [s.pid for n, s in cluster.services.items() if n != name and pid_alive(s.pid)]
    else:
        others = []
    with _registry.lock:
        chain = f"cut_{next(_registry.counter)}"
        pids = _registry.enter([svc.pid, *others])
        try:
            if svc.pid not in pids:
                raise NetFaultError(f"service {name!r} exited during the cut")
            _nft(_rules(_registry.table, chain, svc.pid, [p for p in pids if p != svc.pid], mode))
        except BaseException:
            _registry.leave(pids)
            if not _registry.active:
                _delete_table(_registry.table)
            raise
        fault = Partition(name, mode, chain, pids)
        _registry.active[chain] = fault
        return fault


def _rules(table: str, chain: str, victim: int, others: list[int], mode: str) -> str:
    """The nft script adding base chain `chain` (output hook) for one cut. Processes
    are already in their cgroups, so sockets read now and `socket cgroupv2` matches
    together cover every packet of the cut."""
    a = sockets_of([victim])
    a_cgroup = f'socket cgroupv2 level 2 "{_registry.cgroup_name(victim)}"'
    rules: list[str] = []
    if mode == ALL:
        own = {(local, remote) for (local, remote) in a.connections if (remote, local) in a.connections}
        external = a.connections - own
        if external:
            both_ways = external | {(remote, local) for local, remote in external}
            rules.append(f"tcp sport . tcp dport {_pairs(both_ways)} drop")
        if a.listening:
            rules.append(f"{a_cgroup} tcp dport {_set(a.listening)} accept")  # to itself
        rules.append(f"{a_cgroup} drop")  # new connections of the victim, to anyone else
        if a.listening:
            if own:
                rules.append(f"tcp sport . tcp dport {_pairs(own)} accept")  # its old ones to itself
            rules.append(f"tcp dport {_set(a.listening)} drop")  # anyone's packets to its services
    else:
        b = sockets_of(others)
        existing = _between(a, b)
        if existing:
            rules.append(f"tcp sport . tcp dport {_pairs(existing)} drop")
        if b.listening:
            rules.append(f"{a_cgroup} tcp dport {_set(b.listening)} drop")
        if a.listening:
            for pid in others:
                rules.append(f'socket cgroupv2 level 2 "{_registry.cgroup_name(pid)}" '
                             f"tcp dport {_set(a.listening)} drop")
    body = "".join(f"    {r}\n" for r in rules)
    return (f"table inet {table} {{\n"
            f"  chain {chain} {{\n"
            f"    type filter hook output priority filter; policy accept;\n"
            f"{body}"
            f"  }}\n"
            f"}}\n")


def active() -> list[Partition]:
    """The cuts of this process not healed yet."""
    with _registry.lock:
        return list(_registry.active.values())


def heal_all() -> None:
    """Heal every active cut of this process and delete its table and cgroups (safe
    to call any time; registered with atexit)."""
    with _registry.lock:
        errors = []
        for fault in list(_registry.active.values()):
            try:
                fault.heal()
            except Exception as exc:  # noqa: BLE001 - heal the others, then report
                errors.append(exc)
        if shutil.which("nft") is not None:
            _delete_table(_registry.table)
        if errors:
            raise errors[0]


def remove_stale() -> list[str]:
    """Delete tables `inet exactly_faults_<pid>` and their cgroups whose test process
    is gone (killed before it could heal); returns the names removed."""
    removed = []
    listing = _nft("list tables")
    for m in re.finditer(rf"table inet ({TABLE_PREFIX}(\d+))", listing):
        if not pid_alive(int(m.group(2))):
            _nft(f"delete table inet {m.group(1)}\n")
            removed.append(m.group(1))
    mount = _cgroup2_mount()
    for entry in os.listdir(mount):
        m = re.fullmatch(rf"{TABLE_PREFIX}(\d+)", entry)
        if not m or pid_alive(int(m.group(1))):
            continue
        base = os.path.join(mount, entry)
        try:
            for child in os.listdir(base):
                d = os.path.join(base, child)
                if not os.path.isdir(d):
                    continue
                with open(os.path.join(d, "cgroup.procs")) as f:
                    for pid in f.read().split():
                        _move(int(pid), mount)
                _rmdir_when_empty(d)
            _rmdir_when_empty(base)
        except FileNotFoundError:  # another test process (another xdist worker) removed it first
            continue
        removed.append(base)
    return removed


def _at_exit() -> None:
    try:
        heal_all()
    except Exception:  # noqa: BLE001 - interpreter exit: nothing left to report to
        pass


atexit.register(_at_exit)


@pytest.fixture
def network_faults():
    """Checks that network faults can be made (fails the test loudly otherwise),
    removes what a killed earlier run left, and heals every cut the test made when it
    ends, passed or failed. Yields this module."""
    try:
        require_nft()
        remove_stale()
        _cgroup2_mount()
    except NetFaultError as exc:
        pytest.fail(str(exc))
    try:
        yield sys.modules[__name__]
    finally:
        heal_all()
