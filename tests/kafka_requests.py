"""One Kafka-protocol request over a raw socket (TLS when given an ssl context), built
with kio from a dict of fields (services.common.kafka.codec.build), for tests that
speak to a Kafka port without a client library."""
from __future__ import annotations

import io
import socket
import ssl
import struct

from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer

from services.common.kafka import codec

CORRELATION_ID = 7


def call(address: str, key: int, version: int, fields: dict, context: ssl.SSLContext | None = None,
         client_id: str = "test", timeout_s: float = 30):
    """Send one request of API `key` at `version` to `address` ("host:port") and return
    the decoded response (a kio entity). Fails when the port closes the connection."""
    cls = codec.request_class(key, version)
    out = io.BytesIO()
    header = (RequestHeaderV2 if cls.__flexible__ else RequestHeaderV1)(
        request_api_key=key, request_api_version=version, correlation_id=CORRELATION_ID, client_id=client_id)
    entity_writer(type(header))(out, header)
    entity_writer(cls)(out, codec.build(cls, fields))
    body = out.getvalue()
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as raw:
        s = context.wrap_socket(raw, server_hostname=host) if context is not None else raw
        with s:
            s.sendall(struct.pack(">i", len(body)) + body)
            data = b""
            while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
                chunk = s.recv(65536)
                assert chunk, f"connection closed by {address} for api {key} v{version}"
                data += chunk
    response_cls = codec.response_class(key, version)
    header_cls = ResponseHeaderV1 if response_cls.__flexible__ and key != codec.API_VERSIONS_KEY \
        else ResponseHeaderV0
    header_in, used = entity_reader(header_cls)(data, 4)
    assert header_in.correlation_id == CORRELATION_ID
    value, _ = entity_reader(response_cls)(data, 4 + used)
    return value


def tls_context(certs_dir, who: str) -> ssl.SSLContext:
    """A client context trusting `certs_dir`/ca.pem and presenting `who`'s certificate
    (`who`.pem, `who`.key), without host name checks (the dev cluster's certificates
    name its hosts, the tests connect by address)."""
    context = ssl.create_default_context(cafile=str(certs_dir / "ca.pem"))
    context.check_hostname = False
    context.load_cert_chain(str(certs_dir / f"{who}.pem"), str(certs_dir / f"{who}.key"))
    return context
