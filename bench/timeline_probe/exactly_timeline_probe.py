"""The probe of `python -m bench.txn_timeline`: wraps the methods named in `PROBES`
so that the start and the end of each call are written, with the CLOCK_MONOTONIC
time in ns (one clock for every process of the machine), to
<dir>/events-<pid>.log, one "<ns> <event>" line each. Nothing of the services
changes: the methods are wrapped from outside, in the processes the benchmark
starts (sitecustomize.py beside this file)."""
from __future__ import annotations

import functools
import importlib
import inspect
import os
import threading
import time

# (module, class, method, event name): where a transaction's steps start and end.
# The event is "<name> >" when the call starts, "<name> <" when it returns or raises.
# A name with "{internal}" is told apart by the topic of the call's entry (its third
# argument): "to an internal topic" for __transaction_state and __consumer_offsets.
PROBES: list[tuple[str, str, str, str]] = [
    ("exactly._streams", "_Stream", "send", "sdk: call queued on its stream"),
    ("exactly._streams", "_LinkedStream", "send", "sdk: call queued on its stream"),  # and written, on a link
    ("services.partition_leader.produce", "ProducePipeline", "_append_one", "leader: append of a batch{internal}"),
    ("services.partition_leader.produce", "ProducePipeline", "verify", "leader: KIP-890 add / verify"),
    ("services.partition_leader.produce", "ProducePipeline", "write_markers", "leader: WriteTxnMarkers"),
    ("services.txn_coordinator.coordinator", "TransactionCoordinator", "add_partitions_to_txn",
     "coordinator: AddPartitionsToTxn"),
    ("services.txn_coordinator.coordinator", "TransactionCoordinator", "end_txn", "coordinator: EndTxn"),
    ("services.txn_coordinator.adapters", "ClusterTxnLog", "append", "coordinator: transaction-log append"),
    ("services.txn_coordinator.adapters", "ClusterMarkerWriter", "write", "coordinator: markers of a transaction"),
]

_lock = threading.Lock()
_out = None
_originals: list[tuple[type, str, object]] = []  # what install() replaced, for uninstall()


def mark(event: str) -> None:
    """Write `event` with the current CLOCK_MONOTONIC time (ns); a no-op until install()."""
    if _out is not None:
        line = f"{time.monotonic_ns()} {event}\n"
        with _lock:
            _out.write(line)


def _wrap(fn, name: str):
    if "{internal}" in name:
        data, internal = name.format(internal=""), name.format(internal=" to an internal topic")

        @functools.wraps(fn)
        async def by_topic(self, ctx, entry, *args, **kwargs):
            which = internal if entry.topic.startswith("__") else data
            mark(which + " >")
            try:
                return await fn(self, ctx, entry, *args, **kwargs)
            finally:
                mark(which + " <")
        return by_topic
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def timed(*args, **kwargs):
            mark(name + " >")
            try:
                return await fn(*args, **kwargs)
            finally:
                mark(name + " <")
    else:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            mark(name + " >")
            try:
                return fn(*args, **kwargs)
            finally:
                mark(name + " <")
    return timed


def install(directory: str, importable_only: bool = True) -> list[str]:
    """Open <directory>/events-<pid>.log and wrap every probe whose module this
    process can import (a client has no services, the services no SDK when
    `importable_only`). Returns the events installed. Raises AttributeError when a
    named class or method does not exist (the probe list is out of date)."""
    global _out
    os.makedirs(directory, exist_ok=True)
    _out = open(os.path.join(directory, f"events-{os.getpid()}.log"), "a", buffering=1)
    installed = []
    for module, cls, method, name in PROBES:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            if importable_only:
                continue
            raise
        owner = getattr(mod, cls)
        original = owner.__dict__[method]
        _originals.append((owner, method, original))
        setattr(owner, method, _wrap(original, name))
        installed.append(name.format(internal=""))
    return installed


def uninstall() -> None:
    """Put back every method install() wrapped and close the events file."""
    global _out
    while _originals:
        owner, method, original = _originals.pop()
        setattr(owner, method, original)
    if _out is not None:
        _out.close()
        _out = None
