"""The faults a test injects into `exactly.testing.MockCluster`: errors that the next
requests of an RPC answer (librdkafka's mock cluster has `rd_kafka_mock_push_request_errors`
for the same purpose), and requests held until the test releases them.

An RPC is named as the services' API names it ("EndTxn", "Produce", "JoinGroup": the
methods of `exactly.v1`); a request is matched by the name of the method it arrives on.
"""
from __future__ import annotations

import collections
import concurrent.futures
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from exactly_wire.v1 import exactly_pb2 as pb

# Every RPC of the services' API, by name.
RPCS = frozenset(m.name for s in pb.DESCRIPTOR.services_by_name.values() for m in s.methods)


@dataclass(frozen=True)
class Fault:
    """One injected answer: `error` (an ErrorCode) instead of the request's own outcome;
    `applied`: the request takes effect all the same (an answer lost after the work was
    done: a retry then finds it done); `topic` / `partition`: for an RPC answered per
    partition, only requests naming them match, and only their answers carry the error."""

    error: ErrorCode
    applied: bool = False
    topic: str | None = None
    partition: int | None = None

    def covers(self, tp: TopicPartition) -> bool:
        """Whether the partition `tp` of a matched request answers the error."""
        return (self.topic is None or tp.topic == self.topic) and (self.partition is None or
                                                                   tp.partition == self.partition)


class Held:
    """A request held by `MockCluster.hold_next(rpc)`: `arrived` is set when it came
    in; `release()` lets the cluster handle it and answer (once). A held request's call
    waits, as a slow service's, up to its own timeout. `handled`: the cluster handles
    the request when it arrives and holds only its answer."""

    def __init__(self, rpc: str, handled: bool = False):
        self.rpc = rpc
        self.handled = handled
        self.arrived = threading.Event()
        self._lock = threading.Lock()
        self._released = False
        self._serve: Callable[[], None] | None = None

    def release(self) -> None:
        """Handle and answer the request now (when it has arrived; else as soon as it does)."""
        with self._lock:
            self._released = True
            serve, self._serve = self._serve, None
        if serve is not None:
            serve()

    def _arrive(self, serve: Callable[[], None]) -> None:
        with self._lock:
            now = self._released
            if not now:
                self._serve = serve
        self.arrived.set()
        if now:
            serve()


class Faults:
    """The faults queued per RPC (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: dict[str, collections.deque[Fault]] = collections.defaultdict(collections.deque)
        self._holds: dict[str, collections.deque[Held]] = collections.defaultdict(collections.deque)

    @staticmethod
    def check_rpc(rpc: str) -> None:
        if rpc not in RPCS:
            raise ValueError(f"unknown RPC {rpc!r}: one of {', '.join(sorted(RPCS))}")

    def push(self, rpc: str, faults: Iterable[Fault]) -> None:
        with self._lock:
            self._errors[rpc].extend(faults)

    def hold(self, rpc: str, handled: bool = False) -> Held:
        held = Held(rpc, handled)
        with self._lock:
            self._holds[rpc].append(held)
        return held

    def take(self, rpc: str, partitions: Iterable[TopicPartition] = ()) -> Fault | None:
        """The first fault queued for `rpc` that matches a request naming `partitions`
        (every fault matches a request of an RPC answered as a whole), removed; None."""
        wanted = list(partitions)
        with self._lock:
            queue = self._errors.get(rpc)
            for i, fault in enumerate(queue or ()):
                if (fault.topic is None and fault.partition is None) or any(fault.covers(tp) for tp in wanted):
                    del queue[i]
                    return fault
        return None

    def take_hold(self, rpc: str) -> Held | None:
        with self._lock:
            queue = self._holds.get(rpc)
            return queue.popleft() if queue else None

    def clear(self) -> None:
        with self._lock:
            self._errors.clear()
            self._holds.clear()


def follow(answer: concurrent.futures.Future, out: concurrent.futures.Future) -> None:
    """Resolve `out` as `answer` was (unless `out` is done already)."""
    if out.done():
        return
    if answer.cancelled():
        out.cancel()
    elif answer.exception() is not None:
        out.set_exception(answer.exception())
    else:
        out.set_result(answer.result())


def answer_later(held: Held, run: Callable[[], Any]) -> concurrent.futures.Future:
    """A Future of the answer `run()` gives (or raises) once `held` is released; a
    Future answer of `run` (a request that waits) is followed."""
    out: concurrent.futures.Future = concurrent.futures.Future()

    def serve() -> None:
        if out.done():
            return  # the caller gave up
        try:
            answer = run()
        except BaseException as exc:  # noqa: BLE001 - the call's failure, as the channel reports it
            out.set_exception(exc)
            return
        if not isinstance(answer, concurrent.futures.Future):
            out.set_result(answer)
            return
        out.add_done_callback(lambda o: answer.cancel() if o.cancelled() else None)
        answer.add_done_callback(lambda f: follow(f, out))

    held._arrive(serve)
    return out


__all__ = ["RPCS", "Fault", "Held", "Faults", "answer_later", "follow"]
