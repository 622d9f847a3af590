"""gRPC keepalive between real processes (exactly_wire.keepalive): a channel whose
only call is an idle stream pings its peer the whole time, and the server accepts those
pings; it never answers GOAWAY ENHANCE_YOUR_CALM "too_many_pings", which would drop
the connection and everything on it.

On a dev cluster, after a transaction has opened the services' tunnels to each other,
this process holds a `Tunnel/Calls` stream to a partition leader open without sending
anything on a channel with the services' own options, for KEEPALIVE_IDLE_PINGS
keepalive intervals; then the stream must still be open and no service may have logged
too_many_pings. `make test` scales the keepalive down (exactly.keepalive.time.ms=3000:
pings every 3 s, the servers accept one every 1.5 s) and, as a control, shows that
a channel pinging faster than the servers accept is sent the GOAWAY. EXACTLY_KEEPALIVE_IDLE_S
runs the same on the default settings (10 s pings) for that many seconds (make soak: 240;
before the two ends agreed, the GOAWAY came after about 140 s)."""
from __future__ import annotations

import asyncio
import os
import pathlib

import grpc
import pytest

from exactly import AdminClient, NewTopic, Producer
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.common.transport.rpc import CHANNEL_OPTIONS

pytestmark = pytest.mark.integration

IDLE_S = float(os.environ.get("EXACTLY_KEEPALIVE_IDLE_S", "0"))  # > 0: the default settings, this long
SCALED_KEEPALIVE_MS = 3000
KEEPALIVE_IDLE_PINGS = 10
CLIENT_MIN_PING_INTERVAL_MS = 1000  # gRPC core's clients send a ping at most once a second
TOPIC = "keepalive-topic"


def _one_transaction(bootstrap: str) -> None:
    """A committed transaction: the coordinator's appends, the leaders' verification and
    the markers open the services' tunnels to each other."""
    with Producer({"bootstrap.servers": bootstrap, "transactional.id": "keepalive"}) as p:
        p.init_transactions()
        with p.transaction():
            p.send(TOPIC, b"v")


async def _idle_stream(address: str, options: list, idle_s: float) -> BaseException | None:
    """Hold a Tunnel/Calls stream to `address` open for `idle_s` seconds without sending
    on it. Returns None when it is still open then, else the error that ended it."""
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        call = pbg.TunnelStub(channel).Calls()
        read = asyncio.ensure_future(call.read())
        done, _ = await asyncio.wait({read}, timeout=idle_s)
        if not done:
            call.cancel()
            return None
        return read.exception() or AssertionError(f"the stream ended: {read.result()!r}")


def _too_many_pings(cluster_dir: pathlib.Path) -> dict[str, int]:
    """Service log -> lines naming too_many_pings (a GOAWAY a channel of that service was sent)."""
    found = {}
    for log in sorted((cluster_dir / "logs").glob("*.log")):
        n = sum("too_many_pings" in line for line in log.read_text(errors="replace").splitlines())
        if n:
            found[log.name] = n
    return found


def test_an_idle_stream_is_not_sent_goaway(make_cluster):
    if IDLE_S > 0:
        cluster = make_cluster()
        options, idle_s = CHANNEL_OPTIONS, IDLE_S
    else:
        from services.common.transport.rpc import channel_options
        cluster = make_cluster(props={"exactly.keepalive.time.ms": str(SCALED_KEEPALIVE_MS)})
        options, idle_s = channel_options(SCALED_KEEPALIVE_MS), KEEPALIVE_IDLE_PINGS * SCALED_KEEPALIVE_MS / 1000
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(TOPIC, 1, 1)])
    _one_transaction(cluster.bootstrap_servers)

    ended = asyncio.run(_idle_stream(cluster.services["pl-0"].address, options, idle_s))

    assert ended is None, f"the idle stream was ended after less than {idle_s:.0f} s: {ended!r}"
    assert _too_many_pings(cluster.dir) == {}
    if IDLE_S == 0:
        # The control: a channel pinging more often than the servers accept is sent
        # GOAWAY too_many_pings within a few pings.
        from exactly_wire.keepalive import min_ping_interval_ms
        assert CLIENT_MIN_PING_INTERVAL_MS < min_ping_interval_ms(SCALED_KEEPALIVE_MS)
        fast = channel_options(CLIENT_MIN_PING_INTERVAL_MS)
        ended = asyncio.run(_idle_stream(cluster.services["pl-0"].address, fast, idle_s))
        assert isinstance(ended, grpc.aio.AioRpcError) and ended.code() == grpc.StatusCode.UNAVAILABLE, ended
