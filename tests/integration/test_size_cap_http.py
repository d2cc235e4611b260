"""The archive store under `--max-store-size`: least-recently-served eviction against the real app.

The scene: three stored archives (last served long ago, oldest first A, B, C), a client in the middle
of receiving A (the least recently served: the first victim if it were not pinned), and a cold
download of D under way (held by the fake registry). D's publish takes the store past the cap, which
wakes an eviction run. Expected: B and C go (least recently served, not in use), A and D stay,
A's and D's clients get every byte, and B asked for again is fetched from the upstream again.
Run with the embedded store and with Redis (fleet lock and sorted set).
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from proxy.web.app_keys import ARCHIVE_USAGE, METRICS, SETTINGS
from tests.conftest import REGISTRY_HOST, serve_proxy
from tests.fakes.packages import Release
from tests.fakes.process import wait_for
from tests.fakes.rawclients import open_tls, request

WAIT = 15  # seconds for an awaited condition: only a broken proxy takes that long
MiB = 2**20
LONG_AGO = 3 * 86400


def url(release: Release, platform: str) -> str:
    return (
        f"/mirror/v1/{REGISTRY_HOST}/{release.namespace}/{release.type}/{release.version}/{platform}/"
        f"{release.filename(platform)}"
    )


def stored_shas(proxy) -> set[str]:
    root = proxy.app[SETTINGS].archive_dir / "sha256"
    return {p.name for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def releases(registry, signing_key) -> tuple[Release, Release, Release]:
    """A: acme/huge 1.0.0 (12 MiB of random data, more than the kernel buffers between proxy and client);
    B, C: acme/big 1.0.0 for two platforms; D: acme/big 1.1.0 (3 MiB each)."""
    huge = registry.add(Release("acme", "huge", "1.0.0", signing_key, platforms=("linux_amd64",), noise=12 * MiB))
    old = registry.add(
        Release("acme", "big", "1.0.0", signing_key, platforms=("darwin_arm64", "windows_amd64"), noise=3 * MiB)
    )
    new = registry.add(Release("acme", "big", "1.1.0", signing_key, platforms=("linux_amd64",), noise=3 * MiB))
    return huge, old, new


async def age(proxy, shas: list[str]) -> None:
    """Make the archives look stored and last served long ago, the first the longest."""
    metadata = proxy.app[ARCHIVE_USAGE]._times
    now = time.time()
    await metadata.forget_served(shas)
    await metadata.note_served({sha: now - LONG_AGO + 3600 * n for n, sha in enumerate(shas)})
    root = proxy.app[SETTINGS].archive_dir / "sha256"
    for n, sha in enumerate(shas):
        then = now - LONG_AGO - 3600 + 60 * n
        os.utime(root / sha[:2] / sha[2:4] / sha, (then, then))


async def test_eviction_under_a_small_cap_while_serving_and_downloading(make_settings, client_ssl, registry, releases):
    huge, old, new = releases
    a, b, c = "linux_amd64", "darwin_arm64", "windows_amd64"
    sha = {a: huge.sha256(a), b: old.sha256(b), c: old.sha256(c), "d": new.sha256("linux_amd64")}
    sizes = {a: len(huge.zips[a]), b: len(old.zips[b]), c: len(old.zips[c]), "d": len(new.zips["linux_amd64"])}
    cap = sizes[a] + sizes["d"] + MiB  # room for two archives: two of the four must go
    settings = make_settings(max_store_size=cap, eviction_grace=600.0, eviction_interval=3600.0)
    async with serve_proxy(settings, client_ssl) as proxy:
        for release, name in ((huge, a), (old, b), (old, c)):
            status, _, body = await proxy.get(url(release, name))
            assert status == 200 and body == release.zips[name]

        # A client starts receiving A, then stops reading (a small receive buffer): A's response is in
        # progress, A is pinned.
        slow = await open_tls(
            "127.0.0.1",
            int(proxy.url.rsplit(":", 1)[1]),
            client_ssl,
            receive_buffer=32 * 1024,
            stop_reading_after=256 * 1024,
            keep=64 * MiB,
        )
        slow.send(request(url(huge, a), headers={"Connection": "close"}))
        await wait_for(lambda: slow.received >= 256 * 1024, WAIT, "the first 256 KiB of A")
        await wait_for(lambda: proxy.app[ARCHIVE_USAGE].is_pinned(sha[a]), WAIT, "A pinned while it is sent")
        await age(proxy, [sha[a], sha[b], sha[c]])  # and A's serving just now is forgotten: only its pin protects it

        try:
            # D's download is under way (the upstream holds its body), and a client waits for it.
            d_path = registry.archive_path(new, "linux_amd64")
            hold = registry.hold(d_path)
            d_request = asyncio.create_task(proxy.get(url(new, "linux_amd64")))
            await asyncio.wait_for(hold.started.wait(), WAIT)
            assert stored_shas(proxy) == {sha[a], sha[b], sha[c]}  # D is a temp file: never a candidate

            hold.release.set()  # D is stored: four archives, over the cap, an eviction run starts
            status, _, d_body = await asyncio.wait_for(d_request, WAIT)
            assert status == 200 and d_body == new.zips["linux_amd64"]
            await wait_for(lambda: stored_shas(proxy) == {sha[a], sha["d"]}, WAIT, "B and C evicted, A and D kept")
            assert proxy.app[ARCHIVE_USAGE].is_pinned(sha[a])  # A was still being sent during the run

            # A's client gets every byte, unharmed by the eviction.
            assert len(slow.body()) < sizes[a]
            slow.stop_reading_after = None
            slow.transport.resume_reading()
            await asyncio.wait_for(asyncio.shield(slow.closed), WAIT)
            assert slow.status() == 200 and slow.body() == huge.zips[a]

            root = settings.archive_dir / "sha256"
            assert sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) <= cap
            samples = proxy.app[METRICS].registry.get_sample_value
            assert samples("registry_proxy_store_evictions_total") == 2
            assert samples("registry_proxy_store_evicted_bytes_total") == sizes[b] + sizes[c]
            assert samples("registry_proxy_store_objects") == 2
            assert samples("registry_proxy_store_bytes") == sizes[a] + sizes["d"]

            # B's record survived its file: asking for it again is a fresh upstream fetch, verified, not a 500.
            b_path = registry.archive_path(old, b)
            assert registry.count(b_path) == 1
            status, _, body = await proxy.get(url(old, b))
            assert status == 200 and body == old.zips[b]
            assert registry.count(b_path) == 2
            assert registry.count(registry.archive_path(huge, a)) == 1  # A was never fetched again
            assert registry.count(d_path) == 1
        finally:
            slow.abort()  # a failing test must not leave the proxy's shutdown waiting for this client
