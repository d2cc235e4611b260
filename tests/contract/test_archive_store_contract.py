"""One contract for every archive store: `proxy.store.ArchiveStore` on disk and `proxy.s3store.S3ArchiveStore`
in a bucket of a real S3 API server (moto's server mode over HTTPS, `tests/fakes/s3_server.py`).

A backend is one entry in `BACKENDS`: how to open its stores over one shared location (what
several processes sharing a volume or a bucket see), how to list the temp leftovers there, and how
to read what is stored.
The contract: content appears at its address only whole (atomic publish), publishing the same
content twice is harmless, a crash before publish leaves nothing at the address, temp leftovers
of dead processes are reaped at the next start while those of live processes are not, and no
address outside SHA-256 hex is ever looked up or written.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from proxy.store import LOCK_NAME, ArchiveStore
from tests.fakes.store_holder import StoreHolder, open_store

CHUNK = 64 * 1024
DATA = bytes(range(256)) * 4 * 1024 * 3  # 3 MiB: many chunks
SHA = hashlib.sha256(DATA).hexdigest()


@dataclass
class Backend:
    """How a test sees one backend: its opener ("module:callable", called with the local root, in this
    process or in a child), where its temp leftovers are, and how to read what is stored."""

    opener: str
    leftovers: Callable[[Stores], list[Any]]  # temp artefacts: unpublished downloads, unfinished uploads
    snapshot: Callable[[Stores], list[Any]]  # everything the backend holds, local and remote
    read: Callable[[Stores, Any, str], bytes | None]  # the whole content at an address, or None
    open_reader: Callable[[Stores, Any], Any]  # a reader of a stored archive, opened now, read later


@dataclass
class Stores:
    """Stores of one backend over one shared location; each `open()` is another process's view."""

    root: Path
    backend: Backend
    s3: Any = None  # the S3 server and the test's bucket
    bucket: str = ""
    opened: list[Any] = field(default_factory=list)

    @property
    def opener(self) -> str:
        return self.backend.opener

    def open(self) -> Any:
        store = open_store(self.opener, self.root)
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


def disk_read(stores: Stores, store: Any, sha256: str) -> bytes | None:
    stored = store.get(sha256)
    return None if stored is None else stored.path.read_bytes()


def s3_read(stores: Stores, store: Any, sha256: str) -> bytes | None:
    copy = stores.root.parent / f"read-{threading.get_ident()}"
    try:
        return None if store.download_to(sha256, copy) is None else copy.read_bytes()
    finally:
        copy.unlink(missing_ok=True)


def disk_reader(stores: Stores, stored: Any) -> Any:
    return stored.path.open("rb")


def s3_reader(stores: Stores, stored: Any) -> Any:
    return contextlib.closing(stores.s3.client.get_object(Bucket=stores.bucket, Key=stored.key)["Body"])


BACKENDS = {
    "disk": Backend("proxy.store:ArchiveStore", disk_leftovers, disk_snapshot, disk_read, disk_reader),
    "s3": Backend("tests.fakes.s3_server:test_store", s3_leftovers, s3_snapshot, s3_read, s3_reader),
}


@pytest.fixture(params=sorted(BACKENDS))
def store_factory(request, tmp_path) -> Iterator[Stores]:
    stores = Stores(tmp_path / "store", BACKENDS[request.param])
    if request.param == "s3":
        stores.s3, stores.bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket")
    yield stores
    for store in stores.opened:
        store.close()


def write_pending(store: ArchiveStore, data: bytes = DATA, after_chunk: Callable[[], None] = lambda: None):
    pending = store.begin()
    for offset in range(0, len(data), CHUNK):
        pending.write(data[offset : offset + CHUNK])
        after_chunk()
    return pending


# ---- publish ----------------------------------------------------------------------------------


def test_lookup_of_absent_content_is_none(store_factory):
    assert store_factory.open().get(SHA) is None


def test_content_is_at_its_address_only_once_published(store_factory):
    store = store_factory.open()
    seen: list[object] = []
    pending = write_pending(store, after_chunk=lambda: seen.append(store.get(SHA)))
    assert pending.finish() == SHA and pending.size == len(DATA)
    assert store.get(SHA) is None
    stored = store.publish(pending, SHA)
    assert seen == [None] * len(seen) and len(seen) == len(DATA) // CHUNK
    assert (stored.sha256, stored.size) == (SHA, len(DATA))
    assert store.get(SHA) == stored and store_factory.backend.read(store_factory, store, SHA) == DATA
    assert store_factory.temp_leftovers() == []


def test_a_reader_never_sees_a_partial_file(store_factory):
    """A reader polling the address while the content is written and published sees nothing, then all."""
    store, reader_view = store_factory.open(), store_factory.open()
    published, observed, stop = threading.Event(), [], threading.Event()

    def poll() -> None:
        while not stop.is_set():
            seen = store_factory.backend.read(store_factory, reader_view, SHA)
            observed.append(seen if seen is None else hashlib.sha256(seen).hexdigest())
            if published.is_set() and seen is not None:
                return

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        pending = write_pending(store)
        pending.finish()
        store.publish(pending, SHA)
        published.set()
        reader.join(30)
    finally:
        stop.set()
        reader.join()
    assert observed[-1] == SHA
    assert set(observed) <= {None, SHA}


def test_concurrent_publishes_of_the_same_content_are_fine(store_factory):
    stores = [store_factory.open() for _ in range(4)]
    pendings = [write_pending(store) for store in stores]
    assert {pending.finish() for pending in pendings} == {SHA}
    first = stores[0].publish(pendings[0], SHA)
    # a client already reading the first copy:
    with store_factory.backend.open_reader(store_factory, first) as earlier_reader:
        start = threading.Barrier(len(stores) - 1)
        results: list[object] = []

        def publish(store: ArchiveStore, pending) -> None:
            start.wait(10)
            results.append(store.publish(pending, SHA))

        threads = [threading.Thread(target=publish, args=pair) for pair in zip(stores[1:], pendings[1:], strict=True)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert earlier_reader.read() == DATA
    assert [(r.sha256, r.size) for r in results] == [(SHA, len(DATA))] * (len(stores) - 1)
    assert all(store_factory.backend.read(store_factory, store, SHA) == DATA for store in stores)
    assert store_factory.temp_leftovers() == []


def test_discarded_download_leaves_nothing(store_factory):
    store = store_factory.open()
    write_pending(store).discard()
    assert store.get(SHA) is None
    assert store_factory.temp_leftovers() == []


def test_published_content_outlives_its_store(store_factory):
    store = store_factory.open()
    pending = write_pending(store)
    pending.finish()
    store.publish(pending, SHA)
    store.close()
    store_factory.opened.remove(store)
    assert store_factory.backend.read(store_factory, store_factory.open(), SHA) == DATA


# ---- crashes and temp reaping ------------------------------------------------------------------


def test_a_crash_before_publish_leaves_nothing_at_the_address(store_factory):
    with store_factory.holder(len(DATA)) as crashed:
        crashed.kill()
    store = store_factory.open()
    assert store.get(hashlib.sha256(b"\x00" * len(DATA)).hexdigest()) is None
    assert store.get(SHA) is None


def test_leftovers_of_a_dead_process_are_reaped_at_start(store_factory):
    with store_factory.holder() as crashed:
        crashed.kill()
    assert crashed.part in store_factory.temp_leftovers()  # a crash cleans nothing up
    store_factory.open()
    assert store_factory.temp_leftovers() == []


def test_downloads_of_a_live_process_are_not_reaped(store_factory):
    with store_factory.holder() as alive:
        store_factory.open()
        assert store_factory.temp_leftovers() == [alive.part]
        alive.kill()
        store_factory.open()
        assert store_factory.temp_leftovers() == []


def test_a_clean_exit_leaves_no_temp_files(store_factory):
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


@pytest.mark.parametrize("address", HOSTILE_ADDRESSES)
def test_only_sha256_hex_addresses_are_looked_up(store_factory, address):
    store = store_factory.open()
    with pytest.raises(ValueError):
        store.get(address)


@pytest.mark.parametrize("address", HOSTILE_ADDRESSES)
def test_only_sha256_hex_addresses_are_published_to(store_factory, address):
    store = store_factory.open()
    pending = write_pending(store, b"evil")
    pending.finish()
    before = store_factory.backend.snapshot(store_factory)
    with pytest.raises(ValueError):
        store.publish(pending, address)
    assert store_factory.backend.snapshot(store_factory) == before


def test_list_objects_names_every_published_object_with_its_size(store_factory):
    store = store_factory.open()
    small = b"small archive"
    for data in (DATA, small):
        pending = write_pending(store, data)
        store.publish(pending, pending.finish())
    pending = write_pending(store, b"never published")  # a download under way is not an object
    listed = {info.sha256: info for info in store.list_objects()}
    assert {sha: info.size for sha, info in listed.items()} == {
        SHA: len(DATA),
        hashlib.sha256(small).hexdigest(): len(small),
    }
    assert all(info.modified > 0 for info in listed.values())
    pending.discard()


def test_remove_frees_the_object_and_says_how_many_bytes(store_factory):
    store = store_factory.open()
    pending = write_pending(store)
    store.publish(pending, pending.finish())
    other = store_factory.open()  # another process's view sees the removal too
    assert other.remove(SHA) == len(DATA)
    assert store_factory.backend.read(store_factory, store, SHA) is None
    assert [info.sha256 for info in store.list_objects()] == []
    assert store.remove(SHA) == 0  # absent: nothing freed, no error
    with pytest.raises(ValueError):
        store.remove("../../etc/passwd")
