"""TLS of the Kafka listener with its handshakes off the event loop (docs/design.md,
"SASL", "TLS handshakes off the event loop").

With SASL on, a Kafka port completes TLS for anyone (SASL_SSL clients present no
certificate), and a TLS 1.3 server handshake costs OpenSSL 3 about 0.5 ms of CPU: on the
service's one event loop, a flood of certificate-less connections took that time from
every other client's requests. `OffloadedHandshake` is asyncio's own SSLProtocol
(`asyncio.sslproto`, the implementation the standard library uses for every TLS
connection since Python 3.11) whose handshake steps run on HANDSHAKE_THREADS worker
threads: OpenSSL releases the GIL while it computes, so the event loop goes on meanwhile.
Everything after the handshake (records, close_notify, flow control) is asyncio's.

While a step runs in a worker thread the connection's memory BIOs belong to it: bytes
that arrive meanwhile wait in a list and go into the BIO when the step returned (then the
next step runs), and a connection lost meanwhile is handled once the step returned. The
protocol reads the socket in READ_BUFFER_BYTES chunks (asyncio's default, 256 KB zeroed
per connection, is what a connection would cost before it said anything).

This subclass overrides three methods of `asyncio.sslproto.SSLProtocol`
(`_do_handshake`, `buffer_updated`, `connection_lost`) and reads its state; a Python
whose SSLProtocol differs fails `tests/unit/services/common/kafka/test_tls.py`.
"""
from __future__ import annotations

import asyncio
import ssl
import traceback
from asyncio import sslproto
from concurrent.futures import ThreadPoolExecutor

HANDSHAKE_THREADS = 2
READ_BUFFER_BYTES = 16 * 1024

_executor: ThreadPoolExecutor | None = None


def _handshakes() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(HANDSHAKE_THREADS, thread_name_prefix="tls-handshake")
    return _executor


class OffloadedHandshake(sslproto.SSLProtocol):
    """asyncio's SSLProtocol (server or client side) with each handshake step in a
    worker thread (module docstring). Made like SSLProtocol:
    `OffloadedHandshake(loop, app_protocol, ssl_context, waiter, server_side=True,
    ssl_handshake_timeout=s)`, then the protocol of a plain transport
    (`loop.connect_accepted_socket(lambda: it, sock)`); `waiter` is done once the
    handshake ended (its exception when it failed) and `app_transport()` is the TLS
    transport then."""

    max_size = READ_BUFFER_BYTES

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._step: asyncio.Future | None = None  # the handshake step in a worker thread
        self._arrived: list[bytes] = []  # bytes received while a step runs
        self._lost: list = []  # [exc] of a connection lost while a step runs

    def app_transport(self) -> asyncio.Transport:
        return self._get_app_transport()

    def buffer_updated(self, nbytes: int) -> None:
        if self._step is not None:  # the BIO is the worker's: keep the bytes for later
            self._arrived.append(bytes(self._ssl_buffer_view[:nbytes]))
            return
        super().buffer_updated(nbytes)

    def connection_lost(self, exc) -> None:
        if self._step is not None:
            self._lost.append(exc)  # after the step: connection_lost reads the BIO
            return
        super().connection_lost(exc)

    def _do_handshake(self) -> None:
        if self._step is not None:
            return
        sslobj = self._sslobj

        def step():
            try:
                sslobj.do_handshake()
            except sslproto.SSLAgainErrors:
                return False
            except ssl.SSLError as exc:
                return exc.with_traceback(None)  # its traceback would hold this thread's frames
            return True
        self._step = asyncio.ensure_future(self._loop.run_in_executor(_handshakes(), step), loop=self._loop)
        self._step.add_done_callback(self._stepped)

    def _stepped(self, step: asyncio.Future) -> None:
        self._step = None
        if self._lost:
            super().connection_lost(self._lost.pop())
            return
        if step.cancelled() or self._state != sslproto.SSLProtocolState.DO_HANDSHAKE:
            return  # closed meanwhile (the handshake timeout, an abort)
        result = step.exception() or step.result()
        step = None  # the step's future holds a failure: not in this frame (below)
        if result is True:
            self._on_handshake_complete(None)
        elif isinstance(result, BaseException):
            # SSLProtocol raises it in a frame whose caller is this one: without the name
            # here, its traceback makes no cycle keeping the connection until a collection.
            failure, result = result, None
            self._on_handshake_complete(failure.with_traceback(None))
            failure = None
        else:
            self._process_outgoing()
        arrived, self._arrived = self._arrived, []
        for data in arrived:  # what came during the step, as it would have come now
            self._incoming.write(data)
        if arrived:
            if self._state == sslproto.SSLProtocolState.DO_HANDSHAKE:
                self._do_handshake()
            elif self._state == sslproto.SSLProtocolState.WRAPPED:
                self._do_read()


async def accepted_transport(loop: asyncio.AbstractEventLoop, conn, protocol: asyncio.Protocol,
                             ssl_context: ssl.SSLContext | None, handshake_timeout_s: float,
                             shutdown_timeout_s: float) -> asyncio.Transport:
    """The transport of an accepted socket `conn` to `protocol`: plain with no
    `ssl_context`, else over TLS once its server handshake ended (steps in worker threads:
    `OffloadedHandshake`), bounded by `handshake_timeout_s` (s). The TLS protocol is the
    socket's from the start, so no byte of the handshake is read by anything else. Raises
    the handshake's failure (ssl.SSLError, ConnectionError, TimeoutError); the socket is
    then closed."""
    if ssl_context is None:
        transport, _ = await loop.connect_accepted_socket(lambda: protocol, conn)
        return transport
    handshake = loop.create_future()
    tls = OffloadedHandshake(loop, protocol, ssl_context, handshake, server_side=True,
                             ssl_handshake_timeout=handshake_timeout_s, ssl_shutdown_timeout=shutdown_timeout_s)
    raw, _ = await loop.connect_accepted_socket(lambda: tls, conn)
    try:
        await handshake
    except BaseException as exc:
        raw.abort()
        # The failure's traceback holds the frames it passed, which hold the failure (this
        # one's future, SSLProtocol's handshake_exc): cycles that kept the connection's
        # TLS state (OpenSSL's buffers, the protocol's) until a full garbage collection,
        # 60 KB a connection. Without their locals, it goes with the connection.
        traceback.clear_frames(exc.__traceback__)
        handshake = tls = raw = None  # noqa: F841 - this frame's, which is still running
        raise
    return tls.app_transport()
