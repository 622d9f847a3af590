"""Clients in a process forked from one that used gRPC (docs/design.md, "SDK", Fork).

grpcio's core cannot be used in a child forked while the parent had channels: its
threads are gone, its pollers are shared with the parent, and with its fork handlers
off (as `exactly` sets them, see `exactly/__init__.py`) nothing resets it, so a call
blocks for ever. gRPC's own fork support does not cover the case either: it skips its
handlers whenever another thread is inside a call, and it does not support grpc.aio.

So a process that forked after the SDK opened a gRPC channel (here or in an ancestor)
talks to the cluster over grpclib instead, a pure-Python gRPC implementation on
asyncio that shares no state with grpcio's core. The two speak the same protocol to
the same services; only the client side differs. `sync_channel` and `aio_channel` give
objects with the part of `grpc.Channel` / `grpc.aio.Channel` that the generated stubs
and the client cores use (unary calls, `.future()`, `close()`), raising `PureRpcError`,
a `grpc.RpcError` with `code()` and `details()`, so the one translation seam
(`exactly._client.translate_rpc_error`) stays the only one.

A client created before the fork belongs to the parent: in the child its calls raise
`errors.IllegalStateError` at once (`check_process`), closing it only marks it closed,
and its grpcio channels are kept referenced so that they are never torn down in the
child.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import ssl
import threading
import weakref
from typing import Any, Callable

import grpc

from . import errors
from exactly_wire.security import SASL_AUTHENTICATE_METHOD, SASL_TOKEN_HEADER, TransportSecurity, client_ssl_context

# Whether a gRPC (grpcio) channel was opened by the SDK in this process, and whether
# this process was forked from one that had (then grpcio must not be used here).
_grpc_used = False
_inherited = False
# The grpcio channels of this process: in a forked child they are kept alive for good.
_grpcio_channels: "weakref.WeakSet[Any]" = weakref.WeakSet()
_kept_from_parent: list[Any] = []


def _after_fork_in_child() -> None:
    # Runs in every forked child, also one that will exec at once (subprocess with a
    # preexec_fn): it takes no lock and calls into no library.
    global _inherited, _kept_from_parent
    if _grpc_used:
        _inherited = True
        _kept_from_parent = _kept_from_parent + list(_grpcio_channels)


os.register_at_fork(after_in_child=_after_fork_in_child)


def grpcio_unusable() -> bool:
    """True in a process forked after the SDK used grpcio in an ancestor: channels
    made here must be `sync_channel` / `aio_channel` ones."""
    return _inherited


def note_grpcio_channel(channel: Any) -> Any:
    """Record that this process opened a grpcio `channel`; returns it."""
    global _grpc_used
    _grpc_used = True
    _grpcio_channels.add(channel)
    return channel


def check_process(created_in: int, what: str) -> None:
    """Raise errors.IllegalStateError when a client created in process `created_in`
    is used in another one (a forked child): its threads and connections stayed in
    the parent, so waiting on them would never end."""
    if created_in != os.getpid():
        raise errors.IllegalStateError(
            f"this {what} was created in process {created_in} before a fork(): a forked child "
            f"cannot use it; create a new {what} in the child (the parent's stays usable there)")


class PureRpcError(grpc.RpcError):
    """A failed call of the pure-Python transport: `code()` a grpc.StatusCode,
    `details()` a str, as a grpcio call error."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def _ssl_context(security: TransportSecurity) -> ssl.SSLContext | None:
    """The TLS context of `security` (exactly_wire.security.client_ssl_context), TLS 1.2 or
    newer, speaking HTTP/2."""
    ctx = client_ssl_context(security)
    if ctx is not None:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["h2"])
    return ctx


def _error(exc: BaseException) -> PureRpcError:
    """A grpclib failure as the grpcio status it stands for."""
    from grpclib.exceptions import GRPCError

    if isinstance(exc, GRPCError):
        code = grpc.StatusCode.__members__.get(exc.status.name, grpc.StatusCode.UNKNOWN)
        return PureRpcError(code, exc.message or exc.status.name)
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return PureRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    return PureRpcError(grpc.StatusCode.UNAVAILABLE, f"{type(exc).__name__}: {exc}")


class _Codec:
    """grpclib codec over the generated stubs' own (de)serializers: a call's
    `request_type` is the serializer and its `reply_type` the deserializer."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Callable[[Any], bytes]) -> bytes:
        return message_type(message)

    def decode(self, data: bytes, message_type: Callable[[bytes], Any]) -> Any:
        return message_type(data)


class _Connection:
    """One grpclib channel to `address`, made lazily inside the event loop that uses it."""

    def __init__(self, address: str, security: TransportSecurity):
        host, _, port = address.rpartition(":")
        self._host, self._port = host.strip("[]"), int(port)
        self._security = security
        self._session = security.session()  # SASL: one exchange, then the session token
        self._channel: Any = None
        self._closed = False

    async def call(self, method: str, request: Any, serialize: Callable, deserialize: Callable,
                   timeout: float | None) -> Any:
        """One unary call; raises PureRpcError (DEADLINE_EXCEEDED at `timeout` s,
        whatever the server or the network does)."""
        from grpclib.client import Channel
        from grpclib.const import Cardinality

        if self._closed:
            raise PureRpcError(grpc.StatusCode.CANCELLED, "channel closed")
        if self._channel is None:
            self._channel = Channel(self._host, self._port, codec=_Codec(),
                                    ssl=_ssl_context(self._security))

        async def _raw(path: str, message: Any, ser: Callable, de: Callable, metadata: list,
                       t: float | None) -> Any:
            async with self._channel.request(path, Cardinality.UNARY_UNARY, ser, de, timeout=t,
                                             metadata=metadata) as stream:
                await stream.send_message(message, end=True)
                return await stream.recv_message()

        async def _once() -> Any:
            metadata: list = []
            if self._session is not None:
                from exactly_wire.v1 import exactly_pb2 as pb
                token = await self._session.token_async(
                    lambda req, t: _raw(SASL_AUTHENTICATE_METHOD, req, pb.SaslAuthenticateRequest.SerializeToString,
                                        pb.SaslAuthenticateResponse.FromString, [], t), timeout)
                metadata = [(SASL_TOKEN_HEADER, token)]
            return await _raw(method, request, serialize, deserialize, metadata, timeout)

        try:
            if timeout is None:
                return await _once()
            return await asyncio.wait_for(_once(), timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every transport failure is a status
            raise _error(exc) from None

    def close(self) -> None:
        self._closed = True
        if self._channel is not None:
            self._channel.close()
            self._channel = None


class _LoopThread:
    """The event loop (one daemon thread per process) that runs the synchronous
    clients' pure-Python calls."""

    _lock = threading.Lock()
    _instance: "_LoopThread | None" = None

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def _run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(ready.set)
            self.loop.run_forever()

        threading.Thread(target=_run, name="exactly-pure-grpc", daemon=True).start()
        if not ready.wait(10):
            raise errors.IllegalStateError("the SDK's event loop thread did not start within 10 s")

    @classmethod
    def get(cls) -> "_LoopThread":
        with cls._lock:
            inst = cls._instance
            if inst is None or inst.pid != os.getpid():  # a loop thread does not survive fork
                inst = cls._instance = cls()
            return inst


class _SyncUnary:
    """A unary method of a synchronous pure-Python channel: `(request, timeout=)` and
    `.future(request, timeout=)` as grpcio's UnaryUnaryMultiCallable."""

    def __init__(self, channel: "PureChannel", method: str, serialize: Callable, deserialize: Callable):
        self._channel, self._method = channel, method
        self._serialize, self._deserialize = serialize, deserialize

    def future(self, request: Any, timeout: float | None = None, **_: Any) -> concurrent.futures.Future:
        conn = self._channel.connection
        coro = conn.call(self._method, request, self._serialize, self._deserialize, timeout)
        return asyncio.run_coroutine_threadsafe(coro, self._channel.loop.loop)

    def __call__(self, request: Any, timeout: float | None = None, **_: Any) -> Any:
        fut = self.future(request, timeout)
        try:
            # The call itself ends by `timeout`; the margin only covers a stalled loop.
            return fut.result(None if timeout is None else timeout + 5.0)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise PureRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None


class _AioUnary:
    """A unary method of an asyncio pure-Python channel: `await method(request, timeout=)`."""

    def __init__(self, conn: _Connection, method: str, serialize: Callable, deserialize: Callable):
        self._conn, self._method = conn, method
        self._serialize, self._deserialize = serialize, deserialize

    def __call__(self, request: Any, timeout: float | None = None, **_: Any) -> Any:
        return self._conn.call(self._method, request, self._serialize, self._deserialize, timeout)


def _unsupported(method: str, *_: Any, **__: Any) -> Callable[..., Any]:
    def _call(*_a: Any, **_k: Any) -> Any:
        raise PureRpcError(grpc.StatusCode.UNIMPLEMENTED, f"{method}: streaming calls are not made by the SDK")
    return _call


class PureChannel:
    """The synchronous clients' channel in a forked child (see the module docstring)."""

    def __init__(self, address: str, security: TransportSecurity):
        self.loop = _LoopThread.get()
        self.connection = _Connection(address, security)

    def unary_unary(self, method: str, request_serializer: Callable = None, response_deserializer: Callable = None,
                    **_: Any) -> _SyncUnary:
        return _SyncUnary(self, method, request_serializer, response_deserializer)

    unary_stream = stream_unary = stream_stream = staticmethod(_unsupported)

    def close(self) -> None:
        if self.loop.pid == os.getpid():
            self.loop.loop.call_soon_threadsafe(self.connection.close)


class AioPureChannel:
    """The asyncio clients' channel in a forked child (see the module docstring);
    used from the event loop that created it."""

    def __init__(self, address: str, security: TransportSecurity):
        self.connection = _Connection(address, security)

    def unary_unary(self, method: str, request_serializer: Callable = None, response_deserializer: Callable = None,
                    **_: Any) -> _AioUnary:
        return _AioUnary(self.connection, method, request_serializer, response_deserializer)

    unary_stream = stream_unary = stream_stream = staticmethod(_unsupported)

    async def close(self) -> None:
        self.connection.close()


__all__ = ["grpcio_unusable", "note_grpcio_channel", "check_process", "PureChannel", "AioPureChannel",
           "PureRpcError"]
