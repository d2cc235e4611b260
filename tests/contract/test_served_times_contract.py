"""One contract for every `proxy.storage.ServedTimes`: the last-served times of archives, kept where the
metadata's connection is (the embedded SQLite file, Redis) but not part of the metadata store itself."""

from __future__ import annotations

import uuid

import pytest

from proxy.metadata_store.embedded import EmbeddedStore
from proxy.metadata_store.redis import RedisStore

SHA_A, SHA_B = "a" * 64, "b" * 64


@pytest.fixture(params=["embedded", "redis"])
def open_times(request, tmp_path):
    """A factory that opens the same store again (to check persistence across restarts)."""
    prefix = f"served-{uuid.uuid4().hex[:10]}"

    def open_() -> EmbeddedStore | RedisStore:
        if request.param == "redis":
            return RedisStore(request.getfixturevalue("redis_server").url, prefix=prefix)
        return EmbeddedStore(tmp_path / "meta.sqlite")

    return open_


async def test_served_times_keep_the_latest_and_survive_reopening(open_times):
    times = open_times()
    assert await times.served_times() == {}
    await times.note_served({SHA_A: 1000.0, SHA_B: 2000.5})
    await times.note_served({SHA_A: 3000.0})
    await times.note_served({SHA_B: 1500.0})  # an earlier time (a slower replica's) never moves it back
    await times.note_served({})
    await times.close()
    times = open_times()
    assert await times.served_times() == {SHA_A: 3000.0, SHA_B: 2000.5}
    await times.forget_served([SHA_A, "c" * 64])
    assert await times.served_times() == {SHA_B: 2000.5}
    await times.close()


async def test_served_times_are_not_metadata_keys(open_times):
    """Export lists keys: the served times must not show up there (nor break the listing)."""
    store = open_times()
    await store.set("versions:registry.example.test/acme/foo", b"x")
    await store.note_served({SHA_A: 1000.0})
    assert [key async for key in store.keys()] == ["versions:registry.example.test/acme/foo"]  # noqa: SIM118 - async
    await store.close()
