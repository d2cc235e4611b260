"""Cold `terraform init` across a WAN: the timeline of one init through the proxy (benchmark 7, `--timeline`).

The fake upstream delays every answer by the upstream latency (`FakeRegistry.latency`), for terraform
straight from it and for the proxy alike. A traced run merges three sources on one wall clock: the
registry's arrival and answer of each upstream request (`FakeRegistry.timeline`), and the proxy's JSON log
at debug level: the client's requests (access lines: their end and duration), upstream connections made or
reused, gpg runs, the signature verified and the archive stored.
"""

from __future__ import annotations

import json
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
