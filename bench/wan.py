"""Cold `terraform init` across a WAN (benchmark 7): the WAN, and the timeline of one init (`--timeline`).

The WAN (`tests/fakes/wan_relay.py`, `--wan relay`, the default) is a TCP relay in front of the fake
upstream that stands for a network with a round-trip time of the upstream latency: each segment waits
half of it in each direction, and nothing a client sends gets through before one round trip after it
connected (TCP's handshake), so a new TLS connection costs its round trips as on a real network and a
reused one none. Terraform straight from the upstream and the proxy both reach the upstream through it.
With `--wan answers` the fake upstream instead delays every answer by the latency (`FakeRegistry.latency`)
and connecting costs nothing.

A traced run merges four sources on one wall clock: the connections the relay accepted, the registry's
arrival and answer of each upstream request (`FakeRegistry.timeline`), and the proxy's JSON log at debug
level: the client's requests (access lines: their end and duration), upstream connections made (with their
TCP and TLS set-up time) or reused, gpg runs, the signature verified and the archive stored.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tests.fakes.registry import Served

# The proxy's log events on the timeline: the event, and what the line shows of it.
_EVENTS = {
    "request": "client → proxy",
    "upstream.connected": "new upstream connection",
    "upstream.connection_reused": "upstream connection reused",
    "upstream.spare_opened": "spare upstream connection opened",
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
