"""One contract for every archive store: `DiskStore` on disk and `S3Store` in a bucket of a real S3 API server
(moto's server mode over HTTPS, `tests/fakes/s3_server.py`), both through the `proxy.storage.ArchiveStore`
interface only.

A backend is one entry in `BACKENDS`: how to open its stores over one shared location (what several
processes sharing a volume or a bucket see), how to list the temp leftovers there, and what it holds.
The contract: content appears at its address only whole (atomic publish), publishing the same
content twice is harmless, a crash before publish leaves nothing at the address, temp leftovers
of dead processes are reaped at the next start while those of live processes are not, and no
address outside SHA-256 hex is ever looked up or written.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from proxy.errors import StoreCorruptionError
from proxy.storage import LOCK_NAME, ArchiveStore, PendingArchive
from tests.fakes.store_holder import StoreHolder, open_store

CHUNK = 64 * 1024
DATA = bytes(range(256)) * 4 * 1024 * 3  # 3 MiB: many chunks
SHA = hashlib.sha256(DATA).hexdigest()


@dataclass
class Backend:
    """How a test sees one backend: its opener ("module:callable", called with the local root, in this
    process or in a child), where its temp leftovers are, and everything it holds."""

    opener: str
    leftovers: Callable[[Stores], list[Any]]  # temp artefacts: unpublished downloads, unfinished uploads
    snapshot: Callable[[Stores], list[Any]]  # everything the backend holds, local and remote
    replace: Callable[[Stores, str, bytes], None]  # put other bytes at an address behind the store's back


@dataclass
class Stores:
    """Stores of one backend over one shared location; each `open()` is another process's view."""

    root: Path
    backend: Backend
    s3: Any = None  # the S3 server and the test's bucket
    bucket: str = ""
    opened: list[ArchiveStore] = field(default_factory=list)

    @property
    def opener(self) -> str:
        return self.backend.opener

    async def open(self) -> ArchiveStore:
        store = await open_store(self.opener, self.root)
        self.opened.append(store)
        return store

    def holder(self, size: int = 1024) -> StoreHolder:
        """Another process that opened the store and left an unpublished download in it."""
        return StoreHolder(self.opener, self.root, size)

    def temp_leftovers(self) -> list[Any]:
        return self.backend.leftovers(self)


def disk_leftovers(stores: Stores) -> list[Path]:
    root = stores.root
    return sorted(p for p in (root / "tmp").rglob("*") if p.is_file() and p.name != LOCK_NAME)


def s3_leftovers(stores: Stores) -> list[Any]:
    uploads = stores.s3.client.list_multipart_uploads(Bucket=stores.bucket).get("Uploads", [])
    return disk_leftovers(stores) + [f"upload:{u['Key']}" for u in uploads]


def disk_snapshot(stores: Stores) -> list[Any]:
    return sorted(stores.root.rglob("*"))


def s3_snapshot(stores: Stores) -> list[Any]:
    return [*disk_snapshot(stores), *stores.s3.keys(stores.bucket), *s3_leftovers(stores)]


def disk_replace(stores: Stores, sha256: str, data: bytes) -> None:
    path = stores.root / "sha256" / sha256[:2] / sha256[2:4] / sha256
    path.with_name("replacement").write_bytes(data)
    path.with_name("replacement").replace(path)


def s3_replace(stores: Stores, sha256: str, data: bytes) -> None:
    stores.s3.client.put_object(Bucket=stores.bucket, Key=f"archives/{sha256}", Body=data)


BACKENDS = {
    "disk": Backend("proxy.storage.disk:DiskStore", disk_leftovers, disk_snapshot, disk_replace),
    "s3": Backend("tests.fakes.s3_server:test_store", s3_leftovers, s3_snapshot, s3_replace),
}


@pytest.fixture(params=sorted(BACKENDS))
async def store_factory(request, tmp_path) -> AsyncIterator[Stores]:
    stores = Stores(tmp_path / "store", BACKENDS[request.param])
    if request.param == "s3":
        stores.s3, stores.bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket")
    yield stores
    for store in stores.opened:
        await store.close()


async def read(store: ArchiveStore, sha256: str) -> bytes | None:
    """The whole content at an address as the store hands it out (its file, or a download of the object)."""
    async with store.local_copy(sha256) as path:
        return None if path is None else path.read_bytes()


async def write_pending(
    store: ArchiveStore, data: bytes = DATA, after_chunk: Callable[[], Any] | None = None
) -> PendingArchive:
    pending = store.begin()
    for offset in range(0, len(data), CHUNK):
        pending.write(data[offset : offset + CHUNK])
        if after_chunk is not None:
            await after_chunk()
    return pending


# ---- publish ----------------------------------------------------------------------------------


async def test_lookup_of_absent_content_is_none(store_factory):
    assert await (await store_factory.open()).get(SHA) is None


async def test_content_is_at_its_address_only_once_published(store_factory):
    store = await store_factory.open()
    seen: list[object] = []

    async def look() -> None:
        seen.append(await store.get(SHA))

    pending = await write_pending(store, after_chunk=look)
    assert pending.finish() == SHA and pending.size == len(DATA)
    assert await store.get(SHA) is None
    stored = await store.publish(pending, SHA)
    assert seen == [None] * len(seen) and len(seen) == len(DATA) // CHUNK
    assert (stored.sha256, stored.size) == (SHA, len(DATA))
    assert await store.get(SHA) == stored and await read(store, SHA) == DATA
    assert store_factory.temp_leftovers() == []


async def test_a_reader_never_sees_a_partial_file(store_factory):
    """A reader polling the address while the content is written and published sees nothing, then all."""
    store, reader_view = await store_factory.open(), await store_factory.open()
    published, observed = asyncio.Event(), []

    async def poll() -> None:
        while True:
            seen = await read(reader_view, SHA)
            observed.append(seen if seen is None else hashlib.sha256(seen).hexdigest())
            if published.is_set() and seen is not None:
                return

    reader = asyncio.create_task(poll())
    try:
        pending = await write_pending(store, after_chunk=lambda: asyncio.sleep(0))
        await asyncio.to_thread(pending.finish)
        await store.publish(pending, SHA)
        published.set()
        await asyncio.wait_for(reader, 30)
    finally:
        reader.cancel()
    assert observed[-1] == SHA
    assert set(observed) <= {None, SHA}


async def test_concurrent_publishes_of_the_same_content_are_fine(store_factory):
    stores = [await store_factory.open() for _ in range(4)]
    pendings = [await write_pending(store) for store in stores]
    assert {pending.finish() for pending in pendings} == {SHA}
    first = await stores[0].publish(pendings[0], SHA)
    earlier_reader = await stores[0].open_reader(first, 0, first.size)  # a client already reading the first copy
    try:
        results = await asyncio.gather(
            *(store.publish(pending, SHA) for store, pending in zip(stores[1:], pendings[1:], strict=True))
        )
        assert b"".join([chunk async for chunk in earlier_reader.chunks(CHUNK)]) == DATA
    finally:
        earlier_reader.close()
    assert [(r.sha256, r.size) for r in results] == [(SHA, len(DATA))] * (len(stores) - 1)
    assert [await read(store, SHA) for store in stores] == [DATA] * len(stores)
    assert store_factory.temp_leftovers() == []


async def test_discarded_download_leaves_nothing(store_factory):
    store = await store_factory.open()
    (await write_pending(store)).discard()
    assert await store.get(SHA) is None
    assert store_factory.temp_leftovers() == []


async def test_published_content_outlives_its_store(store_factory):
    store = await store_factory.open()
    pending = await write_pending(store)
    pending.finish()
    await store.publish(pending, SHA)
    await store.close()
    store_factory.opened.remove(store)
    assert await read(await store_factory.open(), SHA) == DATA


# ---- checking copies ---------------------------------------------------------------------------

WRONG = bytes(len(DATA))  # the size of DATA, other bytes


async def published(store: ArchiveStore) -> None:
    pending = await write_pending(store)
    await store.publish(pending, pending.finish())


async def test_check_hashes_the_copy_at_the_address(store_factory):
    store = await store_factory.open()
    assert await store.check(SHA) is None
    await published(store)
    progress: list[int] = []
    good = await store.check(SHA, progress.append)
    assert good is not None and good.intact and good.actual == SHA and sum(progress) == len(DATA)
    assert good.stored == await store.get(SHA)
    store_factory.backend.replace(store_factory, SHA, WRONG)
    bad = await store.check(SHA)
    assert bad is not None and not bad.intact and bad.actual == hashlib.sha256(WRONG).hexdigest()
    assert bad.stored.version != good.stored.version and bad.stored.size == len(WRONG)


async def test_quarantine_moves_only_the_copy_named(store_factory):
    store = await store_factory.open()
    await published(store)
    first = await store.get(SHA)
    store_factory.backend.replace(store_factory, SHA, WRONG)
    assert await store.quarantine(SHA, first.version) is None  # another copy is there now: it stays
    wrong = await store.get(SHA)
    assert wrong is not None and wrong.version != first.version
    moved = await store.quarantine(SHA, wrong.version)
    assert moved is not None and SHA in moved
    assert await store.get(SHA) is None
    assert [(item.name, item.size) for item in await store.quarantined()] == [(moved, len(WRONG))]
    assert await store.quarantine(SHA) is None  # gone already


async def test_a_reader_reads_the_copy_looked_up_or_nothing(store_factory):
    store = await store_factory.open()
    await published(store)
    stored = await store.get(SHA)
    reader = await store.open_reader(stored, 100, 1000)
    try:
        assert (reader.size, reader.version) == (stored.size, stored.version)
        assert b"".join([chunk async for chunk in reader.chunks(300)]) == DATA[100:1100]
    finally:
        reader.close()
    store_factory.backend.replace(store_factory, SHA, WRONG)
    with pytest.raises(StoreCorruptionError):
        await store.open_reader(stored, 0, stored.size)  # replaced since its lookup: looked up again
    await store.remove(SHA)
    with pytest.raises(StoreCorruptionError):
        await store.open_reader(stored, 0, stored.size)  # gone since its lookup


# ---- crashes and temp reaping ------------------------------------------------------------------


@pytest.mark.process
async def test_a_crash_before_publish_leaves_nothing_at_the_address(store_factory):
    with store_factory.holder(len(DATA)) as crashed:
        crashed.kill()
    store = await store_factory.open()
    assert await store.get(hashlib.sha256(b"\x00" * len(DATA)).hexdigest()) is None
    assert await store.get(SHA) is None


@pytest.mark.process
async def test_leftovers_of_a_dead_process_are_reaped_at_start(store_factory):
    with store_factory.holder() as crashed:
        crashed.kill()
    assert crashed.part in store_factory.temp_leftovers()  # a crash cleans nothing up
    await store_factory.open()
    assert store_factory.temp_leftovers() == []


@pytest.mark.process
async def test_downloads_of_a_live_process_are_not_reaped(store_factory):
    with store_factory.holder() as alive:
        await store_factory.open()
        assert store_factory.temp_leftovers() == [alive.part]
        alive.kill()
        await store_factory.open()
        assert store_factory.temp_leftovers() == []


@pytest.mark.process
async def test_a_clean_exit_leaves_no_temp_files(store_factory):
    with store_factory.holder() as holder:
        holder.exit()
    assert store_factory.temp_leftovers() == []


# ---- path safety -------------------------------------------------------------------------------

HOSTILE_ADDRESSES = [
    "",
    "../../../../etc/passwd",
    "/etc/passwd",
    SHA.upper(),
    SHA[:-1],
    SHA + "0",
    SHA + "\n",
    SHA[:62] + "/.",
    "../" + SHA[3:],
    SHA[:32] + "\x00" + SHA[33:],
    "g" * 64,
]


# One store (and, on S3, one bucket) for every hostile address: each address a subtest of its own.
async def test_only_sha256_hex_addresses_are_looked_up(store_factory, subtests):
    store = await store_factory.open()
    for address in HOSTILE_ADDRESSES:
        with subtests.test(address=address), pytest.raises(ValueError):
            await store.get(address)


async def test_only_sha256_hex_addresses_are_published_to(store_factory, subtests):
    store = await store_factory.open()
    for address in HOSTILE_ADDRESSES:
        with subtests.test(address=address):
            pending = await write_pending(store, b"evil")
            pending.finish()
            before = store_factory.backend.snapshot(store_factory)
            with pytest.raises(ValueError):
                await store.publish(pending, address)
            assert store_factory.backend.snapshot(store_factory) == before


async def test_list_objects_names_every_published_object_with_its_size(store_factory):
    store = await store_factory.open()
    small = b"small archive"
    for data in (DATA, small):
        pending = await write_pending(store, data)
        await store.publish(pending, pending.finish())
    pending = await write_pending(store, b"never published")  # a download under way is not an object
    listed = {info.sha256: info for info in await store.list_objects()}
    assert {sha: info.size for sha, info in listed.items()} == {
        SHA: len(DATA),
        hashlib.sha256(small).hexdigest(): len(small),
    }
    assert all(info.modified > 0 for info in listed.values())
    pending.discard()


async def test_remove_frees_the_object_and_says_how_many_bytes(store_factory):
    store = await store_factory.open()
    pending = await write_pending(store)
    await store.publish(pending, pending.finish())
    other = await store_factory.open()  # another process's view sees the removal too
    assert await other.remove(SHA) == len(DATA)
    assert await read(store, SHA) is None
    assert [info.sha256 for info in await store.list_objects()] == []
    assert await store.remove(SHA) == 0  # absent: nothing freed, no error
    with pytest.raises(ValueError):
        await store.remove("../../etc/passwd")
