"""SASL on both ports (docs/design.md, "SASL"): the server side of SCRAM-SHA-256,
SCRAM-SHA-512 (RFC 5802, RFC 7677; through the `scramp` library) and PLAIN (RFC
4616), the failed-authentication throttle, and the session tokens of the gRPC port.

- `SaslServer`: one authentication exchange. SCRAM runs its two round trips (client
  first message -> server first message, client final -> server final); PLAIN checks
  the password against the user's stored SCRAM-SHA-512 credential (a PBKDF2, so in a
  worker thread). Every step that computes a key runs off the event loop.
- `AuthThrottle`: the password checks of one user run one at a time; after a failed
  authentication of a user (or from a peer host), further checks of that user (or
  from that host) are spaced `1 / rate` seconds apart (default 5 a second), queued
  without blocking the event loop; a check that would wait longer than `max_wait_s`
  is refused at once. (SCRAM's check is the client's proof, in its second message.) A failure is answered only
  after `connection.failed.authentication.delay.ms` (Kafka's setting, default 100).
- `SessionTokens`: what the gRPC port's SaslAuthenticate returns once the exchange
  succeeded: `v1.<payload>.<HMAC-SHA256>`, the payload naming the user, the mechanism,
  the expiry (ms since the epoch) and a fingerprint of the user's stored credential
  (so changing or deleting the user revokes its tokens). The HMAC key is the
  cluster's: 32 random bytes in the znode `/exactly/config/sasl-token-key` (created
  once by the first service, with the sensitive ACL when zookeeper.set.acl is on), so
  every service verifies a token any service issued.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from scramp import ScramException, ScramMechanism

from .auth import AuthenticationError, UserStore

log = logging.getLogger(__name__)

SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
MECHANISMS = SCRAM_MECHANISMS + ("PLAIN",)
TOKEN_KEY_PATH = "/exactly/config/sasl-token-key"
DEFAULT_FAILED_DELAY_MS = 100
DEFAULT_ATTEMPTS_PER_SECOND = 5.0
DEFAULT_TOKEN_LIFETIME_MS = 3600000
# An exchange not finished within this long is dropped (gRPC keeps it between calls).
EXCHANGE_TIMEOUT_S = 30.0


class SaslFailure(AuthenticationError):
    """A SASL exchange that failed: bad credentials, an unknown user, a malformed
    message, or throttled (Kafka's SASL_AUTHENTICATION_FAILED)."""


class UnsupportedMechanism(AuthenticationError):
    """A mechanism not in sasl.enabled.mechanisms (Kafka's UNSUPPORTED_SASL_MECHANISM)."""


def parse_mechanisms(value: str) -> tuple[str, ...]:
    """sasl.enabled.mechanisms ("SCRAM-SHA-256,SCRAM-SHA-512,PLAIN") as a tuple;
    ValueError naming an unknown one."""
    out = tuple(m.strip().upper() for m in (value or "").split(",") if m.strip())
    for m in out:
        if m not in MECHANISMS:
            raise ValueError(f"sasl.enabled.mechanisms: unknown mechanism {m!r} (known: {', '.join(MECHANISMS)})")
    return out


@dataclass
class _Slots:
    next_s: float = 0.0      # monotonic time of the next free slot
    failed_s: float = -1e18  # monotonic time of the last failure


@dataclass(eq=False)
class AuthThrottle:
    """Per-user and per-peer spacing of authentication attempts after a failure (see
    the module docstring). `rate`: attempts a second (> 0); `window_s`: how long after
    its last failure a user or peer stays throttled; `max_wait_s`: an attempt that
    would wait longer is refused; `max_keys`: memory bound (the oldest entries go);
    `clock`: () -> seconds (monotonic); `sleep`: async (seconds) -> None, the wait for
    a slot on that clock (tests pass a fake pair that moves the clock)."""

    rate: float = DEFAULT_ATTEMPTS_PER_SECOND
    window_s: float = 60.0
    max_wait_s: float = 10.0
    max_keys: int = 100000
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def __post_init__(self) -> None:
        self.interval_s = 1.0 / self.rate
        self._slots: dict[str, _Slots] = {}
        self._locks: dict[str, list] = {}  # user -> [asyncio.Lock, holders and waiters]

    def reserve(self, keys: list[str]) -> float:
        """Reserve the next attempt for every key ("user:<name>", "peer:<host>");
        returns the seconds to wait before it may be verified (0 when none of the keys
        failed within window_s). Raises SaslFailure when the wait would exceed
        max_wait_s (nothing is reserved then)."""
        now = self.clock()
        active = [self._slots[k] for k in keys if k in self._slots and now - self._slots[k].failed_s < self.window_s]
        if not active:
            return 0.0
        start = max([now] + [s.next_s for s in active])
        if start - now > self.max_wait_s:
            raise SaslFailure("too many failed authentication attempts; try again later")
        for s in active:
            s.next_s = start + self.interval_s
        return start - now

    def failed(self, keys: list[str]) -> None:
        """Record a failed authentication for every key."""
        now = self.clock()
        for k in keys:
            s = self._slots.pop(k, None) or _Slots(next_s=now + self.interval_s)
            s.failed_s = now
            s.next_s = max(s.next_s, now + self.interval_s)
            self._slots[k] = s  # newest last, for the bound below
        while len(self._slots) > self.max_keys:
            self._slots.pop(next(iter(self._slots)))

    async def admit(self, keys: list[str]) -> None:
        """Wait (without blocking the loop) for the keys' next slot; SaslFailure when
        refused outright."""
        wait = self.reserve(keys)
        if wait > 0:
            await self.sleep(wait)

    @contextlib.asynccontextmanager
    async def checking(self, user: str, peer: str):
        """Around one password check of `user` from `peer`: checks of one user run one
        at a time (so a burst of concurrent guesses cannot all be verified before the
        first failure is recorded), each after its slot (admit). Raises SaslFailure
        when refused outright."""
        entry = self._locks.setdefault(user, [asyncio.Lock(), 0])
        entry[1] += 1
        try:
            async with entry[0]:
                await self.admit(throttle_keys(user, peer))
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                self._locks.pop(user, None)


def throttle_keys(user: str | None, peer: str) -> list[str]:
    """The throttle keys of an attempt: the user (when known) and the peer's host."""
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return ([f"user:{user}"] if user else []) + [f"peer:{host}"]


class SaslServer:
    """The server side of one SASL exchange for `mechanism` against `users`.

    `await step(token)` takes the client's next message and returns the server's
    reply; `done` is true once the client is authenticated and `username` names it.
    Raises SaslFailure on bad credentials (after the throttle's delay), a malformed
    message or a refused attempt; UnsupportedMechanism for an unknown mechanism."""

    def __init__(self, mechanism: str, users: UserStore, throttle: AuthThrottle, peer: str,
                 failed_delay_ms: int = DEFAULT_FAILED_DELAY_MS, enabled: tuple[str, ...] = MECHANISMS):
        if mechanism not in enabled:
            raise UnsupportedMechanism(f"SASL mechanism {mechanism!r} is not enabled "
                                       f"(sasl.enabled.mechanisms: {', '.join(enabled)})")
        self.mechanism = mechanism
        self.users = users
        self.throttle = throttle
        self.peer = peer
        self.failed_delay_ms = failed_delay_ms
        self.username: str | None = None
        self.done = False
        self._scram = None
        self._round = 0

    async def step(self, token: bytes) -> bytes:
        if self.done:
            raise SaslFailure("the SASL exchange is already complete")
        try:
            if self.mechanism == "PLAIN":
                return await self._plain(token)
            return await self._scram_step(token)
        except SaslFailure:
            self.throttle.failed(throttle_keys(self.username, self.peer))
            await asyncio.sleep(self.failed_delay_ms / 1000)
            raise

    async def _plain(self, token: bytes) -> bytes:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslFailure("malformed PLAIN message")
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            raise SaslFailure("malformed PLAIN message") from None
        if authzid and authzid != user:
            raise SaslFailure("PLAIN: an authorization id other than the user is not supported")
        self.username = user
        async with self.throttle.checking(user, self.peer):
            if not await asyncio.to_thread(self.users.verify, user, password):
                self.throttle.failed(throttle_keys(user, self.peer))  # before the next check starts
                raise SaslFailure("Authentication failed: invalid credentials with SASL mechanism PLAIN")
        self.done = True
        return b""

    async def _scram_step(self, token: bytes) -> bytes:
        self._round += 1
        try:
            text = token.decode()
        except UnicodeDecodeError:
            raise SaslFailure("malformed SCRAM message") from None
        if self._round == 1:
            user = _scram_user(text)
            self.username = user
            credential = self.users.credential(user, self.mechanism) if user else None
            if credential is None:
                raise SaslFailure(f"Authentication failed: invalid credentials with SASL mechanism {self.mechanism}")
            self._scram = ScramMechanism(self.mechanism).make_server(
                lambda _name: (credential.salt, credential.stored_key, credential.server_key, credential.iterations))
            try:
                self._scram.set_client_first(text)
                return self._scram.get_server_first().encode()
            except ScramException as exc:
                raise SaslFailure(f"malformed SCRAM client first message: {exc}") from None
        if self._round == 2:
            def final() -> str:
                self._scram.set_client_final(text)
                return self._scram.get_server_final()
            # The proof is checked here: one check of a user at a time, after its slot.
            async with self.throttle.checking(self.username, self.peer):
                try:
                    reply = await asyncio.to_thread(final)
                except ScramException:
                    self.throttle.failed(throttle_keys(self.username, self.peer))
                    raise SaslFailure(f"Authentication failed: invalid credentials with SASL mechanism "
                                      f"{self.mechanism}") from None
            self.done = True
            return reply.encode()
        raise SaslFailure("unexpected SCRAM message")


def _scram_user(client_first: str) -> str:
    """The user name of a SCRAM client first message ("n,,n=<user>,r=<nonce>"),
    with RFC 5802's "=2C" / "=3D" escapes undone; "" when absent."""
    parts = client_first.split(",")
    for p in parts[2:]:
        if p.startswith("n="):
            return p[2:].replace("=2C", ",").replace("=3D", "=")
    return ""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SessionTokens:
    """Sign and verify session tokens (module docstring) with the cluster's `key`.
    `lifetime_ms`: how long a token is good for (Kafka's
    connections.max.reauth.ms plays this part on its port)."""

    def __init__(self, key: bytes, users: UserStore, lifetime_ms: int = DEFAULT_TOKEN_LIFETIME_MS,
                 clock=time.time):
        self._key = key
        self.users = users
        self.lifetime_ms = lifetime_ms
        self.clock = clock

    def issue(self, user: str, mechanism: str) -> tuple[str, int]:
        """(token, lifetime in ms) for an authenticated `user`."""
        expiry = int(self.clock() * 1000) + self.lifetime_ms
        payload = json.dumps({"u": user, "m": mechanism, "exp": expiry,
                              "c": self.users.fingerprint(user)}, separators=(",", ":")).encode()
        mac = hmac.new(self._key, payload, hashlib.sha256).digest()
        return f"v1.{_b64(payload)}.{_b64(mac)}", self.lifetime_ms

    def verify(self, token: str) -> str:
        """The user a token was issued to. Raises SaslFailure for a token that is
        malformed, forged, expired, or of a user whose credential changed since."""
        try:
            version, payload_b64, mac_b64 = token.split(".")
            payload, mac = _unb64(payload_b64), _unb64(mac_b64)
        except (ValueError, TypeError):
            raise SaslFailure("malformed session token") from None
        if version != "v1" or not hmac.compare_digest(mac, hmac.new(self._key, payload, hashlib.sha256).digest()):
            raise SaslFailure("invalid session token")
        body = json.loads(payload)
        if body["exp"] <= int(self.clock() * 1000):
            raise SaslFailure("session token expired; authenticate again")
        if self.users.fingerprint(body["u"]) != body["c"]:
            raise SaslFailure("session token revoked: the user's credentials changed")
        return body["u"]


def load_token_key(zk, acl=None) -> bytes:
    """The cluster's session-token key from TOKEN_KEY_PATH, created (32 random bytes,
    with `acl`) when absent; whichever service creates it first wins."""
    from kazoo.exceptions import NodeExistsError
    zk.ensure_path(TOKEN_KEY_PATH.rsplit("/", 1)[0])
    try:
        zk.create(TOKEN_KEY_PATH, os.urandom(32), acl=acl)
    except NodeExistsError:
        pass
    data, _ = zk.get(TOKEN_KEY_PATH)
    return data


@dataclass
class _Pending:
    server: SaslServer
    created_s: float


@dataclass
class SaslGateway:
    """Everything a port needs for SASL: the users, the enabled mechanisms, the
    throttle, the failed-authentication delay and (gRPC) the token signer and the
    exchanges in progress between SaslAuthenticate calls."""

    users: UserStore
    mechanisms: tuple[str, ...] = MECHANISMS
    throttle: AuthThrottle = field(default_factory=AuthThrottle)
    failed_delay_ms: int = DEFAULT_FAILED_DELAY_MS
    tokens: SessionTokens | None = None
    max_pending: int = 10000
    _pending: dict[str, _Pending] = field(default_factory=dict)

    def server(self, mechanism: str, peer: str) -> SaslServer:
        return SaslServer(mechanism, self.users, self.throttle, peer, self.failed_delay_ms, self.mechanisms)

    def begin(self, server: SaslServer) -> str:
        """Keep an exchange between calls; returns its id."""
        now = time.monotonic()
        for sid in [s for s, p in self._pending.items() if now - p.created_s > EXCHANGE_TIMEOUT_S]:
            del self._pending[sid]
        while len(self._pending) >= self.max_pending:
            self._pending.pop(next(iter(self._pending)))
        sid = _b64(os.urandom(18))
        self._pending[sid] = _Pending(server, now)
        return sid

    def resume(self, sid: str) -> SaslServer | None:
        p = self._pending.pop(sid, None)
        if p is None or time.monotonic() - p.created_s > EXCHANGE_TIMEOUT_S:
            return None
        return p.server
