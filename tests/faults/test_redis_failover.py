"""Redis under Sentinel fails over while clients keep a real proxy busy: no answer is wrong, none is refused,
the proxy follows the new master at once, `/readyz` settles, and what was sealed before is served from the
new master without asking the upstream again.

A real proxy process (two workers) on the session's Sentinel setup (TLS, passwords), a real `SENTINEL
FAILOVER`. The old master is left taking writes for minutes, as one the sentinels cannot reach would be: a
proxy that went on writing there would lose those writes, so every key written after the switch must be on
the new master and none on the old one.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
import uuid

from proxy.domain.hashes import h1_of_zip
from proxy.metadata_store.keys import ARCHIVE
from tests.conftest import PROVIDER
from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST, wait_for
from tests.fakes.redis_server import METADATA_SECRET

BEFORE = [f"2.{n}.0" for n in range(5)]  # fetched before the failover (and during it, again and again)
AFTER = [f"3.{n}.0" for n in range(5)]  # first asked for once the proxy follows the new master
PLATFORM = "linux_amd64"
WORKERS = 2


def archive_path(version: str) -> str:
    return f"/mirror/v1/{PROVIDER}/{version}/{PLATFORM}/terraform-provider-foo_{version}_{PLATFORM}.zip"


def archive_key(version: str) -> str:
    return ARCHIVE.key(host=REGISTRY_HOST, namespace="acme", type="foo", version=version, platform=PLATFORM)


class Traffic:
    """Clients of one proxy: every answer checked against the release it is about."""

    def __init__(self, client, releases: dict[str, Release]) -> None:
        self.client = client
        self.releases = releases
        self.answers = 0

    async def version(self, version: str) -> None:
        release = self.releases[version]
        status, _, body = await self.client.get(f"/mirror/v1/{PROVIDER}/{version}.json")
        assert status == 200, (version, body)
        entry = json.loads(body)["archives"][PLATFORM]
        right = {f"zh:{release.sha256(PLATFORM)}", *map(str, h1_of_zip(io.BytesIO(release.zips[PLATFORM])))}
        assert f"zh:{release.sha256(PLATFORM)}" in entry["hashes"] and set(entry["hashes"]) <= right, entry
        self.answers += 1

    async def archive(self, version: str) -> None:
        status, _, body = await self.client.get(archive_path(version))
        assert status == 200 and body == self.releases[version].zips[PLATFORM], (version, status)
        self.answers += 1

    async def round(self, versions: list[str]) -> None:
        """Every version's document and archive, all at once."""
        await asyncio.gather(*(self.version(v) for v in versions), *(self.archive(v) for v in versions))

    async def readiness(self) -> str:
        status, _, body = await self.client.get("/readyz")
        assert status == 200, body
        return json.loads(body)["status"]


async def test_a_failover_during_traffic(
    proxy_process, in_process_proxy, connect, redis_sentinel, registry, signing_key, tmp_path
):
    await asyncio.to_thread(redis_sentinel.settle)
    releases = {v: registry.add(Release("acme", "foo", v, signing_key, platforms=(PLATFORM,))) for v in BEFORE + AFTER}
    prefix = f"failover-{uuid.uuid4().hex[:10]}"
    args = (*redis_sentinel.proxy_args(), "--redis-prefix", prefix, "--metadata-secret", METADATA_SECRET)
    shared = tmp_path / "shared-data"
    proxy = await proxy_process(*args, "--workers", str(WORKERS), data_dir=shared)
    traffic = Traffic(await connect(proxy), releases)
    for _ in range(3):
        await traffic.round(BEFORE)
    old, replica = redis_sentinel.master(), redis_sentinel.replica()

    def replicated() -> bool:
        with replica.client() as client:
            return all(client.exists(f"{prefix}:{archive_key(v)}") for v in BEFORE)

    await wait_for(replicated, 10, "the records to reach the replica")

    # The failover, while the clients keep asking.
    failover = asyncio.create_task(asyncio.to_thread(redis_sentinel.failover, old_master_lingers=True))
    during = 0
    while not failover.done():
        await traffic.round(BEFORE)
        during += 1
    new = failover.result()
    assert during > 0
    await wait_for(lambda: len(proxy.events("redis.master_switched")) >= WORKERS, 10, "every worker to switch")

    # Writes after the switch: on the new master, none on the old one (which still takes writes).
    for version in AFTER:
        await traffic.round([version, *BEFORE])
    with new.client() as on_new, old.client() as on_old:
        assert [bool(on_new.exists(f"{prefix}:{archive_key(v)}")) for v in AFTER] == [True] * len(AFTER)
        assert [bool(on_old.exists(f"{prefix}:{archive_key(v)}")) for v in AFTER] == [False] * len(AFTER)
        assert on_old.info("replication")["role"] == "master"

    # Readiness settles on "ready" and stays there.
    seen: list[str] = []
    deadline = time.monotonic() + 30
    while seen[-2 * WORKERS :] != ["ready"] * 2 * WORKERS:
        assert time.monotonic() < deadline, f"/readyz never settled on ready: {seen}"
        seen.append(await traffic.readiness())
        await asyncio.sleep(0.05)
    after = [await traffic.readiness() for _ in range(10)]
    await traffic.round(BEFORE + AFTER)
    after += [await traffic.readiness() for _ in range(10)]
    assert set(after) == {"ready"}, after

    # What was sealed before the failover is read from the new master: a fresh proxy (served in this process)
    # asks the upstream nothing.
    asked = len(registry.requests)
    fresh = await in_process_proxy(*args, data_dir=shared)
    await Traffic(await connect(fresh), releases).round(BEFORE + AFTER)
    upstream = [path for _, path in registry.requests[asked:] if "/download/" in path or "/files/" in path]
    assert upstream == [], upstream
