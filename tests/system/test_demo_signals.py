"""`make demo` stopped by a signal takes its whole cluster down, on real processes:
the demo (python -m demo.purchases, as `make demo` runs it) is started in its own
session, and once its pipeline worker runs it gets SIGTERM (`kill`), SIGINT (Ctrl-C,
here sent to the demo alone, so its workers and services do not get it) or SIGHUP
(the terminal closed). Within a deadline no process of its cluster may be left:
ZooKeeper, the services and the workers, by the pids in the cluster's state file
(cluster.json: zookeeper_pid, services, clients)."""
from __future__ import annotations

import json
import os
import pathlib
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from exactly_tools.devcluster import pid_alive

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
START_DEADLINE_S = 240.0  # a cluster, 9,998 items loaded, the worker started: on a busy machine
STOP_DEADLINE_S = 60.0  # DevCluster.down: 5 s for the workers, 20 s for the services, 10 s for ZooKeeper


def _as_from_a_terminal() -> None:
    """In the demo's process before it starts: the stop signals at their default
    disposition, as a shell at a terminal starts `make demo`. A test runner started in
    the background or under nohup hands its children these signals ignored, and the demo
    rightly keeps a signal it was started ignoring ignored (demo.common.stop_on_signals)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _lines(stream, out: queue.Queue) -> None:
    for line in iter(stream.readline, b""):
        out.put(line.decode(errors="replace"))
    out.put(None)


def _wait_line(lines: queue.Queue, text: str, deadline: float, seen: list[str]) -> None:
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {text!r} in the demo's output in time:\n{''.join(seen[-40:])}") from None
        if line is None:
            raise AssertionError(f"the demo ended before {text!r}:\n{''.join(seen[-40:])}")
        seen.append(line)
        if text in line:
            return


def _children(pid: int) -> list[int]:
    """Pids of the live children of `pid` (from /proc): the test's own clean-up only."""
    found = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _cluster_pids(state_file: pathlib.Path) -> dict[str, int]:
    """name -> pid of ZooKeeper, the services and the tracked clients in cluster.json."""
    body = json.loads(state_file.read_text())
    pids = {"zookeeper": body["zookeeper_pid"]}
    pids.update({s["name"]: s["pid"] for s in body["services"]})
    pids.update({c["name"]: c["pid"] for c in body.get("clients", ())})
    return pids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_demo_stopped_by_a_signal_leaves_no_process_of_its_cluster(tmp_path, sig):
    run_dir = tmp_path / "demo"
    demo = subprocess.Popen([sys.executable, "-m", "demo.purchases", "--dir", str(run_dir)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=_as_from_a_terminal)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(demo.stdout, lines), daemon=True).start()
    seen: list[str] = []
    pids: dict[str, int] = {}
    workers: list[int] = []
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        _wait_line(lines, "Cluster serving:", deadline, seen)
        _wait_line(lines, "Running the pipeline", deadline, seen)
        # The worker is spawned (and tracked in cluster.json) right after that line; it
        # writes its status file once it runs.
        while not (run_dir / "worker-1.status").exists():
            assert time.monotonic() < deadline, "worker-1 did not start in time"
            time.sleep(0.05)
        pids = _cluster_pids(run_dir / "cluster.json")
        workers = _children(demo.pid)
        assert {"zookeeper", "pl-0", "pl-1", "pl-2", "txn-0", "group-0"} <= set(pids), pids
        assert all(pid_alive(pid) for pid in pids.values()), {n: pid_alive(p) for n, p in pids.items()}

        demo.send_signal(sig)
        stop_by = time.monotonic() + STOP_DEADLINE_S
        while any(pid_alive(pid) for pid in pids.values()) and time.monotonic() < stop_by:
            time.sleep(0.1)
        alive = {name: pid for name, pid in pids.items() if pid_alive(pid)}
        assert not alive, f"still running {STOP_DEADLINE_S:.0f} s after {sig.name}: {alive}"
        assert "worker-1" in pids, f"the pipeline worker is not in cluster.json: {pids}"
        assert demo.wait(timeout=max(1.0, stop_by - time.monotonic())) == 128 + sig
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(timeout=30)
        for pid in [*pids.values(), *workers]:  # whatever the demo left running
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
