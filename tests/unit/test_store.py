"""ArchiveStore: which temp dirs are abandoned, quarantine, and the verified-file facts."""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

import pytest

from proxy.store import LOCK_NAME, ArchiveStore

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
def test_temp_dirs_are_reaped_by_lock_not_by_pid(tmp_path, name, lock, held, age, reaped):
    folder = make_dir(tmp_path, name, lock=lock, age=age)
    holder = open(folder / LOCK_NAME) if held else None  # noqa: SIM115 - closed below
    if holder is not None:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    store = ArchiveStore(tmp_path)
    try:
        store.open()
        assert folder.exists() is not reaped
        own = [p for p in store.temp_dirs() if p != folder]
        assert own == [store.temp_dir]
    finally:
        store.close()
        if holder is not None:
            holder.close()
    assert not store.temp_dir.exists()


def test_own_temp_dir_is_locked_and_recreated_with_its_lock_if_lost(tmp_path):
    store = ArchiveStore(tmp_path)
    store.open()
    try:
        other = ArchiveStore(tmp_path)
        assert store.temp_dir not in other.abandoned_temp_dirs()
        os.rename(store.temp_dir, tmp_path / "elsewhere")  # reaped by someone else
        path = store.temp_path()
        assert path.parent == store.temp_dir and (store.temp_dir / LOCK_NAME).exists()
        assert store.temp_dir not in other.abandoned_temp_dirs()
    finally:
        store.close()


def _publish(store: ArchiveStore, data: bytes) -> str:
    import hashlib

    sha = hashlib.sha256(data).hexdigest()
    path = store.temp_path()
    path.write_bytes(data)
    store.publish_path(path, sha)
    return sha


def test_published_file_is_verified_until_it_changes(tmp_path):
    store = ArchiveStore(tmp_path)
    store.open()
    try:
        sha = _publish(store, b"archive bytes")
        stored = store.get(sha)
        assert store.is_verified(stored)
        before = stored.path.stat()
        stored.path.write_bytes(b"archive bytez")
        os.utime(stored.path, ns=(before.st_atime_ns, before.st_mtime_ns))  # ctime still moves
        assert not store.is_verified(store.get(sha))
        check = store.check(sha)
        assert check is not None and not check.intact
        moved = store.quarantine(sha, check.identity)
        assert moved is not None and moved.parent == tmp_path / "quarantine" and moved.name.startswith(sha)
        assert store.get(sha) is None and store.check(sha) is None
    finally:
        store.close()


def test_quarantine_never_moves_a_fresh_copy(tmp_path):
    store = ArchiveStore(tmp_path)
    store.open()
    try:
        sha = _publish(store, b"good")
        stale = store.check(sha).identity
        _publish(store, b"good")  # replaced meanwhile by a fresh, verified copy (a new inode)
        assert store.quarantine(sha, stale) is None
        assert store.get(sha) is not None and store.is_verified(store.get(sha))
    finally:
        store.close()
