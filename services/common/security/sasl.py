"""SASL on both ports (docs/design.md, "SASL"): the server side of SCRAM-SHA-256,
SCRAM-SHA-512 (RFC 5802, RFC 7677; through the `scramp` library) and PLAIN (RFC
4616), the failed-authentication throttle, and the session tokens of the gRPC port.

- `SaslServer`: one authentication exchange. SCRAM runs its two round trips (client
  first message -> server first message, client final -> server final); PLAIN checks
  the password against the user's stored SCRAM-SHA-512 credential (a PBKDF2). An
  unknown user is answered exactly as a known one with a wrong password: SCRAM's
  server first message carries a salt derived from the cluster's secret and the name
  and the default iteration count (RFC 5802, section 5.1), PLAIN waits as long as a
  PBKDF2 takes, and both fail only at the proof. Once the proof verifies, the user's
  credentials must still be the ones the exchange began with (a password changed or a
  user deleted meanwhile fails it).
- `AuthThrottle`: slows the guesser, not the owner. Its key is the source address of
  an attempt with the user name it names (a digest of it: never the name itself);
  attempts of one key run one at a time, and after a failure of a key further attempts
  of that key are spaced `1 / rate` seconds apart (default 5 a second) for `window_s`,
  queued without blocking the event loop; one that would wait longer than `max_wait_s`
  is refused at once. So a guesser's failures slow only its own address's attempts on
  that name: the owner connecting from elsewhere, and other users of the guesser's
  address, are not slowed. Entries are bounded (`max_keys`) and expire `window_s`
  after their last failure. A failure is answered only after
  `connection.failed.authentication.delay.ms` (Kafka's setting, default 100), on its
  own connection.
- `CheckScheduler`: the password checks (PBKDF2s) run on one worker thread, in turn by
  source address (round robin), so checks take at most one core and a busy address
  delays another address's check by at most one check of its own.
- `SessionTokens`: what the gRPC port's SaslAuthenticate returns once the exchange
  succeeded: `v1.<payload>.<HMAC-SHA256>`, the payload naming the user, the mechanism,
  the expiry (ms since the epoch) and the fingerprint of the user's stored credential
  the exchange verified against (so changing or deleting the user revokes its tokens).
  The HMAC key is the cluster's: 32 random bytes in the znode
  `/exactly/config/sasl-token-key` (created once by the first service, with the
  sensitive ACL when zookeeper.set.acl is on), so every service verifies a token any
  service issued.
"""
from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from scramp import ScramException, ScramMechanism

from .auth import AuthenticationError, ScramCredential, UserStore

log = logging.getLogger(__name__)

SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
MECHANISMS = SCRAM_MECHANISMS + ("PLAIN",)
TOKEN_KEY_PATH = "/exactly/config/sasl-token-key"
DEFAULT_FAILED_DELAY_MS = 100
DEFAULT_ATTEMPTS_PER_SECOND = 5.0
DEFAULT_TOKEN_LIFETIME_MS = 3600000
DEFAULT_MAX_RECEIVE_BYTES = 524288  # Kafka's sasl.server.max.receive.size
# An exchange not finished within this long is dropped (gRPC keeps it between calls).
EXCHANGE_TIMEOUT_S = 30.0
USER_NAME_MAX_LENGTH = 255  # a longer name is no user's (services.common.transport.server._invalid_user_name)


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


def source_of(peer: str) -> str:
    """The source address of a peer ("host:port", "[v6]:port", "ipv4:h:p" or a bare
    address): its IP in canonical form, an IPv6 address as its /64 network (one host
    holds a whole /64); the text itself when it is no address."""
    host = peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def throttle_key(user: str | None, peer: str) -> str:
    """The throttle key of an attempt on `user` from `peer`: the source address and a
    16-byte digest of the name (bounded size, whatever the name's length; the name is
    never kept)."""
    return source_of(peer) + " " + hashlib.sha256((user or "").encode("utf-8", "replace")).hexdigest()[:32]


@dataclass
class _Slots:
    next_s: float = 0.0      # monotonic time of the next free slot
    failed_s: float = -1e18  # monotonic time of the last failure


@dataclass(eq=False)
class AuthThrottle:
    """Spacing of authentication attempts after a failure, per (source address, user)
    key (see the module docstring). `rate`: attempts a second (> 0); `window_s`: how long
    after its last failure a key stays throttled (and is remembered); `max_wait_s`: an
    attempt that would wait longer is refused; `max_keys`: memory bound (the entries
    whose last failure is oldest go first); `clock`: () -> seconds (monotonic); `sleep`:
    async (seconds) -> None, the wait for a slot on that clock (tests pass a fake pair
    that moves the clock)."""

    rate: float = DEFAULT_ATTEMPTS_PER_SECOND
    window_s: float = 60.0
    max_wait_s: float = 10.0
    max_keys: int = 10000
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def __post_init__(self) -> None:
        self.interval_s = 1.0 / self.rate
        # key -> slots, oldest failure first (failed() moves a key to the end).
        self._slots: collections.OrderedDict[str, _Slots] = collections.OrderedDict()
        self._locks: dict[str, list] = {}  # key -> [asyncio.Lock, holders and waiters]

    def tracked(self) -> int:
        """Keys remembered (throttled or recently failed); at most max_keys."""
        return len(self._slots)

    def _expire(self, now: float) -> None:
        while self._slots:
            key, slots = next(iter(self._slots.items()))
            if now - slots.failed_s < self.window_s:
                return
            del self._slots[key]

    def reserve(self, key: str) -> float:
        """Reserve the next attempt of `key`; returns the seconds to wait before it may
        be checked (0 when the key did not fail within window_s). Raises SaslFailure
        when the wait would exceed max_wait_s (nothing is reserved then)."""
        now = self.clock()
        self._expire(now)
        slots = self._slots.get(key)
        if slots is None:
            return 0.0
        start = max(now, slots.next_s)
        if start - now > self.max_wait_s:
            raise SaslFailure("too many failed authentication attempts from this address; try again later")
        slots.next_s = start + self.interval_s
        return start - now

    def failed(self, key: str) -> None:
        """Record a failed authentication of `key`."""
        now = self.clock()
        slots = self._slots.pop(key, None) or _Slots(next_s=now + self.interval_s)
        slots.failed_s = now
        slots.next_s = max(slots.next_s, now + self.interval_s)
        self._slots[key] = slots  # newest last: the bound and the expiry drop from the front
        while len(self._slots) > self.max_keys:
            self._slots.popitem(last=False)

    async def admit(self, key: str) -> None:
        """Wait (without blocking the loop) for the key's next slot; SaslFailure when
        refused outright."""
        wait = self.reserve(key)
        if wait > 0:
            await self.sleep(wait)

    @contextlib.asynccontextmanager
    async def checking(self, key: str):
        """Around one password check of `key`: checks of one key run one at a time (so
        a burst of concurrent guesses cannot all be checked before the first failure is
        recorded), each after its slot (admit). Raises SaslFailure when refused outright."""
        entry = self._locks.setdefault(key, [asyncio.Lock(), 0])
        entry[1] += 1
        try:
            async with entry[0]:
                await self.admit(key)
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                self._locks.pop(key, None)


class CheckScheduler:
    """Runs password checks (blocking functions: PBKDF2s) on one worker thread, taking
    turns between source addresses (round robin): checks never take more than one core,
    and an address with many checks waiting delays another address's check by at most
    one of its own. `run(source, fn)` -> fn()'s result (its exception propagates)."""

    def __init__(self):
        self._queues: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()
        self._executor: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._worker: asyncio.Task | None = None
        self._ready: asyncio.Event | None = None

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None or self._pid != os.getpid():  # a fork has no worker thread
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="sasl-check")
            self._pid = os.getpid()
        return self._executor

    async def run(self, source: str, fn: Callable[[], object]):
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._queues.setdefault(source, collections.deque()).append((fn, done))
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._worker = loop.create_task(self._serve(), name="sasl-checks")
        return await done

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queues:
            source, queue = next(iter(self._queues.items()))
            fn, done = queue.popleft()
            if queue:
                self._queues.move_to_end(source)  # the next source's turn
            else:
                del self._queues[source]
            if done.cancelled():
                continue
            try:
                result = await loop.run_in_executor(self._pool(), fn)
            except Exception as exc:  # noqa: BLE001 - handed to the waiting caller
                if not done.done():
                    done.set_exception(exc)
                continue
            if not done.done():
                done.set_result(result)


class SaslServer:
    """The server side of one SASL exchange for `mechanism` against `users`.

    `await step(token)` takes the client's next message and returns the server's
    reply; `done` is true once the client is authenticated, `username` names it and
    `fingerprint` is that of the credentials it proved (UserStore.fingerprint).
    Raises SaslFailure on bad credentials or an unknown user (after the throttle's
    delay), a malformed message, credentials changed during the exchange or a refused
    attempt; UnsupportedMechanism for an unknown mechanism."""

    def __init__(self, mechanism: str, users: UserStore, throttle: AuthThrottle, peer: str,
                 failed_delay_ms: int = DEFAULT_FAILED_DELAY_MS, enabled: tuple[str, ...] = MECHANISMS,
                 gateway: "SaslGateway | None" = None):
        if mechanism not in enabled:
            raise UnsupportedMechanism(f"SASL mechanism {mechanism!r} is not enabled "
                                       f"(sasl.enabled.mechanisms: {', '.join(enabled)})")
        self.mechanism = mechanism
        self.users = users
        self.throttle = throttle
        self.peer = peer
        self.failed_delay_ms = failed_delay_ms
        self.gateway = gateway
        self.username: str | None = None
        self.fingerprint = ""
        self.done = False
        self._key = ""
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
            if self._key:
                self.throttle.failed(self._key)
            await asyncio.sleep(self.failed_delay_ms / 1000)
            raise

    def _begin(self, user: str) -> None:
        """The exchange names `user`: its throttle key and the credentials it checks
        against (fingerprint "" for an unknown user). A name no user can have (over
        255 characters) is kept cut short, for the log only."""
        self._key = throttle_key(user, self.peer)
        self.username = user if len(user) <= USER_NAME_MAX_LENGTH else user[:USER_NAME_MAX_LENGTH] + "..."
        self.fingerprint = self.users.fingerprint(user) if len(user) <= USER_NAME_MAX_LENGTH else ""

    def _succeeded(self) -> None:
        """The proof verified: refuse it if the user's credentials changed (or the user
        was deleted) since the exchange began, else the exchange is done."""
        if not self.fingerprint or self.users.fingerprint(self.username) != self.fingerprint:
            raise SaslFailure(f"Authentication failed: the credentials of the user changed during the "
                              f"{self.mechanism} exchange")
        self.done = True

    def _invalid(self) -> SaslFailure:
        self.throttle.failed(self._key)  # before the next check of the key starts
        self._key = ""  # recorded once
        return SaslFailure(f"Authentication failed: invalid credentials with SASL mechanism {self.mechanism}")

    async def _check(self, fn: Callable[[], object]):
        scheduler = self.gateway.checks if self.gateway is not None else None
        if scheduler is None:
            return await asyncio.to_thread(fn)
        return await scheduler.run(source_of(self.peer), fn)

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
        self._begin(user)
        credential = self.users.plain_credential(user) if self.fingerprint else None
        async with self.throttle.checking(self._key):
            if credential is None:  # no such user: as long as a check would take, then a failure
                await asyncio.sleep(self.gateway.check_seconds() if self.gateway is not None else 0.0)
                raise self._invalid()
            started = time.monotonic()
            ok = await self._check(lambda: credential.verify(password))
            if self.gateway is not None:
                self.gateway.checked(time.monotonic() - started)
            if not ok:
                raise self._invalid()
        self._succeeded()
        return b""

    async def _scram_step(self, token: bytes) -> bytes:
        self._round += 1
        try:
            text = token.decode()
        except UnicodeDecodeError:
            raise SaslFailure("malformed SCRAM message") from None
        if self._round == 1:
            user = _scram_user(text)
            if not user:
                raise SaslFailure("malformed SCRAM client first message: no user name")
            self._begin(user)
            credential = self.users.credential(user, self.mechanism) if self.fingerprint else None
            if credential is None:  # an unknown user gets a salt like anyone's, and fails at the proof
                secret = self.gateway.secret if self.gateway is not None else b""
                credential = ScramCredential.fake(secret, user, self.mechanism)
                self.fingerprint = ""
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
            # The proof is checked here: one check of a key at a time, after its slot.
            async with self.throttle.checking(self._key):
                try:
                    reply = await self._check(final)
                except ScramException:
                    raise self._invalid() from None
            self._succeeded()
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

    def issue(self, user: str, mechanism: str, fingerprint: str | None = None) -> tuple[str, int]:
        """(token, lifetime in ms) for an authenticated `user`; `fingerprint`: that of
        the credentials the exchange verified (SaslServer.fingerprint; default the
        current one), so a token of an exchange begun before a password change is
        revoked like every older token."""
        expiry = int(self.clock() * 1000) + self.lifetime_ms
        fingerprint = self.users.fingerprint(user) if fingerprint is None else fingerprint
        payload = json.dumps({"u": user, "m": mechanism, "exp": expiry,
                              "c": fingerprint}, separators=(",", ":")).encode()
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
    source: str


@dataclass
class SaslGateway:
    """Everything a port needs for SASL: the users, the enabled mechanisms, the
    throttle, the failed-authentication delay, the password checks' scheduler and
    (gRPC) the token signer and the exchanges in progress between SaslAuthenticate
    calls (at most `max_pending`, and `max_pending_per_source` per source address:
    more drop that source's oldest). `secret`: derives the salts unknown users are
    answered with (default: from the token signer's key, the same at every service);
    `max_receive_bytes`: sasl.server.max.receive.size, the largest SASL message taken
    before authentication."""

    users: UserStore
    mechanisms: tuple[str, ...] = MECHANISMS
    throttle: AuthThrottle = field(default_factory=AuthThrottle)
    failed_delay_ms: int = DEFAULT_FAILED_DELAY_MS
    tokens: SessionTokens | None = None
    max_pending: int = 10000
    max_pending_per_source: int = 16
    max_receive_bytes: int = DEFAULT_MAX_RECEIVE_BYTES
    secret: bytes | None = None
    checks: CheckScheduler = field(default_factory=CheckScheduler)
    _pending: dict[str, _Pending] = field(default_factory=dict)
    _check_s: float = -1.0

    def __post_init__(self) -> None:
        if self.secret is None:
            key = self.tokens._key if self.tokens is not None else os.urandom(32)
            self.secret = hmac.new(key, b"scram-unknown-users", hashlib.sha256).digest()

    def server(self, mechanism: str, peer: str) -> SaslServer:
        return SaslServer(mechanism, self.users, self.throttle, peer, self.failed_delay_ms, self.mechanisms, self)

    def check_seconds(self) -> float:
        """How long a PLAIN password check takes here (a moving average of the real
        ones; one PBKDF2 of the default iterations timed first): how long an attempt on
        an unknown user waits, so it takes as long as a wrong password."""
        if self._check_s < 0:
            started = time.monotonic()
            ScramCredential.fake(self.secret, "", "SCRAM-SHA-512").verify("")
            self._check_s = time.monotonic() - started
        return self._check_s

    def checked(self, seconds: float) -> None:
        """A real PLAIN check took `seconds`."""
        self._check_s = seconds if self._check_s < 0 else 0.8 * self._check_s + 0.2 * seconds

    def begin(self, server: SaslServer) -> str:
        """Keep an exchange between calls; returns its id."""
        now = time.monotonic()
        for sid in [s for s, p in self._pending.items() if now - p.created_s > EXCHANGE_TIMEOUT_S]:
            del self._pending[sid]
        source = source_of(server.peer)
        mine = [sid for sid, p in self._pending.items() if p.source == source]
        for sid in mine[:max(0, len(mine) - self.max_pending_per_source + 1)]:
            del self._pending[sid]
        while len(self._pending) >= self.max_pending:
            self._pending.pop(next(iter(self._pending)))
        sid = _b64(os.urandom(18))
        self._pending[sid] = _Pending(server, now, source)
        return sid

    def resume(self, sid: str) -> SaslServer | None:
        p = self._pending.pop(sid, None)
        if p is None or time.monotonic() - p.created_s > EXCHANGE_TIMEOUT_S:
            return None
        return p.server
