"""Client certificates with a chosen subject, signed by a dev cluster's CA (its own
certificates carry only `CN=<name>`): for the tests of how a certificate names its
principal."""
from __future__ import annotations

import datetime
import os
import pathlib

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from exactly_tools.certs import CertificateAuthority


def signed(ca: CertificateAuthority, subject: x509.Name) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A client certificate for `subject` signed by `ca`, and its private key."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.certificate.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca.key, hashes.SHA256()))
    return cert, key


def write_certificate(ca: CertificateAuthority, stem: str, subject: x509.Name) -> tuple[pathlib.Path, pathlib.Path]:
    """Write <stem>.pem and <stem>.key (mode 0600) for `subject` next to the CA;
    returns their paths."""
    cert, key = signed(ca, subject)
    pem, key_path = ca.directory / f"{stem}.pem", ca.directory / f"{stem}.key"
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return pem, key_path


# RFC 4514 strings (last RDN first) of subjects whose one common name is "mallory"
# while another attribute's value reads like a second CN once its "," is unescaped.
CRAFTED = {
    "ou-admin": r"OU=x\,CN=admin,CN=mallory",
    "o-pl-0": r"O=acme\,CN=pl-0,CN=mallory",
}
# Two common names: refused whatever they are.
TWO_COMMON_NAMES = "CN=admin,CN=mallory"


def name(rfc4514: str) -> x509.Name:
    return x509.Name.from_rfc4514_string(rfc4514)
