"""Loopback listeners that accept TCP connections and answer nothing, for tests of
what a client does against a service that never speaks.

    with listeners.mute(close_at_accept=True) as address:   # "127.0.0.1:PORT"
        ...
"""
from __future__ import annotations

import contextlib
import socket
import threading
from typing import Iterator


@contextlib.contextmanager
def mute(close_at_accept: bool = False) -> Iterator[str]:
    """'127.0.0.1:PORT' of a listener that accepts every connection and never sends a
    byte. It holds each connection open until the block ends, or with close_at_accept
    closes each one at once, as a TLS listener at its connection limit does (grpcio
    past its cap). The accepting thread stops within 0.2 s of the block's end."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.2)
        held: list[socket.socket] = []
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError):  # TimeoutError included: look at `stop` again
                    conn = server.accept()[0]
                    conn.close() if close_at_accept else held.append(conn)

        thread = threading.Thread(target=accept, name="mute-listener", daemon=True)
        thread.start()
        try:
            yield f"127.0.0.1:{server.getsockname()[1]}"
        finally:
            stop.set()
            thread.join(5)
            for conn in held:
                conn.close()
