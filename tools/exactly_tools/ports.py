"""Free TCP ports on loopback for the processes the tools start (dev clusters,
PostgreSQL, the benchmark's Redis peer, test ZooKeepers).

A port is picked now and bound later by another process, so two things can take it
in between: an outgoing connection (the kernel gives those a local port from the
ephemeral range, ``net.ipv4.ip_local_port_range``) and another process picking ports
the same way. Ports are therefore handed out below the ephemeral range, from a slice
of their own for each pytest-xdist worker (``PYTEST_XDIST_WORKER=gwN``) or, outside
pytest-xdist, for each process id. Where the ephemeral range leaves no room below it,
the kernel picks (``bind(port 0)``) as a fallback.
"""
from __future__ import annotations

import os
import socket

_HANDED_OUT: set[int] = set()
_LOWEST = 10000           # well above the registered services people run on a dev box
_SLICE = 1000             # ports per worker / process
_WORKER_SLOTS = 8         # slices kept for xdist workers gw0..gw7; the rest go by process id
_next: int | None = None  # the next candidate in this process's slice


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _slice() -> range | None:
    """This process's slice of ports, or None when no slice fits below the ephemeral
    range."""
    slots = (_ephemeral_low() - _LOWEST) // _SLICE
    if slots < 2:
        return None
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit() and int(worker[2:]) < min(_WORKER_SLOTS, slots - 1):
        slot = int(worker[2:])
    else:
        spare = max(1, slots - _WORKER_SLOTS)
        slot = (slots - spare) + os.getpid() % spare
    start = _LOWEST + slot * _SLICE
    return range(start, start + _SLICE)


def _bindable(port: int) -> bool:
    """Whether `port` binds on every interface (a ZooKeeper quorum port does), which
    fails too when anything holds it on 127.0.0.1."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 (and on every interface) now, not handed out by this
    process in the current round through its slice, and outside the kernel's ephemeral range where there is room, so an
    outgoing connection cannot take it before the caller's process binds it.

    Returns:
        int: the port number.
    Raises:
        RuntimeError: every port of this process's slice is bound by some process.
    """
    global _next
    ports = _slice()
    if ports is None:
        while True:
            port = _kernel_port()
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
    if _next is None or _next not in ports:
        _next = ports.start + (os.getpid() * 7) % len(ports)  # restarts of a worker do not reuse the same first ports
    for round_ in range(2):
        if round_:
            # Every port of the slice was handed out once: a long test session gets
            # through 1,000. Those handed out a whole round ago were bound by their
            # process or given up long since, so a second round takes any that bind.
            _HANDED_OUT.difference_update(ports)
        for _ in range(len(ports)):
            port, _next = _next, (ports.start + (_next + 1 - ports.start) % len(ports))
            if port not in _HANDED_OUT and _bindable(port):
                _HANDED_OUT.add(port)
                return port
    raise RuntimeError(f"no free port left in {ports.start}..{ports.stop - 1}: every one is bound")


def free_ports(n: int) -> list[int]:
    """`n` distinct ports, each as `free_port` gives them."""
    return [free_port() for _ in range(n)]
