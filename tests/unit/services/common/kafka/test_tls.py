"""The Kafka listener's TLS with its handshakes in worker threads (services/common/kafka/tls.py)
over loopback: TLS clients without a certificate connect, authenticate with SASL and make
requests, many at once, bytes pipelined behind the handshake included; asyncio's
SSLProtocol still has what OffloadedHandshake overrides."""
from __future__ import annotations

import asyncio
import ssl
from asyncio import sslproto

import pytest

from exactly_tools.certs import CertificateAuthority
from services.common.kafka.listener import Api, KafkaListener
from services.common.kafka.tls import OffloadedHandshake
from services.common.security.auth import UserStore, create_user_credentials, parse_user_credentials
from services.common.security.sasl import SaslGateway

from ..test_kafka_sasl import METADATA, _closed, _frame, _request, _response


@pytest.fixture(scope="module")
def contexts(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    ca = CertificateAuthority.create(d)
    issued = ca.issue("pl-0", hosts=["127.0.0.1"])
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(issued.certificate, issued.key)
    server.load_verify_locations(ca.ca_path)
    server.verify_mode = ssl.CERT_OPTIONAL
    client = ssl.create_default_context(cafile=str(ca.ca_path))
    return server, client


def test_the_overridden_methods_are_asyncios():
    for name in ("_do_handshake", "buffer_updated", "connection_lost", "_on_handshake_complete",
                 "_process_outgoing", "_do_read", "_get_app_transport"):
        assert callable(getattr(sslproto.SSLProtocol, name)), name
    assert sslproto.SSLProtocolState.DO_HANDSHAKE and sslproto.SSLAgainErrors
    assert issubclass(OffloadedHandshake, sslproto.SSLProtocol)


def test_clients_without_certificates_connect_and_authenticate_over_tls(contexts):
    server_ctx, client_ctx = contexts
    users = UserStore()
    users.put("dave", *parse_user_credentials(create_user_credentials("secret", 4096)).values())
    seen: list[str] = []

    async def metadata(req, version, ctx):
        from services.common.security.auth import current_principal
        seen.append(current_principal.get())
        return {"throttle_time": 0, "brokers": [], "topics": []}

    async def client(port: int, pipelined: bool) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx,
                                                       server_hostname="127.0.0.1")
        handshake, login = _request(17, 1, {"mechanism": "PLAIN"}), _request(36, 1, {"auth_bytes": b"\0dave\0secret"})
        writer.write(handshake + login if pipelined else handshake)
        await _frame(reader)
        if not pipelined:
            writer.write(login)
        assert _response(36, 1, await _frame(reader)).error_code.value == 0
        writer.write(_request(METADATA, 1, {"topics": []}))
        await _frame(reader)
        writer.close()

    async def main():
        gateway = SaslGateway(users, failed_delay_ms=0)
        listener = KafkaListener({METADATA: Api(1, 1, metadata)}, sasl=gateway, require_authentication=True)
        port = await listener.start("127.0.0.1", 0, server_ctx)
        try:
            await asyncio.wait_for(asyncio.gather(*(client(port, i % 2 == 0) for i in range(40))), 60)
            # A request without authentication still closes the connection.
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx,
                                                           server_hostname="127.0.0.1")
            writer.write(_request(METADATA, 1, {"topics": []}))
            assert await _closed(reader)
            writer.close()
        finally:
            await listener.stop()
    asyncio.run(main())
    assert seen == ["User:dave"] * 40


def test_a_failed_handshake_leaves_no_garbage(contexts):
    """A connection whose handshake fails (bytes that are not TLS) is freed with the
    connection, not kept in a reference cycle until a full garbage collection (the
    failure's traceback held the frame that held the future that held the failure: 60 KB
    of TLS state a connection)."""
    import gc
    server_ctx, _ = contexts

    async def main():
        listener = KafkaListener({}, require_authentication=True)
        port = await listener.start("127.0.0.1", 0, server_ctx)
        try:
            for _ in range(20):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET / HTTP/1.1\r\n\r\n" * 20)
                assert await _closed(reader)
                writer.close()
            while listener._connections:  # each connection's task ends after its close
                await asyncio.sleep(0)
        finally:
            await listener.stop()
    gc.collect()
    gc.disable()
    try:
        asyncio.run(main())
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, OffloadedHandshake)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []
