"""Unit tests for the free-space floor (`--min-free-space`), DiskSpace and the full-disk store wrapper."""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import structlog

from proxy.cli import build_parser, settings_from_args
from proxy.errors import DiskFullError
from proxy.metadata_store.full_disk import SkipWritesWhenFull
from proxy.settings.config import ConfigError, SpaceFloor, parse_space_floor
from proxy.storage import DiskSpace, is_disk_full

MiB = 2**20


@pytest.mark.parametrize(
    ("text", "floor"),
    [
        ("1GiB", SpaceFloor(2**30)),
        ("0", SpaceFloor(0)),
        ("500MB", SpaceFloor(500 * 10**6)),
        ("5%", SpaceFloor(0, 5.0)),
        (" 2.5% ", SpaceFloor(0, 2.5)),
        ("0%", SpaceFloor(0, 0.0)),
    ],
)
def test_floor_is_a_size_or_a_percentage(text, floor):
    assert parse_space_floor(text) == floor


@pytest.mark.parametrize("text", ["", "abc", "-1", "100%", "150%", "-5%", "nan%", "5 %%", "1GiB%"])
def test_invalid_floor_is_a_clear_config_error(text):
    with pytest.raises(ConfigError, match="a percentage of the disk below 100%"):
        parse_space_floor(text)


def test_floor_in_bytes_of_a_filesystem():
    assert SpaceFloor(2**30).of(10**12) == 2**30
    assert SpaceFloor(0, 5.0).of(1000 * MiB) == 50 * MiB


def test_flag_and_environment(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("REGISTRY_PROXY_MIN_FREE_SPACE", raising=False)
    default = settings_from_args(build_parser().parse_args(["serve", "--data-dir", str(tmp_path)]))
    assert default.archives.min_free_space == SpaceFloor(2**30)
    monkeypatch.setenv("REGISTRY_PROXY_MIN_FREE_SPACE", "7%")
    from_env = settings_from_args(build_parser().parse_args(["serve", "--data-dir", str(tmp_path)]))
    assert from_env.archives.min_free_space == SpaceFloor(0, 7.0)
    flag = settings_from_args(
        build_parser().parse_args(["serve", "--data-dir", str(tmp_path), "--min-free-space", "3MiB"])
    )
    assert flag.archives.min_free_space == SpaceFloor(3 * MiB)
    with pytest.raises(ConfigError, match="--min-free-space"):
        settings_from_args(
            build_parser().parse_args(["serve", "--data-dir", str(tmp_path), "--min-free-space", "lots"])
        )


class FakeDisk:
    """Stands in for os.statvfs: counts calls; `free` and `total` in bytes (4 KiB blocks)."""

    def __init__(self, free: int, total: int) -> None:
        self.free, self.total, self.calls = free, total, 0

    def __call__(self, path) -> SimpleNamespace:
        self.calls += 1
        return SimpleNamespace(f_bavail=self.free // 4096, f_blocks=self.total // 4096, f_frsize=4096)


@pytest.fixture
def disk(monkeypatch) -> FakeDisk:
    fake = FakeDisk(free=100 * MiB, total=1000 * MiB)
    monkeypatch.setattr("proxy.storage.space.os.statvfs", fake)
    return fake


async def test_free_space_is_measured_at_most_once_per_max_age(disk, tmp_path):
    now = [0.0]
    space = DiskSpace(tmp_path, SpaceFloor(10 * MiB), max_age=1.0, clock=lambda: now[0])
    first = await space.report()
    assert (first.free_bytes, first.min_free_bytes, first.ok) == (100 * MiB, 10 * MiB, True)
    disk.free = 5 * MiB
    now[0] = 0.9
    assert (await space.report()).ok and disk.calls == 1  # cached
    now[0] = 1.0
    assert not (await space.report()).ok and disk.calls == 2  # measured again: below the floor
    disk.free = 50 * MiB
    now[0] = 2.5
    assert (await space.report()).ok  # recovers by itself


async def test_percentage_floor_and_room_for_a_known_size(disk, tmp_path):
    space = DiskSpace(tmp_path, SpaceFloor(0, 5.0))  # 50 MiB of 1000
    await space.require_room("x", 50 * MiB)
    with pytest.raises(DiskFullError, match=r"cannot store big\.zip") as caught:
        await space.require_room("big.zip", 51 * MiB)
    assert caught.value.status == 503 and caught.value.code == "disk_full"


async def test_a_failed_write_forces_a_new_measurement(disk, tmp_path):
    now = [0.0]
    space = DiskSpace(tmp_path, SpaceFloor(0), clock=lambda: now[0])
    await space.report()
    error = space.full(OSError(errno.ENOSPC, "No space left on device"), "store x")
    assert isinstance(error, DiskFullError) and "cannot store x" in error.message
    await space.report()
    assert disk.calls == 2


@pytest.mark.parametrize(
    ("exc", "full"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
        (OSError(errno.EACCES, "Permission denied"), False),
        (sqlite3.OperationalError("database or disk is full"), True),
        (sqlite3.OperationalError("database is locked"), False),
        (ValueError("disk is full"), False),
    ],
)
def test_is_disk_full(exc, full):
    assert is_disk_full(exc) is full


class FailingStore:
    """A MetadataStore whose writes (and, optionally, reads) raise `error`."""

    def __init__(self, error: Exception | None, read_error: Exception | None = None) -> None:
        self.error, self.read_error, self.values = error, read_error, {}

    async def get(self, key: str) -> bytes | None:
        if self.read_error:
            raise self.read_error
        return self.values.get(key)

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        return [await self.get(key) for key in keys]

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        if self.error:
            raise self.error
        self.values[key] = value

    async def delete(self, key: str) -> None:
        self.values.pop(key, None)

    async def keys(self, prefix: str = "") -> AsyncIterator[str]:
        for key in self.values:
            yield key

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        pass


async def test_full_disk_writes_are_skipped_and_logged_once_per_spell():
    inner = FailingStore(sqlite3.OperationalError("database or disk is full"))
    store = SkipWritesWhenFull(inner)
    with structlog.testing.capture_logs() as logs:
        await store.set("a", b"1")
        await store.set("b", b"2")
        inner.error = None
        await store.set("c", b"3")
        inner.error = OSError(errno.ENOSPC, "No space left on device")
        await store.set("d", b"4")
    events = [entry["event"] for entry in logs]
    assert events == [
        "storage.metadata_write_skipped",
        "storage.metadata_writes_resumed",
        "storage.metadata_write_skipped",
    ]
    assert inner.values == {"c": b"3"}


async def test_other_store_errors_still_propagate():
    store = SkipWritesWhenFull(FailingStore(sqlite3.OperationalError("database is locked")))
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        await store.set("a", b"1")
    reader = SkipWritesWhenFull(FailingStore(None, read_error=RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        await reader.get("a")


async def test_a_store_that_cannot_even_be_created_reads_as_misses():
    full = sqlite3.OperationalError("database or disk is full")
    store = SkipWritesWhenFull(FailingStore(full, read_error=full))
    assert await store.get("a") is None
    assert await store.get_many(["a", "b"]) == [None, None]
