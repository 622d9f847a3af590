"""Idle deadlines of a connection's reads and writes without a timer per request.

A listener closes a connection that sends nothing for `connections.max.idle.ms`, and one
that does not read its replies for as long (docs/design.md, "Connections"). Bounding each
read with `asyncio.timeout` costs a timer per request: its creation, its cancellation and
the task lookups around them, a few percent of a service's CPU when requests are small and
many. Kafka's selector instead notes each connection's last activity and closes the ones
idle too long from the outside. `IdleTimer` does that for one connection: `arm(deadline)`
before a wait and `disarm()` after it only store the deadline; one timer handle per
connection fires at the earliest deadline that may have passed, finds the current one, and
either goes back to sleep until it or calls `on_expiry()` once, which closes the connection
(its waiting read then ends with the connection's error). So a connection that is busy
costs a timer handle per idle period (minutes), not per request.

`drain_within(writer, timeout_s)`: `writer.drain()` bounded by `timeout_s`, with the bound
set only when the transport holds unsent bytes (a reply the peer is slow to read): when
the socket took the whole reply there is nothing to wait for.
"""
from __future__ import annotations

import asyncio
from typing import Callable


class IdleTimer:
    """One connection's idle deadline (module docstring). `loop`: the connection's event
    loop; `on_expiry()`: called (from the loop, at most once per `arm`) when a deadline
    passed while armed; it must end the wait, e.g. by aborting the transport. `expired`:
    whether it was called since the last `arm`; `what`: the description of the wait
    given to the last `arm` (for `on_expiry`'s message)."""

    __slots__ = ("_loop", "_on_expiry", "_deadline", "_handle", "expired", "what")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_expiry: Callable[[], None]):
        self._loop = loop
        self._on_expiry = on_expiry
        self._deadline: float | None = None
        self._handle: asyncio.TimerHandle | None = None
        self.expired = False
        self.what = ""

    def arm(self, deadline: float, what: str = "") -> None:
        """Expire at `deadline` (loop time, seconds) unless disarmed before; `what`
        describes the wait."""
        self._deadline = deadline
        self.expired = False
        self.what = what
        if self._handle is None:
            self._schedule(deadline)
        elif deadline < self._handle.when():  # earlier than the handle's (an authentication deadline)
            self._handle.cancel()
            self._schedule(deadline)

    def disarm(self) -> None:
        """The wait ended: no expiry until the next `arm` (the handle stays, and finds
        nothing armed or a later deadline when it fires)."""
        self._deadline = None

    def close(self) -> None:
        """Cancel the handle and let go of `on_expiry` (the connection ended): a callback
        that closes over the connection and this timer would otherwise make a cycle that
        keeps the connection's buffers until the next full garbage collection."""
        self._deadline = None
        self._on_expiry = _ended
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self, when: float) -> None:
        self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        deadline = self._deadline
        if deadline is None:
            return
        if self._loop.time() < deadline:
            self._schedule(deadline)
            return
        self._deadline = None
        self.expired = True
        self._on_expiry()


def _ended() -> None:
    """`on_expiry` of a closed IdleTimer."""


async def drain_within(writer: asyncio.StreamWriter, timeout_s: float) -> None:
    """`writer.drain()` within `timeout_s` seconds (raises TimeoutError past it); no
    timer when the transport holds nothing unsent (module docstring)."""
    transport = writer.transport
    if not transport.get_write_buffer_size() and not transport.is_closing():
        return
    async with asyncio.timeout(timeout_s):
        await writer.drain()
