"""Transport security settings and credentials, shared by the SDK's clients and the
services' channels to each other (docs/design.md, "Security").

Kafka's / librdkafka's keys: `security.protocol` (PLAINTEXT, SSL, SASL_PLAINTEXT,
SASL_SSL), `ssl.ca.location`, `ssl.certificate.location`, `ssl.key.location`,
`ssl.key.password`, `ssl.endpoint.identification.algorithm` (https: the server's
certificate must name the host connected to; gRPC always checks it, so no other
value is accepted), `sasl.mechanism` (SCRAM-SHA-256, SCRAM-SHA-512, PLAIN),
`sasl.username`, `sasl.password`.

SASL (docs/security.md, "SASL"): each channel authenticates once, with one
Cluster/SaslAuthenticate exchange (`SaslSession`: SCRAM-SHA-256/512 as RFC 5802
challenge-response through `scramp`, the server's signature checked too; or PLAIN),
and then sends only the session token it got (`SASL_TOKEN_HEADER`) in each call's
metadata, exchanging again before the token expires. The password never travels per
call; with SCRAM it never travels at all. The services refuse SASL over a plaintext
listener.
"""
from __future__ import annotations

import os
import pathlib
import ssl
import tempfile
from dataclasses import dataclass
from typing import Any, Literal, Mapping

import grpc

from .config import LOW, MEDIUM, ConfigSchema, ConfigurationError, keys, parse, setting
from . import DISTRIBUTION

# A session token from Cluster/SaslAuthenticate, in every call's metadata.
SASL_TOKEN_HEADER = "x-exactly-sasl-token"
# Never sent: the services refuse a call whose metadata carries them.
SASL_USERNAME_HEADER = "x-exactly-sasl-username"
SASL_PASSWORD_HEADER = "x-exactly-sasl-password"
SASL_AUTHENTICATE_METHOD = "/exactly.v1.Cluster/SaslAuthenticate"
SASL_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
TLS_PROTOCOLS = ("SSL", "SASL_SSL")
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")


class SecuritySettings(ConfigSchema):
    """The transport security keys (see the module docstring)."""

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = setting(
        "security.protocol", "PLAINTEXT", "Transport security: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL "
        "(one SASL exchange per channel, then a session token in every call; over TLS with SASL_SSL).", MEDIUM)
    ssl_ca_location: str | None = setting("ssl.ca.location", None, "PEM file of the CA certificate(s) that sign "
                                          "the services' certificates.", MEDIUM)
    ssl_certificate_location: str | None = setting("ssl.certificate.location", None, "PEM file of this "
                                                   "client's certificate (mutual TLS; its common name is the "
                                                   "principal).", MEDIUM)
    ssl_key_location: str | None = setting("ssl.key.location", None, "PEM file of the private key of "
                                           "ssl.certificate.location.", MEDIUM)
    ssl_key_password: str | None = setting("ssl.key.password", None, "Password of an encrypted "
                                           "ssl.key.location.", LOW)
    ssl_endpoint_identification_algorithm: Literal["https"] = setting(
        "ssl.endpoint.identification.algorithm", "https", "The server's certificate must name the host "
        "connected to (https; always on with gRPC).", LOW)
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = setting(
        "sasl.mechanism", "PLAIN", "SASL mechanism: SCRAM-SHA-256 or SCRAM-SHA-512 (challenge-response; the "
        "password never leaves the client) or PLAIN (the password, over TLS, checked against the stored "
        "SCRAM-SHA-512 credential).", LOW)
    sasl_username: str | None = setting("sasl.username", None, "SASL user name (principal User:<name>).", MEDIUM)
    sasl_password: str | None = setting("sasl.password", None, "SASL password.", MEDIUM)


def _read(key: str, path: str | None, error: type[ConfigurationError]) -> bytes | None:
    if path is None:
        return None
    try:
        return pathlib.Path(path).read_bytes()
    except OSError as exc:
        raise error(f"{key}={path!r}: {exc.strerror or exc}", key=key, value=path,
                    allowed="a readable PEM file") from None


def decrypt_key(pem: bytes, password: str | None, error: type[ConfigurationError] = ConfigurationError) -> bytes:
    """An unencrypted PEM of the private key `pem` (decrypted with `password` when it
    is encrypted; needs the `cryptography` package then). Raises `error`."""
    if password is None and b"ENCRYPTED" not in pem:
        return pem
    try:
        from cryptography.hazmat.primitives import serialization
    except ImportError:  # pragma: no cover - the server extra installs it
        raise error(f"ssl.key.password needs the cryptography package (pip install '{DISTRIBUTION}[server]')",
                    key="ssl.key.password") from None
    try:
        key = serialization.load_pem_private_key(pem, password.encode() if password else None)
    except (ValueError, TypeError) as exc:
        raise error(f"ssl.key.location cannot be read with ssl.key.password: {exc}", key="ssl.key.password",
                    allowed="the key's password") from None
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass(frozen=True)
class TransportSecurity:
    """What a channel needs: TLS material (PEM bytes) and SASL credentials."""

    protocol: str = "PLAINTEXT"
    ca: bytes | None = None
    certificate: bytes | None = None
    key: bytes | None = None
    sasl: tuple[str, str, str] | None = None  # mechanism, username, password

    @property
    def tls(self) -> bool:
        return self.protocol in TLS_PROTOCOLS

    @classmethod
    def from_settings(cls, settings: SecuritySettings, error: type[ConfigurationError] = ConfigurationError,
                      role: str = "client") -> "TransportSecurity":
        """From parsed settings (a client's or a service's schema: the SecuritySettings
        fields). Raises `error` naming the key: SSL/SASL_SSL without ssl.ca.location, a
        certificate without its key (or the reverse), SASL without username and
        password, unreadable files."""
        protocol = settings.security_protocol
        if protocol == "PLAINTEXT":
            return cls()
        ca = _read("ssl.ca.location", settings.ssl_ca_location, error)
        cert = _read("ssl.certificate.location", settings.ssl_certificate_location, error)
        key = _read("ssl.key.location", settings.ssl_key_location, error)
        if protocol in TLS_PROTOCOLS and ca is None:
            raise error(f"security.protocol={protocol} needs ssl.ca.location for the {role}",
                        key="ssl.ca.location", allowed="a PEM file")
        if (cert is None) != (key is None):
            missing = "ssl.key.location" if key is None else "ssl.certificate.location"
            raise error(f"ssl.certificate.location and ssl.key.location go together: {missing} is missing",
                        key=missing, allowed="a PEM file")
        if key is not None:
            key = decrypt_key(key, settings.ssl_key_password, error)
        sasl = None
        if protocol in SASL_PROTOCOLS:
            user, password = settings.sasl_username, settings.sasl_password
            if not user or password is None:
                raise error(f"security.protocol={protocol} needs sasl.username and sasl.password",
                            key="sasl.username" if not user else "sasl.password", allowed="a string")
            sasl = (settings.sasl_mechanism, user, password)
        return cls(protocol, ca, cert, key, sasl)

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any], error: type[ConfigurationError] = ConfigurationError
                  ) -> "TransportSecurity":
        """From a mapping of client settings by Kafka key (only the security keys are
        read; the others are left to the client's own schema), parsed by
        SecuritySettings: for a caller that holds settings but no client (a health
        check, a test's raw gRPC channel). Raises `error` as `from_settings`, or for a
        wrong value of a security key."""
        wanted = set(keys(SecuritySettings))
        return cls.from_settings(parse(SecuritySettings, {k: v for k, v in conf.items() if k in wanted}), error)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.certificate)

    def session(self) -> "SaslSession | None":
        """A new SaslSession for one channel (None without SASL)."""
        return SaslSession(*self.sasl) if self.sasl is not None else None


class SaslAuthenticationError(grpc.RpcError):
    """A refused SASL exchange, as the RpcError a refused call raises:
    UNAUTHENTICATED with details "<Kafka error name>: <message>" (so the SDK's
    error mapping gives SaslAuthenticationFailedError / UnsupportedSaslMechanismError)."""

    def __init__(self, error_code: int, message: str):
        super().__init__(message)
        from .error_codes import ErrorCode
        try:
            name = ErrorCode(error_code).name
        except ValueError:
            name = "SASL_AUTHENTICATION_FAILED"
        self._details = f"{name}: {message}"

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAUTHENTICATED

    def details(self) -> str:
        return self._details


class SaslSession:
    """The client side of SASL on one channel (module docstring): `token(call)` (or
    `await token_async(call)`) returns a valid session token, running the
    Cluster/SaslAuthenticate exchange through `call(request, timeout_s) -> response`
    when there is none or it expires within a tenth of its lifetime (at most 60 s).
    Raises SaslAuthenticationError when the service refuses the credentials, and
    whatever `call` raises."""

    def __init__(self, mechanism: str, username: str, password: str, clock=None):
        import time
        self.mechanism, self.username, self._password = mechanism, username, password
        self._clock = clock or time.monotonic
        self._token: str | None = None
        self._renew_at = 0.0
        self._lock = __import__("threading").Lock()
        self.exchanges = 0  # how many exchanges this session ran (observability, tests)

    def _valid(self) -> str | None:
        return self._token if self._token is not None and self._clock() < self._renew_at else None

    def _exchange(self):
        """A generator: yields each request, is sent each response; returns
        (token, lifetime ms)."""
        from .v1 import exactly_pb2 as pb
        if self.mechanism == "PLAIN":
            resp = yield pb.SaslAuthenticateRequest(
                mechanism="PLAIN", auth_bytes=b"\0" + self.username.encode() + b"\0" + self._password.encode())
            _check(resp)
        else:
            from scramp import ScramClient, ScramException
            client = ScramClient([self.mechanism], self.username, self._password)
            resp = yield pb.SaslAuthenticateRequest(mechanism=self.mechanism,
                                                    auth_bytes=client.get_client_first().encode())
            _check(resp)
            try:
                client.set_server_first(resp.auth_bytes.decode())
                final = client.get_client_final()
            except ScramException as exc:
                raise SaslAuthenticationError(58, f"bad SCRAM server first message: {exc}") from None
            resp = yield pb.SaslAuthenticateRequest(mechanism=self.mechanism, auth_bytes=final.encode(),
                                                    session_id=resp.session_id)
            _check(resp)
            try:
                client.set_server_final(resp.auth_bytes.decode())  # the server proves it knows the credential
            except ScramException as exc:
                raise SaslAuthenticationError(58, f"the server's SCRAM signature does not verify: {exc}") from None
        if not resp.token:
            raise SaslAuthenticationError(58, "the SASL exchange ended without a session token")
        return resp.token, resp.session_lifetime_ms

    def _keep(self, token: str, lifetime_ms: int) -> str:
        lifetime_s = max(lifetime_ms, 0) / 1000
        self._token, self._renew_at = token, self._clock() + lifetime_s - min(60.0, lifetime_s / 10)
        self.exchanges += 1
        return token

    def token(self, call, timeout_s: float | None = None) -> str:
        """A valid token, exchanging (blocking) when needed."""
        with self._lock:
            valid = self._valid()
            if valid is not None:
                return valid
            gen = self._exchange()
            request = next(gen)
            try:
                while True:
                    request = gen.send(call(request, timeout_s))
            except StopIteration as done:
                return self._keep(*done.value)

    async def token_async(self, call, timeout_s: float | None = None) -> str:
        """A valid token, exchanging when needed; `call` is a coroutine function. The
        client's PBKDF2 runs in a worker thread."""
        import asyncio
        valid = self._valid()
        if valid is not None:
            return valid
        lock = self.__dict__.setdefault("_alock", asyncio.Lock())
        async with lock:
            valid = self._valid()
            if valid is not None:
                return valid
            gen = self._exchange()
            step: tuple = (False, next(gen))
            while not step[0]:
                response = await call(step[1], timeout_s)
                step = await asyncio.to_thread(_send, gen, response)
            return self._keep(*step[1])


def _send(gen, value) -> tuple:
    """(False, next request) or (True, the generator's result): StopIteration cannot
    cross a thread's future."""
    try:
        return False, gen.send(value)
    except StopIteration as done:
        return True, done.value


def _check(resp) -> None:
    if resp.error_code:
        raise SaslAuthenticationError(resp.error_code, resp.error_message or "SASL authentication failed")


def _serializers():
    from .v1 import exactly_pb2 as pb
    return pb.SaslAuthenticateRequest.SerializeToString, pb.SaslAuthenticateResponse.FromString


class _SaslInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds the channel's session token to every call's metadata (SaslSession)."""

    def __init__(self, channel: grpc.Channel, session: SaslSession):
        ser, de = _serializers()
        self._authenticate = channel.unary_unary(SASL_AUTHENTICATE_METHOD, request_serializer=ser,
                                                 response_deserializer=de)
        self.session = session

    def _details(self, details):
        timeout = details.timeout if details.timeout is not None else 30.0
        token = self.session.token(lambda req, t: self._authenticate(req, timeout=t), timeout)
        md = list(details.metadata or ()) + [(SASL_TOKEN_HEADER, token)]
        return _CallDetails(details.method, details.timeout, md, details.credentials,
                            getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)
class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression


def secure_channel(address: str, security: TransportSecurity, options: list) -> grpc.Channel:
    """A blocking channel to `address` with `security` (TLS; with SASL, one
    SaslAuthenticate exchange and then the session token in every call)."""
    channel = grpc.secure_channel(address, security.channel_credentials(), options=options) if security.tls \
        else grpc.insecure_channel(address, options=options)
    session = security.session()
    return grpc.intercept_channel(channel, _SaslInterceptor(channel, session)) if session else channel


class _AioSaslInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """The asyncio _SaslInterceptor; `channel` is set once the channel exists (the
    exchange's own calls pass through unchanged)."""

    def __init__(self, session: SaslSession):
        self.session = session
        self.channel: grpc.aio.Channel | None = None

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        method = client_call_details.method
        method = method.decode() if isinstance(method, bytes) else method
        if method == SASL_AUTHENTICATE_METHOD:
            return await continuation(client_call_details, request)
        ser, de = _serializers()
        authenticate = self.channel.unary_unary(SASL_AUTHENTICATE_METHOD, request_serializer=ser,
                                                response_deserializer=de)
        timeout = client_call_details.timeout if client_call_details.timeout is not None else 30.0
        token = await self.session.token_async(lambda req, t: authenticate(req, timeout=t), timeout)
        md = grpc.aio.Metadata(*(tuple(client_call_details.metadata or ()) + ((SASL_TOKEN_HEADER, token),)))
        details = grpc.aio.ClientCallDetails(client_call_details.method, client_call_details.timeout, md,
                                             client_call_details.credentials, client_call_details.wait_for_ready)
        return await continuation(details, request)


def load_pem_chain(ctx: ssl.SSLContext, certificate: bytes, key: bytes) -> None:
    """Load a certificate chain and its key, PEM bytes, into `ctx`: `ssl` reads a chain
    only from files, so they go through 0600 files in a private directory removed at once."""
    with tempfile.TemporaryDirectory(prefix="exactly-tls-") as d:
        paths = []
        for name, data in (("cert.pem", certificate), ("key.pem", key)):
            path = os.path.join(d, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            paths.append(path)
        ctx.load_cert_chain(paths[0], paths[1])


def client_ssl_context(security: TransportSecurity) -> ssl.SSLContext | None:
    """The TLS context of a client connection with `security` (None without TLS): the
    server verified against ssl.ca.location with its host name checked, as the gRPC
    channel does, and the client certificate, if any."""
    if not security.tls:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                     cadata=security.ca.decode() if security.ca else None)
    if security.certificate is not None and security.key is not None:
        load_pem_chain(ctx, security.certificate, security.key)
    return ctx


def secure_aio_channel(address: str, security: TransportSecurity, options: list) -> grpc.aio.Channel:
    """An asyncio channel to `address` with `security` (TLS; SASL as secure_channel)."""
    session = security.session()
    interceptor = _AioSaslInterceptor(session) if session else None
    interceptors = [interceptor] if interceptor else None
    if security.tls:
        channel = grpc.aio.secure_channel(address, security.channel_credentials(), options=options,
                                          interceptors=interceptors)
    else:
        channel = grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    if interceptor is not None:
        interceptor.channel = channel
    return channel
