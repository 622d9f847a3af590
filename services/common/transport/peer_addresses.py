"""Peer addresses of the connection limits (services.common.transport.connections): the
canonical text of an IP address, and Kafka's `max.connections.per.ip.overrides`
parsed. No dependency on the rest of the services, so the settings schema
(services.common.settings) validates the overrides with it at start."""
from __future__ import annotations

import ipaddress
import socket


def parse_overrides(value: str) -> dict[str, int]:
    """Kafka's `max.connections.per.ip.overrides`: "host-or-ip:count,..." -> {ip: count}.
    A host name is resolved once, here (every address it has gets the count); IPv6
    literals are written bare or in brackets ("[::1]:5"). Raises ValueError naming the
    entry that is malformed, has a negative count or does not resolve."""
    out: dict[str, int] = {}
    for entry in (e.strip() for e in (value or "").split(",")):
        if not entry:
            continue
        host, sep, count = entry.rpartition(":")
        if not sep or not host or not count.strip().lstrip("-").isdigit():
            raise ValueError(f"{entry!r} is not host:count")
        n = int(count)
        if n < 0:
            raise ValueError(f"{entry!r} has a negative count")
        host = host.strip().strip("[]")
        try:
            out[normalize_ip(host)] = n
        except ValueError:
            try:
                infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
            except OSError as exc:
                raise ValueError(f"{host!r} does not resolve: {exc}") from None
            for info in infos:
                out[normalize_ip(info[4][0])] = n
    return out


def normalize_ip(address: str) -> str:
    """The canonical text of an IP address; an IPv4-mapped IPv6 address as IPv4
    ("::ffff:10.0.0.1" -> "10.0.0.1"), so one peer counts as one whichever socket family
    accepted it. Raises ValueError for anything else."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


__all__ = ["parse_overrides", "normalize_ip"]
