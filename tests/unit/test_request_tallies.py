"""What is counted and logged per request: gathered in the process and written together (the metrics' tallies,
`proxy.runtime.metrics.Metrics.fold`; the access-log lines, `proxy.runtime.log.AccessLines`), and the request's
access-log line formatted directly (`proxy.runtime.log.request_line`)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from proxy.runtime import log, metrics, request_state
from proxy.runtime.metrics import DURATION_BUCKETS, Metrics

DURATIONS = (0.0, 0.004, 0.005, 0.0051, 0.3, 2.5, 899.0, 900.0, 1e6)  # on the bounds, between, beyond the last


def samples(exposition: bytes, prefix: str) -> list[str]:
    """The sample lines starting with `prefix`, without the series' creation times."""
    return sorted(
        line for line in exposition.decode().splitlines() if line.startswith(prefix) and "_created" not in line
    )


def test_tallied_requests_fold_into_exactly_what_observing_each_gives():
    tallied = Metrics()
    reference = CollectorRegistry()
    requests = Counter("registry_proxy_requests_total", "", ["route", "status"], registry=reference)
    seconds = Histogram(
        "registry_proxy_request_duration_seconds", "", ["route"], buckets=DURATION_BUCKETS, registry=reference
    )
    for route, status in (("mirror_json", 200), ("mirror_json", 304), ("mirror_archive", 404)):
        for duration in DURATIONS:
            tallied.count_request(route, status, duration)  # no event loop: folded at once
            requests.labels(route, str(status)).inc()
            seconds.labels(route).observe(duration)
    expected = generate_latest(reference)
    for prefix in ("registry_proxy_requests_total{", "registry_proxy_request_duration_seconds_"):
        assert samples(tallied.exposition(), prefix) == samples(expected, prefix)


def test_a_request_counted_with_its_cache_outcome_counts_it_as_count_cache_does():
    together, apart = Metrics(), Metrics()
    for outcome in ("hit", "hit", "stale"):
        together.count_request("mirror_json", 200, 0.002, outcome)  # no event loop: folded at once
        apart.count_request("mirror_json", 200, 0.002)
        apart.count_cache(outcome)
    together.count_request("mirror_json", 404, 0.002)  # no outcome: none counted
    apart.count_request("mirror_json", 404, 0.002)
    for prefix in ("registry_proxy_requests_total{", "registry_proxy_cache_total{"):
        assert samples(together.exposition(), prefix) == samples(apart.exposition(), prefix)
    assert together.registry.get_sample_value("registry_proxy_cache_total", {"outcome": "hit"}) == 2


async def test_on_the_event_loop_the_tallies_fold_within_a_second_or_when_reported(monkeypatch):
    monkeypatch.setattr(metrics, "FOLD_EVERY", 0.05)
    counted = Metrics()
    sample = counted.registry.get_sample_value
    counted.count_request("mirror_json", 200, 0.002)
    counted.count_cache("hit")
    assert sample("registry_proxy_requests_total", {"route": "mirror_json", "status": "200"}) == 0  # tallied
    while not sample("registry_proxy_cache_total", {"outcome": "hit"}):  # noqa: ASYNC110 - the fold's timer
        await asyncio.sleep(0.01)
    assert sample("registry_proxy_requests_total", {"route": "mirror_json", "status": "200"}) == 1
    assert sample("registry_proxy_request_duration_seconds_bucket", {"route": "mirror_json", "le": "0.005"}) == 1
    counted.count_request("mirror_json", 200, 0.002)
    assert b'registry_proxy_requests_total{route="mirror_json",status="200"} 2.0' in counted.exposition()
    counted.count_cache("miss")
    assert counted.totals().cache_misses == 1
    counted.count_cache("miss")
    counted.fold()  # the application's cleanup
    assert sample("registry_proxy_cache_total", {"outcome": "miss"}) == 2


async def test_access_lines_are_written_together_a_moment_later():
    stream = io.StringIO()
    lines = log.AccessLines(stream, after=0.05, limit=1 << 20)
    write = log._json_lines(lines)
    for n in range(3):
        write("request", {"status": 200, "request_id": str(n)})
    assert stream.getvalue() == ""
    while not stream.getvalue():  # noqa: ASYNC110 - the loop's timer
        await asyncio.sleep(0.01)
    assert [json.loads(line)["request_id"] for line in stream.getvalue().splitlines()] == ["0", "1", "2"]


async def test_access_lines_are_written_when_enough_gathered_before_other_lines_and_on_flush():
    stream = io.StringIO()
    lines = log.AccessLines(stream, after=3600, limit=100)
    lines.add("a" * 60 + "\n")
    assert stream.getvalue() == ""
    lines.add("b" * 60 + "\n")  # over the limit: both at once
    assert stream.getvalue() == "a" * 60 + "\n" + "b" * 60 + "\n"
    lines.add("c\n")
    other = log._AfterAccessLines(lines)  # where every other log line goes
    other.write("other\n")
    assert stream.getvalue().endswith("c\nother\n")
    lines.add("d\n")
    lines.flush()  # at shutdown
    assert stream.getvalue().endswith("other\nd\n")


class _Writes(io.StringIO):
    """A non-terminal stderr that keeps each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)


async def test_a_line_logged_from_a_thread_is_written_whole_after_the_access_lines_gathered_before_it(monkeypatch):
    """A SIGHUP's reload logs from a thread while the event loop gathers access-log lines: its line goes out in
    one write with them (a line written in two parts, the line then its newline, could have another write in
    between and be torn: the log would lose it)."""
    stderr = _Writes()
    monkeypatch.setattr(sys, "stderr", stderr)
    for name in ("_access_lines", "_access_writer"):
        monkeypatch.setattr(log, name, None)
    monkeypatch.setattr(logging, "basicConfig", lambda **_: None)  # stdlib logging as it is
    saved = structlog.get_config()
    try:
        log.setup_logging("json", "info")
        log.access("request", {"request_id": "r1"})  # gathered for a moment
        await asyncio.to_thread(structlog.get_logger("test").info, "policy.reloaded", pid=1)
        log.flush_access_log()
    finally:
        structlog.configure(**saved)
    assert stderr.writes and all(text.endswith("\n") for text in stderr.writes), stderr.writes
    events = [json.loads(line)["event"] for line in "".join(stderr.writes).splitlines()]
    assert events == ["request", "policy.reloaded"]


def test_a_request_line_formatted_directly_is_the_line_the_json_encoder_writes(monkeypatch):
    stream = io.StringIO()
    lines = log.AccessLines(stream, after=3600, limit=0)  # written at once
    monkeypatch.setattr(log, "_access_lines", lines)
    monkeypatch.setattr(log, "_access_writer", log._json_lines(lines))
    odd = ('/a"b\\c/ü/\u2028/\x01', 'curl/8 "x" \t\x7f é', None)
    for path, user_agent, remote in (("/x/index.json", "Terraform/1.11.0", "127.0.0.1"), odd):
        log.request_line("request", "GET", path, 200, 52, 0.41, "hit", remote, user_agent, "abc", 4321)
        direct = stream.getvalue().splitlines()[-1]
        fields = {
            "method": "GET",
            "path": path,
            "status": 200,
            "bytes": 52,
            "duration_ms": 0.41,
            "cache": "hit",
            "remote": remote,
            "user_agent": user_agent,
            "request_id": "abc",
            "pid": 4321,
        }
        log.access("request", fields)
        encoded = stream.getvalue().splitlines()[-1]
        timestamp = json.loads(encoded)["timestamp"]
        assert json.loads(direct) | {"timestamp": timestamp} == json.loads(encoded)
        assert direct.rsplit('"timestamp"', 1)[0] == encoded.rsplit('"timestamp"', 1)[0]  # byte for byte


def test_the_texts_request_lines_repeat_are_escaped_once_and_the_memo_stays_bounded(monkeypatch):
    stream = io.StringIO()
    lines = log.AccessLines(stream, after=3600, limit=0)  # written at once
    monkeypatch.setattr(log, "_access_lines", lines)
    monkeypatch.setattr(log, "_access_writer", log._json_lines(lines))
    monkeypatch.setattr(log, "JSON_STRINGS", 8)
    monkeypatch.setattr(log, "_json_strings", {None: "null"})
    written = []
    for n in range(6):  # each line brings new texts: the memo is emptied when it would hold more than 8
        agent = f'agent "{n % 3}"\n'
        log.request_line("request", "GET", f"/p/{n}", 200, 1, 0.5, "hit", None, agent, "id", 7)
        assert len(log._json_strings) <= 8
        written.append(json.loads(stream.getvalue().splitlines()[-1]))
    assert [(line["path"], line["user_agent"], line["remote"]) for line in written] == [
        (f"/p/{n}", f'agent "{n % 3}"\n', None) for n in range(6)
    ]
    assert log._json_strings['agent "2"\n'] == json.dumps('agent "2"\n')


def test_log_lines_carry_the_request_id_bound_for_the_request():
    request_state.begin_request("req-1")
    assert log.add_request_id(None, "info", {"event": "x"}) == {"event": "x", "request_id": "req-1"}
    assert log.add_request_id(None, "info", {"request_id": "own"})["request_id"] == "own"
