"""Loopback ports for the servers tests start, safe when test workers (pytest-xdist, or other test runs on
the machine) pick ports at the same time.

- A server that can bind port 0 does, and reports the port it got (the fake registry, the S3 server).
- A child that must be told its port (redis-server, the proxy) is started on a port the kernel just
  handed out (`free_port`). Another worker may take that port in between: the child then fails to bind,
  and its starter tries again on another port (`PortTakenError`). Whatever answers on the port counts
  only once the kernel shows that the child itself listens there (`listening_ports`), so a test never
  talks to another test's server.
- A port where nothing listens, for "connection refused" tests, is held bound without listening for as
  long as the test needs it (`refused_port`): no one else can take it meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

PORT_ATTEMPTS = 5  # starts of a child on fresh ports before giving up
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


class PortTakenError(RuntimeError):
    """The port a child was told to listen on was taken by someone else before it could bind it."""


def free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (free now; see the module docstring for after)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections while the block runs (bound, never listening)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (Linux: its socket inodes in /proc/PID/fd, matched with the
    listening sockets the kernel reports). Empty once the process is gone."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(int(target[len("socket:[") : -1]))
    except OSError:
        return set()
    if not inodes:
        return set()
    return {port for inode, port in _listening_sockets().items() if inode in inodes}


def _listening_sockets() -> dict[int, int]:
    """{socket inode: port} of every listening TCP socket of this network namespace.

    Asked of the kernel by sock_diag, which walks only the listening sockets; /proc/net/tcp would list every
    socket (thousands in TIME_WAIT on a machine running tests: about 10 ms of CPU a read, and starters poll
    this every few milliseconds). /proc/net/tcp where sock_diag is not available."""
    try:
        return {inode: port for family in (socket.AF_INET, socket.AF_INET6) for inode, port in _sock_diag(family)}
    except OSError:
        return _proc_net_tcp()


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x301
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN = 10
_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
# struct inet_diag_msg: family, state, timer, retransmits; the socket id (source port big-endian first, 48
# bytes); expires, receive and send queues, uid, then the inode.
_PORT_AT, _INODE_AT = 4, 4 + 48 + 16


def _sock_diag(family: int) -> Iterator[tuple[int, int]]:
    """(inode, port) of the listening TCP sockets of one address family (netlink's inet_diag dump)."""
    request = struct.pack("=BBBBI48x", family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN)  # inet_diag_req_v2
    header = _NLMSGHDR.pack(_NLMSGHDR.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as sock:
        sock.sendto(header + request, (0, 0))
        while True:
            data = sock.recv(1 << 16)
            offset = 0
            while offset < len(data):
                length, kind = _NLMSGHDR.unpack_from(data, offset)[:2]
                if kind == _NLMSG_DONE:
                    return
                if kind == _NLMSG_ERROR:
                    raise OSError("the kernel refused the sock_diag dump")
                body = offset + _NLMSGHDR.size
                yield (
                    struct.unpack_from("=I", data, body + _INODE_AT)[0],
                    struct.unpack_from("!H", data, body + _PORT_AT)[0],
                )
                offset += (length + 3) & ~3


def _proc_net_tcp() -> dict[int, int]:
    """{socket inode: port} of the listening TCP sockets, from /proc/net/tcp and tcp6."""
    found = {}
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == _LISTEN:
                    found[int(fields[9])] = int(fields[1].rpartition(":")[2], 16)
    return found
