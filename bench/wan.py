"""Cold `terraform init` across a WAN (benchmark 7): the WAN, and the timeline of one init (`--timeline`).

The WAN (`WanRelay`, `--wan relay`, the default) is a TCP relay in front of the fake upstream that stands for
a network with a round-trip time of the upstream latency: each segment waits half of it in each direction,
and nothing a client sends gets through before one round trip after it connected (TCP's handshake), so a
new TLS connection costs its round trips as on a real network and a reused one none. Terraform straight
from the upstream and the proxy both reach the upstream through it. With `--wan answers` the fake upstream
instead delays every answer by the latency (`FakeRegistry.latency`) and connecting costs nothing.

A traced run merges four sources on one wall clock: the connections the relay accepted, the registry's
arrival and answer of each upstream request (`FakeRegistry.timeline`), and the proxy's JSON log at debug
level: the client's requests (access lines: their end and duration), upstream connections made (with their
TCP and TLS set-up time) or reused, gpg runs, the signature verified and the archive stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tests.fakes.registry import Served

# The proxy's log events on the timeline: the event, and what the line shows of it.
_EVENTS = {
    "request": "client → proxy",
    "upstream.connected": "new upstream connection",
    "upstream.connection_reused": "upstream connection reused",
    "gpg.imported": "gpg: key import",
    "gpg.verified": "gpg: verify",
    "verify.signature_ok": "SHA256SUMS signature verified",
    "archive.stored": "archive stored and recorded",
}


@dataclass(frozen=True)
class WanRun:
    """One cold init: its wall-clock time, and the CPU time of the proxy it went through (0 for direct)."""

    seconds: float
    cpu_seconds: float = 0.0


def process_cpu_seconds(pid: int) -> float:
    """User and system time of a process and of its children it waited for (gpg runs), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(field) for field in fields[11:15]) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Step:
    """One line of a timeline: from `start` to `end` (seconds after the init started; equal for an instant)."""

    start: float
    end: float
    who: str
    what: str


def proxy_steps(log_path: Path, since: float) -> list[Step]:
    """The proxy's log lines of interest after `since` (wall clock), as steps."""
    steps = []
    for line in log_path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        event = entry.get("event")
        if event not in _EVENTS or "timestamp" not in entry or (event == "request" and "duration_ms" not in entry):
            continue  # (health checks log `request` without a duration)
        end = datetime.fromisoformat(entry["timestamp"]).timestamp() - since
        if end < 0:
            continue
        seconds = entry["duration_ms"] / 1000 if event == "request" else entry.get("seconds", 0.0)
        detail = entry.get("path") or entry.get("url") or ""
        if event == "request":
            detail = f"{entry['method']} {detail} {entry['status']} ({entry.get('cache', '-')})"
        steps.append(Step(end - seconds, end, "proxy", f"{_EVENTS[event]} {detail}".rstrip()))
    return steps


def upstream_steps(served: list[Served], since: float, who: str) -> list[Step]:
    """The registry's requests after `since`, made by `who`."""
    return [
        Step(s.arrived - since, s.answered - since, "upstream", f"{who}: {s.method} {s.path} {s.status}")
        for s in served
        if s.arrived >= since
    ]


def render(steps: list[Step]) -> str:
    """A text table, in order of start: start and end in ms after the init started."""
    lines = ["| start ms | end ms | where | what |", "| ---: | ---: | --- | --- |"]
    for step in sorted(steps, key=lambda s: (s.start, s.end)):
        lines.append(f"| {step.start * 1000:.0f} | {step.end * 1000:.0f} | {step.who} | {step.what} |")
    return "\n".join(lines)


def connection_steps(opened: list[float], since: float, who: str) -> list[Step]:
    """The connections the WAN relay accepted after `since` (wall clock), from `who`."""
    return [Step(t - since, t - since, "wan", f"{who}: new TCP connection") for t in opened if t >= since]


class WanRelay:
    """A TCP relay on 127.0.0.1 in front of `target_port` that adds a round-trip time of `latency` seconds.

    Every chunk read from either side is written to the other half a round trip later (in order); what a
    client sends is held until one round trip after it connected (TCP's SYN and SYN-ACK), so its first bytes
    arrive one and a half round trips after `connect`, as on a real network. `connections` holds the wall
    clock of each connection accepted (`time.time()`, comparable with the proxy's log).
    """

    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.target_port = target_port
        self.latency = 0.0
        self.connections: list[float] = []
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"https://{self.host}:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accepted, self.host, 0)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):  # their reads end, and so their links
            writer.transport.abort()
        await asyncio.gather(*self._links, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accepted(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._links.add(task)
        self._writers.add(client_writer)
        self.connections.append(time.time())
        latency, connected = self.latency, asyncio.get_running_loop().time()
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            client_writer.close()
            self._writers.discard(client_writer)
            self._links.discard(task)
            return
        self._writers.add(upstream_writer)
        try:
            await asyncio.gather(
                _delayed_pipe(client_reader, upstream_writer, latency / 2, connected + latency),
                _delayed_pipe(upstream_reader, client_writer, latency / 2, 0.0),
            )
        finally:
            for writer in (client_writer, upstream_writer):
                writer.close()
                self._writers.discard(writer)
            self._links.discard(task)


async def _delayed_pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, not_before: float
) -> None:
    """Copy `reader` to `writer`, each chunk `delay` seconds after it was read, or after `not_before` (the loop's
    clock) if it was read before that; the end of the stream (a half close) too. A reset ends it quietly."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    delivering = asyncio.ensure_future(deliver())
    try:
        with contextlib.suppress(ConnectionError, OSError):
            while True:
                data = await reader.read(1 << 16)
                queue.put_nowait((max(loop.time(), not_before) + delay, data))
                if not data or delivering.done():  # the end, or the other side went away
                    break
            await delivering
    finally:
        delivering.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
            await delivering
