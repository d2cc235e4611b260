"""Two real proxy processes sharing one Redis and one data dir behave as one cache."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
from collections.abc import AsyncIterator

import aiohttp
import pytest
import redis.asyncio as aioredis

from tests.e2e.test_network_mirror_e2e import MAIN_TF, locked_hashes, mirror_config
from tests.fakes.packages import Release
from tests.fakes.process import wait_for
from tests.fakes.redis_server import METADATA_SECRET

pytestmark = pytest.mark.e2e

PATH = "/mirror/v1/registry.example.test/acme/foo/{v}/linux_amd64/terraform-provider-foo_{v}_linux_amd64.zip"


@pytest.fixture
async def fleet(proxy_process, redis_server, tmp_path):
    shared = tmp_path / "shared-data"
    redis_args = (
        "--redis-url",
        redis_server.url,
        "--redis-prefix",
        f"fleet-{tmp_path.name}",
        "--metadata-secret",
        METADATA_SECRET,
        "--fleet-lock-ttl",
        "2s",
    )
    first = await proxy_process(*redis_args, data_dir=shared)
    second = await proxy_process(*redis_args, data_dir=shared)
    return first, second


async def fetch(session, proxy, path) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    async with session.get(proxy.url + path, ssl=context) as response:
        return response.status, await response.read()


@contextlib.asynccontextmanager
async def lock_attempts(redis_url: str, key: str) -> AsyncIterator[list[str]]:
    """Every attempt to take the fleet lock on `key` (a `SET ... NX`), as Redis's MONITOR sees it."""
    attempts: list[str] = []
    client = aioredis.from_url(redis_url)

    async def watch() -> None:
        async with client.monitor() as monitor:
            started.set()
            async for command in monitor.listen():
                words = command["command"].split()
                if words[:1] == ["SET"] and words[1].endswith(f":lock:{key}") and "NX" in words:
                    attempts.append(command["client_port"])

    started = asyncio.Event()
    watcher = asyncio.create_task(watch())
    try:
        await asyncio.wait_for(started.wait(), 10)
        yield attempts
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await client.aclose()


async def test_killed_lock_holder_is_taken_over_by_the_other_process(fleet, registry, signing_key, redis_server):
    release = registry.add(Release("acme", "foo", "3.0.0", signing_key, platforms=("linux_amd64",)))
    a, b = fleet
    archive = registry.archive_path(release, "linux_amd64")
    held = registry.hold(archive)  # A's download stays under way (holding the fleet lock) until released
    async with (
        aiohttp.ClientSession() as session,
        lock_attempts(redis_server.url, "archive:registry.example.test/acme/foo/3.0.0/linux_amd64") as attempts,
    ):
        from_a = asyncio.create_task(fetch(session, a, PATH.format(v="3.0.0")))
        await asyncio.wait_for(held.started.wait(), 30)
        await wait_for(lambda: len(attempts) == 1, 10, "A's (only) attempt: it took the lock")
        from_b = asyncio.create_task(fetch(session, b, PATH.format(v="3.0.0")))
        # B found the lock taken, rechecked and tried again: it waits instead of downloading
        await wait_for(lambda: len(attempts) >= 3, 30, "B to try the fleet lock twice")
        assert registry.count(archive) == 1
        await a.kill()
        with pytest.raises(aiohttp.ClientError):
            await from_a
        held.release.set()
        status, body = await asyncio.wait_for(from_b, 30)
    assert status == 200 and body == release.zips["linux_amd64"]
    assert registry.count(archive) == 2  # A's broken download and B's takeover


async def test_cold_requests_across_two_processes_fetch_once_then_init_offline_through_the_other(
    fleet, registry, signing_key, terraform
):
    """One fleet for both checks (each process start costs a second of CPU): concurrent cold requests for
    one archive spread over both processes fetch it once; then `terraform init` through A, and with the
    upstream gone, through B."""
    a, b = fleet
    release = registry.add(Release("acme", "foo", "2.0.0", signing_key, platforms=("linux_amd64",)))
    registry.archive_chunk_delay = 0.05
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(*(fetch(session, a if n % 2 else b, PATH.format(v="2.0.0")) for n in range(24)))
    registry.archive_chunk_delay = 0.0
    assert [status for status, _ in results] == [200] * 24
    assert all(body == release.zips["linux_amd64"] for _, body in results)
    assert registry.count(registry.archive_path(release, "linux_amd64")) == 1

    first = terraform.workdir("a", MAIN_TF)
    code, output = await terraform.init(first, mirror_config(a), a.ca_file)
    assert code == 0, output
    await registry.stop()
    second = terraform.workdir("b", MAIN_TF)
    shutil.copy(first / ".terraform.lock.hcl", second / ".terraform.lock.hcl")
    code, output = await terraform.init(second, mirror_config(b), b.ca_file)
    assert code == 0, output
    assert locked_hashes(second) == locked_hashes(first)
