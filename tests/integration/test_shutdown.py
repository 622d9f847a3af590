"""A service asked to stop (SIGTERM) exits even when its ZooKeeper is gone: the
deregistration and the coordinators' resignations are bounded, not waited on for ever
(Kubernetes deletes pods during a ZooKeeper outage too)."""
from __future__ import annotations

import os
import signal
import time

from exactly_tools.devcluster import DevCluster, pid_alive


def _wait_exited(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child: poll the process table
            done = 0 if pid_alive(pid) else pid
        if done == pid:
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


def test_services_stop_while_zookeeper_is_down(tmp_path):
    c = DevCluster(tmp_path)  # its own ZooKeeper, killed below
    try:
        c.up(partition_leaders=1, txn_coordinators=1, group_coordinators=1)
        os.kill(c.zookeeper_pid, signal.SIGKILL)
        assert _wait_exited(c.zookeeper_pid, 10), "ZooKeeper did not die"
        pids = {name: svc.pid for name, svc in c.services.items()}
        for name, pid in pids.items():
            os.kill(pid, signal.SIGTERM)
        # Bounded by the 5 s deregistration timeout and the stop grace periods, not by
        # ZooKeeper: each exits well within 30 s.
        hung = [name for name, pid in pids.items() if not _wait_exited(pid, 30)]
        assert not hung, f"still running 30 s after SIGTERM with ZooKeeper down: {hung}"
    finally:
        c.down()
