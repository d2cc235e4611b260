"""Shared upstream access for the service layer: cached documents and downloads into the store.

`Fetcher.document` is the freshness policy in action: fresh → serve; stale or missing →
one shared upstream fetch (ETag revalidation); on upstream failure the stale copy is
served (stale-if-error); 404s are cached briefly. `Fetcher.download` streams a URL into
a temp file of the archive store while hashing it, lets the caller check it, and only
then publishes it; when the disk is full it raises DiskFullError instead, and
`Fetcher.pass_through` relays the archive to the client unstored, verified on the way.
Both the provider mirror and the module mirror build on this.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any, TypeVar

import structlog
from yarl import URL

from proxy.addrs import Hostname
from proxy.cache import CacheEntry, Freshness, MetadataStore, decode_record, freshness_of
from proxy.config import Settings
from proxy.diskspace import DiskSpace, is_disk_full
from proxy.errors import HostNotAllowedError, NotFoundError, OfflineMissError, UpstreamError
from proxy.log import note_cache
from proxy.metrics import Metrics
from proxy.passthrough import Begin, PassThrough, Send
from proxy.singleflight import FleetLocks, LocalLocks, SingleFlight
from proxy.store import ArchiveStore, PendingArchive, StoredArchive
from proxy.upstream import discovery
from proxy.upstream.client import UpstreamClient

log = structlog.get_logger(__name__)
T = TypeVar("T")
MEMO_ENTRIES = 10_000


class Fetcher:
    """Upstream documents through the metadata cache, and verified downloads into the store."""

    def __init__(self, settings: Settings, upstream: UpstreamClient, cache: MetadataStore,
                 store: ArchiveStore, metrics: Metrics, *, locks: FleetLocks | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.cache = cache
        self.store = store
        self.space = DiskSpace(store.root, settings.min_free_space)
        self.metrics = metrics
        self.locks = locks or LocalLocks()
        self.flights = SingleFlight()
        self._upstream = upstream
        self._clock = clock
        # Metadata and archives have separate slots, so slow downloads never starve index.json.
        self._metadata_slots = asyncio.Semaphore(settings.limits.upstream_concurrency)
        self._download_slots = asyncio.Semaphore(settings.limits.upstream_concurrency)
        self._decoded: dict[str, tuple[bytes, CacheEntry | None]] = {}
        self._parsed: dict[str, tuple[object, object]] = {}
        self._records: dict[str, tuple[bytes, dict[str, Any] | None]] = {}

    async def close(self) -> None:
        await self.flights.close()

    def _decode(self, key: str, raw: bytes | None) -> CacheEntry | None:
        """Decode a cached entry, reusing the last decoding while the stored bytes are the same object."""
        return None if raw is None else self._memoised(self._decoded, key, raw, CacheEntry.decode)

    async def record(self, key: str) -> dict[str, Any] | None:
        """A derived record from the cache, decoded once per stored value."""
        return self._decode_record(key, await self.cache.get(key))

    async def records(self, keys: list[str]) -> list[dict[str, Any] | None]:
        """Several records in one store round trip."""
        return [self._decode_record(k, raw) for k, raw in zip(keys, await self.cache.get_many(keys), strict=True)]

    def _decode_record(self, key: str, raw: bytes | None) -> dict[str, Any] | None:
        return None if raw is None else self._memoised(self._records, key, raw, decode_record)

    def parsed(self, key: str, entry: Any, parse: Callable[[Any], T]) -> T:
        """`parse(entry)`, memoised per key for as long as the entry object is the same."""
        return self._memoised(self._parsed, key, entry, parse)

    @staticmethod
    def _memoised(memo: dict, key: str, source: Any, compute: Callable[[Any], T]) -> T:
        """`compute(source)`, reused while the same source object is asked for under `key` (bounded)."""
        hit = memo.get(key)
        if hit is not None and hit[0] is source:
            return hit[1]
        value = compute(source)
        if len(memo) >= MEMO_ENTRIES:
            memo.pop(next(iter(memo)))
        memo[key] = (source, value)
        return value

    async def once_for_the_fleet(self, key: str, recheck: Callable[[], Awaitable[T | None]],
                                 work: Callable[[], Awaitable[T]]) -> T:
        """Run `work` once per key in this process and, with fleet locks, once in the fleet."""

        async def locked() -> T:
            async with self.locks.hold(key, recheck) as done:
                return done if done is not None else await work()

        return await self.flights.run(key, locked)

    def check_allowed(self, hostname: Hostname) -> None:
        """Refuse registry hostnames outside the allowlist, before any network request."""
        if str(hostname) not in self.settings.all_allowed_hosts:
            raise HostNotAllowedError(
                f"registry host {hostname} is not allowed by this proxy "
                "(the operator can add it with --allow-host)")

    async def service_url(self, hostname: Hostname, service: str) -> URL:
        url = discovery.discovery_url(hostname, self.settings.upstream_map)
        entry = await self.document(
            f"discovery:{hostname}", url, ttl=self.settings.freshness.discovery,
            max_bytes=self.settings.limits.max_discovery_bytes, max_redirects=discovery.MAX_REDIRECTS,
            validate=lambda e: discovery.parse_discovery(e.body, e.content_type, hostname))
        if entry.negative:
            raise NotFoundError(f"host {hostname} offers no registry services (discovery answered 404)")
        services = self.parsed(f"discovery:{hostname}", entry,
                               lambda e: discovery.parse_discovery(e.body, e.content_type, hostname))
        return discovery.service_url(services, service, URL(entry.url), hostname)

    async def document(self, key: str, url: URL, *, ttl: float | None,
                        validate: Callable[[CacheEntry], object],
                        max_bytes: int | None = None, max_redirects: int | None = None) -> CacheEntry:
        """A cached upstream document, refreshed through one shared fetch when not fresh."""
        cached = self._decode(key, await self.cache.get(key))
        if cached is not None and (self.settings.offline or freshness_of(
                cached, self._clock(), ttl, self.settings.freshness.negative) is Freshness.FRESH):
            self._count_cache("hit")
            return cached
        self.require_online(key.replace(":", " ", 1))
        limit = max_bytes or self.settings.limits.max_metadata_bytes
        entry, outcome = await self.flights.run(
            f"doc:{key}", lambda: self._refresh(key, url, cached, limit, max_redirects, validate))
        self._count_cache(outcome)
        return entry

    async def _refresh(self, key: str, url: URL, cached: CacheEntry | None, max_bytes: int,
                       max_redirects: int | None,
                       validate: Callable[[CacheEntry], object]) -> tuple[CacheEntry, str]:
        now = self._clock()
        usable = cached if cached is not None and not cached.negative else None
        try:
            async with self._slot(self._metadata_slots, key):
                response = await self._upstream.get(url, max_bytes=max_bytes, max_redirects=max_redirects,
                                                    etag=usable.etag if usable else None)
            if response.status == 304 and usable is not None:
                entry = replace(usable, fetched_at=now)
            elif response.status in (404, 410):
                entry = CacheEntry(404, b"", str(response.final_url), now)
            elif response.status in (200, 204):
                entry = CacheEntry(response.status, response.body, str(response.final_url), now,
                                   response.etag, response.content_type, response.terraform_get)
                try:
                    validate(entry)
                except (TypeError, KeyError, AttributeError, ValueError) as exc:  # a parser missed a shape
                    raise UpstreamError(f"upstream answer at {url.with_query(None)} is malformed: {exc}") from None
            else:
                raise UpstreamError(f"upstream answered {response.status} for {url}")
        except UpstreamError as exc:
            self.metrics.upstream_fetches.labels("metadata", "error").inc()
            if cached is not None:  # stale-if-error, for remembered 404s too
                log.warning("cache.serve_stale", key=key, error=exc.message,
                            age_seconds=round(now - cached.fetched_at))
                return cached, "stale"
            raise
        self.metrics.upstream_fetches.labels("metadata", str(response.status)).inc()
        await self.cache.set(key, entry.encode())
        return entry, "miss"

    def _count_cache(self, outcome: str) -> None:
        note_cache(outcome)
        self.metrics.cache.labels(outcome).inc()

    @contextlib.asynccontextmanager
    async def _slot(self, slots: asyncio.Semaphore, what: str) -> AsyncIterator[None]:
        """An upstream slot, waited for at most the metadata timeout (then the stale copy is used)."""
        try:
            async with asyncio.timeout(self.settings.limits.metadata_timeout):
                await slots.acquire()
        except TimeoutError:
            raise UpstreamError(f"too many upstream requests in flight; gave up waiting to fetch {what}") from None
        try:
            yield
        finally:
            slots.release()

    def require_online(self, what: str) -> None:
        """With --offline nothing is fetched: a miss answers 404, which clients treat as "not here"."""
        if self.settings.offline:
            raise OfflineMissError(f"the proxy is offline (--offline) and has no cached copy of {what}")

    async def blob(self, url: URL, max_bytes: int, what: str) -> bytes:
        self.require_online(what)
        async with self._slot(self._metadata_slots, what):
            response = await self._upstream.get(url, max_bytes=max_bytes, accept="*/*")
        if response.status != 200:
            raise UpstreamError(f"upstream answered {response.status} for the {what} at {url.with_query(None)}")
        self.metrics.upstream_fetches.labels("checksums", "200").inc()
        return response.body

    async def download(self, url: URL, max_bytes: int,
                       check: Callable[[PendingArchive, str], Awaitable[T]]) -> tuple[StoredArchive, T]:
        """Stream `url` into a temp file, run `check(pending, sha256)` (raise to refuse), then publish.

        Raises DiskFullError, leaving no temp file behind, when the disk is below the free-space
        floor (before or, by the upstream's Content-Length, during the download) or a write fails
        for lack of space."""
        what = str(url.with_query(None))
        self.require_online(what)
        await self.space.require_room(what)
        try:
            return await self._download(url, what, max_bytes, check)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise self.space.full(exc, f"store {what}") from None

    async def _download(self, url: URL, what: str, max_bytes: int,
                        check: Callable[[PendingArchive, str], Awaitable[T]]) -> tuple[StoredArchive, T]:
        pending: PendingArchive = await asyncio.to_thread(self.store.begin)
        try:
            async def sink(chunk: bytes) -> None:
                await asyncio.to_thread(pending.write, chunk)

            async def room(length: int | None) -> None:
                if length:
                    await self.space.require_room(what, length)

            async with self._download_slots:
                await self._upstream.download(url, sink, max_bytes=max_bytes, on_response=room)
            actual = await asyncio.to_thread(pending.finish)
            self.metrics.upstream_fetches.labels("archive", "200").inc()
            self.metrics.upstream_bytes.inc(pending.size)
            result = await check(pending, actual)
            return await asyncio.to_thread(self.store.publish, pending, actual), result
        except BaseException:
            await asyncio.to_thread(pending.discard)
            raise

    def pass_through(self, url: URL, *, max_bytes: int, algorithm: str, kind: str,
                     check: Callable[[str], None], etag: str | None) -> PassThrough:
        """A relay of `url` that stores nothing; `check(hexdigest)` (raise to refuse) runs before the last chunk."""

        async def stream(begin: Begin, send: Send) -> None:
            await self._relay(url, max_bytes, algorithm, kind, check, begin, send)

        return PassThrough(etag, stream)

    async def _relay(self, url: URL, max_bytes: int, algorithm: str, kind: str, check: Callable[[str], None],
                     begin: Begin, send: Send) -> None:
        self.require_online(str(url.with_query(None)))
        digest = hashlib.new(algorithm)
        held = b""
        outcome = "error"
        size = 0

        async def sink(chunk: bytes) -> None:
            nonlocal held, size
            digest.update(chunk)
            size += len(chunk)
            if held:
                await send(held)
            held = chunk  # the newest chunk waits until the digest is known

        try:
            async with self._download_slots:
                await self._upstream.download(url, sink, max_bytes=max_bytes, on_response=begin)
            self.metrics.upstream_fetches.labels("archive", "200").inc()
            self.metrics.upstream_bytes.inc(size)
            outcome = "verification_failed"
            check(digest.hexdigest())
            outcome = "error"
            if held:
                await send(held)
            outcome = "complete"
        finally:
            self.metrics.passthrough.labels(kind, outcome).inc()
            log.info("archive.passthrough_done", url=str(url.with_query(None)), kind=kind, outcome=outcome)


async def gather_bounded(coros: Iterable[Awaitable[T]], limit: int) -> list[T]:
    """`asyncio.gather` with at most `limit` awaitables running at once."""
    slots = asyncio.Semaphore(limit)

    async def one(coro: Awaitable[T]) -> T:
        async with slots:
            return await coro

    return await asyncio.gather(*(one(c) for c in coros))
