"""Password guessing at full rate: PLAIN logins with wrong passwords, each sent as soon as
the previous one of its worker was answered, for a while.

    python guess_flood.py SECONDS KAFKA_HOST:PORT CA_PEM WORKERS USER [SOURCE_IP]
        [--grpc HOST:PORT CERT_PEM KEY_PEM]

USER "*" names a made-up user in every attempt; any other name is guessed. WORKERS
asyncio workers on the Kafka port (TLS without a certificate, from SOURCE_IP when
given), and as many threads on the gRPC port with --grpc (Cluster/SaslAuthenticate,
with the given client certificate: the gRPC port requires one). Prints
{"answered": n} at the end."""
from __future__ import annotations

import asyncio
import json
import ssl
import struct
import sys
import threading
import time


def frame(api_key: int, version: int, corr: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api_key, version, corr, 5) + b"guess"
    return struct.pack(">i", len(header) + len(body)) + header + body


async def kafka_worker(n: int, end: float, host: str, port: int, ctx, source, user: str, counts: list) -> None:
    loop = asyncio.get_running_loop()
    i = 0
    while loop.time() < end:
        i += 1
        name = (f"made-up-{n}-{i}" if user == "*" else user).encode()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                host, port, ssl=ctx, server_hostname=host, local_addr=(source, 0) if source else None), 30)
            try:
                writer.write(frame(17, 1, 1, struct.pack(">h", 5) + b"PLAIN"))
                size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 30))[0]
                await asyncio.wait_for(reader.readexactly(size), 30)
                token = b"\0" + name + b"\0" + f"guess-{n}-{i}".encode()
                writer.write(frame(36, 1, 2, struct.pack(">i", len(token)) + token))
                size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 30))[0]
                await asyncio.wait_for(reader.readexactly(size), 30)
                counts[0] += 1
            finally:
                writer.close()
        except (ConnectionError, OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ssl.SSLError):
            await asyncio.sleep(0.05)


def grpc_worker(n: int, end: float, address: str, cert: str, key: str, ca: str, user: str, counts: list) -> None:
    import grpc
    from exactly_wire.v1 import exactly_pb2 as pb
    from exactly_wire.v1 import exactly_pb2_grpc as pbg
    creds = grpc.ssl_channel_credentials(open(ca, "rb").read(), open(key, "rb").read(), open(cert, "rb").read())
    with grpc.secure_channel(address, creds) as channel:
        stub = pbg.ClusterStub(channel)
        i = 0
        while time.monotonic() < end:
            i += 1
            name = f"made-up-g{n}-{i}" if user == "*" else user
            try:
                stub.SaslAuthenticate(pb.SaslAuthenticateRequest(
                    mechanism="PLAIN", auth_bytes=f"\0{name}\0guess-{n}-{i}".encode()), timeout=30)
                counts[0] += 1
            except grpc.RpcError:
                time.sleep(0.05)


async def main() -> None:
    args = sys.argv[1:]
    grpc_args = None
    if "--grpc" in args:
        at = args.index("--grpc")
        grpc_args, args = args[at + 1:at + 4], args[:at]
    seconds, address, ca, workers, user = float(args[0]), args[1], args[2], int(args[3]), args[4]
    source = args[5] if len(args) > 5 else None
    host, port = address.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = False
    counts = [0]
    end_mono = time.monotonic() + seconds
    threads = []
    if grpc_args is not None:
        threads = [threading.Thread(target=grpc_worker, args=(n, end_mono, *grpc_args, ca, user, counts), daemon=True)
                   for n in range(workers)]
        for t in threads:
            t.start()
    end = asyncio.get_running_loop().time() + seconds
    await asyncio.gather(*(kafka_worker(n, end, host, int(port), ctx, source, user, counts) for n in range(workers)))
    for t in threads:
        t.join(60)
    print(json.dumps({"answered": counts[0]}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
