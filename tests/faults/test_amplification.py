"""Upstream amplification and the bounded negative cache (issue 8, item 8), against real proxy processes.

Made-up versions and platforms are answered from the cached version lists, never by asking the upstream
per version or platform; remembered 404s of made-up names stay within `--negative-cache-entries` and
`--negative-cache-bytes` in both metadata stores, and do not push out warm entries.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time
import uuid

import pytest
import redis

from tests.fakes.packages import MODULE_FILES, Release, module_tar_gz
from tests.fakes.redis_server import METADATA_SECRET
from tests.fakes.registry import Fault, ModuleRelease

HOST = "registry.example.test"
PROVIDER = f"{HOST}/acme/foo"
MIRROR = f"/mirror/v1/{PROVIDER}"
REGISTRY = f"/registry/{HOST}/providers/v1/acme/foo"
MODULES = f"/registry/{HOST}/modules/v1/acme/net/aws"
LINUX_ZIP = "terraform-provider-foo_1.0.0_linux_amd64.zip"
VERSIONS_KEY = f"versions:{PROVIDER}"
RECHECK_INTERVAL = 1.0  # --ttl-negative: a version list is rechecked at most this often
# The negative cache's bound, and a flood of made-up names ten times as large
NEGATIVE_ENTRIES, FLOOD = 20, 200


def archive_url(version: str, platform: str) -> str:
    return f"{MIRROR}/{version}/{platform}/terraform-provider-foo_{version}_{platform}.zip"


def upstream_since(registry, start: int) -> list[str]:
    return [path for _, path in registry.requests[start:]]


def error_of(body: bytes) -> tuple[str, str]:
    """The code and the message of an error answer."""
    document = json.loads(body)
    assert isinstance(document["errors"], list) and len(document["errors"]) == 1, document
    return document["code"], document["errors"][0]


async def gather_limited(calls, limit: int = 16) -> list:
    slots = asyncio.Semaphore(limit)

    async def one(call):
        async with slots:
            return await call

    return await asyncio.gather(*(one(c) for c in calls))


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{name} missing from /metrics"
    return float(match.group(1))


# ---- item 1: validate against the cached lists before any per-version/per-platform request --------------


async def test_hostile_lock_requests_cause_a_handful_of_upstream_requests(in_process_proxy, connect, registry):
    proc = await in_process_proxy()
    client = await connect(proc, timeout=120)
    start = len(registry.requests)

    async def hostile(number: int) -> tuple[int, dict, bytes]:
        query = "&".join(f"platform=fake{number}_arch{i}" for i in range(64))
        return await client.get(f"/lock/v1/{PROVIDER}/1.0.0?{query}")

    answers = await gather_limited(hostile(n) for n in range(100))
    for number, (status, headers, body) in enumerate(answers):
        assert status == 404, body
        assert headers["Content-Type"].startswith("application/json")
        code, message = error_of(body)
        assert code == "package_not_found"
        assert f"fake{number}_arch0" in message and f"fake{number}_arch63" in message, message
    caused = upstream_since(registry, start)
    assert not [p for p in caused if "/download/" in p or p.startswith("/files/")], (len(caused), caused[:5])
    assert len(caused) <= 3, (len(caused), caused[:5])  # discovery and the version list, nothing per platform


async def test_made_up_archive_urls_never_reach_the_upstream(in_process_proxy, connect, registry):
    proc = await in_process_proxy()
    client = await connect(proc, timeout=120)
    start = len(registry.requests)
    urls = []
    for i in range(1000):
        kind = i % 4
        if kind == 0:
            urls.append((archive_url(f"9.9.{i}", "linux_amd64"), f"9.9.{i}", "version_not_found"))
        elif kind == 1:
            urls.append((archive_url("1.0.0", f"fake{i}_arm64"), f"fake{i}_arm64", "package_not_found"))
        elif kind == 2:
            urls.append((f"{REGISTRY}/9.9.{i}/download/linux/amd64", f"9.9.{i}", "version_not_found"))
        else:
            urls.append((f"{REGISTRY}/1.0.0/download/fake{i}/amd64/SHA256SUMS", f"fake{i}_amd64", "package_not_found"))
    answers = await gather_limited(client.get(url) for url, _, _ in urls)
    for (url, named, expected), (status, headers, body) in zip(urls, answers, strict=True):
        assert status == 404, (url, body)
        assert headers["Content-Type"].startswith("application/json"), url
        code, message = error_of(body)
        assert code == expected and named in message, (url, body)  # each answer is about its own URL
    caused = upstream_since(registry, start)
    assert not [p for p in caused if "/download/" in p or p.startswith("/files/")], (len(caused), caused[:5])
    assert len(caused) <= 3, (len(caused), caused[:5])


async def test_real_versions_and_platforms_still_work(in_process_proxy, connect, registry):
    proc = await in_process_proxy()
    client = await connect(proc)
    release = registry.releases[("acme", "foo")]["1.0.0"]
    status, _, data = await client.get(archive_url("1.0.0", "linux_amd64"))
    assert status == 200 and data == release.zips["linux_amd64"]
    status, _, body = await client.get(f"{REGISTRY}/1.0.0/download/darwin/arm64")
    assert status == 200 and json.loads(body)["filename"] == release.filename("darwin_arm64")
    status, _, body = await client.get(f"{REGISTRY}/1.0.0/download/darwin/arm64/SHA256SUMS")
    assert status == 200 and body == release.shasums
    status, _, body = await client.get(f"/lock/v1/{PROVIDER}/1.0.0?platform=linux_amd64&platform=windows_amd64")
    assert status == 200 and set(json.loads(body)["platforms"]) == {"linux_amd64", "windows_amd64"}
    # One made-up platform among real ones: the whole request is refused before anything is fetched.
    start = len(registry.requests)
    status, _, body = await client.get(f"/lock/v1/{PROVIDER}/1.1.0?platform=linux_amd64&platform=plan9_mips")
    code, message = error_of(body)
    assert (status, code) == (404, "package_not_found")
    assert message.startswith(f"provider {PROVIDER} 1.1.0 has no package for plan9_mips (it offers: ")  # lists them
    assert upstream_since(registry, start) == []


async def test_a_version_published_after_the_list_was_cached_is_found_with_one_recheck(
    in_process_proxy, connect, registry, signing_key
):
    proc = await in_process_proxy("--ttl-negative", f"{RECHECK_INTERVAL:g}s")
    client = await connect(proc, timeout=120)
    assert (await client.get(f"{MIRROR}/index.json"))[0] == 200
    versions = "/v1/providers/acme/foo/versions"
    assert registry.count(versions) == 1
    new = registry.add(Release("acme", "foo", "1.2.0", signing_key))
    await proc.wait_stale(RECHECK_INTERVAL, VERSIONS_KEY)  # the cached list is now "old enough" for a recheck
    status, _, data = await client.get(archive_url("1.2.0", "linux_amd64"))
    assert status == 200 and data == new.zips["linux_amd64"]
    assert registry.count(versions) == 2
    # A flood of made-up versions rechecks the list at most once per --ttl-negative, never per version.
    start, began = len(registry.requests), time.monotonic()
    answers = await gather_limited(client.get(archive_url(f"7.{i}.0", "linux_amd64")) for i in range(300))
    flood_ended = time.monotonic()
    elapsed = flood_ended - began
    assert all(status == 404 for status, _, _ in answers)
    caused = upstream_since(registry, start)
    assert not [p for p in caused if "/download/" in p], caused[:5]
    assert caused.count(versions) <= 1 + int(elapsed / RECHECK_INTERVAL), (len(caused), elapsed)
    # Also while the upstream fails: the failed recheck does not make the list "fresh", the gate still holds.
    registry.faults[versions] = Fault(status=500)
    await proc.wait_stale(RECHECK_INTERVAL, VERSIONS_KEY)
    # and the gate is open again: it let the last recheck through during the flood, one interval ago at most
    await asyncio.sleep(max(0.0, flood_ended + RECHECK_INTERVAL - time.monotonic()))
    start, began = len(registry.requests), time.monotonic()
    answers = await gather_limited(client.get(archive_url(f"6.{i}.0", "linux_amd64")) for i in range(300))
    elapsed = time.monotonic() - began
    assert all(status == 404 for status, _, _ in answers)
    # each recheck is one request plus the upstream client's one retry of a 5xx; the first one did happen
    rechecks = upstream_since(registry, start).count(versions)
    assert 1 <= rechecks <= 2 * (1 + int(elapsed / RECHECK_INTERVAL)), (rechecks, elapsed)


async def test_made_up_module_versions_never_reach_the_upstream(in_process_proxy, connect, registry):
    registry.static["net-1.0.0.tar.gz"] = module_tar_gz(MODULE_FILES)
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.0.0", "{base}/static/net-1.0.0.tar.gz"))
    proc = await in_process_proxy()
    client = await connect(proc, timeout=120)
    start = len(registry.requests)
    answers = await gather_limited(
        [client.get(f"{MODULES}/9.{i}.0/download") for i in range(100)]
        + [client.get(f"{MODULES}/8.{i}.0/archive.tar.gz") for i in range(100)]
    )
    for status, _, body in answers:
        assert (status, error_of(body)[0]) == (404, "version_not_found"), body
    caused = upstream_since(registry, start)
    assert not [p for p in caused if p.endswith("/download")], caused[:5]
    assert len(caused) <= 3, (len(caused), caused[:5])
    status, headers, _ = await client.get(f"{MODULES}/1.0.0/download")
    assert status == 200 and "archive.tar.gz" in headers["X-Terraform-Get"]
    status, _, data = await client.get(f"{MODULES}/1.0.0/archive.tar.gz")
    assert status == 200 and data == registry.static["net-1.0.0.tar.gz"]


# ---- item 2: the negative cache is bounded (count and bytes, LRU) in both stores -------------------------

WARM = (f"{MIRROR}/index.json", f"{MIRROR}/1.0.0.json", archive_url("1.0.0", "linux_amd64"))


async def flood_made_up_names(client, registry, names: int) -> None:
    """`names` distinct made-up providers: each 404s and costs exactly one upstream request (its version
    list: the upstream alone knows whether a name exists), never more."""
    tag, start = uuid.uuid4().hex[:6], len(registry.requests)
    answers = await gather_limited(
        (client.get(f"/mirror/v1/{HOST}/acme/nope{tag}x{i}/index.json") for i in range(names)), limit=24
    )
    assert all(status == 404 for status, _, _ in answers)
    caused = [p for p in upstream_since(registry, start) if p != "/.well-known/terraform.json"]
    assert len(caused) == names and all(p.endswith("/versions") for p in caused), len(caused)


def embedded_rows(proc) -> int:
    path = proc.data_dir / "metadata" / "metadata.sqlite"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return db.execute("SELECT COUNT(*) FROM metadata").fetchone()[0]


def redis_keys(url: str, prefix: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return list(client.scan_iter(match=f"{prefix}:*", count=1000))
    finally:
        client.close()


@pytest.mark.parametrize("backend", ["embedded", "redis"])
async def test_negative_cache_stays_bounded_and_warm_entries_survive_a_flood(
    backend, in_process_proxy, connect, registry, request
):
    extra = ["--negative-cache-entries", str(NEGATIVE_ENTRIES)]
    prefix = f"amp-{uuid.uuid4().hex[:10]}"
    if backend == "redis":
        server = request.getfixturevalue("redis_server")
        extra += ["--redis-url", server.url, "--redis-prefix", prefix, "--metadata-secret", METADATA_SECRET]
    proc = await in_process_proxy(*extra)
    client = await connect(proc, timeout=300)
    for path in WARM:
        assert (await client.get(path))[0] == 200, path
    warm_count = embedded_rows(proc) if backend == "embedded" else len(redis_keys(server.url, prefix))

    await flood_made_up_names(client, registry, FLOOD)

    status, _, text = await client.get("/metrics")
    assert status == 200
    entries = metric(text.decode(), "registry_proxy_negative_cache_entries")
    assert 0 < entries <= NEGATIVE_ENTRIES, entries
    if backend == "embedded":
        assert embedded_rows(proc) <= warm_count + 1, "remembered 404s went into the persistent store"
    else:
        keys = redis_keys(server.url, prefix)
        # the warm entries, at most NEGATIVE_ENTRIES negatives, and the negatives' bookkeeping (sorted set + sizes)
        assert len(keys) <= warm_count + NEGATIVE_ENTRIES + 3, len(keys)
        probe = redis.Redis.from_url(server.url)
        try:
            negatives = [k for k in keys if b":negative:" in k]
            assert negatives and all(0 < probe.ttl(k) <= 3600 for k in negatives[:20])
        finally:
            probe.close()

    # Warm entries were not pushed out: with the upstream gone and a fresh process, they still serve.
    await proc.stop()
    await registry.stop()
    again = await in_process_proxy(*extra, data_dir=proc.data_dir)
    client = await connect(again)
    for path in WARM:
        assert (await client.get(path))[0] == 200, path


@pytest.mark.parametrize("backend", ["embedded", "redis"])
async def test_negative_cache_respects_its_byte_bound(backend, in_process_proxy, connect, registry, request):
    extra = ["--negative-cache-entries", "10000", "--negative-cache-bytes", "8KiB"]
    if backend == "redis":
        server = request.getfixturevalue("redis_server")
        extra += [
            "--redis-url",
            server.url,
            "--redis-prefix",
            f"amp-{uuid.uuid4().hex[:10]}",
            "--metadata-secret",
            METADATA_SECRET,
        ]
    proc = await in_process_proxy(*extra)
    client = await connect(proc, timeout=300)
    await flood_made_up_names(client, registry, 200)
    text = (await client.get("/metrics"))[2].decode()
    assert 0 < metric(text, "registry_proxy_negative_cache_bytes") <= 8 * 1024
    assert 0 < metric(text, "registry_proxy_negative_cache_entries") < 200
