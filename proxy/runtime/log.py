"""Logging: structlog set-up (JSON when not on a terminal; console lines in colour only on one), request ids and
cache status.

A request id (from `X-Request-Id` or a new one) is kept in the request's state (`proxy.runtime.request_state`) and
added to every log line of the request (`add_request_id`, a structlog processor). The cache outcome of a request
(hit, miss, stale) is noted there too, for the access log.

Access-log lines (`access`) are the one thing logged per request: with JSON logging they are
written as one JSON line directly, the same fields a structlog line has, without its processor
chain (a third of the cost), and a request's line with the usual fields (`request_line`) is formatted
directly, at a fifth of the JSON encoder's cost; otherwise they go through structlog like every other line.
The JSON lines are written together (`AccessLines`): one write for the lines of `ACCESS_FLUSH_AFTER` seconds
or `ACCESS_BUFFER_BYTES`, and always before any other log line (the log keeps its order) and when the process
ends (`flush_access_log`: the application's cleanup, and at exit): no line is lost on a stop. Lines are logged
from threads too (a SIGHUP's reload, `asyncio.to_thread`): each is written in one piece (`WriteLogger`: the line
and its newline in one write), after the access-log lines gathered before it and under the same lock as the
event loop's writes, so no line is torn by another or lost.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TextIO

import structlog

from proxy.runtime.request_state import current

_escape = json.encoder.encode_basestring_ascii  # a str as a JSON string (C): what the JSON encoder does
_access_log = structlog.get_logger("proxy.access")
_access_writer: Callable[[str, dict[str, Any]], None] | None = None  # set up by setup_logging for JSON
ACCESS_FLUSH_AFTER = 0.05  # seconds an access-log line waits for others at most
ACCESS_BUFFER_BYTES = 64 * 1024  # access-log lines written at once when this much has gathered


class AccessLines:
    """Lines for `stream` written together: once `limit` characters have gathered, `after` seconds after the
    first of them (on the running event loop; at once without one), and on `flush`. Safe from any thread: they
    are written under one lock (a line is added without it), and only the event loop's own calls touch its timer."""

    def __init__(self, stream: TextIO, *, after: float = ACCESS_FLUSH_AFTER, limit: int = ACCESS_BUFFER_BYTES) -> None:
        self.stream = stream
        self._after = after
        self._limit = limit
        self._lines: list[str] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None
        self._lock = threading.Lock()

    def add(self, line: str) -> None:
        self._lines.append(line)  # one step under the GIL: a write from another thread takes whole lines
        self._size += len(line)  # (a count another thread resets may be off by a line: it only says when to write)
        if self._size >= self._limit:
            self.write_before("")
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(self._after, self._on_timer)
            except RuntimeError:  # no event loop: nothing would write them later
                self.write_before("")

    def _on_timer(self) -> None:
        self._timer = None
        self.write_before("")

    def flush(self) -> None:
        """Write the lines gathered (on the event loop's thread, or once it has stopped)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.write_before("")

    def write_before(self, text: str) -> None:
        """Write the lines gathered, then `text` (from any thread; the timer, if any, finds nothing left)."""
        with self._lock:
            lines = self._lines
            if count := len(lines):  # the lines gathered so far; one added meanwhile stays for the next write
                text = "".join(lines[:count]) + text
                del lines[:count]
                self._size = 0
            if text:
                self.stream.write(text)
                self.stream.flush()


class _AfterAccessLines:
    """The stream other log lines go to: the access-log lines gathered before them are written first."""

    def __init__(self, lines: AccessLines) -> None:
        self._lines = lines

    def write(self, text: str) -> int:
        self._lines.write_before(text)
        return len(text)

    def flush(self) -> None:
        pass  # every write is flushed


_access_lines: AccessLines | None = None  # with JSON logging: the access-log lines not yet written


def flush_access_log() -> None:
    """Write the access-log lines gathered so far (at shutdown: none is lost)."""
    if _access_lines is not None:
        _access_lines.flush()


def setup_logging(fmt: str = "auto", level: str = "info") -> None:
    """Configure structlog and stdlib logging once, at start-up."""
    stream = _setup_structlog(fmt, level)
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=stream)


@contextmanager
def command_logging() -> Iterator[None]:
    """The log of a command besides `serve`, while it runs: info and above on stderr, JSON unless on a terminal
    (never the debug lines of an unconfigured structlog). A process that set structlog up already keeps its own
    set-up; one that had not (a test running commands in its own process) gets the defaults back afterwards."""
    global _access_writer, _access_lines
    if structlog.is_configured():
        yield
        return
    before = _access_writer, _access_lines
    _setup_structlog("auto", "info", cache=False)  # a logger used meanwhile is not left bound to this set-up
    try:
        yield
    finally:
        flush_access_log()
        structlog.reset_defaults()
        _access_writer, _access_lines = before


def _setup_structlog(fmt: str, level: str, *, cache: bool = True) -> Any:
    """Configure structlog (`cache`: each logger bound to it on first use, for speed); the stream its lines go
    to."""
    terminal = sys.stderr.isatty()
    as_json = fmt == "json" or (fmt == "auto" and not terminal)
    # Colour codes only for a terminal (never into a pipe or a file) and not under NO_COLOR (no-color.org).
    colors = terminal and not os.environ.get("NO_COLOR")
    renderer = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer(colors=colors)
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    global _access_writer, _access_lines
    flush_access_log()  # set up again (tests): what the last set-up gathered first
    _access_lines = AccessLines(sys.stderr) if as_json and numeric <= logging.INFO else None
    _access_writer = _json_lines(_access_lines) if _access_lines is not None else None
    stream: Any = sys.stderr if _access_lines is None else _AfterAccessLines(_access_lines)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            add_request_id,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(file=stream),  # a line in one write
        cache_logger_on_first_use=cache,
    )
    return stream


atexit.register(flush_access_log)


def current_request_id() -> str | None:
    state = current()
    return None if state is None else state.request_id


def add_request_id(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: the request's id on every line logged while it is served."""
    request_id = current_request_id()
    if request_id is not None:
        event_dict.setdefault("request_id", request_id)
    return event_dict


def _json_lines(lines: AccessLines | TextIO) -> Callable[[str, dict[str, Any]], None]:
    encode = json.JSONEncoder(default=repr).encode
    add = lines.add if isinstance(lines, AccessLines) else lines.write

    def write(event: str, fields: dict[str, Any]) -> None:
        fields["event"] = event
        fields["level"] = "info"
        fields["timestamp"] = _stamp.now()
        add(encode(fields) + "\n")

    return write


class _Timestamps:
    """ISO 8601 UTC timestamps with microseconds, as structlog's `TimeStamper(fmt="iso", utc=True)` writes them
    (`2026-11-25T09:43:36.123456Z`), with the part up to the second formatted once per second."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._second = -1
        self._prefix = ""

    def now(self) -> str:
        now = self._clock()
        second = int(now)
        if second != self._second:
            self._second = second
            self._prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        return f"{self._prefix}.{min(round((now - second) * 1e6), 999_999):06d}Z"


_stamp = _Timestamps()


def request_line(
    event: str,
    method: str,
    path: str,
    status: int,
    sent: int,
    duration_ms: float,
    cache: str,
    remote: str | None,
    user_agent: str,
    request_id: str,
    pid: int,
) -> None:
    """`access(event, fields)` with a request's usual fields, in this order (a line as the JSON encoder writes it,
    formatted directly)."""
    lines = _access_lines
    if lines is None or _access_writer is None:
        fields = {
            "method": method,
            "path": path,
            "status": status,
            "bytes": sent,
            "duration_ms": duration_ms,
            "cache": cache,
            "remote": remote,
            "user_agent": user_agent,
            "request_id": request_id,
            "pid": pid,
        }
        access(event, fields)
        return
    known = _json_strings.get
    texts = (known(method), known(path), known(cache), known(remote), known(user_agent), known(event))
    if None in texts:
        texts = _remember_json_strings(method, path, cache, remote, user_agent, event)
    method_, path_, cache_, remote_, user_agent_, event_ = texts
    lines.add(
        f'{{"method": {method_}, "path": {path_}, "status": {status}, "bytes": {sent}, "duration_ms": {duration_ms!r}, '
        f'"cache": {cache_}, "remote": {remote_}, "user_agent": {user_agent_}, "request_id": {_escape(request_id)}, '
        f'"pid": {pid}, "event": {event_}, "level": "info", "timestamp": "{_stamp.now()}"}}\n'
    )


# The texts access-log lines repeat (methods, paths, cache outcomes, client addresses, user agents, events) as JSON
# strings, each escaped once (the escape is most of a line's cost otherwise); emptied when it holds `JSON_STRINGS`.
JSON_STRINGS = 4096
_json_strings: dict[str | None, str] = {None: "null"}


def _remember_json_strings(*texts: str | None) -> tuple[str, ...]:
    """`texts` as JSON strings (None: `null`), remembered for the next lines."""
    if len(_json_strings) + len(texts) > JSON_STRINGS:
        _json_strings.clear()
        _json_strings[None] = "null"
    for text in texts:
        if text not in _json_strings:
            _json_strings[text] = _escape(text)  # type: ignore[arg-type]  # None is always known
    return tuple(_json_strings[text] for text in texts)


def access(event: str, fields: dict[str, Any]) -> None:
    """One access-log line at level info (`fields` should hold the request id; it is consumed)."""
    writer = _access_writer
    if writer is None:
        _access_log.info(event, **fields)
    else:
        writer(event, fields)


def new_request_id(given: str | None) -> str:
    """The client's request id if it is sane, else a fresh one (64 random bits: an id for the log, not a secret;
    `random` is seeded anew in each forked worker)."""
    if given and len(given) <= 128 and given.isprintable() and " " not in given:
        return given
    return random.getrandbits(64).to_bytes(8).hex()


def note_cache(status: str) -> None:
    """Record a cache outcome (hit, miss or stale) for the current request."""
    state = current()
    if state is not None:
        state.note_cache(status)


def request_cache_status() -> str:
    """The worst outcome seen by this request: stale > miss > hit; '-' if the cache was not used."""
    state = current()
    return "-" if state is None or state.cache is None else state.cache
