"""The SDK's clients on a test's clock: `on_clock(Producer, time)(conf, transport=cluster)`
is a Producer (or Consumer) whose client core, and so everything the client owns (sender,
accumulator, fetcher, group membership, waits and backoffs), reads and waits on `time`
(an exactly.testing.MockTime)."""
from __future__ import annotations

from exactly_wire.clock import MonotonicClock


def on_clock(client_cls: type, clock: MonotonicClock) -> type:
    """`client_cls` (Producer, Consumer: a class with `_make_core`) with its client core, and so
    everything the client owns, on `clock`."""
    make_core = client_cls._make_core

    class OnClock(client_cls):
        def _make_core(self, settings, transport=None):
            core = make_core(self, settings, transport)
            core.clock = clock
            return core

    OnClock.__name__ = client_cls.__name__
    return OnClock
