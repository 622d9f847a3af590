"""SaslHandshake and SaslAuthenticate on the Kafka listener over loopback TCP, without
a cluster (docs/design.md, "SASL"): a v0 handshake followed by bare SCRAM tokens, a
v1 handshake with SaslAuthenticate, an unsupported mechanism, a wrong password (answered
SASL_AUTHENTICATION_FAILED, then the connection closed), and a request before the
exchange completed on a listener that requires authentication."""
from __future__ import annotations

import asyncio
import io

from kio.serial import entity_reader, entity_writer
from kio.schema.request_header.v1.header import RequestHeader
from scramp import ScramClient

from exactly.testing import MockTime
from services.common.security.auth import UserStore, create_user_credentials, current_principal, parse_user_credentials
from services.common.kafka.codec import build, request_class, response_class
from services.common.kafka.listener import Api, KafkaListener
from services.common.security.sasl import AuthThrottle, SaslGateway


METADATA = 3


def _request(api_key: int, version: int, body: dict, correlation_id: int = 7) -> bytes:
    out = io.BytesIO()
    entity_writer(RequestHeader)(out, RequestHeader(request_api_key=api_key, request_api_version=version,
                                                    correlation_id=correlation_id, client_id="t"))
    entity_writer(request_class(api_key, version))(out, build(request_class(api_key, version), body))
    data = out.getvalue()
    return len(data).to_bytes(4, "big") + data


async def _frame(reader: asyncio.StreamReader) -> bytes:
    size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 10), "big")
    return await asyncio.wait_for(reader.readexactly(size), 10)


def _response(api_key: int, version: int, frame: bytes):
    return entity_reader(response_class(api_key, version))(frame, 4)[0]  # after the v0 response header


async def _closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(1), 10) == b""


def _run(body, throttle: AuthThrottle | None = None, **listener_kw) -> None:
    """`body(port, seen, listener)` against a listener that requires authentication, no
    TLS (so every connection is before authentication until its SASL exchange
    completes); `seen`: the principals of the Metadata requests served."""
    users = UserStore()
    users.put("dave", *parse_user_credentials(create_user_credentials("secret", 4096)).values())
    seen: list[str] = []

    async def metadata(req, version, ctx):
        seen.append(current_principal.get())
        return {"throttle_time": 0, "brokers": [], "topics": []}

    async def main():
        gateway = SaslGateway(users, throttle=throttle or AuthThrottle(), failed_delay_ms=0)
        listener = KafkaListener({METADATA: Api(1, 1, metadata)}, sasl=gateway, require_authentication=True,
                                 **listener_kw)
        port = await listener.start("127.0.0.1", 0)
        try:
            await asyncio.wait_for(body(port, seen, listener), 30)
        finally:
            await listener.stop()
    asyncio.run(main())


def test_v0_handshake_then_bare_scram_tokens():
    async def body(port, seen, listener):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request(17, 0, {"mechanism": "SCRAM-SHA-256"}))
        assert _response(17, 0, await _frame(reader)).error_code.value == 0
        client = ScramClient(["SCRAM-SHA-256"], "dave", "secret")
        first = client.get_client_first().encode()
        writer.write(len(first).to_bytes(4, "big") + first)
        client.set_server_first((await _frame(reader)).decode())
        final = client.get_client_final().encode()
        writer.write(len(final).to_bytes(4, "big") + final)
        client.set_server_final((await _frame(reader)).decode())  # the server's signature verifies
        writer.write(_request(METADATA, 1, {"topics": []}))
        await _frame(reader)
        assert seen == ["User:dave"]
        writer.close()
    _run(body)


def test_v1_handshake_authenticate_and_refusals():
    async def body(port, seen, listener):
        # PLAIN through SaslAuthenticate v2 (flexible).
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request(17, 1, {"mechanism": "PLAIN"}))
        assert _response(17, 1, await _frame(reader)).error_code.value == 0
        writer.write(_request(36, 1, {"auth_bytes": b"\0dave\0secret"}))
        assert _response(36, 1, await _frame(reader)).error_code.value == 0
        writer.write(_request(METADATA, 1, {"topics": []}))
        await _frame(reader)
        assert seen == ["User:dave"]
        writer.close()
        # A wrong password: SASL_AUTHENTICATION_FAILED, then closed.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request(17, 1, {"mechanism": "PLAIN"}))
        await _frame(reader)
        writer.write(_request(36, 1, {"auth_bytes": b"\0dave\0guess"}))
        assert _response(36, 1, await _frame(reader)).error_code.value == 58
        assert await _closed(reader)
        # An unsupported mechanism: UNSUPPORTED_SASL_MECHANISM naming the enabled ones.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request(17, 1, {"mechanism": "GSSAPI"}))
        resp = _response(17, 1, await _frame(reader))
        assert resp.error_code.value == 33 and "SCRAM-SHA-512" in resp.mechanisms
        # No certificate and no SASL on a listener that requires authentication: closed.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request(METADATA, 1, {"topics": []}))
        assert await _closed(reader)
        assert seen == ["User:dave"]
    _run(body)


def test_guesses_on_the_kafka_port_are_spaced_by_the_throttle():
    """Six connections guess dave's password at once: after the first failure the
    answers come at most 5 a second (the same AuthThrottle as the gRPC port). The
    throttle runs on a clock that only its waits move, so the spacing is exact."""
    clock = MockTime(0)

    class Recording(AuthThrottle):
        """Keeps the clock's time at which each password check was let through."""

        def __init__(self, **kw):
            super().__init__(**kw)
            self.admitted: list[float] = []

        async def admit(self, key):
            await super().admit(key)
            self.admitted.append(self.clock())

    throttle = Recording(rate=5, clock=clock.now_s, sleep=clock.sleep_async)

    async def body(port, seen, listener):
        async def guess(i: int) -> float:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_request(17, 1, {"mechanism": "PLAIN"}))
            await _frame(reader)
            writer.write(_request(36, 1, {"auth_bytes": b"\0dave\0guess-%d" % i}))
            assert _response(36, 1, await _frame(reader)).error_code.value == 58
            writer.close()
            return clock.now_s()
        answered = await asyncio.gather(*(guess(i) for i in range(6)))
        # The first check runs before any failure is recorded; from then on 0.2 s apart.
        assert max(answered) >= 0.2 * 4, answered
        checked = throttle.admitted
        assert len(checked) == 6 and checked[0] == 0.0, checked
        assert all(b - a >= 0.2 - 1e-9 for a, b in zip(checked, checked[1:])), checked
    _run(body, throttle)


async def _plain_login(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request(17, 1, {"mechanism": "PLAIN"}))
    await _frame(reader)
    writer.write(_request(36, 1, {"auth_bytes": b"\0dave\0secret"}))
    assert _response(36, 1, await _frame(reader)).error_code.value == 0
    return reader, writer


def test_before_authentication_a_request_is_capped_and_large_ones_share_a_pool():
    """sasl.server.max.receive.size: a 100 MB size prefix before authentication closes
    the connection at once; requests between 8 KB and the limit share a pool of four
    (a fifth closes its connection) while small ones, a login, go on; after the login
    the ordinary limit holds again."""
    from prometheus_client import REGISTRY

    def refused() -> float:
        return REGISTRY.get_sample_value("exactly_connections_refused_total",
                                         {"listener": "kafka", "reason": "sasl.server.max.receive.size"}) or 0.0

    async def body(port, seen, listener):
        before = refused()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write((100 << 20).to_bytes(4, "big") + b"x" * 1000)
        assert await _closed(reader)
        assert refused() == before + 1
        slow = []
        for _ in range(4):  # four large requests announced, a little sent
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write((500_000).to_bytes(4, "big") + b"x" * 100)
            slow.append((r, w))
        while listener.preauth_pool_bytes >= 500_000:  # until the listener holds all four
            await asyncio.sleep(0)
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write((500_000).to_bytes(4, "big"))
        assert await _closed(r)  # the pool is taken
        reader, writer = await _plain_login(port)  # small requests are not held up
        topics = [{"name": f"topic-{i:024d}"} for i in range(20000)]  # > 512 KB, after authentication
        writer.write(_request(METADATA, 1, {"topics": topics}))
        await _frame(reader)
        for r, w in slow:
            w.close()
        writer.close()
    _run(body, max_preauth_bytes=524288)


def test_changing_or_deleting_a_user_closes_its_connections():
    """A connection authenticated as dave is closed when dave's password changes (the
    UserStore's change listener), and one authenticated again after that stays open."""
    async def body(port, seen, listener):
        reader, writer = await _plain_login(port)
        writer.write(_request(METADATA, 1, {"topics": []}))
        await _frame(reader)
        users = listener.sasl.users
        users.put("dave", *parse_user_credentials(create_user_credentials("new secret", 4096)).values())
        assert await _closed(reader)
        writer.close()
        assert listener.sasl.users.fingerprint("dave")  # the store itself is untouched
    _run(body)


def test_reauthentication_keeps_the_connection_and_the_principal():
    """connections.max.reauth.ms (KIP-368): SaslAuthenticate answers the session lifetime;
    a second handshake and exchange on the same connection re-authenticates as the same
    user; as another user it closes the connection."""
    async def body(port, seen, listener):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):
            writer.write(_request(17, 1, {"mechanism": "PLAIN"}))
            await _frame(reader)
            writer.write(_request(36, 1, {"auth_bytes": b"\0dave\0secret"}))
            answer = _response(36, 1, await _frame(reader))
            assert answer.error_code.value == 0 and answer.session_lifetime.total_seconds() == 60.0
            writer.write(_request(METADATA, 1, {"topics": []}))
            await _frame(reader)
        assert seen == ["User:dave", "User:dave"]
        listener.sasl.users.put("erin", *parse_user_credentials(create_user_credentials("pw", 4096)).values())
        writer.write(_request(17, 1, {"mechanism": "PLAIN"}))
        await _frame(reader)
        writer.write(_request(36, 1, {"auth_bytes": b"\0erin\0pw"}))
        assert await _closed(reader)
        writer.close()
    _run(body, reauth_ms=60000)
