"""The link protocol, defined once for the services (`services.common.transport.link`)
and the SDK (`exactly._link`): the Batches messages of `Tunnel/Batches` and
`Client/Calls` as frames on a TCP connection (exactly.proto, `Tunnel/Attach` and
`Client/Attach`).

A connection's first bytes are a ticket (TICKET_BYTES) from an Attach call on the
service's gRPC port; the service answers ACK once it took it. Every frame after that
is a 4-byte big-endian length (HEADER) and a TunneledCalls (client to service) or a
TunneledReplies (service to client).
"""
from __future__ import annotations

import socket
import struct
from typing import Any

TICKET_BYTES = 32
ACK = b"\x01"
HEADER = struct.Struct(">I")
# A link client's bound on a reply frame (bytes): the services' gRPC message bound.
MAX_REPLY_FRAME_BYTES = 64 << 20
# Seconds a client leaves a service's calls on the gRPC stream after a link could not be set up.
LINK_RETRY_S = 30.0
# A call that times out on a link from which nothing at all was read for this long (s) drops the link.
LINK_SILENCE_S = 10.0


def offers_link(answer: Any) -> bool:
    """Whether an Attach answer (TunnelAttachResponse) offers a link: a port and a ticket
    (port 0: none offered)."""
    return bool(answer.port) and len(answer.ticket) == TICKET_BYTES


def split_address(address: str) -> str:
    """The host of a "host:port" address ("[::1]:9093" -> "::1")."""
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def tcp_keepalive(sock: Any, keepalive_s: float) -> None:
    """TCP keepalive on a link's socket (a socket.socket or asyncio's TransportSocket),
    probing after `keepalive_s` (s) idle, every `keepalive_s`, 3 times (0: off).
    Raises OSError as setsockopt does."""
    if keepalive_s <= 0:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = max(int(keepalive_s), 1)
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux; elsewhere the system's keepalive times
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)


__all__ = ["ACK", "HEADER", "LINK_RETRY_S", "LINK_SILENCE_S", "MAX_REPLY_FRAME_BYTES", "TICKET_BYTES",
           "offers_link", "split_address", "tcp_keepalive"]
