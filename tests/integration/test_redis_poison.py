"""Keys of the proxy's Redis namespace holding what the proxy never writes there: poison, not an outage.

Real Redis (one server, Sentinel, Cluster); the attacker is a plain client writing other Redis types (a
list where a value belongs, a string where a sorted set belongs, text where a counter belongs). Each key is
refused (`security.metadata_poisoned`), deleted, read as a miss, and Redis stays up: before, the
first WRONGTYPE answer marked Redis down, so one planted key took the fleet's shared store away.
"""

from __future__ import annotations

import uuid

import pytest
from structlog.testing import capture_logs

from proxy.metadata_store import CacheEntry
from proxy.metadata_store.keys import NEGATIVE_BOOKKEEPING, SERVED
from proxy.metadata_store.redis import RedisNegatives
from proxy.metadata_store.sealed import Seal, SealedStore
from tests.fakes.redis_server import REDIS_SETUPS

SECRET = b"poison-test-secret-0123456789abcdef"
NOT_FOUND = CacheEntry(404, b"", "https://registry.example.test/v1/providers/acme/gone/versions", 1.0).encode()


@pytest.fixture(params=list(REDIS_SETUPS))
async def stores(request):
    """(sealed store, its Redis store, negatives, refusals as (store, reason), raw client), on one server,
    Sentinel and Cluster."""
    setup = request.getfixturevalue(REDIS_SETUPS[request.param])
    refused: list[tuple[str, str]] = []
    seal = Seal(SECRET, store="redis", on_reject=lambda store, reason: refused.append((store, reason)))
    inner = setup.open_store(prefix=f"poison-{uuid.uuid4().hex[:10]}", refuse=seal.refuse)
    negatives = RedisNegatives(inner, seal, 100, 1 << 20, 3600.0)
    client = setup.client()
    yield SealedStore(inner, seal), inner, negatives, refused, client
    client.close()
    await inner.close()


def poisoned_keys(logs: list[dict]) -> list[str]:
    return [entry["key"] for entry in logs if entry["event"] == "security.metadata_poisoned"]


async def test_a_value_key_of_another_type_is_a_refused_miss_and_redis_stays_up(stores):
    sealed, inner, _, refused, client = stores
    await sealed.set("versions:a", b"good")
    client.delete(inner.key("versions:b"))
    client.rpush(inner.key("versions:b"), "planted")
    client.hset(inner.key("versions:c"), "planted", "1")
    with capture_logs() as logs:
        assert await sealed.get("versions:b") is None
        assert await sealed.get_many(["versions:a", "versions:c", "versions:d"]) == [b"good", None, None]
    assert inner.available and inner.problem is None
    assert poisoned_keys(logs) == ["versions:b", "versions:c"]
    assert refused == [("redis", "wrong_type")] * 2
    assert client.exists(inner.key("versions:b"), inner.key("versions:c")) == 0  # deleted: the next write starts afresh
    assert not [entry for entry in logs if entry["event"] == "redis.down"]


async def test_poisoned_bookkeeping_of_the_remembered_404s_starts_afresh(stores):
    _, inner, negatives, refused, client = stores
    await negatives.put("versions:gone", NOT_FOUND)
    zset, sizes, total = (inner.key(name) for name in NEGATIVE_BOOKKEEPING)
    client.delete(zset)
    client.set(zset, "planted")  # a string where the write order belongs
    client.set(total, "not a number")
    with capture_logs() as logs:
        await negatives.put("versions:other", NOT_FOUND)
        assert await negatives.get("versions:other") == NOT_FOUND
    assert sorted(poisoned_keys(logs)) == ["negatives", "negatives:bytes"]
    assert refused == [("redis", "wrong_type")] * 2
    assert inner.available
    assert client.type(zset) == b"zset" and client.zcard(zset) == 1  # counting again, from the new entry
    assert int(client.get(total)) == int(client.hget(sizes, "versions:other"))


async def test_a_remembered_404_of_another_type_is_refused(stores):
    _, inner, negatives, _, client = stores
    for name in ("negative:versions:a", "negative:versions:b"):
        client.rpush(inner.key(name), "planted")
    with capture_logs() as logs:
        assert await negatives.get("versions:a") is None
        assert await negatives.get_many(["versions:b", "versions:c"]) == [None, None]
    assert poisoned_keys(logs) == ["negative:versions:a", "negative:versions:b"]
    assert inner.available


async def test_served_times_of_another_type_are_refused_and_started_afresh(stores):
    _, inner, _, _, client = stores
    client.set(inner.key(SERVED), "planted")
    with capture_logs() as logs:
        await inner.note_served({"ab" * 32: 1700000000.0})
    assert poisoned_keys(logs) == [SERVED] and inner.available
    await inner.note_served({"ab" * 32: 1700000000.0})
    assert await inner.served_times() == {"ab" * 32: 1700000000.0}
