"""`registry-proxy gc` against a data dir a real proxy filled, with the embedded store and Redis, beside the
temp dirs of other processes (a killed one, a live one).

The store holds: a live archive (its record written by the proxy), an old orphan, an orphan served a
minute ago (within the grace), an orphan stored a moment ago (its record may be on its way), the temp
leftover of a killed process, the download of a live process, an old and a fresh quarantined file,
and an expired remembered 404 (in the persistent store, as older versions wrote them; and with
Redis, in the fleet's negative bookkeeping).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import sqlite3
import time

import pytest

from proxy.metadata_store import CacheEntry
from proxy.metadata_store.factory import open_metadata
from proxy.metadata_store.redis import RedisNegatives, RedisStore
from proxy.storage import ArchiveStore
from proxy.storage.disk import DiskStore
from tests.conftest import REGISTRY_HOST, serve_proxy
from tests.fakes.process import registry_proxy_in_process
from tests.fakes.store_holder import StoreHolder

LONG_AGO = 3 * 86400
PROVIDER = f"{REGISTRY_HOST}/acme/foo"
ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
GONE_KEY = f"versions:{REGISTRY_HOST}/acme/gone"


async def publish(store: ArchiveStore, data: bytes, modified: float) -> str:
    pending = store.begin()
    pending.write(data)
    sha = pending.finish()
    await store.publish(pending, sha)
    os.utime(store.path_for(sha), (modified, modified))
    return sha


async def gc(settings, *extra: str) -> tuple[int, str]:
    """`registry-proxy gc` on the settings' data dir (and Redis), through the CLI's `main` in this process:
    the temp dirs it judges are other processes' (their flocks, not their PIDs, tell whether they live)."""
    args = ["gc", "--data-dir", str(settings.data_dir), *extra]
    if settings.metadata.redis_url:
        args += [
            "--redis-url",
            settings.metadata.redis_url,
            "--redis-prefix",
            settings.metadata.redis_prefix,
            "--metadata-secret",
            settings.metadata.metadata_secret,
        ]
    return await registry_proxy_in_process(*args)


def lines_of(output: str, kind: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if len(line.split()) >= 4 and line.split()[-3] == kind]


@pytest.mark.process
async def test_gc_dry_run_then_for_real(make_settings, client_ssl, registry, tmp_path):
    settings = make_settings()
    async with serve_proxy(settings, client_ssl) as proxy:
        status, _, body = await proxy.get(ARCHIVE)
        assert status == 200
    live = hashlib.sha256(body).hexdigest()

    now = time.time()
    store = DiskStore(settings.archive_dir)
    await store.open()
    os.utime(store.path_for(live), (now - LONG_AGO, now - LONG_AGO))  # referenced: kept however old
    orphan = await publish(store, b"an orphan" * 1000, now - LONG_AGO)
    served_orphan = await publish(store, b"an orphan served a minute ago", now - LONG_AGO)
    fresh_orphan = await publish(store, b"an orphan stored a moment ago", now - 5)
    await store.close()
    quarantine = settings.archive_dir / "quarantine"
    quarantine.mkdir()
    old_quarantined = quarantine / f"{'1' * 64}-20200101T000000Z-abcdef"
    old_quarantined.write_bytes(b"x" * 777)
    new_quarantined = quarantine / f"{'2' * 64}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-abcdef"
    new_quarantined.write_bytes(b"y" * 10)

    metadata, _, times = await open_metadata(settings)
    await times.note_served({served_orphan: now - 60, orphan: now - LONG_AGO})
    expired = CacheEntry(404, b"", f"{registry.url}/v1/providers/acme/gone/versions", now - 7200)
    await metadata.set(GONE_KEY, expired.encode())  # as versions before the negative bound wrote them
    if settings.metadata.redis_url:
        redis = RedisStore(settings.metadata.redis_url, prefix=settings.metadata.redis_prefix)
        old_clock = RedisNegatives(redis, metadata.seal, 100, 1 << 20, 3600.0, clock=lambda: now - 7200)
        await old_clock.put("versions:registry.example.test/acme/forgotten", expired.encode())
        await redis.close()
    await metadata.close()

    with (
        StoreHolder("proxy.storage.disk:DiskStore", settings.archive_dir, 4096) as dead,
        StoreHolder("proxy.storage.disk:DiskStore", settings.archive_dir, 2048) as alive,
    ):
        dead.kill()
        dead_dir = dead.part.parent

        code, dry = await gc(settings, "--dry-run")
        assert code == 0, dry
        assert [line[-1] for line in lines_of(dry, "archive")] == [orphan]
        assert [line[-1] for line in lines_of(dry, "temp")] == [str(dead_dir)]
        assert [int(line[-2]) for line in lines_of(dry, "temp")] == [4096]
        assert [line[-1] for line in lines_of(dry, "quarantine")] == [str(old_quarantined)]
        assert GONE_KEY in [line[-1] for line in lines_of(dry, "old-negative")]
        if settings.metadata.redis_url:
            assert [line[-1] for line in lines_of(dry, "negative")] == ["versions:registry.example.test/acme/forgotten"]
        total = sum(int(line.split()[-2]) for line in dry.splitlines()[:-1] if line.startswith("would remove"))
        assert total >= 9000 + 4096 + 777
        assert f"{total} bytes would be freed" in dry.splitlines()[-1]
        assert "1 referenced archive(s) kept, 2 unreferenced archive(s) kept as used within the grace" in dry
        # a dry run removes nothing
        assert all(store.path_for(sha).exists() for sha in (live, orphan, served_orphan, fresh_orphan))
        assert dead_dir.exists() and old_quarantined.exists()

        code, real = await gc(settings)
        assert code == 0, real
        assert [line[-1] for line in lines_of(real, "archive")] == [orphan]
        assert real.splitlines()[-1].startswith("gc: ")
        assert not store.path_for(orphan).exists()
        assert all(store.path_for(sha).exists() for sha in (live, served_orphan, fresh_orphan))
        assert not dead_dir.exists()
        assert alive.part.exists()  # a live process's download is never touched
        assert not old_quarantined.exists() and new_quarantined.exists()

    await check_after_gc(settings, client_ssl, registry, orphan, body)


async def check_after_gc(settings, client_ssl, registry, orphan: str, body: bytes, *extra: str) -> None:
    """After gc: the expired 404 and the orphan's served time are gone, the live archive is served from the
    store (no second upstream fetch), and another gc finds nothing."""
    metadata, _, times = await open_metadata(settings)
    try:
        assert await metadata.get(GONE_KEY) is None
        assert orphan not in await times.served_times()
    finally:
        await metadata.close()

    path = "/files/acme/foo/1.0.0/terraform-provider-foo_1.0.0_linux_amd64.zip"
    async with serve_proxy(settings, client_ssl) as proxy:
        status, _, again = await proxy.get(ARCHIVE)
    assert status == 200 and again == body
    assert registry.count(path) == 1

    code, second = await gc(settings, *extra, "--dry-run")
    assert code == 0 and lines_of(second, "archive") == [] and "0 item(s), 0 bytes" in second, second


async def test_gc_removes_no_archive_while_a_record_cannot_be_read(make_local_settings, client_ssl, registry):
    """A wrong secret (or a forged record) must not make every archive look orphaned."""
    settings = make_local_settings()
    async with serve_proxy(settings, client_ssl) as proxy:
        status, _, body = await proxy.get(ARCHIVE)
        assert status == 200
    live = hashlib.sha256(body).hexdigest()
    store = DiskStore(settings.archive_dir)
    os.utime(store.path_for(live), (time.time() - LONG_AGO,) * 2)
    secret = settings.data_dir / "metadata" / "metadata.secret"
    own = secret.read_text()
    secret.write_text("another-secret-0123456789abcdef\n")  # as if gc ran with the wrong --metadata-secret
    code, out = await gc(settings)
    assert (code, out.strip()) == (
        2,
        f"registry-proxy: error: --metadata-secret differs from the one that sealed "
        f"{settings.data_dir / 'metadata' / 'metadata.sqlite'}",
    )
    assert store.path_for(live).exists()

    secret.write_text(own)
    with contextlib.closing(sqlite3.connect(settings.data_dir / "metadata" / "metadata.sqlite")) as db, db:
        assert db.execute("UPDATE metadata SET value = ? WHERE key LIKE 'archive:%'", (b"forged",)).rowcount == 1
    code, out = await gc(settings)
    assert code == 0, out
    assert lines_of(out, "archive") == []
    assert "unreadable record" in out
    assert store.path_for(live).exists()
    # progress on stderr, not a terminal: plain lines and a summary, before the report (on stdout, its last line)
    progress = [line for line in out.splitlines() if line.startswith("gc: ") and "item(s)" not in line]
    assert progress[:2] == [
        "gc: reading the archive and module records",
        "gc: 1 archives stored, 0 of them referenced by a record",
    ]
    assert re.fullmatch(r"gc: done: \d+ items, \d+ bytes in \d+\.\ds", progress[-1]), out
    assert out.splitlines()[-1].startswith("gc: ") and "item(s)" in out.splitlines()[-1]
    code, quiet = await gc(settings, "--quiet")
    assert code == 0 and quiet.splitlines()[-2:] == out.splitlines()[-2:], quiet  # the same report
    assert not [line for line in quiet.splitlines() if line.startswith("gc: ") and "item(s)" not in line]


async def test_gc_stops_when_the_metadata_store_cannot_be_read(make_local_settings, tmp_path, refused_port):
    """Redis down: nothing is known to be unreferenced, so nothing is removed."""
    settings = make_local_settings(redis_url=f"redis://127.0.0.1:{refused_port}/0", metadata_secret="s" * 32)
    store = DiskStore(settings.archive_dir)
    await store.open()
    orphan = await publish(store, b"an orphan", time.time() - LONG_AGO)
    await store.close()
    code, out = await gc(settings)
    assert code == 1 and "the metadata store could not be read" in out, out
    assert store.path_for(orphan).exists()


async def test_purge_shows_its_progress_and_a_summary(make_local_settings, client_ssl, monkeypatch):
    """`registry-proxy purge` where stderr is no terminal: a line per phase, the records counted, a summary; the
    result on stdout as before."""
    from proxy.commands import run
    from proxy.governance.catalog import Catalog

    monkeypatch.setattr(run, "Catalog", functools.partial(Catalog, settle=0.0))  # no other process to wait for
    settings = make_local_settings()
    async with serve_proxy(settings, client_ssl) as proxy:
        status, _, body = await proxy.get(ARCHIVE)
        assert status == 200
    code, out = await registry_proxy_in_process("purge", f"{PROVIDER}@1.0.0", "--data-dir", str(settings.data_dir))
    assert code == 0, out
    lines = [line for line in out.splitlines() if line.startswith(("purge: ", "purged "))]
    records = int(lines[0].split()[2])
    assert lines[0] == f"purge: removing {records} records of {PROVIDER}@1.0.0" and records >= 3
    assert lines[1 : records + 1] == [f"purge: {n}/{records} records" for n in range(1, records + 1)]
    assert lines[records + 1 : -2] == [
        "purge: removing 1 archives unless another record refers to them",
        "purge: waiting 0s for every process to see the purge",
    ]
    assert re.fullmatch(rf"purge: done: {records} records, {len(body)} bytes in \d+\.\ds", lines[-2]), out
    assert lines[-1].startswith(f"purged {PROVIDER}@1.0.0: {records} records, 1 archives removed ({len(body)} bytes)")
