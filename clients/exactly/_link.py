"""The blocking SDK's link to a service: its `Client/Calls` messages as frames on a TCP
connection instead of gRPC stream messages (exactly_wire.links; docs/sdk.md, "Calls on
one stream per service").

A gRPC message costs the client grpcio's per-message work: the caller hands it to
grpcio's writer thread, the channel's poller thread moves the bytes, a reader thread
takes the reply and wakes the caller. On a link the caller writes the frame itself
(`Wire.send`) and one reader thread per link resolves the replies: two thread wakes a
call instead of four, and the service reads a frame instead of an HTTP/2 message.

`connect` sets a link up: `Client/Attach` on the channel (the call's metadata and
certificate are what the link's calls then run with), a TCP connection to the port it
names on the same host (TLS when the channel is TLS, verified as the channel is), the
ticket, the service's ACK. It raises LinkUnavailable for every way that can fail; the
caller then stays on its gRPC stream.

TLS goes through an ssl.SSLObject over memory buffers rather than an SSLSocket, so that
the reader thread and a writing thread never drive one OpenSSL connection at once:
`_tls_lock` guards the SSLObject, `_send_lock` keeps the encrypted records in order.
"""
from __future__ import annotations

import select
import socket
import ssl
import struct
import threading
import time
from typing import Any

import grpc

from exactly_wire.links import ACK, offers_link, split_address, tcp_keepalive
from exactly_wire.security import TransportSecurity, client_ssl_context
from exactly_wire.v1 import exactly_pb2 as pb

CLIENT_ATTACH_METHOD = "/exactly.v1.Client/Attach"
_READ_BYTES = 256 * 1024
_LINGER_ABORT = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection


class LinkUnavailable(Exception):
    """No link to the service: it offers none (a version without Client/Attach, no link
    port, its links or this principal's at their bound), Attach failed, or the port
    could not be reached, handshaken with or did not take the ticket in time."""


class Wire:
    """A link's connection, its socket non-blocking. Thread-safe for one reader and one
    writer at a time (the link's). `encode(data)` -> the bytes to send for `data` (TLS
    records, in the order they must go); `send_some(data)` sends what the socket takes
    now and returns the rest (empty: all sent), never waiting; `send_all(data, timeout_s)`
    waits for room up to `timeout_s` (s), else raises TimeoutError; `send(data, timeout_s)`
    is both. `recv(wait_s)` -> the next bytes, b"" once the connection ended, None when
    none came within `wait_s` (s). Errors: OSError or ssl.SSLError. `abort()` ends it at
    once, also for a reader waiting in `recv`; `close()` releases the socket (the
    reader's, at its end)."""

    def __init__(self, sock: socket.socket, tls: ssl.SSLObject | None = None,
                 incoming: ssl.MemoryBIO | None = None, outgoing: ssl.MemoryBIO | None = None):
        self.sock = sock
        sock.setblocking(False)
        self._tls, self._incoming, self._outgoing = tls, incoming, outgoing
        self._tls_lock = threading.Lock()

    def encode(self, data: bytes) -> bytes:
        if self._tls is None:
            return data
        with self._tls_lock:
            self._tls.write(data)
            return self._outgoing.read()

    def send_some(self, data: bytes | memoryview) -> memoryview:
        view = memoryview(data)
        while view:
            try:
                sent = self.sock.send(view)
            except (BlockingIOError, InterruptedError):
                break
            view = view[sent:]
        return view

    def send_all(self, data: bytes | memoryview, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        rest = self.send_some(data)
        while rest:
            left = deadline - time.monotonic()
            if left <= 0 or not _ready(self.sock, select.POLLOUT, left):
                raise TimeoutError(f"the link took nothing for {timeout_s:.1f} s")
            rest = self.send_some(rest)

    def send(self, data: bytes, timeout_s: float) -> None:
        self.send_all(self.encode(data), timeout_s)

    def recv(self, wait_s: float) -> bytes | None:
        while True:
            if self._tls is not None:
                with self._tls_lock:
                    try:
                        return self._tls.read(_READ_BYTES)
                    except ssl.SSLWantReadError:
                        pass
                    except ssl.SSLZeroReturnError:
                        return b""
            if not _ready(self.sock, select.POLLIN, wait_s):
                return None
            try:
                data = self.sock.recv(_READ_BYTES)
            except (BlockingIOError, InterruptedError):
                continue
            if self._tls is None or not data:
                return data
            with self._tls_lock:
                self._incoming.write(data)

    def abort(self) -> None:
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ABORT)
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a reader waiting in poll()
        except OSError:
            pass

    def close(self) -> None:
        self.abort()
        self.sock.close()


def _ready(sock: socket.socket, event: int, timeout_s: float) -> bool:
    """Whether `sock` is ready for `event` (select.POLLIN / POLLOUT; an error or hang-up
    counts) within `timeout_s` (s)."""
    poller = select.poll()
    poller.register(sock, event)
    return bool(poller.poll(max(timeout_s, 0.0) * 1000))


def _handshake(sock: socket.socket, ctx: ssl.SSLContext, host: str, deadline: float) -> Wire:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=host)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            pending = outgoing.read()
            if pending:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                sock.sendall(pending)
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            data = sock.recv(_READ_BYTES)
            if not data:
                raise ConnectionError("the link port closed the connection during the TLS handshake")
            incoming.write(data)
    pending = outgoing.read()
    if pending:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        sock.sendall(pending)
    return Wire(sock, tls, incoming, outgoing)


class Connector:
    """Sets up links to the service at `address` over `channel` (the module docstring).
    `connect()` -> a Wire past the ACK, within `timeout_s` (s) in all; raises
    LinkUnavailable."""

    def __init__(self, channel: Any, address: str, security: TransportSecurity, timeout_s: float = 5.0,
                 keepalive_s: float = 0.0):
        self._attach = channel.unary_unary(CLIENT_ATTACH_METHOD,
                                           request_serializer=pb.TunnelAttachRequest.SerializeToString,
                                           response_deserializer=pb.TunnelAttachResponse.FromString)
        self.host = split_address(address)
        self._security = security
        self._timeout_s = timeout_s
        self._keepalive_s = keepalive_s

    def connect(self) -> Wire:
        deadline = time.monotonic() + self._timeout_s
        try:
            answer = self._attach(pb.TunnelAttachRequest(), timeout=self._timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            raise LinkUnavailable(f"Client/Attach failed: {getattr(code, 'name', code)}") from None
        except ValueError as exc:  # the channel closed
            raise LinkUnavailable(f"Client/Attach not sent: {exc}") from None
        if not offers_link(answer):
            raise LinkUnavailable("the service offers no link")
        where = f"{self.host}:{answer.port}"
        sock = None
        try:
            sock = socket.create_connection((self.host, answer.port),
                                            timeout=max(deadline - time.monotonic(), 0.001))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tcp_keepalive(sock, self._keepalive_s)
            ctx = client_ssl_context(self._security)
            wire = _handshake(sock, ctx, self.host, deadline) if ctx is not None else Wire(sock)
            wire.send(answer.ticket, deadline - time.monotonic())
            ack = b""
            while len(ack) < len(ACK):
                data = wire.recv(max(deadline - time.monotonic(), 0.0))
                if not data:  # None: not within the deadline; b"": refused (closed)
                    raise ConnectionError("no ACK" if data is None else "the ticket was refused")
                ack += data
        except (OSError, ssl.SSLError, ValueError) as exc:
            if sock is not None:
                Wire(sock).close()
            raise LinkUnavailable(f"link to {where} not set up: {exc!r}") from None
        if ack != ACK:
            wire.close()
            raise LinkUnavailable(f"link to {where}: unexpected answer {ack!r}")
        return wire


__all__ = ["CLIENT_ATTACH_METHOD", "Connector", "LinkUnavailable", "Wire"]
