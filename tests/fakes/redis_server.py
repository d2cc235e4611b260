"""A real `redis-server` process on a free loopback port, for tests (no fakeredis)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.fakes.ports import PORT_ATTEMPTS, PortTakenError, free_port, listening_ports

__all__ = ["METADATA_SECRET", "RedisServer", "free_port"]

# Every proxy on a shared Redis needs the fleet's metadata secret (`--metadata-secret`); tests share this one.
METADATA_SECRET = "test-fleet-metadata-secret-0123456789"


class RedisServer:
    """Start, stop and restart a redis-server; data is not persisted.

    Without a `port`, the first start picks a free one (again, if another test took it first); later
    starts (a restart) and a given `port` keep theirs."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: run `make test`, which installs the Debian package")
        self.binary = binary
        self.workdir = workdir
        self._port_is_chosen = port is None
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        for attempt in range(PORT_ATTEMPTS if self._port_is_chosen else 1):
            try:
                self._start_once()
                break
            except PortTakenError:
                if not self._port_is_chosen or attempt == PORT_ATTEMPTS - 1:
                    raise
                self.port = free_port()
        self._port_is_chosen = False  # a restart keeps the port its clients know

    def _start_once(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:  # it could not bind: someone else has the port
                self.process = None
                raise PortTakenError(f"redis-server could not listen on port {self.port}")
            if self.port not in listening_ports(self.process.pid):  # not bound yet (or not by this server)
                time.sleep(0.02)
                continue
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None
