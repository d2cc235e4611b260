"""After Redis restarts under a running proxy, the proxy's view of it settles: ready, and stays so.

A real proxy process (two workers) on its own real redis-server, which the test restarts while
clients keep the proxy busy. Each worker's pool then holds connections to the old server; before,
each of them failed once when next used, every failure marked Redis down for the retry interval,
and `/readyz` flapped between "degraded" and "ready" for about 30 s: as long as the pools took to
use up their old connections, which a busy moment after a quiet one reaches.
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
BUSY = 32  # requests at once: each worker's pool holds many connections
POLLS = 8  # /readyz at once, each pinging on a connection of its worker's pool
LADDERS = 4  # rounds of rising load after /readyz turned ready again: each ends with BUSY requests at once


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

    async def readiness() -> str:
        status, _, body = await client.get("/readyz")
        assert status == 200, body
        return json.loads(body)["status"]

    async def round_of_polls(requests: int, polls: int) -> list[str]:
        """`requests` requests at once and, meanwhile, /readyz `polls` times: the statuses it answered."""
        answers = await asyncio.gather(
            *(client.get(DOCUMENTS[n % 2]) for n in range(requests)), *(readiness() for _ in range(polls))
        )
        assert [status for status, _, _ in answers[:requests]] == [200] * requests
        return list(answers[requests:])

    for _ in range(3):  # many connections in each worker's pool
        await round_of_polls(BUSY, POLLS)
    own_redis.stop()
    own_redis.start()  # same port, empty, and every pooled connection is now dead
    seen: list[list[str]] = []
    give_up = time.monotonic() + 30
    while not seen or set(seen[-1]) != {"ready"}:  # quiet: a few connections, the most recently used
        assert time.monotonic() < give_up, f"/readyz never turned ready after the restart: {seen}"
        seen.append(await round_of_polls(2, 2))
    ready_at = time.time()
    after: list[str] = []
    for _ in range(LADDERS):  # busier and busier: the pools' older connections come into use
        for requests in (4, 8, 16, BUSY):
            after += await round_of_polls(requests, POLLS)
    assert set(after) == {"ready"}, f"/readyz after it turned ready: {after}"
    flaps = [record for record in proxy.events("redis.down") if logged_at(record) >= ready_at]
    assert flaps == [], f"Redis counted down again once it answered: {flaps}"
