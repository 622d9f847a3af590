"""Clock faults for the system tests: a service process's wall clock stepped while it
runs, or a clock that runs fast, with Debian's libfaketime (package `faketime`,
installed by scripts/setup.sh) preloaded into the process (docs/design.md, "Clocks").

    step = SteppedClock(tmp_path / "pl-0.faketime")
    cluster.service_env["pl-0"] = step.env()    # before the process starts
    step.set(+600)                               # its wall clock jumps 10 minutes ahead

- SteppedClock: the offset is read from a file (FAKETIME_TIMESTAMP_FILE, re-read at
  most every FAKETIME_CACHE_DURATION s: a step is seen within about 2 s), so
  `set(seconds)` steps the wall clock of the running process, forwards or backwards.
  FAKETIME_DONT_FAKE_MONOTONIC=1 leaves CLOCK_MONOTONIC alone, as a real NTP step does
  (without it libfaketime moves time.monotonic() by the same step: a +600 s step moved
  both time.time() and time.monotonic() of a Python process by 600 s).
- slewed_env(rate): both the wall and the monotonic clock run `rate` times as fast as
  real time (an oscillator running fast). libfaketime 0.9.10 cannot speed up the wall
  clock alone: with FAKETIME_DONT_FAKE_MONOTONIC=1 and a rate, Python's time.sleep
  fails with EINVAL (clock_nanosleep on CLOCK_MONOTONIC with an absolute time).

libfaketime wraps clock_gettime in libc; Python's time.time() / time.monotonic() call
that wrapper (the vDSO is reached only through libc), so the step reaches the
service's Python code; the system test checks it on a gauge the service sets from its
wall clock (exactly_log_cleaner_last_run_timestamp_seconds). ZooKeeper's JVM is not
touched. The library path is Debian's for x86-64.
"""
from __future__ import annotations

import pathlib

import pytest

LIBRARY = pathlib.Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
CACHE_S = 1  # how stale a step may be in the faulted process (FAKETIME_CACHE_DURATION, s)


class ClockFaultError(RuntimeError):
    """libfaketime is missing (scripts/setup.sh installs the `faketime` package)."""


def library() -> str:
    """Path of libfaketime.so.1. Raises ClockFaultError when it is not installed."""
    if not LIBRARY.exists():
        raise ClockFaultError(f"{LIBRARY} is missing: install Debian's faketime package (scripts/setup.sh does)")
    return str(LIBRARY)


class SteppedClock:
    """A wall-clock offset (s) in `path` that the processes started with `env()`
    follow while they run; starts at 0."""

    def __init__(self, path: pathlib.Path):
        self.path = pathlib.Path(path)
        self.offset_s = 0
        self.set(0)

    def env(self) -> dict[str, str]:
        """Environment variables preloading libfaketime with this file's offset
        (monotonic clock not faked)."""
        return {"LD_PRELOAD": library(), "FAKETIME_TIMESTAMP_FILE": str(self.path),
                "FAKETIME_CACHE_DURATION": str(CACHE_S), "FAKETIME_DONT_FAKE_MONOTONIC": "1"}

    def set(self, offset_s: int) -> None:
        """Step the wall clock to real time + offset_s seconds (negative: behind).
        Written atomically (rename), so a process never reads half a file."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+d}\n")
        tmp.replace(self.path)
        self.offset_s = offset_s


def slewed_env(rate: float) -> dict[str, str]:
    """Environment variables making the wall and the monotonic clock of a process run
    `rate` times as fast as real time from its start."""
    return {"LD_PRELOAD": library(), "FAKETIME": f"+0 x{rate}"}


@pytest.fixture
def clock_faults() -> str:
    """Fails the test (never skips it) when libfaketime is missing; returns its path."""
    try:
        return library()
    except ClockFaultError as exc:
        pytest.fail(str(exc))
