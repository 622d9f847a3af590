"""Certificates for a secured cluster, made with the `cryptography` library: a
certificate authority, service certificates (one per node, the node id as common
name, the hosts clients connect to as subject alternative names) and client
certificates (the principal's name as common name). Everything is private to its
owner: the directory is created 0700, keys and certificates are mode 0600 from the
moment they exist (never chmod-ed afterwards). docs/design.md, "Security".

    ca = CertificateAuthority.create(directory)           # ca.pem, ca.key
    ca.issue("pl-0", hosts=["127.0.0.1", "localhost"])    # pl-0.pem, pl-0.key
    ca.issue("alice", client=True)                        # alice.pem, alice.key
"""
from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import pathlib
import tempfile
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class Issued:
    """Paths of an issued certificate and its private key (PEM)."""

    certificate: pathlib.Path
    key: pathlib.Path


def write_private(path: pathlib.Path, data: bytes) -> None:
    """Write `data` to `path` readable by its owner only (0600) at every moment: into a
    temporary file of the same directory, created 0600 whatever the umask
    (tempfile.mkstemp: O_CREAT|O_EXCL, mode 0600), renamed over `path` once complete.
    A reader sees the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _write_key(path: pathlib.Path, key, password: bytes | None = None) -> None:
    """A private key as PKCS#8 PEM (encrypted with `password` when given), mode 0600
    from its creation on (write_private)."""
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    write_private(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           encryption))


class CertificateAuthority:
    """A self-signed CA in `directory` (ca.pem, ca.key) that issues certificates."""

    def __init__(self, directory: pathlib.Path, key, certificate: x509.Certificate):
        self.directory = directory
        self.key = key
        self.certificate = certificate

    @property
    def ca_path(self) -> pathlib.Path:
        return self.directory / "ca.pem"

    @classmethod
    def create(cls, directory: pathlib.Path, name: str = "Exactly dev CA") -> "CertificateAuthority":
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        write_private(directory / "ca.pem", cert.public_bytes(serialization.Encoding.PEM))
        _write_key(directory / "ca.key", key)
        return cls(directory, key, cert)

    @classmethod
    def load(cls, directory: pathlib.Path) -> "CertificateAuthority":
        cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
        return cls(directory, key, cert)

    def issue(self, common_name: str, hosts: list[str] = (), client: bool = False,
              key_password: bytes | None = None) -> Issued:
        """A certificate for `common_name` (a node id or a user name), valid for both
        server and client authentication unless `client`, with `hosts` (names or IP
        addresses) as subject alternative names. Writes <cn>.pem and <cn>.key
        (encrypted with `key_password` when given)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([] if client else [ExtendedKeyUsageOID.SERVER_AUTH])
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
                   .issuer_name(self.certificate.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if hosts:
            names: list[x509.GeneralName] = []
            for h in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    names.append(x509.DNSName(h))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        issued = Issued(self.directory / f"{common_name}.pem", self.directory / f"{common_name}.key")
        write_private(issued.certificate, cert.public_bytes(serialization.Encoding.PEM))
        _write_key(issued.key, key, key_password)
        return issued
