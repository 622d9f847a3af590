"""The network-fault helper itself (tests/netfault.py), on plain TCP processes: which
packets each mode drops, on connections open before the cut and on new ones, in
both directions, and that healing restores every path and leaves no rule behind."""
from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

from exactly_tools.devcluster import DevCluster, Service
import netfault
from netfault import network_faults  # noqa: F401 - fixture

pytestmark = pytest.mark.integration

# A node: echoes on its listening port; on stdin "new PORT" opens a new connection,
# "old PORT" uses the one opened at start (--connect), and answers "ok" when an echo
# came back within the probe timeout, else "fail".
NODE = r"""
import socket, sys, threading
listener = socket.socket(); listener.bind(("127.0.0.1", 0)); listener.listen()
def serve(c):
    while True:
        data = c.recv(64)
        if not data:
            return
        c.sendall(data)
def accept():
    while True:
        c, _ = listener.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
threading.Thread(target=accept, daemon=True).start()
print(listener.getsockname()[1], flush=True)
old = {}
for line in sys.stdin:
    cmd, port = line.split()
    port = int(port)
    try:
        if cmd == "connect":
            old[port] = socket.create_connection(("127.0.0.1", port), timeout=5)
            print("ok", flush=True)
            continue
        s = old[port] if cmd == "old" else socket.create_connection(("127.0.0.1", port), timeout=1.0)
        s.settimeout(1.0)
        s.sendall(b"x")
        print("ok" if s.recv(64) else "fail", flush=True)
        if cmd == "new":
            s.close()
    except OSError:
        print("fail", flush=True)
"""


class Node:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", NODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.port = int(self.proc.stdout.readline())

    def ask(self, cmd: str, port: int) -> bool:
        self.proc.stdin.write(f"{cmd} {port}\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip() == "ok"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def client_probe(sock: socket.socket | None, port: int) -> bool:
    """From the test process (a client): on `sock` (open before the cut) or a new
    connection, whether an echo comes back within 1 s."""
    try:
        s = sock or socket.create_connection(("127.0.0.1", port), timeout=1.0)
        s.settimeout(1.0)
        s.sendall(b"x")
        ok = bool(s.recv(64))
        if sock is None:
            s.close()
        return ok
    except OSError:
        return False


@pytest.fixture
def nodes(tmp_path):
    zk, victim, peer = Node(), Node(), Node()
    try:
        for a, b in ((victim, zk), (victim, peer), (peer, victim), (victim, victim)):
            assert a.ask("connect", b.port)
        cluster = DevCluster(pathlib.Path(tmp_path), zookeeper=f"127.0.0.1:{zk.port}/chroot", services={
            "victim": Service("victim", "partition_leader", victim.port, victim.proc.pid),
            "peer": Service("peer", "partition_leader", peer.port, peer.proc.pid)})
        yield cluster, zk, victim, peer
    finally:
        for n in (zk, victim, peer):
            n.close()


def paths(zk: Node, victim: Node, peer: Node, client_old: socket.socket) -> dict[str, bool]:
    return {
        "victim->zookeeper (open)": victim.ask("old", zk.port),
        "victim->zookeeper (new)": victim.ask("new", zk.port),
        "victim->peer (open)": victim.ask("old", peer.port),
        "victim->peer (new)": victim.ask("new", peer.port),
        "peer->victim (open)": peer.ask("old", victim.port),
        "peer->victim (new)": peer.ask("new", victim.port),
        "client->victim (open)": client_probe(client_old, victim.port),
        "client->victim (new)": client_probe(None, victim.port),
        "victim->victim (open)": victim.ask("old", victim.port),
        "victim->victim (new)": victim.ask("new", victim.port),
        "peer->zookeeper (new)": peer.ask("new", zk.port),
    }


CUT = {  # paths that must be silent in each mode; every other one works
    "zookeeper": {"victim->zookeeper (open)", "victim->zookeeper (new)"},
    "peers": {"victim->peer (open)", "victim->peer (new)", "peer->victim (open)", "peer->victim (new)"},
    "all": {"victim->zookeeper (open)", "victim->zookeeper (new)", "victim->peer (open)", "victim->peer (new)",
            "peer->victim (open)", "peer->victim (new)", "client->victim (open)", "client->victim (new)"},
}


@pytest.mark.parametrize("mode", ["zookeeper", "peers", "all"])
def test_each_mode_drops_exactly_its_paths_and_heal_restores_them(nodes, network_faults, mode):
    cluster, zk, victim, peer = nodes
    client_old = socket.create_connection(("127.0.0.1", victim.port), timeout=5)
    try:
        assert all(paths(zk, victim, peer, client_old).values())
        with network_faults.cut(cluster, "victim", mode) as fault:
            assert network_faults.active() == [fault]
            during = paths(zk, victim, peer, client_old)
        assert {p for p, ok in during.items() if not ok} == CUT[mode], during
        assert network_faults.active() == []
        # This process's table is gone (other test processes on the machine may have theirs).
        assert f"{netfault.TABLE_PREFIX}{os.getpid()}" not in subprocess.run(["nft", "list", "tables"],
                                                                             capture_output=True,
                                                      text=True).stdout
        # Open connections recover once TCP retransmits (its backoff grew during the cut).
        deadline = time.monotonic() + 30
        while not all((after := paths(zk, victim, peer, client_old)).values()):
            assert time.monotonic() < deadline, after
    finally:
        client_old.close()
