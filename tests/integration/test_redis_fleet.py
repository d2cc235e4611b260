"""Redis as the shared store: TTLs, prefixes, outages, fleet-wide single flight."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis
from structlog.testing import capture_logs

from proxy.metadata_store.redis import RedisFleetLocks, RedisStore
from tests.conftest import PROVIDER, serve_proxy
from tests.fakes import ports
from tests.fakes.redis_server import METADATA_SECRET, RedisServer

ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
ARCHIVE_110 = f"/mirror/v1/{PROVIDER}/1.1.0/linux_amd64/terraform-provider-foo_1.1.0_linux_amd64.zip"
VERSION_DOC = f"/mirror/v1/{PROVIDER}/1.0.0.json"


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def own_redis(tmp_path):
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


async def test_every_key_has_a_ttl_and_the_prefix(redis_server, prefix):
    store = RedisStore(redis_server.url, prefix=prefix, retention=3600)
    await store.set("a", b"1")
    await store.set("b", b"2", ttl=30)
    client = aioredis.from_url(redis_server.url)
    keys = sorted(k.decode() for k in await client.keys(f"{prefix}:*"))
    assert keys == [f"{prefix}:a", f"{prefix}:b"]
    assert 3590 < await client.ttl(f"{prefix}:a") <= 3600
    assert 20 < await client.ttl(f"{prefix}:b") <= 30
    await client.aclose()
    await store.close()


@pytest.mark.process
async def test_outage_is_logged_once_and_recovers_without_restart(tmp_path, prefix):
    now = [0.0]
    with capture_logs() as logs:
        with ports.refused_port() as port:  # nobody can take it while Redis is "down"
            store = RedisStore(f"redis://127.0.0.1:{port}/0", prefix=prefix, retry_interval=5, clock=lambda: now[0])
            assert await store.get("k") is None
            await store.set("k", b"v")
            assert await store.get("k") is None
            assert store.available is False
            assert await store.ping() is False
        server = RedisServer(tmp_path / "r", port=port)
        server.start()
        try:
            assert await store.get("k") is None  # breaker still open: not even asked
            now[0] = 10.0
            await store.set("k", b"v")
            assert await store.get("k") == b"v"
        finally:
            server.stop()
    events = [entry["event"] for entry in logs if entry["event"].startswith("redis.")]
    assert events == ["redis.down", "redis.up"]
    await store.close()


async def test_a_crashed_owners_lock_expires_and_another_takes_over(redis_server, prefix):
    store = RedisStore(redis_server.url, prefix=prefix)
    crashed = store.client.lock(store.key("lock:k"), timeout=1, thread_local=False)
    assert await crashed.acquire(blocking=False)  # never released, never renewed: a kill -9
    locks = RedisFleetLocks(store, ttl=5, poll=0.05)
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def nothing():
        return None

    async with locks.hold("k", nothing) as existing:
        assert existing is None
        waited = loop.time() - started
    assert 0.5 < waited < 3
    await store.close()


async def test_the_owner_renews_its_lock_while_working(redis_server, prefix):
    """The lock outlives its TTL (0.6 s here, renewed every third of it) for as long as its owner works:
    watched until Redis has seen it renewed three times and more than twice its TTL has passed."""
    ttl = 0.6
    store = RedisStore(redis_server.url, prefix=prefix)
    locks = RedisFleetLocks(store, ttl=ttl, poll=0.05)
    key = store.key("lock:k")
    loop = asyncio.get_running_loop()

    async def nothing():
        return None

    async with locks.hold("k", nothing):
        started, renewals, left = loop.time(), 0, await store.client.pttl(key)
        async with asyncio.timeout(10):
            while renewals < 3 or loop.time() - started < 2 * ttl:
                await asyncio.sleep(ttl / 10)
                now_left = await store.client.pttl(key)
                assert now_left > 0, "the lock expired while its owner was working"
                renewals += now_left > left  # its time to live went up again: renewed
                left = now_left
    assert await store.client.exists(key) == 0
    await store.close()


async def test_a_planted_lock_that_never_expires_is_cut_to_one_lease(redis_server, prefix):
    refused: list[tuple[str, str]] = []
    store = RedisStore(redis_server.url, prefix=prefix, refuse=lambda key, why, reason: refused.append((key, reason)))
    await store.client.set(store.key("lock:k"), "planted")  # no expiry: no proxy wrote it
    locks = RedisFleetLocks(store, ttl=1, poll=0.05)
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def nothing():
        return None

    async with asyncio.timeout(10), locks.hold("k", nothing) as existing:
        assert existing is None
        waited = loop.time() - started
    assert 0.5 < waited < 3
    assert ("lock:k", "wrong_type") in refused
    await store.close()


async def test_fleet_lock_with_redis_down_lets_the_caller_work(prefix, refused_port):
    store = RedisStore(f"redis://127.0.0.1:{refused_port}/0", prefix=prefix)

    async def nothing():
        return None

    async with RedisFleetLocks(store).hold("k", nothing) as existing:
        assert existing is None
    await store.close()


async def test_two_replicas_on_one_redis_and_one_data_dir_fetch_once(
    make_local_settings, client_ssl, registry, redis_server, prefix
):
    settings = make_local_settings(redis_url=redis_server.url, redis_prefix=prefix, metadata_secret=METADATA_SECRET)
    registry.archive_chunk_delay = 0.05
    async with serve_proxy(settings, client_ssl) as a, serve_proxy(settings, client_ssl) as b:
        results = await asyncio.gather(*((a if n % 2 else b).get(ARCHIVE) for n in range(24)))
        assert {status for status, _, _ in results} == {200}
        release = registry.releases[("acme", "foo")]["1.0.0"]
        assert all(body == release.zips["linux_amd64"] for _, _, body in results)
        assert registry.count(registry.archive_path(release, "linux_amd64")) == 1
        # h1 computed by one replica is visible to the other at once
        _, doc_b = await b.json(VERSION_DOC)
        _, doc_a = await a.json(VERSION_DOC)
        assert doc_a == doc_b
        assert any(h.startswith("h1:") for h in doc_b["archives"]["linux_amd64"]["hashes"])


@pytest.mark.process
async def test_redis_outage_keeps_serving_and_redis_is_used_again(
    make_local_settings, client_ssl, registry, own_redis, prefix
):
    settings = make_local_settings(redis_url=own_redis.url, redis_prefix=prefix, metadata_secret=METADATA_SECRET)
    async with serve_proxy(settings, client_ssl) as running:
        assert (await running.get(ARCHIVE))[0] == 200
        own_redis.stop()
        assert (await running.get(ARCHIVE))[0] == 200  # warm
        assert (await running.get(ARCHIVE_110))[0] == 200  # cold, straight from upstream
        assert (await running.json(VERSION_DOC))[0] == 200
        status, body = await running.json("/readyz")
        assert (status, body["status"], body["checks"]["metadata_store"]) == (200, "degraded", False)

        own_redis.start()  # same port, empty: Redis lost all its data
        status, body = await running.json("/readyz")
        assert (status, body["status"]) == (200, "ready")
        release = registry.releases[("acme", "foo")]["1.0.0"]
        status, _, data = await running.get(ARCHIVE.replace("linux_amd64", "darwin_arm64"))
        assert status == 200 and data == release.zips["darwin_arm64"]
        client = aioredis.from_url(own_redis.url)
        assert await client.keys(f"{prefix}:archive:*darwin_arm64")
        await client.aclose()


async def test_redis_losing_its_data_does_not_re_download_archives(
    make_local_settings, client_ssl, registry, redis_server, prefix
):
    settings = make_local_settings(redis_url=redis_server.url, redis_prefix=prefix, metadata_secret=METADATA_SECRET)
    release = registry.releases[("acme", "foo")]["1.0.0"]
    async with serve_proxy(settings, client_ssl) as running:
        assert (await running.get(ARCHIVE))[0] == 200
    client = aioredis.from_url(redis_server.url)
    for key in await client.keys(f"{prefix}:*"):
        await client.delete(key)
    await client.aclose()
    async with serve_proxy(settings, client_ssl) as restarted:
        status, _, data = await restarted.get(ARCHIVE)
        assert status == 200 and data == release.zips["linux_amd64"]
    assert registry.count(registry.archive_path(release, "linux_amd64")) == 1


async def test_reads_renew_the_retention_of_entries_in_use(redis_server, prefix):
    store = RedisStore(redis_server.url, prefix=prefix, retention=100)
    await store.set("k", b"v", ttl=5)
    assert await store.client.ttl(store.key("k")) <= 5
    assert await store.get("k") == b"v"
    assert 95 < await store.client.ttl(store.key("k")) <= 100
    await store.set("j", b"w", ttl=5)
    assert await store.get_many(["j", "missing"]) == [b"w", None]
    assert 95 < await store.client.ttl(store.key("j")) <= 100
    await store.close()
