"""DiskStore: which temp dirs are abandoned, quarantine, and which copy a lookup saw (its version)."""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

import pytest

from proxy.runtime.metrics import Metrics
from proxy.storage import LOCK_NAME, ArchiveGuard
from proxy.storage.disk import DiskStore

HOST = socket.gethostname()
DAY = 86400


def make_dir(root: Path, name: str, *, lock: bool = True, age: float = 0) -> Path:
    folder = root / "tmp" / name
    folder.mkdir(parents=True)
    (folder / "x.part").write_bytes(b"partial")
    if lock:
        (folder / LOCK_NAME).touch()
    if age:
        os.utime(folder, (time.time() - age, time.time() - age))
    return folder


@pytest.mark.parametrize(
    ("name", "lock", "held", "age", "reaped"),
    [
        (f"{HOST}-1-aaaaaaaa", True, False, 0, True),  # this host, nobody holds it: dead, whatever its PID
        (f"{HOST}-1-aaaaaaaa", True, True, 2 * DAY, False),  # held: alive, however old
        ("otherhost-7-aaaaaaaa", True, False, 0, False),  # another host's lock may be invisible here: wait a day
        ("otherhost-7-aaaaaaaa", True, False, 2 * DAY, True),
        ("otherhost-7-aaaaaaaa", True, True, 2 * DAY, False),
        (f"{HOST}-1-aaaaaaaa", False, False, 0, False),  # no lock file: an older version's, or being created now
        (f"{HOST}-1-aaaaaaaa", False, False, 2 * DAY, True),
    ],
)
async def test_temp_dirs_are_reaped_by_lock_not_by_pid(tmp_path, name, lock, held, age, reaped):
    folder = make_dir(tmp_path, name, lock=lock, age=age)
    holder = open(folder / LOCK_NAME) if held else None  # noqa: SIM115, ASYNC230 - closed below
    if holder is not None:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    store = DiskStore(tmp_path)
    try:
        await store.open()
        assert folder.exists() is not reaped
        own = [p for p in store.temp_dirs() if p != folder]
        assert own == [store.temp_dir]
    finally:
        await store.close()
        if holder is not None:
            holder.close()
    assert not store.temp_dir.exists()


async def test_own_temp_dir_is_locked_and_recreated_with_its_lock_if_lost(tmp_path):
    store = DiskStore(tmp_path)
    await store.open()
    try:
        other = DiskStore(tmp_path)
        assert store.temp_dir not in other.abandoned_temp_dirs()
        os.rename(store.temp_dir, tmp_path / "elsewhere")  # reaped by someone else
        path = store.temp_path()
        assert path.parent == store.temp_dir and (store.temp_dir / LOCK_NAME).exists()
        assert store.temp_dir not in other.abandoned_temp_dirs()
    finally:
        await store.close()


async def _publish(store: DiskStore, data: bytes) -> str:
    import hashlib

    sha = hashlib.sha256(data).hexdigest()
    path = store.temp_path()
    path.write_bytes(data)
    await store.publish_path(path, sha)
    return sha


async def test_a_file_changed_in_place_is_another_copy_and_is_trusted_no_more(tmp_path):
    store = DiskStore(tmp_path)
    await store.open()
    try:
        sha = await _publish(store, b"archive bytes")
        guard = ArchiveGuard(store, Metrics())
        await guard.verify(await store.get(sha))  # hashed whole, found intact
        stored = await store.get(sha)
        assert guard.trusted(stored)
        before = stored.path.stat()
        stored.path.write_bytes(b"archive bytez")
        os.utime(stored.path, ns=(before.st_atime_ns, before.st_mtime_ns))  # ctime still moves
        changed = await store.get(sha)
        assert changed.version != stored.version and not guard.trusted(changed)
        check = await store.check(sha)
        assert check is not None and not check.intact and check.stored.version == changed.version
        moved = await store.quarantine(sha, check.stored.version)
        assert moved is not None and Path(moved).parent == tmp_path / "quarantine" and Path(moved).name.startswith(sha)
        assert await store.get(sha) is None and await store.check(sha) is None
    finally:
        await store.close()


async def test_quarantine_never_moves_a_fresh_copy(tmp_path):
    store = DiskStore(tmp_path)
    await store.open()
    try:
        sha = await _publish(store, b"good")
        stale = (await store.check(sha)).stored.version
        await _publish(store, b"good")  # replaced meanwhile by a fresh, verified copy (a new inode)
        assert await store.quarantine(sha, stale) is None
        assert await store.get(sha) is not None
    finally:
        await store.close()
