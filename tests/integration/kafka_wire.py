"""Raw Kafka-protocol frames over TLS for the tests that play a client without
credentials: no client certificate, no password, only the cluster's CA (so the server's
certificate verifies). Requests are built and responses read with kio through the
service's own codec (services.common.kafka.codec).

    conn = RawKafka.connect(cluster.services["pl-0"].kafka_address, ca_path)
    conn.send(request(17, 1, {"mechanism": "PLAIN"}))
    resp = response(17, 1, conn.frame())
"""
from __future__ import annotations

import io
import socket
import ssl
import struct
import time

from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer

from services.common.kafka import codec

SASL_HANDSHAKE, SASL_AUTHENTICATE, METADATA = 17, 36, 3


def request(key: int, version: int, fields: dict, correlation_id: int = 7) -> bytes:
    """A size-prefixed request frame of API `key` v`version` with `fields`."""
    cls = codec.request_class(key, version)
    out = io.BytesIO()
    header = RequestHeaderV2 if cls.__flexible__ else RequestHeaderV1
    entity_writer(header)(out, header(request_api_key=key, request_api_version=version,
                                      correlation_id=correlation_id, client_id="no-credentials"))
    entity_writer(cls)(out, codec.build(cls, fields))
    body = out.getvalue()
    return struct.pack(">i", len(body)) + body


def response(key: int, version: int, frame: bytes):
    """The decoded response of a frame (its size prefix removed)."""
    cls = codec.response_class(key, version)
    header = ResponseHeaderV1 if cls.__flexible__ and key != codec.API_VERSIONS_KEY else ResponseHeaderV0
    _, used = entity_reader(header)(frame, 0)
    return entity_reader(cls)(frame, used)[0]


def plain_authenticate(user: str | bytes, password: str) -> bytes:
    """SaslAuthenticate v1 carrying a PLAIN message for `user`."""
    name = user if isinstance(user, bytes) else user.encode()
    return request(SASL_AUTHENTICATE, 1, {"auth_bytes": b"\0" + name + b"\0" + password.encode()})


def tls_context(ca_path: str) -> ssl.SSLContext:
    """A client context that trusts the cluster's CA and presents no certificate."""
    ctx = ssl.create_default_context(cafile=ca_path)
    ctx.check_hostname = False
    return ctx


class RawKafka:
    """One TLS connection to a Kafka port, without a client certificate."""

    def __init__(self, sock: ssl.SSLSocket):
        self.sock = sock

    @classmethod
    def connect(cls, address: str, ca_path: str, timeout_s: float = 20.0, source: str | None = None) -> "RawKafka":
        host, port = address.rsplit(":", 1)
        raw = socket.create_connection((host, int(port)), timeout=timeout_s,
                                       source_address=(source, 0) if source else None)
        return cls(tls_context(ca_path).wrap_socket(raw, server_hostname=host))

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _exactly(self, n: int, deadline: float) -> bytes:
        out = bytearray()
        while len(out) < n:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(min(n - len(out), 65536))
            if not chunk:
                raise ConnectionError("closed by the server")
            out += chunk
        return bytes(out)

    def frame(self, timeout_s: float = 20.0) -> bytes:
        """The next size-prefixed frame (without its size). ConnectionError when the
        server closed the connection, TimeoutError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        size = struct.unpack(">i", self._exactly(4, deadline))[0]
        return self._exactly(size, deadline)

    def closed_within(self, timeout_s: float) -> float | None:
        """Seconds until the server closed the connection (reading and dropping what it
        sends meanwhile), None if it is still open after `timeout_s`."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            self.sock.settimeout(max(0.01, timeout_s - (time.monotonic() - start)))
            try:
                if not self.sock.recv(65536):
                    return time.monotonic() - start
            except (socket.timeout, TimeoutError):
                return None
            except (ConnectionError, ssl.SSLError, OSError):
                return time.monotonic() - start
        return None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "RawKafka":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
