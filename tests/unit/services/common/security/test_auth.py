"""Authentication without a server: SCRAM credentials, principal mapping rules, and
the order SASL > certificate > anonymous (docs/design.md, "Security")."""
from __future__ import annotations

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from exactly_wire.security import SASL_PASSWORD_HEADER, SASL_TOKEN_HEADER, SASL_USERNAME_HEADER
from services.common.security.auth import (ANONYMOUS, AuthenticationError, Authenticator, CertificateIdentityError,
                                           PrincipalMapper, ScramCredential, UserStore, distinguished_name)
from services.common.security.sasl import SessionTokens


def test_scram_credentials_verify_the_password_and_never_hold_it():
    cred = ScramCredential.create("correct horse", iterations=4096)
    assert cred.verify("correct horse") and not cred.verify("wrong")
    stored = cred.to_json()
    assert b"correct horse" not in stored
    assert ScramCredential.from_json(stored).verify("correct horse")


def _dn(rfc4514: str) -> x509.Name:
    return x509.Name.from_rfc4514_string(rfc4514)


def test_principal_mapping_rules():
    assert PrincipalMapper().principal(_dn("CN=alice,O=acme")) == "User:alice"
    assert PrincipalMapper().principal(_dn("O=acme")) == "User:O=acme"  # no CN: the whole DN
    rules = r"RULE:^CN=(.*?),OU=(.*?)$/$1@$2/L,DEFAULT"
    assert PrincipalMapper(rules).principal(_dn("CN=Bob,OU=Ops")) == "User:bob@ops"
    assert PrincipalMapper(rules).principal(_dn("CN=carol,O=x")) == "User:carol"


def test_mapping_rules_follow_kafkas_syntax():
    dn = _dn("CN=Svc/1,OU=ServiceUsers,O=Org,C=US")
    # Rules are tried in order; "/" inside a pattern is written "\/"; U uppercases.
    rules = r"RULE:^CN=(.*?),OU=Nobody.*$/$1/, RULE:^CN=([^\/]*)\/(\d),OU=ServiceUsers.*$/$2-$1/U , DEFAULT"
    assert PrincipalMapper(rules).principal(dn) == "User:1-SVC"
    # A reference to a group the pattern does not have is literal (Kafka); "\" escapes.
    assert PrincipalMapper(r"RULE:^CN=(.*?),.*$/$1\$x$4/").principal(dn) == "User:Svc/1$x$4"
    assert PrincipalMapper(r"RULE:^CN=(.*?),.*$/$12/").principal(dn) == "User:Svc/12"
    # Empty entries are skipped; an empty setting is DEFAULT.
    assert PrincipalMapper(" ,DEFAULT,, ").principal(dn) == "User:Svc/1"
    assert PrincipalMapper("").principal(dn) == "User:Svc/1"
    # No rule applies (Kafka's NoMatchingRule): refused, not the whole DN.
    with pytest.raises(CertificateIdentityError):
        PrincipalMapper(r"RULE:^CN=(.*?),OU=Nobody.*$/$1/").principal(dn)
    for malformed in ("RULE:broken", "RULE:a/b/X", "RULE:a/b/Lx", "DEFAULTS", "RULE:(/x/", "RULE:a/$/",
                      "RULE:a/x\\/", "DEFAULT,RULE:a/b"):
        with pytest.raises(ValueError):
            PrincipalMapper(malformed)


def test_rules_see_the_dn_as_java_writes_it():
    r"""X500Principal.getName(): RFC 2253, last RDN first, ',=+<>#;"\' escaped."""
    special = r'CN=a\,b\=c\+d\<e\>f\#g\;h\"i\\j,O=acme'
    assert distinguished_name(_dn(special)) == special
    assert distinguished_name(_dn(r"CN=\ padded\ ,DC=example,DC=com")) == r"CN=\ padded\ ,DC=example,DC=com"
    assert distinguished_name(_dn("CN=alice+UID=42,OU=Ops")) == "CN=alice+UID=42,OU=Ops"
    assert distinguished_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "a\0b")])) == r"CN=a\00b"
    # Types without an RFC 2253 keyword: the dotted OID and the value's DER in hex.
    email = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "alice"),
                       x509.NameAttribute(NameOID.EMAIL_ADDRESS, "a@b")])
    assert distinguished_name(email) == "1.2.840.113549.1.9.1=#1603614062,CN=alice"


def test_the_principal_comes_from_the_parsed_subject():
    """An escaped "," in another attribute is no separator, whatever the rules."""
    for subject in (r"OU=x\,CN=admin,CN=mallory", r"O=acme\,CN=pl-0,CN=mallory"):
        assert PrincipalMapper().principal(_dn(subject)) == "User:mallory"
        assert PrincipalMapper(r"RULE:^CN=([^,]*)$/$1/,DEFAULT").principal(_dn(subject)) == "User:mallory"
    assert distinguished_name(_dn(r"OU=x\,CN=admin,CN=mallory")) == r"OU=x\,CN\=admin,CN=mallory"
    with pytest.raises(CertificateIdentityError):  # several common names: refused
        PrincipalMapper(r"RULE:^.*$/anyone/").principal(_dn("CN=admin,CN=mallory"))


def test_sasl_token_first_then_certificate_then_anonymous(tmp_path):
    from exactly_tools.certs import CertificateAuthority
    ca = CertificateAuthority.create(tmp_path)
    bob = x509.load_pem_x509_certificate(ca.issue("bob", client=True).certificate.read_bytes())
    users = UserStore()
    users.put("dave", ScramCredential.create("pw"))
    tokens = SessionTokens(b"k" * 32, users)
    auth = Authenticator(users, tls=True, tokens=tokens)
    token, _ = tokens.issue("dave", "SCRAM-SHA-512")
    assert auth.principal({SASL_TOKEN_HEADER: token}, bob) == "User:dave"
    assert auth.principal({}, bob) == "User:bob"
    assert auth.principal({}, None) == ANONYMOUS
    forged = SessionTokens(b"x" * 32, users).issue("dave", "SCRAM-SHA-512")[0]
    for bad in ({SASL_TOKEN_HEADER: forged}, {SASL_TOKEN_HEADER: "v1.e30.AAAA"}, {SASL_TOKEN_HEADER: "junk"},
                # a password in the metadata is refused, right or wrong
                {SASL_USERNAME_HEADER: "dave", SASL_PASSWORD_HEADER: "pw"}):
        with pytest.raises(AuthenticationError):
            auth.principal(bad, bob)
    with pytest.raises(AuthenticationError):  # never SASL over plaintext
        Authenticator(users, tls=False, tokens=tokens).principal({SASL_TOKEN_HEADER: token}, None)
    with pytest.raises(ValueError):  # malformed rules fail at start
        Authenticator(users, tls=True, mapping_rules="RULE:broken")


def test_malformed_rules_stop_the_service_naming_the_key():
    from exactly_wire.config import ConfigurationError
    from services.common.config import ServiceConfig
    with pytest.raises(ConfigurationError) as info:
        ServiceConfig("pl-0", "partition_leader", props={"ssl.principal.mapping.rules": "RULE:^CN=(.*)$/$1/X"})
    assert info.value.key == "ssl.principal.mapping.rules"
    rules = r"RULE:^CN=(.*?),OU=Ops$/$1/L,DEFAULT"
    cfg = ServiceConfig("pl-0", "partition_leader", props={"ssl.principal.mapping.rules": rules})
    assert cfg.get_str("ssl.principal.mapping.rules", "DEFAULT") == rules
