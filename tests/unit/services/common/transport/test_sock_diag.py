"""The gRPC port's connection sweep asks the kernel for the port's connections only
(services.common.transport.sock_diag): the request's bytes, the answer's parsing, and the
same connections as /proc/net/tcp lists on a real loopback socket."""
from __future__ import annotations

import os
import socket
import struct

import pytest

from services.common.transport import connections as c
from services.common.transport import sock_diag as sd


def test_the_request_is_a_dump_of_tcp_sockets_filtered_by_local_port_in_the_kernel():
    msg = sd.request(8080, socket.AF_INET6, seq=7)
    length, kind, flags, seq, pid = struct.unpack_from("=IHHII", msg)
    assert (length, kind, flags, seq, pid) == (len(msg), 20, 0x301, 7, 0)
    family, protocol, ext, pad, states = struct.unpack_from("=BBBBI", msg, 16)
    assert (family, protocol, ext, pad) == (socket.AF_INET6, socket.IPPROTO_TCP, 0, 0)
    assert states == 0xFFFFFFFF & ~(1 << 10)  # every state but LISTEN
    assert msg[24:72] == bytes(48)  # any socket id: the bytecode filters
    attr_len, attr_type = struct.unpack_from("=HH", msg, 72)
    assert (attr_len, attr_type) == (4 + 16, sd.INET_DIAG_REQ_BYTECODE) and len(msg) == 72 + attr_len
    ops = [struct.unpack_from("=BBH", msg, 76 + 4 * i) for i in range(4)]
    # sport >= 8080, else jump past the end (reject); sport <= 8080, likewise; the end accepts.
    assert ops == [(sd.INET_DIAG_BC_S_GE, 8, 20), (0, 0, 8080), (sd.INET_DIAG_BC_S_LE, 8, 12), (0, 0, 8080)]


def _answer(family: int, peer: bytes, inode: int, seq: int = 1) -> bytes:
    body = struct.pack("=BBBB", family, 1, 0, 0) + struct.pack("!HH", 8080, 54321) + bytes(16) \
        + peer.ljust(16, b"\0") + bytes(12) + struct.pack("=IIIII", 0, 0, 0, 1000, inode)
    return struct.pack("=IHHII", 16 + len(body), 20, 2, seq, 0) + body


def test_the_answer_gives_inode_and_peer_and_ends_with_done():
    data = (_answer(socket.AF_INET, socket.inet_aton("10.0.0.7"), 501)
            + _answer(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, "::ffff:127.0.0.2"), 502)
            + _answer(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, "fd00::5"), 0))  # no inode: left out
    assert sd.parse(data) == ([(501, "10.0.0.7"), (502, "127.0.0.2")], False)
    assert sd.parse(struct.pack("=IHHII", 20, sd.NLMSG_DONE, 2, 1, 0) + bytes(4)) == ([], True)


def test_an_error_answer_is_an_os_error():
    err = struct.pack("=IHHII", 36, sd.NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", -1) + bytes(16)
    with pytest.raises(OSError, match="sock_diag"):
        sd.parse(err)


def _proc(port: int) -> list[tuple[int, str]]:
    out = []
    for name, ipv6 in (("tcp", False), ("tcp6", True)):
        with open(f"/proc/self/net/{name}") as f:
            out += c.parse_proc_net_tcp(f.read(), port, ipv6)
    return sorted(out)


@pytest.mark.skipif(not hasattr(socket, "AF_NETLINK"), reason="Linux only")
def test_the_kernel_lists_the_ports_connections_as_proc_net_tcp_does():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    accepted = [server.accept()[0] for _ in clients]
    try:
        inodes = sorted(os.fstat(s.fileno()).st_ino for s in accepted)
        found = sorted(sd.accepted(port))
        assert found == [(inode, "127.0.0.1") for inode in inodes]  # not the listener, not the clients' ends
        assert found == _proc(port)
        sweeper = c.GrpcConnectionSweeper(port, c.ConnectionLimits(), c.RefusalLog("grpc-test"), 1.0)
        assert sorted(sweeper.connections()) == found
    finally:
        for s in (*clients, *accepted, server):
            s.close()


def test_the_sweep_reads_proc_net_tcp_where_the_kernel_cannot_be_asked(monkeypatch):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    try:
        def refused(_port):
            raise PermissionError(1, "Operation not permitted")
        monkeypatch.setattr(sd, "accepted", refused)
        sweeper = c.GrpcConnectionSweeper(port, c.ConnectionLimits(), c.RefusalLog("grpc-test"), 1.0)
        assert sweeper.connections() == [(os.fstat(accepted.fileno()).st_ino, "127.0.0.1")]
        assert not sweeper._sock_diag  # asked once, not at every sweep
    finally:
        for s in (client, accepted, server):
            s.close()
