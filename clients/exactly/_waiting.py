"""Rate-limited WARNINGs of what a client is waiting for (no I/O).

A send() that waits for the metadata of a topic the cluster does not know, or a poll()
that returns nothing because no service answers, the subscribed topic does not exist or
a partition has no leader, would otherwise be silent until its bound passes (or, for
poll(), for ever). Kafka's clients log such waits at WARN ("Error while fetching metadata
... UNKNOWN_TOPIC_OR_PARTITION"); the SDK logs one WARNING per condition once it has lasted
`FIRST_WARNING_MS`, then at most one every `WARNING_INTERVAL_MS` while it lasts, with how
many were left out, on the client's clock (so unit tests drive it without waiting).
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from exactly_wire.clock import Clock

# A condition is reported once it has lasted this many ms (a topic being created, a
# leader moving, takes less), then at most once per WARNING_INTERVAL_MS while it lasts.
FIRST_WARNING_MS = 1000
WARNING_INTERVAL_MS = 10000

Message = Callable[[], str]


class WaitWarnings:
    """What one client waits for, by condition key (e.g. "topic:invoices"): `waiting(key,
    message)` each time the client finds itself waiting on it, `resolved(key)` once it no
    longer does (or `only(keys)`: every other condition resolved). `message()` is built only
    when a line is logged. `clock`: the client's monotonic clock (ms). Thread-safe."""

    def __init__(self, logger: logging.Logger, clock: Clock, first_ms: int = FIRST_WARNING_MS,
                 interval_ms: int = WARNING_INTERVAL_MS):
        self._log = logger
        self._clock = clock
        self._first_ms = first_ms
        self._interval_ms = interval_ms
        self._lock = threading.Lock()
        self._since: dict[str, int] = {}
        self._logged: dict[str, int] = {}
        self._quiet: dict[str, int] = {}

    def waiting(self, key: str, message: Message) -> bool:
        """Note that the client waits on `key`; log `message()` at WARNING when the
        condition has lasted `first_ms` and nothing was logged for it in the last
        `interval_ms`. Returns True when a line was logged."""
        now = self._clock()
        with self._lock:
            since = self._since.setdefault(key, now)
            if now - since < self._first_ms:
                return False
            last = self._logged.get(key)
            if last is not None and now - last < self._interval_ms:
                self._quiet[key] = self._quiet.get(key, 0) + 1
                return False
            self._logged[key] = now
            quiet = self._quiet.pop(key, 0)
        more = f"; {quiet} more such waits since the last message" if quiet else ""
        self._log.warning("%s (waiting for %.1f s%s)", message(), (now - since) / 1000.0, more)
        return True

    def resolved(self, key: str) -> None:
        """The client no longer waits on `key`: a later wait on it counts from its start."""
        with self._lock:
            self._since.pop(key, None)
            self._logged.pop(key, None)
            self._quiet.pop(key, None)

    def only(self, keys: set[str]) -> None:
        """Every condition but `keys` is resolved."""
        with self._lock:
            for key in [k for k in self._since if k not in keys]:
                self._since.pop(key, None)
                self._logged.pop(key, None)
                self._quiet.pop(key, None)


__all__ = ["WaitWarnings", "FIRST_WARNING_MS", "WARNING_INTERVAL_MS"]
