"""bench.txn_timeline: the steps of a lone transaction from events of several
processes (`timeline`), and the probe's list of methods (bench/timeline_probe) names
methods that exist, wrapped and put back without a trace."""
from __future__ import annotations

import asyncio
import importlib
import inspect
import sys

import pytest

from bench.txn_timeline import PROBE_DIR, SEND, read_events, timeline


def _cycle(t0_ms: float, steps: list[tuple[float, str]], pid: str = "1") -> list[tuple[int, str, str]]:
    return [(int((t0_ms + dt) * 1e6), name, pid) for dt, name in [(0.0, SEND), *steps]]


def test_steps_are_offsets_from_the_send_in_the_order_of_their_medians():
    events = []
    for i, scale in enumerate([1.0, 2.0, 3.0, 4.0]):
        events += _cycle(10.0 * i, [(0.5 * scale, "leader: verify >"), (0.2 * scale, "sdk: queued >"),
                                    (0.9 * scale, "coordinator: append >"), (1.5 * scale, "coordinator: append >")])
    events.sort()
    out = timeline(events)
    # the last transaction may be cut short by the end of the run: left out
    assert out["transactions"] == 3
    assert [row["event"] for row in out["steps"]] == [
        SEND, "sdk: queued >", "leader: verify >", "coordinator: append >", "coordinator: append > #2"]
    by_event = {row["event"]: row for row in out["steps"]}
    assert by_event["leader: verify >"]["p50_ms"] == pytest.approx(1.0)
    assert by_event["coordinator: append > #2"]["p50_ms"] == pytest.approx(3.0)
    assert by_event["coordinator: append > #2"]["count"] == 3
    assert out["cycle_ms"]["p50"] == pytest.approx(10.0)


def test_warmup_transactions_and_rare_events_are_left_out():
    events = []
    for i in range(6):
        steps = [(1.0 if i < 2 else 0.1, "leader: append >")]
        if i == 3:
            steps.append((0.05, "leader: snapshot >"))  # a periodic task's, once
        events += _cycle(5.0 * i, steps)
    out = timeline(sorted(events), skip=2)
    assert out["transactions"] == 3
    by_event = {row["event"]: row for row in out["steps"]}
    assert "leader: snapshot >" not in by_event
    assert by_event["leader: append >"]["p50_ms"] == pytest.approx(0.1)


def test_events_before_the_first_send_belong_to_no_transaction():
    events = [(1, "leader: start >", "2")] + _cycle(1.0, [(0.3, "x >")]) + _cycle(2.0, [])
    out = timeline(events)
    assert out["transactions"] == 1
    assert [row["event"] for row in out["steps"]] == [SEND, "x >"]


def test_read_events_merges_every_process_in_time_order(tmp_path):
    (tmp_path / "events-10.log").write_text("300 c\n100 a\n")
    (tmp_path / "events-20.log").write_text("200 b with spaces\n\n")
    assert read_events(tmp_path) == [(100, "a", "10"), (200, "b with spaces", "20"), (300, "c", "10")]


@pytest.fixture
def probe():
    sys.path.insert(0, str(PROBE_DIR))
    try:
        yield importlib.import_module("exactly_timeline_probe")
    finally:
        sys.path.remove(str(PROBE_DIR))


def test_every_probe_names_a_method_that_exists(probe):
    for module, cls, method, name in probe.PROBES:
        fn = getattr(importlib.import_module(module), cls).__dict__[method]
        assert callable(fn), (module, cls, method)
        if "{internal}" in name:  # told apart by its entry's topic: (self, ctx, entry)
            assert inspect.iscoroutinefunction(fn)
            assert list(inspect.signature(fn).parameters)[:3] == ["self", "ctx", "e"]


def test_installed_probes_mark_start_and_end_and_uninstall_puts_every_method_back(probe, tmp_path):
    owners = [(getattr(importlib.import_module(m), c), meth) for m, c, meth, _ in probe.PROBES]
    before = [owner.__dict__[meth] for owner, meth in owners]
    from services.partition_leader.produce import ProduceEntry

    async def append_one(self, ctx, e):
        return e.partition

    try:
        installed = probe.install(str(tmp_path), importable_only=False)
        assert len(installed) == len(probe.PROBES)
        assert all(owner.__dict__[meth] is not fn for (owner, meth), fn in zip(owners, before))
        wrapped = probe._wrap(append_one, "leader: append of a batch{internal}")
        assert asyncio.run(wrapped(None, None, ProduceEntry("__transaction_state", 4, b""))) == 4
        assert asyncio.run(wrapped(None, None, ProduceEntry("orders", 1, b""))) == 1
    finally:
        probe.uninstall()
    assert [owner.__dict__[meth] for owner, meth in owners] == before
    lines = [line.split(" ", 1)[1] for line in next(tmp_path.glob("events-*.log")).read_text().splitlines()]
    assert lines == ["leader: append of a batch to an internal topic >",
                     "leader: append of a batch to an internal topic <",
                     "leader: append of a batch >", "leader: append of a batch <"]
