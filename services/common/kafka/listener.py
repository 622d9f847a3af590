"""The Kafka protocol listener of a service process (docs/design.md, "Kafka protocol").

A plain asyncio TCP server: each connection reads size-prefixed request frames and
answers them one at a time, in order (a Kafka broker mutes a connection while a
request is in progress, and clients are written for that). Handlers are registered
per API key with the versions implemented; ApiVersions answers exactly those. A
service registers the table of services.common.kafka.surface, the same keys and
versions at every role.

Refused input, as a Kafka broker does it:
- a size below 8 or above `socket.request.max.bytes` (104857600), or a body that does
  not parse: the connection is closed;
- an API key not registered or a version outside the implemented range:
  ApiVersions gets UNSUPPORTED_VERSION with the supported versions (KIP-511), any
  other API closes the connection;
- a handler failing unexpectedly: logged, the connection closed; the service goes on;
- a request the connection's principal may not make (the same checks as gRPC,
  services.common.security.authz): the connection is closed (logged with the reason).

Quotas (services.common.security.quotas, KIP-13/124/219): every handled request is recorded
against the connection's principal and client id; the throttle time goes into the
response's throttle_time_ms, and the connection is muted (no further request read)
for that long after the response is written, as a Kafka broker mutes a throttled
channel. A throttled Produce with acks=0 mutes the connection too. A request of a
principal whose quota is exceeded through any connection or port first waits out that
mute (a new connection per request is no way round it); a client id longer than
quotas.MAX_CLIENT_ID_LENGTH closes the connection.

The principal of a connection comes from its verified TLS client certificate, by the
same function as on the gRPC port (services.common.security.auth.principal_from_certificate:
the parsed subject through ssl.principal.mapping.rules). A certificate that names no
principal (several common names, no rule applies) closes the connection before any
request is read, as a Kafka broker fails the authentication of such a connection.

Connections (services.common.transport.connections, docs/design.md "Connections"): a new
connection is admitted by `limits` (max.connections, max.connections.per.ip and its
overrides, max.connection.creation.rate) before its TLS handshake starts, and closed
at once when refused; the handshake must end within `handshake_timeout_s`; a
connection with no request for `idle_timeout_s` (connections.max.idle.ms), or whose
response the peer does not read for that long, is closed. Each refusal and close is
counted and logged (rate-limited) by `RefusalLog`.

Before authentication (a connection without a client certificate on a listener that
requires authentication, until its SASL exchange completes; and any SASL exchange in
progress) a connection costs the server a few kilobytes and nothing once it closes: a
request may be at most `max_preauth_bytes` (sasl.server.max.receive.size, Kafka's
524288), larger ones close the connection when their size arrives; the requests above
PREAUTH_SMALL_BYTES together take at most PREAUTH_POOL_REQUESTS of that size on the whole
listener (more close their connection), so slow senders of large requests cannot
multiply it; the connection reads ahead at most PREAUTH_READ_AHEAD bytes; and it must
have authenticated `auth_timeout_s` after its TLS handshake
(exactly.sasl.authentication.timeout.ms), whatever it sends meanwhile, or it is closed.
Once authenticated, a request's body must arrive within connections.max.idle.ms of its
size (a size alone no longer holds the connection forever).

SASL (docs/design.md, "SASL"; a TLS listener given a SaslGateway): SaslHandshake
(key 17, v0-1) picks a mechanism of sasl.enabled.mechanisms (else
UNSUPPORTED_SASL_MECHANISM with the enabled ones); SaslAuthenticate (key 36, v0-2,
KIP-152) carries the exchange's messages (after a v0 handshake they come as bare
size-prefixed tokens, as Kafka before 1.0). Once it succeeds the connection's
principal is User:<name>, whatever certificate it presented, for as long as the
user's credentials stay those it proved: deleting the user or changing its password
closes its connections (and a connection whose credentials changed is closed at its
next request, whatever the watch's timing). With `reauth_ms` > 0
(connections.max.reauth.ms, KIP-368) SaslAuthenticate answers that session lifetime, a
client re-authenticates on the same connection (SaslHandshake and SaslAuthenticate
again, as the same user) before it ends, and a request after it ends closes the
connection. After a handshake,
any request but ApiVersions before the exchange completed closes the connection
(ILLEGAL_SASL_STATE); a failed exchange is answered SASL_AUTHENTICATION_FAILED
after connection.failed.authentication.delay.ms, and the connection closed.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from exactly_wire.error_codes import ErrorCode

from ..security.auth import (ANONYMOUS, CertificateIdentityError, PrincipalMapper, current_principal,
                             principal_from_certificate)
from ..security.authz import Denied
from ..security import quotas as quota
from ..transport.connections import (CONNECTIONS_MAX_IDLE_MS, SASL_AUTHENTICATION_TIMEOUT_MS,
                                     SASL_SERVER_MAX_RECEIVE_SIZE, ConnectionLimits, RefusalLog)
from ..transport.idle import IdleTimer, drain_within
from ..security.sasl import SaslFailure, UnsupportedMechanism
from .tls import accepted_transport
from .codec import API_VERSIONS_KEY, ProtocolError, api_name, decode_request, encode_response, field, peek_header

log = logging.getLogger(__name__)

Handler = Callable[[Any, int, "RequestContext"], Awaitable[dict | None]]
DEFAULT_MAX_REQUEST_BYTES = 104857600
SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY = 17, 36
SASL_KEYS = (SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY)
# Before authentication: requests up to this size are read without asking (a SASL message
# of SCRAM or PLAIN, an ApiVersions request: a few hundred bytes); larger ones share a pool
# of this many requests of sasl.server.max.receive.size on the listener.
PREAUTH_SMALL_BYTES = 8192
PREAUTH_POOL_REQUESTS = 4
# Bytes a connection reads ahead of the request being handled (asyncio's StreamReader
# pauses the transport past twice this): small before authentication, then asyncio's
# default, which a large Produce needs.
PREAUTH_READ_AHEAD, READ_AHEAD = 4096, 2 ** 16
CLOSE_LINGER_S = 1.0  # how long a closing connection may take to end (TLS close_notify)


class _Closing(Exception):
    """Close the connection after sending `response` (a refused SASL step)."""

    def __init__(self, response: bytes | None, reason: str):
        super().__init__(reason)
        self.response = response


class _Reader(asyncio.StreamReader):
    """A StreamReader whose read-ahead can change once the connection authenticated."""

    def read_ahead(self, limit: int) -> None:
        """Read ahead up to `limit` bytes (the transport pauses past twice that)."""
        self._limit = limit
        self._maybe_resume_transport()


@dataclass(eq=False)  # hashed by identity: a listener keeps the sessions of each user in a set
class _Sasl:
    """A connection's SASL state: the exchange in progress (None: none started), and
    whether its tokens come bare (after a v0 SaslHandshake)."""

    server: Any = None
    raw: bool = False
    required: bool = False  # no certificate on a listener that wants one: SASL first
    user: str | None = None  # the user authenticated as (SASL), its credentials' fingerprint
    fingerprint: str = ""
    expiry: float | None = None  # loop time the session ends (connections.max.reauth.ms)
    transport: Any = None

    @property
    def pending(self) -> bool:
        """An exchange started and not yet complete, or none done where one is required:
        the connection is before authentication (module docstring)."""
        if self.server is None:
            return self.required
        return not self.server.done


@dataclass
class RequestContext:
    """What a handler knows of the request besides its body: the header's client id,
    the API version, and the peer address."""

    client_id: str | None
    version: int
    peer: str


@dataclass(frozen=True)
class Api:
    min_version: int
    max_version: int
    handler: Handler


# Keys the listener answers itself (min, max version): ApiVersions always, the SASL
# keys on a listener given a SaslGateway.
LISTENER_APIS = {API_VERSIONS_KEY: (0, 3), SASL_HANDSHAKE_KEY: (0, 1), SASL_AUTHENTICATE_KEY: (0, 2)}


async def _close(writer: asyncio.StreamWriter, reader: asyncio.StreamReader) -> None:
    """Close a connection: TLS's close_notify and what was written go out, but a peer
    that keeps the connection open (or keeps sending) past CLOSE_LINGER_S is cut off, so
    a closed connection never outlives its place in the connection limits.

    The error the connection ended with (a reset; TLS's APPLICATION_DATA_AFTER_CLOSE_NOTIFY
    from a peer still sending when its connection was refused) then loses its traceback:
    the reader and the protocol's closed future keep the error, and its traceback keeps
    their frames, a cycle that held each such connection's buffers (its read-ahead, the
    TLS records) until the next full garbage collection, not until the next heap trim."""
    writer.close()
    try:
        async with asyncio.timeout(CLOSE_LINGER_S):
            await writer.wait_closed()
    except (TimeoutError, ConnectionError, ssl.SSLError, OSError):
        writer.transport.abort()
    finally:
        if (ended := reader.exception()) is not None:
            ended.__traceback__ = None


class KafkaListener:
    """Serve `apis` (api key -> Api) on host:port. A handler returns the response as a
    dict of plain values (services.common.kafka.codec), or None to send nothing (a
    Produce with acks=0)."""

    def __init__(self, apis: dict[int, Api], max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 principal_rules: str = "DEFAULT", sasl=None, require_authentication: bool = False,
                 quota_manager: "quota.QuotaManager | None" = None,
                 limits: ConnectionLimits | None = None,
                 idle_timeout_s: float = 600.0, handshake_timeout_s: float = 10.0,
                 max_preauth_bytes: int = 524288, auth_timeout_s: float = 15.0, reauth_ms: int = 0):
        """`principal_rules`: ssl.principal.mapping.rules (ValueError when malformed);
        `sasl`: a services.common.security.sasl.SaslGateway to serve SaslHandshake and
        SaslAuthenticate (give it for TLS listeners only; None: no SASL);
        `require_authentication`: a connection without a client certificate must
        authenticate with SASL before any request but ApiVersions (ssl.client.auth=
        required with SASL: the TLS layer then asks for a certificate without
        requiring one, as a Kafka SASL_SSL listener does);
        `quota_manager`: the process's client quotas (None: none); `limits`: admission of
        new connections (default: none); `idle_timeout_s`: connections.max.idle.ms in
        seconds; `handshake_timeout_s`: seconds a TLS handshake may take;
        `max_preauth_bytes`: sasl.server.max.receive.size, the largest request before
        authentication; `auth_timeout_s`: exactly.sasl.authentication.timeout.ms in
        seconds, how long after its TLS handshake a connection that must authenticate may
        take to do so; `reauth_ms`: connections.max.reauth.ms (KIP-368; 0: sessions do
        not end)."""
        self.require_authentication = require_authentication and sasl is not None
        self.apis = dict(apis)
        self.quotas = quota_manager
        self.limits = limits or ConnectionLimits()
        self.idle_timeout_s = idle_timeout_s
        self.handshake_timeout_s = handshake_timeout_s
        self.refusals = RefusalLog("kafka")
        self._ssl = None
        self.principal_mapper = PrincipalMapper(principal_rules)
        self.apis[API_VERSIONS_KEY] = Api(*LISTENER_APIS[API_VERSIONS_KEY], self._api_versions)
        self.sasl = sasl
        if sasl is not None:  # answered by _sasl_step; listed here for ApiVersions
            for key in (SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY):
                self.apis[key] = Api(*LISTENER_APIS[key], self._api_versions)
        self.max_request_bytes = max_request_bytes
        self.max_preauth_bytes = max_preauth_bytes
        self.auth_timeout_s = auth_timeout_s
        self.reauth_ms = reauth_ms
        self._sessions: dict[str, set[_Sasl]] = {}  # user -> its SASL-authenticated connections
        self._loop: asyncio.AbstractEventLoop | None = None
        # Bytes left in the pool of large requests before authentication (module docstring).
        self.preauth_pool_bytes = PREAUTH_POOL_REQUESTS * max_preauth_bytes
        self._socket: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        self._connections: set[asyncio.Task] = set()

    async def start(self, host: str, port: int, ssl_context=None) -> int:
        """Bind and start accepting (TLS with `ssl_context`, started by each connection
        once admitted); returns the bound port."""
        self._ssl = ssl_context
        self._loop = asyncio.get_running_loop()
        if self.sasl is not None:
            self.sasl.users.add_listener(self._user_changed)
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self._socket = socket.create_server((host, port), family=family, backlog=1024, reuse_port=False)
        self._socket.setblocking(False)
        self._accepting = asyncio.create_task(self._accept(), name="kafka-accept")
        return self._socket.getsockname()[1]

    async def stop(self) -> None:
        if self.sasl is not None:
            self.sasl.users.remove_listener(self._user_changed)
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
        if self._socket is not None:
            self._socket.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _accept(self) -> None:
        """Accept connections; admit each by `limits` before anything is read from it."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, addr = await loop.sock_accept(self._socket)
            except OSError as exc:  # EMFILE and the like: the fd reserve keeps them rare
                log.warning("kafka listener: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            ip = addr[0] if isinstance(addr, tuple) else str(addr)
            # "host:port", an IPv6 host in brackets (the SASL throttle keys on the host).
            peer_s = (f"[{addr[0]}]:{addr[1]}" if ":" in addr[0] else f"{addr[0]}:{addr[1]}") \
                if isinstance(addr, tuple) else str(addr)
            refused = self.limits.admit(ip)
            if refused is not None:
                conn.close()
                self.refusals.refused(refused, peer_s)
                continue
            task = asyncio.create_task(self._open(conn, ip, peer_s))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _open(self, conn: socket.socket, ip: str, peer_s: str) -> None:
        """TLS handshake (bounded by handshake_timeout_s), then serve the connection."""
        loop = asyncio.get_running_loop()
        try:
            reader = _Reader(limit=PREAUTH_READ_AHEAD if self.sasl is not None else READ_AHEAD)
            protocol = asyncio.StreamReaderProtocol(reader)
            started = loop.time()
            try:
                async with asyncio.timeout(self.handshake_timeout_s + 1):  # not wait_for: its frame
                    transport = await self._connect(loop, conn, protocol)  # and task make a cycle (_connect)
            except (asyncio.TimeoutError, TimeoutError, ConnectionError, ssl.SSLError, OSError) as exc:
                conn.close()
                if loop.time() - started >= self.handshake_timeout_s * 0.99:
                    self.refusals.refused("ssl.handshake.timeout", peer_s, f"{self.handshake_timeout_s:g} s")
                else:
                    self.refusals.refused("ssl.handshake.failed", peer_s, str(exc) or type(exc).__name__)
                return
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            await self._serve(reader, writer, peer_s)
        finally:
            self.limits.release(ip)

    async def _connect(self, loop: asyncio.AbstractEventLoop, conn: socket.socket,
                       protocol: asyncio.Protocol) -> asyncio.Transport:
        """The connection's transport to `protocol`: over TLS once its handshake ended
        (in worker threads: kafka/tls.py), bounded by handshake_timeout_s."""
        return await accepted_transport(loop, conn, protocol, self._ssl, self.handshake_timeout_s, CLOSE_LINGER_S)

    def _user_changed(self, name: str) -> None:
        """UserStore listener (ZooKeeper's thread): user `name` changed or is gone."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._revoke, name)

    def _revoke(self, name: str) -> None:
        """Close the connections authenticated as `name` with credentials it no longer has."""
        current = self.sasl.users.fingerprint(name)
        for session in list(self._sessions.get(name, ())):
            if session.fingerprint != current and session.transport is not None:
                log.info("kafka connection of User:%s closed: the user's credentials changed or the user "
                         "was deleted", name)
                session.transport.abort()

    def _session_ended(self, sasl: _Sasl) -> str | None:
        """Why the connection's SASL session no longer holds (None while it does): the
        user's credentials changed, or its lifetime (connections.max.reauth.ms) ended."""
        if sasl.user is None:
            return None
        if self.sasl.users.fingerprint(sasl.user) != sasl.fingerprint:
            return f"the credentials of User:{sasl.user} changed or the user was deleted"
        if sasl.expiry is not None and self._loop.time() >= sasl.expiry:
            return f"the SASL session ended (connections.max.reauth.ms={self.reauth_ms}) without re-authentication"
        return None

    async def _api_versions(self, req: Any, version: int, ctx: RequestContext) -> dict:
        return {"error_code": 0, "api_keys": self.supported(), "throttle_time": 0}

    def supported(self) -> list[dict]:
        return [{"api_key": k, "min_version": a.min_version, "max_version": a.max_version}
                for k, a in sorted(self.apis.items())]

    async def _serve(self, reader: _Reader, writer: asyncio.StreamWriter, peer_s: str) -> None:
        sasl = _Sasl(transport=writer.transport)
        loop = asyncio.get_running_loop()
        auth_deadline = loop.time() + self.auth_timeout_s

        def idle_expired() -> None:
            self._timed_out(False, peer_s, idle.what)
            writer.transport.abort()

        idle = IdleTimer(loop, idle_expired)
        try:
            principal = self._principal(writer)
            current_principal.set(principal)
            ssl_object = writer.get_extra_info("ssl_object")
            sasl.required = self.require_authentication and not (
                ssl_object is not None and ssl_object.getpeercert(binary_form=True))
            preauth = self.sasl is not None and sasl.pending
            if not preauth:
                reader.read_ahead(READ_AHEAD)
            while True:
                was, preauth = preauth, self.sasl is not None and sasl.pending
                if preauth and not was:  # a re-authentication began: its own deadline
                    auth_deadline = loop.time() + self.auth_timeout_s
                frame = await self._read_request(reader, sasl, peer_s,
                                                 auth_deadline if preauth else None, idle)
                if frame is None:  # nothing owed to the peer: drop the connection at once
                    writer.transport.abort()
                    return
                throttle_ms = 0
                try:
                    if sasl.raw:
                        response = await self._sasl_raw(frame, sasl, peer_s)
                    elif self.sasl is not None and (peek_header(frame)[0] in SASL_KEYS or sasl.pending):
                        response = await self._sasl_step(frame, sasl, peer_s)
                    else:
                        if self.sasl is not None and (ended := self._session_ended(sasl)) is not None:
                            raise _Closing(None, ended)
                        response, throttle_ms = await self._handle(frame, peer_s)
                except _Closing as closing:
                    log.info("kafka connection from %s: %s; closing", peer_s, closing)
                    if closing.response is not None:
                        writer.write(closing.response)
                        await asyncio.wait_for(writer.drain(), self.idle_timeout_s)
                    return
                finally:
                    if len(frame) > PREAUTH_SMALL_BYTES and preauth:
                        self.preauth_pool_bytes += len(frame)
                del frame
                if preauth and not sasl.pending:  # authenticated: the ordinary limits from now on
                    reader.read_ahead(READ_AHEAD)
                if response is not None:
                    writer.write(response)
                    try:
                        await drain_within(writer, self.idle_timeout_s)
                    except TimeoutError:
                        self.refusals.refused(CONNECTIONS_MAX_IDLE_MS, peer_s, "response unread")
                        return
                if throttle_ms > 0:  # muted: read nothing more for that long (KIP-219)
                    await asyncio.sleep(throttle_ms / 1000.0)
        except ProtocolError as exc:
            log.info("kafka connection from %s: %s; closing", peer_s, exc)
        except Denied as exc:
            log.info("kafka connection from %s (%s): %s; closing", peer_s, current_principal.get(), exc)
        except CertificateIdentityError as exc:
            log.warning("kafka connection from %s: SSL authentication failed: %s; closing", peer_s, exc)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except ssl.SSLError as exc:
            log.info("kafka connection from %s: TLS failed: %s; closing", peer_s, exc)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - one connection fails, the service goes on
            log.exception("kafka connection from %s failed; closing", peer_s)
        finally:
            idle.close()
            if sasl.user is not None:
                self._forget(sasl)
            await _close(writer, reader)

    async def _read_request(self, reader: _Reader, sasl: _Sasl, peer_s: str,
                            auth_deadline: float | None, idle: IdleTimer) -> bytes | None:
        """The next request frame (without its size), None when the connection is to
        close: the peer closed it, it was idle for connections.max.idle.ms, its size is
        out of bounds, or (before authentication, `auth_deadline` given: loop time) the
        authentication deadline passed or the pre-authentication pool is full. A large
        frame read before authentication holds its bytes of the pool; the caller gives
        them back once it handled the frame. `idle`: the connection's idle deadline after
        authentication (its expiry records the refusal and aborts the connection)."""
        preauth = auth_deadline is not None
        size_bytes = await self._read_within(reader, 4, auth_deadline, idle, peer_s, "no request")
        if size_bytes is None:
            return None
        size = int.from_bytes(size_bytes, "big", signed=True)
        limit = self.max_preauth_bytes if preauth else self.max_request_bytes
        if size < (0 if sasl.raw else 8) or size > limit:
            if preauth and size > limit:
                self.refusals.refused(SASL_SERVER_MAX_RECEIVE_SIZE, peer_s,
                                      f"a request of {size} bytes before authentication, the limit is {limit}")
            else:
                log.info("kafka connection from %s: request size %d refused; closing", peer_s, size)
            return None
        pooled = preauth and size > PREAUTH_SMALL_BYTES
        if pooled:
            if size > self.preauth_pool_bytes:
                self.refusals.refused(SASL_SERVER_MAX_RECEIVE_SIZE, peer_s,
                                      "the listener's pre-authentication buffers are taken")
                return None
            self.preauth_pool_bytes -= size
        # The body within connections.max.idle.ms of its size (before authentication:
        # within the authentication deadline).
        frame = await self._read_within(reader, size, auth_deadline, idle, peer_s,
                                        f"{size} bytes announced, not sent")
        if frame is None and pooled:
            self.preauth_pool_bytes += size
        return frame

    async def _read_within(self, reader: _Reader, n: int, auth_deadline: float | None, idle: IdleTimer,
                           peer_s: str, what: str) -> bytes | None:
        """`n` bytes, or None when the connection ended or its deadline passed (the
        refusal recorded): before authentication `auth_deadline` (a timer of its own),
        after it connections.max.idle.ms from now (`idle`: no timer per read)."""
        if auth_deadline is not None:
            try:
                async with asyncio.timeout_at(auth_deadline):
                    return await reader.readexactly(n)
            except TimeoutError:
                self._timed_out(True, peer_s, what)
                return None
            except (asyncio.IncompleteReadError, ConnectionError):
                return None
        idle.arm(self._loop.time() + self.idle_timeout_s, what)
        try:
            return await reader.readexactly(n)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None  # closed by the peer, or by `idle`'s expiry (its refusal recorded)
        finally:
            idle.disarm()

    def _timed_out(self, preauth: bool, peer_s: str, what: str) -> None:
        if preauth:
            self.refusals.refused(SASL_AUTHENTICATION_TIMEOUT_MS, peer_s, f"not authenticated within "
                                  f"{self.auth_timeout_s:g} s ({what})")
        else:
            self.refusals.refused(CONNECTIONS_MAX_IDLE_MS, peer_s, f"idle {self.idle_timeout_s:g} s ({what})")

    def _principal(self, writer: asyncio.StreamWriter) -> str:
        """The connection's principal: from its verified TLS client certificate
        (principal_from_certificate), else User:ANONYMOUS. Raises
        CertificateIdentityError for a certificate that names no principal."""
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            return ANONYMOUS
        from cryptography import x509
        return principal_from_certificate(x509.load_der_x509_certificate(der), self.principal_mapper)

    async def _sasl_step(self, frame: bytes, sasl: _Sasl, peer: str) -> bytes | None:
        """SaslHandshake / SaslAuthenticate on a connection (module docstring); any
        other request while an exchange is unfinished closes the connection."""
        api_key, version, correlation_id = peek_header(frame)
        if api_key not in SASL_KEYS:
            if api_key == API_VERSIONS_KEY:
                return (await self._handle(frame, peer))[0]
            raise _Closing(None, f"{api_name(api_key)} before SASL authentication completed (ILLEGAL_SASL_STATE)")
        api = self.apis[api_key]
        if not api.min_version <= version <= api.max_version:
            raise ProtocolError(f"{api_name(api_key)} v{version} is not served here")
        _header, request = decode_request(frame, api_key, version)
        if api_key == SASL_HANDSHAKE_KEY:
            mechanism = field(request, "mechanism", "")
            if sasl.server is not None and sasl.server.done and not self.reauth_ms:
                raise _Closing(None, "SaslHandshake after SASL authentication completed (ILLEGAL_SASL_STATE)")
            try:
                sasl.server = self.sasl.server(mechanism, peer)
            except UnsupportedMechanism as exc:
                raise _Closing(encode_response(api_key, version, correlation_id, {
                    "error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                    "mechanisms": list(self.sasl.mechanisms)}), str(exc)) from None
            sasl.raw = version == 0
            return encode_response(api_key, version, correlation_id,
                                   {"error_code": 0, "mechanisms": list(self.sasl.mechanisms)})
        if sasl.server is None or sasl.server.done:
            raise _Closing(encode_response(api_key, version, correlation_id, {
                "error_code": ErrorCode.ILLEGAL_SASL_STATE, "error_message": "SaslAuthenticate without an "
                "exchange in progress (SaslHandshake first)", "auth_bytes": b""}), "unexpected SaslAuthenticate")
        try:
            reply = await sasl.server.step(field(request, "auth_bytes", b""))
        except SaslFailure as exc:
            raise _Closing(encode_response(api_key, version, correlation_id, {
                "error_code": ErrorCode.SASL_AUTHENTICATION_FAILED, "error_message": str(exc),
                "auth_bytes": b""}), f"SASL authentication failed: {exc}") from None
        self._authenticated(sasl, peer)
        return encode_response(api_key, version, correlation_id, {
            "error_code": 0, "error_message": None, "auth_bytes": reply,
            "session_lifetime": self.reauth_ms if sasl.server.done else 0})

    async def _sasl_raw(self, token: bytes, sasl: _Sasl, peer: str) -> bytes:
        """A bare SASL token after a v0 SaslHandshake; the reply goes back bare too (a
        failure closes the connection without an answer, as Kafka does)."""
        try:
            reply = await sasl.server.step(token)
        except SaslFailure as exc:
            raise _Closing(None, f"SASL authentication failed: {exc}") from None
        self._authenticated(sasl, peer)
        return len(reply).to_bytes(4, "big") + reply

    def _authenticated(self, sasl: _Sasl, peer: str) -> None:
        """After an exchange's step: once it is done, the connection's session is the
        user's (a re-authentication must name the same user, as in KIP-368)."""
        server = sasl.server
        if not server.done:
            return
        sasl.raw = False
        again = sasl.user is not None
        if again and server.username != sasl.user:
            raise _Closing(None, f"re-authentication as User:{server.username} on a connection of "
                                 f"User:{sasl.user} (KIP-368 keeps the principal)")
        if again:
            self._forget(sasl)
        sasl.user, sasl.fingerprint = server.username, server.fingerprint
        sasl.expiry = self._loop.time() + self.reauth_ms / 1000 if self.reauth_ms else None
        self._sessions.setdefault(sasl.user, set()).add(sasl)
        current_principal.set("User:" + server.username)
        log.info("kafka connection from %s %s as User:%s (%s)", peer, "re-authenticated" if again
                 else "authenticated", server.username, server.mechanism)

    def _forget(self, sasl: _Sasl) -> None:
        sessions = self._sessions.get(sasl.user)
        if sessions is not None:
            sessions.discard(sasl)
            if not sessions:
                del self._sessions[sasl.user]

    async def _handle(self, frame: bytes, peer: str) -> tuple[bytes | None, int]:
        """(encoded response or None for none, throttle time in ms) of one request frame."""
        api_key, version, correlation_id = peek_header(frame)
        api = self.apis.get(api_key)
        if api is None or not api.min_version <= version <= api.max_version:
            if api_key == API_VERSIONS_KEY:
                # KIP-511: answer with v0 framing so any client can read the versions.
                return encode_response(API_VERSIONS_KEY, 0, correlation_id, {
                    "error_code": ErrorCode.UNSUPPORTED_VERSION, "api_keys": self.supported()}), 0
            raise ProtocolError(f"{api_name(api_key)} v{version} is not served here")
        header, request = decode_request(frame, api_key, version)
        ctx = RequestContext(getattr(header, "client_id", None), version, peer)
        if (bad := quota.client_id_error(ctx.client_id or "")) is not None:
            raise ProtocolError(bad)
        if self.quotas is not None and (muted_ms := self.quotas.muted_ms(current_principal.get(), ctx.client_id or "")):
            await asyncio.sleep(muted_ms / 1000.0)  # muted by a quota its user (any connection) is over (KIP-219)
        token = quota.current_client_id.set(ctx.client_id or "")
        try:
            if self.quotas is None or not self.quotas.configs():  # no quota set: nothing to time or record
                value, throttle = await api.handler(request, version, ctx), 0
            else:
                timed = quota.Timed(api.handler(request, version, ctx))
                value = await timed
                throttle = self._throttle(api_key, frame, value, timed.seconds, ctx.client_id or "")
        finally:
            quota.current_client_id.reset(token)
        if value is None:
            return None, throttle
        if throttle > 0 or "throttle_time" in value:
            value = {**value, "throttle_time": max(throttle, int(value.get("throttle_time") or 0))}
            throttle = value["throttle_time"]
        return encode_response(api_key, version, correlation_id, value), throttle

    def _throttle(self, api_key: int, frame: bytes, value: dict | None, elapsed_s: float, client_id: str) -> int:
        """The request's throttle time (ms) under the connection's quotas: handling
        time, a Produce's request size, a Fetch's record bytes (services.common.security.quotas)."""
        if self.quotas is None or api_key == API_VERSIONS_KEY:
            return 0
        method = {0: quota.PRODUCE_METHOD, 1: quota.FETCH_METHOD}.get(api_key, f"kafka/{api_key}")
        fetched = None
        if api_key == 1 and value is not None:
            fetched = sum(len(p.get("records") or b"") for t in value.get("responses", ())
                          for p in t.get("partitions", ()))
        return quota.throttle_request(self.quotas, current_principal.get(), client_id, method, None, value,
                                      elapsed_s, request_bytes=len(frame), response_bytes=fetched)
