"""When versions came out, for the policy's min-age rules: first-seen times, baselines and publish times.

Two records per provider or module, sealed in the metadata store (Redis for a fleet, so replicas agree),
written under the fleet lock of their key and never with a TTL (`keys.KEPT`: no store expires them):

- **first seen** (`keys.first_seen`): the first time any replica saw each version in its upstream's list. A
  record that is missing (never made, or lost: deleted, flushed, evicted) or unreadable (forged: it fails its
  seal) is no evidence of age: the versions listed when it is made again are recorded as listed *since* now
  with an **unknown** age (`ReleaseTime.known` False), never as seen long ago; versions that appear in a later
  refresh of the list are new from then on. Losing the record can so only lengthen a cooldown.
- **baseline** (`keys.baseline`): the versions an operator recorded as old on purpose
  (`registry-proxy policy baseline`), with who did it. A separate key: losing the first-seen record leaves it.
- **published**: the upstream's own publish time where it gives one, learned without asking for lists: the
  public registry's per-version document (`PublishDates`, asked once for the fleet, for a version a client asks
  for and whose age decides, and for a list's newest versions whose age is unknown), else the `Last-Modified`
  of the release's SHA256SUMS when the proxy fetches it anyway (`note_published`). A version the registry API
  was asked about and gave no date for is recorded so (None), so it is asked once.

A version's age is its first-seen time where one is recorded, else old if baselined, else unknown (at least
since it was listed); a publish time makes it known, the later of the two counting
(`proxy.governance.policy.ReleaseTime`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import structlog

from proxy.domain.addresses import ModuleAddr, ProviderAddr, Version
from proxy.errors import NotFoundError, UpstreamError, UpstreamTimeoutError
from proxy.governance.policy import FIRST_LISTING, NEVER, Policy, ReleaseTime, believed, utc_timestamp
from proxy.metadata_store import MetadataStore, decode_record, encode_record, keys
from proxy.protocol import discovery
from proxy.protocol.publish_dates import REGISTRY_API, SOURCES, parse_published_at, registry_api_url
from proxy.runtime.coalescing import no_recheck
from proxy.runtime.memo import Memo
from proxy.services.documents import INLINE_PARSE_BYTES, DocumentCache
from proxy.services.shared_fetches import SharedFetches
from proxy.settings.config import Settings

log = structlog.get_logger(__name__)
Address = ProviderAddr | ModuleAddr
_SERVICES = {ProviderAddr: "providers.v1", ModuleAddr: "modules.v1"}
UNKNOWN_AGES_ASKED = 16  # a list's newest versions of an unknown age whose publish dates are asked for at once


@dataclass(frozen=True)
class ReleaseRecord:
    """A provider's or module's first-seen record: first-seen times, since when the versions of an unknown age
    have been listed, and publish times by source (a time of None: the source was asked and gave none)."""

    seen: dict[Version, float] = field(default_factory=dict)
    published: dict[Version, dict[str, float | None]] = field(default_factory=dict)
    since: dict[Version, float] = field(default_factory=dict)

    def listed(self) -> frozenset[Version]:
        """Every version the record has a time for (first seen, or listed since)."""
        return frozenset(self.seen.keys() | self.since.keys())

    def asked(self, version: Version, source: str) -> bool:
        """Whether `source` was asked about `version` (or its date learned)."""
        return source in self.published.get(version, {})

    def encode(self) -> bytes:
        return encode_record(
            {
                "v": 2,
                "seen": {str(v): t for v, t in self.seen.items()},
                "since": {str(v): t for v, t in self.since.items()},
                "published": {str(v): dict(dates) for v, dates in self.published.items()},
            }
        )


@dataclass(frozen=True)
class Baseline:
    """The versions an operator recorded as old on purpose (`registry-proxy policy baseline`): when, by whom."""

    versions: dict[Version, float] = field(default_factory=dict)
    by: str = ""

    def encode(self) -> bytes:
        return encode_record({"v": 1, "versions": {str(v): t for v, t in self.versions.items()}, "by": self.by})


@dataclass(frozen=True)
class Releases:
    """What the age of each version of one provider or module counts from: its record and its baseline."""

    record: ReleaseRecord = field(default_factory=ReleaseRecord)
    baseline: Baseline = field(default_factory=Baseline)

    def time_of(self, version: Version) -> ReleaseTime:
        """A recorded first-seen time first, then the baseline (old on purpose), else an unknown age (since
        when it has been listed, at least); with the date of the most trusted source that gave one."""
        dates = self.record.published.get(version, {})
        published, source = None, ""
        for name, text in SOURCES.items():
            if dates.get(name) is not None:
                published, source = dates[name], text
                break
        if version in self.record.seen:
            return ReleaseTime(self.record.seen[version], published, source)
        if version in self.baseline.versions:
            when = utc_timestamp(self.baseline.versions[version])
            basis = f"the baseline recorded by {self.baseline.by or 'an operator'} ({when})"
            return ReleaseTime(FIRST_LISTING, published, source, basis=basis)
        return ReleaseTime(self.record.since.get(version, NEVER), published, source, known=False)

    def times(self) -> dict[Version, ReleaseTime]:
        return {version: self.time_of(version) for version in self.record.listed()}


def read_release_record(raw: bytes | None) -> ReleaseRecord | None:
    """A stored record (None: missing or unreadable, or written before unknown ages were told apart: its
    "seen long ago" is no evidence)."""
    data = decode_record(raw)
    if data is None or data.get("v") != 2:
        return None
    try:
        seen, since = _times(data.get("seen")), _times(data.get("since"))
        published = data.get("published", {})
        dates = {
            Version.parse(text): {
                str(source): None if when is None else float(when) for source, when in by_source.items()
            }
            for text, by_source in (published.items() if isinstance(published, dict) else ())
        }
    except (ValueError, TypeError, AttributeError):
        return None
    return ReleaseRecord(seen, dates, since)


def read_baseline(raw: bytes | None) -> Baseline:
    """A stored baseline (an empty one: missing or unreadable)."""
    data = decode_record(raw)
    if data is None or data.get("v") != 1:
        return Baseline()
    try:
        return Baseline(_times(data.get("versions")), str(data.get("by", "")))
    except (ValueError, TypeError, AttributeError):
        return Baseline()


def _times(found: object) -> dict[Version, float]:
    if not isinstance(found, dict):
        raise TypeError("not a table of versions")
    return {Version.parse(text): float(when) for text, when in found.items()}


def release_time_in(raw: bytes | None, version: Version, baseline: bytes | None = None) -> ReleaseTime:
    """What `version`'s age counts from by the record `raw` and the baseline (no record: an unknown age)."""
    return Releases(read_release_record(raw) or ReleaseRecord(), read_baseline(baseline)).time_of(version)


class PublishDates:
    """The upstream's publish time of one version from the public registry's per-version document."""

    def __init__(self, settings: Settings, documents: DocumentCache) -> None:
        self._settings = settings
        self._documents = documents

    async def offered(self, addr: Address) -> bool:
        """Whether the host of `addr` answers the public registry's per-version documents (dates are asked)."""
        try:
            base = await self._documents.service_url(addr.hostname, _SERVICES[type(addr)])
        except (UpstreamError, UpstreamTimeoutError, NotFoundError):
            return False
        discovered_at = discovery.discovery_url(addr.hostname, self._settings.upstreams.upstream_map)
        return registry_api_url(base, discovered_at, addr, Version.parse("0.0.0")) is not None

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
    """When each version of a provider or module came out as far as the fleet knows (first seen, baselined,
    published), sealed in the metadata store."""

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
        self.changes = 0  # counts the publish times and baselines this process learned (decisions are made again)
        self._known: Memo[str, Releases] = Memo()
        self._writing = asyncio.Lock()  # this process's writes of records, one at a time

    async def times(self, addr: Address, versions: Iterable[Version]) -> Mapping[Version, ReleaseTime]:
        """What the age of every one of `versions` counts from (recording now as the first-seen time of those
        never seen before; in a record made anew, as since when those of an unknown age are listed)."""
        wanted = frozenset(versions)
        key = keys.first_seen(addr)
        known = self._known.get(key)
        if known is not None and wanted <= known.record.listed():
            if wanted.isdisjoint(known.record.since):
                return known.times()
            # some ages are unknown: a baseline recorded meanwhile (by `policy baseline`) decides them now
            baseline = await self._baseline(addr)
            if baseline != known.baseline:
                known = Releases(known.record, baseline)
                self._known.put(key, known)
                self.changes += 1  # decisions remembered before are made again
            return known.times()

        def seeing(stored: ReleaseRecord | None) -> ReleaseRecord | None:
            if stored is not None and wanted <= stored.listed():
                return None  # recorded meanwhile (by another process or replica)
            now = self.clock()
            record = stored or ReleaseRecord()
            new = dict.fromkeys(wanted - record.listed(), now)
            if not record.listed():  # never listed, or lost, flushed, evicted or forged: no evidence of age
                if stored is None:
                    log.warning(
                        "policy.release_times_unknown",
                        artifact=str(addr),
                        versions=len(new),
                        effect="no first-seen record (a first listing, or one lost or forged): the ages of the "
                        "versions listed are unknown, held back by min-age rules with unknown-age = hold until "
                        "dated, baselined (`registry-proxy policy baseline`) or listed for the min-age",
                    )
                return replace(record, since={**record.since, **new})
            return replace(record, seen={**record.seen, **new})

        found = await self._read(key)
        if found is None or not wanted <= found.listed():
            found = await self._shared_fetches.join(key, lambda: self._update(key, seeing), key)
        releases = Releases(found, await self._baseline(addr))
        self._known.put(key, releases)
        return releases.times()

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
        releases = Releases(stored, await self._baseline(addr))
        self._remember(key, releases)
        return releases.time_of(version)

    async def learn_unknown(self, addr: Address, versions: Iterable[Version]) -> None:
        """The registry API's publish dates of the newest `UNKNOWN_AGES_ASKED` of `versions` (whose ages are
        unknown), asked at once, each once for the fleet: a list is not stuck where the upstream dates them."""
        known = self._known.get(keys.first_seen(addr))
        pending = [v for v in versions if known is None or not known.record.asked(v, REGISTRY_API)]
        if not pending or self.dates is None or not await self.dates.offered(addr):
            return
        newest = sorted(pending, key=Version.precedence, reverse=True)[:UNKNOWN_AGES_ASKED]
        await asyncio.gather(*(self.learn(addr, version) for version in newest))

    async def note_published(self, addr: Address, version: Version, when: float, source: str) -> None:
        """A publish time learned on the way (the SHA256SUMS's `Last-Modified`), recorded once per source."""
        key = keys.first_seen(addr)
        dated = believed(when, self.clock())
        record = await self._update(key, lambda r: _with_date(r, version, source, dated))
        self._remember(key, Releases(record, await self._baseline(addr)))
        log.info("policy.publish_time", artifact=f"{addr} {version}", source=source, published=dated)

    async def releases(self, addr: Address) -> Releases:
        """The records of `addr` as stored now (first-seen and baseline)."""
        return Releases(await self._read(keys.first_seen(addr)) or ReleaseRecord(), await self._baseline(addr))

    async def record_baseline(self, addr: Address, versions: Iterable[Version], by: str) -> Baseline:
        """Record `versions` as old on purpose (kept with those baselined before), by `by`."""
        key = keys.baseline(addr)
        now = self.clock()
        async with self._writing, self._shared_fetches.locks.hold(key, no_recheck):
            stored = read_baseline(await self._store.get(key))
            added = {version: now for version in versions if version not in stored.versions}
            baseline = Baseline({**stored.versions, **added}, by)
            await self._store.set(key, baseline.encode())
        self._known.pop(keys.first_seen(addr))
        return baseline

    def _remember(self, key: str, releases: Releases) -> None:
        before = self._known.get(key)
        if (before.record.published if before is not None else {}) != releases.record.published:
            self.changes += 1
        self._known.put(key, releases)

    async def _update(self, key: str, change: Callable[[ReleaseRecord | None], ReleaseRecord | None]) -> ReleaseRecord:
        """Read, change and write the record under `key` (under the fleet lock of the key, and one write at a
        time in this process); `change` returns None when there is nothing to write."""
        async with self._writing, self._shared_fetches.locks.hold(key, no_recheck):
            stored = await self._read(key)
            changed = change(stored)
            if changed is None:
                return stored or ReleaseRecord()
            await self._store.set(key, changed.encode())
            return changed

    async def _read(self, key: str) -> ReleaseRecord | None:
        return read_release_record(await self._store.get(key))

    async def _baseline(self, addr: Address) -> Baseline:
        return read_baseline(await self._store.get(keys.baseline(addr)))


async def warn_if_records_at_risk(policy: Policy, backend: object) -> None:
    """One warning when the policy has a min-age rule and its Redis (`backend`, a `RedisStore`) may lose the
    records the rule depends on: an evicting maxmemory-policy, no persistence, or a configuration it cannot
    read. A lost record makes ages unknown (held back by default), never old."""
    from proxy.metadata_store.redis import RedisStore, durability_risks  # redis-py: only with Redis

    if not isinstance(backend, RedisStore) or not policy.ages:
        return
    risks = durability_risks(await backend.durability())
    if risks:
        log.warning(
            "redis.policy_records_at_risk",
            risks=risks,
            effect="a min-age rule is in force: if Redis loses its first-seen records or baselines, the ages of "
            "those versions become unknown and are held back (unknown-age = hold) until they are dated, "
            "baselined again (`registry-proxy policy baseline`) or listed for the min-age",
        )


def _with_date(stored: ReleaseRecord | None, version: Version, source: str, when: float | None) -> ReleaseRecord | None:
    """`stored` with what `source` says of `version` (None: nothing to write, the source's answer is recorded
    already: the first is kept)."""
    record = stored or ReleaseRecord()
    if record.asked(version, source):
        return None
    dates = {**record.published.get(version, {}), source: when}
    return replace(record, published={**record.published, version: dates})
