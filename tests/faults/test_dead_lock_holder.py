"""A process killed while it fetches a cold archive must not stall everyone else waiting for that archive.

Real proxy processes (two replicas on one real redis-server, or two workers on one data dir), a fake
upstream whose archive answer stalls mid-body (the holder is mid-download), and `kill -9`. Another
process asked for the same archive right after the kill must take over the fetch within about two
seconds: a Redis fleet lock is a short lease its holder renews while it works, a lock file is freed
by the kernel. Before, the Redis lock outlived its dead holder for its whole 15 s expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import aiohttp
import pytest
import redis

from tests.conftest import PROVIDER
from tests.fakes.packages import Release
from tests.fakes.process import wait_for
from tests.fakes.redis_server import METADATA_SECRET

ARCHIVE = f"/mirror/v1/{PROVIDER}/3.0.0/linux_amd64/terraform-provider-foo_3.0.0_linux_amd64.zip"
LOCK = f"lock:archive:{PROVIDER}/3.0.0/linux_amd64"
TAKEOVER_BOUND = 3.5  # the two-second lease, a waiter's poll, and room for a loaded machine


@pytest.fixture
def big_release(registry, signing_key) -> Release:
    """A release whose archive answer stalls after its first 64 KiB (until the test lets it go)."""
    release = registry.add(Release("acme", "foo", "3.0.0", signing_key, platforms=("linux_amd64",), noise=300_000))
    registry.stall[registry.archive_path(release, "linux_amd64")] = 64 * 1024
    return release


async def first_request_then_takeover(client, other, registry, release, kill) -> float:
    """`client` starts the download (it stalls), `kill()` kills its process, then `other` asks: the seconds from
    the kill until `other` has the whole archive."""
    path = registry.archive_path(release, "linux_amd64")
    first = asyncio.create_task(client.get(ARCHIVE))
    await wait_for(lambda: registry.count(path) == 1, 30, "the first process to start the download")
    await kill()
    registry.stall.pop(path)  # the upstream answers whoever asks next
    killed = time.monotonic()
    status, _, body = await other.get(ARCHIVE)
    waited = time.monotonic() - killed
    with contextlib.suppress(aiohttp.ClientError):
        await first  # its process is gone
    assert (status, body) == (200, release.zips["linux_amd64"])
    assert registry.count(path) == 2  # the dead holder's download, and the takeover
    return waited


async def test_a_replica_takes_over_the_fetch_of_a_killed_lock_holder_within_two_seconds(
    proxy_process, connect, registry, big_release, redis_server, tmp_path
):
    prefix = f"dead-{tmp_path.name[-10:]}"
    args = ("--redis-url", redis_server.url, "--redis-prefix", prefix, "--metadata-secret", METADATA_SECRET)
    holder = await proxy_process(*args, data_dir=tmp_path / "shared")
    waiter = await proxy_process(*args, data_dir=tmp_path / "shared")
    raw = redis.Redis(port=redis_server.port)

    async def kill() -> None:
        await wait_for(lambda: raw.exists(f"{prefix}:{LOCK}") == 1, 10, "the holder's fleet lock")
        await holder.kill()

    waited = await first_request_then_takeover(
        await connect(holder), await connect(waiter), registry, big_release, kill
    )
    raw.close()
    assert waited < TAKEOVER_BOUND, f"the waiter took over {waited:.1f} s after the holder died"


async def test_a_worker_takes_over_the_fetch_of_a_killed_worker_at_once(
    proxy_process, connect, registry, big_release, tmp_path
):
    proxy = await proxy_process("--workers", "2", data_dir=tmp_path / "data")
    temp_root = tmp_path / "data" / "archives" / "tmp"

    async def kill() -> None:
        await wait_for(lambda: any(temp_root.glob("*/*.part")), 10, "the worker's temp file")
        downloading = next(temp_root.glob("*/*.part")).parent.name  # HOST-PID-ID
        os.kill(int(downloading.rsplit("-", 2)[1]), signal.SIGKILL)

    client = await connect(proxy)
    waited = await first_request_then_takeover(client, client, registry, big_release, kill)
    assert waited < TAKEOVER_BOUND, f"the other worker took over {waited:.1f} s after the holder died"
