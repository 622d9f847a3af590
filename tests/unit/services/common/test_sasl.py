"""SASL without a server (docs/design.md, "SASL"): SCRAM-SHA-256/512 exchanges between
the SDK's SaslSession and the services' SaslServer (both through scramp), PLAIN
against the stored SCRAM credential, session tokens (forged, expired, revoked), the
failed-authentication throttle, and user credentials stored for both mechanisms."""
from __future__ import annotations

import asyncio
import base64
import json

import pytest

from exactly_wire.security import SaslAuthenticationError, SaslSession
from exactly_wire.v1 import exactly_pb2 as pb
from exactly.testing import MockTime
from services.common.security.auth import ScramCredential, UserStore, create_user_credentials, parse_user_credentials
from services.common.security.sasl import (AuthThrottle, CheckScheduler, SaslFailure, SaslGateway, SessionTokens,
                                           UnsupportedMechanism, parse_mechanisms, throttle_key)
from services.common.transport.server import sasl_authenticate



def _store(password: str = "correct horse") -> UserStore:
    users = UserStore()
    users.put("dave", *parse_user_credentials(create_user_credentials(password, 4096)).values())
    return users


def _gateway(users: UserStore, **kw) -> SaslGateway:
    return SaslGateway(users, tokens=SessionTokens(b"k" * 32, users), failed_delay_ms=kw.pop("delay", 0), **kw)


def _exchange(gateway: SaslGateway, mechanism: str, user: str, password: str, seen: list | None = None) -> str:
    """The SDK's session against the Cluster/SaslAuthenticate handler; the token."""
    session = SaslSession(mechanism, user, password)

    async def call(request, timeout_s):
        if seen is not None:
            seen.append(request.SerializeToString())
        return await sasl_authenticate(gateway, request, "ipv4:127.0.0.1:5555")
    return asyncio.run(session.token_async(call, 5))


def test_both_scram_credentials_are_stored_and_the_old_format_still_reads():
    data = create_user_credentials("correct horse battery", 4096)
    creds = parse_user_credentials(data)
    assert set(creds) == {"SCRAM-SHA-256", "SCRAM-SHA-512"} and b"correct horse" not in data
    assert all(c.verify("correct horse battery") and not c.verify("px") for c in creds.values())
    assert creds["SCRAM-SHA-256"].salt != creds["SCRAM-SHA-512"].salt
    old = ScramCredential.create("correct horse battery").to_json()  # a user stored before SCRAM-SHA-256 was
    assert set(parse_user_credentials(old)) == {"SCRAM-SHA-512"}
    assert json.loads(data)["mechanism"] == "SCRAM-SHA-512"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_an_exchange_gives_a_token_of_the_user(mechanism):
    users = _store()
    gateway = _gateway(users)
    seen: list = []
    token = _exchange(gateway, mechanism, "dave", "correct horse", seen)
    assert gateway.tokens.verify(token) == "dave"
    if mechanism != "PLAIN":  # challenge-response: the password never leaves the client
        assert len(seen) == 2 and not any(b"correct horse" in m for m in seen)
    assert b"correct horse" not in token.encode()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_a_wrong_password_or_unknown_user_is_refused(mechanism):
    clock = MockTime(0)  # the second attempt from the host waits its slot on it
    gateway = _gateway(_store(), throttle=AuthThrottle(clock=clock.now_s, sleep=clock.sleep_async))
    for user, password in (("dave", "wrong"), ("eve", "correct horse")):
        with pytest.raises(SaslAuthenticationError) as info:
            _exchange(gateway, mechanism, user, password)
        assert info.value.details().startswith("SASL_AUTHENTICATION_FAILED")


def test_unknown_mechanisms_and_sessions_are_refused():
    gateway = _gateway(_store(), mechanisms=("SCRAM-SHA-512",))
    with pytest.raises(SaslAuthenticationError) as info:
        _exchange(gateway, "PLAIN", "dave", "correct horse")
    assert info.value.details().startswith("UNSUPPORTED_SASL_MECHANISM")
    resp = asyncio.run(sasl_authenticate(gateway, pb.SaslAuthenticateRequest(
        mechanism="SCRAM-SHA-512", auth_bytes=b"c=biws,r=x,p=y", session_id="nope"), "ipv4:1.2.3.4:5"))
    assert resp.error_code == 58 and not resp.token
    with pytest.raises(ValueError):
        parse_mechanisms("SCRAM-SHA-512,GSSAPI")
    with pytest.raises(UnsupportedMechanism):
        gateway.server("GSSAPI", "peer")


def test_tokens_expire_and_are_revoked_when_the_user_changes():
    users = _store()
    clock = MockTime(1_000_000)  # 1000 s
    tokens = SessionTokens(b"k" * 32, users, lifetime_ms=60000, clock=clock.now_s)
    token, lifetime = tokens.issue("dave", "SCRAM-SHA-512")
    assert lifetime == 60000 and tokens.verify(token) == "dave"
    clock.advance(61_000)
    with pytest.raises(SaslFailure, match="expired"):
        tokens.verify(token)
    clock.advance(-61_000)
    users.put("dave", ScramCredential.create("new password", 4096))  # password changed
    with pytest.raises(SaslFailure, match="revoked"):
        tokens.verify(token)
    payload = token.split(".")[1]
    with pytest.raises(SaslFailure, match="invalid"):  # another user's name under the same MAC
        tokens.verify(token.replace(payload, payload[:-2] + ("AA" if payload[-2:] != "AA" else "BB")))


def test_the_throttle_spaces_attempts_after_a_failure():
    clock = MockTime(0)
    throttle = AuthThrottle(rate=5, window_s=60, max_wait_s=2, clock=clock.now_s)
    key = throttle_key("dave", "10.0.0.1:5000")
    assert throttle.reserve(key) == 0  # no failure yet: no wait
    assert throttle.tracked() == 0  # and nothing kept for it
    throttle.failed(key)
    waits = [throttle.reserve(key) for _ in range(10)]  # ten attempts at once
    assert waits == pytest.approx([0.2 * (i + 1) for i in range(10)])
    with pytest.raises(SaslFailure):  # more than max_wait_s of queue: refused, nothing reserved
        throttle.reserve(key)
    # The guesser's address and name only: the owner elsewhere, and another user of the
    # guessing address, are not slowed.
    assert throttle.reserve(throttle_key("dave", "10.0.0.2:5000")) == 0
    assert throttle.reserve(throttle_key("carol", "10.0.0.1:5001")) == 0
    with pytest.raises(SaslFailure):  # another port of the guessing host: the same key
        throttle.reserve(throttle_key("dave", "10.0.0.1:6000"))
    clock.set_ms(61_000)  # a minute without failures: free again, and forgotten
    assert throttle.reserve(key) == 0 and throttle.tracked() == 0


def test_the_throttle_keeps_a_bounded_digest_never_the_name():
    clock = MockTime(0)
    throttle = AuthThrottle(max_keys=100, clock=clock.now_s)
    huge = "u" * (40 << 20)
    key = throttle_key(huge, "[2001:db8::1]:5000")
    assert len(key) < 100 and "uuuu" not in key
    assert key.split()[0] == "2001:db8::/64"  # an IPv6 host is its /64
    for i in range(1000):  # made-up users
        clock.set_ms(i)
        throttle.failed(throttle_key(f"made-up-{i}", "10.0.0.1:1"))
    assert throttle.tracked() == 100  # the oldest failures were dropped
    assert throttle.reserve(throttle_key("made-up-999", "10.0.0.1:1")) > 0


def test_unknown_users_get_a_salt_like_known_ones_and_fail_at_the_proof():
    """RFC 5802, 5.1: the server first message of an unknown user has a salt (the same
    at every service and every time, derived from the cluster's key) and the default
    iteration count; the exchange fails only at the proof, with the wrong-password error."""
    from scramp import ScramClient
    users = _store()
    a, b = _gateway(users), _gateway(users)  # two services of one cluster: the same key

    def first(gateway, user):
        client = ScramClient(["SCRAM-SHA-512"], user, "anything")
        server = gateway.server("SCRAM-SHA-512", "10.0.0.9:1")
        reply = asyncio.run(server.step(client.get_client_first().encode())).decode()
        return dict(part.split("=", 1) for part in reply.split(",")[1:])

    real, ghost = first(a, "dave"), first(a, "ghost")
    assert set(real) == set(ghost) == {"s", "i"} and ghost["i"] == real["i"] == "4096"
    assert len(base64.b64decode(ghost["s"])) == len(base64.b64decode(real["s"])) == 32
    assert first(b, "ghost")["s"] == ghost["s"] and first(a, "ghost2")["s"] != ghost["s"]
    errors_seen = []
    for user in ("ghost", "dave"):  # dave with a wrong password: the same answer
        with pytest.raises(SaslAuthenticationError) as info:
            _exchange(a, "SCRAM-SHA-512", user, "wrong")
        errors_seen.append(info.value.details())
    assert errors_seen[0] == errors_seen[1]


@pytest.mark.parametrize("iterations", [1, 4095, 16385, 400000])
def test_iteration_counts_outside_kafkas_bounds_are_refused(iterations, caplog):
    with pytest.raises(ValueError, match="between 4096 and 16384"):
        create_user_credentials("pw", iterations)
    stored = json.loads(create_user_credentials("pw", 4096))
    stored["iterations"] = iterations
    stored["credentials"] = [dict(c, iterations=iterations) for c in stored["credentials"]]
    users = UserStore()
    users._on_data("mallory", json.dumps(stored).encode())  # as the ZooKeeper watch delivers it
    assert users.plain_credential("mallory") is None and "unreadable SCRAM credential" in caplog.text


def test_a_password_changed_during_an_exchange_fails_it():
    """A SCRAM exchange begun before a password change cannot complete with the old
    password after it; a token issued before the change is revoked."""
    from scramp import ScramClient
    users = _store()
    gateway = _gateway(users)
    client = ScramClient(["SCRAM-SHA-512"], "dave", "correct horse")
    server = gateway.server("SCRAM-SHA-512", "10.0.0.9:1")
    client.set_server_first(asyncio.run(server.step(client.get_client_first().encode())).decode())
    token, _ = gateway.tokens.issue("dave", "SCRAM-SHA-512")
    users.put("dave", *parse_user_credentials(create_user_credentials("new horse", 4096)).values())
    with pytest.raises(SaslFailure, match="changed"):
        asyncio.run(server.step(client.get_client_final().encode()))
    with pytest.raises(SaslFailure, match="revoked"):
        gateway.tokens.verify(token)
    assert gateway.tokens.verify(_exchange(gateway, "SCRAM-SHA-512", "dave", "new horse")) == "dave"


def test_a_sasl_message_over_the_receive_limit_is_refused_unread():
    gateway = _gateway(_store(), max_receive_bytes=1024)
    resp = asyncio.run(sasl_authenticate(gateway, pb.SaslAuthenticateRequest(
        mechanism="PLAIN", auth_bytes=b"\0" + b"u" * 2000 + b"\0pw"), "ipv4:10.0.0.1:5"))
    assert resp.error_code == 58 and "sasl.server.max.receive.size=1024" in resp.error_message


def test_pending_exchanges_are_bounded_per_source():
    gateway = _gateway(_store(), max_pending_per_source=3)
    ids = [gateway.begin(gateway.server("SCRAM-SHA-512", f"10.0.0.1:{i}")) for i in range(5)]
    other = gateway.begin(gateway.server("SCRAM-SHA-512", "10.0.0.2:1"))
    assert [gateway.resume(sid) is not None for sid in ids] == [False, False, True, True, True]
    assert gateway.resume(other) is not None


def test_checks_take_turns_between_sources():
    """The check scheduler runs one check at a time, alternating between sources: a
    source with many checks waiting delays another's by at most one."""
    scheduler = CheckScheduler()
    order: list[str] = []

    async def main():
        busy = [asyncio.ensure_future(scheduler.run("10.0.0.1", lambda i=i: order.append(f"busy-{i}")))
                for i in range(5)]
        await asyncio.sleep(0)
        other = asyncio.ensure_future(scheduler.run("10.0.0.2", lambda: order.append("other")))
        await asyncio.gather(*busy, other)
    asyncio.run(main())
    assert order.index("other") <= 2, order


def test_the_session_exchanges_once_and_renews_before_expiry():
    users = _store()
    gateway = _gateway(users)
    gateway.tokens.lifetime_ms = 100000
    clock = MockTime(0)
    session = SaslSession("SCRAM-SHA-512", "dave", "correct horse", clock=clock.now_s)

    async def call(request, timeout_s):
        return await sasl_authenticate(gateway, request, "ipv4:127.0.0.1:1")

    first = asyncio.run(session.token_async(call))
    assert asyncio.run(session.token_async(call)) == first and session.exchanges == 1
    clock.set_ms(95_000)  # within the last tenth of its lifetime: renewed
    asyncio.run(session.token_async(call))
    assert session.exchanges == 2
