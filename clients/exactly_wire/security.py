"""Transport security settings and credentials, shared by the SDK's clients and the
services' channels to each other (docs/design.md, "Security").

Kafka's / librdkafka's keys: `security.protocol` (PLAINTEXT, SSL, SASL_PLAINTEXT,
SASL_SSL), `ssl.ca.location`, `ssl.certificate.location`, `ssl.key.location`,
`ssl.key.password`, `ssl.endpoint.identification.algorithm` (https: the server's
certificate must name the host connected to; gRPC always checks it, so no other
value is accepted), `sasl.mechanism` (PLAIN, SCRAM-SHA-512), `sasl.username`,
`sasl.password`.

SASL credentials travel in the metadata of every call (`SASL_*_HEADER`), which is why
SASL_PLAINTEXT is refused by the services unless they are told otherwise: a password
must not cross the network in clear. The services verify them against salted
SCRAM-SHA-512 credentials stored in ZooKeeper (services/common/auth.py).
"""
from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any, Literal

import grpc

from .config import LOW, MEDIUM, ConfigSchema, ConfigurationError, setting

SASL_MECHANISM_HEADER = "x-exactly-sasl-mechanism"
SASL_USERNAME_HEADER = "x-exactly-sasl-username"
SASL_PASSWORD_HEADER = "x-exactly-sasl-password"
TLS_PROTOCOLS = ("SSL", "SASL_SSL")
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")


class SecuritySettings(ConfigSchema):
    """The transport security keys (see the module docstring)."""

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = setting(
        "security.protocol", "PLAINTEXT", "Transport security: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL "
        "(username and password in every call, over TLS with SASL_SSL).", MEDIUM)
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
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-512"] = setting(
        "sasl.mechanism", "PLAIN", "How sasl.username / sasl.password are checked: both are verified against "
        "the salted SCRAM-SHA-512 credentials the cluster stores.", LOW)
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
        raise error("ssl.key.password needs the cryptography package (pip install 'exactly[server]')",
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
    def from_settings(cls, conf: dict[str, Any], error: type[ConfigurationError] = ConfigurationError,
                      role: str = "client") -> "TransportSecurity":
        """From resolved settings (Kafka key -> value). Raises `error` naming the key:
        SSL/SASL_SSL without ssl.ca.location, a certificate without its key (or the
        reverse), SASL without username and password, unreadable files."""
        protocol = conf.get("security.protocol") or "PLAINTEXT"
        if protocol == "PLAINTEXT":
            return cls()
        ca = _read("ssl.ca.location", conf.get("ssl.ca.location"), error)
        cert = _read("ssl.certificate.location", conf.get("ssl.certificate.location"), error)
        key = _read("ssl.key.location", conf.get("ssl.key.location"), error)
        if protocol in TLS_PROTOCOLS and ca is None:
            raise error(f"security.protocol={protocol} needs ssl.ca.location for the {role}",
                        key="ssl.ca.location", allowed="a PEM file")
        if (cert is None) != (key is None):
            missing = "ssl.key.location" if key is None else "ssl.certificate.location"
            raise error(f"ssl.certificate.location and ssl.key.location go together: {missing} is missing",
                        key=missing, allowed="a PEM file")
        if key is not None:
            key = decrypt_key(key, conf.get("ssl.key.password"), error)
        sasl = None
        if protocol in SASL_PROTOCOLS:
            user, password = conf.get("sasl.username"), conf.get("sasl.password")
            if not user or password is None:
                raise error(f"security.protocol={protocol} needs sasl.username and sasl.password",
                            key="sasl.username" if not user else "sasl.password", allowed="a string")
            sasl = (conf.get("sasl.mechanism") or "PLAIN", user, password)
        return cls(protocol, ca, cert, key, sasl)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.certificate)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The SASL headers of every call (empty without SASL)."""
        if self.sasl is None:
            return ()
        mechanism, user, password = self.sasl
        return ((SASL_MECHANISM_HEADER, mechanism), (SASL_USERNAME_HEADER, user),
                (SASL_PASSWORD_HEADER, password))


class _MetadataInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, extra: tuple[tuple[str, str], ...]):
        self.extra = extra

    def _details(self, details):
        md = list(details.metadata or ()) + list(self.extra)
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
    """A blocking channel to `address` with `security` (TLS, SASL headers)."""
    channel = grpc.secure_channel(address, security.channel_credentials(), options=options) if security.tls \
        else grpc.insecure_channel(address, options=options)
    extra = security.metadata()
    return grpc.intercept_channel(channel, _MetadataInterceptor(extra)) if extra else channel


class _AioMetadataInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, extra: tuple[tuple[str, str], ...]):
        self.extra = extra

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        md = grpc.aio.Metadata(*(tuple(client_call_details.metadata or ()) + self.extra))
        details = grpc.aio.ClientCallDetails(client_call_details.method, client_call_details.timeout, md,
                                             client_call_details.credentials, client_call_details.wait_for_ready)
        return await continuation(details, request)


def secure_aio_channel(address: str, security: TransportSecurity, options: list) -> grpc.aio.Channel:
    """An asyncio channel to `address` with `security` (TLS, SASL headers)."""
    interceptors = [_AioMetadataInterceptor(security.metadata())] if security.sasl else None
    if security.tls:
        return grpc.aio.secure_channel(address, security.channel_credentials(), options=options,
                                       interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
