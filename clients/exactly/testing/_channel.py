"""In-process gRPC channels: what the generated stubs of `exactly_wire.v1` call
(`channel.unary_unary(path, serializers)`), answered by servicers in this process
instead of over the network, for `exactly.testing.MockCluster`.

The servicers are registered with their generated `add_*Servicer_to_server`
functions on a `HandlerTable` (which records gRPC's own method handlers), so a call
reaches the servicer method gRPC would call, through the channel's `serve` function
(`Serve`: where the cluster takes nodes down, records requests and injects faults). Requests and responses go through
their serializers both ways, as on the wire: the servicer never shares a message
object with the client. A servicer may answer with a `concurrent.futures.Future`
(a request that waits: a long-polling Fetch, a JoinGroup until the group's
rebalance completes); `context.abort(code, details)` fails the call with a
`grpc.RpcError` of that status, as a real server's does.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Callable

import grpc

from exactly_wire.clock import MonotonicClock

from .._fork import PureRpcError


class HandlerTable:
    """The `server` argument of the generated `add_*Servicer_to_server` functions:
    records each method handler by its full path ("/exactly.v1.Cluster/Metadata")."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """Recorded through `add_registered_method_handlers`, which the generated code calls too."""

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for method, handler in handlers.items():
            self.handlers[f"/{service}/{method}"] = handler


class CallError(PureRpcError):
    """A failed in-process call, as grpcio raises it: `code()` and `details()`."""


class _Aborted(Exception):
    """Raised by `Context.abort` out of a servicer method."""


class Context:
    """The `context` a servicer method gets: `abort`, `set_code` / `set_details` (as the
    generated servicers' unimplemented methods use them), `invocation_metadata`, `peer`;
    and, for the in-process cluster, the `address` the call was sent to and its `rpc`
    (the method's name: "EndTxn")."""

    def __init__(self, address: str, rpc: str, timeout_s: float | None):
        self.address = address
        self.rpc = rpc
        self.timeout_s = timeout_s
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise _Aborted(details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def invocation_metadata(self) -> tuple:
        return ()

    def peer(self) -> str:
        return "in-process"

    def time_remaining(self) -> float | None:
        return self.timeout_s

    def is_active(self) -> bool:
        return True


def _error(context: Context, exc: BaseException) -> CallError:
    if isinstance(exc, CallError):
        return exc
    if context.code is not None and context.code is not grpc.StatusCode.OK:
        return CallError(context.code, context.details or str(exc))
    return CallError(grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")


class _UnaryUnary:
    """One method of a stub on an in-process channel: `__call__` (blocking) and
    `future` (a concurrent.futures.Future, as grpcio's `.future()`)."""

    def __init__(self, channel: "InProcessChannel", path: str, serialize: Callable, deserialize: Callable):
        self._channel, self._path = channel, path
        self._serialize, self._deserialize = serialize, deserialize

    def future(self, request: Any, timeout: float | None = None, **_: Any) -> concurrent.futures.Future:
        out: concurrent.futures.Future = concurrent.futures.Future()
        try:
            answer = self._channel.invoke(self._path, self._serialize(request), timeout)
        except CallError as exc:
            out.set_exception(exc)
            return out
        if not isinstance(answer, concurrent.futures.Future):
            out.set_result(self._deserialize(answer))
            return out

        def _done(f: concurrent.futures.Future) -> None:
            if out.done():
                return  # the caller cancelled it
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(self._deserialize(f.result()))

        out.add_done_callback(lambda o: answer.cancel() if o.cancelled() else None)
        answer.add_done_callback(_done)
        return out

    def __call__(self, request: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        fut = self.future(request, timeout)
        done, _ = self._channel.clock.wait_futures([fut], timeout)
        if not done:
            fut.cancel()
            raise CallError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        return fut.result()


class _AioUnaryUnary(_UnaryUnary):
    """The same for `exactly.aio`: calling it gives an awaitable of the response."""

    def __call__(self, request: Any, timeout: float | None = None, **kwargs: Any) -> Any:  # noqa: D401
        return self._await(request, timeout)

    async def _await(self, request: Any, timeout: float | None) -> Any:
        fut = asyncio.wrap_future(self.future(request, timeout))
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise CallError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None


# serve(request, context, run): the answer to `request` (or a Future of it), which
# `run()` gives by calling the servicer; `context` names the address and the RPC.
Serve = Callable[[Any, Context, Callable[[], Any]], Any]


def _run(request: Any, context: Context, run: Callable[[], Any]) -> Any:
    return run()


class InProcessChannel:
    """A grpc.Channel whose calls reach `handlers` (a HandlerTable's) in this process,
    as sent to `address`, through `serve` (default: the servicer at once); `invoke` runs
    one. `clock` bounds the waits of blocking calls. Only unary calls exist (the SDK
    makes no other)."""

    _method = _UnaryUnary

    def __init__(self, address: str, handlers: dict[str, grpc.RpcMethodHandler], clock: MonotonicClock,
                 serve: Serve = _run):
        self.address = address
        self.clock = clock
        self._handlers = handlers
        self._serve = serve
        self.closed = False

    def unary_unary(self, path: str, request_serializer: Callable = None, response_deserializer: Callable = None,
                    **_: Any) -> _UnaryUnary:
        return self._method(self, path, request_serializer, response_deserializer)

    def invoke(self, path: str, payload: bytes, timeout: float | None) -> bytes | concurrent.futures.Future:
        """Run the handler of `path` on the serialized request `payload`: its serialized
        answer, or a Future of it. Raises CallError for a failed call."""
        if self.closed:
            raise CallError(grpc.StatusCode.CANCELLED, "Channel closed")
        handler = self._handlers.get(path)
        if handler is None or handler.unary_unary is None:
            raise CallError(grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {path}")
        request = handler.request_deserializer(payload)
        context = Context(self.address, path.rsplit("/", 1)[-1], timeout)
        try:
            answer = self._serve(request, context, lambda: handler.unary_unary(request, context))
        except Exception as exc:  # noqa: BLE001 - a failed call, as the server reports it
            raise _error(context, exc) from None
        serialize = handler.response_serializer
        if not isinstance(answer, concurrent.futures.Future):
            return serialize(answer)
        out: concurrent.futures.Future = concurrent.futures.Future()

        def _done(f: concurrent.futures.Future) -> None:
            if f.cancelled():
                out.cancel()
            elif f.exception() is not None:
                out.set_exception(_error(context, f.exception()))
            else:
                out.set_result(serialize(f.result()))

        out.add_done_callback(lambda o: answer.cancel() if o.cancelled() else None)
        answer.add_done_callback(_done)
        return out

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> "InProcessChannel":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class AioInProcessChannel(InProcessChannel):
    """An InProcessChannel for grpc.aio stubs (`exactly.aio`): calls are awaited and
    `close()` is a coroutine."""

    _method = _AioUnaryUnary

    async def close(self) -> None:  # type: ignore[override]
        self.closed = True


__all__ = ["HandlerTable", "InProcessChannel", "AioInProcessChannel", "CallError", "Context", "Serve"]
