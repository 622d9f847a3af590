"""Memory a burst of connections leaves behind goes back to the system
(docs/design.md, "Connections").

Connections that never finish TLS, on either port, allocate in C: grpcio's core
(handshakers, endpoint buffers, on its own threads and so in glibc's per-thread
arenas), OpenSSL and uvloop's SSL protocol (a 256 KB read buffer each). When they
close, glibc keeps the freed memory in its arenas for the next allocations instead of
returning it, scattered between chunks still in use: 40 s of such connections left a
leader 600 MB larger for good, though nothing was allocated any more. `malloc_trim(0)`
gives back every free page of every arena (measured: 725 MB to 188 MB in one call;
0.01-0.1 ms when there is nothing to give back).

`MemoryTrim` calls it every `exactly.memory.trim.interval.ms` (default 10000; 0: never)
in a worker thread, where the C library has it (glibc; elsewhere nothing is done), and
logs what it returned when that is more than LOG_ABOVE_BYTES.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from typing import Callable

from .connections import run_every

log = logging.getLogger(__name__)

LOG_ABOVE_BYTES = 32 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """This process's resident memory in bytes (/proc/self/statm; -1 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return -1


def malloc_trim() -> Callable[[], int] | None:
    """The C library's malloc_trim(0) as a callable (-> 1 when memory was released), None
    where the C library has none (not glibc)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


class MemoryTrim:
    """Return freed heap memory to the system every `interval_s` (module docstring).
    `trim`: () -> int, the call (malloc_trim(0)); `resident`: () -> bytes."""

    def __init__(self, interval_s: float, trim: Callable[[], int],
                 resident: Callable[[], int] = resident_bytes):
        self.interval_s = interval_s
        self.trim = trim
        self.resident = resident

    @classmethod
    def from_settings(cls, settings) -> "MemoryTrim | None":
        """From exactly.memory.trim.interval.ms; None when it is 0 or the C library has no
        malloc_trim."""
        interval_ms = settings.memory_trim_interval_ms
        trim = malloc_trim() if interval_ms > 0 else None
        return cls(interval_ms / 1000, trim) if trim is not None else None

    def once(self) -> int:
        """One trim (blocking: run it in a thread); returns the bytes it gave back."""
        before = self.resident()
        self.trim()
        returned = before - self.resident() if before >= 0 else 0
        if returned > LOG_ABOVE_BYTES:
            log.info("returned %d MB of freed memory to the system", returned >> 20)
        return returned

    async def run(self) -> None:
        """Trim until cancelled; a failing trim is logged and the next one runs."""
        await run_every(self.interval_s, self.once, "malloc_trim")
