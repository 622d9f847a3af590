"""Connection limits of a service's two listeners, the gRPC port and the Kafka port
(docs/design.md, "Connections"; Kafka's broker settings of the same names).

- `max.connections`: connections one listener holds at once; more are refused.
- `max.connections.per.ip` and `max.connections.per.ip.overrides` ("ip:count,..."):
  connections one peer address holds on one listener.
- `max.connection.creation.rate` (KIP-612): new connections per second one listener
  accepts; more are refused (a token bucket holding one second's worth).
- a file-descriptor reserve (`exactly.connections.fd.reserve`): at start the process
  raises its RLIMIT_NOFILE soft limit to the hard limit; each of the two listeners may
  hold at most (limit - reserve - the descriptors not held by connections) / 2
  connections whatever `max.connections` says (`DescriptorBudget`, updated at every
  sweep: a partition leader's segments and indexes count as they open), so connections
  can never take the descriptors ZooKeeper's session, the segments and the indexes need.

`ConnectionLimits` is the pure accounting (no sockets): the Kafka listener asks it
before its TLS handshake, the gRPC port's `GrpcConnectionSweeper` on every sweep.
A refusal is counted in `exactly_connections_refused_total{listener, reason}` and
logged at most once per `LOG_INTERVAL_S` per listener and reason (`RefusalLog`).
"""
from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
import time
from dataclasses import dataclass, field
from typing import Callable

from ..metrics import CONNECTIONS_REFUSED as REFUSED
from ..settings import ServiceSchema, key_of
from . import peer_addresses, sock_diag
from .peer_addresses import normalize_ip

parse_overrides = peer_addresses.parse_overrides  # part of the limits' API (max.connections.per.ip.overrides)

log = logging.getLogger(__name__)

MAX_INT = 2147483647  # Kafka's Integer.MAX_VALUE: a limit this high is no limit
# Key names, for refusal reasons and messages (the values: ServiceSchema attributes).
MAX_CONNECTIONS = key_of(ServiceSchema, "max_connections")
MAX_CONNECTIONS_PER_IP = key_of(ServiceSchema, "max_connections_per_ip")
MAX_CONNECTION_CREATION_RATE = key_of(ServiceSchema, "max_connection_creation_rate")
CONNECTIONS_MAX_IDLE_MS = key_of(ServiceSchema, "connections_max_idle_ms")
SASL_SERVER_MAX_RECEIVE_SIZE = key_of(ServiceSchema, "sasl_server_max_receive_size")
SASL_AUTHENTICATION_TIMEOUT_MS = key_of(ServiceSchema, "exactly_sasl_authentication_timeout_ms")
LOG_INTERVAL_S = 10.0

REASONS = (MAX_CONNECTIONS, MAX_CONNECTIONS_PER_IP, MAX_CONNECTION_CREATION_RATE, CONNECTIONS_MAX_IDLE_MS,
           "ssl.handshake.timeout", "ssl.handshake.failed", SASL_SERVER_MAX_RECEIVE_SIZE,
           SASL_AUTHENTICATION_TIMEOUT_MS)


def declare_series(listener: str) -> None:
    """Create every refusal series of `listener` at 0."""
    for reason in REASONS:
        REFUSED.labels(listener, reason)


class TokenBucket:
    """`rate` tokens per second, holding at most `rate` (one second's worth, at least 1);
    `take()` spends one when there is one (KIP-612's connection creation rate; also the
    InitProducerId rate per principal, services.common.security.pid_binding). clock: monotonic s."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic):
        self.rate = float(rate)
        self.capacity = max(self.rate, 1.0)
        self.tokens = self.capacity
        self.clock = clock
        self.stamp = clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0 - 1e-9:  # a whole token, up to float rounding
            self.tokens = max(self.tokens - 1.0, 0.0)
            return True
        return False

    def wait_ms(self) -> int:
        """After a refused take(): ms until a token is there (at least 1)."""
        return max(1, int((1 - self.tokens) / self.rate * 1000 + 0.999))


@dataclass
class ConnectionLimits:
    """Admission of one listener's connections. `max_connections`: the listener's cap
    (already bounded by the fd budget); `per_ip` and `overrides` ({ip: count}):
    connections per peer address; `rate`: new connections per second (MAX_INT: no
    limit). `admit(ip)` returns None and counts the connection, or the name of the
    limit that refuses it; `release(ip)` uncounts an admitted one."""

    max_connections: int = MAX_INT
    per_ip: int = MAX_INT
    overrides: dict[str, int] = field(default_factory=dict)
    rate: float = MAX_INT
    clock: Callable[[], float] = time.monotonic
    active: int = 0
    by_ip: dict[str, int] = field(default_factory=dict)
    # Whether `active` counts a listener's open connections (the Kafka port's, admitted and
    # released as they come and go); the gRPC port's are counted at each sweep instead.
    counted: bool = True

    def __post_init__(self):
        self.overrides = {normalize_ip(ip): n for ip, n in self.overrides.items()}
        self._bucket = TokenBucket(self.rate, self.clock) if self.rate < MAX_INT else None

    def limit_for(self, ip: str) -> int:
        """Connections `ip` may hold (its override, else max.connections.per.ip)."""
        return self.overrides.get(ip, self.per_ip)

    def admit(self, ip: str) -> str | None:
        ip = _canonical(ip)
        if self.active >= self.max_connections:
            return MAX_CONNECTIONS
        if self.by_ip.get(ip, 0) >= self.limit_for(ip):
            return MAX_CONNECTIONS_PER_IP
        if self._bucket is not None and not self._bucket.take():
            return MAX_CONNECTION_CREATION_RATE
        self.active += 1
        self.by_ip[ip] = self.by_ip.get(ip, 0) + 1
        return None

    def release(self, ip: str) -> None:
        ip = _canonical(ip)
        n = self.by_ip.get(ip, 0)
        if n <= 0:
            return
        self.active -= 1
        if n == 1:
            del self.by_ip[ip]
        else:
            self.by_ip[ip] = n - 1

    @property
    def unlimited(self) -> bool:
        """True when nothing but the fd budget limits this listener."""
        return (self.max_connections >= MAX_INT and self.per_ip >= MAX_INT and not self.overrides
                and self._bucket is None)


def _canonical(ip: str) -> str:
    try:
        return normalize_ip(ip)
    except ValueError:
        return ip  # a Unix socket path or an unknown peer: counted under its own text


class RefusalLog:
    """Count every refusal (REFUSED) and log it at most once per `interval_s` per
    (listener, reason), with how many were not logged since."""

    def __init__(self, listener: str, interval_s: float = LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.listener = listener
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}
        declare_series(listener)

    def refused(self, reason: str, peer: str, detail: str = "") -> bool:
        """Count one refusal; returns True when it was logged."""
        REFUSED.labels(self.listener, reason).inc()
        now = self.clock()
        last = self._last.get(reason)
        if last is not None and now - last < self.interval_s:
            self._quiet[reason] = self._quiet.get(reason, 0) + 1
            return False
        quiet = self._quiet.pop(reason, 0)
        self._last[reason] = now
        more = f" ({quiet} more since the last such message)" if quiet else ""
        log.warning("%s connection from %s refused: %s%s%s", self.listener, peer, reason,
                    f" ({detail})" if detail else "", more)
        return True


# ------------------------------------------------------------------ file descriptors

def raise_nofile_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to its hard limit (capped at 1048576); returns
    the soft limit now in force. Never fails: an unchangeable limit is kept."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, 1048576) if hard != resource.RLIM_INFINITY else 1048576
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise RLIMIT_NOFILE from %d to %d: %s", soft, target, exc)
    return soft


def connection_budget(nofile: int, reserve: int, max_connections: int, listeners: int = 2) -> int:
    """Connections one listener may hold: `max_connections`, but at most
    (nofile - reserve) / listeners, and at least 1, so the listeners together never
    take the `reserve` descriptors kept for ZooKeeper, the logs and the channels."""
    return max(1, min(max_connections, (nofile - reserve) // max(listeners, 1)))


class DescriptorBudget:
    """The connections each listener may hold given the descriptors the process holds
    otherwise (docs/design.md, "Connections"): (RLIMIT_NOFILE - `reserve` - other) /
    `listeners`, at most `max_connections`, at least 1, where other is every open
    descriptor that is not a connection of a listener (ZooKeeper's session, segments,
    indexes, channels to the other services). `update(connections)` recomputes it from
    the process's open descriptors and the listeners' connections (`connections`: the
    gRPC port's, from its sweep; each ConnectionLimits of `limits` counts its own) and
    sets it as the `max_connections` of every one of `limits`. `nofile`: () -> the soft
    RLIMIT_NOFILE; `descriptors`: () -> open descriptors (tests pass fakes)."""

    def __init__(self, reserve: int, max_connections: int, limits: list[ConnectionLimits],
                 nofile: Callable[[], int] = lambda: resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                 descriptors: Callable[[], int] = lambda: open_descriptors()):
        self.reserve = reserve
        self.max_connections = max_connections
        self.limits = limits
        self.nofile = nofile
        self.descriptors = descriptors
        self.other = 0

    def update(self, connections: int = 0) -> int:
        """Recompute and apply the per-listener budget; returns it."""
        held = self.descriptors()
        if held >= 0:
            self.other = max(0, held - connections - sum(lim.active for lim in self.limits if lim.counted))
        budget = max(1, min(self.max_connections, (self.nofile() - self.reserve - self.other) // 2))
        for lim in self.limits:
            lim.max_connections = budget
        return budget


def open_descriptors() -> int:
    """File descriptors this process has open (Linux /proc/self/fd; -1 elsewhere)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


# ------------------------------------------------------------------ the gRPC port

def parse_proc_net_tcp(text: str, port: int, ipv6: bool) -> list[tuple[int, str]]:
    """(socket inode, peer IP) of every socket in a /proc/net/tcp (or tcp6) table whose
    local port is `port`, that is not listening and that a process holds (inode > 0):
    the connections accepted on that port, handshake or not."""
    out = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10 or parts[3] == "0A":  # 0A: LISTEN
            continue
        local, remote, inode = parts[1], parts[2], int(parts[9])
        if inode == 0 or int(local.rpartition(":")[2], 16) != port:
            continue
        out.append((inode, normalize_ip(_proc_address(remote.rpartition(":")[0], ipv6))))
    return out


def _proc_address(hexaddr: str, ipv6: bool) -> str:
    """An address of /proc/net/tcp: IPv4 as one host-order 32-bit word, IPv6 as four."""
    raw = bytes.fromhex(hexaddr)
    if not ipv6:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))


def socket_descriptors() -> dict[int, int]:
    """socket inode -> file descriptor, for this process's sockets (/proc/self/fd)."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            out[int(target[8:-1])] = int(name)
    return out


def shutdown_socket(fd: int, inode: int) -> bool:
    """Shut down (both directions) the socket `fd` if it still is socket `inode`; the
    descriptor stays its owner's, which sees the connection end and closes it. The
    check runs on a duplicate, so a descriptor closed and reused meanwhile is left
    alone. Returns True when shut."""
    try:
        dup = os.dup(fd)
    except OSError:
        return False
    try:
        if os.fstat(dup).st_ino != inode:
            return False
        sock = socket.socket(fileno=dup)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.detach()
        return True
    finally:
        os.close(dup)


class GrpcConnectionSweeper:
    """Per-IP limits, `max.connections` within the descriptor budget and the creation
    rate on the gRPC port, which grpcio cannot apply itself (its core has one
    process-wide cap, grpc.max_allowed_incoming_connections, set to the fd budget at
    start by `server_options`).

    Every `interval_s` it lists the connections accepted on `port` (`connections()`: the
    kernel's socket diagnostics for the port, handshake done or not) and admits them through a fresh
    `ConnectionLimits`, connections already admitted at the previous sweep first (so an
    established client keeps its place), new ones after, in order of creation, each new
    one also spending a token of the creation-rate bucket. Every connection refused is
    shut down (its descriptor stays grpcio's, which closes it), counted and logged. So a
    limit holds at each sweep, not at accept: between two sweeps a peer may hold more,
    up to the core cap."""

    def __init__(self, port: int, limits: ConnectionLimits, refusals: RefusalLog, interval_s: float,
                 budget: DescriptorBudget | None = None):
        """`budget`: updated at every sweep with the port's connections (it sets
        `limits.max_connections`)."""
        self.port = port
        self.limits = limits
        self.limits.counted = False
        self.refusals = refusals
        self.interval_s = interval_s
        self.budget = budget
        self._bucket = TokenBucket(limits.rate) if limits.rate < MAX_INT else None
        self._admitted: set[int] = set()
        self._sock_diag = True  # until the kernel refuses (connections())

    def plan(self, connections: list[tuple[int, str]]) -> list[tuple[int, str, str]]:
        """(inode, ip, reason) of each connection of `connections` ((inode, ip)) to shut
        down; remembers the others as admitted."""
        fresh = ConnectionLimits(self.limits.max_connections, self.limits.per_ip, dict(self.limits.overrides))
        old = sorted(c for c in connections if c[0] in self._admitted)
        new = sorted(c for c in connections if c[0] not in self._admitted)  # inodes grow with creation
        kept, refused = set(), []
        for inode, ip in old + new:
            reason = fresh.admit(ip)
            if reason is None and inode not in self._admitted and self._bucket is not None \
                    and not self._bucket.take():
                fresh.release(ip)
                reason = MAX_CONNECTION_CREATION_RATE
            if reason is None:
                kept.add(inode)
            else:
                refused.append((inode, ip, reason))
        self._admitted = kept
        return refused

    def connections(self) -> list[tuple[int, str]]:
        """(socket inode, peer IP) of the port's connections: from the kernel's socket
        diagnostics filtered to the port (services.common.transport.sock_diag), or, where
        those cannot be asked, from /proc/self/net/tcp and tcp6, which list every socket
        of the host's network namespace (logged once)."""
        if self._sock_diag:
            try:
                return sock_diag.accepted(self.port)
            except OSError as exc:
                self._sock_diag = False
                log.info("gRPC connection sweep: the kernel's socket diagnostics cannot be asked (%s); "
                         "reading /proc/self/net/tcp instead", exc)
        connections = []
        for name, ipv6 in (("tcp", False), ("tcp6", True)):
            try:
                with open(f"/proc/self/net/{name}") as f:
                    connections += parse_proc_net_tcp(f.read(), self.port, ipv6)
            except FileNotFoundError:
                continue
        return connections

    def sweep(self) -> int:
        """One pass (blocking: run it in a thread); returns the connections shut down."""
        connections = self.connections()
        if self.budget is not None:
            self.budget.update(len(connections))
        refused = self.plan(connections)
        if not refused:
            return 0
        fds = socket_descriptors()
        shut = 0
        for inode, ip, reason in refused:
            fd = fds.get(inode)
            if fd is not None and shutdown_socket(fd, inode):
                shut += 1
                self.refusals.refused(reason, ip, f"limit {self._limit_text(ip, reason)}")
        return shut

    def _limit_text(self, ip: str, reason: str) -> str:
        if reason == MAX_CONNECTIONS_PER_IP:
            return str(self.limits.limit_for(ip))
        if reason == MAX_CONNECTIONS:
            return str(self.limits.max_connections)
        return f"{self.limits.rate:g}/s"

    async def run(self) -> None:
        """Sweep until cancelled; a failing sweep is logged and the next one runs."""
        await run_every(self.interval_s, self.sweep, "gRPC connection sweep")


async def run_every(interval_s: float, blocking: Callable[[], object], what: str) -> None:
    """Call `blocking` in a worker thread now and every `interval_s` after it returned,
    until cancelled; a call that fails is logged (naming `what`) and the next one runs
    (the periodic tasks of the connection limits and of memory.MemoryTrim)."""
    while True:
        try:
            await asyncio.to_thread(blocking)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - best effort until the next call; logged
            log.exception("%s failed", what)
        await asyncio.sleep(interval_s)
