"""The audit trail (`--audit-log FILE|stdout`): one JSON line per decision that matters, apart from the access log.

Events (`event`):
- `fetched`: an artifact (provider archive, module) was fetched from its upstream;
- `served`: an archive was served to a client (once per client, artifact and hour in each worker process);
- `denied`: the policy refused a request (`decision`: `deny`), or would have in warn mode (`would-deny`), or
  left a version out of a list (`withheld`: once per client, version and hour, when the list is filtered anew).

Every event has `time` (UTC, ISO 8601), `event`, `artifact` (address, version, platform), and where there
is a client its identity (`client`: token name or `anonymous`, `address`, later an OIDC `subject`) and
the `request_id` of the access log; a denial has `rule` and `reason`. Never a token or a secret.
Each event is written whole or not at all (`AuditFile`): one `write` of the whole line to a file opened for
appending, under an advisory lock (`flock`) shared by the workers of one proxy (and replicas sharing a file on a
file system that honours it); a short write (a full disk) is taken back (`ftruncate` to where the line began)
before the lock is released, so no other writer's line can follow the torn one. Nothing is buffered: an event
that could not be written is dropped, never written later out of order. Drops are counted (`on_dropped`: the
metric) and logged once per episode (`audit.dropping` when the first is dropped, with the reason;
`audit.resumed` with the count once a write succeeds again). With `required` (`--audit-required`) the request
that would have produced the event is refused instead (`AuditUnavailableError`, 503). SIGHUP reopens the file
(`reopen`: after a rotation the events go to a new file at the same path). The last denials and the count per
rule are kept in memory for the page (`recent_denials`, `blocked_by_rule`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

import structlog

from proxy.errors import AuditUnavailableError
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


class AuditFile:
    """An audit log file: every line appended whole or not at all, and reopened at the same path on SIGHUP.

    Why a lock and a truncation: `write` on a full disk may write part of a line and report the count. Left
    there, the next line is glued onto the half one. Taking it back needs the offset where the line began and
    no other writer in between, so every append holds `flock` (the workers of a proxy each open the file, so
    each has its own open file description and the lock excludes them all) around `fstat`, `write` and, on a
    short write, `ftruncate`. The lock is held for a few microseconds per event; events are rare next to
    requests (a `served` once per client, artifact and hour)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)  # reopened at the same place whatever the working directory then
        self._descriptor = _open_for_appending(path)
        self._swap = threading.Lock()  # `reopen` runs in a thread (the SIGHUP reload), appends on the loop

    def append(self, line: bytes) -> None:
        """Append `line` whole, or raise OSError having written nothing."""
        with self._swap:
            descriptor = self._descriptor
            if descriptor < 0:
                raise OSError(errno.EBADF, "the audit log is closed")
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            try:
                start = os.fstat(descriptor).st_size
                written = os.write(descriptor, line)
                if written != len(line):
                    os.ftruncate(descriptor, start)  # the torn line taken back, before any other writer's
                    raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({written} of {len(line)} bytes)")
            finally:
                fcntl.flock(descriptor, fcntl.LOCK_UN)

    def reopen(self) -> None:
        """Open the path again (a rotation renamed the file): later events go to the file now at the path."""
        descriptor = _open_for_appending(self.path)
        with self._swap:
            old, self._descriptor = self._descriptor, descriptor
        if old >= 0:
            os.close(old)

    def close(self) -> None:
        with self._swap:
            old, self._descriptor = self._descriptor, -1
        if old >= 0:
            os.close(old)


def _open_for_appending(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)


class _Stream:
    """`--audit-log stdout` (or a test's stream): one write and a flush per line; no whole-line guarantee."""

    def __init__(self, stream: IO[str]) -> None:
        self.path = getattr(stream, "name", "stdout")
        self._stream = stream

    def append(self, line: bytes) -> None:
        self._stream.write(line.decode())
        self._stream.flush()

    def reopen(self) -> None:
        pass

    def close(self) -> None:
        pass


class AuditLog:
    """The audit stream (a no-op sink without `--audit-log`, still keeping recent denials for the page)."""

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        required: bool = False,
        on_dropped: Callable[[], None] | None = None,
    ) -> None:
        self._sink: AuditFile | _Stream | None = None if stream is None else _Stream(stream)
        self.clock = clock
        self.required = required
        self.on_dropped = on_dropped
        self.dropped = 0  # events dropped in the current episode (0: writing)
        self._served: set[tuple[str, str, int]] = set()
        self._served_period = -1
        self.recent: deque[Denial] = deque(maxlen=RECENT_DENIALS)
        self.blocked: Counter[str] = Counter()

    @classmethod
    def open(
        cls, target: str | None, *, required: bool = False, on_dropped: Callable[[], None] | None = None
    ) -> AuditLog:
        """The sink for `--audit-log`: None (nowhere), `stdout`, or a file appended to (made if missing)."""
        if target is None:
            return cls()
        if target in ("stdout", "-"):
            return cls(sys.stdout, required=required, on_dropped=on_dropped)
        sink = cls(required=required, on_dropped=on_dropped)
        sink._sink = AuditFile(target)
        return sink

    @property
    def enabled(self) -> bool:
        return self._sink is not None

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()
            self._sink = None

    def reopen(self) -> None:
        """SIGHUP: open the audit log's path again (after a rotation); on failure the old file is kept."""
        if self._sink is None:
            return
        try:
            self._sink.reopen()
        except OSError as exc:
            log.error("audit.reopen_failed", file=self._sink.path, error=str(exc), effect="still writing the old file")
            return
        log.info("audit.reopened", file=self._sink.path, pid=os.getpid())

    def write(self, event: str, **fields: Any) -> bool:
        """One event as one JSON line, whole or not at all (nothing without a sink). False: dropped (counted);
        with `required`, AuditUnavailableError instead."""
        if self._sink is None:
            return True
        line = json.dumps({"time": _iso(self.clock()), "event": event, **fields}, separators=(",", ":"))
        try:
            self._sink.append(line.encode() + b"\n")
        except (OSError, ValueError) as exc:  # a full disk, a closed stdout
            self._drop(exc)
            if self.required:
                raise AuditUnavailableError(
                    f"the audit log cannot be written ({_reason(exc)}) and --audit-required is set: "
                    "nothing is served unaudited"
                ) from exc
            return False
        if self.dropped:
            log.warning("audit.resumed", file=self._sink.path, dropped=self.dropped, pid=os.getpid())
            self.dropped = 0
        return True

    def _drop(self, exc: BaseException) -> None:
        if self.on_dropped is not None:
            self.on_dropped()
        self.dropped += 1
        if self.dropped == 1:  # one line per episode, not per event
            log.warning(
                "audit.dropping",
                file=getattr(self._sink, "path", None),
                reason=_reason(exc),
                pid=os.getpid(),
                effect="requests that produce an event are refused (503 audit_unavailable) until it can be written"
                if self.required
                else "events are dropped and counted (registry_proxy_audit_events_dropped_total) until it can be "
                "written",
            )

    def fetched(self, artifact: dict[str, Any]) -> None:
        self.write("fetched", artifact=artifact)

    def served(self, artifact: dict[str, Any], client: ClientIdentity) -> None:
        """A `served` event, unless this client was already recorded for this artifact in this hour."""
        if self._sink is None:
            return
        key = (client.name, client.address or "", json.dumps(artifact, sort_keys=True))
        if not self._written_this_hour(key) and self.write("served", artifact=artifact, **client.fields()):
            self._note_written(key)

    def withheld(self, artifact: dict[str, Any], client: ClientIdentity, *, rule: str, reason: str) -> None:
        """A version left out of a list (once per client, version and hour): `denied` with `withheld`."""
        key = (client.name, "withheld", json.dumps(artifact, sort_keys=True))
        if self._written_this_hour(key):
            return
        self._remember(artifact, client, rule, reason, "withheld")
        if self.write("denied", artifact=artifact, decision="withheld", rule=rule, reason=reason, **client.fields()):
            self._note_written(key)

    def _written_this_hour(self, key: tuple) -> bool:
        """Whether the once-an-hour event `key` was written in this hour (one dropped or refused was not: the next
        request tries again)."""
        period = int(self.clock() // SERVED_PERIOD)
        if period != self._served_period:
            self._served.clear()
            self._served_period = period
        return key in self._served

    def _note_written(self, key: tuple) -> None:
        if len(self._served) >= MAX_REMEMBERED:  # bounded: at worst an event is written twice in an hour
            self._served.clear()
        self._served.add(key)

    def _remember(self, artifact: dict[str, Any], client: ClientIdentity, rule: str, reason: str, decision: str):
        text = " ".join(str(artifact[k]) for k in ("address", "version", "platform") if artifact.get(k))
        self.recent.appendleft(Denial(self.clock(), text, client.name, rule, reason, decision))
        self.blocked[rule] += 1

    def denied(
        self, artifact: dict[str, Any], client: ClientIdentity, *, rule: str, reason: str, decision: str
    ) -> None:
        self._remember(artifact, client, rule, reason, decision)
        self.write("denied", artifact=artifact, decision=decision, rule=rule, reason=reason, **client.fields())


def _reason(exc: BaseException) -> str:
    return (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
