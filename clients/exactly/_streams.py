"""The blocking SDK's transaction-path calls on one `Client/Calls` stream per service
(exactly_wire.client_calls; docs/sdk.md, "Calls on one stream per service").

`StreamingChannel` stands in for a grpc.Channel where the generated stubs are made:
each method of `client_calls.CARRIED` becomes a `StreamedMethod`, whose blocking call
and `.future()` send the request as a message of the channel's stream and resolve
on its reply, matched by correlation id; every other method is the channel's own,
and so is a request larger than STREAMED_MAX_BYTES (bulk producing: its cost is its
bytes, not the call).
Pipelining is the caller's as before: the sender thread keeps up to
max.in.flight.requests.per.connection Produce requests in flight, now as messages
of one stream without waiting for each other's replies.

One `CallStream` per channel holds the current stream (opened on the first call,
again after it ended) and two threads of its own: grpcio's, which writes each
message (every call queued while the previous message was written: no linger),
and a reader, which resolves the replies. A call's outcome is what the same method
called directly would give, with the same error types (`StreamCallError` is a
grpc.RpcError with `code()` and `details()`):

- a reply: the response, or the method's status (PERMISSION_DENIED, ...);
- a stream that breaks (the service restarts, the connection drops): every call
  on it fails with the stream's status, UNAVAILABLE or CANCELLED, which the SDK
  retries as a failed direct call (a Produce resent carries the same sequence
  numbers: the leader's duplicate check answers it; KIP-98, "Idempotent producer");
- a call not answered by its timeout: DEADLINE_EXCEEDED, raised by the waiting
  thread for a blocking call, by one timer thread per process for futures;
- a service of a version without `Client/Calls` answers the stream UNIMPLEMENTED
  before reading anything: its calls are sent again as direct calls, and this
  channel makes direct calls from then on.

A stream that carried nothing for STREAM_IDLE_S ends (a half-close), so an idle
client holds no call open and the service's connections.max.idle.ms can close its
connection; the next call opens a new one.

Links (exactly._link): beside a new stream, a thread of its own sets up a link to the
service (`Client/Attach`, a TCP connection, the ticket). Once it is up new calls go there
as frames (`_LinkedStream`) and the stream is retired: it takes no new call, writes the
ones it took, half-closes, and the service ends it after answering them. A link fails its
calls as a broken stream does (UNAVAILABLE), and is dropped when a call times out after
nothing was read on it for LINK_SILENCE_S. A service that offers no link, or whose link
cannot be set up, keeps the calls on the stream; the next set-up is LINK_RETRY_S later.
"""
from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import logging
import ssl
import threading
import time
from collections import deque
from typing import Any, Callable

import grpc

from exactly_wire import client_calls
from exactly_wire.links import HEADER, LINK_RETRY_S, LINK_SILENCE_S, MAX_REPLY_FRAME_BYTES
from exactly_wire.v1 import exactly_pb2 as pb

from ._link import Connector, LinkUnavailable, Wire

log = logging.getLogger(__name__)

# Requests larger than this (bytes, serialized) go as direct calls: their cost is their
# bytes, which a stream message would copy once more, and one stream's flow-control
# window would hold back what parallel calls send at once (bulk producing).
STREAMED_MAX_BYTES = client_calls.MAX_CARRIED_REQUEST_BYTES
# On a link, requests up to this many bytes (bulk producing's batches included) go as its
# frames: TCP's own flow control carries them, and the service bounds an SDK link's frame
# at twice this (services.common.transport.link.MAX_CLIENT_FRAME_BYTES).
LINKED_MAX_BYTES = client_calls.MAX_LINKED_REQUEST_BYTES
# Seconds a stream with no call in flight stays open before it half-closes.
STREAM_IDLE_S = 60.0
# Seconds the writer and the timer thread wait at most between checks of their state.
_POLL_S = 5.0
# Seconds a link's write may stall at most (the service reads nothing) before the link is dropped.
_WRITE_STALL_S = 30.0
# Frames a caller that became a link's writer writes at most before a thread of the link's own
# takes over (other threads keep queuing): a call's own wait is not spent on others' frames.
_INLINE_FRAMES = 4


StreamCallError = client_calls.StreamedCallError  # a streamed call's failure (grpc.RpcError)


class _Call(concurrent.futures.Future):
    """One call on a stream: a concurrent.futures.Future of the response (its
    exception a grpc.RpcError), with what is needed to send it directly instead."""

    def __init__(self, method: str, request: Any, body: bytes, deserialize: Callable[[bytes], Any],
                 direct: Any, deadline: float | None, timed: bool):
        super().__init__()
        self.method, self.request, self.body, self.deserialize = method, request, body, deserialize
        # `timed`: the timer thread fails it at `deadline` (a blocking call's own thread does).
        self.direct, self.deadline, self.timed = direct, deadline, timed
        self.stream: _Stream | None = None
        self.correlation_id = 0
        self.timer_entry: list | None = None  # its entry in the timer's heap while it waits there

    def answer(self, reply: pb.TunneledReply) -> None:
        if reply.status_code == 0:
            try:
                response = self.deserialize(reply.response)
            except Exception as exc:  # noqa: BLE001 - an unreadable response is the call's failure
                self.fail(grpc.StatusCode.INTERNAL, f"unreadable {self.method} response: {exc}")
                return
            self._settle(response, None)
        else:
            self.fail(client_calls.status(reply.status_code), reply.status_details)

    def fail(self, code: grpc.StatusCode, details: str) -> None:
        self._settle(None, StreamCallError(code, details))

    def expire(self) -> None:
        """Past its deadline: DEADLINE_EXCEEDED, and its stream forgets it."""
        self.fail(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        if self.stream is not None:
            self.stream.forget(self)

    def _settle(self, response: Any, error: BaseException | None) -> None:
        self.request = self.body = None  # nothing to resend any more
        try:
            if error is None:
                self.set_result(response)
            else:
                self.set_exception(error)
        except concurrent.futures.InvalidStateError:
            pass  # cancelled or timed out meanwhile
        self._leave_timer()

    def cancel(self) -> bool:
        cancelled = super().cancel()
        if cancelled:
            self._leave_timer()
        return cancelled

    def _leave_timer(self) -> None:
        """Done: the timer lets go of this call now, not at its deadline (`_Timer`).
        After the future is done, so that a concurrent `_Timer.add` either sees it
        done or has set the entry read here."""
        entry = self.timer_entry
        if entry is not None:
            self.timer_entry = None
            _TIMER.discard(entry)

    def send_directly(self) -> None:
        """Send this call as a direct call (its stream's service has no Client/Calls)."""
        timeout = None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)
        request = self.request
        if request is None or self.done():
            return
        try:
            inner = self.direct.future(request, timeout=timeout)
        except grpc.RpcError as exc:
            self._settle(None, exc)
            return
        except ValueError as exc:  # the channel closed
            self.fail(grpc.StatusCode.CANCELLED, str(exc))
            return

        def done(f) -> None:
            try:
                self._settle(f.result(), None)
            except grpc.RpcError as exc:
                self._settle(None, exc)
            except grpc.FutureCancelledError:
                self.fail(grpc.StatusCode.CANCELLED, "request cancelled")
        inner.add_done_callback(done)


class _Timer:
    """Fails futures not answered by their deadline (one thread per process, made on
    first use). A call answered earlier lets go of its entry at once (`discard`): the
    heap keeps no answered call, whose done-callbacks would hold what its caller built
    (a Produce's batches) until the deadline, growing the memory and the garbage
    collector's work with the call rate × the timeout. The entries let go of are
    dropped from the heap when they reach its front or, past half the heap, all at once.
    The thread wakes at the earliest deadline of a call still waiting (at most every
    _POLL_S), not at every call's."""

    _COMPACT_MIN = 256  # entries let go of before the heap is rebuilt without them

    def __init__(self) -> None:
        self._heap: list[list] = []  # [deadline, sequence, call or None once let go of]
        self._dropped = 0
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")  # when the thread wakes next (monotonic s)

    def add(self, call: _Call) -> None:
        """Hold `call` until its deadline; once per call (a call sent again on the next
        stream keeps its entry)."""
        entry = [call.deadline, next(self._seq), call]
        with self._cond:
            if call.done() or call.timer_entry is not None:
                return
            call.timer_entry = entry
            heapq.heappush(self._heap, entry)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="exactly-stream-deadlines", daemon=True)
                self._thread.start()
            elif call.deadline < self._wake_at:
                self._cond.notify()

    def discard(self, entry: list) -> None:
        """Let go of the call of `entry` (answered, failed or cancelled)."""
        with self._cond:
            if entry[2] is None:
                return
            entry[2] = None
            self._dropped += 1
            if self._dropped >= self._COMPACT_MIN and 2 * self._dropped > len(self._heap):
                self._heap = [e for e in self._heap if e[2] is not None]
                heapq.heapify(self._heap)
                self._dropped = 0

    def __len__(self) -> int:
        """Calls the timer holds (waiting for an answer or their deadline)."""
        with self._cond:
            return len(self._heap) - self._dropped

    def _run(self) -> None:
        while True:
            expired = []
            with self._cond:
                now = time.monotonic()
                heap = self._heap
                while heap and (heap[0][2] is None or heap[0][0] <= now):
                    entry = heapq.heappop(heap)
                    call = entry[2]
                    if call is None:
                        self._dropped -= 1
                    else:
                        entry[2] = call.timer_entry = None  # out of the heap: nothing to discard
                        expired.append(call)
                if not expired:
                    wait = min(heap[0][0] - now, _POLL_S) if heap else _POLL_S
                    self._wake_at = now + wait
                    self._cond.wait(wait)
                    self._wake_at = float("inf")
                    continue
            for call in expired:
                if not call.done():
                    call.expire()


_TIMER = _Timer()


class _Calls:
    """What a stream and a link keep alike: the calls in flight by correlation id and the
    outbox, under `cond`; `ended` once no call may be added."""

    def __init__(self, owner: "CallStream"):
        self.owner = owner
        self.cond = threading.Condition()
        self.outbox: deque[_Call] = deque()
        self.pending: dict[int, _Call] = {}
        self.ended = False
        self._ids = itertools.count(1)

    def _queue(self, call: _Call) -> bool:
        """Under `cond`: `call` in flight here, in the outbox; False once this has ended."""
        if self.ended:
            return False
        call.stream, call.correlation_id = self, next(self._ids)
        self.pending[call.correlation_id] = call
        self.outbox.append(call)
        return True

    def _next_message(self) -> tuple[list[pb.TunneledCall], float]:
        """Under `cond`: the outbox's calls for one message (client_calls.fits), those timed
        out or cancelled meanwhile left out, and their latest deadline (inf: one has none)."""
        calls, size, deadline = [], 0, 0.0
        while self.outbox:
            call = self.outbox[0]
            if calls and not client_calls.fits(len(calls), size, len(call.body or b"")):
                break
            self.outbox.popleft()
            if call.done() or call.body is None:
                continue  # timed out or cancelled before it was written
            calls.append(pb.TunneledCall(correlation_id=call.correlation_id, method=call.method, request=call.body))
            size += len(call.body)
            deadline = max(deadline, call.deadline if call.deadline is not None else float("inf"))
        return calls, deadline

    def _answer(self, message: pb.TunneledReplies) -> None:
        for reply in message.replies:
            with self.cond:
                call = self.pending.pop(reply.correlation_id, None)
            if call is not None:
                call.answer(reply)

    def _end(self) -> list[_Call]:
        """Ended: the calls left unanswered, taken from here."""
        with self.cond:
            self.ended = True
            left = list(self.pending.values())
            self.pending.clear()
            self.outbox.clear()
            self.cond.notify_all()
        return left

    def forget(self, call: _Call) -> None:
        with self.cond:
            self.pending.pop(call.correlation_id, None)


class _Stream(_Calls):
    """One open `Client/Calls` stream: its calls in flight by correlation id, its
    outbox, grpcio's writer (the request generator) and the reader thread."""

    def __init__(self, owner: "CallStream", open_stream: Callable[..., Any]):
        super().__init__(owner)
        self.call = open_stream(self._messages())
        self.reader = threading.Thread(target=self._read, name="exactly-stream-reader", daemon=True)
        self.reader.start()

    def send(self, call: _Call) -> bool:
        """Queue `call` for the next message; False when this stream has ended."""
        with self.cond:
            if not self._queue(call):
                return False
            self.cond.notify()
        return True

    def retire(self) -> None:
        """Take no new call; half-close once the calls taken are written (the service
        answers them, then ends the stream)."""
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def cancel(self) -> None:
        self.call.cancel()

    def _messages(self):
        """The stream's messages, as grpcio's writer thread asks for them: every call
        queued, up to what one message carries; ends after STREAM_IDLE_S without a
        call in flight, or once the stream ended."""
        idle_since = time.monotonic()
        while True:
            with self.cond:
                while not self.outbox and not self.ended:
                    if self.pending:
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since >= STREAM_IDLE_S:
                        self.ended = True  # nothing more is sent on it: new calls open a new stream
                        return
                    self.cond.wait(_POLL_S)
                if self.ended and not self.outbox:
                    return  # ended, or retired with every call it took written
                calls, _ = self._next_message()
                idle_since = time.monotonic()
            if calls:
                yield pb.TunneledCalls(calls=calls)

    def _read(self) -> None:
        code, details = grpc.StatusCode.UNAVAILABLE, "the stream ended"
        try:
            for message in self.call:
                self._answer(message)
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
            details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
        except Exception as exc:  # noqa: BLE001 - e.g. an unreadable message: the stream is over
            code, details = grpc.StatusCode.INTERNAL, f"Client/Calls stream failed: {exc!r}"
        self.owner.ending(self, code)  # before the stream shows ended: no new stream after an UNIMPLEMENTED
        self.owner.ended(self, code, details, self._end())


class _LinkedStream(_Calls):
    """The same calls on a link (exactly._link): `send`, `forget`, `ended`, `cancel` as
    a `_Stream`'s. The thread that queues a call while no other writes becomes the
    writer: it writes every call queued meanwhile, up to what one frame carries, until
    none is left, without ever waiting for room: when the socket is full the rest goes
    to a thread of its own (`_flush`), which writes on. One reader thread resolves the
    replies. The link ends when it breaks, when the socket takes nothing by the latest
    deadline of the calls being written (at most _WRITE_STALL_S: the service stopped
    reading), after STREAM_IDLE_S without a call in flight, and when a call times out
    after nothing at all was read on it for LINK_SILENCE_S (a service stopped or cut off)."""

    def __init__(self, owner: "CallStream", wire: Wire):
        super().__init__(owner)
        self.wire = wire
        self.last_read = self._last_call = time.monotonic()
        self._writing = False
        self._why = ""
        self.reader = threading.Thread(target=self._read, name="exactly-link-reader", daemon=True)
        self.reader.start()

    def send(self, call: _Call) -> bool:
        with self.cond:
            if not self._queue(call):
                return False
            self._last_call = time.monotonic()
            if self._writing:
                return True  # the writer takes it with the calls queued before it
            self._writing = True
        self._write()
        return True

    def _write(self, inline: bool = True) -> None:
        frames = 0
        while True:
            if inline and frames == _INLINE_FRAMES:
                self._hand_over()  # others keep queuing: a caller writes a few frames at most
                return
            frames += 1
            with self.cond:
                calls, deadline = self._next_message() if not self.ended else ([], 0.0)
                if not calls:
                    self._writing = False
                    return
            body = pb.TunneledCalls(calls=calls).SerializeToString()
            try:
                rest = self.wire.send_some(self.wire.encode(HEADER.pack(len(body)) + body))
            except (OSError, ssl.SSLError, ValueError) as exc:
                self._write_failed(exc)
                return
            if rest:
                self._hand_over(bytes(rest), deadline)  # the socket is full: no caller waits for room
                return

    def _hand_over(self, rest: bytes = b"", deadline: float = 0.0) -> None:
        """The writing goes on in a thread of the link's own (`_flush`)."""
        threading.Thread(target=self._flush, args=(rest, deadline), name="exactly-link-writer", daemon=True).start()

    def _flush(self, rest: bytes, deadline: float) -> None:
        """The writer, while the socket takes nothing: send `rest` within the latest
        deadline of its calls (at most _WRITE_STALL_S, at least 1 s), else drop the link."""
        try:
            self.wire.send_all(rest, min(max(deadline - time.monotonic(), 1.0), _WRITE_STALL_S))
        except (OSError, ssl.SSLError, ValueError) as exc:
            self._write_failed(exc)
            return
        self._write(inline=False)

    def _write_failed(self, exc: BaseException) -> None:
        with self.cond:
            self._writing = False
        self.abort(f"the link broke while writing: {exc!r}")

    def forget(self, call: _Call) -> None:
        super().forget(call)
        silent_s = time.monotonic() - self.last_read
        if silent_s >= LINK_SILENCE_S:
            self.abort(f"nothing read on the link for {silent_s:.0f} s")

    def abort(self, why: str) -> None:
        """End the link: its calls in flight fail UNAVAILABLE (`why`), new ones go elsewhere."""
        with self.cond:
            self.ended = True
            self._why = self._why or why
        self.wire.abort()

    def cancel(self) -> None:
        self.abort("the client closed")

    def _read(self) -> None:
        buffer = bytearray()
        code, details = grpc.StatusCode.UNAVAILABLE, "the link closed"
        try:
            while True:
                data = self.wire.recv(_POLL_S)
                if data is None:
                    with self.cond:
                        if self.ended:
                            break
                        if not self.pending and not self.outbox \
                                and time.monotonic() - self._last_call >= STREAM_IDLE_S:
                            self.ended = True  # idle: new calls set up a new stream
                            break
                    continue
                if not data:
                    break
                self.last_read = time.monotonic()
                buffer += data
                while len(buffer) >= HEADER.size:
                    (size,) = HEADER.unpack_from(buffer)
                    if size > MAX_REPLY_FRAME_BYTES:
                        raise ValueError(f"a reply frame of {size} bytes, above {MAX_REPLY_FRAME_BYTES}")
                    if len(buffer) < HEADER.size + size:
                        break
                    message = pb.TunneledReplies.FromString(bytes(buffer[HEADER.size:HEADER.size + size]))
                    del buffer[:HEADER.size + size]
                    self._answer(message)
        except (OSError, ssl.SSLError) as exc:
            details = f"the link broke: {exc!r}"
        except Exception as exc:  # noqa: BLE001 - e.g. an unreadable frame: the link is over
            code, details = grpc.StatusCode.INTERNAL, f"Client/Calls link failed: {exc!r}"
        self.owner.ending(self, code)
        left = self._end()
        self.wire.close()
        self.owner.ended(self, code, self._why or details, left)


class CallStream:
    """The `Client/Calls` stream of one channel (module docstring). Thread-safe.
    `link`: sets up a link to the service (exactly._link.Connector), or None for none."""

    def __init__(self, channel: grpc.Channel, link: Connector | None = None):
        self._open = channel.stream_stream(client_calls.CLIENT_CALLS_METHOD,
                                           request_serializer=pb.TunneledCalls.SerializeToString,
                                           response_deserializer=pb.TunneledReplies.FromString)
        self._lock = threading.Lock()
        self._stream: _Stream | _LinkedStream | None = None
        self._link = link
        self._link_at = 0.0  # monotonic s before which no link is set up (after one could not be)
        self._linking = False
        self._closed = False
        self.direct_only = False  # the service answered Client/Calls UNIMPLEMENTED
        self.streams_opened = 0
        self.links_opened = 0

    def submit(self, call: _Call) -> _Call:
        """Send `call` on the current stream (opening one if needed), or directly once
        the service is known to have no Client/Calls."""
        while True:
            with self._lock:
                if self.direct_only:
                    stream = None
                else:
                    stream = self._stream
                    if stream is None or stream.ended:
                        stream = self._stream = _Stream(self, self._open)
                        self.streams_opened += 1
                    if isinstance(stream, _Stream):
                        self._link_beside()
            if stream is None:
                call.send_directly()
                return call
            if call.timed and call.deadline is not None:
                _TIMER.add(call)
            if stream.send(call):
                return call

    def max_request_bytes(self) -> int:
        """The largest request (bytes) sent on this channel's stream rather than directly:
        LINKED_MAX_BYTES while a link carries the calls (a frame on TCP costs its bytes
        and no more; a gRPC message of that size costs HTTP/2 framing and flow-control
        round trips), STREAMED_MAX_BYTES on a gRPC stream."""
        stream = self._stream
        return LINKED_MAX_BYTES if isinstance(stream, _LinkedStream) and not stream.ended else STREAMED_MAX_BYTES

    def _link_beside(self) -> None:
        """Under the lock, with a gRPC stream current: set a link up on a thread of its
        own when one is due; the calls go on the stream meanwhile."""
        if self._link is None or self._linking or self._closed or time.monotonic() < self._link_at:
            return
        self._linking = True
        threading.Thread(target=self._set_up_link, name="exactly-link-setup", daemon=True).start()

    def _set_up_link(self) -> None:
        """Set up a link; once up, new calls go there and the gRPC stream is retired
        (it answers the calls it took). One that cannot be set up is tried again
        LINK_RETRY_S later."""
        linked = None
        try:
            linked = _LinkedStream(self, self._link.connect())
        except LinkUnavailable as exc:
            log.debug("no link to %s (%s): calls stay on the gRPC stream for %.0f s", self._link.host, exc,
                      LINK_RETRY_S)
        with self._lock:
            self._linking = False
            if linked is None:
                self._link_at = time.monotonic() + LINK_RETRY_S
                return
            if self._closed or self.direct_only:
                old = None
            else:
                old, self._stream = self._stream, linked
                self.links_opened += 1
        if old is None:
            linked.cancel()
        elif isinstance(old, _Stream):
            old.retire()

    def ending(self, stream: _Stream | _LinkedStream, code: grpc.StatusCode) -> None:
        """The reader's report that `stream` ended with `code` (its calls not failed yet)."""
        with self._lock:
            if self._stream is stream:
                self._stream = None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                self.direct_only = True

    def ended(self, stream: _Stream, code: grpc.StatusCode, details: str, left: list[_Call]) -> None:
        """The reader's report of a stream's end with `left` calls unanswered."""
        for call in left:
            if code == grpc.StatusCode.UNIMPLEMENTED:
                call.send_directly()  # refused before the service read anything
            else:
                call.fail(code, details)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()


class StreamedMethod:
    """A method of `client_calls.CARRIED` as the stub's multicallable: `m(request,
    timeout=s)` blocks for the response, `m.future(request, timeout=s)` returns a
    concurrent.futures.Future of it; failures are grpc.RpcError as for a direct call."""

    def __init__(self, stream: CallStream, method: str, direct: Any, direct_bytes: Any,
                 serialize: Callable[[Any], bytes], deserialize: Callable[[bytes], Any]):
        self._stream, self._method, self._direct, self._direct_bytes = stream, method, direct, direct_bytes
        self._serialize, self._deserialize = serialize, deserialize

    def _call(self, request: Any, body: bytes, timeout: float | None, timed: bool) -> _Call:
        deadline = None if timeout is None else time.monotonic() + timeout
        return _Call(self._method, request, body, self._deserialize, self._direct, deadline, timed)

    def __call__(self, request: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        if self._stream.direct_only or kwargs:
            return self._direct(request, timeout=timeout, **kwargs)
        body = self._serialize(request)
        if len(body) > self._stream.max_request_bytes():
            return self._direct_bytes(body, timeout=timeout)
        call = self._stream.submit(self._call(request, body, timeout, timed=False))
        try:
            return call.result(timeout)
        except concurrent.futures.TimeoutError:
            call.expire()
            return call.result(0)

    def future(self, request: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        if self._stream.direct_only or kwargs:
            return self._direct.future(request, timeout=timeout, **kwargs)
        body = self._serialize(request)
        if len(body) > self._stream.max_request_bytes():
            return self._direct_bytes.future(body, timeout=timeout)
        return self._stream.submit(self._call(request, body, timeout, timed=True))


class StreamingChannel:
    """`channel` for the generated stubs, with the methods of client_calls.CARRIED on
    `stream` (module docstring); everything else is `channel`'s."""

    def __init__(self, channel: grpc.Channel, stream: CallStream):
        self._channel, self._stream = channel, stream

    def unary_unary(self, method: str, request_serializer=None, response_deserializer=None, **kwargs: Any) -> Any:
        direct = self._channel.unary_unary(method, request_serializer=request_serializer,
                                           response_deserializer=response_deserializer, **kwargs)
        if method not in client_calls.CARRIED or request_serializer is None or response_deserializer is None:
            return direct
        direct_bytes = self._channel.unary_unary(method, request_serializer=None,
                                                 response_deserializer=response_deserializer, **kwargs)
        return StreamedMethod(self._stream, method, direct, direct_bytes, request_serializer, response_deserializer)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.unary_stream(*args, **kwargs)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.stream_unary(*args, **kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.stream_stream(*args, **kwargs)

    def close(self) -> None:
        self._stream.close()
        self._channel.close()
