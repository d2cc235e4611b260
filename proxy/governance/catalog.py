"""The catalog of what the proxy caches, and its purge: one service for `GET /api/v1/catalog`, `DELETE
/api/v1/catalog/ADDRESS[@VERSION]` and `registry-proxy purge ADDRESS[@VERSION]`.

`Catalog.page` lists cached providers (address, versions, platforms, sizes, digests, signer, last served)
and modules, grouped by address in address order, only those the caller may see (`visible`: the
client's scope, as on the page), a page of at most `limit` addresses at a time with a cursor for the next.

`Catalog.purge` is the one call that purges (the audit trail hooks it): it removes the target's
records from the metadata store (Redis or the embedded store: every replica reads the same), removes
each of their archives from the archive store (a directory or S3) unless another record still refers to
it by content, writes a new purge mark so that every worker and replica drops its in-memory copies
(`proxy.metadata_store.memory.MemoryFront.follow_purges`), waits until each must have seen it, and logs one
`catalog.purged` event naming who purged what. A request that arrives after the purge returns fetches
the purged versions from their upstream again, in every process.

Uses only the public face of the archive storage package, `proxy.storage` (`ArchiveStore.remove`,
`ServedTimes.forget_served`); a download under way when
the purge runs may write its record again afterwards (as after an eviction, the proxy then fetches the
archive again when it is asked for).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from proxy.domain.addresses import AddressError, ModuleAddr, ProviderAddr, Version
from proxy.errors import InvalidAddressError, InvalidRequestError, NotCachedError, UpstreamError
from proxy.governance.inventory import COUNT_LIMIT, CachedModule, CachedProvider, InventoryReader, download_info
from proxy.metadata_store import CacheEntry, MetadataStore, keys, records
from proxy.metadata_store.memory import PURGE_CHECK_INTERVAL
from proxy.metadata_store.records import ArchiveRecord, ModuleRecord
from proxy.runtime.progress import Progress
from proxy.storage import ArchiveStore, ServedTimes

log = structlog.get_logger(__name__)

PAGE_LIMIT = 100  # addresses on one page unless the client asks for fewer
MAX_PAGE_LIMIT = 500
Visible = Callable[[str, str], bool]


# ---- what a purge names (pure) -----------------------------------------------------------------


@dataclass(frozen=True)
class PurgeTarget:
    """A provider (`HOST/NAMESPACE/TYPE`) or module (`HOST/NAMESPACE/NAME/SYSTEM`), all its versions or one."""

    kind: str  # "provider" or "module"
    address: str  # normalised
    host: str
    namespace: str
    version: str | None = None

    @classmethod
    def parse(cls, text: str) -> PurgeTarget:
        """`ADDRESS[@VERSION]`; InvalidAddressError saying what is wrong."""
        address, at, version_text = text.strip().strip("/").partition("@")
        parts = address.split("/")
        try:
            version = str(Version.parse(version_text)) if at else None
            if len(parts) == 3:
                provider = ProviderAddr.parse(*parts)
                return cls("provider", str(provider), str(provider.hostname), provider.namespace, version)
            if len(parts) == 4:
                module = ModuleAddr.parse(*parts)
                return cls("module", str(module), str(module.hostname), module.namespace, version)
        except AddressError as exc:
            raise InvalidAddressError(f"{text[:200]!r}: {exc}") from None
        raise InvalidAddressError(
            f"{text[:200]!r}: give a provider HOST/NAMESPACE/TYPE or a module HOST/NAMESPACE/NAME/SYSTEM, "
            "optionally @VERSION (e.g. registry.terraform.io/hashicorp/aws@5.31.0)"
        )

    def __str__(self) -> str:
        return self.address + (f"@{self.version}" if self.version else "")

    def patterns(self) -> tuple[keys.KeyPattern, ...]:
        """The kinds of record a purge of this target removes: per version, and the version list when all go."""
        per_version = (keys.ARCHIVE, keys.DOWNLOAD) if self.kind == "provider" else (keys.MODULE, keys.MODULE_DOWNLOAD)
        listing = keys.VERSIONS if self.kind == "provider" else keys.MODULE_VERSIONS
        return per_version if self.version else (*per_version, listing)

    def names(self, pattern: keys.KeyPattern, key: str) -> bool:
        """Whether `key` (of `pattern`) is one of this target's records."""
        parts = pattern.parse(key)
        if parts is None or _address(parts) != self.address:
            return False
        return self.version is None or "version" not in parts or _same_version(parts["version"], self.version)


def _address(parts: dict[str, str]) -> str:
    fields = ("host", "namespace", "type") if "type" in parts else ("host", "namespace", "name", "system")
    return "/".join(parts[name] for name in fields)


def _same_version(text: str, version: str) -> bool:
    try:
        return str(Version.parse(text)) == version
    except AddressError:
        return False


# ---- the catalog's pages (pure) ----------------------------------------------------------------


def encode_cursor(entry: tuple[str, str]) -> str:
    """The opaque cursor after `entry` (its kind and address)."""
    return base64.urlsafe_b64encode("\0".join(entry).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, str]:
    try:
        kind, _, address = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode().partition("\0")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidRequestError("the catalog cursor is malformed: use the `next` of the previous page") from None
    if kind not in ("module", "provider") or not address:
        raise InvalidRequestError("the catalog cursor is malformed: use the `next` of the previous page")
    return kind, address


def parse_limit(text: str | None) -> int:
    if text is None:
        return PAGE_LIMIT
    if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE_LIMIT:
        raise InvalidRequestError(f"limit must be a whole number from 1 to {MAX_PAGE_LIMIT}")
    return int(text)


def _version_order(text: str) -> tuple:
    try:
        return (0, Version.parse(text))
    except AddressError:
        return (1, text)


def provider_entry(address: str, archives: list[CachedProvider]) -> dict:
    """One provider's catalog entry: its versions (newest first), each with its platforms' archives."""
    versions: dict[str, list[dict]] = {}
    for item in sorted(archives, key=lambda a: a.platform):
        versions.setdefault(item.version, []).append(
            {
                "platform": item.platform,
                "filename": item.filename,
                "size": item.size,
                "sha256": item.sha256,
                "signed_by": item.signed_by or None,
                "last_served": item.last_served,
            }
        )
    ordered = sorted(versions, key=_version_order, reverse=True)
    return {
        "address": address,
        "versions": [{"version": v, "platforms": versions[v]} for v in ordered],
        "size": sum(item.size for item in archives),
    }


def module_entry(address: str, archives: list[CachedModule]) -> dict:
    """One module's catalog entry: its cached versions (newest first)."""
    ordered = sorted(archives, key=lambda a: _version_order(a.version), reverse=True)
    return {
        "address": address,
        "versions": [
            {
                "version": item.version,
                "size": item.size,
                "sha256": item.sha256,
                "source": item.source,
                "commit": item.commit or None,
                "last_served": item.last_served,
            }
            for item in ordered
        ],
        "size": sum(item.size for item in archives),
    }


@dataclass(frozen=True)
class CatalogPage:
    providers: list[dict] = field(default_factory=list)
    modules: list[dict] = field(default_factory=list)
    next: str | None = None  # the cursor of the next page; None on the last
    complete: bool = True  # False: the store holds more records than one listing looks at (COUNT_LIMIT)

    def document(self) -> dict:
        return {"providers": self.providers, "modules": self.modules, "next": self.next, "complete": self.complete}


# ---- the purge's outcome -----------------------------------------------------------------------


@dataclass(frozen=True)
class PurgeReport:
    target: str
    who: str
    records: list[str]  # the metadata keys removed
    archives_removed: list[str]  # SHA-256s removed from the archive store
    archives_kept: list[str]  # SHA-256s another record still refers to (or, when a record could not be read, all)
    freed_bytes: int
    unreadable: list[str] = field(default_factory=list)  # records that could not be read: no archive removed

    def document(self) -> dict:
        return {
            "purged": self.target,
            "by": self.who,
            "records": self.records,
            "archives_removed": self.archives_removed,
            "archives_kept": self.archives_kept,
            "freed_bytes": self.freed_bytes,
            "unreadable_records": self.unreadable,
        }


# ---- the service -------------------------------------------------------------------------------


class Catalog:
    """The catalog's pages and the purge, over the metadata store (the app's: behind its memory front) and the
    archive store."""

    def __init__(
        self,
        metadata: MetadataStore,
        archives: ArchiveStore,
        served: ServedTimes,
        inventory: InventoryReader,
        *,
        settle: float = PURGE_CHECK_INTERVAL,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._metadata = metadata
        self._archives = archives
        self._served = served
        self._inventory = inventory
        self._settle = settle  # how long every process may take to see a new purge mark
        self._sleep = sleep

    async def page(self, visible: Visible, *, after: str | None = None, limit: int = PAGE_LIMIT) -> CatalogPage:
        """The cached providers and modules `visible` to the caller, `limit` addresses after the cursor `after`."""
        start = decode_cursor(after) if after else None
        grouped, complete = await self._visible_records(visible)
        entries = sorted(entry for entry in grouped if start is None or entry > start)
        chosen, rest = entries[:limit], entries[limit:]
        providers, modules = await self._inventory.load([key for entry in chosen for key in grouped[entry]])
        found: dict[tuple[str, str], list] = {}
        for item in providers:
            found.setdefault(("provider", item.address), []).append(item)
        for item in modules:
            found.setdefault(("module", item.address), []).append(item)
        return CatalogPage(
            providers=[provider_entry(a, found[(k, a)]) for k, a in chosen if k == "provider" and (k, a) in found],
            modules=[module_entry(a, found[(k, a)]) for k, a in chosen if k == "module" and (k, a) in found],
            next=encode_cursor(chosen[-1]) if rest else None,
            complete=complete,
        )

    async def _visible_records(self, visible: Visible) -> tuple[dict[tuple[str, str], list[str]], bool]:
        """The `archive:` and `module:` keys the caller may see, by (kind, address); bounded by COUNT_LIMIT."""
        grouped: dict[tuple[str, str], list[str]] = {}
        seen = 0
        for kind, pattern in (("provider", keys.ARCHIVE), ("module", keys.MODULE)):
            async for key in self._metadata.keys(pattern.prefix):
                seen += 1
                if seen > COUNT_LIMIT:
                    return grouped, False
                parts = pattern.parse(key)
                if parts is None or not visible(parts["host"], parts["namespace"]):
                    continue
                grouped.setdefault((kind, _address(parts)), []).append(key)
        return grouped, True

    async def purge(self, target: PurgeTarget, who: str, progress: Progress | None = None) -> PurgeReport:
        """Remove `target`'s records and the archives nothing else refers to, everywhere; NotCachedError when
        nothing of it is cached. `who` names the caller in the log (a token's name, `cli:USER`); `progress`
        counts the records removed, with the bytes of the archives."""
        progress = progress or Progress.silent()
        doomed: list[str] = []
        for pattern in target.patterns():  # every key of the target starts with its kind and address
            doomed += [
                key async for key in self._metadata.keys(pattern.prefix + target.address) if target.names(pattern, key)
            ]
        if not doomed:
            raise NotCachedError(f"nothing of {target} is cached")
        doomed += await self._release_sums(target, [k for k in doomed if k.startswith(keys.DOWNLOAD.prefix)])
        record_keys = [k for k in doomed if k.startswith((keys.ARCHIVE.prefix, keys.MODULE.prefix))]
        found = await self._metadata.get_many(record_keys) if record_keys else []
        digests = {r.sha256 for r in map(_decode, record_keys, found) if r is not None and r.sha256}
        progress.total(len(doomed))
        progress.note(f"removing {len(doomed)} records of {target}")
        for key in sorted(doomed):
            await self._metadata.delete(key)
            progress.advance()
        # every process drops its copies of the records now; the archives go once nothing refers to them
        await self._metadata.set(keys.PURGES, f"{time.time():.6f} {secrets.token_hex(8)}".encode())
        progress.note(f"removing {len(digests)} archives unless another record refers to them")
        referenced, unreadable = await self._referenced()
        removed, kept, freed = [], [], 0
        for sha256 in sorted(digests):
            if unreadable or sha256 in referenced:
                kept.append(sha256)
                continue
            size = await self._archives.remove(sha256)
            if size:
                removed.append(sha256)
                freed += size
                progress.advance(0, bytes=size)
        if removed:
            await self._served.forget_served(removed)
        progress.note(f"waiting {self._settle:g}s for every process to see the purge")
        await self._sleep(self._settle)  # every process reads the new mark before its next request
        report = PurgeReport(str(target), who, sorted(doomed), removed, kept, freed, unreadable)
        log.info(
            "catalog.purged",
            who=who,
            what=str(target),
            kind=target.kind,
            records=len(doomed),
            archives_removed=removed,
            archives_kept=kept,
            freed_bytes=freed,
            unreadable_records=len(unreadable),
        )
        return report

    async def _release_sums(self, target: PurgeTarget, download_keys: list[str]) -> list[str]:
        """The verified SHA256SUMS records of the purged provider releases: an upstream that publishes the release
        again (at the same URLs) is checked against its new SHA256SUMS, not the one recorded before."""
        found = await self._metadata.get_many(download_keys) if download_keys else []
        candidates: set[str] = set()
        for key, raw in zip(download_keys, found, strict=True):
            entry, parts = CacheEntry.decode(raw), keys.DOWNLOAD.parse(key)
            if entry is None or entry.negative or parts is None:
                continue
            try:
                info = download_info(parts, entry)
            except (UpstreamError, ValueError):
                continue
            candidates |= {keys.sums(info), keys.sums(info, scope=target.host)}  # as a public or a private host
        names = sorted(candidates)
        present = await self._metadata.get_many(names) if names else []
        return [name for name, raw in zip(names, present, strict=True) if raw is not None]

    async def _referenced(self) -> tuple[set[str], list[str]]:
        """The SHA-256 of every archive a remaining record names, and the records that could not be read."""
        found: set[str] = set()
        unreadable: list[str] = []
        for pattern in (keys.ARCHIVE, keys.MODULE):
            names = [key async for key in self._metadata.keys(pattern.prefix)]
            for offset in range(0, len(names), 500):
                batch = names[offset : offset + 500]
                for name, raw in zip(batch, await self._metadata.get_many(batch), strict=True):
                    record = _decode(name, raw)
                    if record is None:
                        if raw is not None:
                            unreadable.append(name)
                        continue
                    found.add(record.sha256)
        return found, unreadable


def _decode(key: str, raw: bytes | None) -> ArchiveRecord | ModuleRecord | None:
    if raw is None:
        return None
    return records.decode(raw, ArchiveRecord if key.startswith(keys.ARCHIVE.prefix) else ModuleRecord)
