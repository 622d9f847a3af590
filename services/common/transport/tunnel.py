"""Many unary calls over one long-lived gRPC stream (`exactly.v1.Tunnel/Calls`, `Tunnel/Batches`).

Why: a unary call between two Python processes costs about 0.45 ms on loopback, a
message each way on an open stream about half of that (call set-up, headers,
trailers and several event-loop callbacks are paid once per stream instead of once
per call), and the transaction path is a chain of calls between services.

Server side (`TunnelServicer`): each `TunneledCall` names a unary method of this
process. It runs through the server's interceptors -- metrics, the request guard,
authentication and authorization -- and the method's own handler, exactly as a
direct call would, with a per-call context (`TunneledContext`) whose metadata and
peer certificate are the stream's. Calls run concurrently; replies go back in the
order they finish, matched by `correlation_id`.

The tunnel is for the services' own calls to each other (replica fetches, a
coordinator's appends, transaction markers and verification); the SDK and the
Kafka port never use it. So (docs/design.md, "Tunnel and fetch limits"):

- the stream is admitted only for a principal holding ClusterAction on the Cluster
  (the service principals; super users pass too): before the stream's first message
  is read, an `Open` pseudo-call (`OPEN_METHOD`, no request body) runs through the
  same interceptors, so authentication and the authorizer's rule for `Tunnel/Open`
  (services.common.security.authz) decide, and a refusal ends the stream with the refusal's
  status (PERMISSION_DENIED, CLUSTER_AUTHORIZATION_FAILED) before anything of it is
  read. With the authorizer off everyone is admitted, as for every call;
- at most `max_in_flight` calls of one stream are in flight (read and not yet
  answered), and while `max_queued` replies wait to be sent the stream reads no
  further call: HTTP/2 flow control then holds the sender (back-pressure), so
  memory per stream is bounded by the calls in flight whatever the peer does.

Two stream methods carry the calls: `Tunnel/Calls`, one call or reply to a message,
and `Tunnel/Batches`, whose messages carry several (`TunneledCalls`,
`TunneledReplies`). Each stream message costs gRPC's per-message work on both ends
(framing, flow control, the socket write, a completion on the event loop) whatever
it carries, so a writer sends in one message everything that is ready when it
writes: the calls that queued while the previous message was being written, the
replies that finished together (the adds one marker write releases, the appends of
one group commit). Nothing waits to fill a message: a lone call goes at once.

Client side (`TunnelChannel`): `call(method, request, response_class, timeout_s)`
opens the stream on first use (Batches; Calls towards a peer that answers Batches
UNIMPLEMENTED; a Batches stream that ends INTERNAL before anything was read asks the
peer's status again, `_status_of_batches`), sends the call, and waits for its reply. A broken
stream fails every call in flight with UNAVAILABLE (`TunnelError`, a
`grpc.RpcError`, so callers handle it like a failed unary call); the next call
opens a new stream.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any, Callable, Sequence

import grpc

from exactly_wire import client_calls
# A Tunnel/Batches message carries at most MAX_BATCH_CALLS calls (or replies) and, past
# the first, MAX_BATCH_BYTES of requests (or responses): far below the peers' message
# size limits (64 MiB between services) whatever it merges.
from exactly_wire.client_calls import MAX_BATCH_BYTES, MAX_BATCH_CALLS, fits as _fits
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg

from ..after_answer import AfterAnswer, answering
from ..security.principal import current_principal
from ..settings import ServiceSchema
from .guard import safe_deserializer, Undecodable  # the request guard's parsing, for the stream's messages
from .link import LINK_RETRY_S, LINK_SILENCE_S, LinkError, LinkServer, LinkStream, Snapshot

log = logging.getLogger(__name__)

def method_path(service: str, method: str) -> str:
    """The gRPC path "/exactly.v1.<service>/<method>" of a method of exactly.proto, the
    name a TunneledCall carries; KeyError for a method the proto does not have."""
    desc = pb.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    return f"/{desc.containing_service.full_name}/{desc.name}"


TUNNEL_METHOD = method_path("Tunnel", "Calls")
# The admission check of a stream, as the interceptors see it (a method the proto
# does not have, so no real call can name it or collide with its cached handlers).
OPEN_METHOD = "/exactly.v1.Tunnel/Open"
# An SDK's stream of calls to a service (`Client/Calls`, module docstring), its admission
# check, and the methods it carries (exactly_wire.client_calls).
CLIENT_METHOD = client_calls.CLIENT_CALLS_METHOD
CLIENT_OPEN_METHOD = "/exactly.v1.Client/Open"
CLIENT_CARRIED = client_calls.CARRIED
# The stream methods and admission checks themselves, which no stream carries.
ATTACH_METHOD = method_path("Tunnel", "Attach")
CLIENT_ATTACH_METHOD = method_path("Client", "Attach")
_STREAM_METHODS = frozenset((TUNNEL_METHOD, method_path("Tunnel", "Batches"), ATTACH_METHOD, OPEN_METHOD,
                             CLIENT_METHOD, CLIENT_OPEN_METHOD, CLIENT_ATTACH_METHOD))
# The schema's defaults of exactly.tunnel.max.in.flight.calls and exactly.tunnel.max.queued.replies.
DEFAULT_MAX_IN_FLIGHT = ServiceSchema.model_fields["tunnel_max_in_flight_calls"].default
DEFAULT_MAX_QUEUED = ServiceSchema.model_fields["tunnel_max_queued_replies"].default
# How long a one-way call (TunnelChannel.notify) may wait to be written when the link is
# not free at once (s): about a unary call's own bound between services.
NOTICE_TIMEOUT_S = 10.0



class TunnelError(client_calls.StreamedCallError):
    """A tunneled call that did not get a response: the status its method would
    have ended with (`code()`, `details()`), or UNAVAILABLE for a broken stream and
    DEADLINE_EXCEEDED for a call not answered within its timeout."""



# ------------------------------------------------------------------ server side

class TunneledContext:
    """The servicer context of one tunneled call, narrowed to what the interceptors
    (metrics, the request guard, authentication, authorization) and the servicers call:

    - the call's own status: `abort(code, details, trailing_metadata)` records the
      status and details and raises grpc.aio.AbortError, as on a direct call;
      `code()` (None until aborted) and `details()` read them back for the reply;
      `set_trailing_metadata(metadata)` is accepted and dropped, since a TunneledReply
      carries status and details only (the request guard's Kafka error name leads
      the details);
    - the stream's connection, forwarded: `invocation_metadata()`, `auth_context()`
      (the peer's certificate) and `peer()`.

    Nothing else of grpc.aio.ServicerContext is offered: the stream's own context
    holds one status for the whole stream, so it cannot stand in for a call."""

    __slots__ = ("_stream", "_code", "_details")

    def __init__(self, stream: grpc.aio.ServicerContext):
        self._stream = stream
        self._code: grpc.StatusCode | None = None
        self._details = ""

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: tuple = ()) -> None:
        self._code, self._details = code, details
        raise grpc.aio.AbortError()

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str]]) -> None:
        pass

    def invocation_metadata(self):
        return self._stream.invocation_metadata()

    def auth_context(self):
        return self._stream.auth_context()

    def peer(self) -> str:
        return self._stream.peer()


class _Details(grpc.HandlerCallDetails):
    __slots__ = ("method", "invocation_metadata")

    def __init__(self, method: str, metadata):
        self.method, self.invocation_metadata = method, metadata


class HandlerRegistry:
    """The unary method handlers of a server, by full method path: pass it where the
    generated `add_*Servicer_to_server(servicer, server)` functions take a server
    (it forwards to the real one and keeps a copy)."""

    def __init__(self, server: Any):
        self._server = server
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for name, handler in handlers.items():
            if handler.unary_unary is not None:
                self.handlers[f"/{service}/{name}"] = handler
        self._server.add_registered_method_handlers(service, handlers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


async def _admitted(request, context) -> pb.TunneledReply:
    return pb.TunneledReply()


_OPEN_HANDLER = grpc.unary_unary_rpc_method_handler(_admitted)


class TunnelServicer(pbg.TunnelServicer):
    """Serves `Tunnel/Calls` and `Tunnel/Batches` (module docstring): each call through
    `interceptors` (the server's, outermost first) to the unary handler `registry` has
    for it. max_in_flight: calls of one stream read and not yet answered (>= 1);
    max_queued: replies waiting to be sent at which the stream stops reading (>= 1).
    `open_method`: the pseudo-call whose authorization admits a stream (OPEN_METHOD;
    CLIENT_OPEN_METHOD for `Client/Calls`); `carried`: the only methods its streams
    carry (None: every unary method), the others answered UNIMPLEMENTED.

    `link`: the process's link listener (services.common.transport.link), whose tickets
    `Attach` hands out; None: Attach answers port 0 (no link offered).

    Observable state (over all streams and links): `in_flight`, calls read and not yet
    answered; `held_reads`, streams whose next read waits for a slot or for the
    replies to drain (back-pressure on their senders); `messages_read` and
    `messages_sent`, stream messages each way (a Batches message or a link's frame
    counts once)."""

    def __init__(self, registry: HandlerRegistry, interceptors: Sequence[grpc.aio.ServerInterceptor],
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, max_queued: int = DEFAULT_MAX_QUEUED,
                 open_method: str = OPEN_METHOD, carried: frozenset[str] | None = None):
        self._registry = registry
        self._open_method = open_method
        self._carried = carried
        self._interceptors = list(interceptors)
        self._resolved: dict[str, grpc.RpcMethodHandler | None] = {}
        self.max_in_flight = max(int(max_in_flight), 1)
        self.max_queued = max(int(max_queued), 1)
        self.in_flight = 0
        self.held_reads = 0
        self.messages_read = 0
        self.messages_sent = 0
        self.link: LinkServer | None = None

    async def Attach(self, request: pb.TunnelAttachRequest, context: grpc.aio.ServicerContext
                     ) -> pb.TunnelAttachResponse:
        """A ticket for a link (services.common.transport.link) whose calls run with this
        call's metadata, certificate, peer and principal, served by this servicer; port 0
        when no link is offered (none configured, or the listener's links and tickets at
        their bound, for an SDK's link also its principal's). Tunnel/Attach was authorized
        as `Tunnel/Open` (ClusterAction on the Cluster), Client/Attach as `Client/Open`
        (any caller that authenticates)."""
        link = self.link
        if link is None or not link.port:
            return pb.TunnelAttachResponse()
        ticket = link.issue(Snapshot(tuple(context.invocation_metadata() or ()), dict(context.auth_context() or {}),
                                     context.peer(), current_principal.get(),
                                     client=self._open_method == CLIENT_OPEN_METHOD))
        if ticket is None:
            return pb.TunnelAttachResponse()
        return pb.TunnelAttachResponse(port=link.port, ticket=ticket,
                                       ticket_ttl_ms=int(link.tickets.ttl_s * 1000))

    async def _handler(self, method: str, metadata) -> grpc.RpcMethodHandler | None:
        if method in self._resolved:
            return self._resolved[method]

        async def innermost(details):
            if details.method in (OPEN_METHOD, CLIENT_OPEN_METHOD):
                return _OPEN_HANDLER
            return self._registry.handlers.get(details.method)

        continuation: Callable = innermost
        for interceptor in reversed(self._interceptors):
            continuation = _chain(interceptor, continuation)
        handler = await continuation(_Details(method, metadata))
        # The interceptors cache their wrapping per method and read each call's own
        # context, so one resolution serves every later call of the method.
        self._resolved[method] = handler
        return handler

    async def _one(self, call: pb.TunneledCall, stream: grpc.aio.ServicerContext) -> pb.TunneledReply:
        reply = pb.TunneledReply(correlation_id=call.correlation_id)
        if call.method in _STREAM_METHODS:
            reply.status_code, reply.status_details = grpc.StatusCode.INVALID_ARGUMENT.value[0], \
                "INVALID_REQUEST: the tunnel does not carry itself"
            return reply
        if self._carried is not None and call.method not in self._carried:
            reply.status_code, reply.status_details = grpc.StatusCode.UNIMPLEMENTED.value[0], \
                f"{call.method!r} is not carried on {CLIENT_METHOD}: call it directly"
            return reply
        handler = await self._handler(call.method, stream.invocation_metadata())
        if handler is None or handler.unary_unary is None:
            reply.status_code, reply.status_details = grpc.StatusCode.UNIMPLEMENTED.value[0], \
                f"no unary method {call.method!r}"
            return reply
        context = TunneledContext(stream)
        try:
            request = handler.request_deserializer(call.request) if handler.request_deserializer else call.request
            response = await handler.unary_unary(request, context)
            reply.response = handler.response_serializer(response) if handler.response_serializer else response
        except grpc.aio.AbortError:
            code = context.code() or grpc.StatusCode.UNKNOWN
            reply.status_code, reply.status_details = code.value[0], context.details()
        return reply

    async def admit(self, context: grpc.aio.ServicerContext) -> tuple[grpc.StatusCode, str] | None:
        """Run the `Open` pseudo-call of a new stream through the interceptors (module
        docstring): None when admitted, else the refusal's (status, details)."""
        handler = await self._handler(self._open_method, context.invocation_metadata())
        call_context = TunneledContext(context)
        try:
            await handler.unary_unary(pb.TunneledCall(), call_context)
        except grpc.aio.AbortError:
            return call_context.code() or grpc.StatusCode.UNKNOWN, call_context.details()
        return None

    async def Calls(self, request_iterator, context):
        async for reply in self._serve(request_iterator, context, batched=False):
            yield reply

    async def Batches(self, request_iterator, context):
        async for replies in self._serve(request_iterator, context, batched=True):
            yield replies

    async def _serve(self, request_iterator, context, batched: bool):
        """The calls of one stream: each TunneledCall (Calls) or each call of a
        TunneledCalls (Batches) answered as it finishes; Batches yields every reply
        that is ready in one TunneledReplies."""
        refused = await self.admit(context)
        if refused is not None:
            log.info("tunnel stream from %s refused: %s %s", context.peer(), refused[0].name, refused[1])
            await context.abort(*refused)
        replies: asyncio.Queue = asyncio.Queue()
        running: set[asyncio.Task] = set()
        # A slot per call from its read until its reply is handed to gRPC; `drained`
        # is set while fewer than max_queued replies wait to be sent.
        slots = asyncio.Semaphore(self.max_in_flight)
        drained = asyncio.Event()
        drained.set()
        done = object()
        mine = 0  # this stream's share of self.in_flight
        failure: list[LinkError] = []  # a link's frame that broke the protocol: the link closes
        # Work the calls deferred until their reply is handed to the writer
        # (services.common.after_answer), by id of the reply waiting to be sent: each
        # call's reply is a new object (_one), alive in the queue until it is sent. Not by
        # correlation id: the peer picks those and may repeat one, and a second call's
        # entry would then drop the first's work (an EndTxn's markers).
        unsent: dict[int, AfterAnswer] = {}

        def put(reply) -> None:
            replies.put_nowait(reply)
            if replies.qsize() >= self.max_queued:
                drained.clear()

        async def answer(call: pb.TunneledCall | Undecodable) -> None:
            if isinstance(call, Undecodable):
                # No correlation id to answer under: 0, and the stream serves on.
                put(pb.TunneledReply(
                    correlation_id=0, status_code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                    status_details=f"INVALID_REQUEST: not a valid {'TunneledCalls' if batched else 'TunneledCall'} "
                                   f"encoding: {call.error}"[:1000]))
                return
            deferred = answering()  # this task's: the call's handler runs in it
            try:
                reply = await self._one(call, context)
            except BaseException:
                deferred.run()  # no reply to wait for
                raise
            unsent[id(reply)] = deferred
            put(reply)

        async def slot(first: bool) -> None:
            # Back-pressure: no further call is taken while the replies wait or the
            # stream has max_in_flight calls (the sender's window fills).
            held = (first and not drained.is_set()) or slots.locked()
            self.held_reads += held
            try:
                if first:
                    await drained.wait()
                await slots.acquire()
            finally:
                self.held_reads -= held

        def start(call) -> None:
            nonlocal mine
            mine += 1
            self.in_flight += 1
            task = asyncio.create_task(answer(call))
            running.add(task)
            task.add_done_callback(running.discard)

        async def read() -> None:
            try:
                while True:
                    await slot(first=True)
                    try:
                        message = await request_iterator.__anext__()
                    except StopAsyncIteration:
                        slots.release()
                        break
                    self.messages_read += 1
                    if not batched or isinstance(message, Undecodable):
                        start(message)
                        continue
                    # A message's calls take a slot each: the ones past the bound wait,
                    # read but not started, and the stream reads nothing more meanwhile.
                    # A one-way call (a notice) runs here, in order with the stream's
                    # other calls and before the next message is read, and is answered
                    # by nothing: its handler must be quick.
                    waited = False
                    for call in message.calls:
                        if call.one_way:
                            try:
                                await self._one(call, context)
                            except Exception:  # noqa: BLE001 - nobody to answer; the stream serves on
                                log.exception("one-way %s failed", call.method)
                            continue
                        if waited:
                            await slot(first=False)
                        waited = True
                        start(call)
                    if not waited:
                        slots.release()
                if running:
                    await asyncio.gather(*running, return_exceptions=True)
            except LinkError as exc:
                failure.append(exc)
            finally:
                replies.put_nowait(done)

        def sent(count: int) -> None:
            nonlocal mine
            mine -= count
            self.in_flight -= count
            for _ in range(count):
                slots.release()

        reader = asyncio.create_task(read())
        carried = None  # a reply that did not fit in the previous message
        try:
            while True:
                reply, carried = (carried if carried is not None else await replies.get()), None
                if reply is done:
                    if failure:
                        raise failure[0]
                    break
                ready, size = [reply], len(reply.response)
                while batched and not replies.empty():  # a Calls message carries one reply
                    more = replies.get_nowait()
                    if more is done or not _fits(len(ready), size, len(more.response)):
                        carried = more  # the end of the stream, or the next message's first reply
                        break
                    ready.append(more)
                    size += len(more.response)
                if replies.qsize() < self.max_queued:
                    drained.set()
                self.messages_sent += 1
                for ready_reply in ready:
                    # The deferred work starts as its reply goes to the writer, which writes
                    # it in this turn, before the tasks that work started run (and whether
                    # or not the peer reads it).
                    deferred = unsent.pop(id(ready_reply), None)
                    if deferred is not None:
                        deferred.run()
                yield pb.TunneledReplies(replies=ready) if batched else reply
                sent(len(ready))
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()
            self.in_flight -= mine
            for deferred in unsent.values():  # replies never sent: their work runs all the same
                deferred.run()
            unsent.clear()


def add_tunnel_to_server(servicer: TunnelServicer, server: grpc.aio.Server) -> None:
    """Serve `Tunnel/Calls` and `Tunnel/Batches` on `server`. Unlike the generated
    add_TunnelServicer_to_server, a message that does not parse reaches the servicer
    (answered INVALID_ARGUMENT) instead of silently ending the stream."""
    calls = grpc.stream_stream_rpc_method_handler(
        servicer.Calls, request_deserializer=safe_deserializer(pb.TunneledCall.FromString),
        response_serializer=pb.TunneledReply.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "exactly.v1.Tunnel", {"Calls": calls, "Batches": _batches_handler(servicer),
                              "Attach": _attach_handler(servicer)}),))


def add_client_calls_to_server(servicer: TunnelServicer, server: grpc.aio.Server) -> None:
    """Serve `Client/Calls` on `server` with `servicer` (made with CLIENT_OPEN_METHOD
    and CLIENT_CARRIED): the Batches protocol, an unparsable message answered as on the tunnel."""
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "exactly.v1.Client", {"Calls": _batches_handler(servicer), "Attach": _attach_handler(servicer)}),))


def _attach_handler(servicer: TunnelServicer) -> grpc.RpcMethodHandler:
    """The `Attach` handler of `servicer` (Tunnel/Attach or Client/Attach)."""
    return grpc.unary_unary_rpc_method_handler(
        servicer.Attach, request_deserializer=pb.TunnelAttachRequest.FromString,
        response_serializer=pb.TunnelAttachResponse.SerializeToString)


def _batches_handler(servicer: TunnelServicer) -> grpc.RpcMethodHandler:
    """The Batches protocol's handler (TunneledCalls in, TunneledReplies out) of `servicer`."""
    return grpc.stream_stream_rpc_method_handler(
        servicer.Batches, request_deserializer=safe_deserializer(pb.TunneledCalls.FromString),
        response_serializer=pb.TunneledReplies.SerializeToString)


def _chain(interceptor: grpc.aio.ServerInterceptor, continuation: Callable) -> Callable:
    async def step(details):
        return await interceptor.intercept_service(continuation, details)
    return step


# ------------------------------------------------------------------ client side

def _stream_error(exc: grpc.RpcError) -> TunnelError:
    """What the calls of a stream that ended with `exc` fail with: UNIMPLEMENTED when
    the peer serves no tunnel (a version without it will never serve one: its calls
    are not supported there, not worth a retry), else UNAVAILABLE (a status of the
    stream itself is not one of its calls': retriable for all of them)."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNAVAILABLE
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return TunnelError(code, "the peer serves no tunnel (a version without Tunnel/Calls)")
    return TunnelError(grpc.StatusCode.UNAVAILABLE, f"the tunnel broke: {code.name if code else exc}")


# How long `TunnelChannel._status_of_batches` waits for the peer's status, in seconds.
PROBE_TIMEOUT_S = 5.0


class _Downgraded(TunnelError):
    """The peer answered Tunnel/Batches UNIMPLEMENTED (a version without it) before
    running any call of the stream: its calls go again over Tunnel/Calls."""

    def __init__(self):
        super().__init__(grpc.StatusCode.UNIMPLEMENTED, "the peer serves no Tunnel/Batches")


class _LinkDown(_Downgraded):
    """The link could not be set up, so nothing of its calls was sent: they go again on
    the gRPC stream."""

    def __init__(self, why: str):
        TunnelError.__init__(self, grpc.StatusCode.UNAVAILABLE, f"no link: {why}")


class TunnelChannel:
    """Tunneled unary calls to one service over `channel` (module docstring).

    batched (default True): the calls travel on a `Tunnel/Batches` stream, each
    message carrying every call that queued while the previous one was written (at
    most MAX_BATCH_CALLS calls and, past the first, MAX_BATCH_BYTES of requests); a
    lone call goes at once. Towards a peer that answers Batches UNIMPLEMENTED the
    channel uses `Tunnel/Calls` from then on, and the calls refused go again there.
    batched False: `Tunnel/Calls` only, one call to a message.

    link: a factory of the peer's link (`stub -> link.LinkStream`): the Batches protocol
    then goes on a TCP connection (services.common.transport.link). After a link could
    not be set up the calls go on the gRPC stream; LINK_RETRY_S later the next call sets
    up a link beside it, and once that link is up new calls go there while the stream
    ends after answering the calls it carries (half-closed).

    Each call is failed by the end of the stream or link it was written on (UNAVAILABLE,
    or sent again when that stream refused it unread), so calls on a stream being
    retired are answered or failed as on any other."""

    def __init__(self, channel: grpc.aio.Channel, batched: bool = True,
                 link: Callable[[Any], LinkStream] | None = None):
        self._stub = pbg.TunnelStub(channel)
        self._link = link
        self._link_retry_at = 0.0
        self._batched = batched
        self._stream: grpc.aio.StreamStreamCall | None = None
        self._readers: dict[asyncio.Task, Any] = {}  # reader task -> its stream or link
        self._probe: asyncio.Task | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._sent: dict[int, Any] = {}  # correlation id -> the stream or link it was written on
        self._outbox: list[pb.TunneledCall] = []
        self._ids = itertools.count(1)
        self._write_lock = asyncio.Lock()
        self._notices: set[asyncio.Task] = set()  # one-way calls waiting to be written
        self._closed = False

    @property
    def batched(self) -> bool:
        """Whether calls go on Tunnel/Batches (False after the peer refused it)."""
        return self._batched

    @property
    def linked(self) -> bool:
        """Whether the calls go on a link that is set up."""
        return isinstance(self._stream, LinkStream) and self._stream.ready

    def _open(self) -> grpc.aio.StreamStreamCall:
        stream = self._stream
        if stream is None:
            batched = self._batched
            if batched and self._link is not None and time.monotonic() >= self._link_retry_at:
                stream = self._stream = self._link(self._stub)
            else:
                stream = self._stream = self._stub.Batches() if batched else self._stub.Calls()
            self._start_reader(stream, batched)
        elif (self._link is not None and self._batched and self._probe is None and not isinstance(stream, LinkStream)
              and time.monotonic() >= self._link_retry_at):
            # On the gRPC stream since a link failed: try one again beside it.
            self._probe = asyncio.get_running_loop().create_task(self._link_again())
        return stream

    def _start_reader(self, stream: Any, batched: bool) -> None:
        reader = asyncio.get_running_loop().create_task(self._read(stream, batched))
        self._readers[reader] = stream
        reader.add_done_callback(lambda task: self._readers.pop(task, None))

    async def _link_again(self) -> None:
        """Set up a link beside the gRPC stream the calls use; once it is up, new calls go
        on it and the stream is half-closed (it ends once its calls are answered). Dropped
        when that stream was replaced meanwhile."""
        beside = self._stream
        link = self._link(self._stub)
        try:
            await link.wait_ready()
        except (LinkError, grpc.RpcError, ConnectionError) as exc:
            link.cancel()
            self._link_failed(exc if isinstance(exc, LinkError) else LinkError(str(exc)))
            return
        except asyncio.CancelledError:
            link.cancel()
            raise
        finally:
            self._probe = None
        async with self._write_lock:
            if self._stream is not beside or beside is None:
                link.cancel()
                return
            old, self._stream = self._stream, link
            self._start_reader(link, True)
        log.info("a peer's calls go on a link again")
        if old is not None and not isinstance(old, LinkStream):
            try:
                await old.done_writing()
            except (grpc.RpcError, asyncio.InvalidStateError):
                pass

    def _link_failed(self, exc: LinkError) -> TunnelError:
        if time.monotonic() >= self._link_retry_at:
            log.info("no link to a peer (%s): its calls go on the gRPC stream for %.0f s", exc, LINK_RETRY_S)
        self._link_retry_at = time.monotonic() + LINK_RETRY_S
        return _LinkDown(str(exc))

    def _broken(self, exc: grpc.RpcError, batched: bool) -> TunnelError:
        error = _stream_error(exc)
        if batched and error.code() is grpc.StatusCode.UNIMPLEMENTED:
            return self._downgrade()
        return error

    def _downgrade(self) -> TunnelError:
        """Calls go on Tunnel/Calls from now on; the error that sends a refused Batches
        stream's calls again there."""
        if self._batched:
            log.info("a peer serves no Tunnel/Batches (a previous version): calling it over Tunnel/Calls")
        self._batched = False
        return _Downgraded()

    async def _read(self, stream: grpc.aio.StreamStreamCall, batched: bool) -> None:
        error = TunnelError(grpc.StatusCode.UNAVAILABLE, "the tunnel closed")
        read = False
        try:
            async for message in stream:
                read = True
                for reply in (message.replies if batched else (message,)):
                    self._sent.pop(reply.correlation_id, None)
                    future = self._pending.pop(reply.correlation_id, None)
                    if future is not None and not future.done():
                        future.set_result(reply)
        except grpc.RpcError as exc:
            if batched and not read and exc.code() is grpc.StatusCode.INTERNAL and not isinstance(stream, LinkStream):
                exc = await self._status_of_batches() or exc
            error = self._broken(exc, batched)
        except LinkError as exc:
            error = self._link_failed(exc)
        except ConnectionError as exc:
            error = TunnelError(grpc.StatusCode.UNAVAILABLE, f"the tunnel broke: {exc}")
        except asyncio.CancelledError:
            pass
        finally:
            self._fail(stream, error)

    async def _status_of_batches(self) -> grpc.RpcError | None:
        """The status the peer ends a Tunnel/Batches stream with before reading anything
        of it (UNIMPLEMENTED from a version without Batches, a refusal of the stream's
        admission), asked on a stream that writes nothing: half-closed at once, it ends
        within PROBE_TIMEOUT_S (OK from a peer that serves it: None). Asked when a Batches
        stream ended INTERNAL before anything was read on it: grpcio's aio client sets the
        call of a write that failed to INTERNAL ("Internal error from Core"), hiding the
        status the peer had sent, so a refusal that met a write in flight would look like
        a broken stream and its calls would fail instead of going again over Calls."""
        probe = self._stub.Batches(timeout=PROBE_TIMEOUT_S)
        try:
            await probe.done_writing()
            async for _ in probe:
                pass
            return None
        except grpc.RpcError as exc:
            return exc if exc.code() is not grpc.StatusCode.INTERNAL else None
        except asyncio.InvalidStateError:
            return None
        finally:
            probe.cancel()

    def _fail(self, stream: grpc.aio.StreamStreamCall, error: TunnelError) -> None:
        """Fail the calls written on `stream` with `error` and, when it is the current
        one, those waiting to be written (they fail unsent)."""
        doomed = [cid for cid, on in self._sent.items() if on is stream]
        if self._stream is stream:
            self._stream = None
            doomed += [call.correlation_id for call in self._outbox]
            self._outbox.clear()
        for cid in doomed:
            self._sent.pop(cid, None)
            future = self._pending.pop(cid, None)
            if future is not None and not future.done():
                future.set_exception(error)
                future.exception()  # its waiter may have timed out meanwhile: no "never retrieved" log

    def _abandon(self, stream: grpc.aio.StreamStreamCall, why: str, error: TunnelError | None = None) -> TunnelError:
        error = error or TunnelError(grpc.StatusCode.UNAVAILABLE, why)
        stream.cancel()
        self._fail(stream, error)
        return error

    async def call(self, method: str, request: Any, response_class: type, timeout_s: float) -> Any:
        """Send `request` to unary `method` (full path) and return its response, a
        `response_class`. Raises TunnelError with the method's status (as a direct
        call raises AioRpcError), UNAVAILABLE when the stream broke, DEADLINE_EXCEEDED
        after `timeout_s` seconds."""
        started = time.monotonic()
        try:
            # The bound covers the write too: towards a peer that stopped reading (SIGSTOP,
            # a cut network) a write waits on flow control, and later calls on the lock.
            # asyncio.timeout, not wait_for: no task of its own per call.
            async with asyncio.timeout(timeout_s):
                return await self._call(method, request, response_class)
        except TimeoutError:
            stream = self._stream
            if isinstance(stream, LinkStream) and stream.ready and stream.last_read < started \
                    and time.monotonic() - stream.last_read >= LINK_SILENCE_S:
                # Nothing at all came back on the link for LINK_SILENCE_S, this call's wait
                # included: a stopped or cut-off peer, which keepalive would not see; the
                # next call sets up a new link.
                self._abandon(stream, f"nothing read on the link for {LINK_SILENCE_S:.0f} s")
            raise TunnelError(grpc.StatusCode.DEADLINE_EXCEEDED, f"{method}: no answer within {timeout_s} s") from None

    def notify(self, method: str, request: Any) -> None:
        """Send `request` to unary `method` (full path) one way: the callee runs it and
        answers nothing (TunneledCall.one_way), and nothing here waits or learns whether
        it arrived, so it suits a notice whose loss costs only a later call. Written at
        once when the link is set up and idle (it goes before whatever the caller writes
        next, e.g. its own client's answer); otherwise queued as calls are, in a task
        bounded by NOTICE_TIMEOUT_S. Nothing is sent on a channel that is not batched
        (a peer without Batches has no one-way calls)."""
        if not self._batched or self._closed:
            return
        call = pb.TunneledCall(correlation_id=next(self._ids), method=method,
                               request=request.SerializeToString(), one_way=True)
        stream = self._stream
        if isinstance(stream, LinkStream) and not self._outbox and not self._write_lock.locked() \
                and stream.write_nowait(pb.TunneledCalls(calls=[call])):
            return
        task = asyncio.get_running_loop().create_task(self._notify_later(call))
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)

    async def _notify_later(self, call: pb.TunneledCall) -> None:
        try:
            async with asyncio.timeout(NOTICE_TIMEOUT_S):
                await self._send_batched(call, None)
        except (TimeoutError, grpc.RpcError, LinkError, ConnectionError, OSError) as exc:
            log.debug("one-way %s not sent: %r", call.method, exc)

    async def _call(self, method: str, request: Any, response_class: type) -> Any:
        correlation_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        call = pb.TunneledCall(correlation_id=correlation_id, method=method, request=request.SerializeToString())
        if self._batched:
            await self._send_batched(call, future)
        else:
            await self._send_one(call, future)
        try:
            reply = await future
        except _Downgraded:
            return await self._call(method, request, response_class)
        finally:
            self._pending.pop(correlation_id, None)
            self._sent.pop(correlation_id, None)
        if reply.status_code:
            raise TunnelError(client_calls.status(reply.status_code), reply.status_details)
        return response_class.FromString(reply.response)

    async def _send_one(self, call: pb.TunneledCall, future: asyncio.Future) -> None:
        async with self._write_lock:
            stream = self._open()
            self._pending[call.correlation_id] = future
            self._sent[call.correlation_id] = stream
            try:
                await stream.write(call)
            except asyncio.CancelledError:
                # A write cut short (its call's time ran out) may leave half a message on
                # the stream: drop the stream; the other calls on it fail as UNAVAILABLE.
                self._pending.pop(call.correlation_id, None)
                self._abandon(stream, "a write was interrupted")
                raise
            except (grpc.RpcError, asyncio.InvalidStateError) as exc:
                self._pending.pop(call.correlation_id, None)
                raise self._abandon(stream, f"the tunnel broke: {exc}",
                                    _stream_error(exc) if isinstance(exc, grpc.RpcError) else None) from None

    async def _send_batched(self, call: pb.TunneledCall, future: asyncio.Future) -> None:
        # The call waits in the outbox; whoever holds the write lock next sends what
        # the outbox holds then, so calls that queued during a write share the next
        # message. A call another's write sent finds nothing to do; the holder writes
        # until its own call is sent (the lock serves its waiters in order, so the calls
        # queued ahead of it were taken before its turn: one write at most).
        if future is not None:  # None: a one-way call (notify), answered by nothing
            self._pending[call.correlation_id] = future
        self._outbox.append(call)
        try:
            async with self._write_lock:
                while any(queued is call for queued in self._outbox):
                    stream = self._open()
                    batch = self._take()
                    for taken in batch:
                        if not taken.one_way:
                            self._sent[taken.correlation_id] = stream
                    try:
                        await stream.write(pb.TunneledCalls(calls=batch))
                    except asyncio.CancelledError:
                        # This call's own future is not failed with the others: nobody awaits it.
                        self._pending.pop(call.correlation_id, None)
                        self._sent.pop(call.correlation_id, None)
                        if isinstance(stream, LinkStream) and not stream.ready:
                            # A set-up slower than a call's timeout: the calls go on the gRPC
                            # stream until a link is set up beside it (`_link_again`).
                            self._abandon(stream, "the link's set-up outlasted a call",
                                          self._link_failed(LinkError("its set-up outlasted a call's timeout")))
                        else:
                            self._abandon(stream, "a write was interrupted")
                        raise
                    except LinkError as exc:
                        self._abandon(stream, str(exc), self._link_failed(exc))
                    except (grpc.RpcError, asyncio.InvalidStateError, ConnectionError, OSError) as exc:
                        if not isinstance(stream, LinkStream) and stream.done():
                            # The stream already ended (e.g. refused UNIMPLEMENTED by a peer
                            # without Batches): its reader fails, or sends again, the calls
                            # written on it, these included.
                            continue
                        self._abandon(stream, f"the tunnel broke: {exc}",
                                      self._broken(exc, True) if isinstance(exc, grpc.RpcError) else None)
        except asyncio.CancelledError:
            # Its time ran out before it was sent: it is not sent at all.
            self._pending.pop(call.correlation_id, None)
            self._outbox = [queued for queued in self._outbox if queued is not call]
            raise

    def _take(self) -> list[pb.TunneledCall]:
        outbox = self._outbox
        count, size = 1, len(outbox[0].request)
        while count < len(outbox) and _fits(count, size, len(outbox[count].request)):
            size += len(outbox[count].request)
            count += 1
        batch, self._outbox = outbox[:count], outbox[count:]
        return batch

    async def close(self) -> None:
        self._closed = True
        if self._notices:  # not written yet: never (they would open a stream after the close)
            for task in self._notices:
                task.cancel()
            await asyncio.gather(*self._notices, return_exceptions=True)
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        readers = dict(self._readers)
        for stream in readers.values():
            stream.cancel()
        if readers:
            await asyncio.gather(*readers, return_exceptions=True)


__all__ = ["add_tunnel_to_server", "OPEN_METHOD", "method_path", "TunnelServicer", "TunnelChannel", "TunnelError", "TunneledContext", "HandlerRegistry", "TUNNEL_METHOD"]
