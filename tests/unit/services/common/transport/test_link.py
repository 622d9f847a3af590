"""services.common.transport.link over real gRPC and TCP on loopback: tunneled calls go on a
link once a ticket from Tunnel/Attach set it up, with what the gRPC stream would give them;
without a link (a peer of the previous version, none offered, none reachable) they go on the
stream; a connection without a valid ticket, an oversized frame or a silent peer cost the
server a closed connection and nothing else."""
from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from types import SimpleNamespace

import grpc
import pytest

from exactly_wire.security import TransportSecurity
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.common.transport import link as link_module
from services.common.transport import tunnel as tunnel_module
from services.common.transport.link import (ACK, TICKET_BYTES, LinkServer, LinkStream, LinkTickets, Snapshot,
                                            split_address)
from services.common.transport.guard import RequestGuard
from services.common.transport.tunnel import (HandlerRegistry, TunnelChannel, TunnelError, TunnelServicer,
                                              add_tunnel_to_server)
from waiting import wait_for_async

from .test_tunnel import LIST_OFFSETS, Leader, _request, _serving

_HEADER = struct.Struct(">I")


async def _linked(leader: Leader, max_frame: int = 1 << 20, idle_s: float = 30.0, handshake_s: float = 2.0,
                  offered: bool = True):
    """A server of `leader` with its tunnel and (with `offered`) a link listener:
    (server, address, tunnel servicer, LinkServer)."""
    server, address, servicer = await _serving(leader)
    link = LinkServer(servicer, max_frame, idle_timeout_s=idle_s, handshake_timeout_s=handshake_s)
    await link.start("127.0.0.1", 0, None)
    if offered:
        servicer.link = link
    return server, address, servicer, link


@contextlib.asynccontextmanager
async def _cluster(leader: Leader | None = None, servicer: type[TunnelServicer] | None = None, **link_args):
    """A served leader (`leader`, or a new one) with its link listener and a channel to
    it: SimpleNamespace(leader, address, servicer, link, channel); everything is stopped
    on exit. `servicer`: a TunnelServicer subclass to serve the tunnel with (its link
    offered), else `_linked`'s, with link_args."""
    leader = leader or Leader()
    if servicer is None:
        server, address, tunnel_servicer, link = await _linked(leader, **link_args)
    else:
        interceptors = [RequestGuard()]
        server = grpc.aio.server(interceptors=interceptors)
        registry = HandlerRegistry(server)
        pbg.add_PartitionLeaderServicer_to_server(leader, registry)
        tunnel_servicer = servicer(registry, interceptors)
        add_tunnel_to_server(tunnel_servicer, server)
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        link = tunnel_servicer.link = LinkServer(tunnel_servicer, 1 << 20, idle_timeout_s=30, handshake_timeout_s=2)
        await link.start("127.0.0.1", 0, None)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            yield SimpleNamespace(leader=leader, address=address, servicer=tunnel_servicer, link=link, channel=channel)
    finally:
        await link.stop()
        await server.stop(0)


def _tunnel(c: SimpleNamespace) -> TunnelChannel:
    """A tunnel channel to `c` that sets up links."""
    return TunnelChannel(c.channel, link=lambda stub: LinkStream(stub, c.address, TransportSecurity(), lambda: None,
                                                                setup_timeout_s=2.0))


async def _attached(c: SimpleNamespace) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw link to `c`, set up with a fresh ticket."""
    answer = await _ticket(c.channel)
    reader, writer = await asyncio.open_connection("127.0.0.1", c.link.port)
    writer.write(answer.ticket)
    assert await reader.readexactly(1) == ACK
    return reader, writer


def _frame(message) -> bytes:
    return _HEADER.pack(message.ByteSize()) + message.SerializeToString()


async def _replies(reader: asyncio.StreamReader) -> list[pb.TunneledReply]:
    """The replies of the next frame a raw link reads."""
    (size,) = _HEADER.unpack(await reader.readexactly(4))
    return list(pb.TunneledReplies.FromString(await reader.readexactly(size)).replies)


def _call(correlation_id: int, partition: int) -> pb.TunneledCalls:
    return pb.TunneledCalls(calls=[pb.TunneledCall(correlation_id=correlation_id, method=LIST_OFFSETS,
                                                   request=_request("t", partition).SerializeToString())])


async def _offsets(tunnel: TunnelChannel, partitions, timeout_s: float = 5.0) -> list[int]:
    replies = await asyncio.gather(*(tunnel.call(LIST_OFFSETS, _request("t", p), pb.ListOffsetsResponse, timeout_s)
                                     for p in partitions))
    return [r.topics[0].partitions[0].offset for r in replies]


async def _ticket(channel: grpc.aio.Channel) -> pb.TunnelAttachResponse:
    return await pbg.TunnelStub(channel).Attach(pb.TunnelAttachRequest(), timeout=5)


async def _closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection (within 5 s)."""
    return await asyncio.wait_for(reader.read(1), 5) == b""


def test_tickets_are_good_once_and_only_for_their_time():
    now = [100.0]
    tickets = LinkTickets(ttl_ms=1000, limit=2, clock=lambda: now[0])
    who = Snapshot((("x-who", "svc"),), {}, "ipv4:127.0.0.1:1")
    first, second = tickets.issue(who), tickets.issue(who)
    assert len(first) == TICKET_BYTES and first != second
    assert tickets.issue(who) is None  # the bound on outstanding tickets
    assert tickets.redeem(first) == who
    assert tickets.redeem(first) is None  # once
    assert tickets.redeem(os.urandom(TICKET_BYTES)) is None and tickets.redeem(b"short") is None
    now[0] += 1.0
    assert tickets.redeem(second) is None  # expired
    assert len(tickets) == 0 and tickets.issue(who) is not None


def test_split_address_takes_the_host_of_ipv4_names_and_ipv6():
    assert split_address("127.0.0.1:9093") == "127.0.0.1"
    assert split_address("pl-0.exactly.svc:9093") == "pl-0.exactly.svc"
    assert split_address("[::1]:9093") == "::1"


def test_calls_go_on_the_link_and_answer_as_on_the_stream():
    async def body():
        async with _cluster() as c:
            tunnel = _tunnel(c)
            assert await _offsets(tunnel, range(20)) == [p * 10 for p in range(20)]
            assert tunnel.linked and c.link.links == 1
            read = c.servicer.messages_read
            assert 1 <= read <= 20  # calls ready together share a frame
            with pytest.raises(TunnelError) as denied:
                await tunnel.call(LIST_OFFSETS, _request("u", 0), pb.ListOffsetsResponse, 5)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert denied.value.details() == "TOPIC_AUTHORIZATION_FAILED: not t"
            assert c.servicer.messages_read == read + 1 and c.link.links == 1  # on the same link
            await tunnel.close()
            await wait_for_async(lambda: c.link.links == 0, 5, "the server closed its end")
    asyncio.run(body())


class _WithoutAttach(TunnelServicer):
    """The tunnel as a version without links serves it: Attach UNIMPLEMENTED."""

    async def Attach(self, request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")


def test_a_peer_without_a_link_is_called_on_the_grpc_stream():
    """No link offered (Attach answers port 0), and a server of the previous version
    (Attach UNIMPLEMENTED): every call is answered once, over Tunnel/Batches."""
    async def body():
        for previous_version in (False, True):
            async with _cluster(servicer=_WithoutAttach) if previous_version else _cluster(offered=False) as c:
                if previous_version:
                    with pytest.raises(grpc.RpcError) as unimplemented:
                        await _ticket(c.channel)
                    assert unimplemented.value.code() == grpc.StatusCode.UNIMPLEMENTED
                tunnel = _tunnel(c)
                assert await _offsets(tunnel, range(10)) == [p * 10 for p in range(10)]
                assert not tunnel.linked and tunnel.batched and c.link.links == 0
                assert await _offsets(tunnel, [3]) == [30]
                assert c.link.refused == {}  # never even tried
                await tunnel.close()
    asyncio.run(body())


def test_a_link_that_cannot_be_set_up_sends_its_calls_on_the_stream_and_waits_before_trying_again():
    async def body():
        async with _cluster() as c:
            await c.link.stop()  # offered, but nothing listens on its port any more
            tunnel = _tunnel(c)
            assert await _offsets(tunnel, range(10)) == [p * 10 for p in range(10)]
            assert not tunnel.linked and tunnel._link_retry_at > 0
            read = c.servicer.messages_read
            assert await _offsets(tunnel, [4]) == [40]
            assert c.servicer.messages_read == read + 1  # on the stream, without a second attempt
            await tunnel.close()
    asyncio.run(body())


class _Refusing(TunnelServicer):
    """Attach refused (PERMISSION_DENIED) while `refuse` is set."""

    refuse = True

    async def Attach(self, request, context):
        if self.refuse:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "CLUSTER_AUTHORIZATION_FAILED: no")
        return await super().Attach(request, context)


def test_an_attach_that_fails_fails_the_calls_as_a_stream_that_cannot_open_and_the_next_call_tries_again():
    """A refused or failed Attach (the principal refused, the peer unreachable) is not a
    peer without links: the calls fail UNAVAILABLE, as on a stream that cannot be opened,
    nothing falls back, and the next call sets the link up."""
    async def body():
        async with _cluster(servicer=_Refusing) as c:
            tunnel = _tunnel(c)
            with pytest.raises(TunnelError) as failed:
                await tunnel.call(LIST_OFFSETS, _request("t", 1), pb.ListOffsetsResponse, 5)
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "PERMISSION_DENIED" in failed.value.details()
            assert tunnel._link_retry_at == 0 and c.servicer.messages_read == 0  # no fallback: nothing ran
            c.servicer.refuse = False
            assert await _offsets(tunnel, [2]) == [20] and tunnel.linked
            await tunnel.close()
    asyncio.run(body())


def test_a_link_needs_a_ticket_it_may_use_once():
    async def body():
        async with _cluster() as c:
            reader, writer = await asyncio.open_connection("127.0.0.1", c.link.port)
            writer.write(os.urandom(TICKET_BYTES))
            assert await _closed(reader)
            assert c.link.refused == {"ticket": 1}
            answer = await _ticket(c.channel)
            assert answer.port == c.link.port and answer.ticket_ttl_ms == 10_000
            reader, writer = await asyncio.open_connection("127.0.0.1", c.link.port)
            writer.write(answer.ticket)
            assert await reader.readexactly(1) == ACK
            writer.write(_frame(_call(5, 2)))
            [reply] = await _replies(reader)
            assert reply.correlation_id == 5 and reply.status_code == 0
            again_reader, again = await asyncio.open_connection("127.0.0.1", c.link.port)
            again.write(answer.ticket)  # the same ticket again
            assert await _closed(again_reader)
            assert c.link.refused == {"ticket": 2} and c.link.links == 1
            writer.close()
    asyncio.run(body())


def test_connections_without_a_ticket_are_bounded_and_closed_after_the_handshake_timeout(monkeypatch):
    monkeypatch.setattr(link_module, "MAX_PENDING_LINKS", 2)

    async def body():
        async with _cluster(handshake_s=0.5) as c:
            silent = [await asyncio.open_connection("127.0.0.1", c.link.port) for _ in range(2)]
            await wait_for_async(lambda: c.link.pending == 2, 5, "two connections waiting for their ticket")
            reader, _ = await asyncio.open_connection("127.0.0.1", c.link.port)
            assert await _closed(reader)  # a third: closed at once
            assert c.link.refused == {"pending": 1}
            for reader, _ in silent:
                assert await _closed(reader)
            assert c.link.refused == {"pending": 1, "ssl.handshake.timeout": 2} and c.link.pending == 0
            tunnel = _tunnel(c)  # and the listener serves on
            assert await _offsets(tunnel, [1]) == [10] and tunnel.linked
            await tunnel.close()
    asyncio.run(body())


def test_an_oversized_frame_closes_its_link_and_one_that_does_not_parse_is_answered():
    async def body():
        async with _cluster(max_frame=4096) as c:
            reader, writer = await _attached(c)
            writer.write(_HEADER.pack(3) + b"\xff\xff\xff")
            [reply] = await _replies(reader)
            assert reply.correlation_id == 0 and reply.status_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
            assert reply.status_details.startswith("INVALID_REQUEST: not a valid TunneledCalls encoding")
            writer.write(_frame(_call(9, 1)))  # the link serves on
            assert [r.correlation_id for r in await _replies(reader)] == [9]
            writer.write(_HEADER.pack(1 << 30))  # announces 1 GiB: closed before anything is read
            assert await _closed(reader)
            assert c.link.refused == {"socket.request.max.bytes": 1}
            await wait_for_async(lambda: c.link.links == 0, 5, "the oversized frame's link closed")
            tunnel = _tunnel(c)
            assert await _offsets(tunnel, [2]) == [20] and tunnel.linked
            await tunnel.close()
    asyncio.run(body())


def test_a_link_whose_peer_sends_nothing_is_closed_after_the_idle_timeout():
    async def body():
        async with _cluster(idle_s=0.5) as c:
            reader, _ = await _attached(c)
            assert await _closed(reader)
            assert c.link.refused == {"connections.max.idle.ms": 1} and c.link.links == 0
    asyncio.run(body())


def test_a_broken_link_fails_its_calls_in_flight_and_the_next_call_sets_up_a_new_one():
    async def body():
        async with _cluster() as c:
            tunnel = _tunnel(c)
            assert await _offsets(tunnel, [1]) == [10]
            held = asyncio.ensure_future(tunnel.call(LIST_OFFSETS, _request("t", 99), pb.ListOffsetsResponse, 10))
            await asyncio.wait_for(c.leader.arrived.wait(), 5)
            for task in list(c.link._tasks):  # the server's end of the link goes away
                task.cancel()
            with pytest.raises(TunnelError) as broken:
                await held
            assert broken.value.code() == grpc.StatusCode.UNAVAILABLE
            c.leader.release.set()
            assert await _offsets(tunnel, [5]) == [50] and tunnel.linked
            assert c.link.links == 1
            await tunnel.close()
    asyncio.run(body())


def test_a_call_that_times_out_with_nothing_read_from_its_link_drops_the_link(monkeypatch):
    """A peer that answers nothing at all for LINK_SILENCE_S, a call's timeout included
    (stopped, cut off), loses the link: the next call sets up a new one instead of
    queueing behind it."""
    monkeypatch.setattr(tunnel_module, "LINK_SILENCE_S", 0.2)

    async def body():
        async with _cluster() as c:
            tunnel = _tunnel(c)
            assert await _offsets(tunnel, [1]) == [10]
            first = tunnel._stream
            with pytest.raises(TunnelError) as late:
                await tunnel.call(LIST_OFFSETS, _request("t", 99), pb.ListOffsetsResponse, 0.3)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert tunnel._stream is None
            c.leader.release.set()
            assert await _offsets(tunnel, [2]) == [20] and tunnel._stream is not first and tunnel.linked
            await tunnel.close()
    asyncio.run(body())


def test_calls_move_back_to_a_link_once_one_can_be_set_up_and_the_stream_ends_after_its_calls():
    """After a link could not be set up, the next call due for a retry sets one up beside
    the gRPC stream; new calls go on the link, the call still in flight on the stream is
    answered there, and the stream then ends."""
    async def body():
        async with _cluster() as c:
            await c.link.stop()
            tunnel = _tunnel(c)
            assert await _offsets(tunnel, [1]) == [10] and not tunnel.linked
            c.link = c.servicer.link = LinkServer(c.servicer, 1 << 20, idle_timeout_s=30, handshake_timeout_s=2)
            await c.link.start("127.0.0.1", 0, None)
            held = asyncio.ensure_future(tunnel.call(LIST_OFFSETS, _request("t", 99), pb.ListOffsetsResponse, 10))
            await asyncio.wait_for(c.leader.arrived.wait(), 5)
            tunnel._link_retry_at = 0.0  # LINK_RETRY_S passed
            assert await _offsets(tunnel, [2]) == [20]  # still on the stream; it starts the link
            await wait_for_async(lambda: tunnel.linked, 5, "the link set up beside the stream")
            assert await _offsets(tunnel, [3, 4]) == [30, 40] and c.link.links == 1
            assert len(tunnel._readers) == 2 and not held.done()  # the stream waits for its call
            c.leader.release.set()
            assert (await held).topics[0].partitions[0].offset == 990
            await wait_for_async(lambda: len(tunnel._readers) == 1, 5, "the stream ended after its last call")
            assert await _offsets(tunnel, [5]) == [50] and tunnel.linked
            await tunnel.close()
            await c.link.stop()
    asyncio.run(body())


def test_a_short_call_that_times_out_leaves_the_link_and_the_calls_beside_it():
    """A call whose own timeout is short times out alone: the link, and a slower call in
    flight on it, stay (the link is dropped only after LINK_SILENCE_S of silence)."""
    async def body():
        async with _cluster() as c:
            tunnel = _tunnel(c)
            assert await _offsets(tunnel, [1]) == [10]
            link = tunnel._stream
            held = asyncio.ensure_future(tunnel.call(LIST_OFFSETS, _request("t", 99), pb.ListOffsetsResponse, 10))
            await asyncio.wait_for(c.leader.arrived.wait(), 5)
            with pytest.raises(TunnelError) as short:
                await tunnel.call(LIST_OFFSETS, _request("t", 99), pb.ListOffsetsResponse, 0.2)
            assert short.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert tunnel._stream is link and not held.done()
            c.leader.release.set()
            assert (await held).topics[0].partitions[0].offset == 990
            await tunnel.close()
    asyncio.run(body())


def test_the_idle_timeout_does_not_close_a_link_with_a_call_in_flight():
    async def body():
        async with _cluster(idle_s=0.3) as c:
            tunnel = _tunnel(c)
            held = asyncio.ensure_future(tunnel.call(LIST_OFFSETS, _request("t", 99), pb.ListOffsetsResponse, 10))
            await asyncio.wait_for(c.leader.arrived.wait(), 5)
            await wait_for_async(lambda: c.link.held_idle >= 3, 5, "three idle timeouts with the call running")
            assert c.link.links == 1 and c.link.refused == {}
            c.leader.release.set()
            assert (await held).topics[0].partitions[0].offset == 990
            await wait_for_async(lambda: c.link.refused == {"connections.max.idle.ms": 1}, 5,
                                 "the link closed once idle with nothing in flight")
            await tunnel.close()
    asyncio.run(body())


class _HeldAttach(TunnelServicer):
    """Attach answers once `release` is set (a busy or stopped peer); `entered` is set
    when one arrives."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.entered, self.release = asyncio.Event(), asyncio.Event()

    async def Attach(self, request, context):
        self.entered.set()
        await self.release.wait()
        return await super().Attach(request, context)


def test_a_link_slower_to_set_up_than_a_call_leaves_the_calls_on_the_stream():
    """A set-up that outlasts a call's timeout counts as a failed link: the next calls go
    on the gRPC stream instead of each waiting for a set-up of its own."""
    async def body():
        async with _cluster(servicer=_HeldAttach) as c:
            tunnel = _tunnel(c)
            with pytest.raises(TunnelError) as late:
                await tunnel.call(LIST_OFFSETS, _request("t", 1), pb.ListOffsetsResponse, 0.3)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert tunnel._link_retry_at > 0
            assert await _offsets(tunnel, [2], timeout_s=0.5) == [20] and not tunnel.linked
            c.servicer.release.set()
            await tunnel.close()
    asyncio.run(body())


def test_closing_the_channel_during_a_set_up_fails_its_calls_unavailable():
    async def body():
        async with _cluster(servicer=_HeldAttach) as c:
            tunnel = _tunnel(c)
            waiting = asyncio.ensure_future(tunnel.call(LIST_OFFSETS, _request("t", 1), pb.ListOffsetsResponse, 5))
            await asyncio.wait_for(c.servicer.entered.wait(), 5)
            await asyncio.wait_for(tunnel.close(), 5)
            with pytest.raises(TunnelError) as closed:
                await waiting
            assert closed.value.code() == grpc.StatusCode.UNAVAILABLE  # not a CancelledError
            c.servicer.release.set()
    asyncio.run(body())


def test_expired_tickets_do_not_hold_the_listeners_bound():
    now = [0.0]
    link = LinkServer(None, 1 << 20, idle_timeout_s=30, handshake_timeout_s=2, max_links=2,
                      tickets=LinkTickets(ttl_ms=1000, clock=lambda: now[0]))
    who = Snapshot((), {}, "peer")
    assert link.issue(who) and link.issue(who) and link.issue(who) is None
    now[0] += 1.0  # both expire unredeemed
    assert link.issue(who) is not None


class _Revoked(TunnelServicer):
    """Tickets are issued, but the principal is no longer admitted when one is redeemed
    (its ClusterAction revoked meanwhile), nor on a stream. `refusals`: how many times."""

    refusals = 0

    async def admit(self, context):
        self.refusals += 1
        return grpc.StatusCode.PERMISSION_DENIED, "CLUSTER_AUTHORIZATION_FAILED: revoked"


def test_a_link_whose_principal_lost_its_right_since_attach_is_refused_before_its_ack():
    """The refusal reaches the calls as it would on the gRPC stream; nothing of theirs ran.
    The link is refused, then the gRPC stream the calls go on: the call fails UNAVAILABLE
    naming PERMISSION_DENIED, also when the client's write of the calls came after the
    service had ended the stream (grpc's client then reports its own send failure,
    INTERNAL, in place of the status, and the channel asks the status again on a stream
    that writes nothing: a third refusal)."""
    async def body():
        async with _cluster(servicer=_Revoked) as c:
            tunnel = _tunnel(c)
            with pytest.raises(TunnelError) as refused:
                await tunnel.call(LIST_OFFSETS, _request("t", 1), pb.ListOffsetsResponse, 5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert refused.value.details() == "the tunnel broke: PERMISSION_DENIED", refused.value.details()
            assert c.link.refused == {"authorization": 1} and c.link.links == 0
            assert c.servicer.refusals in (2, 3)  # the link, then the stream (and the status asked again)
            assert c.servicer.messages_read == 0
            await tunnel.close()
    asyncio.run(body())


def test_sdk_links_have_bounds_and_tickets_of_their_own():
    """SDK links (Client/Attach) are bounded apart from the services' links: per process,
    per principal, with their own tickets, so clients cannot take a service's place; no
    client servicer, no SDK link."""
    link = LinkServer(object(), 1 << 20, idle_timeout_s=30, handshake_timeout_s=2, client_servicer=object(),
                      max_links=2, max_client_links=3, max_client_links_per_principal=2)

    def client(principal: str) -> Snapshot:
        return Snapshot((), {}, "ipv4:127.0.0.1:1", principal, client=True)
    service = Snapshot((), {}, "ipv4:127.0.0.1:2", "User:CN=leader")
    assert link.issue(client("User:alice")) and link.issue(client("User:alice"))
    assert link.issue(client("User:alice")) is None  # alice's bound
    assert link.issue(client("User:bob")) is not None
    assert link.issue(client("User:carol")) is None  # the process's SDK-link bound
    assert link.issue(service) and link.issue(service)  # the services' links are untouched
    assert link.issue(service) is None
    assert link.client_tickets.outstanding("User:alice") == 2 and link.tickets.outstanding() == 2
    assert LinkServer(object(), 1 << 20, idle_timeout_s=30, handshake_timeout_s=2).issue(client("User:bob")) is None


def test_a_link_counts_against_its_principals_bound_while_it_is_admitted():
    """A redeemed ticket's link counts toward its principal's bound from the redemption on,
    also while its admission waits (a quota, a slow authorizer): no ticket is issued past
    the bound meanwhile."""
    class SlowAdmission:
        def __init__(self):
            self.entered, self.release = asyncio.Event(), asyncio.Event()

        async def admit(self, context):
            self.entered.set()
            await self.release.wait()
            return grpc.StatusCode.PERMISSION_DENIED, "refused after the wait"

    async def body():
        servicer = SlowAdmission()
        link = LinkServer(object(), 1 << 20, idle_timeout_s=30, handshake_timeout_s=2, client_servicer=servicer,
                          max_client_links_per_principal=1)
        await link.start("127.0.0.1", 0, None)
        alice = Snapshot((), {}, "ipv4:127.0.0.1:1", "User:alice", client=True)
        try:
            ticket = link.issue(alice)
            reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
            writer.write(ticket)
            await asyncio.wait_for(servicer.entered.wait(), 5)
            assert link.client_tickets.outstanding("User:alice") == 0 and link.client_links == 1
            assert link.issue(alice) is None  # the link being admitted holds alice's one place
            servicer.release.set()
            assert await _closed(reader)  # refused: closed unanswered
            await wait_for_async(lambda: link.client_links == 0, 5, "the refused link to be uncounted")
            assert link.issue(alice) is not None and link.refused == {"authorization": 1}
            writer.close()
        finally:
            await link.stop()
    asyncio.run(body())


def test_one_way_calls_on_a_link_run_at_once_and_do_not_hold_it_open():
    """A notice on a set-up link is written by notify() itself (before anything the
    caller writes next) and run by the callee; answered by nothing, it does not count as
    a call in flight, so the link still closes once idle."""
    from .test_tunnel import TXN_PARTITIONS_ADDED, _Noticed
    async def body():
        async with _cluster(_Noticed(), idle_s=0.3) as c:
            tunnel = _tunnel(c)
            await tunnel.call(LIST_OFFSETS, _request("t", 1), pb.ListOffsetsResponse, 5)
            assert tunnel.linked
            tunnel.notify(TXN_PARTITIONS_ADDED, pb.TxnPartitionsAddedRequest(producer_id=3))
            assert not tunnel._notices  # written at once, not queued in a task
            await asyncio.wait_for(c.leader.noticed.wait(), 5)
            assert c.leader.notices == [3]
            await wait_for_async(lambda: c.link.refused == {"connections.max.idle.ms": 1}, 5,
                                 "the link closed once idle")
            assert c.link.held_idle == 0
            await tunnel.close()
    asyncio.run(body())
