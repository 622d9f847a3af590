"""gRPC keepalive of every Exactly channel and server, defined once so that both ends
agree (gRPC core's keepalive guide, doc/keepalive.md of grpc/grpc).

A channel with a call open pings its peer once `keepalive_time_ms` passed without
reading from it, and closes the connection when the ping is not answered within
KEEPALIVE_TIMEOUT_MS (a peer that stopped, a network that is gone): the calls then
fail with UNAVAILABLE instead of waiting for their deadlines. A channel without calls
does not ping (`grpc.keepalive_permit_without_calls` 0): there is nothing to fail, and
the server closes such a connection after `connections.max.idle.ms`. The number of
pings between two data frames is not limited (`grpc.http2.max_pings_without_data` 0;
by default a channel stops checking an idle stream after two pings, such as the
services' tunnel, `services.common.transport.tunnel`).

A gRPC server counts a ping received sooner than
`grpc.http2.min_ping_interval_without_data_ms` after the previous one (default 5
minutes; 2 hours while no call is open unless `grpc.keepalive_permit_without_calls`)
as a strike, and after `grpc.http2.max_ping_strikes` (2) strikes without having sent
data it answers GOAWAY ENHANCE_YOUR_CALM "too_many_pings" and drops the connection.
So a server accepts pings at half the interval its clients send them, with or without
calls open: network delays can bring two pings closer than they were sent, never
closer than half.
"""
from __future__ import annotations

from typing import Any

# ms without reads after which a channel with a call open pings its peer: every SDK
# channel; the services' channels to each other take exactly.keepalive.time.ms.
KEEPALIVE_TIME_MS = 10_000
# ms a ping may go unanswered before the channel closes the connection (gRPC's default).
KEEPALIVE_TIMEOUT_MS = 20_000


def channel_options(keepalive_time_ms: int = KEEPALIVE_TIME_MS) -> list[tuple[str, Any]]:
    """gRPC options of a channel pinging after `keepalive_time_ms` (ms) without reads
    while a call is open, without a limit on pings between data frames."""
    return [("grpc.keepalive_time_ms", keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 0),
            ("grpc.http2.max_pings_without_data", 0)]


def min_ping_interval_ms(keepalive_time_ms: int = KEEPALIVE_TIME_MS) -> int:
    """The shortest interval (ms) between two pings a server accepts from clients that
    ping every `keepalive_time_ms` or every KEEPALIVE_TIME_MS (the SDK's), whichever
    is shorter: half of it."""
    return max(1, min(keepalive_time_ms, KEEPALIVE_TIME_MS) // 2)


def server_options(keepalive_time_ms: int = KEEPALIVE_TIME_MS) -> list[tuple[str, Any]]:
    """gRPC options of a server whose own pings follow channel_options(keepalive_time_ms)
    and which accepts its clients' pings every min_ping_interval_ms(keepalive_time_ms),
    with or without calls open."""
    options = dict(channel_options(keepalive_time_ms))
    options["grpc.keepalive_permit_without_calls"] = 1
    options["grpc.http2.min_ping_interval_without_data_ms"] = min_ping_interval_ms(keepalive_time_ms)
    return list(options.items())
