"""ZooKeeper over TLS: the services' ZooKeeper client connects to the ensemble's
`secureClientPort` with TLS, verifies the server's certificate and presents its own.

Kafka's names (KIP-515, "Enable TLS for ZooKeeper clients"), PEM files only:

- `zookeeper.ssl.client.enable`: connect with TLS (the connect string then names the
  servers' secureClientPort);
- `zookeeper.ssl.keystore.location` (+ `zookeeper.ssl.keystore.password`): one PEM file
  holding the client certificate and its private key, presented to ZooKeeper (its
  `ssl.clientAuth=need`). Unset: the service's own identity, `ssl.certificate.location`
  and `ssl.key.location` (+ `ssl.key.password`);
- `zookeeper.ssl.truststore.location`: PEM file of the CA certificates that sign the
  servers' certificates. Unset: `ssl.ca.location`; both unset: the system's CAs;
- `zookeeper.ssl.endpoint.identification.algorithm`: HTTPS (the default) checks that the
  server's certificate names the host of the connect string; empty turns the check off.

The connection itself is kazoo's (`KazooClient(use_ssl=True, ...)`): the whole session,
digest authentication included (zk_security.py), runs inside TLS. docs/design.md,
"Security", "ZooKeeper over TLS".
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any, Mapping

from exactly_wire.config import ConfigurationError

from ..settings import ServiceSchema, key_of, service_settings

# Key names for error messages (the values are read from ServiceSchema's attributes).
KEYSTORE = key_of(ServiceSchema, "zookeeper_ssl_keystore_location")
KEYSTORE_PASSWORD = key_of(ServiceSchema, "zookeeper_ssl_keystore_password")
TRUSTSTORE = key_of(ServiceSchema, "zookeeper_ssl_truststore_location")


@dataclass(frozen=True)
class ZkTls:
    """The TLS parameters of one process's ZooKeeper connection.

    enabled: TLS on; ca: PEM file of trusted CAs (None: the system's); certfile/keyfile:
    the client certificate and key presented (None: no client certificate);
    keyfile_password: password of an encrypted key; check_hostname: the server's
    certificate must name the connect string's host.
    """

    enabled: bool = False
    ca: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    keyfile_password: str | None = None
    check_hostname: bool = True

    @classmethod
    def from_props(cls, props: Mapping[str, object]) -> "ZkTls":
        """From a mapping of a service's settings (Kafka key -> value; the keys of other
        settings are ignored): `from_settings` of their parsed ServiceSchema. Raises
        ConfigurationError as `from_settings` does, or for a malformed value."""
        return cls.from_settings(service_settings(props))

    @classmethod
    def from_settings(cls, settings: ServiceSchema) -> "ZkTls":
        """From a service's parsed settings. Reads the files once to check them: raises
        ConfigurationError naming the key when a file cannot be read, holds no
        certificate and matching key, or holds no CA certificate, and when a keystore
        password comes without a keystore. Disabled: no file is read."""
        s = settings
        if s.zookeeper_ssl_keystore_password and not s.zookeeper_ssl_keystore_location:
            raise ConfigurationError(f"{KEYSTORE_PASSWORD} needs {KEYSTORE}", key=KEYSTORE_PASSWORD)
        if not s.zookeeper_ssl_client_enable:
            return cls()
        algorithm = str(s.zookeeper_ssl_endpoint_identification_algorithm or "").strip().upper()
        if s.zookeeper_ssl_keystore_location:
            cert_key = KEYSTORE
            certfile = keyfile = str(s.zookeeper_ssl_keystore_location)
            password = s.zookeeper_ssl_keystore_password
        else:
            cert_key = key_of(ServiceSchema, "ssl_certificate_location")
            certfile, keyfile = s.ssl_certificate_location, s.ssl_key_location
            password = s.ssl_key_password
            certfile, keyfile = (str(certfile), str(keyfile)) if certfile and keyfile else (None, None)
        ca_key, ca = ((TRUSTSTORE, s.zookeeper_ssl_truststore_location) if s.zookeeper_ssl_truststore_location
                      else (key_of(ServiceSchema, "ssl_ca_location"), s.ssl_ca_location))
        tls = cls(True, str(ca) if ca else None, certfile, keyfile, str(password) if password else None,
                  algorithm == "HTTPS")
        tls._check(cert_key, ca_key)
        return tls

    def _check(self, cert_key: str, ca_key: str) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if self.certfile is not None:
            try:
                context.load_cert_chain(self.certfile, self.keyfile, password=self.keyfile_password)
            except (OSError, ssl.SSLError, ValueError) as exc:
                raise ConfigurationError(f"{cert_key}={self.certfile}: no certificate and matching private key "
                                         f"for ZooKeeper TLS ({exc})", key=cert_key, value=self.certfile,
                                         allowed="a readable PEM certificate and its key") from None
        if self.ca is not None:
            try:
                context.load_verify_locations(self.ca)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigurationError(f"{ca_key}={self.ca}: no CA certificate for ZooKeeper TLS ({exc})",
                                         key=ca_key, value=self.ca, allowed="a readable PEM file") from None

    def kazoo_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of kazoo's KazooClient: {} when disabled, else use_ssl,
        verify_certs (always True), check_hostname, ca, certfile, keyfile and
        keyfile_password."""
        if not self.enabled:
            return {}
        return {"use_ssl": True, "verify_certs": True, "check_hostname": self.check_hostname, "ca": self.ca,
                "certfile": self.certfile, "keyfile": self.keyfile, "keyfile_password": self.keyfile_password}
