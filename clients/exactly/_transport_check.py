"""Why a connection to a service fails before any call gets through, when grpcio only
says "Socket closed" or "handshake failed": the client and the service disagree on the
transport. `probe(address, security)` connects once more with plain sockets (bounded by
`timeout_s`) and records what the service does — speaks TLS or not, asks for a client
certificate, has a certificate the client's CA signed, answers Kafka's ApiVersions (a
Kafka port, not a gRPC one) — and `explain(facts, security, address)` (pure) turns that
into a sentence naming what the service expected and which setting to change; None when
nothing is wrong with the transport (a service that was down, say). The SDK raises it as
`errors.ConnectionSetupError` (Kafka's clients say the same with SslAuthenticationException
and their "disconnected while ... check security.protocol" warnings).
"""
from __future__ import annotations

import socket
import ssl
import struct
from dataclasses import dataclass

from exactly_wire.security import TransportSecurity

# What grpcio reports when the transport, not the service, refused the call.
_SUSPECT = ("socket closed", "handshake", "connection reset", "ssl", "tls", "certificate", "alpn",
            "check peer", "end of tcp stream", "connection closed")
# An ApiVersions v0 request (key 18), correlation id "EXCT", client id "exactly-probe".
_CORRELATION = 0x45584354
_CLIENT_ID = b"exactly-probe"
_API_VERSIONS = struct.pack(">hhih", 18, 0, _CORRELATION, len(_CLIENT_ID)) + _CLIENT_ID
_API_VERSIONS = struct.pack(">i", len(_API_VERSIONS)) + _API_VERSIONS


def suspect(details: str) -> bool:
    """Whether a failed call's details point at the transport (TLS, a closed socket)."""
    text = details.lower()
    return any(word in text for word in _SUSPECT)


@dataclass(frozen=True)
class Facts:
    """What the probe saw at one address. `reachable`: a TCP connection was accepted;
    `speaks_tls`: a TLS handshake (no verification) completed, False when the service
    answered the handshake with bytes that are not TLS, None when not known (not tried,
    or the service closed both connections without sending a byte: a TLS listener at
    its connection limit does that, so it says nothing about the transport);
    `alpn`: the protocol the service chose in TLS (gRPC services choose "h2");
    `kafka`: it answered a Kafka ApiVersions request; `verify_failed`: the service's
    certificate is not signed by the client's CA; `wants_certificate`: it refused a
    client without a certificate; `refused_certificate`: it refused the client's
    certificate."""

    reachable: bool = True
    speaks_tls: bool | None = None
    alpn: str | None = None
    kafka: bool = False
    verify_failed: str = ""
    wants_certificate: bool = False
    refused_certificate: str = ""


def explain(facts: Facts, security: TransportSecurity, address: str) -> str | None:
    """A sentence naming what the service at `address` expected and what to set, from
    what `probe` saw with the client's `security`; None when the transport is not at fault."""
    if not facts.reachable:
        return None
    if facts.kafka:
        return (f"{address} is a Kafka protocol port; the SDK speaks gRPC: give bootstrap.servers the services' "
                "gRPC addresses (a dev cluster's bootstrap_servers, `exactly-dev env`), or use a Kafka client "
                "for this port")
    if not security.tls and facts.speaks_tls:
        return (f"{address} speaks TLS: set security.protocol=SSL (or SASL_SSL) and ssl.ca.location to the CA "
                "that signed its certificate")
    if security.tls and facts.speaks_tls is False:
        return (f"{address} does not speak TLS: set security.protocol=PLAINTEXT (or SASL_PLAINTEXT), or give "
                "the address of a TLS listener")
    if facts.verify_failed:
        return (f"the certificate of {address} is not signed by the CA of ssl.ca.location "
                f"({facts.verify_failed}): give the CA of the cluster")
    if facts.wants_certificate and security.certificate is None:
        sasl = (" — with SASL_SSL too: the gRPC port checks a certificate before SASL (`exactly-dev up "
                "--security` writes DIR/sasl-client.properties with one)") if security.sasl else ""
        return (f"{address} requires a client certificate signed by the cluster's CA (ssl.client.auth=required): "
                f"set ssl.certificate.location and ssl.key.location{sasl}")
    if facts.refused_certificate:
        return (f"{address} refused the client certificate of ssl.certificate.location "
                f"({facts.refused_certificate}): it must be signed by the cluster's CA")
    return None


def _kafka_answer(sock: socket.socket) -> tuple[bool, bool]:
    """Send an ApiVersions v0 request: (whether the peer sent any byte back, whether
    its answer carries the request's correlation id: a Kafka port)."""
    head = b""
    try:
        sock.sendall(_API_VERSIONS)
        while len(head) < 8:
            chunk = sock.recv(8 - len(head))
            if not chunk:
                break
            head += chunk
    except (OSError, ssl.SSLError):
        pass
    return bool(head), len(head) == 8 and struct.unpack(">i", head[4:8])[0] == _CORRELATION


# A TLS handshake that ended without a byte from the service: it closed or reset the
# connection (a listener at its connection limit), or did not answer in time.
_SILENT = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionError, TimeoutError)  # socket.timeout is TimeoutError


def _host(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _reason(exc: BaseException) -> str:
    return (getattr(exc, "reason", None) or getattr(exc, "verify_message", None) or str(exc) or
            type(exc).__name__).lower()


def probe(address: str, security: TransportSecurity, timeout_s: float = 3.0) -> Facts:
    """Connect to `address` as a client of `security` would, with plain sockets, and
    record what the service does (Facts). Each connection waits at most `timeout_s`."""
    from ._fork import _ssl_context  # the client's own TLS context: CA, certificate, ALPN h2

    host, port = _host(address)

    def connect() -> socket.socket:
        return socket.create_connection((host, port), timeout=timeout_s)

    try:
        sock = connect()
    except OSError:
        return Facts(reachable=False)
    loose = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    loose.check_hostname = False
    loose.verify_mode = ssl.CERT_NONE
    loose.set_alpn_protocols(["h2"])
    silent = False
    with sock:
        try:
            with loose.wrap_socket(sock, server_hostname=host) as tls:
                alpn = tls.selected_alpn_protocol()
                speaks_tls = True
                kafka = alpn != "h2" and _kafka_answer(tls)[1]
        except (OSError, ssl.SSLError) as exc:
            speaks_tls, alpn, kafka = "certificate" in _reason(exc) or "handshake" in _reason(exc), None, False
            silent = not speaks_tls and isinstance(exc, _SILENT)
    if not speaks_tls:
        answered = False
        try:
            with connect() as plain:
                answered, kafka = _kafka_answer(plain)
        except OSError:
            pass
        if silent and not answered:
            # Closed twice without a byte: nothing is known of the transport (a TLS
            # listener at its connection limit closes at accept), so nothing is said.
            return Facts(speaks_tls=None)
        return Facts(speaks_tls=False, kafka=kafka)
    if kafka or not security.tls:
        return Facts(speaks_tls=True, alpn=alpn, kafka=kafka)
    # As configured: the client's CA, and its certificate if it has one.
    verify_failed = refused = ""
    wants = False
    try:
        with connect() as raw, _ssl_context(security).wrap_socket(raw, server_hostname=host) as tls:
            tls.settimeout(min(timeout_s, 1.0))
            try:  # TLS 1.3: a refused client certificate is an alert (or a close) after the handshake
                closed = tls.recv(1) == b""
            except (socket.timeout, TimeoutError):
                closed = False  # a gRPC service waiting for the HTTP/2 preface: nothing refused
            if closed:
                raise ssl.SSLError("the service closed the connection after the TLS handshake")
    except ssl.SSLCertVerificationError as exc:
        verify_failed = _reason(exc)
    except (OSError, ssl.SSLError) as exc:
        reason = _reason(exc)
        if security.certificate is None and any(w in reason for w in ("certificate_required", "certificate required",
                                                                      "handshake_failure", "eof", "reset",
                                                                      "closed the connection")):
            wants = True
        elif security.certificate is not None and any(w in reason for w in ("unknown_ca", "bad_certificate",
                                                                            "certificate_unknown", "decrypt")):
            refused = reason
    return Facts(speaks_tls=True, alpn=alpn, verify_failed=verify_failed, wants_certificate=wants,
                 refused_certificate=refused)


__all__ = ["Facts", "explain", "probe", "suspect"]
