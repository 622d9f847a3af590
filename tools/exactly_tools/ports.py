"""Free TCP ports on loopback for the processes the tools start (dev clusters,
PostgreSQL, the benchmark's Redis peer)."""
from __future__ import annotations

import socket

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free on 127.0.0.1 now and not handed out before by this process (the
    kernel may offer a just-closed port again, and a service binds its several ports
    one after the other)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
