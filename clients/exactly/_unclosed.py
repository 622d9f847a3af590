"""A ResourceWarning for a client that is garbage-collected without `close()`, as
Python's sockets and files, asyncio's transports and aiokafka's clients warn.

A client records where it was created when Python runs in development mode
(`python -X dev`, PYTHONDEVMODE=1) or with asyncio's debug switch
(PYTHONASYNCIODEBUG=1, or an event loop in debug mode for the asyncio clients), and
the warning then shows that stack; otherwise it says how to see it. The warning names
the object as its `source`, so `python -X tracemalloc` adds where it was allocated.
"""
from __future__ import annotations

import os
import sys
import traceback
import warnings
from typing import Callable


def debugging(loop_debug: bool = False) -> bool:
    """Whether clients record where they are created: development mode, asyncio's
    PYTHONASYNCIODEBUG, or `loop_debug` (an asyncio client's loop.get_debug())."""
    return sys.flags.dev_mode or bool(os.environ.get("PYTHONASYNCIODEBUG")) or loop_debug


def creation_stack(loop_debug: bool = False, skip: int = 2) -> traceback.StackSummary | None:
    """The stack of the caller's caller (`skip` frames above this function: the code
    that created the client), when `debugging(loop_debug)`; else None."""
    if not debugging(loop_debug):
        return None
    return traceback.extract_stack(sys._getframe(skip))


def collected(client: object, still_open: bool, release: Callable[[], None]) -> None:
    """The `__del__` of a client: when it is `still_open`, warn (`warn_unclosed`, with
    the stack its `_created` attribute holds) and `release()` what it holds, without
    waiting or I/O (its background thread or task stops, its connections close)."""
    if still_open:
        warn_unclosed(client, getattr(client, "_created", None))
        release()


def warn_unclosed(client: object, created: traceback.StackSummary | None) -> None:
    """Warn (ResourceWarning, source `client`) that `client` was not closed, with
    where it was created when `created` holds that stack."""
    name = type(client).__name__
    message = f"unclosed {name} {client!r}: call close() or use it as a context manager"
    if created:
        message += "\n" + name + " created at (most recent call last):\n" + "".join(created.format()).rstrip()
    else:
        message += " (run Python with -X dev to see where it was created)"
    warnings.warn(message, ResourceWarning, source=client)


__all__ = ["debugging", "creation_stack", "collected", "warn_unclosed"]
