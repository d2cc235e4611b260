"""One contract for the bounded stores of remembered 404s: in process memory and in Redis."""

from __future__ import annotations

import uuid

import pytest
import redis

from proxy.cache import CacheEntry, encode_record
from proxy.cache.embedded import EmbeddedStore
from proxy.cache.memory import MemoryFront
from proxy.cache.negative import MemoryNegatives, NegativeBound, is_negative
from proxy.cache.redis import RedisNegatives, RedisStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
async def make_negatives(request):
    """`make(max_entries, max_bytes, retention)` → (negatives, clock, reports, raw redis client or None)."""
    opened = []

    def make(max_entries: int = 100, max_bytes: int = 1 << 20, retention: float = 3600.0):
        clock, reports = Clock(), []

        def report(entries: int, size: int) -> None:
            reports.append((entries, size))

        if request.param == "memory":
            return MemoryNegatives(max_entries, max_bytes, retention, report=report, clock=clock), clock, reports, None
        url = request.getfixturevalue("redis_server").url
        store, client = RedisStore(url, prefix=f"neg-{uuid.uuid4().hex[:10]}"), redis.Redis.from_url(url)
        opened.append((store, client))
        negatives = RedisNegatives(store, max_entries, max_bytes, retention, report=report, clock=clock)
        return negatives, clock, reports, (client, store.prefix)

    yield make
    for store, client in opened:
        await store.close()
        client.close()


async def test_put_get_discard(make_negatives):
    negatives, _, reports, _ = make_negatives()
    assert await negatives.get("versions:a") is None
    await negatives.put("versions:a", b"404-a")
    assert await negatives.get("versions:a") == b"404-a"
    assert await negatives.get_many(["versions:a", "versions:b"]) == [b"404-a", None]
    assert reports[-1] == (1, len("versions:a") + len(b"404-a"))
    await negatives.put("versions:a", b"404-again")  # replacing does not count twice
    assert reports[-1] == (1, len("versions:a") + len(b"404-again"))
    await negatives.discard("versions:a")
    assert await negatives.get("versions:a") is None and reports[-1] == (0, 0)


async def test_the_count_bound_drops_the_oldest(make_negatives):
    negatives, clock, reports, raw = make_negatives(max_entries=3)
    for number in range(10):
        clock.now += 1
        await negatives.put(f"k{number}", b"v")
    assert [await negatives.get(f"k{n}") for n in range(10)] == [None] * 7 + [b"v"] * 3
    assert reports[-1][0] == 3
    if raw is not None:
        client, prefix = raw
        assert len(list(client.scan_iter(match=f"{prefix}:negative:*"))) == 3  # evicted keys are gone
        assert 0 < client.ttl(f"{prefix}:negative:k9") <= 3600
        assert [key async for key in negatives._store.keys()] == []  # noqa: SIM118 - never listed, never exported


async def test_the_byte_bound_drops_the_oldest(make_negatives):
    negatives, clock, reports, _ = make_negatives(max_bytes=100)
    for number in range(10):
        clock.now += 1
        await negatives.put(f"k{number}", b"x" * 28)  # 30 bytes each
    assert reports[-1] == (3, 90)
    assert [await negatives.get(f"k{n}") for n in (6, 7, 8, 9)] == [None, b"x" * 28, b"x" * 28, b"x" * 28]
    await negatives.put("huge", b"x" * 200)  # larger than the whole bound: not kept, nothing else lost
    assert await negatives.get("huge") is None and reports[-1] == (3, 90)


async def test_entries_older_than_the_retention_are_dropped(make_negatives):
    negatives, clock, reports, _ = make_negatives(retention=60)
    await negatives.put("old", b"v")
    clock.now += 61
    await negatives.put("new", b"v")
    assert await negatives.get("old") is None
    assert await negatives.get("new") == b"v"
    assert reports[-1][0] == 1


def negative(url: str = "https://r.example/v1/x") -> bytes:
    return CacheEntry(404, b"", url, 1700000000.0).encode()


def test_is_negative_tells_remembered_404s_from_everything_else():
    assert is_negative(negative())
    assert is_negative(CacheEntry(410, b"", "u", 1.0).encode())
    assert not is_negative(CacheEntry(200, b"{}", "u", 1.0).encode())
    assert not is_negative(encode_record({"status": 404}))
    assert not is_negative(b"not json")


async def test_negative_bound_keeps_negatives_out_of_the_persistent_store(tmp_path):
    inner = MemoryFront(EmbeddedStore(tmp_path / "meta.sqlite"), remember_absence=True)
    store = NegativeBound(inner, MemoryNegatives(2, 1 << 20, 3600))
    positive = CacheEntry(200, b"{}", "u", 1.0).encode()
    await store.set("versions:warm", positive)
    for number in range(50):
        await store.set(f"versions:made-up-{number}", negative())
    assert [key async for key in store.keys()] == ["versions:warm"]  # noqa: SIM118 - nothing else is kept
    assert await store.get("versions:made-up-49") == negative()
    assert await store.get("versions:made-up-0") is None  # evicted
    assert await store.get_many(["versions:warm", "versions:made-up-48", "x"]) == [positive, negative(), None]
    # A 404 for a key that had a document replaces it; a document replaces a remembered 404.
    await store.set("versions:warm", negative())
    assert await store.get("versions:warm") == negative() and await inner.get("versions:warm") is None
    await store.set("versions:warm", positive)
    assert await store.get("versions:warm") == positive and await store.negatives.get("versions:warm") is None
    await store.delete("versions:made-up-49")
    assert await store.get("versions:made-up-49") is None
    await store.close()
