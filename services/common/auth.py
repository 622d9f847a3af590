"""Authentication: who is calling (docs/design.md, "Security").

A call's principal, in this order:
1. SASL credentials in the call's metadata (`exactly_wire.security`): `User:<username>`
   when the password matches the user's salted SCRAM-SHA-512 credential stored in
   ZooKeeper (`/exactly/config/users/<name>`: salt, iterations, StoredKey, ServerKey
   as RFC 5802 defines them; the password itself is never stored); a wrong password
   or unknown user fails the call (UNAUTHENTICATED, Kafka's
   SASL_AUTHENTICATION_FAILED). SASL over a plaintext listener is refused.
2. The verified TLS client certificate: `User:<name>` from its subject through
   `ssl.principal.mapping.rules` (Kafka's syntax: `RULE:pattern/replacement/[LU]`
   rules tried in order over the RFC 4514 subject, then `DEFAULT`, the common name).
3. Otherwise `User:ANONYMOUS`.

The principal of the call in progress is in `current_principal` (a contextvar set by
`AuthInterceptor` for gRPC and by the Kafka listener for its connections).
"""
from __future__ import annotations

import base64
import contextvars
import hashlib
import hmac
import json
import logging
import os
import re
import threading
from dataclasses import dataclass

import grpc

from exactly_wire.security import SASL_MECHANISM_HEADER, SASL_PASSWORD_HEADER, SASL_USERNAME_HEADER

log = logging.getLogger(__name__)

ANONYMOUS = "User:ANONYMOUS"
USERS = "/exactly/config/users"
SCRAM_ITERATIONS = 4096  # Kafka's minimum for SCRAM-SHA-512
current_principal: contextvars.ContextVar[str] = contextvars.ContextVar("principal", default=ANONYMOUS)


class AuthenticationError(Exception):
    """Credentials that do not verify (SASL_AUTHENTICATION_FAILED)."""


@dataclass(frozen=True)
class ScramCredential:
    """RFC 5802 SCRAM-SHA-512 credential: salt, iterations, StoredKey, ServerKey."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def create(cls, password: str, iterations: int = SCRAM_ITERATIONS, salt: bytes | None = None
               ) -> "ScramCredential":
        salt = salt or os.urandom(32)
        salted = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", hashlib.sha512).digest()
        server_key = hmac.new(salted, b"Server Key", hashlib.sha512).digest()
        return cls(salt, iterations, hashlib.sha512(client_key).digest(), server_key)

    def verify(self, password: str) -> bool:
        again = ScramCredential.create(password, self.iterations, self.salt)
        return hmac.compare_digest(again.stored_key, self.stored_key)

    def to_json(self) -> bytes:
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        return json.dumps({"mechanism": "SCRAM-SHA-512", "salt": b64(self.salt), "iterations": self.iterations,
                           "stored_key": b64(self.stored_key), "server_key": b64(self.server_key)}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "ScramCredential":
        d = json.loads(data)
        return cls(base64.b64decode(d["salt"]), int(d["iterations"]), base64.b64decode(d["stored_key"]),
                   base64.b64decode(d["server_key"]))


def principal_from_subject(subject: str, rules: str = "DEFAULT") -> str:
    """`User:<name>` for a certificate subject (RFC 4514, e.g. "CN=alice,O=acme") by
    Kafka's `ssl.principal.mapping.rules`: comma-separated `RULE:pattern/replacement/`
    rules (optional trailing L or U lowercases or uppercases the result), the first
    whose pattern matches the whole subject wins; `DEFAULT` takes the CN (the whole
    subject when there is none). Raises ValueError for a malformed rule."""
    for rule in _split_rules(rules):
        if rule == "DEFAULT":
            m = re.search(r"(?:^|,)CN=((?:\\.|[^,])*)", subject)
            return "User:" + (m.group(1) if m else subject)
        m = re.fullmatch(r"RULE:(.*)/(.*)/([LU]?)", rule)
        if m is None:
            raise ValueError(f"ssl.principal.mapping.rules: malformed rule {rule!r}")
        pattern, replacement, case = m.groups()
        if re.fullmatch(pattern, subject):
            name = re.sub(pattern, replacement.replace("$", "\\"), subject)
            return "User:" + (name.lower() if case == "L" else name.upper() if case == "U" else name)
    return "User:" + subject


def _split_rules(rules: str) -> list[str]:
    out, cur = [], ""
    for part in (rules or "DEFAULT").split(","):
        cur = f"{cur},{part}" if cur else part
        if cur.strip() == "DEFAULT" or re.fullmatch(r"\s*RULE:.*/.*/[LU]?\s*", cur):
            out.append(cur.strip())
            cur = ""
    if cur.strip():
        raise ValueError(f"ssl.principal.mapping.rules: malformed rule {cur.strip()!r}")
    return out


class UserStore:
    """The SCRAM credentials under /exactly/config/users, cached with ZooKeeper
    watches (a change applies within the watch's delivery, no restart)."""

    def __init__(self, zk=None, ensure_path=None):
        """zk: a started KazooClient (None: no store, every password fails);
        ensure_path(path): creates the users znode (ClusterState.ensure_sensitive_path,
        so it gets the sensitive ACL); default zk.ensure_path."""
        self._users: dict[str, ScramCredential] = {}
        self._lock = threading.Lock()
        self._zk = zk
        if zk is not None:
            (ensure_path or zk.ensure_path)(USERS)
            zk.ChildrenWatch(USERS, self._on_children)

    def _on_children(self, children: list[str]) -> None:
        for name in children:
            if name not in self._users:
                self._zk.DataWatch(f"{USERS}/{name}", self._watcher(name))
        with self._lock:
            for gone in set(self._users) - set(children):
                self._users.pop(gone, None)

    def _watcher(self, name: str):
        # kazoo passes a third argument (the event) to functions that take three.
        def on_data(data, stat):
            return self._on_data(name, data)
        return on_data

    def _on_data(self, name: str, data: bytes | None) -> bool | None:
        with self._lock:
            if data is None:
                self._users.pop(name, None)
                return False  # stop watching a deleted user
            try:
                self._users[name] = ScramCredential.from_json(data)
            except (ValueError, KeyError) as exc:
                log.warning("user %s: unreadable SCRAM credential (%s); ignored", name, exc)
                self._users.pop(name, None)
        return None

    def put(self, name: str, credential: ScramCredential) -> None:
        with self._lock:
            self._users[name] = credential

    def verify(self, name: str, password: str) -> bool:
        with self._lock:
            cred = self._users.get(name)
        return cred is not None and cred.verify(password)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._users)


class Authenticator:
    """Decides a call's principal (see the module docstring). `tls`: the listener
    uses TLS (SASL is refused otherwise)."""

    def __init__(self, users: UserStore, tls: bool, mapping_rules: str = "DEFAULT"):
        self.users = users
        self.tls = tls
        self.mapping_rules = mapping_rules
        principal_from_subject("CN=x", mapping_rules)  # malformed rules fail at start

    def principal(self, metadata: dict[str, str], subject: str | None) -> str:
        """Raises AuthenticationError for SASL credentials that do not verify."""
        user = metadata.get(SASL_USERNAME_HEADER)
        if user is not None:
            if not self.tls:
                raise AuthenticationError("SASL credentials over a plaintext listener are refused")
            mechanism = metadata.get(SASL_MECHANISM_HEADER, "PLAIN")
            if mechanism not in ("PLAIN", "SCRAM-SHA-512"):
                raise AuthenticationError(f"unsupported SASL mechanism {mechanism}")
            if not self.users.verify(user, metadata.get(SASL_PASSWORD_HEADER, "")):
                raise AuthenticationError(f"authentication failed for user {user!r}")
            return "User:" + user
        if subject:
            return principal_from_subject(subject, self.mapping_rules)
        return ANONYMOUS


def certificate_subject(context: grpc.ServicerContext) -> str | None:
    """The RFC 4514 subject of the verified client certificate of a gRPC call."""
    auth = context.auth_context() if context is not None else {}
    pem = (auth.get("x509_pem_cert") or [None])[0]
    if pem:
        from cryptography import x509
        return x509.load_pem_x509_certificate(pem).subject.rfc4514_string()
    cn = (auth.get("x509_common_name") or [None])[0]
    return f"CN={cn.decode()}" if cn else None


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Sets `current_principal` for every gRPC call; a failed SASL check ends the
    call with UNAUTHENTICATED (SASL_AUTHENTICATION_FAILED) before the handler runs.
    With an `authorizer`, the call's checks (services.common.authz) run next: a
    failing one ends the call with PERMISSION_DENIED naming the Kafka error.
    `authenticator` and `authorizer` may be set after the server was built."""

    def __init__(self, authenticator: Authenticator | None = None, authorizer=None):
        self.authenticator = authenticator
        self.authorizer = authorizer

    async def intercept_service(self, continuation, handler_call_details):
        from . import authz
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None or self.authenticator is None:
            return handler
        # The handler returned here may serve later calls of the method too: read each
        # call's metadata and certificate from its own context.
        inner = handler.unary_unary
        authenticator, authorizer = self.authenticator, self.authorizer
        method = authz.method_key(handler_call_details.method)

        async def behavior(request, context):
            metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
            try:
                principal = authenticator.principal(metadata, certificate_subject(context))
            except AuthenticationError as exc:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"SASL_AUTHENTICATION_FAILED: {exc}")
            if authorizer is not None and authz.has_rule(method):
                try:
                    authz.enforce(authorizer, principal, method, request)
                except authz.Denied as exc:
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
            token = current_principal.set(principal)
            try:
                return await inner(request, context)
            finally:
                current_principal.reset(token)

        return grpc.unary_unary_rpc_method_handler(behavior, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)
