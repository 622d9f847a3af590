"""A TCP relay that makes its clients' connections come from another loopback address:
it listens on 127.0.0.1 and opens each upstream connection from `source` (e.g.
127.0.0.5), so a service sees the relay's clients at that address. TLS passes through
untouched (the client still verifies the service's certificate for 127.0.0.1). For the
tests that need a client the services tell apart by address, where the client library
cannot choose its source address (grpcio, librdkafka).

    with Relay("127.0.0.5", "127.0.0.1:9092") as relay:
        connect_to(relay.address)          # the service sees 127.0.0.5
"""
from __future__ import annotations

import asyncio
import threading


class Relay:
    def __init__(self, source: str, upstream: str):
        self.source = source
        self.upstream_host, port = upstream.rsplit(":", 1)
        self.upstream_port = int(port)
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"relay-{source}")
        self._server: asyncio.base_events.Server | None = None
        self.port = 0
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the relay did not start")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(
                self.upstream_host, self.upstream_port, local_addr=(self.source, 0)), 10)
        except (OSError, asyncio.TimeoutError):
            writer.close()
            return

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while chunk := await src.read(65536):
                    dst.write(chunk)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    def close(self) -> None:
        async def stop():
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> "Relay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
