"""What the proxy holds and knows, read from the metadata store without contacting any upstream.

`InventoryReader.scan` lists the cached provider archives and module archives (bounded: at most
`limit` listed, the rest counted), each with what the store recorded: size, digest, the key that
signed the release's SHA256SUMS, and when it was last served (`LastServed`, a lookup the
eviction feature fills in). `InventoryReader.hosts` reports each upstream host's last discovery
answer. Both list only what the caller says the client may see (`visible`). `download_info` and
`release_sums_key` (shared with `proxy.commands.bundle`) read a cached archive's download answer and
find its release's signed SHA256SUMS record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

import structlog
from yarl import URL

from proxy.domain.addresses import Platform, ProviderAddr, Version
from proxy.errors import UpstreamError
from proxy.metadata_store import CacheEntry, MetadataStore, keys, records
from proxy.metadata_store.records import ArchiveRecord, ModuleRecord, SumsRecord
from proxy.protocol.provider_registry import DownloadInfo, parse_download
from proxy.settings.config import Settings

log = structlog.get_logger(__name__)

LIST_LIMIT = 500  # archives listed at most on one page; the others are counted
COUNT_LIMIT = 100_000  # keys looked at at most in one scan (a bound on the work one request can cause)
UNSIGNED = "unsigned: its registry lists no keys (checked against SHA256SUMS over TLS)"
A = TypeVar("A", "CachedProvider", "CachedModule")


class LastServed(Protocol):
    """When stored archives were last served, by SHA-256 (archives never served, or not tracked, are absent)."""

    async def last_served(self, sha256s: list[str]) -> dict[str, float]: ...


class NoAccessTimes:
    """A `LastServed` that tracks nothing (until the store records access times)."""

    async def last_served(self, sha256s: list[str]) -> dict[str, float]:
        return {}


@dataclass(frozen=True)
class CachedProvider:
    """One verified provider archive in the store."""

    host: str
    namespace: str
    type: str
    version: str
    platform: str
    sha256: str
    size: int
    filename: str
    signed_by: str = ""  # the signing key's fingerprint (or key id), "" when the record is missing
    last_served: float | None = None

    @property
    def address(self) -> str:
        return f"{self.host}/{self.namespace}/{self.type}"


@dataclass(frozen=True)
class CachedModule:
    """One module archive in the store."""

    host: str
    namespace: str
    name: str
    system: str
    version: str
    sha256: str
    size: int
    source: str
    commit: str = ""
    last_served: float | None = None

    @property
    def address(self) -> str:
        return f"{self.host}/{self.namespace}/{self.name}/{self.system}"


@dataclass(frozen=True)
class Inventory:
    """A bounded listing: what matched `query`, and how many more matched than were listed."""

    providers: list[CachedProvider] = field(default_factory=list)
    modules: list[CachedModule] = field(default_factory=list)
    more: int = 0  # matching archives not listed
    complete: bool = True  # False: the scan stopped at COUNT_LIMIT keys
    problem: str | None = None  # why the store could not be read (nothing listed then)


@dataclass(frozen=True)
class HostHealth:
    """What the proxy knows of one upstream registry host, from its last discovery answer."""

    host: str
    roles: tuple[str, ...]  # "allowed", "default", "mapped"
    mapped_to: str | None
    state: str  # "ok", "not found", "error", "unknown"
    detail: str
    checked_at: float | None


def matches(subject: str, query: str) -> bool:
    """Whether a key subject (`HOST/NS/TYPE/VERSION/PLATFORM`) matches a search: every word is in it
    (case-insensitive; `name@1.2.0` is read as `name/1.2.0`)."""
    text = subject.lower()
    return all(word in text for word in query.lower().replace("@", "/").split())


def provider_of(parts: dict[str, str]) -> tuple[ProviderAddr, Version, Platform]:
    """The provider, version and platform an `archive:` or `download:` key's parts name."""
    return (
        ProviderAddr.parse(parts["host"], parts["namespace"], parts["type"]),
        Version.parse(parts["version"]),
        Platform.parse(parts["platform"]),
    )


def download_info(parts: dict[str, str], download: CacheEntry) -> DownloadInfo:
    """The cached download answer of the provider archive an `archive:`/`download:` key's parts name;
    UpstreamError (or an address error, a ValueError) when it does not parse."""
    addr, version, platform = provider_of(parts)
    return parse_download(download.body, URL(download.url), addr, version, platform)


def release_sums_key(parts: dict[str, str], download: CacheEntry) -> str:
    """The `sums:` key of the signed SHA256SUMS of that archive's release."""
    return keys.sums(download_info(parts, download))


class InventoryReader:
    """Reads the inventory and the upstream hosts' health from the metadata store."""

    def __init__(self, settings: Settings, store: MetadataStore, access: LastServed) -> None:
        self._settings = settings
        self._store = store
        self._access = access

    async def scan(
        self,
        query: str = "",
        limit: int = LIST_LIMIT,
        visible: Callable[[str, str], bool] = lambda host, namespace: True,
    ) -> Inventory:
        """Cached archives matching `query` whose host and namespace are `visible` (the client's scope), at
        most `limit` of them (never raises: a store that cannot be read gives an empty inventory with its
        problem)."""
        try:
            wanted, more, complete = await self._matching_keys(query, limit, visible)
            providers, modules = await self.load(wanted)
        except Exception as exc:  # the page shows the problem instead of failing
            log.warning("inventory.unavailable", error=str(exc) or type(exc).__name__)
            return Inventory(problem=self._store.problem or str(exc) or type(exc).__name__)
        return Inventory(providers, modules, more, complete)

    async def load(self, record_keys: list[str]) -> tuple[list[CachedProvider], list[CachedModule]]:
        """The cached archives that these `archive:` and `module:` keys name (with when each was last served);
        keys whose record is gone or unreadable are left out. Raises when the store cannot be read."""
        providers = await self._providers([k for k in record_keys if k.startswith(keys.ARCHIVE.prefix)])
        modules = await self._modules([k for k in record_keys if k.startswith(keys.MODULE.prefix)])
        served = await self._access.last_served([a.sha256 for a in [*providers, *modules]])
        return [_with_time(p, served) for p in providers], [_with_time(m, served) for m in modules]

    async def _matching_keys(
        self, query: str, limit: int, visible: Callable[[str, str], bool]
    ) -> tuple[list[str], int, bool]:
        wanted: list[str] = []
        more = seen = 0
        for pattern in (keys.ARCHIVE, keys.MODULE):
            async for key in self._store.keys(pattern.prefix):
                seen += 1
                if seen > COUNT_LIMIT:
                    return sorted(wanted), more, False
                parts = pattern.parse(key)
                if (
                    parts is None
                    or not visible(parts["host"], parts["namespace"])
                    or not matches(pattern.subject(key), query)
                ):
                    continue
                if len(wanted) < limit:
                    wanted.append(key)
                else:
                    more += 1
        return sorted(wanted), more, True

    async def _providers(self, archive_keys: list[str]) -> list[CachedProvider]:
        parts = [keys.ARCHIVE.parse(k) or {} for k in archive_keys]
        download_keys = [keys.DOWNLOAD.key_for(p) for p in parts]
        found = await self._store.get_many([*archive_keys, *download_keys])
        archives, downloads = found[: len(archive_keys)], found[len(archive_keys) :]
        sums_keys: list[str | None] = []
        for part, raw in zip(parts, downloads, strict=True):
            entry = CacheEntry.decode(raw)
            try:
                sums_keys.append(release_sums_key(part, entry) if entry and not entry.negative else None)
            except (UpstreamError, ValueError):
                sums_keys.append(None)
        unique = sorted({k for k in sums_keys if k})
        signers = {
            k: _signer(records.decode(raw, SumsRecord))
            for k, raw in zip(unique, await self._store.get_many(unique), strict=True)
        }
        listed = []
        for part, raw, sums_key in zip(parts, archives, sums_keys, strict=True):
            record = records.decode(raw, ArchiveRecord)
            if record is None:
                continue
            signer = UNSIGNED if record.unsigned else signers.get(sums_key, "") if sums_key else ""
            listed.append(
                CachedProvider(
                    part["host"],
                    part["namespace"],
                    part["type"],
                    part["version"],
                    part["platform"],
                    record.sha256,
                    record.size,
                    record.filename,
                    signer,
                )
            )
        return listed

    async def _modules(self, module_keys: list[str]) -> list[CachedModule]:
        listed = []
        for key, raw in zip(module_keys, await self._store.get_many(module_keys), strict=True):
            part, record = keys.MODULE.parse(key) or {}, records.decode(raw, ModuleRecord)
            if record is None or not part:
                continue
            listed.append(
                CachedModule(
                    part["host"],
                    part["namespace"],
                    part["name"],
                    part["system"],
                    part["version"],
                    record.sha256,
                    record.size,
                    record.source,
                    record.commit,
                )
            )
        return listed

    async def hosts(self, visible: Callable[[str], bool] = lambda host: True) -> list[HostHealth]:
        """Every host clients may ask for that is `visible` (the client's scope), with its last discovery
        answer (never fetched here)."""
        settings = self._settings
        names = sorted(
            name
            for name in settings.upstreams.all_allowed_hosts | {str(settings.upstreams.default_upstream)}
            if visible(name)
        )
        try:
            found = await self._store.get_many([keys.discovery(name) for name in names])
        except Exception as exc:  # the page shows the hosts without their state
            log.warning("inventory.hosts_unavailable", error=str(exc) or type(exc).__name__)
            found = [None] * len(names)
        return [_health(settings, name, CacheEntry.decode(raw)) for name, raw in zip(names, found, strict=True)]


def _signer(record: SumsRecord | None) -> str:
    return (record.fingerprint or record.key_id) if record else ""


def _with_time(item: A, served: dict[str, float]) -> A:
    when = served.get(item.sha256)
    return item if when is None else replace(item, last_served=when)


def _roles(settings: Settings, name: str) -> Iterable[str]:
    if name in settings.upstreams.allowed_hosts:
        yield "allowed"
    if name in settings.upstreams.upstream_map:
        yield "mapped"
    if name == str(settings.upstreams.default_upstream):
        yield "default"


def _health(settings: Settings, name: str, entry: CacheEntry | None) -> HostHealth:
    mapped = settings.upstreams.upstream_map.get(name)
    roles = tuple(_roles(settings, name))
    if entry is None:
        detail = (
            "never contacted: the proxy is offline"
            if settings.upstreams.offline
            else "not contacted yet (discovery runs on the first request for this host)"
        )
        return HostHealth(name, roles, str(mapped) if mapped else None, "unknown", detail, None)
    if entry.negative:
        state, detail = "not found", f"the last discovery answered {entry.status}"
    else:
        state, detail = "ok", "discovery document cached"
    return HostHealth(name, roles, str(mapped) if mapped else None, state, detail, entry.fetched_at)
