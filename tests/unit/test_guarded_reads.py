"""ArchiveGuard's reader over the disk store: every whole read is hashed and its last chunk held back until it
matched; a range of a copy found intact is not hashed; chunks come from the page cache in the event loop."""

from __future__ import annotations

import asyncio
import hashlib
import os
from types import SimpleNamespace

import blake3
import pytest

from proxy.errors import StoreCorruptionError
from proxy.runtime.metrics import Metrics
from proxy.storage import ArchiveGuard, StoredArchive, disk, guard
from proxy.storage.disk import DiskStore

DATA = os.urandom(5 * 100_000 + 17)  # several chunks and a short last one
CHUNK = 100_000


@pytest.fixture
async def store(tmp_path):
    store = DiskStore(tmp_path)
    await store.open()
    yield store
    await store.close()


@pytest.fixture
def hashes(monkeypatch) -> list[str]:
    """The digests the reader starts, by kind ("sha256", "blake3")."""
    started: list[str] = []

    def sha256():
        started.append("sha256")
        return hashlib.sha256()

    def fingerprint():
        started.append("blake3")
        return blake3.blake3()

    monkeypatch.setattr(guard, "hashlib", SimpleNamespace(sha256=sha256))
    monkeypatch.setattr(guard, "blake3", fingerprint)
    return started


async def publish(store: DiskStore, data: bytes = DATA) -> StoredArchive:
    path = store.temp_path()
    path.write_bytes(data)
    return await store.publish_path(path, hashlib.sha256(data).hexdigest())


def flip_byte(stored: StoredArchive, offset: int) -> None:
    with open(stored.path, "r+b") as handle:
        handle.seek(offset)
        handle.write(bytes([DATA[offset] ^ 1]))


async def read(guard: ArchiveGuard, stored: StoredArchive, start: int = 0, length: int | None = None) -> bytes:
    reader = await guard.open(stored, start, stored.size - start if length is None else length)
    try:
        return b"".join([bytes(chunk) async for chunk in reader.chunks(CHUNK)])
    finally:
        reader.close()


async def test_every_whole_read_is_hashed_even_of_a_file_found_intact_before(store, hashes):
    stored = await publish(store)
    guard = ArchiveGuard(store, Metrics())
    assert await read(guard, stored) == DATA
    assert hashes == ["sha256", "blake3"]  # the SHA-256, and the content's fingerprint on the way
    assert await read(guard, stored) == DATA
    assert await read(guard, stored) == DATA
    assert hashes == ["sha256", "blake3", "blake3", "blake3"]  # then the fingerprint alone, every time


async def test_a_file_changed_after_its_fingerprint_was_taken_is_caught_by_it(store):
    stored = await publish(store)
    guard = ArchiveGuard(store, Metrics())
    assert await read(guard, stored) == DATA  # SHA-256 checked, fingerprint taken
    flip_byte(stored, len(DATA) // 2)
    with pytest.raises(StoreCorruptionError):
        await read(guard, await store.get(stored.sha256))
    assert not stored.path.exists()  # quarantined


async def test_a_range_of_a_file_found_intact_is_read_without_hashing(store, hashes):
    stored = await publish(store)
    guard = ArchiveGuard(store, Metrics())
    await guard.verify(stored)  # what the server does before a range: the whole file hashed once (the store's check)
    assert await read(guard, stored, 1000, 300_000) == DATA[1000:301_000]
    assert hashes == []


async def test_a_file_changed_in_place_while_it_is_read_raises_before_its_last_chunk(store):
    stored = await publish(store)
    reader = await ArchiveGuard(store, Metrics()).open(stored, 0, stored.size)
    received = bytearray()
    with pytest.raises(StoreCorruptionError):
        async for chunk in reader.chunks(CHUNK):
            if not received:
                flip_byte(stored, len(DATA) - 5)  # after the first chunk went out, in the last one
            received += chunk
    reader.close()
    assert received == DATA[: len(received)] and len(received) < len(DATA)
    assert not stored.path.exists()  # quarantined


async def test_a_changed_file_with_a_flipped_byte_raises_before_its_last_chunk(store):
    stored = await publish(store)
    flip_byte(stored, 10)
    reader = await ArchiveGuard(store, Metrics()).open(stored, 0, stored.size)
    received = bytearray()
    with pytest.raises(StoreCorruptionError):
        async for chunk in reader.chunks(CHUNK):
            received += chunk
    reader.close()
    assert len(received) < len(DATA)
    assert not stored.path.exists()  # quarantined


async def test_chunks_missing_from_the_page_cache_are_read_in_a_thread(store, monkeypatch):
    stored = await publish(store)
    monkeypatch.setattr(disk, "_read_cached", lambda *_: None)
    guard = ArchiveGuard(store, Metrics())
    assert await read(guard, stored) == DATA
    assert await read(guard, stored, 123_456, 200_000) == DATA[123_456:323_456]


async def test_a_trusted_file_that_shrank_while_open_raises(store):
    stored = await publish(store)
    reader = await ArchiveGuard(store, Metrics()).open(stored, 0, stored.size)
    os.truncate(stored.path, 250_000)
    with pytest.raises(StoreCorruptionError):
        async for _ in reader.chunks(CHUNK):
            pass
    reader.close()


async def test_the_event_loop_runs_once_per_fair_share_of_chunks_read_from_the_page_cache(store, monkeypatch):
    monkeypatch.setattr(disk, "FAIR_SHARE", 2 * CHUNK)
    stored = await publish(store)
    reader = await ArchiveGuard(store, Metrics()).open(stored, 0, stored.size)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    try:
        before, last, chunks, unshared = ticks, ticks, 0, 0
        async for chunk in reader.chunks(CHUNK):
            chunks += 1
            unshared = 0 if ticks != last else unshared + len(chunk)  # read since the ticker last ran
            last = ticks
            assert unshared < disk.FAIR_SHARE
        assert 0 < ticks - before < chunks - 1  # not a turn of the loop after every chunk
    finally:
        task.cancel()
        reader.close()


@pytest.fixture
def read_buffers(monkeypatch) -> list[disk.ReadBuffer]:
    """The read buffers the disk store's readers make."""
    made: list[disk.ReadBuffer] = []

    class Recorded(disk.ReadBuffer):
        def __init__(self, size: int) -> None:
            super().__init__(size)
            made.append(self)

    monkeypatch.setattr(disk, "ReadBuffer", Recorded)
    return made


@pytest.mark.parametrize("cached", [True, False], ids=["page-cache", "thread"])
async def test_a_whole_read_whose_chunks_are_dropped_reuses_one_buffer(store, read_buffers, monkeypatch, cached):
    if not cached:
        monkeypatch.setattr(disk, "_read_cached", lambda *_: None)
    stored = await publish(store)
    reader = await ArchiveGuard(store, Metrics()).open(stored, 0, stored.size)
    digest = hashlib.sha256()
    try:
        async for chunk in reader.chunks(CHUNK):
            digest.update(chunk)
            del chunk  # as the server's copy loop does
    finally:
        reader.close()
    assert digest.hexdigest() == stored.sha256
    assert [buffers.allocations for buffers in read_buffers] == [1]


async def test_chunks_kept_by_the_caller_keep_their_bytes(store, read_buffers):
    stored = await publish(store)
    reader = await ArchiveGuard(store, Metrics()).open(stored, 0, stored.size)
    try:
        kept = [chunk async for chunk in reader.chunks(CHUNK)]  # as a transport that could not send them would
    finally:
        reader.close()
    assert b"".join(kept) == DATA
    assert read_buffers[0].allocations == len(kept)  # a new buffer for every chunk still held


@pytest.fixture
def sha256_bytes(monkeypatch) -> list[int]:
    """The sizes of the chunks the reader feeds to SHA-256."""
    fed: list[int] = []

    class Counted:
        def __init__(self) -> None:
            self._digest = hashlib.sha256()

        def update(self, chunk) -> None:
            fed.append(len(chunk))
            self._digest.update(chunk)

        def hexdigest(self) -> str:
            return self._digest.hexdigest()

    monkeypatch.setattr(guard, "hashlib", SimpleNamespace(sha256=Counted))
    return fed


async def test_a_first_serve_drops_its_sha256_once_a_concurrent_one_found_the_fingerprint(store, sha256_bytes):
    stored = await publish(store)
    archive_guard = ArchiveGuard(store, Metrics())
    later = await archive_guard.open(stored, 0, stored.size)
    chunks = later.chunks(CHUNK)
    received = bytearray(await anext(chunks))  # started before any fingerprint was known: on SHA-256
    assert await read(archive_guard, stored) == DATA  # another serve, whole: SHA-256 checked, fingerprint taken
    sha256_bytes.clear()
    async for chunk in chunks:
        received += chunk
    later.close()
    assert received == DATA
    assert sha256_bytes == []  # the rest checked against the fingerprint alone


async def test_a_serve_that_dropped_its_sha256_still_catches_a_changed_byte(store):
    stored = await publish(store)
    archive_guard = ArchiveGuard(store, Metrics())
    later = await archive_guard.open(stored, 0, stored.size)
    chunks = later.chunks(CHUNK)
    received = bytearray(await anext(chunks))
    assert await read(archive_guard, stored) == DATA
    flip_byte(stored, len(DATA) - 5)  # in the last chunk, after the fingerprint was taken
    with pytest.raises(StoreCorruptionError):
        async for chunk in chunks:
            received += chunk
    later.close()
    assert len(received) < len(DATA)
    assert not stored.path.exists()  # quarantined
