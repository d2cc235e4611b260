"""The audit trail (`--audit-log FILE|stdout`): one JSON line per decision that matters, apart from the access log.

Events (`event`):
- `fetched`: an artifact (provider archive, module) was fetched from its upstream;
- `served`: an archive was served to a client (once per client, artifact and hour in each worker process);
- `denied`: the policy refused a request (`decision`: `deny`), or would have in warn mode (`would-deny`), or
  left a version out of a list (`withheld`: once per client, version and hour, when the list is filtered anew).

Every event has `time` (UTC, ISO 8601), `event`, `artifact` (address, version, platform), and where there
is a client its identity (`client`: token name or `anonymous`, `address`, later an OIDC `subject`) and
the `request_id` of the access log; a denial has `rule` and `reason`. Never a token or a secret.
Each line is written with one `write` to a file opened for appending, so the workers of one proxy
(and replicas sharing a file) do not interleave lines. The last denials and the count per rule are
kept in memory for the page (`recent_denials`, `blocked_by_rule`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

import structlog

from proxy.runtime.log import current_request_id

log = structlog.get_logger(__name__)
RECENT_DENIALS = 50
MAX_REMEMBERED = 100_000
SERVED_PERIOD = 3600  # seconds: a `served` event per client and artifact at most once in each of these


@dataclass(slots=True)  # not frozen: made per request, and a frozen dataclass is slower to make
class ClientIdentity:
    """Who asked: the token's name (`anonymous` without one), the client's address, an OIDC subject, and its scope
    as `HOST/NAMESPACE` texts (for the policy's `scopes` globs; not logged)."""

    name: str = "anonymous"
    address: str | None = None
    subject: str | None = None
    request_id: str | None = None
    scopes: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        found: dict[str, Any] = {"client": self.name, "address": self.address}
        if self.subject is not None:
            found["subject"] = self.subject
        request_id = self.request_id or current_request_id()
        if request_id is not None:  # the access log's, of the request being answered
            found["request_id"] = request_id
        return found


@dataclass(frozen=True, slots=True)
class Denial:
    """A recent denial, for the page."""

    time: float
    artifact: str
    client: str
    rule: str
    reason: str
    decision: str


class AuditLog:
    """The audit stream (a no-op sink without `--audit-log`, still keeping recent denials for the page)."""

    def __init__(self, stream: IO[str] | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self._stream = stream
        self._owned = False
        self.clock = clock
        self._served: set[tuple[str, str, int]] = set()
        self._served_period = -1
        self.recent: deque[Denial] = deque(maxlen=RECENT_DENIALS)
        self.blocked: Counter[str] = Counter()

    @classmethod
    def open(cls, target: str | None) -> AuditLog:
        """The sink for `--audit-log`: None (nowhere), `stdout`, or a file appended to (made if missing)."""
        if target is None:
            return cls()
        if target in ("stdout", "-"):
            return cls(sys.stdout)
        descriptor = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        sink = cls(os.fdopen(descriptor, "a", buffering=1, encoding="utf-8"))
        sink._owned = True
        return sink

    @property
    def enabled(self) -> bool:
        return self._stream is not None

    def close(self) -> None:
        if self._owned and self._stream is not None:
            self._stream.close()
            self._stream = None

    def write(self, event: str, **fields: Any) -> None:
        """One event as one JSON line (nothing without a stream)."""
        if self._stream is None:
            return
        line = json.dumps({"time": _iso(self.clock()), "event": event, **fields}, separators=(",", ":"))
        try:
            self._stream.write(line + "\n")
            self._stream.flush()
        except (OSError, ValueError) as exc:  # a full disk or closed stdout must not fail the request
            log.error("audit.write_failed", error=str(exc))

    def fetched(self, artifact: dict[str, Any]) -> None:
        self.write("fetched", artifact=artifact)

    def served(self, artifact: dict[str, Any], client: ClientIdentity) -> None:
        """A `served` event, unless this client was already recorded for this artifact in this hour."""
        if self._stream is None:
            return
        if not self._once_this_hour((client.name, client.address or "", json.dumps(artifact, sort_keys=True))):
            return
        self.write("served", artifact=artifact, **client.fields())

    def withheld(self, artifact: dict[str, Any], client: ClientIdentity, *, rule: str, reason: str) -> None:
        """A version left out of a list (once per client, version and hour): `denied` with `withheld`."""
        if not self._once_this_hour((client.name, "withheld", json.dumps(artifact, sort_keys=True))):
            return
        self._remember(artifact, client, rule, reason, "withheld")
        self.write("denied", artifact=artifact, decision="withheld", rule=rule, reason=reason, **client.fields())

    def _once_this_hour(self, key: tuple) -> bool:
        period = int(self.clock() // SERVED_PERIOD)
        if period != self._served_period:
            self._served.clear()
            self._served_period = period
        if key in self._served:
            return False
        if len(self._served) >= MAX_REMEMBERED:  # bounded: at worst an event is written twice in an hour
            self._served.clear()
        self._served.add(key)
        return True

    def _remember(self, artifact: dict[str, Any], client: ClientIdentity, rule: str, reason: str, decision: str):
        text = " ".join(str(artifact[k]) for k in ("address", "version", "platform") if artifact.get(k))
        self.recent.appendleft(Denial(self.clock(), text, client.name, rule, reason, decision))
        self.blocked[rule] += 1

    def denied(
        self, artifact: dict[str, Any], client: ClientIdentity, *, rule: str, reason: str, decision: str
    ) -> None:
        self._remember(artifact, client, rule, reason, decision)
        self.write("denied", artifact=artifact, decision=decision, rule=rule, reason=reason, **client.fields())


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
