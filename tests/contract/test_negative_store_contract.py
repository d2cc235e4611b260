"""One contract for the bounded stores of remembered 404s: in process memory and in Redis (one server,
Sentinel, Cluster: there the entries and their bookkeeping share one hash slot, so the script that keeps
them never meets a CROSSSLOT error)."""

from __future__ import annotations

import uuid

import pytest

from proxy.metadata_store import CacheEntry, encode_record
from proxy.metadata_store.embedded import EmbeddedStore
from proxy.metadata_store.keys import NEGATIVE
from proxy.metadata_store.memory import MemoryFront
from proxy.metadata_store.negative import MemoryNegatives, NegativeBound, is_negative
from proxy.metadata_store.redis import RedisNegatives
from proxy.metadata_store.sealed import Seal, seal
from tests.fakes.redis_server import REDIS_SETUPS


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


SECRET = b"negative-contract-secret-0123456789"
SEAL_OVERHEAD = len(seal(SECRET, "k", b""))  # what the seal adds to every value Redis keeps


@pytest.fixture(params=["memory", *REDIS_SETUPS])
def negatives_store(request) -> str:
    return request.param


@pytest.fixture
def overhead(negatives_store) -> int:
    """Bytes a store adds to each value it counts (Redis seals them)."""
    return 0 if negatives_store == "memory" else SEAL_OVERHEAD


@pytest.fixture
async def make_negatives(negatives_store, open_redis, redis_setup):
    """`make(max_entries, max_bytes, retention)` → (negatives, clock, reports, (raw redis client, store) or None)."""
    opened = []

    def make(max_entries: int = 100, max_bytes: int = 1 << 20, retention: float = 3600.0):
        clock, reports = Clock(), []

        def report(entries: int, size: int) -> None:
            reports.append((entries, size))

        if negatives_store == "memory":
            return MemoryNegatives(max_entries, max_bytes, retention, report=report, clock=clock), clock, reports, None
        store = open_redis(negatives_store, prefix=f"neg-{uuid.uuid4().hex[:10]}")
        client = redis_setup(negatives_store).client()
        opened.append((store, client))
        negatives = RedisNegatives(
            store, Seal(SECRET, store="redis"), max_entries, max_bytes, retention, report=report, clock=clock
        )
        return negatives, clock, reports, (client, store)

    yield make
    for store, client in opened:
        await store.close()
        client.close()


async def test_put_get_discard(make_negatives, overhead):
    negatives, _, reports, _ = make_negatives()
    assert await negatives.get("versions:a") is None
    await negatives.put("versions:a", b"404-a")
    assert await negatives.get("versions:a") == b"404-a"
    assert await negatives.get_many(["versions:a", "versions:b"]) == [b"404-a", None]
    assert reports[-1] == (1, len("versions:a") + len(b"404-a") + overhead)
    await negatives.put("versions:a", b"404-again")  # replacing does not count twice
    assert reports[-1] == (1, len("versions:a") + len(b"404-again") + overhead)
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
        client, store = raw
        assert len(list(client.scan_iter(match=store.key(NEGATIVE.key("*"))))) == 3  # evicted keys are gone
        assert 0 < client.ttl(store.key(NEGATIVE.key("k9"))) <= 3600
        assert [key async for key in store.keys()] == []  # noqa: SIM118 - never listed, never exported


async def test_the_byte_bound_drops_the_oldest(make_negatives, overhead):
    each = 30 + overhead  # key, value and seal
    negatives, clock, reports, _ = make_negatives(max_bytes=3 * each + 10)
    for number in range(10):
        clock.now += 1
        await negatives.put(f"k{number}", b"x" * 28)
    assert reports[-1] == (3, 3 * each)
    assert [await negatives.get(f"k{n}") for n in (6, 7, 8, 9)] == [None, b"x" * 28, b"x" * 28, b"x" * 28]
    await negatives.put("huge", b"x" * 4 * each)  # larger than the whole bound: not kept, nothing else lost
    assert await negatives.get("huge") is None and reports[-1] == (3, 3 * each)


async def test_entries_older_than_the_retention_are_dropped(make_negatives):
    negatives, clock, reports, _ = make_negatives(retention=60)
    await negatives.put("old", b"v")
    clock.now += 61
    await negatives.put("new", b"v")
    assert await negatives.get("old") is None
    assert await negatives.get("new") == b"v"
    assert reports[-1][0] == 1


async def test_in_memory_a_read_within_the_retention_is_a_use_and_a_stale_one_is_not():
    clock = Clock()
    negatives = MemoryNegatives(2, 1 << 20, 60, clock=clock)
    await negatives.put("old", b"v")
    await negatives.put("stale", b"v")
    clock.now += 30
    await negatives.put("new", b"v")  # "old" goes: 2 entries at most
    clock.now += 31
    assert await negatives.get("stale") is None  # past the retention: dropped, not used
    await negatives.put("newer", b"v")
    assert await negatives.get("new") == b"v"  # a use: "newer" is now the least recently used
    await negatives.put("newest", b"v")
    assert [await negatives.get(key) for key in ("old", "new", "newer", "newest")] == [None, b"v", None, b"v"]


def refused_into(refused: list[tuple[str, str]]):
    """A `refuse` callback of NegativeBound that notes (key, reason)."""
    return lambda key, why, reason: refused.append((key, reason))


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
    store = NegativeBound(inner, MemoryNegatives(2, 1 << 20, 3600), refuse=refused_into([]))
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


async def test_a_negative_store_only_ever_answers_absent(make_negatives, tmp_path):
    """Whatever is found among the negatives that is not a remembered 404 is refused, never an answer."""
    negatives, _, _, _ = make_negatives()
    refused: list[tuple[str, str]] = []
    store = NegativeBound(EmbeddedStore(tmp_path / "meta.sqlite"), negatives, refuse=refused_into(refused))
    document = CacheEntry(200, b'{"version": "1.0.0"}', "https://r.example/v1/x", 1.0).encode()
    await negatives.put("download:a", document)  # as if planted: NegativeBound never writes one there
    await negatives.put("download:b", negative())
    assert await store.get("download:a") is None
    assert await store.get_many(["download:a", "download:b", "download:c"]) == [None, negative(), None]
    assert refused == [("negative:download:a", "not_negative")] * 2
    await store.close()


@pytest.mark.parametrize("setup", REDIS_SETUPS)
async def test_redis_negatives_refuse_what_the_fleet_did_not_seal(setup, open_redis, redis_setup):
    """A remembered 404 written by anyone without the secret, or moved from another key, is a miss."""
    store, client = open_redis(setup, prefix=f"neg-{uuid.uuid4().hex[:10]}"), redis_setup(setup).client()
    refused: list[tuple[str, str]] = []
    negatives = RedisNegatives(
        store, Seal(SECRET, store="redis", on_reject=lambda s, r: refused.append((s, r))), 10, 1 << 20, 3600
    )
    await negatives.put("versions:a", negative())
    assert await negatives.get("versions:a") == negative()
    entry = {name: store.key(NEGATIVE.key(f"versions:{name}")) for name in "abc"}
    client.set(entry["b"], negative())  # no seal
    client.set(entry["c"], client.get(entry["a"]))  # moved
    assert await negatives.get_many(["versions:a", "versions:b", "versions:c"]) == [negative(), None, None]
    assert refused == [("redis", "no_seal"), ("redis", "bad_seal")]
    client.close()
    await store.close()


@pytest.mark.parametrize("setup", REDIS_SETUPS)
async def test_redis_negatives_past_the_retention_are_listed_for_gc(setup, open_redis):
    """`expired()` (what `registry-proxy gc` removes) reads the bookkeeping wherever the setup keeps it."""
    store, clock = open_redis(setup, prefix=f"neg-{uuid.uuid4().hex[:10]}"), Clock()
    negatives = RedisNegatives(store, Seal(SECRET, store="redis"), 10, 1 << 20, 60, clock=clock)
    await negatives.put("versions:old", b"404-old")
    clock.now += 30
    await negatives.put("versions:new", b"404-new")
    size = len("versions:old") + len(b"404-old") + SEAL_OVERHEAD
    assert await negatives.expired(clock.now + 31) == [("versions:old", size)]
    assert await negatives.expired(clock.now) == []
    await store.close()
