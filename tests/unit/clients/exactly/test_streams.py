"""exactly._streams over real gRPC on loopback: the SDK's transaction-path calls on one
`Client/Calls` stream per service get what direct calls get (response, or status and
details, the same error types); calls pipelined together share messages; a call not
answered by its timeout fails with DEADLINE_EXCEEDED while the stream serves on; a
broken stream fails its calls with UNAVAILABLE and the next call opens another; a
service without Client/Calls gets every call once, as a direct call; large requests
and idle streams are direct / closed."""
from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import socket
import threading
import weakref

import grpc
import pytest
from waiting import wait_for

from exactly import _streams, errors
from exactly._client import translate_rpc_error
from exactly._link import Connector
from exactly_wire.links import HEADER
from exactly_wire.security import TransportSecurity
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.common.transport.guard import RequestGuard
from services.common.transport import link as link_module
from services.common.transport.link import ACK, TICKET_BYTES, LinkServer
from services.common.transport.tunnel import (CLIENT_CARRIED, CLIENT_OPEN_METHOD, HandlerRegistry, TunneledContext,
                                              TunnelServicer, add_client_calls_to_server)


class Coordinator(pbg.TransactionCoordinatorServicer):
    """EndTxn answers the next producer epoch; transactional.id "deny" is refused,
    "hang" waits until `release` is set. `direct` and `streamed` count the calls by path."""

    def __init__(self):
        self.release = asyncio.Event()
        self.direct = 0
        self.streamed = 0

    async def EndTxn(self, request, context):  # noqa: N802 - the gRPC method name
        if isinstance(context, TunneledContext):
            self.streamed += 1
        else:
            self.direct += 1
        if request.transactional_id == "deny":
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED: deny")
        if request.transactional_id == "hang":
            await self.release.wait()
        return pb.EndTxnResponse(producer_id=request.producer_id, producer_epoch=request.producer_epoch + 1)

    async def ListTransactions(self, request, context):  # noqa: N802 - not carried: always direct
        self.direct += 1
        return pb.ListTransactionsResponse()


class Service:
    """An asyncio gRPC server on its own thread serving Coordinator, and Client/Calls
    unless `streams` is False (a service of a version without it)."""

    def __init__(self, streams: bool = True, port: int = 0, links: dict | None = None):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.coordinator = Coordinator()
        self.streams = streams
        self.servicer: TunnelServicer | None = None
        self.links = links  # LinkServer arguments: serve SDK links (Client/Attach)
        self.link: LinkServer | None = None
        self.server, self.port = self.run(self._start(port))
        self.address = f"127.0.0.1:{self.port}"

    def run(self, coro, timeout: float = 10):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self, port: int):
        interceptors = [RequestGuard()]
        server = grpc.aio.server(interceptors=interceptors)
        registry = HandlerRegistry(server)
        self.coordinator.release = asyncio.Event()
        pbg.add_TransactionCoordinatorServicer_to_server(self.coordinator, registry)
        if self.streams:
            self.servicer = TunnelServicer(registry, interceptors, max_in_flight=32,
                                           open_method=CLIENT_OPEN_METHOD, carried=CLIENT_CARRIED)
            add_client_calls_to_server(self.servicer, server)
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        if self.links is not None:
            self.link = self.servicer.link = LinkServer(self.servicer, 64 << 20, idle_timeout_s=30,
                                                        handshake_timeout_s=2, client_servicer=self.servicer,
                                                        **self.links)
            await self.link.start("127.0.0.1", 0, None)
        return server, bound

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.coordinator.release.set)
        if self.link is not None:
            self.run(self.link.stop())
        self.run(self.server.stop(0))

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def service():
    s = Service()
    yield s
    s.close()


def _stub(address: str, link: bool = False):
    channel = grpc.insecure_channel(address)
    stream = _streams.CallStream(channel, Connector(channel, address, TransportSecurity()) if link else None)
    return pbg.TransactionCoordinatorStub(_streams.StreamingChannel(channel, stream)), stream, channel


@pytest.fixture
def linked():
    s = Service(links={})
    yield s
    s.close()


def _linked_stub(service: Service):
    """A stub whose calls went on the link once it was set up (the first call's on the stream)."""
    stub, stream, channel = _stub(service.address, link=True)
    assert stub.EndTxn(_end("t"), timeout=5).producer_epoch == 1
    wait_for(lambda: stream.links_opened == 1 and service.link.client_links == 1, 10, "the link to be set up")
    return stub, stream, channel


def _end(tid: str, epoch: int = 0) -> pb.EndTxnRequest:
    return pb.EndTxnRequest(transactional_id=tid, producer_id=7, producer_epoch=epoch, committed=True)


def test_streamed_calls_answer_like_direct_ones(service):
    stub, stream, channel = _stub(service.address)
    try:
        direct = pbg.TransactionCoordinatorStub(channel).EndTxn(_end("t", 3), timeout=5)
        assert stub.EndTxn(_end("t", 3), timeout=5) == direct
        futures = [stub.EndTxn.future(_end("t", e), timeout=5) for e in range(40)]
        assert [f.result(5).producer_epoch for f in futures] == list(range(1, 41))
        with pytest.raises(grpc.RpcError) as denied:
            stub.EndTxn(_end("deny"), timeout=5)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert denied.value.details() == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED: deny"
        assert isinstance(translate_rpc_error(denied.value), errors.TransactionalIdAuthorizationFailedError)
        with pytest.raises(grpc.RpcError) as denied_future:
            stub.EndTxn.future(_end("deny"), timeout=5).result(5)
        assert denied_future.value.code() == grpc.StatusCode.PERMISSION_DENIED
        stub.ListTransactions(pb.ListTransactionsRequest(), timeout=5)  # not carried: direct
        assert service.coordinator.direct == 2 and service.coordinator.streamed == 1 + 40 + 2
        # One stream; the 40 futures sent together took fewer messages than calls.
        assert stream.streams_opened == 1
        assert service.servicer.messages_read < 1 + 40 + 2, service.servicer.messages_read
    finally:
        channel.close()


def test_a_call_past_its_timeout_fails_and_the_stream_serves_on(service):
    stub, stream, channel = _stub(service.address)
    try:
        hanging = stub.EndTxn.future(_end("hang"), timeout=0.3)
        with pytest.raises(grpc.RpcError) as late:
            hanging.result(5)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert isinstance(translate_rpc_error(late.value), errors.RequestTimedOutError)
        with pytest.raises(grpc.RpcError) as blocking:
            stub.EndTxn(_end("hang"), timeout=0.3)
        assert blocking.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert stub.EndTxn(_end("t", 5), timeout=5).producer_epoch == 6
        assert stream.streams_opened == 1
    finally:
        channel.close()


def test_answered_futures_leave_the_deadline_timer_at_once(service):
    """The timer lets go of a future as soon as it is answered, not at its deadline: what
    its done-callbacks hold (a Produce's batches) is freed with it, and the timer's heap
    does not grow with the call rate × the timeout. Deadlines of unanswered calls still
    fire."""
    stub, stream, channel = _stub(service.address)
    try:
        held = len(_streams._TIMER)

        class Batches:
            pass
        batches = Batches()
        freed = weakref.ref(batches)
        first = stub.EndTxn.future(_end("t"), timeout=60)
        first.add_done_callback(lambda _f, batches=batches: None)
        del batches
        assert first.result(5).producer_epoch == 1
        futures = [stub.EndTxn.future(_end("t", e), timeout=60) for e in range(300)]
        assert [f.result(5).producer_epoch for f in futures] == list(range(1, 301))
        assert len(_streams._TIMER) == held
        assert len(_streams._TIMER._heap) < 300  # the entries let go of were dropped
        del first, futures
        gc.collect()
        assert freed() is None
        with pytest.raises(grpc.RpcError) as late:
            stub.EndTxn.future(_end("hang"), timeout=0.3).result(5)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert len(_streams._TIMER) == held
    finally:
        channel.close()


def _answered_once_restarted(stub) -> None:
    """Wait until a call to a restarted service is answered (UNAVAILABLE meanwhile)."""
    def answered() -> bool:
        try:
            return stub.EndTxn(_end("t", 8), timeout=2).producer_epoch == 9
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
            return False
    wait_for(answered, 20, "a call to the restarted service to be answered")


def test_a_broken_stream_fails_its_calls_and_the_next_call_opens_another():
    first = Service()
    stub, stream, channel = _stub(first.address)
    try:
        assert stub.EndTxn(_end("t"), timeout=5).producer_epoch == 1
        hanging = stub.EndTxn.future(_end("hang"), timeout=30)
        wait_for(lambda: first.coordinator.streamed == 2, 5, "the hanging call to arrive")
        first.run(first.server.stop(0))  # the service goes away with the call in flight
        with pytest.raises(grpc.RpcError) as broken:
            hanging.result(10)
        assert broken.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        assert isinstance(translate_rpc_error(broken.value), errors.NetworkException)
        first.close()
        second = Service(port=first.port)  # restarted on the same port
        try:
            _answered_once_restarted(stub)
            assert stream.streams_opened >= 2 and second.coordinator.streamed == 1
        finally:
            second.close()
    finally:
        channel.close()


def test_a_service_without_client_calls_gets_every_call_once_directly():
    old = Service(streams=False)
    stub, stream, channel = _stub(old.address)
    try:
        futures = [stub.EndTxn.future(_end("t", e), timeout=5) for e in range(10)]
        assert [f.result(5).producer_epoch for f in futures] == list(range(1, 11))
        assert stub.EndTxn(_end("t", 20), timeout=5).producer_epoch == 21
        assert stream.direct_only and stream.streams_opened == 1
        assert old.coordinator.direct == 11 and old.coordinator.streamed == 0
    finally:
        channel.close()
        old.close()


def test_large_requests_go_directly(service):
    stub, stream, channel = _stub(service.address)
    try:
        big = "x" * (_streams.STREAMED_MAX_BYTES + 1)
        assert stub.EndTxn(_end(big, 1), timeout=5).producer_epoch == 2
        assert stub.EndTxn.future(_end(big, 2), timeout=5).result(5).producer_epoch == 3
        assert service.coordinator.direct == 2 and stream.streams_opened == 0
    finally:
        channel.close()


def test_an_idle_stream_ends_and_the_next_call_opens_another(service, monkeypatch):
    monkeypatch.setattr(_streams, "STREAM_IDLE_S", 0.2)
    monkeypatch.setattr(_streams, "_POLL_S", 0.05)
    stub, stream, channel = _stub(service.address)
    try:
        assert stub.EndTxn(_end("t"), timeout=5).producer_epoch == 1
        opened = stream._stream
        wait_for(lambda: opened.ended and not opened.reader.is_alive(), 5, "the idle stream to end")
        assert stub.EndTxn(_end("t", 1), timeout=5).producer_epoch == 2
        assert stream.streams_opened == 2
    finally:
        channel.close()


def test_closing_the_channel_fails_the_calls_in_flight(service):
    stub, stream, channel = _stub(service.address)
    hanging = stub.EndTxn.future(_end("hang"), timeout=30)
    wait_for(lambda: service.coordinator.streamed == 1, 5, "the hanging call to arrive")
    channel.close()
    with pytest.raises((grpc.RpcError, concurrent.futures.CancelledError)) as closed:
        hanging.result(10)
    if isinstance(closed.value, grpc.RpcError):
        assert closed.value.code() == grpc.StatusCode.CANCELLED


def test_the_stream_carries_only_the_transaction_path(service):
    """A method outside client_calls.CARRIED, or a stream method, sent on Client/Calls
    by hand: answered with an error under its correlation id, and the stream serves on."""
    channel = grpc.insecure_channel(service.address)
    try:
        calls = pbg.ClientStub(channel).Calls

        def one(method: str, request) -> pb.TunneledReply:
            message = pb.TunneledCalls(calls=[pb.TunneledCall(correlation_id=5, method=method,
                                                              request=request.SerializeToString())])
            [reply] = next(iter(calls(iter([message]), timeout=5))).replies
            return reply
        listed = one("/exactly.v1.TransactionCoordinator/ListTransactions", pb.ListTransactionsRequest())
        assert (listed.correlation_id, listed.status_code) == (5, grpc.StatusCode.UNIMPLEMENTED.value[0])
        assert "call it directly" in listed.status_details
        itself = one("/exactly.v1.Client/Calls", pb.TunneledCalls())
        assert itself.status_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        ended = one("/exactly.v1.TransactionCoordinator/EndTxn", _end("t", 1))
        assert ended.status_code == 0 and pb.EndTxnResponse.FromString(ended.response).producer_epoch == 2
        assert service.coordinator.direct == 0
    finally:
        channel.close()


# ------------------------------------------------------------------ links (Client/Attach)

def test_calls_go_on_a_link_once_it_is_set_up_and_answer_like_direct_ones(linked):
    stub, stream, channel = _linked_stub(linked)
    try:
        read_before = linked.servicer.messages_read
        futures = [stub.EndTxn.future(_end("t", e), timeout=5) for e in range(40)]
        assert [f.result(5).producer_epoch for f in futures] == list(range(1, 41))
        with pytest.raises(grpc.RpcError) as denied:
            stub.EndTxn(_end("deny"), timeout=5)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert denied.value.details() == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED: deny"
        assert isinstance(stream._stream, _streams._LinkedStream)
        assert stream.streams_opened == 1 and stream.links_opened == 1
        assert linked.coordinator.streamed == 1 + 40 + 1 and linked.coordinator.direct == 0
        assert linked.servicer.messages_read - read_before <= 40 + 1  # frames on the link
    finally:
        stream.close()
        channel.close()
    wait_for(lambda: linked.link.client_links == 0, 10, "the closed client's link to end on the service")


def test_a_principal_past_its_bound_stays_on_its_stream():
    service = Service(links={"max_client_links_per_principal": 1})
    try:
        first, first_stream, first_channel = _linked_stub(service)
        second, second_stream, second_channel = _stub(service.address, link=True)
        try:
            assert second.EndTxn(_end("t", 1), timeout=5).producer_epoch == 2
            wait_for(lambda: second_stream._link_at > 0, 10, "the second link to be refused")
            assert second_stream.links_opened == 0 and service.link.client_links == 1
            assert second.EndTxn(_end("t", 2), timeout=5).producer_epoch == 3  # on its gRPC stream
            assert first.EndTxn(_end("t", 3), timeout=5).producer_epoch == 4  # on its link
        finally:
            for closing in (second_stream, second_channel, first_stream, first_channel):
                closing.close()
    finally:
        service.close()


def test_a_service_offering_no_link_answers_on_the_stream(service):
    """A service without a link port (or of a version without Client/Attach: the same
    LinkUnavailable) leaves the calls on the gRPC stream and is asked again later."""
    stub, stream, channel = _stub(service.address, link=True)
    try:
        assert stub.EndTxn(_end("t"), timeout=5).producer_epoch == 1
        wait_for(lambda: stream._link_at > 0, 10, "the link set-up to give up")
        futures = [stub.EndTxn.future(_end("t", e), timeout=5) for e in range(10)]
        assert [f.result(5).producer_epoch for f in futures] == list(range(1, 11))
        assert stream.links_opened == 0 and isinstance(stream._stream, _streams._Stream)
    finally:
        stream.close()
        channel.close()


def test_a_broken_link_fails_its_calls_and_the_next_call_links_again():
    first = Service(links={})
    stub, stream, channel = _linked_stub(first)
    try:
        hanging = stub.EndTxn.future(_end("hang"), timeout=30)
        wait_for(lambda: first.coordinator.streamed == 2, 5, "the hanging call to arrive")
        first.run(first.link.stop())  # the link goes away with the call in flight
        with pytest.raises(grpc.RpcError) as broken:
            hanging.result(10)
        assert broken.value.code() == grpc.StatusCode.UNAVAILABLE
        assert isinstance(translate_rpc_error(broken.value), errors.NetworkException)
        first.link = None
        first.close()
        second = Service(port=first.port, links={})
        try:
            _answered_once_restarted(stub)
            wait_for(lambda: stream.links_opened == 2 and second.link.client_links == 1, 10, "a new link")
            assert stub.EndTxn(_end("t", 9), timeout=5).producer_epoch == 10
        finally:
            second.close()
    finally:
        stream.close()
        channel.close()


def test_a_call_timing_out_on_a_silent_link_drops_it(linked, monkeypatch):
    """A link on which nothing was read for LINK_SILENCE_S when a call times out (a
    service stopped or cut off) is dropped; a call with a short timeout on a link that
    answers keeps it."""
    stub, stream, channel = _linked_stub(linked)
    try:
        link = stream._stream
        with pytest.raises(grpc.RpcError) as late:
            stub.EndTxn(_end("hang"), timeout=0.3)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert not link.ended  # something was read within LINK_SILENCE_S
        monkeypatch.setattr(_streams, "LINK_SILENCE_S", 0.0)
        with pytest.raises(grpc.RpcError) as silent:
            stub.EndTxn.future(_end("hang"), timeout=0.3).result(5)
        assert silent.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_for(lambda: link.ended and not link.reader.is_alive(), 10, "the silent link to be dropped")
        monkeypatch.setattr(_streams, "LINK_SILENCE_S", 10.0)
        linked.coordinator.release.set()
        assert stub.EndTxn(_end("t", 4), timeout=5).producer_epoch == 5
        wait_for(lambda: stream.links_opened == 2, 10, "a new link")
    finally:
        stream.close()
        channel.close()


def test_an_idle_link_ends_and_the_next_call_opens_another(linked, monkeypatch):
    monkeypatch.setattr(_streams, "STREAM_IDLE_S", 0.2)
    monkeypatch.setattr(_streams, "_POLL_S", 0.05)
    stub, stream, channel = _linked_stub(linked)
    try:
        link = stream._stream
        wait_for(lambda: link.ended and not link.reader.is_alive(), 5, "the idle link to end")
        wait_for(lambda: linked.link.client_links == 0, 10, "the service to see it end")
        assert stub.EndTxn(_end("t", 1), timeout=5).producer_epoch == 2
        wait_for(lambda: stream.links_opened == 2, 10, "a new link")
    finally:
        stream.close()
        channel.close()


def test_closing_the_client_fails_the_calls_in_flight_on_a_link(linked):
    stub, stream, channel = _linked_stub(linked)
    hanging = stub.EndTxn.future(_end("hang"), timeout=30)
    wait_for(lambda: linked.coordinator.streamed == 2, 5, "the hanging call to arrive")
    stream.close()
    channel.close()
    with pytest.raises(grpc.RpcError) as closed:
        hanging.result(10)
    assert closed.value.code() == grpc.StatusCode.UNAVAILABLE
    linked.loop.call_soon_threadsafe(linked.coordinator.release.set)  # the call the link had in flight ends
    wait_for(lambda: linked.link.client_links == 0, 10, "the link to end on the service")


def test_an_sdk_link_carries_the_transaction_path_only_and_bounds_its_frames(linked):
    """A raw link set up with a Client/Attach ticket: a method outside client_calls.CARRIED
    is answered UNIMPLEMENTED and the link serves on; a frame above the SDK links' bound
    (far below socket.request.max.bytes) closes it, counted, and the service serves on."""
    channel = grpc.insecure_channel(linked.address)
    try:
        answer = pbg.ClientStub(channel).Attach(pb.TunnelAttachRequest(), timeout=5)
        assert answer.port == linked.link.port and len(answer.ticket) == TICKET_BYTES
        with socket.create_connection(("127.0.0.1", answer.port), timeout=5) as sock:
            sock.sendall(answer.ticket)
            assert sock.recv(1) == ACK

            def one(method: str, request) -> pb.TunneledReply:
                body = pb.TunneledCalls(calls=[pb.TunneledCall(correlation_id=3, method=method,
                                                               request=request.SerializeToString())])
                sock.sendall(HEADER.pack(body.ByteSize()) + body.SerializeToString())
                (size,) = HEADER.unpack(_read(sock, HEADER.size))
                [reply] = pb.TunneledReplies.FromString(_read(sock, size)).replies
                return reply
            listed = one("/exactly.v1.TransactionCoordinator/ListTransactions", pb.ListTransactionsRequest())
            assert listed.status_code == grpc.StatusCode.UNIMPLEMENTED.value[0]
            ended = one("/exactly.v1.TransactionCoordinator/EndTxn", _end("t", 1))
            assert pb.EndTxnResponse.FromString(ended.response).producer_epoch == 2
            sock.sendall(HEADER.pack(link_module.MAX_CLIENT_FRAME_BYTES + 1))
            assert sock.recv(1) == b""  # closed before anything more is read
        assert linked.link.refused == {"socket.request.max.bytes": 1}
        wait_for(lambda: linked.link.client_links == 0, 5, "the oversized frame's link to close")
        stub, stream, streamed = _linked_stub(linked)  # the service serves on
        stream.close()
        streamed.close()
    finally:
        channel.close()


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = sock.recv(size - len(data))
        assert more, "the link closed"
        data += more
    return data


def test_on_a_link_requests_up_to_its_bound_go_there_and_larger_ones_directly(linked):
    """A gRPC stream carries requests up to STREAMED_MAX_BYTES; a link up to
    LINKED_MAX_BYTES (bulk producing's batches: a frame costs its bytes, TCP carries it);
    larger ones are direct calls either way."""
    stub, stream, channel = _linked_stub(linked)
    try:
        big = "x" * (_streams.STREAMED_MAX_BYTES + 1)
        assert stub.EndTxn(_end(big, 1), timeout=5).producer_epoch == 2
        assert stub.EndTxn.future(_end(big, 2), timeout=5).result(5).producer_epoch == 3
        assert linked.coordinator.direct == 0 and linked.coordinator.streamed == 1 + 2
        huge = "x" * (_streams.LINKED_MAX_BYTES + 1)
        assert stub.EndTxn(_end(huge, 3), timeout=5).producer_epoch == 4
        assert linked.coordinator.direct == 1
    finally:
        stream.close()
        channel.close()


def test_a_future_never_waits_for_room_on_a_link_the_service_stopped_reading(linked):
    """The service holds its 32 calls in flight and reads nothing more: the socket fills,
    a thread of the link's own takes the writing over, and `.future()` returns at once
    (the calls wait in the outbox, each for its own deadline) instead of in a write."""
    stub, stream, channel = _linked_stub(linked)
    big = pb.EndTxnRequest(transactional_id="x" * 30000, producer_id=7, producer_epoch=0, committed=True)
    try:
        held = [stub.EndTxn.future(_end("hang"), timeout=60) for _ in range(40)]
        wait_for(lambda: linked.coordinator.streamed == 1 + 32, 10, "the service's slots to fill")

        def flusher() -> bool:
            return any(t.name == "exactly-link-writer" and t.is_alive() for t in threading.enumerate())

        def flood() -> bool:  # queue calls until the socket is full and the link's own thread writes
            for _ in range(50):
                stub.EndTxn.future(big, timeout=60)
            return flusher()
        wait_for(flood, 30, "the socket to fill")
        returned = concurrent.futures.ThreadPoolExecutor(1).submit(lambda: stub.EndTxn.future(big, timeout=60))
        assert returned.result(5).done() is False  # queued, not written, and the caller is free
        assert flusher() and len(stream._stream.outbox) > 0
        linked.loop.call_soon_threadsafe(linked.coordinator.release.set)  # the service reads again
        assert [f.result(30).producer_epoch for f in held] == [1] * 40
        assert returned.result().result(30).producer_epoch == 1
    finally:
        stream.close()
        channel.close()


def test_a_call_sent_again_on_the_next_stream_is_timed_once(service):
    """A future that meets a stream as it is retired (a link took over) goes on the next
    one and keeps its one entry in the deadline timer, which lets go of it once answered."""
    stub, stream, channel = _stub(service.address)
    try:
        assert stub.EndTxn(_end("t"), timeout=5).producer_epoch == 1
        retiring = stream._stream
        sent = retiring.send

        def retired_meanwhile(call) -> bool:
            retiring.send = sent
            retiring.retire()
            return sent(call)
        retiring.send = retired_meanwhile
        held = len(_streams._TIMER)
        assert stub.EndTxn.future(_end("t", 1), timeout=60).result(5).producer_epoch == 2
        assert stream.streams_opened == 2
        wait_for(lambda: len(_streams._TIMER) == held, 5, "the timer to let go of the answered call")
    finally:
        channel.close()
