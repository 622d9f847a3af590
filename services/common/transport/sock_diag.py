"""The TCP connections accepted on one local port, asked of the kernel's socket diagnostics
(Linux `NETLINK_SOCK_DIAG`, `inet_diag`: what `ss` uses) with the port filtered in the
kernel, for the gRPC port's connection sweep (services.common.transport.connections).

Why not /proc/net/tcp: the kernel formats a line for every TCP socket of the network
namespace on each read, the port's or not. On a host with a few thousand sockets that is
12 ms of kernel time and 2.5 ms of parsing per read, and the sweep reads it every second
in every service process. A dump filtered by the local port in the kernel (an
`INET_DIAG_REQ_BYTECODE` of two port comparisons) answers only the port's sockets: about
1 ms. pyroute2's diag socket has no such filter (it dumps every socket and parses each in
Python), so the request is encoded here: the structures of linux/inet_diag.h,
linux/sock_diag.h and linux/netlink.h.

`accepted(port)` raises OSError where the kernel offers no such socket or refuses the
request (another OS, a seccomp profile without netlink); the sweep then reads
/proc/net/tcp as before.
"""
from __future__ import annotations

import os
import socket
import struct

from .peer_addresses import normalize_ip

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300  # NLM_F_ROOT | NLM_F_MATCH
NLMSG_ERROR = 2
NLMSG_DONE = 3
INET_DIAG_REQ_BYTECODE = 1
INET_DIAG_BC_S_GE = 2
INET_DIAG_BC_S_LE = 3
TCP_LISTEN = 10
# Every TCP state but LISTEN: the listening socket is not a connection. Request sockets
# (SYN_RECV) and TIME_WAIT have no inode, and are left out by the caller as in /proc.
STATES = 0xFFFFFFFF & ~(1 << TCP_LISTEN)

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_OP = struct.Struct("=BBH")  # inet_diag_bc_op: code, yes, no
_RTATTR = struct.Struct("=HH")  # len, type
_REQ = struct.Struct("=BBBBI48x")  # inet_diag_req_v2: family, protocol, ext, pad, states, sockid (any)
# inet_diag_msg: family, state, timer, retrans; sockid: sport, dport (big-endian), src[16],
# dst[16], if, cookie[2]; expires, rqueue, wqueue, uid, inode.
_MSG = struct.Struct("=BBBB2s2s16s16s4s8sIIIII")
_RECV_BYTES = 1 << 16


def port_filter(port: int) -> bytes:
    """inet_diag bytecode accepting the sockets whose local port is `port`: "sport >= port"
    then "sport <= port", each op followed by the op holding the port; a failed comparison
    jumps past the end (rejected), reaching the end accepts (the kernel's inet_diag_bc_run)."""
    return (_OP.pack(INET_DIAG_BC_S_GE, 8, 20) + _OP.pack(0, 0, port)
            + _OP.pack(INET_DIAG_BC_S_LE, 8, 12) + _OP.pack(0, 0, port))


def request(port: int, family: int, seq: int = 1) -> bytes:
    """The netlink message asking for a dump of the TCP sockets of `family` (AF_INET or
    AF_INET6) whose local port is `port`, in every state but LISTEN."""
    bytecode = port_filter(port)
    body = _REQ.pack(family, socket.IPPROTO_TCP, 0, 0, STATES) + _RTATTR.pack(_RTATTR.size + len(bytecode),
                                                                             INET_DIAG_REQ_BYTECODE) + bytecode
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def parse(data: bytes) -> tuple[list[tuple[int, str]], bool]:
    """The (socket inode, peer IP) of each socket message in one read of the dump, and
    whether the dump ended in it. Sockets without an inode are left out. Raises OSError
    for the kernel's error answer."""
    out: list[tuple[int, str]] = []
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if kind == NLMSG_DONE:
            return out, True
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", data, offset + _NLMSGHDR.size)
            raise OSError(-code, f"sock_diag: {os.strerror(-code)}")
        if length < _NLMSGHDR.size + _MSG.size:
            raise OSError(0, f"sock_diag: a message of {length} bytes")
        family, _state, _timer, _retrans, _sport, _dport, _src, dst, _if, _cookie, _expires, _rq, _wq, _uid, inode = \
            _MSG.unpack_from(data, offset + _NLMSGHDR.size)
        if inode:
            peer = socket.inet_ntop(socket.AF_INET, dst[:4]) if family == socket.AF_INET \
                else socket.inet_ntop(socket.AF_INET6, dst)
            out.append((inode, normalize_ip(peer)))
        offset += (length + 3) & ~3
    return out, False


def accepted(port: int, timeout_s: float = 5.0) -> list[tuple[int, str]]:
    """(socket inode, peer IP) of every connection of this network namespace whose local
    port is `port` (IPv4 and IPv6), as services.common.transport.connections.parse_proc_net_tcp
    lists them. Blocking (the sweep runs it in a thread); raises OSError when the kernel
    cannot be asked (see the module docstring) or does not answer within `timeout_s`."""
    out: list[tuple[int, str]] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(timeout_s)
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            sock.sendto(request(port, family, seq), (0, 0))
            done = False
            while not done:
                found, done = parse(sock.recv(_RECV_BYTES))
                out += found
    return out
