"""Upstream documents through the metadata cache: the freshness policy, memos and the offline policy.

`DocumentCache.document` is the freshness policy in action: fresh → serve; stale or missing →
one shared upstream fetch (ETag revalidation); on upstream failure the stale copy is
served (stale-if-error); 404s are cached briefly. A request waits for a refresh at most
its stale deadline (then the stale copy is answered while the refresh goes on) and for a
missing document at most its request deadline (then 504) — see `proxy.runtime.deadline`.

Each document is parsed once per stored value (the parse of a fresh answer is its validation),
a big one in a worker thread so the event loop keeps answering meanwhile (`proxy.protocol.safe_json` parses
in steps that let it). An answer that does not parse is never stored: it is remembered for
`--ttl-negative` instead, so retries meanwhile are answered with the same 502 (or the stale copy)
without asking the upstream again. Derived records (`proxy.metadata_store.records`) are read and written here
too, each decoded once per stored value. The registry allowlist and service discovery come first
for every address.

A document may be fetched early (`fetch_early`), before the request that needs it knows its URL
for sure (a version list at its usual place while discovery names the place): the refresh of a
document that has no cached copy takes the early answer only if it asks for that very URL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

import structlog
from yarl import URL

from proxy.domain.addresses import Hostname
from proxy.errors import (
    HostNotAllowedError,
    OfflineMissError,
    ServiceNotFoundError,
    UpstreamError,
    UpstreamMalformedError,
    UpstreamStatusError,
)
from proxy.metadata_store import (
    CacheEntry,
    Freshness,
    MetadataStore,
    decode_record,
    fresh_until,
    freshness_of,
    keys,
    records,
)
from proxy.protocol import discovery
from proxy.runtime import deadline
from proxy.runtime.background import BackgroundTasks
from proxy.runtime.log import note_cache
from proxy.runtime.memo import Memo, memoised
from proxy.runtime.metrics import Metrics
from proxy.runtime.upstream_slots import HostSlots
from proxy.services.freshness import note_fresh_for
from proxy.services.shared_fetches import SharedFetches
from proxy.settings.config import Settings
from proxy.upstream.client import UpstreamClient, UpstreamResponse

log = structlog.get_logger(__name__)
T = TypeVar("T")
R = TypeVar("R", bound=records.Record)
INLINE_PARSE_BYTES = 64 * 1024  # bigger documents are parsed in a worker thread
# What a parser raises for a shape it did not expect (every one is a malformed answer, never a crash).
PARSE_ERRORS = (UpstreamError, TypeError, KeyError, AttributeError, ValueError, RecursionError)
EARLY_KEEP = 30.0  # seconds an early answer nobody asked for is kept before it is dropped
EARLY_FETCHES = 64  # early fetches kept at most (the oldest dropped first: its refresh fetches again)
SPARE_CONNECTIONS = 2  # connections opened ahead to a cold host, beside its discovery and version list


def require_online(settings: Settings, what: str) -> None:
    """With --offline nothing is fetched: a miss answers 404, which clients treat as "not here"."""
    if settings.upstreams.offline:
        raise OfflineMissError(f"the proxy is offline (--offline) and has no cached copy of {what}")


class DocumentCache:
    """Cached upstream documents and derived records, refreshed through shared fetches."""

    def __init__(
        self,
        settings: Settings,
        upstream: UpstreamClient,
        cache: MetadataStore,
        metrics: Metrics,
        shared_fetches: SharedFetches,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._cache = cache
        self._metrics = metrics
        self._shared_fetches = shared_fetches
        self._upstream = upstream
        self.clock = clock  # wall-clock seconds; the freshness of every document is judged by it
        # Metadata has slots of its own (archives have theirs, in proxy.services.downloader), so slow downloads
        # never starve index.json; each upstream host gets a share, so one slow host never takes them all.
        self._slots = HostSlots.for_upstream(settings.limits)
        self._decoded: Memo[str, tuple[bytes, CacheEntry | None]] = Memo()
        self._parsed: Memo[str, tuple[object, Any]] = Memo()
        self._values: Memo[str, tuple[CacheEntry, Any]] = Memo()  # each document's parsed value
        self._malformed: Memo[str, tuple[float, UpstreamError]] = Memo()  # key → (until when, the error)
        self._records: Memo[str, tuple[bytes, Any]] = Memo()
        self._discovery_urls: Memo[Hostname, tuple[None, tuple[str, URL]]] = Memo()  # key and URL per host
        self._early: Memo[str, asyncio.Future[UpstreamResponse]] = Memo(EARLY_FETCHES)  # URL → its early fetch
        self._spares = BackgroundTasks("upstream.spares_failed")  # spare connections being opened
        self._spared: Memo[str, bool] = Memo()  # the hosts (origins) spare connections were opened to

    async def _decode(self, key: str, raw: bytes | None) -> CacheEntry | None:
        """Decode a cached entry, reusing the last decoding while the stored bytes are the same object (a big
        one is decoded in a worker thread)."""
        if raw is None:
            return None
        known = self._decoded.get(key)
        if known is not None and known[0] is raw:
            return known[1]
        if len(raw) <= INLINE_PARSE_BYTES:
            return memoised(self._decoded, key, raw, CacheEntry.decode)
        entry = await asyncio.to_thread(CacheEntry.decode, raw)
        return memoised(self._decoded, key, raw, lambda _: entry)

    async def cached(self, key: str) -> CacheEntry | None:
        """The cached upstream document under `key`, never fetching it."""
        return await self._decode(key, await self._cache.get(key))

    async def record(self, key: str, kind: type[R]) -> R | None:
        """The record of type `kind` under `key` (None: missing or unreadable), decoded once per stored value."""
        return self._decode_record(key, await self._cache.get(key), kind)

    async def records(self, wanted: list[str], kind: type[R]) -> list[R | None]:
        """Several records in one store round trip."""
        found = await self._cache.get_many(wanted)
        return [self._decode_record(key, raw, kind) for key, raw in zip(wanted, found, strict=True)]

    def _decode_record(self, key: str, raw: bytes | None, kind: type[R]) -> R | None:
        return None if raw is None else memoised(self._records, key, raw, lambda r: _read_record(key, r, kind))

    def parsed(self, key: str, entry: Any, parse: Callable[[Any], T]) -> T:
        """`parse(entry)`, memoised per key for as long as the entry object is the same."""
        return memoised(self._parsed, key, entry, parse)

    async def stored(self, wanted: list[str]) -> list[bytes | None]:
        """The stored values under `wanted` as they are, in one round trip (to tell later whether any changed)."""
        return await self._cache.get_many(wanted)

    def check_allowed(self, hostname: Hostname) -> None:
        """Refuse registry hostnames outside the allowlist, before any network request."""
        if str(hostname) not in self._settings.upstreams.all_allowed_hosts:
            raise HostNotAllowedError.for_host(hostname)

    async def service_url(self, hostname: Hostname, service: str) -> URL:
        """The base URL of a registry service (`providers.v1`, `modules.v1`) from the host's discovery document."""
        return (await self.service(hostname, service))[0]

    def _discovery(self, hostname: Hostname) -> tuple[str, URL]:
        """The store key and the URL of a host's discovery document."""
        return memoised(
            self._discovery_urls,
            hostname,
            None,
            lambda _: (
                keys.discovery(hostname),
                discovery.discovery_url(hostname, self._settings.upstreams.upstream_map),
            ),
        )

    async def usual_service_url(self, hostname: Hostname, path: str, unless_cached: str) -> URL | None:
        """Where a service usually is (`path` on the host of its discovery document), when neither that
        document nor the document under `unless_cached` is in the store (else None: no guess is needed)."""
        key, url = self._discovery(hostname)
        if any(value is not None for value in await self._cache.get_many([key, unless_cached])):
            return None
        return url.join(URL(path))

    def open_spares(self, url: URL) -> None:
        """Open `SPARE_CONNECTIONS` more connections to `url`'s host in the background (`UpstreamClient.open_spares`),
        once per host in this process: for a cold host, whose next requests (download documents, SHA256SUMS,
        archives) go out several at once."""
        origin = str(url.origin())
        if self._settings.upstreams.offline or self._spared.get(origin):
            return
        self._spared.put(origin, True)
        self._spares.start(self._upstream.open_spares(url, SPARE_CONNECTIONS))

    def fetch_early(self, url: URL) -> None:
        """Start fetching the document at `url` before a request is sure to need it; the refresh of an uncached
        document at this very URL within `EARLY_KEEP` seconds takes the answer instead of fetching it again."""
        key = str(url)
        if self._settings.upstreams.offline or self._early.get(key) is not None:
            return

        async def fetch() -> UpstreamResponse:
            async with self._slots.hold(url, self._settings.limits.metadata_timeout, key):
                return await self._upstream.get(url, max_bytes=self._settings.limits.max_metadata_bytes)

        early = asyncio.ensure_future(self._shared_fetches.run(f"early {key}", fetch))
        self._early.put(key, early)
        early.add_done_callback(lambda done: self._keep_early(key, done))

    def _keep_early(self, key: str, early: asyncio.Future[UpstreamResponse]) -> None:
        """An early fetch ended: its answer is kept `EARLY_KEEP` seconds for the refresh that wants it."""
        if not early.cancelled():
            early.exception()  # retrieved: a failed early fetch is only a fetch made again
        loop = asyncio.get_running_loop()
        loop.call_later(EARLY_KEEP, lambda: self._early.get(key) is early and self._early.pop(key))

    async def _early_answer(self, url: URL, max_bytes: int, max_redirects: int | None) -> UpstreamResponse | None:
        """The answer of an early fetch of `url` made with the same limits, taken once (None: there is none);
        its failure is this fetch's failure (it was the same request)."""
        if max_bytes != self._settings.limits.max_metadata_bytes or max_redirects is not None:
            return None
        early = self._early.pop(str(url))
        return None if early is None else await early

    async def service(self, hostname: Hostname, service: str) -> tuple[URL, float]:
        """`service_url`, and until when (`clock` time) the discovery document it came from is fresh."""
        key, url = self._discovery(hostname)
        ttl = self._settings.freshness.discovery
        entry, services = await self.document(
            key,
            url,
            ttl=ttl,
            max_bytes=self._settings.limits.max_discovery_bytes,
            max_redirects=discovery.MAX_REDIRECTS,
            parse=lambda e: discovery.parse_discovery(e.body, e.content_type, hostname),
        )
        if services is None:
            raise ServiceNotFoundError(f"host {hostname} offers no registry services (discovery answered 404)")
        return self.parsed(
            f"{key} {service}", entry, lambda e: discovery.service_url(services, service, URL(e.url), hostname)
        ), self.fresh_until(entry, ttl)

    def fresh_until(self, entry: CacheEntry, ttl: float | None) -> float:
        """The `clock` time at which `entry` stops being fresh under `ttl` (as `document` judges it)."""
        return fresh_until(entry, ttl, self._settings.freshness.negative)

    async def document(
        self,
        key: str,
        url: URL,
        *,
        ttl: float | None,
        parse: Callable[[CacheEntry], T],
        max_bytes: int | None = None,
        max_redirects: int | None = None,
    ) -> tuple[CacheEntry, T | None]:
        """A cached upstream document and `parse(entry)` (None for a remembered 404), refreshed through one
        shared fetch when not fresh. `parse` raises UpstreamError (or any of `PARSE_ERRORS`) for an answer
        that cannot be used."""
        entry = await self._fresh_entry(key, url, ttl, parse, max_bytes, max_redirects)
        note_fresh_for(self.fresh_until(entry, ttl) - self.clock())
        return entry, (None if entry.negative else await self.value(key, entry, parse))

    async def value(self, key: str, entry: CacheEntry, parse: Callable[[CacheEntry], T]) -> T:
        """`parse(entry)` of the document stored under `key`, once per stored value (a big one in a worker thread)."""
        known = self._values.get(key)
        if known is not None and known[0] is entry:
            return known[1]
        value = await asyncio.to_thread(parse, entry) if len(entry.body) > INLINE_PARSE_BYTES else parse(entry)
        self._values.put(key, (entry, value))
        return value

    async def _fresh_entry(
        self,
        key: str,
        url: URL,
        ttl: float | None,
        parse: Callable[[CacheEntry], object],
        max_bytes: int | None,
        max_redirects: int | None,
    ) -> CacheEntry:
        cached = await self._decode(key, await self._cache.get(key))
        if cached is not None and (
            self._settings.upstreams.offline
            or freshness_of(cached, self.clock(), ttl, self._settings.freshness.negative) is Freshness.FRESH
        ):
            self._count_cache("hit")
            return cached
        self.require_online(key.replace(":", " ", 1))
        limit = max_bytes or self._settings.limits.max_metadata_bytes

        async def refresh() -> tuple[CacheEntry, str]:
            # A flight for this key may have stored a fresh entry since the read above: no second fetch.
            latest = await self._decode(key, await self._cache.get(key))
            if (
                latest is not None
                and freshness_of(latest, self.clock(), ttl, self._settings.freshness.negative) is Freshness.FRESH
            ):
                return latest, "hit"
            return await self._refresh(key, url, latest or cached, limit, max_redirects, parse)

        if cached is None:
            entry, outcome = await self._shared_fetches.join(
                keys.DOCUMENT_FLIGHT.key(key), refresh, str(url.with_query(None))
            )
        else:
            entry, outcome = await self._stale_while_revalidate(key, refresh, cached)
        self._count_cache(outcome)
        return entry

    async def _stale_while_revalidate(
        self, key: str, refresh: Callable[[], Awaitable[tuple[CacheEntry, str]]], cached: CacheEntry
    ) -> tuple[CacheEntry, str]:
        """The refreshed entry if the shared refresh ends within the stale deadline, else the stale copy
        (the refresh goes on in the background and its result lands in the cache)."""
        try:
            async with asyncio.timeout(deadline.stale_wait(self._settings.limits.stale_deadline)) as scope:
                return await self._shared_fetches.run(keys.DOCUMENT_FLIGHT.key(key), refresh)
        except TimeoutError:
            if not scope.expired():
                raise
        log.info(
            "cache.serve_stale",
            key=key,
            reason="refresh still running at the stale deadline",
            age_seconds=round(self.clock() - cached.fetched_at),
        )
        return cached, "stale"

    async def _refresh(
        self,
        key: str,
        url: URL,
        cached: CacheEntry | None,
        max_bytes: int,
        max_redirects: int | None,
        parse: Callable[[CacheEntry], object],
    ) -> tuple[CacheEntry, str]:
        usable = cached if cached is not None and not cached.negative else None
        malformed = self._malformed_lately(key)
        if malformed is not None:
            return self._stale_if_error(key, cached, malformed)
        try:
            response = None if cached is not None else await self._early_answer(url, max_bytes, max_redirects)
            if response is None:
                async with self._slots.hold(url, self._settings.limits.metadata_timeout, key):
                    response = await self._upstream.get(
                        url, max_bytes=max_bytes, max_redirects=max_redirects, etag=usable.etag if usable else None
                    )
            now = self.clock()  # the answer's age counts from its arrival, however slow the upstream was
            if response.status == 304 and usable is not None:
                entry = replace(usable, fetched_at=now)
                self._carry_value(key, usable, entry)
            elif response.status in (404, 410):
                entry = CacheEntry(404, b"", str(response.final_url), now)
            elif response.status in (200, 204):
                entry = CacheEntry(
                    response.status,
                    response.body,
                    str(response.final_url),
                    now,
                    response.etag,
                    response.content_type,
                    response.terraform_get,
                )
                await self._validate(key, url, entry, parse)
            else:
                raise UpstreamStatusError(f"upstream answered {response.status} for {url}")
        except UpstreamError as exc:
            self._metrics.upstream_fetches.labels("metadata", "error").inc()
            return self._stale_if_error(key, cached, exc)
        self._metrics.upstream_fetches.labels("metadata", str(response.status)).inc()
        encoded = await asyncio.to_thread(entry.encode) if len(entry.body) > INLINE_PARSE_BYTES else entry.encode()
        await self._cache.set(key, encoded)
        return entry, "miss"

    async def _validate(self, key: str, url: URL, entry: CacheEntry, parse: Callable[[CacheEntry], object]) -> None:
        """Parse a fresh answer (which `value` then remembers); one that does not parse is remembered as
        malformed for `--ttl-negative`."""
        try:
            await self.value(key, entry, parse)
        except PARSE_ERRORS as exc:
            shown = url.with_query(None)
            error = (
                exc
                if isinstance(exc, UpstreamError)
                else UpstreamMalformedError(f"upstream answer at {shown} is malformed: {exc}")
            )
            self._malformed.put(key, (self.clock() + self._settings.freshness.negative, error))
            log.warning("upstream.malformed", key=key, url=str(shown), error=error.message)
            raise error from None

    def _malformed_lately(self, key: str) -> UpstreamError | None:
        """If the upstream's last answer for `key` did not parse, within `--ttl-negative`: its error again."""
        known = self._malformed.get(key)
        if known is None:
            return None
        until, error = known
        if 0 < until - self.clock() <= self._settings.freshness.negative:
            return type(error)(error.message)
        self._malformed.pop(key)
        return None

    def _stale_if_error(self, key: str, cached: CacheEntry | None, exc: UpstreamError) -> tuple[CacheEntry, str]:
        """The stale copy (a remembered 404 too) when the upstream failed; without one, the error."""
        if cached is None:
            raise exc
        log.warning(
            "cache.serve_stale", key=key, error=exc.message, age_seconds=round(self.clock() - cached.fetched_at)
        )
        return cached, "stale"

    def _carry_value(self, key: str, before: CacheEntry, after: CacheEntry) -> None:
        """A revalidated document (304) has the parsed value of the copy it renews: not parsed again."""
        known = self._values.get(key)
        if known is not None and known[0] is before:
            self._values.put(key, (after, known[1]))

    def count_hit(self) -> None:
        """Count a hit answered without asking `document` (in the access log and the metrics)."""
        self._count_cache("hit")

    def _count_cache(self, outcome: str) -> None:
        note_cache(outcome)
        self._metrics.count_cache(outcome)

    def require_online(self, what: str) -> None:
        """With --offline nothing is fetched: a miss answers 404, which clients treat as "not here"."""
        require_online(self._settings, what)

    async def put_record(self, key: str, record: records.Record) -> None:
        """Store a derived record (only ever a verified one)."""
        await self._cache.set(key, records.encode(record))

    async def blob(self, url: URL, max_bytes: int, what: str) -> bytes:
        """An uncached upstream file (SHA256SUMS and its signature), fetched in a metadata slot."""
        return (await self.dated_blob(url, max_bytes, what))[0]

    async def dated_blob(self, url: URL, max_bytes: int, what: str) -> tuple[bytes, str | None]:
        """`blob`, and the answer's `Last-Modified` header (None without one)."""
        self.require_online(what)
        async with self._slots.hold(url, self._settings.limits.metadata_timeout, what):
            response = await self._upstream.get(url, max_bytes=max_bytes, accept="*/*")
        if response.status != 200:
            raise UpstreamStatusError(f"upstream answered {response.status} for the {what} at {url.with_query(None)}")
        self._metrics.upstream_fetches.labels("checksums", "200").inc()
        return response.body, response.last_modified

    async def optional(self, url: URL, max_bytes: int, what: str) -> UpstreamResponse | None:
        """An uncached upstream document nothing depends on (a publish date), fetched in a metadata slot: the
        answer (200, 204, 304, 404 or 410), or None when offline or the upstream failed (never an error)."""
        if self._settings.upstreams.offline:
            return None
        try:
            async with self._slots.hold(url, self._settings.limits.metadata_timeout, what):
                response = await self._upstream.get(url, max_bytes=max_bytes)
        except UpstreamError as exc:
            self._metrics.upstream_fetches.labels("metadata", "error").inc()
            log.info("upstream.optional_failed", url=str(url.with_query(None)), what=what, error=exc.message)
            return None
        self._metrics.upstream_fetches.labels("metadata", str(response.status)).inc()
        return response


def _read_record(key: str, raw: bytes, kind: type[R]) -> R | None:
    """A stored record; one written by a newer proxy is logged and read as a miss."""
    data = decode_record(raw)
    record = kind.from_dict(data)
    if record is None and records.is_newer(data):
        log.warning(
            "cache.record_unreadable",
            key=key,
            version=records.version_of(data),
            reason="written in a newer record format than this proxy reads: treated as a miss",
        )
    return record
