"""One contract for every metadata store: the embedded SQLite store and Redis (one server, Sentinel, Cluster)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from proxy.domain.addresses import ProviderAddr
from proxy.metadata_store import CacheEntry, decode_record, encode_record, keys
from proxy.metadata_store.embedded import EmbeddedStore
from proxy.metadata_store.memory import MemoryFront
from proxy.metadata_store.redis import RedisStore
from proxy.metadata_store.sealed import Seal, SealedStore
from tests.fakes.redis_server import REDIS_SETUPS


# The seal wraps whatever store is inside it and changes values only, never keys or commands: sealed over
# one embedded store and one Redis server; Sentinel and Cluster are checked unsealed.
@pytest.fixture(params=["embedded", *REDIS_SETUPS, "memory-front", "sealed-embedded", "sealed-redis"])
def open_store(request, tmp_path, open_redis):
    """A factory that opens the same store again (to check persistence across restarts)."""
    prefix = f"contract-{uuid.uuid4().hex[:10]}"
    opened = []

    def open_():
        if request.param in REDIS_SETUPS:
            store = open_redis(request.param, prefix=prefix)
        elif request.param == "embedded":
            store = EmbeddedStore(tmp_path / "meta.sqlite")
        elif request.param == "memory-front":
            store = MemoryFront(EmbeddedStore(tmp_path / "meta.sqlite"), max_entries=2)
        elif request.param.removeprefix("sealed-") in REDIS_SETUPS:
            inner = open_redis(request.param.removeprefix("sealed-"), prefix=prefix)
            store = SealedStore(inner, Seal(b"contract-secret-0123456789", store="redis"))
        else:
            store = SealedStore(
                EmbeddedStore(tmp_path / "meta.sqlite"), Seal(b"contract-secret-0123456789", store="embedded")
            )
        opened.append(store)
        return store

    return open_


async def test_missing_key_is_none(open_store):
    store = open_store()
    assert await store.get("nope") is None
    await store.close()


async def test_set_then_get_returns_the_same_bytes(open_store):
    store = open_store()
    value = bytes(range(256)) * 4096  # 1 MiB of every byte value
    await store.set("k:binary", value)
    assert await store.get("k:binary") == value
    await store.close()


async def test_overwrite_and_delete(open_store):
    store = open_store()
    await store.set("k", b"one")
    await store.set("k", b"two", ttl=60)
    assert await store.get("k") == b"two"
    await store.delete("k")
    assert await store.get("k") is None
    await store.delete("k")  # deleting a missing key is fine
    await store.close()


async def test_keys_are_independent_and_may_hold_any_characters(open_store):
    store = open_store()
    keys = [
        "versions:registry.example.test/acme/foo",
        "versions:registry.example.test/acme/bar",
        "download:xn--bcher-kva.example/ns/typ/1.0.0/linux_amd64",
        "sums:" + "a" * 64,
    ]
    for number, key in enumerate(keys):
        await store.set(key, str(number).encode())
    assert [await store.get(key) for key in keys] == [b"0", b"1", b"2", b"3"]
    await store.close()


async def test_entries_survive_reopening(open_store):
    store = open_store()
    entry = CacheEntry(200, b'{"versions": []}', "https://r.example/v1/x", 1700000000.5, '"etag"', "application/json")
    await store.set("doc", entry.encode())
    await store.set("rec", encode_record({"sha256": "ab" * 32}))
    await store.close()
    again = open_store()
    assert CacheEntry.decode(await again.get("doc")) == entry
    assert decode_record(await again.get("rec")) == {"sha256": "ab" * 32}
    await again.close()


async def test_ping_reports_a_working_store(open_store):
    store = open_store()
    assert await store.ping() is True
    assert store.problem is None
    await store.close()


async def test_get_many_returns_values_in_order_with_none_for_missing(open_store):
    store = open_store()
    await store.set("a", b"1")
    await store.set("c", b"3")
    assert await store.get_many(["c", "b", "a", "c"]) == [b"3", None, b"1", b"3"]
    assert await store.get_many([]) == []
    await store.close()


async def test_get_many_of_more_keys_than_one_statement_takes(open_store):
    store = open_store()
    for n in range(0, 1300, 3):
        await store.set(f"k{n}", str(n).encode())
    wanted = [f"k{n}" for n in range(1300)]
    assert await store.get_many(wanted) == [str(n).encode() if n % 3 == 0 else None for n in range(1300)]
    await store.close()


async def test_keys_with_a_prefix_are_exactly_those_starting_with_it(open_store):
    store = open_store()
    for key in ("archive:a/b", "archive:z", "archive", "archivf:x", "archive;x", "archiv:x", "module:a", "a"):
        await store.set(key, b"v")
    assert sorted([key async for key in store.keys("archive:")]) == ["archive:a/b", "archive:z"]
    assert sorted([key async for key in store.keys("archive")]) == ["archive", "archive:a/b", "archive:z", "archive;x"]
    assert len([key async for key in store.keys("")]) == 8
    await store.close()


async def test_a_burst_of_commands_is_answered_in_full(open_store):
    """Hundreds of reads and writes at once (a busy worker), the first commands of a store among them:
    every one answered, and the store stays up (redis-py 8's pools refuse their 101st connection, which
    counted as Redis failing; its cluster client lost some of many first commands to a race)."""
    store = open_store()
    assert await asyncio.gather(*(store.get("burst") for _ in range(200))) == [None] * 200
    await store.set("burst", b"value")
    found = await asyncio.gather(
        *(store.get("burst") for _ in range(300)),
        *(store.get_many(["burst", "other"]) for _ in range(100)),
        *(store.set(f"burst:{n}", b"v") for n in range(100)),
    )
    assert found[:300] == [b"value"] * 300
    assert found[300:400] == [[b"value", None]] * 100
    assert await store.get_many([f"burst:{n}" for n in range(100)]) == [b"v"] * 100
    assert await store.ping() is True and store.problem is None
    await store.close()


async def test_a_record_a_policy_depends_on_is_kept_without_a_ttl(open_store):
    """First-seen times and baselines (`keys.KEPT`) never expire, whatever TTL a caller asks for: an expired one
    would make ages unknown. Redis, where every other key has one, writes them without and removes one on read
    (a record an older version wrote with the retention)."""
    store = open_store()
    addr = ProviderAddr.parse("registry.example.test", "acme", "foo")
    kept = [keys.first_seen(addr), keys.baseline(addr)]
    for key in kept:
        await store.set(key, b"record", ttl=1.0)
    await store.set(keys.versions(addr), b"list", ttl=60.0)
    redis = store if isinstance(store, RedisStore) else getattr(store, "inner", None)
    if isinstance(redis, RedisStore):
        assert [await redis.client.ttl(redis.key(key)) for key in kept] == [-1, -1]
        assert 0 < await redis.client.ttl(redis.key(keys.versions(addr))) <= 60  # the others keep theirs
        for key in kept:
            await redis.client.expire(redis.key(key), 100)
        assert await store.get(kept[0]) == b"record" and await store.get_many(kept[1:]) == [b"record"]
        assert [await redis.client.ttl(redis.key(key)) for key in kept] == [-1, -1]
    assert await store.get_many(kept) == [b"record", b"record"]
    await store.close()
