"""Unit tests for proxy.metadata_store.memory.MemoryFront (the in-process LRU in front of a metadata store)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from proxy.metadata_store.memory import MemoryFront


class CountingStore:
    """An in-memory MetadataStore that counts calls and can hold a call until released."""

    def __init__(self, values: dict[str, bytes] | None = None) -> None:
        self.values: dict[str, bytes] = dict(values or {})
        self.gets: list[str] = []
        self.sets: list[tuple[str, bytes, float | None]] = []
        self.deletes: list[str] = []
        self.closed = False
        self.hold_get: asyncio.Event | None = None
        self.hold_delete: asyncio.Event | None = None

    async def get(self, key: str) -> bytes | None:
        self.gets.append(key)
        value = self.values.get(key)
        if self.hold_get is not None:
            await self.hold_get.wait()
        return value

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        self.sets.append((key, value, ttl))
        self.values[key] = value

    async def delete(self, key: str) -> None:
        self.deletes.append(key)
        if self.hold_delete is not None:
            await self.hold_delete.wait()
        self.values.pop(key, None)

    async def keys(self, prefix: str = "") -> AsyncIterator[str]:
        for key in sorted(self.values):
            if key.startswith(prefix):
                yield key

    async def ping(self) -> bool:
        return not self.closed

    async def close(self) -> None:
        self.closed = True


async def test_set_writes_through_to_the_inner_store() -> None:
    inner = CountingStore()
    front = MemoryFront(inner)
    await front.set("k", b"v", ttl=30)
    assert inner.values == {"k": b"v"}
    assert inner.sets == [("k", b"v", 30)]
    assert await front.get("k") == b"v"
    assert inner.gets == []  # served from memory


async def test_reads_are_served_from_memory_after_the_first() -> None:
    inner = CountingStore({"a": b"1", "b": b"2"})
    front = MemoryFront(inner)
    for _ in range(3):
        assert await front.get("a") == b"1"
        assert await front.get("b") == b"2"
    assert inner.gets == ["a", "b"]


async def test_memory_hides_later_changes_in_the_inner_store() -> None:
    inner = CountingStore({"a": b"1"})
    front = MemoryFront(inner)
    assert await front.get("a") == b"1"
    inner.values["a"] = b"changed behind its back"
    assert await front.get("a") == b"1"


@pytest.mark.parametrize("max_entries", [1, 2, 3, 5])
async def test_least_recently_used_entry_is_evicted(max_entries: int) -> None:
    keys = [f"k{i}" for i in range(max_entries + 1)]
    inner = CountingStore({key: key.encode() for key in keys})
    front = MemoryFront(inner, max_entries=max_entries)
    for key in keys[:max_entries]:
        await front.get(key)
    await front.get(keys[0])  # now the most recently used
    await front.get(keys[-1])  # one too many: evicts the least recently used
    evicted = keys[1] if max_entries > 1 else keys[0]
    inner.gets.clear()
    for key in keys:
        if key != evicted:
            assert await front.get(key) == key.encode()
    assert inner.gets == []
    assert await front.get(evicted) == evicted.encode()
    assert inner.gets == [evicted]


async def test_eviction_counts_sets_too() -> None:
    inner = CountingStore()
    front = MemoryFront(inner, max_entries=2)
    await front.set("a", b"1")
    await front.set("b", b"2")
    await front.get("a")  # "b" is now the least recently used
    await front.set("c", b"3")
    assert await front.get("a") == b"1"
    assert await front.get("c") == b"3"
    assert inner.gets == []
    assert await front.get("b") == b"2"
    assert inner.gets == ["b"]


async def test_at_most_max_entries_are_remembered() -> None:
    inner = CountingStore({f"k{i}": b"x" for i in range(10)})
    front = MemoryFront(inner, max_entries=4)
    for i in range(10):
        await front.get(f"k{i}")
    inner.gets.clear()
    for i in range(6, 10):
        await front.get(f"k{i}")
    assert inner.gets == []
    await front.get("k5")
    assert inner.gets == ["k5"]


@pytest.mark.parametrize(("remember_absence", "inner_gets"), [(False, 3), (True, 1)])
async def test_absences_are_remembered_only_when_asked(remember_absence: bool, inner_gets: int) -> None:
    inner = CountingStore()
    front = MemoryFront(inner, remember_absence=remember_absence)
    for _ in range(3):
        assert await front.get("missing") is None
    assert inner.gets == ["missing"] * inner_gets


async def test_absence_not_remembered_sees_a_record_added_later_by_someone_else() -> None:
    inner = CountingStore()
    front = MemoryFront(inner, remember_absence=False)
    assert await front.get("k") is None
    inner.values["k"] = b"added by another replica"
    assert await front.get("k") == b"added by another replica"


@pytest.mark.parametrize("remember_absence", [False, True])
async def test_set_replaces_a_remembered_absence(remember_absence: bool) -> None:
    inner = CountingStore()
    front = MemoryFront(inner, remember_absence=remember_absence)
    assert await front.get("k") is None
    await front.set("k", b"v")
    gets_before = len(inner.gets)
    assert await front.get("k") == b"v"
    assert len(inner.gets) == gets_before


@pytest.mark.parametrize("remember_absence", [False, True])
async def test_delete_removes_from_memory_and_inner_store(remember_absence: bool) -> None:
    inner = CountingStore()
    front = MemoryFront(inner, remember_absence=remember_absence)
    await front.set("k", b"v")
    await front.set("other", b"o")
    await front.delete("k")
    assert inner.deletes == ["k"]
    assert "k" not in inner.values
    assert await front.get("k") is None
    assert inner.gets == ["k"]
    assert await front.get("other") == b"o"


async def test_delete_of_an_unknown_key_is_harmless() -> None:
    inner = CountingStore()
    front = MemoryFront(inner)
    await front.delete("never-set")
    assert inner.deletes == ["never-set"]


async def test_values_are_per_key() -> None:
    inner = CountingStore()
    front = MemoryFront(inner)
    await front.set("a", b"1")
    await front.set("b", b"2")
    await front.set("a", b"3")
    assert (await front.get("a"), await front.get("b")) == (b"3", b"2")
    assert inner.values == {"a": b"3", "b": b"2"}


async def test_keys_are_listed_by_the_inner_store() -> None:
    inner = CountingStore({"module:a": b"1", "module:b": b"2", "versions:a": b"3"})
    front = MemoryFront(inner)
    await front.set("module:c", b"4")
    assert [key async for key in front.keys("module:")] == ["module:a", "module:b", "module:c"]
    assert [key async for key in front.keys("")] == ["module:a", "module:b", "module:c", "versions:a"]


async def test_ping_and_close_reach_the_inner_store() -> None:
    inner = CountingStore({"k": b"v"})
    front = MemoryFront(inner)
    assert await front.get("k") == b"v"
    assert await front.ping() is True
    await front.close()
    assert inner.closed
    assert await front.ping() is False
    inner.gets.clear()
    await front.get("k")
    assert inner.gets == ["k"]  # close() forgot what was remembered


async def test_a_get_overtaken_by_a_set_does_not_remember_the_old_value() -> None:
    """A get that read the inner store before a concurrent set finished must not overwrite the new value."""
    inner = CountingStore({"k": b"old"})
    front = MemoryFront(inner)
    release = asyncio.Event()
    inner.hold_get = release
    reader = asyncio.create_task(front.get("k"))
    await asyncio.sleep(0)  # the reader has read b"old" from the inner store and is held
    assert inner.gets == ["k"]
    inner.hold_get = None
    await front.set("k", b"new")
    release.set()
    assert await reader in (b"old", b"new")
    assert inner.values["k"] == b"new"
    assert await front.get("k") == b"new"


async def test_a_get_during_a_delete_does_not_bring_the_value_back() -> None:
    inner = CountingStore()
    front = MemoryFront(inner)
    await front.set("k", b"v")
    release = asyncio.Event()
    inner.hold_delete = release
    deleter = asyncio.create_task(front.delete("k"))
    await asyncio.sleep(0)  # the delete has started and is held in the inner store
    assert inner.deletes == ["k"]
    assert await front.get("k") in (b"v", None)  # the delete has not finished: either answer is fine
    release.set()
    await deleter
    assert "k" not in inner.values
    assert await front.get("k") is None


async def test_a_flood_of_absences_does_not_push_out_warm_values() -> None:
    inner = CountingStore({"warm:a": b"1", "warm:b": b"2"})
    front = MemoryFront(inner, max_entries=2, remember_absence=True, max_absent=3)
    assert [await front.get("warm:a"), await front.get("warm:b")] == [b"1", b"2"]
    for number in range(1000):
        assert await front.get(f"made-up:{number}") is None
    inner.gets.clear()
    assert [await front.get("warm:a"), await front.get("warm:b")] == [b"1", b"2"]
    assert inner.gets == []  # still in memory
    assert await front.get("made-up:999") is None and inner.gets == []  # recent absences are remembered
    assert await front.get("made-up:0") is None and inner.gets == ["made-up:0"]  # old ones were evicted
