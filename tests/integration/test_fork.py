"""Forked children use the SDK (docs/design.md, "SDK", Fork): with multiprocessing's
default start method and ProcessPoolExecutor(), a child builds its own Producer and
Consumer and completes a transaction while the parent's sync and asyncio clients are
open, and while they have calls in flight; a client of the parent, used in the child,
fails at once instead of hanging."""
from __future__ import annotations

import json
import multiprocessing
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from exactly import AdminClient, NewTopic, Producer, errors

SCENARIO = pathlib.Path(__file__).with_name("fork_scenario.py")


def _run_scenario(bootstrap: str, topic: str, children: int, pool_children: int, busy: bool) -> dict:
    proc = subprocess.Popen([sys.executable, str(SCENARIO), bootstrap, topic, str(children), str(pool_children),
                             "busy" if busy else "idle"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240 + 10 * children)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError("the fork scenario hung") from None
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_children_complete_transactions_while_the_parents_clients_are_open(cluster):
    result = _run_scenario(cluster.bootstrap_servers, "fork-idle", children=6, pool_children=4, busy=False)
    assert result["failed"] == {}
    assert sorted(result["ok"]) == list(range(10))


def test_fifty_children_in_a_row_while_the_parent_has_calls_in_flight(cluster):
    result = _run_scenario(cluster.bootstrap_servers, "fork-busy", children=50, pool_children=4, busy=True)
    assert result["failed"] == {}, result["failed"]
    assert sorted(result["ok"]) == list(range(54))
    assert result["parent_calls"] > 50, "the parent's clients must have been busy while the children ran"


def _use_parents_producer(producer: Producer, out) -> None:
    started = time.monotonic()
    try:
        producer.send("anything", b"x")
        out.send(("sent", time.monotonic() - started))
    except errors.IllegalStateError as exc:
        out.send(("refused", time.monotonic() - started, str(exc)))
    producer.close()  # only marks it closed here
    out.send(("closed", time.monotonic() - started))


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="needs the fork start method")
def test_a_parents_client_in_a_forked_child_fails_at_once(cluster):
    AdminClient({"bootstrap.servers": cluster.bootstrap_servers}).create_topics([NewTopic("fork-parent-client", 1)])
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers})
    try:
        producer.send("fork-parent-client", b"before").result(30)
        ours, theirs = multiprocessing.Pipe()
        child = multiprocessing.Process(target=_use_parents_producer, args=(producer, theirs))
        child.start()
        child.join(30)
        assert not child.is_alive(), "the child hung on the parent's producer"
        first, second = ours.recv(), ours.recv()
        assert first[0] == "refused" and first[1] < 1.0, first
        assert "create a new producer in the child" in first[2]
        assert second[0] == "closed" and second[1] < 1.0, second
        # The parent's producer is untouched by the child.
        assert producer.send("fork-parent-client", b"after").result(30).offset == 1
    finally:
        producer.close()
