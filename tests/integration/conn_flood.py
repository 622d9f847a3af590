"""Open raw TCP connections that never send a byte (no TLS handshake), and hold them.

    python conn_flood.py SOURCE_IP HOST:PORT=COUNT [HOST:PORT=COUNT ...]

Raises its own RLIMIT_NOFILE (as root, the hard limit too) to hold them all, opens
them 500 at a time (each connect bounded by 10 s), prints one JSON line
{"opened": n, "failed": n}, then every second {"open": n} (connections the server has
not closed yet) until its stdin closes."""
from __future__ import annotations

import asyncio
import json
import resource
import socket
import sys

IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # Linux

def raise_limit(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (n, max(n, hard)))
        except (ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def connect(source: str, host: str, port: int, gate: asyncio.Semaphore) -> socket.socket | None:
    async with gate:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            # The port is chosen at connect, not bind (a bind to port 0 searches the whole range each time).
            sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
            sock.bind((source, 0))
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (host, port)), 10)
            return sock
        except (OSError, asyncio.TimeoutError):
            sock.close()
            return None


def still_open(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


async def main() -> None:
    source, targets = sys.argv[1], [a.rpartition("=") for a in sys.argv[2:]]
    total = sum(int(n) for _, _, n in targets)
    raise_limit(total + 1000)
    gate = asyncio.Semaphore(500)
    jobs = []
    for address, _, n in targets:
        host, _, port = address.rpartition(":")
        jobs += [connect(source, host, int(port), gate) for _ in range(int(n))]
    socks = [s for s in await asyncio.gather(*jobs) if s is not None]
    print(json.dumps({"opened": len(socks), "failed": total - len(socks)}), flush=True)
    stdin = asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    while not stdin.done():
        print(json.dumps({"open": sum(still_open(s) for s in socks)}), flush=True)
        await asyncio.wait([stdin], timeout=1)
    for s in socks:
        s.close()


if __name__ == "__main__":
    asyncio.run(main())
