"""After Redis restarts under a running proxy, the proxy's view of it settles: ready, and stays so.

A real proxy process (two workers) on its own real redis-server, which the test restarts while
clients keep the proxy busy. Each worker's pool then holds connections to the old server; before,
each of them failed once when next used, every failure marked Redis down for the retry interval,
and `/readyz` flapped between "degraded" and "ready" for about 30 s.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime

import pytest

from tests.conftest import PROVIDER
from tests.fakes.redis_server import METADATA_SECRET, RedisServer

# Version documents read the archive records, absent until archives are fetched: each request asks Redis.
DOCUMENTS = [f"/mirror/v1/{PROVIDER}/{version}.json" for version in ("1.0.0", "1.1.0")]
CONCURRENCY = 24  # requests at once: enough for each worker's pool to hold many connections
WATCH = 4.0  # seconds of load after Redis answers again, /readyz polled throughout


@pytest.fixture
def own_redis(tmp_path):
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


def logged_at(record: dict) -> float:
    return datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()


async def test_after_a_redis_restart_readiness_settles_and_stays(proxy_process, connect, own_redis):
    proxy = await proxy_process("--redis-url", own_redis.url, "--metadata-secret", METADATA_SECRET, "--workers", "2")
    client = await connect(proxy)

    async def burst() -> None:
        answers = await asyncio.gather(*(client.get(DOCUMENTS[n % 2]) for n in range(CONCURRENCY)))
        assert [status for status, _, _ in answers] == [200] * CONCURRENCY

    async def readiness() -> str:
        status, _, body = await client.get("/readyz")
        assert status == 200, body
        return json.loads(body)["status"]

    for _ in range(3):  # fill the pools
        await burst()
    own_redis.stop()
    own_redis.start()  # same port, empty, and every pooled connection is now dead

    seen: list[tuple[float, str]] = []
    loop_until = time.monotonic() + 30
    while not seen or seen[-1][1] != "ready":
        assert time.monotonic() < loop_until, f"/readyz never turned ready after the restart: {seen}"
        await burst()
        seen.append((time.time(), await readiness()))
    ready_at = seen[-1][0]
    watch_until = time.monotonic() + WATCH
    while time.monotonic() < watch_until:
        statuses = await asyncio.gather(burst(), readiness(), readiness())
        seen += [(time.time(), status) for status in statuses[1:]]
    after = [status for at, status in seen if at >= ready_at]
    assert set(after) == {"ready"}, f"/readyz after it turned ready: {after}"
    flaps = [record for record in proxy.events("redis.down") if logged_at(record) >= ready_at]
    assert flaps == [], f"Redis counted down again once it answered: {flaps}"
