"""Slow and trickling upstreams against a real proxy process: deadlines, rate limits, slots, shutdown.

Issue 8 items 3 and 4. Each test prints the time it measured (run with `-s` to see them). The proxies
run with scaled timings (deadlines, TTLs and windows of 1-2 s); tests/unit/test_deadline_settings.py
keeps the defaults (2 s stale, 8 s request deadline: under terraform's 10 s) covered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import time
from collections.abc import Awaitable
from pathlib import Path

import pytest

from tests.conftest import PROVIDER
from tests.fakes.packages import Release
from tests.fakes.process import wait_for
from tests.fakes.registry import FakeRegistry, Fault

SLOW = 45.0  # an upstream this slow outlasts the proxy's 30 s upstream timeout and the clients' 10 s
MARGIN = 2.5  # how much later than its deadline an answer may come on a loaded machine
DISCOVERY_KEY = "discovery:registry.example.test"
VERSIONS_KEY = "versions:registry.example.test/acme/foo"
INDEX = f"/mirror/v1/{PROVIDER}/index.json"
VERSION_DOC = f"/mirror/v1/{PROVIDER}/1.0.0.json"
DISCOVERY = "/.well-known/terraform.json"
VERSIONS = "/v1/providers/acme/foo/versions"
DOWNLOAD_DOC = "/v1/providers/acme/foo/1.0.0/download/linux/amd64"
OTHER_HOST = "other.example.test"


def archive_url(host: str, name: str, version: str = "1.0.0", platform: str = "linux_amd64") -> str:
    return f"/mirror/v1/{host}/acme/{name}/{version}/{platform}/terraform-provider-{name}_{version}_{platform}.zip"


FOO_ARCHIVE = archive_url("registry.example.test", "foo")
BIG_ARCHIVE = archive_url("registry.example.test", "big")
BIG_VERSION_DOC = "/mirror/v1/registry.example.test/acme/big/1.0.0.json"
UNKNOWN_INDEX = "/mirror/v1/registry.example.test/acme/unknown/index.json"


async def timed(call: Awaitable) -> tuple[float, object]:
    started = time.perf_counter()
    result = await call
    return time.perf_counter() - started, result


def error_of(body: bytes) -> tuple[str, str]:
    """The code and the message of an error answer."""
    document = json.loads(body)
    return document["code"], document["errors"][0]


def part_files(data_dir: Path) -> list[Path]:
    return list((data_dir / "archives" / "tmp").rglob("*.part"))


def stored(data_dir: Path, sha256: str) -> bool:
    return (data_dir / "archives" / "sha256" / sha256[:2] / sha256[2:4] / sha256).exists()


def cached_keys(proc) -> set[str]:
    """The keys in the proxy's embedded metadata store (read-only, while the proxy runs)."""
    path = proc.data_dir / "metadata" / "metadata.sqlite"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return {key for (key,) in db.execute("SELECT key FROM metadata")}


def big_release(registry: FakeRegistry, signing_key, noise: int = 256 * 1024, name: str = "big") -> Release:
    """A provider whose archive is large enough to trickle for minutes."""
    return registry.add(Release("acme", name, "1.0.0", signing_key, platforms=("linux_amd64",), noise=noise))


async def warm(client, path: str, expected: int = 200) -> None:
    """GET `path` until it answers `expected`: with short deadlines a loaded machine may answer 504 first,
    while the fetch goes on in the background and lands in the cache."""
    async with asyncio.timeout(60):
        while (status := (await client.get(path))[0]) != expected:
            assert status == 504, f"{path}: {status}"


async def request_log(proc, path: str, nth: int) -> dict:
    """The access log record of the `nth` request for `path` (waiting for it to be written)."""

    def records() -> list[dict]:
        return [r for r in proc.events("request") if r.get("path") == path]

    await wait_for(lambda: len(records()) >= nth, 5, f"access log record {nth} of {path}")
    return records()[nth - 1]


# ---- item 3: stale-while-revalidate and the request deadline -----------------------------------


async def test_stale_index_is_answered_within_the_stale_deadline_from_a_45s_slow_upstream(
    in_process_proxy, connect, registry
):
    proc = await in_process_proxy("--ttl-discovery", "1s", "--ttl-versions", "1s", "--stale-deadline", "1s")
    client = await connect(proc, timeout=15)
    status, _, warm = await client.get(INDEX)
    assert status == 200
    await proc.wait_stale(1, DISCOVERY_KEY, VERSIONS_KEY)
    registry.faults[DISCOVERY] = Fault(delay=SLOW)
    registry.faults[VERSIONS] = Fault(delay=SLOW)

    elapsed, (status, _, body) = await timed(client.get(INDEX))
    print(f"\nstale index.json with a {SLOW:g}s-slow upstream answered in {elapsed:.2f}s")
    assert status == 200 and json.loads(body) == json.loads(warm)
    assert elapsed < 1 + MARGIN, f"stale answer took {elapsed:.1f}s (stale deadline 1 s)"
    assert (await request_log(proc, INDEX, 2))["cache"] == "stale"

    # A second client joins the refreshes already running: again a quick stale answer, no new upstream call.
    elapsed, (status, _, _) = await timed(client.get(INDEX))
    assert status == 200 and elapsed < 1 + MARGIN
    assert registry.count(DISCOVERY) == 2 and registry.count(VERSIONS) == 2


async def test_background_refresh_lands_without_another_client_wait(in_process_proxy, connect, registry, signing_key):
    # The refreshed list must still be fresh when the third request comes, after the refresh is seen to land.
    proc = await in_process_proxy("--ttl-versions", "2s", "--stale-deadline", "1s")
    client = await connect(proc, timeout=15)
    assert (await client.get(INDEX))[0] == 200
    await proc.wait_stale(2, VERSIONS_KEY)
    listed_at = proc.fetched_at(VERSIONS_KEY)
    registry.add(Release("acme", "foo", "1.2.0", signing_key))
    registry.faults[VERSIONS] = Fault(delay=3)  # slower than the stale deadline, faster than the timeout

    elapsed, (status, _, body) = await timed(client.get(INDEX))
    assert status == 200 and "1.2.0" not in json.loads(body)["versions"]
    assert elapsed < 2.9, f"stale answer took {elapsed:.1f}s, it waited for the refresh"
    await wait_for(lambda: registry.completed_count(VERSIONS) == 2, 10, "the background refresh")
    # (the upstream answered; the proxy stores the answer a moment later)
    await wait_for(lambda: proc.fetched_at(VERSIONS_KEY) != listed_at, 10, "the refreshed list in the cache")

    elapsed, (status, _, body) = await timed(client.get(INDEX))
    assert status == 200 and "1.2.0" in json.loads(body)["versions"]
    assert (await request_log(proc, INDEX, 3))["cache"] == "hit"  # the refresh landed in the cache
    assert registry.count(VERSIONS) == 2


async def test_cold_miss_against_a_45s_slow_upstream_is_a_504_at_the_request_deadline(
    in_process_proxy, connect, registry
):
    proc = await in_process_proxy("--request-deadline", "1s", "--stale-deadline", "1s")
    client = await connect(proc, timeout=15)
    await warm(client, UNKNOWN_INDEX, 404)  # discovery is cached: the version list is the one step left
    registry.faults[VERSIONS] = Fault(delay=SLOW)
    elapsed, (status, headers, body) = await timed(client.get(INDEX))
    print(f"\ncold index.json with a {SLOW:g}s-slow upstream: {status} in {elapsed:.2f}s")
    assert status == 504 and elapsed < 1 + MARGIN
    assert headers["Content-Type"].startswith("application/json")
    code, message = error_of(body)
    assert code == "upstream_timeout" and f"{registry.url}{VERSIONS}" in message  # names the upstream URL
    assert proc.events("upstream.deadline_exceeded")


async def test_cold_version_document_with_serial_slow_steps_is_a_504_at_the_request_deadline(
    in_process_proxy, connect, registry
):
    proc = await in_process_proxy("--request-deadline", "3s", "--stale-deadline", "1s")
    client = await connect(proc, timeout=15)
    for path in (DISCOVERY, VERSIONS):
        registry.faults[path] = Fault(delay=0.6)  # each step well within its own timeout ...
    registry.faults[DOWNLOAD_DOC] = Fault(delay=SLOW)  # ... but together with this one far beyond the deadline
    elapsed, (status, _, body) = await timed(client.get(VERSION_DOC))
    print(f"\ncold 1.0.0.json, serial slow steps: {status} in {elapsed:.2f}s")
    assert status == 504 and elapsed < 3 + MARGIN
    code, message = error_of(body)
    assert code == "upstream_timeout" and DOWNLOAD_DOC in message  # names the step that did not answer


async def test_cold_fetch_goes_on_after_the_504_and_the_next_request_finds_it(in_process_proxy, connect, registry):
    proc = await in_process_proxy("--request-deadline", "1s", "--stale-deadline", "1s")
    client = await connect(proc, timeout=15)
    registry.faults[VERSIONS] = Fault(delay=2.5)
    status, _, _ = await client.get(INDEX)
    assert status == 504
    await wait_for(lambda: registry.completed_count(VERSIONS) == 1, 10, "the shared fetch")
    await wait_for(
        lambda: "versions:registry.example.test/acme/foo" in cached_keys(proc),
        10,
        "the answer to reach the proxy's cache",
    )
    elapsed, (status, _, body) = await timed(client.get(INDEX))
    assert status == 200 and "1.1.0" in json.loads(body)["versions"]
    assert elapsed < 1 and registry.count(VERSIONS) == 1


async def test_request_deadline_bounds_archive_metadata_but_not_a_slow_download(
    in_process_proxy, connect, registry, signing_key
):
    proc = await in_process_proxy("--request-deadline", "1s", "--stale-deadline", "1s")
    client = await connect(proc, timeout=20)
    big = big_release(registry, signing_key, noise=1024 * 1024)
    await warm(client, INDEX)  # the version list is cached: the download document is the one step left
    await warm(client, BIG_VERSION_DOC)
    registry.faults[DOWNLOAD_DOC] = Fault(delay=SLOW)
    elapsed, (status, _, body) = await timed(client.get(FOO_ARCHIVE))
    assert status == 504 and elapsed < 1 + MARGIN, (status, elapsed)
    code, message = error_of(body)
    assert code == "upstream_timeout" and DOWNLOAD_DOC in message

    registry.archive_chunk_delay = 0.4  # ~2 s for 1 MiB: far above the minimum rate, longer than the deadline
    elapsed, (status, _, body) = await timed(client.get(BIG_ARCHIVE))
    assert status == 200 and body == big.zips["linux_amd64"]
    assert elapsed > 1


# ---- item 4: trickling downloads, slots, shutdown --------------------------------------------------


async def test_trickling_archive_is_aborted_within_the_window_and_nothing_is_stored(
    in_process_proxy, connect, registry, signing_key
):
    big = big_release(registry, signing_key)
    upstream_path = registry.archive_path(big, "linux_amd64")
    registry.trickle[upstream_path] = 1024  # 1 KiB/s: 256 KiB would take over four minutes
    proc = await in_process_proxy("--min-download-rate", "32KiB", "--download-rate-window", "1s")
    client = await connect(proc, timeout=20)
    elapsed, (status, _, body) = await timed(client.get(BIG_ARCHIVE))
    print(f"\ntrickling archive (1 KiB/s) aborted after {elapsed:.2f}s with {status}")
    assert status == 504 and elapsed < 2 + MARGIN  # the window, and as long again before the rate counts
    code, message = error_of(body)
    assert code == "upstream_too_slow" and "below the minimum" in message  # the rate, not the idle timeout
    assert not stored(proc.data_dir, big.sha256("linux_amd64"))
    await wait_for(lambda: not part_files(proc.data_dir), 5, "the temp file to be removed")

    registry.trickle.clear()  # nothing bad was remembered: the next request downloads and verifies
    status, _, body = await client.get(BIG_ARCHIVE)
    assert status == 200 and body == big.zips["linux_amd64"]
    assert registry.count(upstream_path) == 2


async def test_stalled_download_hits_the_idle_timeout(in_process_proxy, connect, registry, signing_key):
    big = big_release(registry, signing_key)
    registry.stall[registry.archive_path(big, "linux_amd64")] = 1000  # some bytes, then silence
    proc = await in_process_proxy("--download-idle-timeout", "1s", "--min-download-rate", "0")
    client = await connect(proc, timeout=20)
    elapsed, (status, _, body) = await timed(client.get(BIG_ARCHIVE))
    assert status == 504 and elapsed < 8
    code, message = error_of(body)
    assert code == "upstream_too_slow" and "sent nothing" in message  # the idle timeout, not the rate
    assert not stored(proc.data_dir, big.sha256("linux_amd64"))


async def start_trickle(client, registry: FakeRegistry, path: str, upstream_path: str) -> asyncio.Task:
    """A client download of `path` that is trickling from the upstream once this returns."""
    task = asyncio.create_task(client.get(path))
    await wait_for(lambda: registry.count(upstream_path) >= 1, 10, "the trickling download to start")
    return task


@pytest.fixture
async def other_registry(upstream_ssl, signing_key):
    """A second upstream host (its own port) with provider acme/bar."""
    fake = FakeRegistry(upstream_ssl)
    fake.add(Release("acme", "bar", "1.0.0", signing_key))
    await fake.start()
    yield fake
    await fake.stop()


async def test_one_slow_host_cannot_take_the_slots_of_another(
    in_process_proxy, connect, registry, other_registry, signing_key
):
    big = big_release(registry, signing_key)
    upstream_path = registry.archive_path(big, "linux_amd64")
    registry.trickle[upstream_path] = 1024
    proc = await in_process_proxy(
        "--upstream-map",
        f"{OTHER_HOST}={other_registry.url}",
        "--upstream-host-concurrency",
        "1",
        "--download-slot-wait",
        "1s",
        "--shutdown-grace",
        "1s",
    )
    client = await connect(proc, timeout=20)
    trickling = await start_trickle(client, registry, BIG_ARCHIVE, upstream_path)

    elapsed, (status, _, body) = await timed(client.get(archive_url(OTHER_HOST, "bar")))
    assert status == 200 and body == other_registry.releases[("acme", "bar")]["1.0.0"].zips["linux_amd64"]
    assert elapsed < 5, f"the other host's download waited {elapsed:.1f}s"

    # The slow host's own slot is taken: a second download from it waits a bounded time, then 503.
    elapsed, (status, _, body) = await timed(client.get(FOO_ARCHIVE))
    print(f"\ndownload slot wait ended after {elapsed:.2f}s with {status}")
    assert status == 503 and elapsed < 6
    assert error_of(body)[0] == "upstream_busy"
    assert not trickling.done()
    trickling.cancel()


async def test_same_host_downloads_within_the_per_host_cap_are_not_blocked(
    in_process_proxy, connect, registry, signing_key
):
    big = big_release(registry, signing_key)
    upstream_path = registry.archive_path(big, "linux_amd64")
    registry.trickle[upstream_path] = 1024
    proc = await in_process_proxy(
        "--upstream-host-concurrency", "2", "--upstream-concurrency", "2", "--shutdown-grace", "1s"
    )
    client = await connect(proc, timeout=20)
    trickling = await start_trickle(client, registry, BIG_ARCHIVE, upstream_path)
    elapsed, (status, _, body) = await timed(client.get(FOO_ARCHIVE))
    assert status == 200 and body == registry.releases[("acme", "foo")]["1.0.0"].zips["linux_amd64"]
    assert elapsed < 5
    assert not trickling.done()
    trickling.cancel()


async def test_sigterm_during_a_trickling_download_exits_within_the_grace(
    proxy_process, connect, registry, signing_key
):
    big = big_release(registry, signing_key)
    upstream_path = registry.archive_path(big, "linux_amd64")
    registry.trickle[upstream_path] = 1024
    proc = await proxy_process("--shutdown-grace", "1s")
    client = await connect(proc, timeout=30)
    trickling = await start_trickle(client, registry, BIG_ARCHIVE, upstream_path)
    await wait_for(lambda: bool(part_files(proc.data_dir)), 10, "the download's temp file")

    proc.process.send_signal(signal.SIGTERM)
    elapsed, code = await timed(asyncio.wait_for(proc.process.wait(), 15))
    print(f"\nSIGTERM with a trickling download in flight: exit {code} after {elapsed:.2f}s (grace 1 s)")
    assert code == 0 and elapsed < 1 + 5  # the grace and the clean-up; the trickle alone would take minutes
    assert not part_files(proc.data_dir)
    assert not stored(proc.data_dir, big.sha256("linux_amd64"))
    assert proc.events("proxy.fetches_cancelled")
    status, _, body = await trickling  # the waiting client got an answer, not a dropped connection
    assert (status, error_of(body)[0]) == (503, "shutting_down")
