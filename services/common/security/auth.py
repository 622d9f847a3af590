"""Authentication: who is calling (docs/design.md, "Security").

A call's principal, in this order:
1. A SASL session token in the call's metadata (`exactly_wire.security.SASL_TOKEN_HEADER`):
   `User:<username>` of the user the token was issued to by Cluster/SaslAuthenticate
   after a SCRAM-SHA-256/512 or PLAIN exchange (services.common.security.sasl); users are
   salted SCRAM credentials in ZooKeeper (`/exactly/config/users/<name>`: salt,
   iterations, StoredKey, ServerKey per mechanism, as RFC 5802 defines them; the
   password itself is never stored). A token that does not verify fails the call
   (UNAUTHENTICATED, Kafka's SASL_AUTHENTICATION_FAILED); so does a password in the
   metadata, which is never accepted. SASL over a plaintext listener is refused.
2. The verified TLS client certificate: `User:<name>` from its parsed subject (never
   from parsing a subject string, where an escaped "," in another attribute would
   pass for a separator) through `ssl.principal.mapping.rules` (`PrincipalMapper`:
   Kafka's `RULE:pattern/replacement/[LU]` rules over the RFC 2253 DN as Java's
   X500Principal.getName() writes it, and `DEFAULT`, the common name). A subject
   with several common names, or one no rule applies to, is refused.
3. Otherwise `User:ANONYMOUS`.

The principal of the call in progress is in `current_principal` (services.common.security.principal,
re-exported here; set by `AuthInterceptor` for gRPC and by the Kafka listener for its
connections).
"""
from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import logging
import os
import re
import threading
from dataclasses import dataclass

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID

from exactly_wire.security import SASL_PASSWORD_HEADER, SASL_TOKEN_HEADER, SASL_USERNAME_HEADER

from . import authz
from .principal import ANONYMOUS, current_principal

log = logging.getLogger(__name__)

USERS = "/exactly/config/users"
SCRAM_ITERATIONS = 4096  # the default of a new credential
# Kafka's bounds on a SCRAM credential's iteration count (ScramMechanism minIterations /
# maxIterations): fewer makes a stolen credential cheap to attack, more makes every
# PLAIN check an attacker triggers expensive.
SCRAM_MIN_ITERATIONS, SCRAM_MAX_ITERATIONS = 4096, 16384


class AuthenticationError(Exception):
    """Credentials that do not verify (SASL_AUTHENTICATION_FAILED)."""


def check_iterations(iterations: int) -> None:
    """ValueError naming the bounds when `iterations` is outside Kafka's
    SCRAM_MIN_ITERATIONS..SCRAM_MAX_ITERATIONS (UNACCEPTABLE_CREDENTIAL)."""
    if not SCRAM_MIN_ITERATIONS <= iterations <= SCRAM_MAX_ITERATIONS:
        raise ValueError(f"a SCRAM iteration count must be between {SCRAM_MIN_ITERATIONS} and "
                         f"{SCRAM_MAX_ITERATIONS}, got {iterations}")


_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


@dataclass(frozen=True)
class ScramCredential:
    """RFC 5802 SCRAM credential of one mechanism (SCRAM-SHA-256 or SCRAM-SHA-512,
    RFC 7677): salt, iterations, StoredKey, ServerKey."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes
    mechanism: str = "SCRAM-SHA-512"

    @classmethod
    def create(cls, password: str, iterations: int = SCRAM_ITERATIONS, salt: bytes | None = None,
               mechanism: str = "SCRAM-SHA-512") -> "ScramCredential":
        """The credential of `password` (PBKDF2 with `iterations`, a random 32-byte
        salt unless given) for `mechanism`; KeyError for another mechanism, ValueError
        for iterations outside SCRAM_MIN_ITERATIONS..SCRAM_MAX_ITERATIONS."""
        check_iterations(iterations)
        name = _HASHES[mechanism]
        salt = salt or os.urandom(32)
        salted = hashlib.pbkdf2_hmac(name, password.encode(), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", name).digest()
        server_key = hmac.new(salted, b"Server Key", name).digest()
        return cls(salt, iterations, hashlib.new(name, client_key).digest(), server_key, mechanism)

    def verify(self, password: str) -> bool:
        again = ScramCredential.create(password, self.iterations, self.salt, self.mechanism)
        return hmac.compare_digest(again.stored_key, self.stored_key)

    def as_dict(self) -> dict:
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        return {"mechanism": self.mechanism, "salt": b64(self.salt), "iterations": self.iterations,
                "stored_key": b64(self.stored_key), "server_key": b64(self.server_key)}

    def to_json(self) -> bytes:
        return json.dumps(self.as_dict()).encode()

    @classmethod
    def from_dict(cls, d: dict) -> "ScramCredential":
        """ValueError for an unknown mechanism or an iteration count outside Kafka's
        bounds (a credential written into ZooKeeper with 400,000 iterations would make
        every PLAIN check of that user cost 100 times the CPU), KeyError for a missing
        field."""
        mechanism = d.get("mechanism", "SCRAM-SHA-512")
        if mechanism not in _HASHES:
            raise ValueError(f"unknown SCRAM mechanism {mechanism!r}")
        iterations = int(d["iterations"])
        check_iterations(iterations)
        return cls(base64.b64decode(d["salt"]), iterations, base64.b64decode(d["stored_key"]),
                   base64.b64decode(d["server_key"]), mechanism)

    @classmethod
    def fake(cls, secret: bytes, user: str, mechanism: str) -> "ScramCredential":
        """The credential an unknown `user` is answered with (RFC 5802, section 5.1: a
        server should not tell unknown users from known ones): a salt derived from
        `secret` and the name, so every service answers the same salt every time, and
        the default iteration count; its keys match no proof."""
        digest = hmac.new(secret, b"scram-unknown-user\0" + mechanism.encode() + b"\0" + user.encode(),
                          hashlib.sha512).digest()
        return cls(digest[:32], SCRAM_ITERATIONS, digest[32:], hashlib.sha256(digest).digest(), mechanism)

    @classmethod
    def from_json(cls, data: bytes) -> "ScramCredential":
        return cls.from_dict(json.loads(data))


def create_user_credentials(password: str, iterations: int = SCRAM_ITERATIONS) -> bytes:
    """The znode data of a user: a SCRAM-SHA-512 and a SCRAM-SHA-256 credential of
    `password` (each its own salt), as {"mechanism": "SCRAM-SHA-512", ...,
    "credentials": [<each credential>]} (the top level stays the SCRAM-SHA-512 one,
    as before SCRAM-SHA-256 was stored). ValueError for `iterations` outside
    SCRAM_MIN_ITERATIONS..SCRAM_MAX_ITERATIONS."""
    creds = [ScramCredential.create(password, iterations, mechanism=m) for m in ("SCRAM-SHA-512", "SCRAM-SHA-256")]
    return json.dumps({**creds[0].as_dict(), "credentials": [c.as_dict() for c in creds]}).encode()


def parse_user_credentials(data: bytes) -> dict[str, ScramCredential]:
    """Mechanism -> credential of a user's znode data (create_user_credentials, or the
    older single SCRAM-SHA-512 credential). ValueError/KeyError when unreadable."""
    d = json.loads(data)
    out = {c.mechanism: c for c in (ScramCredential.from_dict(x) for x in d.get("credentials", ()))}
    top = ScramCredential.from_dict(d)
    out.setdefault(top.mechanism, top)
    return out


# Attribute types X500Principal.getName() (RFC 2253) names by keyword; any other type
# is written as its dotted OID with the value's DER encoding in hex.
_RFC2253_KEYWORDS = {
    NameOID.COMMON_NAME: "CN", NameOID.COUNTRY_NAME: "C", NameOID.LOCALITY_NAME: "L",
    NameOID.STATE_OR_PROVINCE_NAME: "ST", NameOID.ORGANIZATION_NAME: "O",
    NameOID.ORGANIZATIONAL_UNIT_NAME: "OU", NameOID.STREET_ADDRESS: "STREET",
    NameOID.DOMAIN_COMPONENT: "DC", NameOID.USER_ID: "UID",
}
# ASN.1 string tags Java writes as text (AVA.isDerString): UTF8String, PrintableString,
# T61String, IA5String, GeneralString, BMPString.
_TEXT_TAGS = {12, 19, 20, 22, 27, 30}
_RFC2253_ESCAPED = ',=+<>#;"\\'
_RULE = re.compile(r"(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?)")


class CertificateIdentityError(AuthenticationError):
    """A verified certificate that names no principal: its subject has several common
    names, or no ssl.principal.mapping.rules rule matches its DN (Kafka's
    NoMatchingRule). The connection is refused."""


def distinguished_name(name: x509.Name) -> str:
    """The RFC 2253 string of a parsed certificate name, as Java's
    `X500Principal.getName()` gives it (the DN Kafka's ssl.principal.mapping.rules see):
    RDNs from last to first joined by ",", the attributes of a multi-valued RDN by "+";
    CN, C, L, ST, O, OU, STREET, DC and UID by keyword with `,=+<>#;"\\` escaped by a
    backslash (leading and trailing spaces too, NUL as \\00); other types as
    `<dotted OID>=#<hex of the value's DER>`, as are non-text values."""
    rdns = []
    for rdn in reversed(name.rdns):
        rdns.append("+".join(_attribute_rfc2253(attribute) for attribute in rdn))
    return ",".join(rdns)


def _attribute_rfc2253(attribute: x509.NameAttribute) -> str:
    # The value's ASN.1 string type, which cryptography keeps (not public API): UTF8String
    # when it is not there.
    asn1_type = getattr(attribute, "_type", None)
    tag = int(getattr(asn1_type, "value", 12))
    keyword = _RFC2253_KEYWORDS.get(attribute.oid)
    if keyword is None or tag not in _TEXT_TAGS or not isinstance(attribute.value, str):
        return f"{attribute.oid.dotted_string}=#{_der_value(attribute.value, tag).hex()}"
    escaped = "".join("\\00" if c == "\0" else "\\" + c if c in _RFC2253_ESCAPED else c
                      for c in attribute.value)
    lead = len(escaped) - len(escaped.lstrip(" \r"))
    trail = len(escaped.rstrip(" \r"))
    if lead == len(escaped):
        trail = 0
    return keyword + "=" + "".join("\\" + c if i < lead or i >= trail else c for i, c in enumerate(escaped))


def _der_value(value: str | bytes, tag: int) -> bytes:
    if isinstance(value, bytes):
        content = value
    elif tag == 30:  # BMPString
        content = value.encode("utf-16-be")
    elif tag == 28:  # UniversalString
        content = value.encode("utf-32-be")
    elif tag == 12:
        content = value.encode("utf-8")
    else:
        content = value.encode("latin-1")
    n = len(content)
    length = bytes([n]) if n < 0x80 else bytes([0x80 | ((n.bit_length() + 7) // 8)]) + n.to_bytes(
        (n.bit_length() + 7) // 8, "big")
    return bytes([tag]) + length + content


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""

    def apply(self, dn: str, common_name: str | None) -> str | None:
        if self.pattern is None:
            return common_name if common_name is not None else dn
        if self.pattern.fullmatch(dn) is None:
            return None
        name = self.pattern.sub(self.replacement, dn)
        return name.lower() if self.case == "L" else name.upper() if self.case == "U" else name


class PrincipalMapper:
    """Kafka's `ssl.principal.mapping.rules` (SslPrincipalMapper): a comma-separated
    list of `RULE:pattern/replacement/[LU]` and `DEFAULT`, tried in order; the first
    that applies names the principal. A RULE applies when `pattern` (a regular
    expression; "/" written "\\/") matches the whole RFC 2253 DN (`distinguished_name`);
    the result is the DN with every match replaced by `replacement` ($1.. the groups,
    "\\" escapes the next character; a $n above the pattern's group count is literal,
    as in Kafka), lowercased with L, uppercased with U. Unlike Kafka, whose DEFAULT is
    the whole DN, Exactly's DEFAULT is the subject's common name (the whole DN when it
    has none). Empty rules are skipped; an empty setting means DEFAULT.

    Raises ValueError naming the rule for a malformed one (at construction, so a
    service with bad rules does not start)."""

    def __init__(self, rules: str = "DEFAULT"):
        self.rules = rules
        self._rules = [self._parse(text) for text in self._split(rules or "DEFAULT")]

    @staticmethod
    def _split(rules: str) -> list[str]:
        out, pos, text = [], 0, rules.strip()
        while pos <= len(text):
            m = _RULE.match(text, pos)
            end = m.end() if m else pos
            comma = text.find(",", end)
            if comma < 0:
                comma = len(text)
            if text[end:comma].strip():  # text after a rule, or no rule at all
                raise ValueError(f"ssl.principal.mapping.rules: malformed rule {text[pos:comma].strip()!r}")
            if m is not None:
                out.append(m.group(0))
            pos = comma + 1
            while pos < len(text) and text[pos].isspace():
                pos += 1
        return out

    @staticmethod
    def _parse(text: str) -> _Rule:
        m = _RULE.fullmatch(text)
        if m.group(1):
            return _Rule(None)
        try:
            pattern = re.compile(m.group(2))
        except re.error as exc:
            raise ValueError(f"ssl.principal.mapping.rules: malformed rule {text!r} ({exc})") from None
        return _Rule(pattern, _python_replacement(m.group(3), pattern.groups, text), m.group(4))

    def principal(self, name: x509.Name) -> str:
        """`User:<name>` for a verified certificate's parsed subject. Raises
        CertificateIdentityError when the subject has several common names (refused
        whatever the rules, so no rule or DEFAULT can pick the wrong one) or when no
        rule applies."""
        common_names = name.get_attributes_for_oid(NameOID.COMMON_NAME)
        if len(common_names) > 1:
            raise CertificateIdentityError(f"certificate subject {distinguished_name(name)!r} has "
                                           f"{len(common_names)} common names; refused")
        common_name = common_names[0].value if common_names else None
        if common_name is not None and not isinstance(common_name, str):
            raise CertificateIdentityError("certificate common name is not a string; refused")
        dn = distinguished_name(name)
        for rule in self._rules:
            result = rule.apply(dn, common_name)
            if result is not None:
                return "User:" + result
        raise CertificateIdentityError(f"no ssl.principal.mapping.rules rule applies to {dn!r}")


def _python_replacement(replacement: str, groups: int, rule: str) -> str:
    """Java's replacement syntax ($n groups, "\\" escapes) as a re.sub template."""
    out, i = [], 0
    while i < len(replacement):
        c = replacement[i]
        if c == "\\":
            if i + 1 == len(replacement):
                raise ValueError(f"ssl.principal.mapping.rules: malformed rule {rule!r} (trailing \\)")
            out.append(replacement[i + 1].replace("\\", "\\\\"))
            i += 2
        elif c == "$":
            digits = re.match(r"\d+", replacement[i + 1:])
            if digits is None:
                raise ValueError(f"ssl.principal.mapping.rules: malformed rule {rule!r} ($ without a group number)")
            ref = digits.group(0)
            number = int(ref[0])
            used = 1
            # Java takes further digits while they name an existing group.
            while used < len(ref) and number * 10 + int(ref[used]) <= groups:
                number = number * 10 + int(ref[used])
                used += 1
            if number > groups:  # Kafka: a reference to a missing group is literal
                out.append("$" + ref[:used])
            else:
                out.append(f"\\g<{number}>")
            i += 1 + used
        else:
            out.append(c.replace("\\", "\\\\"))
            i += 1
    return "".join(out)


def principal_from_certificate(certificate: x509.Certificate, mapper: PrincipalMapper) -> str:
    """`User:<name>` of a verified client certificate, from its parsed subject through
    `mapper` (the one function both the gRPC and the Kafka listener use). Raises
    CertificateIdentityError for a subject that names no principal."""
    return mapper.principal(certificate.subject)


class UserStore:
    """The SCRAM credentials under /exactly/config/users, cached with ZooKeeper
    watches (a change applies within the watch's delivery, no restart). Listeners
    (`add_listener`) hear of every user whose credentials changed or who was deleted,
    so live sessions of that user end (docs/design.md, "SASL", revocation)."""

    def __init__(self, zk=None, ensure_path=None):
        """zk: a started KazooClient (None: no store, every password fails);
        ensure_path(path): creates the users znode (ClusterState.ensure_sensitive_path,
        so it gets the sensitive ACL); default zk.ensure_path."""
        self._users: dict[str, dict[str, ScramCredential]] = {}
        self._fingerprints: dict[str, str] = {}
        self._listeners: list = []
        self._lock = threading.Lock()
        self._zk = zk
        if zk is not None:
            (ensure_path or zk.ensure_path)(USERS)
            zk.ChildrenWatch(USERS, self._on_children)

    def add_listener(self, listener) -> None:
        """Call `listener(name)` (on ZooKeeper's thread, or put()'s caller) after user
        `name`'s credentials changed or the user was deleted."""
        self._listeners.append(listener)

    def remove_listener(self, listener) -> None:
        """Stop calling `listener` (no error when it was not added)."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _changed(self, name: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(name)
            except Exception:  # noqa: BLE001 - one listener's failure must not stop the others; logged
                log.exception("user %s: a change listener failed", name)

    def _on_children(self, children: list[str]) -> None:
        for name in children:
            if name not in self._users:
                self._zk.DataWatch(f"{USERS}/{name}", self._watcher(name))
        with self._lock:
            gone = set(self._users) - set(children)
            for name in gone:
                self._set(name, None)
        for name in gone:
            self._changed(name)

    def _watcher(self, name: str):
        # kazoo passes a third argument (the event) to functions that take three.
        def on_data(data, stat):
            return self._on_data(name, data)
        return on_data

    def _on_data(self, name: str, data: bytes | None) -> bool | None:
        with self._lock:
            before = self._fingerprints.get(name, "")
            if data is None:
                self._set(name, None)
            else:
                try:
                    self._set(name, parse_user_credentials(data))
                except (ValueError, KeyError) as exc:
                    log.warning("user %s: unreadable SCRAM credential (%s); ignored", name, exc)
                    self._set(name, None)
            changed = self._fingerprints.get(name, "") != before
        if changed:
            self._changed(name)
        return False if data is None else None  # stop watching a deleted user

    def _set(self, name: str, creds: dict[str, ScramCredential] | None) -> None:
        """Store (None: drop) a user's credentials and their fingerprint; under _lock."""
        if not creds:
            self._users.pop(name, None)
            self._fingerprints.pop(name, None)
            return
        self._users[name] = creds
        h = hashlib.sha256()
        for m in sorted(creds):
            h.update(m.encode() + creds[m].salt + creds[m].stored_key)
        self._fingerprints[name] = h.hexdigest()[:24]

    def put(self, name: str, *credentials: ScramCredential) -> None:
        with self._lock:
            self._set(name, {c.mechanism: c for c in credentials})
        self._changed(name)

    def credential(self, name: str, mechanism: str) -> ScramCredential | None:
        """The user's stored credential for `mechanism` (None: no such user, or none
        stored for that mechanism)."""
        with self._lock:
            return self._users.get(name, {}).get(mechanism)

    def plain_credential(self, name: str) -> ScramCredential | None:
        """The credential PLAIN checks a password against: the stored SCRAM-SHA-512
        one (SCRAM-SHA-256 when only that is stored); None for no such user."""
        with self._lock:
            creds = self._users.get(name, {})
        return creds.get("SCRAM-SHA-512") or creds.get("SCRAM-SHA-256")

    def verify(self, name: str, password: str) -> bool:
        """Whether `password` is the user's (PLAIN; plain_credential); a PBKDF2, so
        call it off the event loop."""
        cred = self.plain_credential(name)
        return cred is not None and cred.verify(password)

    def fingerprint(self, name: str) -> str:
        """A short digest of the user's stored credentials ("" for no such user):
        session tokens and authenticated connections carry it, so a changed or deleted
        user's tokens stop verifying and its connections close. A dictionary lookup."""
        with self._lock:
            return self._fingerprints.get(name, "")

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._users)


class Authenticator:
    """Decides a call's principal (see the module docstring). `tls`: the listener
    uses TLS (SASL is refused otherwise); `mapping_rules`: ssl.principal.mapping.rules
    (ValueError when malformed, so a service with bad rules does not start);
    `tokens`: the verifier of session tokens (services.common.security.sasl.SessionTokens;
    None: no SASL on this port)."""

    def __init__(self, users: UserStore, tls: bool, mapping_rules: str = "DEFAULT", tokens=None):
        self.users = users
        self.tls = tls
        self.mapper = PrincipalMapper(mapping_rules)
        self.tokens = tokens

    def principal(self, metadata: dict[str, str], certificate: x509.Certificate | None) -> str:
        """The principal of a call with these metadata and verified client
        `certificate` (None: none presented). Raises AuthenticationError for a
        session token that does not verify (forged, expired, revoked), for a password
        sent in the call's metadata (never accepted: SaslAuthenticate exchanges it for
        a token) and CertificateIdentityError for a certificate that names no
        principal."""
        token = metadata.get(SASL_TOKEN_HEADER)
        if token is not None:
            if not self.tls:
                raise AuthenticationError("SASL over a plaintext listener is refused")
            if self.tokens is None:
                raise AuthenticationError("SASL is not enabled on this listener")
            return "User:" + self.tokens.verify(token)
        if SASL_PASSWORD_HEADER in metadata or SASL_USERNAME_HEADER in metadata:
            raise AuthenticationError("a password in a call's metadata is refused; authenticate once with "
                                      "Cluster/SaslAuthenticate and send its session token")
        if certificate is not None:
            return principal_from_certificate(certificate, self.mapper)
        return ANONYMOUS


def peer_certificate(context: grpc.ServicerContext) -> x509.Certificate | None:
    """The verified client certificate of a gRPC call (from the auth context's PEM),
    None when the call presented none."""
    auth = context.auth_context() if context is not None else {}
    pem = (auth.get("x509_pem_cert") or [None])[0]
    return _certificate(pem) if pem else None


@functools.lru_cache(maxsize=1024)
def _certificate(pem: bytes) -> x509.Certificate:
    """A PEM certificate parsed once: a connection's calls, and a tunnel's, present
    the same one (certificates are immutable; peers are bounded by max.connections)."""
    return x509.load_pem_x509_certificate(pem)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Sets `current_principal` for every gRPC call; a failed SASL check ends the
    call with UNAUTHENTICATED (SASL_AUTHENTICATION_FAILED) before the handler runs, as
    does a client certificate that names no principal (CertificateIdentityError).
    With an `authorizer`, the call's checks (services.common.security.authz) run next: a
    failing one ends the call with PERMISSION_DENIED naming the Kafka error.
    Between the two, `gate` (services.common.security.quotas.QuotaInterceptor) holds a call
    of a muted principal, or answers it throttled instead of handling it, and is
    told of each denied call, so that quotas hold calls that are then refused too.
    `authenticator`, `authorizer` and `gate` may be set after the server was built."""

    def __init__(self, authenticator: Authenticator | None = None, authorizer=None, gate=None):
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.gate = gate

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None or self.authenticator is None:
            return handler
        # The handler returned here may serve later calls of the method too: read each
        # call's metadata and certificate from its own context.
        inner = handler.unary_unary
        authenticator, authorizer, gate = self.authenticator, self.authorizer, self.gate
        method = authz.method_key(handler_call_details.method)

        async def behavior(request, context):
            metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
            try:
                principal = authenticator.principal(metadata, peer_certificate(context))
            except CertificateIdentityError as exc:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"SSL authentication failed: {exc}")
            except AuthenticationError as exc:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"SASL_AUTHENTICATION_FAILED: {exc}")
            if gate is not None and (throttled := await gate.admit(principal, method, request, context)) is not None:
                return throttled
            if authorizer is not None and authz.has_rule(method):
                try:
                    authz.enforce(authorizer, principal, method, request)
                except authz.Denied as exc:
                    if gate is not None:
                        gate.denied(principal, context)
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
            token = current_principal.set(principal)
            try:
                return await inner(request, context)
            finally:
                current_principal.reset(token)

        return grpc.unary_unary_rpc_method_handler(behavior, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)
