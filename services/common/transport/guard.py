"""The last line of defence against hostile input, shared by every service
(docs/design.md, "Input validation and limits").

`RequestGuard` is a gRPC server interceptor wrapped around every unary method of a
process. It makes two promises the servicers cannot make themselves:

- A request body that is not a valid protobuf encoding of the method's request
  message is answered with gRPC status INVALID_ARGUMENT (gRPC itself would answer
  UNKNOWN, "Exception deserializing request").
- An exception escaping a servicer is logged with its traceback and answered with
  a specific status instead of UNKNOWN: INVALID_ARGUMENT for errors caused by the
  request's content (ValueError, TypeError, OverflowError, KeyError, IndexError,
  struct.error, RecursionError and the like: a field the servicer did not
  validate), UNAVAILABLE for an unreachable dependency (ZooKeeper, the disk:
  kazoo errors, OSError, TimeoutError; retriable), RESOURCE_EXHAUSTED for
  MemoryError. The status details start with the Kafka error name (e.g.
  "INVALID_REQUEST: ...") and the trailing metadata `exactly-error-code` carries its
  number, so clients can map it like a response's error_code.

Servicers still validate their fields and answer with per-partition error codes
(the guard is a safety net, and each exception it catches is a bug to fix at its
root); `context.abort` and cancellation pass through untouched.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import struct
from typing import Any, Callable

import grpc
from google.protobuf.message import DecodeError

from exactly_wire.error_codes import ErrorCode
from services.common.cluster.state import ZOOKEEPER_ERRORS

log = logging.getLogger(__name__)

ERROR_CODE_METADATA = "exactly-error-code"

_REQUEST_ERRORS = (ValueError, TypeError, OverflowError, LookupError, struct.error, RecursionError,
                   AttributeError, ArithmeticError)


class Undecodable:
    """Stands for a request body that failed to parse (see `RequestGuard`): what a
    `safe_deserializer` returns instead of raising. `error` is the parser's exception."""

    __slots__ = ("error",)

    def __init__(self, error: Exception):
        self.error = error


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, ErrorCode]:
    """The (gRPC status, Kafka error code) answering an exception that escaped a
    servicer (module docstring)."""
    if isinstance(exc, MemoryError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, ErrorCode.POLICY_VIOLATION
    if isinstance(exc, ZOOKEEPER_ERRORS):
        code = ErrorCode.KAFKA_STORAGE_ERROR if isinstance(exc, OSError) and not isinstance(
            exc, (TimeoutError, ConnectionError)) else ErrorCode.REQUEST_TIMED_OUT
        return grpc.StatusCode.UNAVAILABLE, code
    return grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_REQUEST


def safe_deserializer(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """`deserialize` (bytes -> message; None for a raw-bytes method, returned as is)
    wrapped so that a body it cannot parse (DecodeError, RuntimeError, ValueError)
    yields an `Undecodable` instead of raising: the caller answers it with
    INVALID_ARGUMENT (module docstring). Used by `RequestGuard` for unary methods and
    by the tunnel (services.common.transport.tunnel) for its stream's messages."""
    if deserialize is None:
        return None

    def parse(body: bytes) -> Any:
        try:
            return deserialize(body)
        except (DecodeError, RuntimeError, ValueError) as exc:
            return Undecodable(exc)
    return parse


def _guard(behavior: Callable, method: str) -> Callable:
    async def handler(request, context):
        if isinstance(request, Undecodable):
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_REQUEST,
                         f"the request is not a valid encoding of {method}'s request message: {request.error}")
        try:
            response = behavior(request, context)
            if inspect.isawaitable(response):
                response = await response
            return response
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # noqa: BLE001 - answered with a specific status, logged with its traceback
            if context.code() not in (None, grpc.StatusCode.OK):
                raise  # the servicer already set a status
            status, code = status_for(exc)
            log.exception("%s failed; answered %s (%s)", method, status.name, code.name)
            await _abort(context, status, code, f"{type(exc).__name__}: {exc}")
    return handler


async def _abort(context, status: grpc.StatusCode, code: ErrorCode, message: str) -> None:
    context.set_trailing_metadata(((ERROR_CODE_METADATA, str(int(code))),))
    await context.abort(status, f"{code.name}: {message}"[:1000])


class UnaryHandlerInterceptor(grpc.aio.ServerInterceptor):
    """An interceptor that wraps each unary method's handler once, cached by method
    name; streaming methods (e.g. Health.Watch) pass through untouched.

    wrap_behavior(behavior, method) -> behavior: the coroutine function serving the
    unary `behavior` of `method` ("/package.Service/Method");
    wrap_deserializer(deserializer) -> deserializer: the request parsing (default: as is)."""

    def __init__(self, wrap_behavior: Callable[[Callable, str], Callable],
                 wrap_deserializer: Callable[[Callable | None], Callable | None] = lambda d: d) -> None:
        self._wrap_behavior = wrap_behavior
        self._wrap_deserializer = wrap_deserializer
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        cached = self._handlers.get(method)
        if cached is not None:
            return cached
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        wrapped = grpc.unary_unary_rpc_method_handler(
            self._wrap_behavior(handler.unary_unary, method),
            request_deserializer=self._wrap_deserializer(handler.request_deserializer),
            response_serializer=handler.response_serializer)
        self._handlers[method] = wrapped
        return wrapped


class RequestGuard(UnaryHandlerInterceptor):
    """Interceptor applying the module docstring's rules to every unary method;
    streaming methods (e.g. Health.Watch) pass through untouched."""

    def __init__(self) -> None:
        super().__init__(_guard, safe_deserializer)


__all__ = ["RequestGuard", "UnaryHandlerInterceptor", "status_for", "safe_deserializer", "Undecodable", "ERROR_CODE_METADATA"]
