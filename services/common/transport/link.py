"""The tunnel's link: its Batches protocol on a plain TCP connection (docs/design.md, "Tunnel
and fetch limits"; exactly.proto, `Tunnel/Attach`).

Why: each message on a gRPC stream costs both processes gRPC's per-message work (HTTP/2
framing and flow control, the completion queue's poller thread, a callback on the event
loop); a length-prefixed frame on a TCP connection costs a fraction of it (`python -m
bench.transport_floor`: 0.25 ms of CPU per round trip on a stream against 0.06 ms on a
connection, one call at a time, the 2-core machine). The calls between services (a
coordinator's appends and markers, the leaders' verification and implicit adds, replica
fetches) are the transaction path's most frequent messages.

How a link is set up, so that it is admitted exactly as a tunnel stream is:

1. The client calls `Tunnel/Attach` on the service's gRPC port: an ordinary unary call,
   through the server's interceptors (metrics, the request guard, authentication,
   authorization: ClusterAction on the Cluster, as `Tunnel/Open`). The answer is the
   link's port and a ticket: TICKET_BYTES random bytes, good once, for TICKET_TTL_MS. The
   server keeps, with the ticket, the call's metadata, certificate and peer (`Snapshot`).
2. The client connects to that port on the same host (TLS when the gRPC port is TLS, with
   the same certificates and the same host name check) and sends the ticket; the server
   answers ACK once it redeemed it.
3. From then on the connection carries the Batches protocol: client frames are
   TunneledCalls, server frames TunneledReplies, each a 4-byte big-endian length and the
   message. `TunnelServicer._serve` runs them with a context that gives every call the
   snapshot's metadata and certificate, so each call is authenticated, authorized and
   held by quotas exactly as on a Batches stream, with the same bounds on calls in flight
   and replies queued (a link that stops being read stops reading: TCP's flow control
   then holds the sender).

Before its ticket is redeemed a connection costs the server a few kilobytes: at most
MAX_PENDING_LINKS connections wait for their TLS handshake and ticket at once, at most
MAX_PENDING_LINKS_PER_IP of one address (more are closed when accepted), each for at most
`handshake_timeout_s`; a wrong, used or expired ticket closes the connection. Where the
gRPC port requires client certificates (ssl.client.auth=required) the link port does too.
At most `max_links` links are open and unexpired tickets outstanding together (a ticket is
only issued below that), at most MAX_OUTSTANDING_TICKETS tickets wait to be redeemed. A
frame larger than `max_frame_bytes` (socket.request.max.bytes) closes the link; a frame
that does not parse is answered INVALID_ARGUMENT under correlation id 0, as on a stream. A
link with no frame for `idle_timeout_s` (connections.max.idle.ms) while none of its calls
is in flight, or whose replies its peer does not read for that long, is closed; a link is
closed by abort, so nothing it held stays for a peer that reads nothing.

The link is an optimization, never a requirement: the client (`LinkStream`, used by
tunnel.TunnelChannel) falls back to the gRPC stream when the peer answers Attach
UNIMPLEMENTED (a version without links), offers no port, or cannot be connected to there
(a firewall, the listener's bounds), and tries the link again when it next opens a stream
for that peer LINK_RETRY_S or more later (a peer's restart, as in an upgrade, breaks the
stream). Calls only go on a link after its ACK, so a link that could not be set up has
sent nothing and its calls go on the stream unchanged. An Attach that fails (the peer down
or unreachable, the principal refused) fails the calls as a stream that cannot be opened
does, and the next call tries again. A link that breaks later fails its calls in flight
with UNAVAILABLE, as a broken stream does. A
call that times out on a link from which nothing at all was read for LINK_SILENCE_S, its
wait included, closes the link (a peer stopped or cut off; TCP keepalive, at
exactly.keepalive.time.ms, finds dead hosts too), and the next call sets up a new one; a
call whose own timeout is short times out alone. A set-up that outlasts a call's timeout
counts as a link that could not be set up.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, Callable

import grpc
from google.protobuf.message import DecodeError

from exactly_wire.client_calls import MAX_BATCH_BYTES
from exactly_wire.links import (ACK, HEADER as _HEADER, LINK_RETRY_S, LINK_SILENCE_S, MAX_REPLY_FRAME_BYTES,
                                TICKET_BYTES, offers_link, split_address, tcp_keepalive)
from exactly_wire.security import TransportSecurity
from exactly_wire.v1 import exactly_pb2 as pb

from ..kafka.tls import accepted_transport
from ..metrics import CONNECTIONS_REFUSED, TUNNEL_LINKS
from ..settings import ServiceSchema, key_of
from .connections import CONNECTIONS_MAX_IDLE_MS
from .guard import safe_deserializer
from .idle import IdleTimer, drain_within

log = logging.getLogger(__name__)

TICKET_TTL_MS = 10_000
MAX_OUTSTANDING_TICKETS = 256
MAX_PENDING_LINKS = 32
MAX_PENDING_LINKS_PER_IP = 8  # one host cannot hold every pending slot
DEFAULT_MAX_LINKS = 256
# The largest frame an SDK's link may send (bytes): what one Client/Calls message of the SDK
# carries at most (client_calls.MAX_BATCH_BYTES of requests past the first, each at most
# client_calls.MAX_CARRIED_REQUEST_BYTES), with room for the framing.
MAX_CLIENT_FRAME_BYTES = 2 * MAX_BATCH_BYTES
# The schema's defaults of exactly.client.link.max.links and its per-principal bound.
DEFAULT_MAX_CLIENT_LINKS = ServiceSchema.model_fields["client_link_max_links"].default
DEFAULT_MAX_CLIENT_LINKS_PER_PRINCIPAL = ServiceSchema.model_fields["client_link_max_links_per_principal"].default
CLOSE_LINGER_S = 1.0  # how long a closing TLS link may take to end (close_notify)
_parse_calls = safe_deserializer(pb.TunneledCalls.FromString)


class LinkError(Exception):
    """A link that could not be set up (the client falls back to the gRPC stream) or
    a frame that breaks the protocol (the link is closed)."""


class _Oversized(LinkError):
    """A frame above the listener's bound."""


class _Idle(LinkError):
    """No frame, or replies not read, for the listener's idle timeout."""


# Why the link listener refuses or closes a connection (exactly_connections_refused_total's
# `reason` with listener="link"): too many waiting for their ticket; no TLS handshake and
# ticket within exactly.ssl.handshake.timeout.ms; a failed handshake or a connection closed
# before its ticket; a ticket not issued, used or expired; its principal no longer admitted
# (as Tunnel/Open: ClusterAction on the Cluster) when it is redeemed; a frame above
# socket.request.max.bytes; no frame, or replies not read, for connections.max.idle.ms.
SOCKET_REQUEST_MAX_BYTES = key_of(ServiceSchema, "socket_request_max_bytes")
REASONS = ("pending", "ssl.handshake.timeout", "ssl.handshake.failed", "ticket", "authorization",
           SOCKET_REQUEST_MAX_BYTES, CONNECTIONS_MAX_IDLE_MS)


# ------------------------------------------------------------------ tickets (pure)

@dataclass(frozen=True)
class Snapshot:
    """What a link's calls run as: the metadata, certificate (gRPC auth context), peer
    and principal of the Attach call that got its ticket. `client`: an SDK's link
    (`Client/Attach`, its calls served as on `Client/Calls`), not a service's tunnel link."""

    metadata: tuple
    auth_context: dict
    peer: str
    principal: str = ""
    client: bool = False


class LinkTickets:
    """One-time tickets of a link listener. `issue(snapshot)` -> TICKET_BYTES bytes, or
    None while `limit` tickets are outstanding; `redeem(ticket)` -> the snapshot it was
    issued with, once, within `ttl_ms` (ms); None for any other bytes. clock: monotonic
    seconds."""

    def __init__(self, ttl_ms: int = TICKET_TTL_MS, limit: int = MAX_OUTSTANDING_TICKETS,
                 clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_ms / 1000
        self.limit = limit
        self.clock = clock
        self._tickets: dict[bytes, tuple[float, Snapshot]] = {}

    def __len__(self) -> int:
        return len(self._tickets)

    def outstanding(self, principal: str | None = None) -> int:
        """Tickets issued, not redeemed and not expired (of `principal` only, when given)."""
        self._expire(self.clock())
        if principal is None:
            return len(self._tickets)
        return sum(1 for _, snapshot in self._tickets.values() if snapshot.principal == principal)

    def _expire(self, now: float) -> None:
        for ticket in [t for t, (expiry, _) in self._tickets.items() if expiry <= now]:
            del self._tickets[ticket]

    def issue(self, snapshot: Snapshot) -> bytes | None:
        now = self.clock()
        self._expire(now)
        if len(self._tickets) >= self.limit:
            return None
        ticket = secrets.token_bytes(TICKET_BYTES)
        self._tickets[ticket] = (now + self.ttl_s, snapshot)
        return ticket

    def redeem(self, ticket: bytes) -> Snapshot | None:
        self._expire(self.clock())
        # 256 random bits: guessing one is out of reach whatever a lookup's timing shows.
        entry = self._tickets.pop(ticket, None) if len(ticket) == TICKET_BYTES else None
        return None if entry is None else entry[1]


# ------------------------------------------------------------------ server side

class LinkContext:
    """The stream-level context of a link for TunnelServicer._serve and TunneledContext:
    the snapshot's metadata, certificate and peer; `abort` ends the link."""

    __slots__ = ("_snapshot",)

    def __init__(self, snapshot: Snapshot):
        self._snapshot = snapshot

    def invocation_metadata(self):
        return self._snapshot.metadata

    def auth_context(self):
        return self._snapshot.auth_context

    def peer(self) -> str:
        return self._snapshot.peer

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: tuple = ()) -> None:
        raise LinkError(f"link refused: {code.name} {details}")


class _Frames:
    """A link's TunneledCalls as the async iterator TunnelServicer._serve reads, each at
    most `max_bytes`; a frame that does not parse comes as guard.Undecodable. The link is
    idle (_Idle) when no frame came for `idle_s` while none of its calls was in flight
    (`calls` read, `answered` counted by the writer), or when a frame's body does not
    follow its length within `idle_s`. `held()` is called for each `idle_s` without a
    frame that a call in flight kept the link open through. The deadlines are an
    IdleTimer's (no timer per frame): an expiry aborts `transport`, and the read it ends
    raises _Idle."""

    def __init__(self, reader: asyncio.StreamReader, transport: asyncio.BaseTransport, max_bytes: int,
                 idle_s: float, held: Callable[[], None]):
        self._reader, self._transport, self._max, self._idle_s, self._held = reader, transport, max_bytes, idle_s, held
        self._loop = asyncio.get_running_loop()
        self._idle = IdleTimer(self._loop, self._expired)
        self._no_frame = f"no frame for {idle_s:.0f} s ({CONNECTIONS_MAX_IDLE_MS})"
        self._no_body = f"a frame's body not sent within {idle_s:.0f} s ({CONNECTIONS_MAX_IDLE_MS})"
        self.calls = 0
        self.answered = 0

    def _expired(self) -> None:
        if self._idle.what is self._no_frame and self.calls > self.answered:
            self._held()  # a call in flight keeps the link: another idle_s
            self._idle.arm(self._loop.time() + self._idle_s, self._no_frame)
            return
        self._transport.abort()

    def __aiter__(self):
        return self

    async def _read(self, n: int, what: str) -> bytes:
        self._idle.arm(self._loop.time() + self._idle_s, what)
        try:
            return await self._reader.readexactly(n)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            if self._idle.expired:
                raise _Idle(self._idle.what) from None
            raise StopAsyncIteration from None
        finally:
            self._idle.disarm()

    async def __anext__(self):
        try:
            (size,) = _HEADER.unpack(await self._read(_HEADER.size, self._no_frame))
            if size > self._max:
                raise _Oversized(f"a frame of {size} bytes, above {SOCKET_REQUEST_MAX_BYTES} ({self._max})")
            body = await self._read(size, self._no_body)
        except BaseException:
            self._idle.close()
            raise
        calls = _parse_calls(body)
        # One-way calls are answered by nothing: they keep no link from going idle.
        self.calls += sum(not c.one_way for c in calls.calls) if isinstance(calls, pb.TunneledCalls) else 1
        return calls


class LinkServer:
    """The link listener of a service process (module docstring). `servicer`: the
    process's tunnel servicer (tunnel.TunnelServicer), whose `_serve` runs each service
    link's calls; `client_servicer`: its `Client/Calls` servicer, which runs the SDKs'
    links (None: no SDK link is offered). `start(host, port, ssl_context)` -> the bound
    port; `stop()`.

    Bounds: the services' links and their unexpired tickets at most `max_links`; the
    SDKs' at most `max_client_links`, of one principal at most
    `max_client_links_per_principal`, with tickets of their own (`client_tickets`), so
    that clients never take a service's place. A ticket is not issued past a bound:
    Attach then answers port 0 and the caller stays on its gRPC stream.

    Observable: `links` and `client_links` (open), `pending` (waiting for their ticket),
    `refused` (by reason), `held_idle` (idle timeouts a call in flight kept a link open
    through)."""

    def __init__(self, servicer: Any, max_frame_bytes: int, idle_timeout_s: float, handshake_timeout_s: float,
                 keepalive_s: float = 0.0, max_links: int = DEFAULT_MAX_LINKS, tickets: LinkTickets | None = None,
                 client_servicer: Any = None, max_client_links: int = DEFAULT_MAX_CLIENT_LINKS,
                 max_client_links_per_principal: int = DEFAULT_MAX_CLIENT_LINKS_PER_PRINCIPAL):
        self.servicer = servicer
        self.client_servicer = client_servicer
        self.max_frame_bytes = max_frame_bytes
        self.idle_timeout_s = idle_timeout_s
        self.handshake_timeout_s = handshake_timeout_s
        self.keepalive_s = keepalive_s
        self.max_links = max_links
        self.max_client_links = max_client_links
        self.max_client_links_per_principal = max_client_links_per_principal
        self.tickets = tickets if tickets is not None else LinkTickets()
        self.client_tickets = LinkTickets(limit=max(min(max_client_links, MAX_OUTSTANDING_TICKETS), 1))
        self.port = 0
        self.links = 0
        self._client_links_of: dict[str, int] = {}  # principal -> its open SDK links
        self.pending = 0
        self.refused: dict[str, int] = {}
        self.held_idle = 0
        self._ssl: ssl.SSLContext | None = None
        self._socket: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._pending_by_ip: dict[str, int] = {}

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None) -> int:
        self._ssl = ssl_context
        for reason in REASONS:
            CONNECTIONS_REFUSED.labels("link", reason)
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self._socket = socket.create_server((host, port), family=family, backlog=128)
        self._socket.setblocking(False)
        self.port = self._socket.getsockname()[1]
        self._accepting = asyncio.create_task(self._accept(), name="link-accept")
        return self.port

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
        if self._socket is not None:
            self._socket.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def issue(self, snapshot: Snapshot) -> bytes | None:
        """A ticket for a new link, or None while no more may be opened: a service's
        links and unexpired tickets at max_links; an SDK's (snapshot.client) at
        max_client_links, or its principal's at max_client_links_per_principal, or no
        client servicer."""
        if not snapshot.client:
            if self.links + self.tickets.outstanding() >= self.max_links:
                return None
            return self.tickets.issue(snapshot)
        if self.client_servicer is None or self.client_links + self.client_tickets.outstanding() >= self.max_client_links:
            return None
        principal = snapshot.principal
        if self._client_links_of.get(principal, 0) + self.client_tickets.outstanding(principal) \
                >= self.max_client_links_per_principal:
            return None
        return self.client_tickets.issue(snapshot)

    def _redeem(self, ticket: bytes) -> Snapshot | None:
        snapshot = self.tickets.redeem(ticket)
        return snapshot if snapshot is not None else self.client_tickets.redeem(ticket)

    def _held_idle(self) -> None:
        self.held_idle += 1

    def _refuse(self, why: str) -> None:
        self.refused[why] = self.refused.get(why, 0) + 1
        CONNECTIONS_REFUSED.labels("link", why).inc()

    async def _accept(self) -> None:
        """Accept connections; at most MAX_PENDING_LINKS wait for their ticket, the others
        are closed before anything is read from them."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, addr = await loop.sock_accept(self._socket)
            except OSError as exc:  # EMFILE and the like
                log.warning("link listener: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            ip = str(addr[0]) if isinstance(addr, tuple) else str(addr)
            if self.pending >= MAX_PENDING_LINKS or self._pending_by_ip.get(ip, 0) >= MAX_PENDING_LINKS_PER_IP:
                conn.close()
                self._refuse("pending")
                continue
            self.pending += 1
            _step(self._pending_by_ip, ip, 1)
            task = asyncio.create_task(self._connection(conn, ip))
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._ended, conn))

    def _ended(self, conn: socket.socket, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        conn.close()  # a no-op once its transport closed it; closes one whose task never ran

    def _done_pending(self, ip: str) -> None:
        self.pending -= 1
        _step(self._pending_by_ip, ip, -1)

    async def _connection(self, conn: socket.socket, ip: str) -> None:
        """One accepted connection (counted in `pending` by `_accept`): its TLS handshake
        and ticket within handshake_timeout_s, then the link it sets up."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        transport: asyncio.Transport | None = None
        try:
            try:
                async with asyncio.timeout(self.handshake_timeout_s):
                    transport = await accepted_transport(loop, conn, protocol, self._ssl, self.handshake_timeout_s,
                                                         CLOSE_LINGER_S)
                    ticket = await reader.readexactly(TICKET_BYTES)
            except TimeoutError:
                self._refuse("ssl.handshake.timeout")
                return
            except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError):
                self._refuse("ssl.handshake.failed")
                return
            finally:
                self._done_pending(ip)
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            snapshot = self._redeem(ticket)
            if snapshot is None:
                self._refuse("ticket")
                log.info("link from %s refused: not a ticket this process issued, used or expired",
                         writer.get_extra_info("peername"))
                return
            await self._linked(reader, writer, snapshot)
        finally:
            # abort, not close: a peer that reads nothing would otherwise keep the socket and
            # its unsent replies for as long as it likes.
            if transport is not None:
                transport.abort()
            else:
                conn.close()

    async def _linked(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, snapshot: Snapshot) -> None:
        """Serve a link whose ticket was redeemed, until it ends. It is admitted again
        before the ACK (the principal may have lost its right since Attach): refused, it
        is closed unanswered, and the caller meets the refusal on the gRPC stream."""
        context = LinkContext(snapshot)
        servicer = self.client_servicer if snapshot.client else self.servicer
        # Counted from the redeemed ticket on, so that its principal's bound holds while it is
        # admitted (the admission may wait, e.g. on a quota).
        self._count(snapshot, 1)
        try:
            refused = await servicer.admit(context)
            if refused is not None:
                self._refuse("authorization")
                log.info("link from %s refused: %s %s", snapshot.peer, refused[0].name, refused[1])
                return
            _keepalive(writer, self.keepalive_s)
            writer.write(ACK)
            await self._serve(servicer, reader, writer, context,
                              min(self.max_frame_bytes, MAX_CLIENT_FRAME_BYTES) if snapshot.client
                              else self.max_frame_bytes)
        except _Oversized as exc:
            self._refuse(SOCKET_REQUEST_MAX_BYTES)
            log.warning("link from %s closed: %s", snapshot.peer, exc)
        except _Idle as exc:
            self._refuse(CONNECTIONS_MAX_IDLE_MS)
            log.info("link from %s closed: %s", snapshot.peer, exc)
        except LinkError as exc:
            log.info("link from %s closed: %s", snapshot.peer, exc)
        except (ConnectionError, ssl.SSLError, OSError):
            pass
        finally:
            self._count(snapshot, -1)

    def _count(self, snapshot: Snapshot, step: int) -> None:
        """A link of `snapshot`'s opened (step 1) or ended (-1)."""
        if snapshot.client:
            _step(self._client_links_of, snapshot.principal, step)
        else:
            self.links += step
        TUNNEL_LINKS.labels("client" if snapshot.client else "service").inc(step)

    @property
    def client_links(self) -> int:
        """SDK links open (counted from their ticket's redemption)."""
        return sum(self._client_links_of.values())

    async def _serve(self, servicer: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     context: LinkContext, max_frame_bytes: int) -> None:
        frames = _Frames(reader, writer.transport, max_frame_bytes, self.idle_timeout_s, self._held_idle)
        async for replies in servicer._serve(frames, context, batched=True):
            frames.answered += len(replies.replies)
            body = replies.SerializeToString()
            writer.write(_HEADER.pack(len(body)) + body)
            try:
                await drain_within(writer, self.idle_timeout_s)
            except TimeoutError:
                raise _Idle(f"replies not read for {self.idle_timeout_s:.0f} s ({CONNECTIONS_MAX_IDLE_MS})") from None


def _step(counts: dict[str, int], key: str, step: int) -> None:
    """Move `counts[key]` by `step`, dropping the key at 0 (counts per address, per principal)."""
    left = counts.get(key, 0) + step
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


def _keepalive(writer: asyncio.StreamWriter, keepalive_s: float) -> None:
    """TCP keepalive on a link's socket, probing after `keepalive_s` idle (0: off)."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    try:
        tcp_keepalive(sock, keepalive_s)
    except OSError:
        pass


# ------------------------------------------------------------------ client side

class LinkStream:
    """The client end of one link, in the shape of the gRPC stream TunnelChannel uses:
    `write(TunneledCalls)`, async iteration over TunneledReplies, `cancel()`. It sets
    itself up on first use (Attach, connect, ticket, ACK), within `setup_timeout_s`;
    until then nothing is sent. A set-up that fails raises, from `write` and from the
    iteration, LinkError when the peer offers no link or cannot be connected to there
    (TunnelChannel then sends the calls on the gRPC stream), or Attach's own
    grpc.RpcError when the call failed (the peer down or unreachable, the principal
    refused: the calls fail as on a broken stream).
    `last_read`: monotonic time of the last bytes read (set-up included)."""

    def __init__(self, stub: Any, address: str, security: TransportSecurity, ssl_context: Callable[[], Any],
                 setup_timeout_s: float = 5.0, keepalive_s: float = 0.0):
        self._stub = stub
        self._host = split_address(address)
        self._security = security
        self._ssl_context = ssl_context
        self._timeout_s = setup_timeout_s
        self._keepalive_s = keepalive_s
        self.last_read = time.monotonic()
        self._writer: asyncio.StreamWriter | None = None
        self._cancelled = False
        self._ready = asyncio.ensure_future(self._setup())

    async def _setup(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            answer = await self._stub.Attach(pb.TunnelAttachRequest(), timeout=self._timeout_s)
        except grpc.RpcError as exc:
            if (exc.code() if hasattr(exc, "code") else None) is grpc.StatusCode.UNIMPLEMENTED:
                raise LinkError("Attach answered UNIMPLEMENTED (a version without links)") from None
            # The peer is down, unreachable or refuses this principal: the gRPC stream would
            # fail the same way, so the calls fail as a broken stream's do.
            raise
        if not offers_link(answer):
            raise LinkError("the peer offers no link")
        tls = self._ssl_context() if self._security.tls else None
        try:
            async with asyncio.timeout(self._timeout_s):
                reader, writer = await asyncio.open_connection(
                    self._host, answer.port, ssl=tls, server_hostname=self._host if tls else None)
                self._writer = writer
                writer.write(answer.ticket)
                ack = await reader.readexactly(len(ACK))
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError) as exc:
            if self._writer is not None:
                self._writer.transport.abort()
            raise LinkError(f"link to {self._host}:{answer.port} not set up: {exc!r}") from None
        if ack != ACK:
            writer.transport.abort()
            raise LinkError(f"link to {self._host}:{answer.port} refused")
        if self._cancelled:
            writer.transport.abort()
            raise LinkError("cancelled")
        _keepalive(writer, self._keepalive_s)
        self.last_read = time.monotonic()
        return reader, writer

    async def _set_up(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The set-up's (reader, writer), awaited without cancelling it; a set-up cancelled
        by `cancel()` (the channel closing or dropping it) is a ConnectionError to the
        caller, whose own cancellation alone is a CancelledError."""
        try:
            return await asyncio.shield(self._ready)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._ready.cancelled() and not (task is not None and task.cancelling()):
                raise ConnectionError("the link was closed while it was being set up") from None
            raise

    async def wait_ready(self) -> None:
        """Until the link is set up; raises as `write` does when it cannot be."""
        await self._set_up()

    @property
    def ready(self) -> bool:
        """Whether the link is set up (calls written from now on go on it)."""
        return self._ready.done() and not self._ready.cancelled() and self._ready.exception() is None

    async def write(self, message: pb.TunneledCalls) -> None:
        # Set up: the writer at once (no shielded wait per frame).
        writer = self._writer if self.ready and not self._cancelled else (await self._set_up())[1]
        body = message.SerializeToString()
        writer.write(_HEADER.pack(len(body)) + body)
        await writer.drain()

    def write_nowait(self, message: pb.TunneledCalls) -> bool:
        """Write `message` at once when the link is set up and its socket took everything
        written before (nothing is buffered); False, writing nothing, otherwise."""
        writer = self._writer
        if not self.ready or self._cancelled or writer is None or writer.transport.get_write_buffer_size():
            return False
        body = message.SerializeToString()
        writer.write(_HEADER.pack(len(body)) + body)
        return True

    def __aiter__(self):
        return self._replies()

    async def _replies(self):
        reader, _ = await self._set_up()
        while True:
            try:
                (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
                self.last_read = time.monotonic()
                if size > MAX_REPLY_FRAME_BYTES:
                    raise ConnectionError(f"a reply frame of {size} bytes, above {MAX_REPLY_FRAME_BYTES}")
                body = await reader.readexactly(size)
                replies = pb.TunneledReplies.FromString(body)
            except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError, DecodeError) as exc:
                raise ConnectionError(f"the link closed: {exc!r}") from None
            self.last_read = time.monotonic()
            yield replies

    def cancel(self) -> None:
        """Drop the link at once (abort: whatever the peer has not read is discarded, so a
        stopped peer holds nothing of this process)."""
        self._cancelled = True
        if self._writer is not None:
            self._writer.transport.abort()
        if not self._ready.done():
            self._ready.cancel()
        else:
            self._ready.exception() if not self._ready.cancelled() else None  # retrieved: no "never retrieved" warning


__all__ = ["ACK", "LINK_RETRY_S", "LINK_SILENCE_S", "LinkContext", "LinkError", "LinkServer", "LinkStream",
           "LinkTickets", "Snapshot", "TICKET_BYTES", "split_address"]
