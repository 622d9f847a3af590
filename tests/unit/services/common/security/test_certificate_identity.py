"""The principal of a CA-signed client certificate with a crafted subject, as each
port derives it (the gRPC AuthInterceptor and the Kafka listener's TLS path): the one
common name of the parsed subject, never a "CN=" inside another attribute's value; a
subject with two common names is refused (docs/design.md, "Security")."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest
from cryptography.hazmat.primitives import serialization

from crafted_certs import CRAFTED, TWO_COMMON_NAMES, name, signed
from exactly_tools.certs import CertificateAuthority
from services.common.security.auth import (AuthenticationError, Authenticator, AuthInterceptor, UserStore,
                                           current_principal)
from services.common.kafka.listener import KafkaListener


class _Aborted(Exception):
    pass


class _Context:
    """The parts of a grpc.aio.ServicerContext the interceptor reads."""

    def __init__(self, pem: bytes):
        self.pem = pem
        self.aborted: tuple | None = None

    def invocation_metadata(self):
        return ()

    def auth_context(self):
        return {"x509_pem_cert": [self.pem]}

    async def abort(self, code, details):
        self.aborted = (code, details)
        raise _Aborted(details)


def _grpc_principal(cert) -> str:
    """The principal the gRPC port's interceptor gives a call with `cert`."""
    interceptor = AuthInterceptor(Authenticator(UserStore(), tls=True))
    seen = []

    async def handler(request, context):
        seen.append(current_principal.get())
        return b""

    async def run():
        async def continuation(details):
            return grpc.unary_unary_rpc_method_handler(handler)
        wrapped = await interceptor.intercept_service(
            continuation, SimpleNamespace(method="/exactly.v1.PartitionLeader/Produce"))
        context = _Context(cert.public_bytes(serialization.Encoding.PEM))
        try:
            await wrapped.unary_unary(b"", context)
        except _Aborted:
            assert context.aborted[0] == grpc.StatusCode.UNAUTHENTICATED
            raise AuthenticationError(context.aborted[1])
    asyncio.run(run())
    return seen[0]


def _kafka_principal(cert) -> str:
    """The principal the Kafka listener gives a TLS connection with `cert`."""
    der = cert.public_bytes(serialization.Encoding.DER)
    ssl_object = SimpleNamespace(getpeercert=lambda binary_form=False: der)
    writer = SimpleNamespace(get_extra_info=lambda key, default=None: ssl_object if key == "ssl_object" else default)
    return KafkaListener({})._principal(writer)


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return CertificateAuthority.create(tmp_path_factory.mktemp("ca"))


@pytest.mark.parametrize("port", [_grpc_principal, _kafka_principal], ids=["grpc", "kafka"])
@pytest.mark.parametrize("subject", sorted(CRAFTED.values()))
def test_an_escaped_comma_does_not_make_a_second_common_name(ca, port, subject):
    cert, _ = signed(ca, name(subject))
    assert port(cert) == "User:mallory"


@pytest.mark.parametrize("port", [_grpc_principal, _kafka_principal], ids=["grpc", "kafka"])
def test_a_subject_with_two_common_names_is_refused(ca, port):
    cert, _ = signed(ca, name(TWO_COMMON_NAMES))
    with pytest.raises(AuthenticationError):
        principal = port(cert)
        pytest.fail(f"mapped to {principal}")
