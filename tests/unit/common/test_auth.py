"""Authentication without a server: SCRAM credentials, principal mapping rules, and
the order SASL > certificate > anonymous (docs/design.md, "Security")."""
from __future__ import annotations

import pytest

from exactly_wire.security import SASL_MECHANISM_HEADER, SASL_PASSWORD_HEADER, SASL_USERNAME_HEADER
from services.common.auth import (ANONYMOUS, AuthenticationError, Authenticator, ScramCredential, UserStore,
                                  principal_from_subject)


def test_scram_credentials_verify_the_password_and_never_hold_it():
    cred = ScramCredential.create("correct horse", iterations=4096)
    assert cred.verify("correct horse") and not cred.verify("wrong")
    stored = cred.to_json()
    assert b"correct horse" not in stored
    assert ScramCredential.from_json(stored).verify("correct horse")


def test_principal_mapping_rules():
    assert principal_from_subject("CN=alice,O=acme") == "User:alice"
    assert principal_from_subject("O=acme") == "User:O=acme"
    rules = r"RULE:^CN=(.*?),OU=(.*?)$/$1@$2/L,DEFAULT"
    assert principal_from_subject("CN=Bob,OU=Ops", rules) == "User:bob@ops"
    assert principal_from_subject("CN=carol,O=x", rules) == "User:carol"
    with pytest.raises(ValueError):
        principal_from_subject("CN=x", "RULE:broken")


def test_sasl_first_then_certificate_then_anonymous():
    users = UserStore()
    users.put("dave", ScramCredential.create("pw"))
    auth = Authenticator(users, tls=True)
    sasl = {SASL_MECHANISM_HEADER: "SCRAM-SHA-512", SASL_USERNAME_HEADER: "dave", SASL_PASSWORD_HEADER: "pw"}
    assert auth.principal(sasl, "CN=bob") == "User:dave"
    assert auth.principal({}, "CN=bob") == "User:bob"
    assert auth.principal({}, None) == ANONYMOUS
    for bad in ({**sasl, SASL_PASSWORD_HEADER: "nope"}, {**sasl, SASL_USERNAME_HEADER: "eve"},
                {**sasl, SASL_MECHANISM_HEADER: "GSSAPI"}):
        with pytest.raises(AuthenticationError):
            auth.principal(bad, "CN=bob")
    with pytest.raises(AuthenticationError):  # never a password over plaintext
        Authenticator(users, tls=False).principal(sasl, None)
