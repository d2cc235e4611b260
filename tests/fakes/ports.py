"""Loopback ports for the servers tests start, safe when test workers (pytest-xdist, or other test runs on
the machine) pick ports at the same time.

- A server that can bind port 0 does, and reports the port it got (the fake registry, the S3 server).
- A child that must be told its port (redis-server, the proxy) is started on a port the kernel just
  handed out (`free_port`). Another worker may take that port in between: the child then fails to bind,
  and its starter tries again on another port (`PortTakenError`). Whatever answers on the port counts
  only once `/proc` shows that the child itself listens there (`listening_ports`), so a test never
  talks to another test's server.
- A port where nothing listens, for "connection refused" tests, is held bound without listening for as
  long as the test needs it (`refused_port`): no one else can take it meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import socket
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
    """The TCP ports process `pid` listens on (Linux: its socket inodes in /proc/PID/fd, their ports
    in /proc/PID/net/tcp and tcp6). Empty once the process is gone."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    except OSError:
        return set()
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == _LISTEN and fields[9] in inodes:
                    ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports
