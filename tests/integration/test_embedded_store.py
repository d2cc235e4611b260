"""The embedded SQLite store on real files: breaker, start-up check and repair of a damaged file."""

from __future__ import annotations

import asyncio
import os
import shutil

from structlog.testing import capture_logs

from proxy.metadata_store.embedded import EmbeddedStore


def corrupt_files(path) -> list:
    return sorted(p for p in path.parent.glob(f"{path.name}.corrupt-*") if not p.name.endswith("-wal"))


def damage_after_page_one(path) -> None:
    with open(path, "r+b") as handle:
        handle.seek(4096)
        handle.write(os.urandom(path.stat().st_size // 2))


async def test_damage_found_while_running_is_moved_aside_and_the_write_lands_in_a_fresh_file(tmp_path):
    path = tmp_path / "metadata.sqlite"
    store = EmbeddedStore(path)
    keys = [f"download:example/{n}" for n in range(800)]
    for key in keys:
        await store.set(key, os.urandom(6000))  # ~5 MB: more than SQLite's page cache holds
    await store.close()
    store = EmbeddedStore(path)
    assert await store.ping() is True  # opened and checked while whole
    damage_after_page_one(path)  # then damaged under the running store
    with capture_logs() as logs:
        found = [await store.get(key) for key in keys]
        await store.set("after", b"value")
    assert [e["event"] for e in logs if e["event"].startswith("metadata_store.")] == ["metadata_store.quarantined"]
    assert len(corrupt_files(path)) == 1
    assert None in found  # what was read after the damage was found is a miss, not an error
    assert await store.get("after") == b"value"
    assert await store.ping() is True and store.problem is None
    await store.close()


async def test_garbage_found_at_start_is_moved_aside(tmp_path):
    path = tmp_path / "metadata.sqlite"
    path.write_bytes(b"this is not a database" * 1000)
    store = EmbeddedStore(path)
    with capture_logs() as logs:
        assert await store.get("k") is None
        await store.set("k", b"v")
    assert await store.get("k") == b"v"
    assert [e["event"] for e in logs] == ["metadata_store.quarantined"]
    assert corrupt_files(path)[0].read_bytes().startswith(b"this is not a database")
    await store.close()


async def test_unusable_file_opens_the_breaker_and_closes_it_when_usable_again(tmp_path):
    path = tmp_path / "metadata.sqlite"
    path.mkdir()  # cannot be opened as a database
    now = [1000.0]
    store = EmbeddedStore(path, retry_interval=5, clock=lambda: now[0])
    with capture_logs() as logs:
        assert await store.get("k") is None
        await store.set("k", b"v")  # skipped, not raised
        assert await store.ping() is False
        assert "unable to open" in (store.problem or "")
        now[0] += 1
        assert await store.get("k") is None
    assert [e["event"] for e in logs] == ["metadata_store.down"]
    shutil.rmtree(path)
    assert await store.ping() is False  # still within the retry interval: the file is left alone
    now[0] += 5
    with capture_logs() as logs:
        assert await store.ping() is True
    assert [e["event"] for e in logs] == ["metadata_store.up"]
    await store.set("k", b"v")
    assert await store.get("k") == b"v" and store.problem is None
    assert corrupt_files(path) == []
    await store.close()


async def test_commits_are_not_fsynced_one_by_one_in_wal_mode(tmp_path):
    """`synchronous=NORMAL` with WAL: a power cut may lose the last writes of the cache, never its file."""
    store = EmbeddedStore(tmp_path / "metadata.sqlite")
    await store.set("k", b"v")

    async def pragmas(cache) -> tuple:
        async with cache.get_connection() as db:
            modes = []
            for pragma in ("journal_mode", "synchronous"):
                async with db.execute(f"PRAGMA {pragma}") as cursor:
                    modes.append((await cursor.fetchone())[0])
            return tuple(modes)

    assert await store._patiently(pragmas) == ("wal", 1)  # 1 = NORMAL (2 = FULL, the default)
    await store.close()


async def test_concurrent_fills_keep_every_record_and_never_mark_the_store_down(tmp_path):
    """Many requests at once write records, served times and first-seen records on the one connection (issue 33:
    `InterfaceError: bad parameter or other API misuse` took the store down and its writes were skipped)."""
    store = EmbeddedStore(tmp_path / "metadata.sqlite")
    waves, per_wave = 2, 500  # requests keep arriving: a write skipped while the store is down is lost

    async def fill(number: int) -> None:
        await store.set(f"archive:example/{number}", b"record %d" % number)
        await store.note_served({f"{number:064x}": float(number)})
        await store.add(f"first-seen:example/{number}", b"seen")

    with capture_logs() as logs:
        for wave in range(waves):
            await asyncio.gather(*(fill(wave * per_wave + n) for n in range(per_wave)))
    total = waves * per_wave
    assert [e["error"] for e in logs if e["event"] == "metadata_store.down"] == []
    assert store.problem is None
    assert len([key async for key in store.keys("archive:")]) == total
    assert len([key async for key in store.keys("first-seen:")]) == total
    assert len(await store.served_times()) == total
    await store.close()
