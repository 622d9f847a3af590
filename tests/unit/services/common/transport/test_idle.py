"""IdleTimer: a connection's idle deadline without a timer per read (services/common/transport/idle.py)."""
import asyncio
import gc
import weakref

import pytest

from services.common.transport.idle import IdleTimer, drain_within


class _Handle:
    def __init__(self, when, callback):
        self._when, self.callback, self.cancelled = when, callback, False

    def when(self):
        return self._when

    def cancel(self):
        self.cancelled = True


class _ManualLoop:
    """The two loop methods IdleTimer uses, on a clock the test moves (`advance`), which
    runs the callbacks that fall due; `scheduled` counts the handles made."""

    def __init__(self):
        self.now = 0.0
        self.handles: list[_Handle] = []
        self.scheduled = 0

    def time(self):
        return self.now

    def call_at(self, when, callback):
        self.scheduled += 1
        handle = _Handle(when, callback)
        self.handles.append(handle)
        return handle

    def advance(self, seconds: float) -> None:
        self.now += seconds
        while due := [h for h in self.handles if not h.cancelled and h.when() <= self.now]:
            for h in due:
                self.handles.remove(h)
                h.callback()

    @property
    def pending(self) -> int:
        return sum(not h.cancelled for h in self.handles)


def test_an_armed_deadline_expires_once_and_says_what_waited():
    loop = _ManualLoop()
    calls = []
    timer = IdleTimer(loop, lambda: calls.append(timer.what))
    timer.arm(loop.time() + 0.05, "no request")
    loop.advance(0.04)
    assert calls == [] and not timer.expired
    loop.advance(0.02)
    assert calls == ["no request"] and timer.expired
    loop.advance(10)  # nothing re-armed: no second expiry, no handle left
    assert calls == ["no request"] and loop.pending == 0


def test_a_busy_connection_never_expires_and_costs_one_handle_per_idle_period():
    loop = _ManualLoop()
    expired = []
    timer = IdleTimer(loop, lambda: expired.append(True))
    for _ in range(500):  # a read every 1 ms for 0.5 s against a 0.2 s deadline
        timer.arm(loop.time() + 0.2, "no request")
        loop.advance(0.001)
        timer.disarm()
    assert not expired and not timer.expired
    # one handle at the first arm, then one each time it fired early and slept on
    assert loop.scheduled == 3, loop.scheduled
    timer.close()
    assert loop.pending == 0


def test_a_closed_timer_lets_go_of_its_callback_so_the_connection_is_freed_without_a_collection():
    # As the Kafka listener's: the callback closes over the connection and the timer
    # itself, a cycle; once the timer is closed, the connection goes with its last reference.
    loop = _ManualLoop()

    def serve() -> weakref.ref:
        connection = _Connection()

        def on_expiry():
            connection.abort(timer)
        timer = IdleTimer(loop, on_expiry)
        timer.arm(loop.time() + 60, "no request")
        timer.close()
        return weakref.ref(connection)
    gc.collect()
    gc.disable()
    try:
        freed = serve()
        assert freed() is None
    finally:
        gc.enable()
    assert loop.pending == 0


class _Connection:
    def abort(self, timer):
        pass


def test_a_disarmed_timer_does_not_expire():
    loop = _ManualLoop()
    expired = []
    timer = IdleTimer(loop, lambda: expired.append(True))
    timer.arm(loop.time() + 0.05)
    timer.disarm()
    loop.advance(0.15)  # the handle fires and finds nothing armed
    assert not expired and not timer.expired and loop.pending == 0


def test_an_earlier_deadline_than_the_handle_is_kept():
    async def main():
        loop = asyncio.get_running_loop()
        fired = asyncio.Event()
        timer = IdleTimer(loop, fired.set)
        timer.arm(loop.time() + 60, "idle")
        timer.disarm()
        started = loop.time()
        timer.arm(started + 0.05, "authentication")  # earlier than the 60 s handle
        await asyncio.wait_for(fired.wait(), 5)
        assert loop.time() - started < 5 and timer.what == "authentication"
    asyncio.run(main())


def test_the_expiry_may_arm_again_from_its_callback():
    """A link with a call in flight is held open: the expiry arms another period."""
    async def main():
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        held = []

        def expired():
            held.append(loop.time())
            if len(held) < 3:
                timer.arm(loop.time() + 0.03, "held")
            else:
                done.set()

        timer = IdleTimer(loop, expired)
        timer.arm(loop.time() + 0.03, "first")
        await asyncio.wait_for(done.wait(), 5)
        assert len(held) == 3 and held == sorted(held)
    asyncio.run(main())


def test_drain_within_sets_no_timer_for_an_empty_buffer_and_bounds_a_full_one():
    async def main():
        accepted = asyncio.Event()
        peers = []

        async def on_connect(reader, writer):
            peers.append((reader, writer))
            accepted.set()

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.wait_for(accepted.wait(), 5)
        writer.write(b"x")
        await drain_within(writer, 1.0)  # taken by the socket: returns at once
        writer.transport.set_write_buffer_limits(high=1)
        chunk = b"y" * (1 << 20)
        with pytest.raises(TimeoutError):  # the peer reads nothing: the buffer stays full
            for _ in range(64):
                writer.write(chunk)
                await drain_within(writer, 0.2)
        writer.transport.abort()
        peers[0][1].transport.abort()
        server.close()
        await server.wait_closed()
    asyncio.run(main())
