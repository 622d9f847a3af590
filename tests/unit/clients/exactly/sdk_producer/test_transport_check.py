"""What the SDK says when its transport does not match the service's (exactly/_transport_check.py):
the sentence for each thing the probe can see, and nothing when the transport is not at fault."""
from __future__ import annotations

import concurrent.futures

import grpc

from exactly._transport_check import Facts, explain, probe, suspect
from exactly_wire.security import TransportSecurity

import listeners

PLAIN = TransportSecurity.from_conf({})
A = "127.0.0.1:9093"


def tls(**extra) -> TransportSecurity:
    """A TLS client's settings without files (the fields explain() reads)."""
    return TransportSecurity(**{"protocol": "SSL", **extra})


def test_each_mismatch_is_named_with_the_setting_to_change():
    assert "is a Kafka protocol port; the SDK speaks gRPC" in explain(Facts(speaks_tls=False, kafka=True), PLAIN, A)
    assert "speaks TLS: set security.protocol=SSL" in explain(Facts(speaks_tls=True, alpn="h2"), PLAIN, A)
    assert "does not speak TLS" in explain(Facts(speaks_tls=False), tls(), A)
    assert "not signed by the CA of ssl.ca.location" in explain(
        Facts(speaks_tls=True, verify_failed="certificate verify failed"), tls(), A)
    needs = explain(Facts(speaks_tls=True, wants_certificate=True), tls(), A)
    assert "requires a client certificate" in needs and "ssl.certificate.location" in needs
    with_sasl = explain(Facts(speaks_tls=True, wants_certificate=True), tls(protocol="SASL_SSL", sasl=("SCRAM-SHA-512", "billing", "pw")), A)
    assert "with SASL_SSL too" in with_sasl and "sasl-client.properties" in with_sasl
    assert "refused the client certificate" in explain(
        Facts(speaks_tls=True, refused_certificate="tlsv1 alert unknown ca"), tls(certificate=b"x", key=b"y"), A)


def test_nothing_is_said_when_the_transport_is_not_at_fault():
    assert explain(Facts(reachable=False), PLAIN, A) is None          # down: grpcio's message is right
    assert explain(Facts(speaks_tls=False), PLAIN, A) is None           # plaintext both sides
    assert explain(Facts(speaks_tls=True, alpn="h2"), tls(), A) is None  # TLS both sides, nothing refused
    assert explain(Facts(speaks_tls=None), tls(), A) is None             # closed without a byte: unknown


def test_a_listener_that_closes_without_a_byte_is_not_called_plaintext():
    """A TLS client whose connections are closed at accept (the service at its connection
    limit) learns nothing of the transport: no ConnectionSetupError, the call's own
    retriable error stands."""
    with listeners.mute(close_at_accept=True) as address:
        facts = probe(address, tls(), timeout_s=2.0)
    assert facts.reachable and facts.speaks_tls is None and not facts.kafka
    assert explain(facts, tls(), address) is None


def test_a_plaintext_grpc_service_is_named_to_a_tls_client():
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(1))
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    try:
        facts = probe(address, tls(), timeout_s=2.0)
    finally:
        server.stop(None)
    assert facts.speaks_tls is False and not facts.kafka
    assert "does not speak TLS: set security.protocol=PLAINTEXT" in explain(facts, tls(), address)


def test_which_failures_are_worth_a_probe():
    assert suspect("UNAVAILABLE: failed to connect to all addresses; last error: UNAVAILABLE: ipv4:1: Socket closed")
    assert suspect("UNKNOWN: ipv4:127.0.0.1:1: Cannot check peer: missing selected ALPN property.")
    assert suspect("Ssl handshake failed: SSL_ERROR_SSL")
    assert not suspect("UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: Connection refused")
    assert not suspect("DEADLINE_EXCEEDED")
