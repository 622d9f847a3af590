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

With that trim running, freed memory need not go back on every free as well
(`keep_freed_memory`): glibc by default gives the top of its heap back as soon as more
than about twice its largest recent chunk is free there, and serves chunks above
128 KB-32 MB from mmap, unmapped when freed. A partition leader frees and allocates
the buffers of every batch it receives (hundreds of KB each), so with those defaults
the same memory went back to the kernel and came again, page by page, hundreds of
times per MB written: on a virtual machine that backs guest memory on first touch,
about 3 µs per 4 KB page (bench/common.page_touch_us), some 15 % of the leader's CPU
per record while producing 1 KB records in 256 KB batches. Heap chunks up to
MMAP_THRESHOLD_BYTES and up to TRIM_THRESHOLD_BYTES of free heap top stay with the
process between two trims; the periodic trim still returns every free page.
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
# keep_freed_memory: chunks up to this come from the heap, not from mmap (a batch is at
# most max.message.bytes, 1 MB by default; a read of the Kafka port's, the same) ...
MMAP_THRESHOLD_BYTES = 4 << 20
# ... and up to this much free memory stays at the top of a heap until the next trim.
TRIM_THRESHOLD_BYTES = 16 << 20
# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """This process's resident memory in bytes (/proc/self/statm; -1 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return -1


def _libc_function(name: str):
    """The C library's function `name` (a ctypes function), None where it has none (not glibc)."""
    lib = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(lib) if lib else ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def malloc_trim() -> Callable[[], int] | None:
    """The C library's malloc_trim(0) as a callable (-> 1 when memory was released), None
    where the C library has none (not glibc)."""
    trim = _libc_function("malloc_trim")
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


def keep_freed_memory(mmap_threshold_bytes: int = MMAP_THRESHOLD_BYTES,
                      trim_threshold_bytes: int = TRIM_THRESHOLD_BYTES) -> bool:
    """Set glibc's malloc to serve chunks up to `mmap_threshold_bytes` from its heaps and to
    keep up to `trim_threshold_bytes` of free memory at a heap's top (mallopt
    M_MMAP_THRESHOLD, M_TRIM_THRESHOLD; module docstring), for a process whose
    MemoryTrim returns freed memory periodically. Returns whether both were set (False
    where the C library has no mallopt, or refused a value)."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold_bytes)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold_bytes))


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
