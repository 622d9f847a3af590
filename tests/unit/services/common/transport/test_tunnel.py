"""services.common.transport.tunnel over real gRPC on loopback: a tunneled call gets what a direct
call gets (response, or status and details), through the server's interceptors; a
broken stream fails the calls in flight with UNAVAILABLE and the next call reopens it."""
from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from waiting import wait_for_async

from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.common.after_answer import after_answer
from services.common.protocol import REQUEST_ARRIVAL_S
from services.common.metrics import RpcMetricsInterceptor
from services.common.transport.guard import RequestGuard, UnaryHandlerInterceptor
from services.common.transport.tunnel import (MAX_BATCH_CALLS, OPEN_METHOD, TUNNEL_METHOD, HandlerRegistry, TunnelChannel,
                                              TunnelError, TunnelServicer, add_tunnel_to_server, method_path)

LIST_OFFSETS = method_path("PartitionLeader", "ListOffsets")


class Leader(pbg.PartitionLeaderServicer):
    """ListOffsets answers offset = partition * 10 for topic "t", aborts otherwise;
    partition 99 sets `arrived`, then waits until `release` is set."""

    def __init__(self):
        self.release = asyncio.Event()
        self.arrived = asyncio.Event()

    async def ListOffsets(self, request, context):
        part = request.topics[0].partitions[0]
        if request.topics[0].name != "t":
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "TOPIC_AUTHORIZATION_FAILED: not t")
        if part.partition == 99:
            self.arrived.set()
            await self.release.wait()
        return pb.ListOffsetsResponse(topics=[pb.ListOffsetsTopicResponse(name="t", partitions=[
            pb.ListOffsetsPartitionResponse(partition=part.partition, offset=part.partition * 10)])])


class _Raw:
    """Bytes sent as a request body as they are."""

    def __init__(self, body: bytes):
        self.body = body

    def SerializeToString(self) -> bytes:  # noqa: N802 - the protobuf method name
        return self.body


def _request(topic: str, partition: int) -> pb.ListOffsetsRequest:
    return pb.ListOffsetsRequest(topics=[pb.ListOffsetsTopic(name=topic, partitions=[
        pb.ListOffsetsPartition(partition=partition, timestamp=-1)])])


async def _serving(leader: Leader, only_calls: bool = False):
    """A server of `leader` and the tunnel (Tunnel/Calls alone with `only_calls`, as a
    version without Batches): (server, address, its TunnelServicer)."""
    interceptors = [RequestGuard()]
    server = grpc.aio.server(interceptors=interceptors)
    registry = HandlerRegistry(server)
    pbg.add_PartitionLeaderServicer_to_server(leader, registry)
    servicer = TunnelServicer(registry, interceptors)
    if only_calls:
        handler = grpc.stream_stream_rpc_method_handler(
            servicer.Calls, request_deserializer=pb.TunneledCall.FromString,
            response_serializer=pb.TunneledReply.SerializeToString)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("exactly.v1.Tunnel",
                                                                              {"Calls": handler}),))
    else:
        add_tunnel_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}", servicer


async def _server(leader: Leader):
    server, address, _ = await _serving(leader)
    return server, address


def test_tunneled_calls_answer_like_direct_ones():
    async def body():
        leader = Leader()
        server, address = await _server(leader)
        async with grpc.aio.insecure_channel(address) as channel:
            tunnel = TunnelChannel(channel)
            direct = await pbg.PartitionLeaderStub(channel).ListOffsets(_request("t", 3))
            replies = await asyncio.gather(*(tunnel.call(LIST_OFFSETS, _request("t", p), pb.ListOffsetsResponse, 5)
                                             for p in range(20)))
            assert [r.topics[0].partitions[0].offset for r in replies] == [p * 10 for p in range(20)]
            assert replies[3] == direct
            with pytest.raises(TunnelError) as denied:
                await tunnel.call(LIST_OFFSETS, _request("u", 0), pb.ListOffsetsResponse, 5)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert denied.value.details() == "TOPIC_AUTHORIZATION_FAILED: not t"
            # The request guard runs for tunneled calls too: an undecodable body.
            with pytest.raises(TunnelError) as garbage:
                await tunnel.call(LIST_OFFSETS, _Raw(b"\x12\x06\xff\xff"), pb.ListOffsetsResponse, 5)
            assert garbage.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert garbage.value.details().startswith("INVALID_REQUEST: the request is not a valid encoding")
            with pytest.raises(TunnelError) as unknown:
                await tunnel.call("/exactly.v1.PartitionLeader/Nope", _request("t", 0), pb.ListOffsetsResponse, 5)
            assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
            with pytest.raises(TunnelError) as itself:
                await tunnel.call(TUNNEL_METHOD, _request("t", 0), pb.ListOffsetsResponse, 5)
            assert itself.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            # A message that is no TunneledCall: answered under correlation id 0.
            raw = channel.stream_stream("/exactly.v1.Tunnel/Calls", request_serializer=None,
                                        response_deserializer=pb.TunneledReply.FromString)
            answers = [r async for r in raw(iter([b"\xff\xff\xff", pb.TunneledCall(
                correlation_id=7, method=LIST_OFFSETS, request=_request("t", 2).SerializeToString()).SerializeToString()]))]
            assert sorted((r.correlation_id, r.status_code) for r in answers) == [
                (0, grpc.StatusCode.INVALID_ARGUMENT.value[0]), (7, 0)], answers
            # The stream still serves after every refusal.
            again = await tunnel.call(LIST_OFFSETS, _request("t", 4), pb.ListOffsetsResponse, 5)
            assert again.topics[0].partitions[0].offset == 40
            await tunnel.close()
        await server.stop(0)
    asyncio.run(body())


def test_a_broken_stream_fails_calls_in_flight_and_the_next_call_reopens_it():
    async def body():
        leader = Leader()
        server, address = await _server(leader)
        port = int(address.rsplit(":", 1)[1])
        # Reconnect to the new server as soon as it listens, not after gRPC's default
        # first reconnect backoff (1 s; gRPC waits at least 0.1 s whatever these say).
        backoff = [("grpc.initial_reconnect_backoff_ms", 10), ("grpc.max_reconnect_backoff_ms", 100)]
        async with grpc.aio.insecure_channel(address, options=backoff) as channel:
            tunnel = TunnelChannel(channel)
            waiting = asyncio.create_task(tunnel.call(LIST_OFFSETS, _request("t", 99), pb.ListOffsetsResponse, 30))
            await leader.arrived.wait()  # the call is in flight, at the server
            await server.stop(0)
            with pytest.raises(TunnelError) as broken:
                await waiting
            assert broken.value.code() == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(TunnelError) as late:
                await tunnel.call(LIST_OFFSETS, _request("t", 99), pb.ListOffsetsResponse, 0.3)
            assert late.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            # A new server on the same port: the next call opens a new stream.
            server2 = grpc.aio.server()
            registry = HandlerRegistry(server2)
            pbg.add_PartitionLeaderServicer_to_server(Leader(), registry)
            add_tunnel_to_server(TunnelServicer(registry, []), server2)
            server2.add_insecure_port(f"127.0.0.1:{port}")
            await server2.start()
            await asyncio.wait_for(channel.channel_ready(), 30)  # reconnected to the new server
            reply = await tunnel.call(LIST_OFFSETS, _request("t", 5), pb.ListOffsetsResponse, 5)
            assert reply.topics[0].partitions[0].offset == 50
            await tunnel.close()
            await server2.stop(0)
    asyncio.run(body())


class _OnlyServices(grpc.aio.ServerInterceptor):
    """Stands in for the authorizer: a call of `refused` aborts with PERMISSION_DENIED
    unless the caller's metadata says `role: service`."""

    def __init__(self, refused: str):
        self.refused = refused
        self.opened = 0

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if details.method != self.refused:
            return handler

        async def check(request, context):
            self.opened += 1
            if ("role", "service") not in tuple(context.invocation_metadata() or ()):
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, "CLUSTER_AUTHORIZATION_FAILED: not a service")
            return await handler.unary_unary(request, context)
        return grpc.unary_unary_rpc_method_handler(check)


class _Counting(Leader):
    """Leader counting the ListOffsets calls that reached it."""

    def __init__(self):
        super().__init__()
        self.entered = 0

    async def ListOffsets(self, request, context):
        self.entered += 1
        return await super().ListOffsets(request, context)


class _Deferring(Leader):
    """Leader whose ListOffsets defers work until its answer is written
    (services.common.after_answer): `deferred` gets, per call, the partition and the
    messages the stream had sent when the work ran."""

    def __init__(self):
        super().__init__()
        self.servicer: TunnelServicer | None = None
        self.deferred: list[tuple[int, int]] = []

    async def ListOffsets(self, request, context):
        partition = request.topics[0].partitions[0].partition
        after_answer(lambda: self.deferred.append((partition, self.servicer.messages_sent)))
        return await super().ListOffsets(request, context)


def test_work_deferred_until_the_answer_runs_once_it_is_written_or_its_stream_is_gone():
    """A tunneled call's deferred work runs as its reply goes to the stream's writer
    (the first reply of a fresh stream: 1 message sent, where running at once saw 0),
    and, for a call whose stream ends before it answers, when the stream ends."""
    async def body():
        leader = _Deferring()
        server, address, leader.servicer = await _serving(leader)
        async with grpc.aio.insecure_channel(address) as channel:
            tunnel = TunnelChannel(channel)
            reply = await tunnel.call(LIST_OFFSETS, _request("t", 7), pb.ListOffsetsResponse, 5)
            assert reply.topics[0].partitions[0].offset == 70
            await wait_for_async(lambda: leader.deferred, 10, "the deferred work to run")
            assert leader.deferred == [(7, 1)]
            blocked = asyncio.ensure_future(tunnel.call(LIST_OFFSETS, _request("t", 99), pb.ListOffsetsResponse, 30))
            await asyncio.wait_for(leader.arrived.wait(), 10)
            assert leader.deferred == [(7, 1)]  # its answer is not written
            await tunnel.close()
            await wait_for_async(lambda: len(leader.deferred) == 2, 10, "the work of the unanswered call to run")
            assert leader.deferred[1][0] == 99
            blocked.cancel()
        await server.stop(0)
    asyncio.run(body())


def test_a_stream_is_admitted_only_when_its_open_pseudo_call_passes_the_interceptors():
    async def body():
        leader = _Counting()
        gate = _OnlyServices(OPEN_METHOD)
        interceptors = [RequestGuard(), gate]
        server = grpc.aio.server(interceptors=interceptors)
        registry = HandlerRegistry(server)
        pbg.add_PartitionLeaderServicer_to_server(leader, registry)
        add_tunnel_to_server(TunnelServicer(registry, interceptors), server)
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        async with grpc.aio.insecure_channel(address) as channel:
            raw = channel.stream_stream(TUNNEL_METHOD, request_serializer=pb.TunneledCall.SerializeToString,
                                        response_deserializer=pb.TunneledReply.FromString)
            calls = [pb.TunneledCall(correlation_id=i, method=LIST_OFFSETS,
                                     request=_request("t", i).SerializeToString()) for i in range(1, 50)]
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                _ = [r async for r in raw(iter(calls[:1]), timeout=10)]
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert refused.value.details() == "CLUSTER_AUTHORIZATION_FAILED: not a service"
            assert leader.entered == 0  # not one of its calls ran
            admitted = [r async for r in raw(iter(calls), metadata=(("role", "service"),), timeout=10)]
            assert sorted(r.correlation_id for r in admitted) == list(range(1, 50))
            assert leader.entered == 49 and gate.opened == 2  # once per stream, not per call
            # The pseudo-call cannot be tunneled.
            [own] = [r async for r in raw(iter([pb.TunneledCall(correlation_id=1, method=OPEN_METHOD)]),
                                          metadata=(("role", "service"),), timeout=10)]
            assert own.status_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        await server.stop(0)
    asyncio.run(body())


def test_a_stream_reads_no_more_calls_than_its_in_flight_bound():
    """Calls that do not finish hold their slots: with max_in_flight 4, 40 blocked
    calls on one stream run 4 at a time (the stream's next read waits for a slot, the
    rest wait unread in the transport), and all finish once released."""
    async def body():
        leader = _Counting()
        interceptors = [RequestGuard()]
        server = grpc.aio.server(interceptors=interceptors)
        registry = HandlerRegistry(server)
        pbg.add_PartitionLeaderServicer_to_server(leader, registry)
        servicer = TunnelServicer(registry, interceptors, max_in_flight=4, max_queued=2)
        add_tunnel_to_server(servicer, server)
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        async with grpc.aio.insecure_channel(address) as channel:
            tunnel = TunnelChannel(channel)
            calls = [asyncio.ensure_future(tunnel.call(LIST_OFFSETS, _request("t", 99), pb.ListOffsetsResponse, 30))
                     for _ in range(40)]
            # The stream's reader stops at the bound (it would read the 5th call next)...
            await wait_for_async(lambda: servicer.held_reads == 1, 10, "the stream's reads to wait for a slot")
            assert servicer.in_flight == 4
            # ...and the 4 calls it read reach the handler, no more.
            await wait_for_async(lambda: leader.entered >= 4, 10, "the calls read to reach the handler")
            assert leader.entered == 4 and servicer.held_reads == 1 and servicer.in_flight == 4
            leader.release.set()
            replies = await asyncio.wait_for(asyncio.gather(*calls), 30)
            assert len(replies) == 40 and leader.entered == 40
            await wait_for_async(lambda: servicer.in_flight == 0, 10, "every slot to be given back")
            await tunnel.close()
        await server.stop(0)
    asyncio.run(body())


def test_a_calls_arrival_is_taken_before_the_interceptors_that_hold_it():
    """The outermost interceptor (RpcMetricsInterceptor) records each call's arrival in
    REQUEST_ARRIVAL_S before an inner interceptor holds the call (as a quota mute
    does), for direct and tunneled calls: deadlines that count from the arrival
    (services/common/protocol.py) do not grow by the hold."""
    entered: list[float] = []
    seen: list[float | None] = []

    class Hold(UnaryHandlerInterceptor):
        """Holds every call until `release` is set (a quota mute's stand-in)."""

        def __init__(self):
            self.release = asyncio.Event()
            self.holding = asyncio.Event()

            def wrap(behavior, method):
                if method != LIST_OFFSETS:  # the tunnel's admission (Open) passes
                    return behavior

                async def held(request, context):
                    entered.append(time.monotonic())
                    self.holding.set()
                    await self.release.wait()
                    return await behavior(request, context)
                return held
            super().__init__(wrap)

    class Recorder(Leader):
        async def ListOffsets(self, request, context):
            seen.append(REQUEST_ARRIVAL_S.get())
            return await super().ListOffsets(request, context)

    async def body():
        hold = Hold()
        interceptors = [RpcMetricsInterceptor(), hold]
        server = grpc.aio.server(interceptors=interceptors)
        registry = HandlerRegistry(server)
        pbg.add_PartitionLeaderServicer_to_server(Recorder(), registry)
        add_tunnel_to_server(TunnelServicer(registry, interceptors), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            tunnel = TunnelChannel(channel)
            for call in (lambda: pbg.PartitionLeaderStub(channel).ListOffsets(_request("t", 1), timeout=5),
                         lambda: tunnel.call(LIST_OFFSETS, _request("t", 2), pb.ListOffsetsResponse, 5)):
                hold.holding.clear()
                hold.release.clear()
                pending = asyncio.ensure_future(call())
                await hold.holding.wait()
                hold.release.set()
                await pending
            await tunnel.close()
        await server.stop(0)
    asyncio.run(asyncio.wait_for(body(), 20))
    assert len(seen) == len(entered) == 2 and None not in seen
    assert all(arrival <= held for arrival, held in zip(seen, entered)), (seen, entered)
    assert REQUEST_ARRIVAL_S.get() is None  # set per call only


TUNNEL_BATCHES = method_path("Tunnel", "Batches")


def test_calls_that_queue_during_a_write_share_the_next_message_and_replies_ready_together_share_one():
    """40 calls started at once: the first goes alone, the 39 that queued while it was
    written go in one TunneledCalls; 40 calls held at the server and released together
    are answered in fewer messages than calls. Every call gets its own answer."""
    async def body():
        leader = Leader()
        server, address, servicer = await _serving(leader)
        async with grpc.aio.insecure_channel(address) as channel:
            tunnel = TunnelChannel(channel)
            replies = await asyncio.gather(*(tunnel.call(LIST_OFFSETS, _request("t", p), pb.ListOffsetsResponse, 5)
                                             for p in range(40)))
            assert [r.topics[0].partitions[0].offset for r in replies] == [p * 10 for p in range(40)]
            assert tunnel.batched and servicer.messages_read == 2, servicer.messages_read
            # More than a message holds (MAX_BATCH_CALLS): 1 + 199 calls in 1 + 4 messages.
            more = await asyncio.gather(*(tunnel.call(LIST_OFFSETS, _request("t", p), pb.ListOffsetsResponse, 5)
                                          for p in range(100, 300)))  # (99 would wait for `release`)
            assert [r.topics[0].partitions[0].offset for r in more] == [p * 10 for p in range(100, 300)]
            assert servicer.messages_read - 2 == 1 + -(-199 // MAX_BATCH_CALLS), servicer.messages_read
            # Held calls released at once: their replies leave together.
            sent_before = servicer.messages_sent
            held = [asyncio.ensure_future(tunnel.call(LIST_OFFSETS, _request("t", 99), pb.ListOffsetsResponse, 10))
                    for _ in range(40)]
            await wait_for_async(lambda: servicer.in_flight == 40, 10, "the 40 held calls to reach the server")
            leader.release.set()
            answers = await asyncio.gather(*held)
            assert {a.topics[0].partitions[0].offset for a in answers} == {990}
            assert servicer.messages_sent - sent_before < 40, servicer.messages_sent - sent_before
            await tunnel.close()
        await server.stop(0)
    asyncio.run(body())


def test_a_peer_without_batches_is_called_over_calls_and_the_refused_calls_go_again():
    """A server of the previous version serves Tunnel/Calls only: the Batches stream is
    refused UNIMPLEMENTED before any call ran, the channel sends those calls again over
    Calls and uses Calls from then on; each call runs once. Fifty times: the refusal
    meets the calls' writes in flight now and then."""
    async def once():
        leader = _Counting()
        server, address, servicer = await _serving(leader, only_calls=True)
        async with grpc.aio.insecure_channel(address) as channel:
            tunnel = TunnelChannel(channel)
            # The first calls already: grpcio's client hides a refusal that meets a write
            # in flight (INTERNAL); the channel then asks the peer's status again.
            replies = await asyncio.gather(*(tunnel.call(LIST_OFFSETS, _request("t", p), pb.ListOffsetsResponse, 5)
                                             for p in range(10)))
            assert [r.topics[0].partitions[0].offset for r in replies] == [p * 10 for p in range(10)]
            assert not tunnel.batched and leader.entered == 10
            assert servicer.messages_read == 10  # one call to a message, over Calls
            await tunnel.close()
        await server.stop(0)

    async def body():
        for _ in range(50):
            await once()
    asyncio.run(body())


def test_a_batches_message_that_does_not_parse_is_answered_and_the_stream_serves_on():
    async def body():
        server, address = await _server(Leader())
        async with grpc.aio.insecure_channel(address) as channel:
            raw = channel.stream_stream(TUNNEL_BATCHES, request_serializer=None,
                                        response_deserializer=pb.TunneledReplies.FromString)
            good = pb.TunneledCalls(calls=[pb.TunneledCall(correlation_id=c, method=LIST_OFFSETS,
                                                           request=_request("t", c).SerializeToString())
                                           for c in (7, 8)]).SerializeToString()
            answers = [r for m in [m async for m in raw(iter([b"\xff\xff\xff", good]), timeout=10)]
                       for r in m.replies]
            assert sorted((r.correlation_id, r.status_code) for r in answers) == [
                (0, grpc.StatusCode.INVALID_ARGUMENT.value[0]), (7, 0), (8, 0)], answers
            assert [r.status_details for r in answers if r.correlation_id == 0][0].startswith(
                "INVALID_REQUEST: not a valid TunneledCalls encoding")
        await server.stop(0)
    asyncio.run(body())


class _Big(Leader):
    """Fetch answers `size` bytes of records."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    async def Fetch(self, request, context):
        return pb.FetchResponse(responses=[pb.FetchTopicResponse(topic="t", partitions=[
            pb.FetchPartitionResponse(partition=0, records=b"r" * self.size)])])


def test_a_batches_message_stays_within_its_byte_bound_whatever_is_ready():
    """Replies of 700 KB ready together go one to a message (two would pass
    MAX_BATCH_BYTES), and calls whose requests pass it together are split the same
    way: a merged message never nears the peers' message size limits."""
    fetch = method_path("PartitionLeader", "Fetch")

    async def body():
        server, address, servicer = await _serving(_Big(700_000))
        async with grpc.aio.insecure_channel(address) as channel:
            tunnel = TunnelChannel(channel)
            replies = await asyncio.gather(*(tunnel.call(fetch, pb.FetchRequest(), pb.FetchResponse, 10)
                                             for _ in range(6)))
            assert [len(r.responses[0].partitions[0].records) for r in replies] == [700_000] * 6
            assert servicer.messages_sent == 6
            # Requests: 6 calls of 700 KB bodies started at once go one to a message too.
            read_before = servicer.messages_read
            big = _request("t" * 700_000, 1)  # aborts (not topic "t"): the size is what counts
            outcomes = await asyncio.gather(*(tunnel.call(LIST_OFFSETS, big, pb.ListOffsetsResponse, 10)
                                              for _ in range(6)), return_exceptions=True)
            assert all(isinstance(o, TunnelError) and o.code() == grpc.StatusCode.PERMISSION_DENIED
                       for o in outcomes), outcomes
            assert servicer.messages_read - read_before == 6
            await tunnel.close()
        await server.stop(0)
    asyncio.run(body())


class _Noticed(Leader):
    """Leader whose TxnPartitionsAdded records each notice, in order, beside ListOffsets."""

    def __init__(self):
        super().__init__()
        self.notices: list[int] = []
        self.noticed = asyncio.Event()

    async def TxnPartitionsAdded(self, request, context):
        self.notices.append(request.producer_id)
        self.noticed.set()
        return pb.TxnPartitionsAddedResponse()


TXN_PARTITIONS_ADDED = method_path("PartitionLeader", "TxnPartitionsAdded")


def test_a_one_way_call_runs_in_order_and_is_answered_by_nothing():
    """notify(): the callee runs the call before the calls written after it, and no reply
    comes back (no message sent for it, nothing pending at the caller); calls still get
    their answers, and the stream's in-flight count returns to zero."""
    async def body():
        leader = _Noticed()
        server, address, servicer = await _serving(leader)
        async with grpc.aio.insecure_channel(address) as channel:
            tunnel = TunnelChannel(channel)
            await tunnel.call(LIST_OFFSETS, _request("t", 1), pb.ListOffsetsResponse, 5)  # the stream is open
            sent_before = servicer.messages_sent
            for pid in range(5):
                tunnel.notify(TXN_PARTITIONS_ADDED, pb.TxnPartitionsAddedRequest(producer_id=pid))
            reply = await tunnel.call(LIST_OFFSETS, _request("t", 2), pb.ListOffsetsResponse, 5)
            assert reply.topics[0].partitions[0].offset == 20
            assert leader.notices == [0, 1, 2, 3, 4]  # all ran, in order, before the call after them
            assert servicer.messages_sent - sent_before == 1  # the call's answer only
            assert not tunnel._pending and not tunnel._sent
            # The server gives the slot back once gRPC took the answer, which the
            # caller may read first.
            await wait_for_async(lambda: servicer.in_flight == 0, 10, "the call's slot to be given back")
            await tunnel.close()
        await server.stop(0)
    asyncio.run(body())


def test_a_channel_without_batches_sends_no_one_way_call():
    """Towards a peer of a version without Batches (its calls one to a message, each
    answered) a notice is not sent at all."""
    async def body():
        leader = _Noticed()
        server, address, _ = await _serving(leader, only_calls=True)
        async with grpc.aio.insecure_channel(address) as channel:
            tunnel = TunnelChannel(channel, batched=False)
            tunnel.notify(TXN_PARTITIONS_ADDED, pb.TxnPartitionsAddedRequest(producer_id=7))
            await tunnel.call(LIST_OFFSETS, _request("t", 1), pb.ListOffsetsResponse, 5)
            assert leader.notices == [] and not tunnel._notices
            await tunnel.close()
        await server.stop(0)
    asyncio.run(body())


def test_a_notice_written_as_the_peer_refuses_batches_leaves_the_calls_to_the_downgrade():
    """Towards a peer without Batches: a notice written after its refusal arrived, before
    the channel's reader took it, fails to write; the call on that stream is still sent
    again on Calls and answered (the ended stream is its reader's to fail), not failed
    UNAVAILABLE."""
    async def body():
        leader = _Noticed()
        server, address, _ = await _serving(leader, only_calls=True)
        async with grpc.aio.insecure_channel(address) as channel:
            tunnel = TunnelChannel(channel)
            call = asyncio.ensure_future(tunnel.call(LIST_OFFSETS, _request("t", 1), pb.ListOffsetsResponse, 5))
            for _ in range(100_000):  # until the Batches stream ended, its reader not yet run
                await asyncio.sleep(0)
                if tunnel._stream is not None and tunnel._stream.done():
                    break
            assert tunnel.batched, "the reader took the refusal first: the window was missed"
            tunnel.notify(TXN_PARTITIONS_ADDED, pb.TxnPartitionsAddedRequest(producer_id=7))
            notices = set(tunnel._notices)
            assert (await call).topics[0].partitions[0].offset == 10 and not tunnel.batched
            outcomes = await asyncio.gather(*notices, return_exceptions=True)
            assert not any(isinstance(r, BaseException) for r in outcomes), outcomes
            await tunnel.close()
        await server.stop(0)
    asyncio.run(body())


def test_a_notice_queued_at_close_is_dropped_and_opens_no_stream():
    async def body():
        leader = _Noticed()
        server, address, _ = await _serving(leader)
        async with grpc.aio.insecure_channel(address) as channel:
            tunnel = TunnelChannel(channel)
            tunnel.notify(TXN_PARTITIONS_ADDED, pb.TxnPartitionsAddedRequest(producer_id=9))  # queued: no stream yet
            await tunnel.close()
            tunnel.notify(TXN_PARTITIONS_ADDED, pb.TxnPartitionsAddedRequest(producer_id=10))  # after the close
            # close() awaited the queued notice's task, and the later one made none: no
            # stream was opened, none can be now.
            assert tunnel._stream is None and not tunnel._readers and not tunnel._notices
            assert leader.notices == []
        await server.stop(0)
    asyncio.run(body())
