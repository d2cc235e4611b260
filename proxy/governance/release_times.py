"""When versions came out, for the policy's min-age rules: first-seen times and the upstream's publish times.

One record per provider or module (`keys.first_seen`), sealed in the metadata store (Redis for a fleet, so
replicas agree) and written under the fleet lock of its key:

- **first seen**: the first time any replica saw each version in its upstream's list. The versions of a list
  the proxy had never seen before count as seen long ago (`FIRST_LISTING`: the proxy cannot tell how old they
  are, and holding back every version of every provider for the min-age after the first start would stop
  every installation); versions that appear in a later refresh of the list are new from then on.
- **published**: the upstream's own publish time where it gives one, learned without asking for lists: the
  public registry's per-version document (`PublishDates`, asked once for the fleet, only for a version a
  client asks for and whose age decides), else the `Last-Modified` of the release's SHA256SUMS when the proxy
  fetches it anyway (`note_published`). A version the registry API was asked about and gave no date for is
  recorded so (None), so it is asked once.

The age counts from the later of the two (`proxy.governance.policy.ReleaseTime`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import structlog

from proxy.domain.addresses import ModuleAddr, ProviderAddr, Version
from proxy.errors import NotFoundError, UpstreamError, UpstreamTimeoutError
from proxy.governance.policy import FIRST_LISTING, ReleaseTime, believed
from proxy.metadata_store import MetadataStore, decode_record, encode_record, keys
from proxy.protocol import discovery
from proxy.protocol.publish_dates import REGISTRY_API, SOURCES, parse_published_at, registry_api_url
from proxy.runtime.memo import Memo
from proxy.services.documents import INLINE_PARSE_BYTES, DocumentCache
from proxy.services.shared_fetches import SharedFetches
from proxy.settings.config import Settings

log = structlog.get_logger(__name__)
Address = ProviderAddr | ModuleAddr
_SERVICES = {ProviderAddr: "providers.v1", ModuleAddr: "modules.v1"}


@dataclass(frozen=True)
class ReleaseRecord:
    """A provider's or module's record: first-seen times, and publish times by source (a time of None: the
    source was asked and gave none)."""

    seen: dict[Version, float] = field(default_factory=dict)
    published: dict[Version, dict[str, float | None]] = field(default_factory=dict)

    def time_of(self, version: Version) -> ReleaseTime:
        """What `version`'s age counts from: its first-seen time, and the date of the most trusted source."""
        dates = self.published.get(version, {})
        first_seen = self.seen.get(version, FIRST_LISTING)
        for source, name in SOURCES.items():
            when = dates.get(source)
            if when is not None:
                return ReleaseTime(first_seen, when, name)
        return ReleaseTime(first_seen)

    def times(self) -> dict[Version, ReleaseTime]:
        return {version: self.time_of(version) for version in self.seen}

    def asked(self, version: Version, source: str) -> bool:
        """Whether `source` was asked about `version` (or its date learned)."""
        return source in self.published.get(version, {})

    def encode(self) -> bytes:
        return encode_record(
            {
                "v": 1,
                "seen": {str(v): t for v, t in self.seen.items()},
                "published": {str(v): dict(dates) for v, dates in self.published.items()},
            }
        )


def read_release_record(raw: bytes | None) -> ReleaseRecord | None:
    """A stored record (None: missing or unreadable; a record without publish times reads as having none)."""
    data = decode_record(raw)
    if data is None or data.get("v") != 1 or not isinstance(data.get("seen"), dict):
        return None
    published = data.get("published", {})
    try:
        seen = {Version.parse(text): float(when) for text, when in data["seen"].items()}
        dates = {
            Version.parse(text): {
                str(source): None if when is None else float(when) for source, when in by_source.items()
            }
            for text, by_source in (published.items() if isinstance(published, dict) else ())
        }
    except (ValueError, TypeError, AttributeError):
        return None
    return ReleaseRecord(seen, dates)


def release_time_in(raw: bytes | None, version: Version) -> ReleaseTime:
    """What `version`'s age counts from by the record `raw` (a version without one: listed long ago)."""
    return (read_release_record(raw) or ReleaseRecord()).time_of(version)


class PublishDates:
    """The upstream's publish time of one version from the public registry's per-version document."""

    def __init__(self, settings: Settings, documents: DocumentCache) -> None:
        self._settings = settings
        self._documents = documents

    async def registry_date(self, addr: Address, version: Version) -> tuple[float | None, bool]:
        """The version's `published_at` (None: no date), and whether that answer is final (a failing upstream's
        is not: the version is asked about again the next time its age decides)."""
        hostname = addr.hostname
        base = await self._documents.service_url(hostname, _SERVICES[type(addr)])
        discovered_at = discovery.discovery_url(hostname, self._settings.upstreams.upstream_map)
        url = registry_api_url(base, discovered_at, addr, version)
        if url is None:
            return None, True
        response = await self._documents.optional(url, self._settings.limits.max_metadata_bytes, "publish date")
        if response is None:
            return None, False
        if response.status != 200:
            return None, True
        if len(response.body) > INLINE_PARSE_BYTES:  # the public registry's documents list every docs page
            return await asyncio.to_thread(parse_published_at, response.body, version), True
        return parse_published_at(response.body, version), True


class FirstSeen:
    """When each version of a provider or module came out as far as the fleet knows (first seen, published),
    sealed in the metadata store."""

    def __init__(
        self,
        store: MetadataStore,
        shared_fetches: SharedFetches,
        clock: Callable[[], float],
        dates: PublishDates | None = None,
    ) -> None:
        self._store = store
        self._shared_fetches = shared_fetches
        self.clock = clock
        self.dates = dates
        self.changes = 0  # counts the publish times this process learned (decisions made before are made again)
        self._known: Memo[str, ReleaseRecord] = Memo()
        self._writing = asyncio.Lock()  # this process's writes of records, one at a time

    async def times(self, addr: Address, versions: Iterable[Version]) -> Mapping[Version, ReleaseTime]:
        """What the age of every one of `versions` counts from (recording now as the first-seen time of those
        never seen before)."""
        wanted = frozenset(versions)
        key = keys.first_seen(addr)
        known = self._known.get(key)
        if known is not None and wanted <= known.seen.keys():
            return known.times()

        def seeing(stored: ReleaseRecord | None) -> ReleaseRecord | None:
            if stored is not None and wanted <= stored.seen.keys():
                return None  # recorded meanwhile (by another process or replica)
            now = self.clock()
            merged = dict(stored.seen) if stored is not None else {}
            for version in wanted - merged.keys():
                merged[version] = now if stored is not None and stored.seen else FIRST_LISTING
            return ReleaseRecord(merged, stored.published if stored is not None else {})

        found = await self._read(key)
        if found is None or not wanted <= found.seen.keys():
            found = await self._shared_fetches.join(key, lambda: self._update(key, seeing), key)
        self._known.put(key, found)
        return found.times()

    async def learn(self, addr: Address, version: Version) -> ReleaseTime:
        """For a version a client asks for, whose age decides: the record read again (another process may have
        learned a publish time), and when the registry API was not asked about it yet, asked once for the fleet."""
        key = keys.first_seen(addr)
        stored = await self._read(key) or ReleaseRecord()
        if not stored.asked(version, REGISTRY_API) and self.dates is not None:
            dates = self.dates

            async def recheck() -> ReleaseRecord | None:
                found = await self._read(key)
                return found if found is not None and found.asked(version, REGISTRY_API) else None

            async def ask() -> ReleaseRecord:
                when, final = await dates.registry_date(addr, version)
                if not final:
                    return stored
                dated = None if when is None else believed(when, self.clock())
                return await self._update(key, lambda r: _with_date(r, version, REGISTRY_API, dated))

            try:
                stored = await self._shared_fetches.once_for_the_fleet(
                    f"{key} {REGISTRY_API} {version}", recheck, ask, f"the publish date of {addr} {version}"
                )
            except (UpstreamError, UpstreamTimeoutError, NotFoundError) as exc:  # no date, never an error
                log.info("policy.publish_date_unknown", artifact=f"{addr} {version}", error=exc.message)
        self._remember(key, stored)
        return stored.time_of(version)

    async def note_published(self, addr: Address, version: Version, when: float, source: str) -> None:
        """A publish time learned on the way (the SHA256SUMS's `Last-Modified`), recorded once per source."""
        key = keys.first_seen(addr)
        dated = believed(when, self.clock())
        self._remember(key, await self._update(key, lambda r: _with_date(r, version, source, dated)))
        log.info("policy.publish_time", artifact=f"{addr} {version}", source=source, published=dated)

    def _remember(self, key: str, record: ReleaseRecord) -> None:
        before = self._known.get(key)
        if (before.published if before is not None else {}) != record.published:
            self.changes += 1
        self._known.put(key, record)

    async def _update(self, key: str, change: Callable[[ReleaseRecord | None], ReleaseRecord | None]) -> ReleaseRecord:
        """Read, change and write the record under `key` (under the fleet lock of the key, and one write at a
        time in this process); `change` returns None when there is nothing to write."""
        async with self._writing, self._shared_fetches.locks.hold(key, _nothing):
            stored = await self._read(key)
            changed = change(stored)
            if changed is None:
                return stored or ReleaseRecord()
            await self._store.set(key, changed.encode())
            return changed

    async def _read(self, key: str) -> ReleaseRecord | None:
        return read_release_record(await self._store.get(key))


def _with_date(stored: ReleaseRecord | None, version: Version, source: str, when: float | None) -> ReleaseRecord | None:
    """`stored` with what `source` says of `version` (None: nothing to write, the source's answer is recorded
    already: the first is kept)."""
    record = stored or ReleaseRecord()
    if record.asked(version, source):
        return None
    dates = {**record.published.get(version, {}), source: when}
    return replace(record, published={**record.published, version: dates})


async def _nothing() -> None:
    return None
