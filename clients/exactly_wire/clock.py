"""The two clocks of Exactly, in integer milliseconds; one definition each.

- `wall_clock_ms()`: milliseconds since the Unix epoch. For what is stored or sent:
  record timestamps, transaction start and last-update timestamps in the transaction
  log, producer-state timestamps (they survive restarts and move between hosts, so
  they may step backwards; code comparing them tolerates that).
- `monotonic_ms()`: a clock that never steps backwards, with an arbitrary origin.
  For timers inside one process: linger, backoff, session and rebalance timeouts,
  request deadlines, leases.

Domain objects take a clock as an argument (`clock: Callable[[], int] = monotonic_ms`
or `wall_clock_ms`) so unit tests drive time by hand.
"""
from __future__ import annotations

import time
from typing import Callable

Clock = Callable[[], int]


def wall_clock_ms() -> int:
    """Milliseconds since the Unix epoch (time.time_ns, truncated)."""
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    """Milliseconds of a monotonic clock with an arbitrary origin (time.monotonic_ns)."""
    return time.monotonic_ns() // 1_000_000


__all__ = ["Clock", "wall_clock_ms", "monotonic_ms"]
