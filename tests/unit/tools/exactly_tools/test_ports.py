"""The tools' port picker: ports outside the kernel's ephemeral range, one slice per
pytest-xdist worker, never handed out twice."""
from __future__ import annotations

import os
import socket

import pytest

from exactly_tools import ports


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(ports, "_HANDED_OUT", set())
    monkeypatch.setattr(ports, "_next", None)
    return monkeypatch


def test_ports_lie_below_the_ephemeral_range_and_repeat_never(fresh):
    picked = ports.free_ports(50)
    assert len(set(picked)) == 50
    low = ports._ephemeral_low()
    assert all(ports._LOWEST <= p < low for p in picked)


def test_each_xdist_worker_has_its_own_slice(fresh):
    slices = []
    for worker in ("gw0", "gw1", "gw2"):
        fresh.setenv("PYTEST_XDIST_WORKER", worker)
        fresh.setattr(ports, "_next", None)
        slices.append(ports._slice())
        assert ports.free_port() in slices[-1]
    assert all(not set(a) & set(b) for i, a in enumerate(slices) for b in slices[i + 1:])
    fresh.delenv("PYTEST_XDIST_WORKER")
    assert not set(ports._slice()) & set().union(*map(set, slices))  # a plain process: a slice of its own


def test_a_port_in_use_is_skipped(fresh):
    fresh.setenv("PYTEST_XDIST_WORKER", "gw5")
    first = ports._slice().start + (os.getpid() * 7) % ports._SLICE
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        held.listen()
        assert ports.free_port() != first


def test_no_room_below_the_ephemeral_range_falls_back_to_the_kernel(fresh):
    fresh.setattr(ports, "_ephemeral_low", lambda: ports._LOWEST + 500)
    port = ports.free_port()
    assert port > 0 and ports.free_port() != port


def test_a_worker_that_handed_out_its_whole_slice_goes_round_again(fresh):
    """A long test session hands out more ports than a slice holds: once every port of
    it was handed out, the next round takes those that bind, skipping any still held.
    Which ports bind is simulated (`held`): the slice of a patched size lies inside a real
    worker's slice, whose ports other test processes bind meanwhile."""
    fresh.setenv("PYTEST_XDIST_WORKER", "gw6")
    fresh.setattr(ports, "_SLICE", 20)
    held: set[int] = set()
    fresh.setattr(ports, "_bindable", lambda port: port not in held)
    first_round = ports.free_ports(20)
    assert sorted(first_round) == list(ports._slice())
    held.add(first_round[0])
    second_round = ports.free_ports(19)
    assert first_round[0] not in second_round
    assert sorted(second_round) == sorted(first_round[1:])
    assert ports.free_port() != first_round[0]  # a third round, still skipping it
    held.update(ports._slice())
    with pytest.raises(RuntimeError, match="every one is bound"):
        ports.free_port()
