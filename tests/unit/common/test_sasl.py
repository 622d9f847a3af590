"""SASL without a server (docs/design.md, "SASL"): SCRAM-SHA-256/512 exchanges between
the SDK's SaslSession and the services' SaslServer (both through scramp), PLAIN
against the stored SCRAM credential, session tokens (forged, expired, revoked), the
failed-authentication throttle, and user credentials stored for both mechanisms."""
from __future__ import annotations

import asyncio
import json

import pytest

from exactly_wire.security import SaslAuthenticationError, SaslSession
from exactly_wire.v1 import exactly_pb2 as pb
from services.common.security.auth import ScramCredential, UserStore, create_user_credentials, parse_user_credentials
from services.common.security.sasl import (AuthThrottle, SaslFailure, SaslGateway, SessionTokens, UnsupportedMechanism,
                                           parse_mechanisms)
from services.common.transport.server import sasl_authenticate

from .clocks import SleepClock


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
    clock = SleepClock()  # the second attempt from the host waits its slot on it
    gateway = _gateway(_store(), throttle=AuthThrottle(clock=clock, sleep=clock.sleep))
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
    now = [1000.0]
    tokens = SessionTokens(b"k" * 32, users, lifetime_ms=60000, clock=lambda: now[0])
    token, lifetime = tokens.issue("dave", "SCRAM-SHA-512")
    assert lifetime == 60000 and tokens.verify(token) == "dave"
    now[0] += 61
    with pytest.raises(SaslFailure, match="expired"):
        tokens.verify(token)
    now[0] -= 61
    users.put("dave", ScramCredential.create("new password", 4096))  # password changed
    with pytest.raises(SaslFailure, match="revoked"):
        tokens.verify(token)
    payload = token.split(".")[1]
    with pytest.raises(SaslFailure, match="invalid"):  # another user's name under the same MAC
        tokens.verify(token.replace(payload, payload[:-2] + ("AA" if payload[-2:] != "AA" else "BB")))


def test_the_throttle_spaces_attempts_after_a_failure():
    now = [0.0]
    throttle = AuthThrottle(rate=5, window_s=60, max_wait_s=2, clock=lambda: now[0])
    keys = ["user:dave", "peer:10.0.0.1"]
    assert throttle.reserve(keys) == 0  # no failure yet: no wait
    throttle.failed(keys)
    waits = [throttle.reserve(keys) for _ in range(10)]  # ten attempts at once
    assert waits == pytest.approx([0.2 * (i + 1) for i in range(10)])
    with pytest.raises(SaslFailure):  # more than max_wait_s of queue: refused, nothing reserved
        throttle.reserve(keys)
    assert throttle.reserve(["user:carol", "peer:10.0.0.2"]) == 0  # others are not slowed
    with pytest.raises(SaslFailure):  # the guessing host is (its queue is full)
        throttle.reserve(["user:carol", "peer:10.0.0.1"])
    now[0] = 61.0  # a minute without failures: free again
    assert throttle.reserve(keys) == 0


def test_the_session_exchanges_once_and_renews_before_expiry():
    users = _store()
    gateway = _gateway(users)
    gateway.tokens.lifetime_ms = 100000
    now = [0.0]
    session = SaslSession("SCRAM-SHA-512", "dave", "correct horse", clock=lambda: now[0])

    async def call(request, timeout_s):
        return await sasl_authenticate(gateway, request, "ipv4:127.0.0.1:1")

    first = asyncio.run(session.token_async(call))
    assert asyncio.run(session.token_async(call)) == first and session.exchanges == 1
    now[0] = 95.0  # within the last tenth of its lifetime: renewed
    asyncio.run(session.token_async(call))
    assert session.exchanges == 2
