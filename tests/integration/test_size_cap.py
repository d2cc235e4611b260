"""`Evictor` and `ArchiveUsage` on a real store and real metadata stores: the free-space floor, the
periodic run, an unreadable fleet view, pins and the throttle of served-time writes."""

from __future__ import annotations

import os
import time

import pytest

from proxy.metadata_store.embedded import EmbeddedStore
from proxy.metadata_store.redis import RedisStore
from proxy.runtime.coalescing import LocalLocks
from proxy.runtime.metrics import Metrics
from proxy.settings.config import SpaceFloor
from proxy.storage import ArchiveStore, ArchiveUsage, DiskSpace, Evictor
from proxy.storage.disk import DiskStore
from tests.fakes.process import wait_for, wait_until

LONG_AGO = 3 * 86400
WAIT = 10
NO_FLOOR = SpaceFloor(0)


@pytest.fixture
async def store(tmp_path) -> ArchiveStore:
    store = DiskStore(tmp_path / "archives")
    await store.open()
    yield store
    await store.close()


async def publish(store: ArchiveStore, data: bytes, age: float) -> str:
    pending = store.begin()
    pending.write(data)
    sha = pending.finish()
    await store.publish(pending, sha)
    then = time.time() - age
    os.utime(store.path_for(sha), (then, then))
    return sha


def evictor(
    store: ArchiveStore,
    metadata,
    *,
    cap: int | None,
    floor: SpaceFloor = NO_FLOOR,
    interval: float = 3600.0,
    usage: ArchiveUsage | None = None,
) -> Evictor:
    return Evictor(
        store,
        usage or ArchiveUsage(metadata),
        metadata,
        LocalLocks(),
        DiskSpace(store.root, floor),
        Metrics(),
        cap=cap,
        grace=600.0,
        interval=interval,
    )


async def present(store: ArchiveStore) -> set[str]:
    return {obj.sha256 for obj in await store.list_objects()}


async def test_below_the_free_space_floor_the_cap_evicts_more(store, tmp_path):
    metadata = EmbeddedStore(tmp_path / "meta.sqlite")
    old = [await publish(store, bytes([n]) * 1000, LONG_AGO - n) for n in range(3)]
    fresh = await publish(store, b"stored a moment ago", 1)
    # far under the cap, but the disk is "below its floor" (99.9% must stay free): free what is not in use
    run = await evictor(store, metadata, cap=10**12, floor=SpaceFloor(0, 99.9)).run()
    assert set(run.evicted) == set(old) and run.freed == 3000
    assert await present(store) == {fresh}
    await metadata.close()


async def test_without_a_cap_nothing_is_evicted_but_the_size_is_measured(store, tmp_path):
    metadata = EmbeddedStore(tmp_path / "meta.sqlite")
    shas = {await publish(store, bytes([n]) * 100, LONG_AGO) for n in range(2)}
    job = evictor(store, metadata, cap=None, floor=SpaceFloor(0, 99.9))
    run = await job.run()
    assert (run.objects, run.bytes, run.evicted) == (2, 200, ())
    assert await present(store) == shas
    assert job._metrics.registry.get_sample_value("registry_proxy_store_bytes") == 200
    await metadata.close()


async def test_the_periodic_run_evicts_the_least_recently_served(store, tmp_path):
    metadata = EmbeddedStore(tmp_path / "meta.sqlite")
    first, second, third = [await publish(store, bytes([n]) * 1000, LONG_AGO) for n in range(3)]
    now = time.time()
    await metadata.note_served({first: now - 3000, second: now - 9000, third: now - 1000})
    job = evictor(store, metadata, cap=2000, interval=0.05)

    async def forgotten() -> bool:
        return second not in await metadata.served_times()

    job.start()
    try:
        # no publish wakes it: only the interval does; the run removes the file, then forgets its served time
        await wait_for(lambda: not store.path_for(second).exists(), WAIT, "the periodic run to evict")
        await wait_until(forgotten, WAIT, "the periodic run to forget the evicted archive's served time")
    finally:
        await job.close()
    assert await present(store) == {first, third}
    assert second not in await metadata.served_times()
    await metadata.close()


async def test_nothing_is_evicted_while_the_fleet_s_served_times_cannot_be_read(store, tmp_path, refused_port):
    """Redis down: evicting by file times alone could remove what other replicas serve all day."""
    metadata = RedisStore(f"redis://127.0.0.1:{refused_port}/0", prefix="nobody-listens")
    shas = {await publish(store, bytes([n]) * 1000, LONG_AGO) for n in range(3)}
    run = await evictor(store, metadata, cap=1000).run()
    assert run.excess == 2000 and run.evicted == ()
    assert await present(store) == shas
    await metadata.close()


async def test_archive_usage_pins_while_serving_and_writes_once_a_minute(tmp_path):
    metadata = EmbeddedStore(tmp_path / "meta.sqlite")
    clock = [1_000_000.0]
    usage = ArchiveUsage(metadata, every=60.0, clock=lambda: clock[0])
    sha = "a" * 64
    async with usage.serving(sha):
        async with usage.serving(sha):
            assert usage.pinned() == {sha}
        assert usage.is_pinned(sha)  # the other response still sends it
    assert not usage.is_pinned(sha)
    assert await metadata.served_times() == {sha: 1_000_000.0}
    clock[0] += 59
    await usage.note(sha)
    assert await metadata.served_times() == {sha: 1_000_000.0}  # throttled
    clock[0] += 2
    await usage.note(sha)
    assert await metadata.served_times() == {sha: 1_000_061.0}
    usage.forget(sha)  # evicted: the next serve is written at once
    clock[0] += 1
    await usage.note(sha)
    assert await metadata.served_times() == {sha: 1_000_062.0}
    await metadata.close()
