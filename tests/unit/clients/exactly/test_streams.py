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
import threading
import weakref

import grpc
import pytest
from waiting import wait_for

from exactly import _streams, errors
from exactly._client import translate_rpc_error
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.common.transport.guard import RequestGuard
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

    def __init__(self, streams: bool = True, port: int = 0):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.coordinator = Coordinator()
        self.streams = streams
        self.servicer: TunnelServicer | None = None
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
        return server, bound

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.coordinator.release.set)
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


def _stub(address: str):
    channel = grpc.insecure_channel(address)
    stream = _streams.CallStream(channel)
    return pbg.TransactionCoordinatorStub(_streams.StreamingChannel(channel, stream)), stream, channel


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
            def answered() -> bool:
                try:
                    return stub.EndTxn(_end("t", 8), timeout=2).producer_epoch == 9
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                    return False
            wait_for(answered, 20, "a call to the restarted service to be answered")
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
