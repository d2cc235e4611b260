"""What is counted and logged per request is gathered in the process and written together: the metrics' tallies
(`proxy.runtime.metrics.Metrics.fold`) and the access-log lines (`proxy.runtime.log.AccessLines`)."""

from __future__ import annotations

import asyncio
import io
import json

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from proxy.runtime import log, metrics
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
