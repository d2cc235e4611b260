"""Shared upstream access for the service layer: cached documents and downloads into the store.

`Fetcher.document` is the freshness policy in action: fresh → serve; stale or missing →
one shared upstream fetch (ETag revalidation); on upstream failure the stale copy is
served (stale-if-error); 404s are cached briefly. A request waits for a refresh at most
its stale deadline (then the stale copy is answered while the refresh goes on) and for a
missing document at most its request deadline (then 504) — see `proxy.deadline`.
`Fetcher.download` streams a URL into a temp file of the archive store while hashing it,
lets the caller check it, and only then publishes it; when the disk is full it raises
DiskFullError instead, and `Fetcher.pass_through` relays the archive to the client
unstored, verified on the way. Both the provider mirror and the module mirror build on this.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any, TypeVar

import structlog
from yarl import URL

from proxy import deadline, records
from proxy.addrs import Hostname
from proxy.cache import CacheEntry, Freshness, MetadataStore, decode_record, freshness_of, keys
from proxy.config import Settings
from proxy.diskspace import DiskSpace, is_disk_full
from proxy.errors import HostNotAllowedError, NotFoundError, OfflineMissError, UpstreamError
from proxy.integrity import StoreGuard
from proxy.log import note_cache
from proxy.metrics import Metrics
from proxy.passthrough import Begin, PassThrough, Send
from proxy.singleflight import FleetLocks, LocalLocks, SingleFlight
from proxy.slots import HostSlots
from proxy.store import ArchiveStore, PendingArchive, StoredArchive
from proxy.upstream import discovery
from proxy.upstream.client import UpstreamClient

log = structlog.get_logger(__name__)
T = TypeVar("T")
R = TypeVar("R", bound=records.Record)
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
        self.guard = StoreGuard(store, metrics)
        self.locks = locks or LocalLocks()
        self.flights = SingleFlight()
        self._upstream = upstream
        self._clock = clock
        # Metadata and archives have separate slots, so slow downloads never starve index.json;
        # each upstream host gets a share of them, so one slow host never takes them all.
        limits = settings.limits
        self._metadata_slots = HostSlots(limits.upstream_concurrency, limits.upstream_host_concurrency)
        self._download_slots = HostSlots(limits.upstream_concurrency, limits.upstream_host_concurrency)
        self._decoded: dict[str, tuple[bytes, CacheEntry | None]] = {}
        self._parsed: dict[str, tuple[object, object]] = {}
        self._records: dict[str, tuple[bytes, Any]] = {}
        self._shutdown_timer: asyncio.TimerHandle | None = None

    def begin_shutdown(self, grace: float) -> None:
        """Requests may wait for running fetches `grace` seconds more; then the fetches are cancelled."""
        self._shutdown_timer = asyncio.get_running_loop().call_later(grace, self._cancel_fetches)

    def _cancel_fetches(self) -> None:
        cancelled = self.flights.cancel_all()
        if cancelled:
            log.info("proxy.fetches_cancelled", count=cancelled)

    async def close(self) -> None:
        """At shutdown (requests have had their grace): cancel the fetches still running, wait for their cleanup."""
        if self._shutdown_timer is not None:
            self._shutdown_timer.cancel()
        self._cancel_fetches()
        await self.flights.close(grace=0)

    def _decode(self, key: str, raw: bytes | None) -> CacheEntry | None:
        """Decode a cached entry, reusing the last decoding while the stored bytes are the same object."""
        return None if raw is None else self._memoised(self._decoded, key, raw, CacheEntry.decode)

    async def cached(self, key: str) -> CacheEntry | None:
        """The cached upstream document under `key`, never fetching it."""
        return self._decode(key, await self.cache.get(key))

    async def record(self, key: str, kind: type[R]) -> R | None:
        """The record of type `kind` under `key` (None: missing or unreadable), decoded once per stored value."""
        return self._decode_record(key, await self.cache.get(key), kind)

    async def records(self, wanted: list[str], kind: type[R]) -> list[R | None]:
        """Several records in one store round trip."""
        found = await self.cache.get_many(wanted)
        return [self._decode_record(key, raw, kind) for key, raw in zip(wanted, found, strict=True)]

    def _decode_record(self, key: str, raw: bytes | None, kind: type[R]) -> R | None:
        return None if raw is None else self._memoised(self._records, key, raw, lambda r: _read_record(key, r, kind))

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
                                 work: Callable[[], Awaitable[T]], what: str | None = None) -> T:
        """Run `work` once per key in this process and, with fleet locks, once in the fleet.

        A request waits for it at most its deadline (504 naming `what`, the upstream URL).
        """

        async def locked() -> T:
            async with self.locks.hold(key, recheck) as done:
                return done if done is not None else await work()

        return await self._shared(key, locked, what or key)

    async def _shared(self, key: str, work: Callable[[], Awaitable[T]], what: str) -> T:
        """Join (or start) the shared fetch of `key`, waiting at most the request's remaining deadline."""
        try:
            async with asyncio.timeout(deadline.remaining()) as scope:
                return await self.flights.run(key, work)
        except TimeoutError:
            if not scope.expired():
                raise
        log.warning("upstream.deadline_exceeded", key=key, upstream=what)
        raise deadline.timed_out(what)

    def check_allowed(self, hostname: Hostname) -> None:
        """Refuse registry hostnames outside the allowlist, before any network request."""
        if str(hostname) not in self.settings.all_allowed_hosts:
            raise HostNotAllowedError(
                f"registry host {hostname} is not allowed by this proxy "
                "(the operator can add it with --allow-host)")

    async def service_url(self, hostname: Hostname, service: str) -> URL:
        url = discovery.discovery_url(hostname, self.settings.upstream_map)
        entry = await self.document(
            keys.discovery(hostname), url, ttl=self.settings.freshness.discovery,
            max_bytes=self.settings.limits.max_discovery_bytes, max_redirects=discovery.MAX_REDIRECTS,
            validate=lambda e: discovery.parse_discovery(e.body, e.content_type, hostname))
        if entry.negative:
            raise NotFoundError(f"host {hostname} offers no registry services (discovery answered 404)")
        services = self.parsed(keys.discovery(hostname), entry,
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

        async def refresh() -> tuple[CacheEntry, str]:
            # A flight for this key may have stored a fresh entry since the read above: no second fetch.
            latest = self._decode(key, await self.cache.get(key))
            if latest is not None and freshness_of(
                    latest, self._clock(), ttl, self.settings.freshness.negative) is Freshness.FRESH:
                return latest, "hit"
            return await self._refresh(key, url, latest or cached, limit, max_redirects, validate)

        if cached is None:
            entry, outcome = await self._shared(keys.DOCUMENT_FLIGHT.key(key), refresh, str(url.with_query(None)))
        else:
            entry, outcome = await self._stale_while_revalidate(key, refresh, cached)
        self._count_cache(outcome)
        return entry

    async def _stale_while_revalidate(self, key: str, refresh: Callable[[], Awaitable[tuple[CacheEntry, str]]],
                                      cached: CacheEntry) -> tuple[CacheEntry, str]:
        """The refreshed entry if the shared refresh ends within the stale deadline, else the stale copy
        (the refresh goes on in the background and its result lands in the cache)."""
        try:
            async with asyncio.timeout(deadline.stale_wait(self.settings.stale_deadline)) as scope:
                return await self.flights.run(keys.DOCUMENT_FLIGHT.key(key), refresh)
        except TimeoutError:
            if not scope.expired():
                raise
        log.info("cache.serve_stale", key=key, reason="refresh still running at the stale deadline",
                 age_seconds=round(self._clock() - cached.fetched_at))
        return cached, "stale"

    async def _refresh(self, key: str, url: URL, cached: CacheEntry | None, max_bytes: int,
                       max_redirects: int | None,
                       validate: Callable[[CacheEntry], object]) -> tuple[CacheEntry, str]:
        usable = cached if cached is not None and not cached.negative else None
        try:
            async with self._metadata_slots.hold(url, self.settings.limits.metadata_timeout, key):
                response = await self._upstream.get(url, max_bytes=max_bytes, max_redirects=max_redirects,
                                                    etag=usable.etag if usable else None)
            now = self._clock()  # the answer's age counts from its arrival, however slow the upstream was
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
                            age_seconds=round(self._clock() - cached.fetched_at))
                return cached, "stale"
            raise
        self.metrics.upstream_fetches.labels("metadata", str(response.status)).inc()
        await self.cache.set(key, entry.encode())
        return entry, "miss"

    def _count_cache(self, outcome: str) -> None:
        note_cache(outcome)
        self.metrics.cache.labels(outcome).inc()

    def require_online(self, what: str) -> None:
        """With --offline nothing is fetched: a miss answers 404, which clients treat as "not here"."""
        if self.settings.offline:
            raise OfflineMissError(f"the proxy is offline (--offline) and has no cached copy of {what}")

    async def blob(self, url: URL, max_bytes: int, what: str) -> bytes:
        self.require_online(what)
        async with self._metadata_slots.hold(url, self.settings.limits.metadata_timeout, what):
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

            async with self._download_slots.hold(url, self.settings.limits.download_slot_wait,
                                                 str(url.with_query(None))):
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
            async with self._download_slots.hold(url, self.settings.limits.download_slot_wait,
                                                 str(url.with_query(None))):
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


def _read_record(key: str, raw: bytes, kind: type[R]) -> R | None:
    """A stored record; one written by a newer proxy is logged and read as a miss."""
    data = decode_record(raw)
    record = kind.from_dict(data)
    if record is None and records.is_newer(data):
        log.warning("cache.record_unreadable", key=key, version=records.version_of(data),
                    reason="written in a newer record format than this proxy reads: treated as a miss")
    return record


async def gather_bounded(coros: Iterable[Awaitable[T]], limit: int) -> list[T]:
    """`asyncio.gather` with at most `limit` awaitables running at once."""
    slots = asyncio.Semaphore(limit)

    async def one(coro: Awaitable[T]) -> T:
        async with slots:
            return await coro

    return await asyncio.gather(*(one(c) for c in coros))
