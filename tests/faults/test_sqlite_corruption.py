"""A corrupt or unusable embedded metadata store degrades like a Redis outage, never into 500s.

Real proxy processes on the embedded SQLite store: the file is overwritten with garbage or
truncated (while the proxy is stopped, and while it runs), or cannot be opened at all.
Archives already on disk are still served with the right bytes, metadata is re-fetched,
`/readyz` says what is true, and an unreadable file is moved aside for a fresh one.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import time

import pytest

PROVIDER = "registry.example.test/acme/foo"
ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
INDEX = f"/mirror/v1/{PROVIDER}/index.json"
VERSION = f"/mirror/v1/{PROVIDER}/1.0.0.json"


def damage(path, how: str) -> None:
    """Write garbage over the whole file, or cut it in the middle (the same inode, like a bad disk)."""
    size = path.stat().st_size
    assert size > 8192, "the metadata file is too small to damage meaningfully"
    with open(path, "r+b") as handle:
        if how == "garbage":
            handle.write(os.urandom(size))
        else:
            handle.truncate(size // 2)
            handle.seek(1024)
            handle.write(os.urandom(4096))  # and a torn page inside what is left


def quarantined(data_dir) -> list:
    return sorted(p for p in (data_dir / "metadata").glob("metadata.sqlite.corrupt-*") if p.name[-4:] != "-wal")


async def warm(client, release) -> None:
    for path in (INDEX, VERSION):
        status, _, _ = await client.get(path)
        assert status == 200
    status, _, body = await client.get(ARCHIVE)
    assert (status, body) == (200, release.zips["linux_amd64"])


async def answers_correctly(client, registry, release) -> None:
    """Archive from disk with the right bytes (not downloaded again) and metadata answered."""
    downloads = registry.count(registry.archive_path(release, "linux_amd64"))
    status, _, body = await client.get(ARCHIVE)
    assert status == 200
    assert body == release.zips["linux_amd64"]
    assert registry.count(registry.archive_path(release, "linux_amd64")) == downloads
    for path in (INDEX, VERSION):
        status, _, body = await client.get(path)
        assert status == 200, body
        assert "1.0.0" in json.loads(body).get("versions", {}) or "archives" in json.loads(body)


@pytest.mark.parametrize("how", ["garbage", "truncated"])
async def test_damaged_while_stopped_is_moved_aside_and_replaced(in_process_proxy, connect, registry, tmp_path, how):
    release = registry.releases[("acme", "foo")]["1.0.0"]
    data_dir = tmp_path / "data"
    proc = await in_process_proxy(data_dir=data_dir)
    await warm(await connect(proc), release)
    await proc.stop()
    database = data_dir / "metadata" / "metadata.sqlite"
    damage(database, how)

    proc = await in_process_proxy(data_dir=data_dir)
    client = await connect(proc)
    await answers_correctly(client, registry, release)
    status, _, body = await client.get("/readyz")
    assert (status, json.loads(body)["status"]) == (200, "ready")
    assert len(quarantined(data_dir)) == 1
    assert proc.events("metadata_store.quarantined")

    # The fresh database works: after a restart everything is a cache hit (no upstream metadata request).
    await proc.stop()
    requests = len(registry.requests)
    proc = await in_process_proxy(data_dir=data_dir)
    client = await connect(proc)
    await answers_correctly(client, registry, release)
    assert registry.requests[requests:] == []
    assert len(quarantined(data_dir)) == 1


@pytest.mark.parametrize("how", ["garbage", "truncated"])
async def test_damaged_while_running_keeps_serving(in_process_proxy, connect, registry, tmp_path, how):
    release = registry.releases[("acme", "foo")]["1.0.0"]
    data_dir = tmp_path / "data"
    proc = await in_process_proxy(data_dir=data_dir)
    client = await connect(proc)
    await warm(client, release)
    damage(data_dir / "metadata" / "metadata.sqlite", how)

    # 1.1.0 was never asked for: its metadata must come from the (damaged) store or upstream.
    status, _, _ = await client.get(f"/mirror/v1/{PROVIDER}/1.1.0.json")
    assert status == 200
    await answers_correctly(client, registry, release)
    for _ in range(5):
        status, _, body = await client.get(
            f"/mirror/v1/{PROVIDER}/1.1.0/darwin_arm64/terraform-provider-foo_1.1.0_darwin_arm64.zip"
        )
        assert status == 200
    status, _, body = await client.get("/readyz")
    assert status == 200
    assert not [r for r in proc.events("request") if r.get("status", 200) >= 500]

    # SQLite in WAL mode keeps serving pages it holds and writes them back at the checkpoint, so the
    # file may come back whole; if not, the next start finds the damage and moves the file aside.
    await proc.stop()
    first, proc = proc, await in_process_proxy(data_dir=data_dir)
    client = await connect(proc)
    await answers_correctly(client, registry, release)
    status, _, body = await client.get("/readyz")
    assert (status, json.loads(body)["status"]) == (200, "ready")
    await proc.stop()
    moved = first.events("metadata_store.quarantined") + proc.events("metadata_store.quarantined")
    assert len(quarantined(data_dir)) == len(moved) <= 1
    with sqlite3.connect(data_dir / "metadata" / "metadata.sqlite") as db:
        assert db.execute("PRAGMA quick_check").fetchall() == [("ok",)]


async def test_unopenable_store_is_degraded_not_down_and_recovers(in_process_proxy, connect, registry, tmp_path):
    release = registry.releases[("acme", "foo")]["1.0.0"]
    data_dir = tmp_path / "data"
    blocker = data_dir / "metadata" / "metadata.sqlite"
    blocker.mkdir(parents=True)  # a directory where the database file should be: it cannot be opened
    proc = await in_process_proxy(data_dir=data_dir)
    client = await connect(proc)

    status, _, body = await client.get("/readyz")
    answer = json.loads(body)
    assert (status, answer["status"], answer["checks"]["metadata_store"]) == (200, "degraded", False)
    assert "unable to open" in json.dumps(answer).lower()
    down_at_start = len(proc.events("metadata_store.down"))
    assert 1 <= down_at_start <= 2, proc.events("metadata_store.down")
    await warm(client, release)
    await answers_correctly(client, registry, release)
    # logged once per state change, not per request (the start-up check says it once more, at start)
    assert len(proc.events("metadata_store.down")) == down_at_start

    shutil.rmtree(blocker)
    deadline = time.monotonic() + 20
    while True:
        status, _, body = await client.get("/readyz")
        if json.loads(body)["status"] == "ready":
            break
        assert time.monotonic() < deadline, f"still not ready after the file could be created: {body}"
        await asyncio.sleep(0.2)
    assert proc.events("metadata_store.up")
    status, _, _ = await client.get(f"/mirror/v1/{PROVIDER}/1.1.0.json")
    assert status == 200
    await proc.stop()
    assert (data_dir / "metadata" / "metadata.sqlite").is_file()
    assert quarantined(data_dir) == []
