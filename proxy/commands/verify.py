"""`registry-proxy verify`: re-hash every object of a data dir's archive store (directory or S3).

An object is intact when its content hashes to its name (`sha256/ab/cd/<sha256>`, or the key
`PREFIX<sha256>` in object storage). With
`--repair` corrupt objects are moved to the quarantine (a running proxy fetches and
verifies them again on the next request) and abandoned temp dirs are removed. Safe to run
next to a running proxy: nothing is written without `--repair`, and a live process's temp
dir is recognised by its lock.

With the data dir's metadata store (or the fleet's Redis), every provider archive record is held to
the verification chain again (`proxy.providers.verification`), from what the store recorded: the release's SHA256SUMS
signature verified anew with the keys of its download document (in a keyring of its own, so the
proxy's is not written), the archive's line, its digest and its signing state; a record that fails
is listed (a running proxy would not serve it). It also lists the provider archives stored unsigned
(`--unsigned-providers`: their registry lists no signing keys), so an operator sees what was
admitted on TLS and checksums alone; whether they are still served is that option's decision, so
their records are checked against their SHA256SUMS (fetched over TLS) and `shasum` only.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from proxy.domain.unsigned_policy import UnsignedPolicy
from proxy.errors import UpstreamError, VerificationError
from proxy.governance.inventory import download_info, provider_of
from proxy.metadata_store import CacheEntry, MetadataStore, keys, records
from proxy.metadata_store.records import ArchiveRecord, SumsRecord
from proxy.providers.signatures import Keyring
from proxy.providers.verification import VerificationChain
from proxy.runtime.progress import Progress
from proxy.storage import ArchiveStore


@dataclass(frozen=True, order=True)
class UnsignedArchive:
    """A stored provider archive whose registry listed no signing keys."""

    provider: str  # HOST/NAMESPACE/TYPE
    version: str
    platform: str
    filename: str
    sha256: str


@dataclass(frozen=True, order=True)
class RefusedArchive:
    """A provider archive record that fails the verification chain, and why."""

    provider: str  # HOST/NAMESPACE/TYPE
    version: str
    platform: str
    sha256: str
    reason: str


@dataclass
class VerifyReport:
    objects: int = 0
    bytes: int = 0
    corrupt: dict[str, str] = field(default_factory=dict)  # sha256 → what is wrong
    quarantined: dict[str, Path | str] = field(default_factory=dict)  # sha256 → where it went
    strays: list[Path | str] = field(default_factory=list)  # files (keys) not named by a digest at their place
    abandoned_temp_dirs: list[Path] = field(default_factory=list)
    removed_temp_dirs: list[Path] = field(default_factory=list)
    live_temp_dirs: int = 0
    quarantine_files: int = 0
    unsigned: list[UnsignedArchive] = field(default_factory=list)
    refused: list[RefusedArchive] = field(default_factory=list)  # records the chain refuses
    unchecked: int = 0  # records whose download document or SHA256SUMS is not recorded

    @property
    def unrepaired(self) -> int:
        return len(set(self.corrupt) - set(self.quarantined))

    @property
    def failed(self) -> bool:
        """Whether anything found is wrong and left so: corrupt objects, or records the chain refuses."""
        return bool(self.unrepaired or self.refused)


async def verify_store(store: ArchiveStore, *, repair: bool = False, progress: Progress | None = None) -> VerifyReport:
    """Hash every stored object; with `repair`, quarantine corrupt ones and reap temp dirs. `progress` counts the
    objects, and the bytes as they are hashed."""
    progress = progress or Progress.silent()
    report = VerifyReport()
    objects, report.strays = await _inventory(store)
    progress.total(len(objects))

    def hashed(count: int) -> None:
        progress.advance(0, bytes=count)

    for sha, _ in objects:
        result = await store.check(sha, hashed)
        progress.advance()
        if result is None:  # removed meanwhile (a running proxy quarantined it)
            continue
        report.objects += 1
        report.bytes += result.stored.size
        if result.intact:
            continue
        report.corrupt[sha] = f"content hashes to {result.actual}"
        if repair:
            moved = await store.quarantine(sha, result.stored.version)
            if moved is not None:
                report.quarantined[sha] = moved
    report.abandoned_temp_dirs = store.abandoned_temp_dirs()
    report.live_temp_dirs = len(store.temp_dirs()) - len(report.abandoned_temp_dirs)
    if repair:
        for folder in report.abandoned_temp_dirs:
            store.remove_temp_dir(folder)
            report.removed_temp_dirs.append(folder)
    report.quarantine_files = len(await store.quarantined())
    return report


async def check_records(report: VerifyReport, cache: MetadataStore) -> None:
    """Hold every provider archive record of the metadata store to the verification chain; list those it
    refuses and those stored unsigned (sorted) in `report`."""
    with tempfile.TemporaryDirectory(prefix="registry-proxy-verify-") as home:
        keyring = Keyring(Path(home) / "gnupg")
        try:
            async for key in cache.keys():
                parts = keys.ARCHIVE.parse(key)
                record = None if parts is None else records.decode(await cache.get(key), ArchiveRecord)
                if parts is None or record is None:
                    continue
                provider = f"{parts['host']}/{parts['namespace']}/{parts['type']}"
                if record.unsigned:
                    report.unsigned.append(
                        UnsignedArchive(provider, parts["version"], parts["platform"], record.filename, record.sha256)
                    )
                reason = await _refusal(keyring, cache, parts, record)
                if reason is None:
                    continue
                if reason:
                    report.refused.append(
                        RefusedArchive(provider, parts["version"], parts["platform"], record.sha256, reason)
                    )
                else:
                    report.unchecked += 1
        finally:
            await asyncio.to_thread(keyring.close)
    report.unsigned.sort()
    report.refused.sort()


async def _refusal(keyring: Keyring, cache: MetadataStore, parts: dict[str, str], record: ArchiveRecord) -> str | None:
    """Why the chain refuses a stored archive's record (None: it holds; "": what it needs is not recorded)."""
    entry = CacheEntry.decode(await cache.get(keys.DOWNLOAD.key_for(parts)))
    if entry is None or entry.negative:
        return ""
    try:
        addr, version, _ = provider_of(parts)
        d = download_info(parts, entry)
    except (UpstreamError, ValueError) as exc:
        return f"its download document does not parse: {getattr(exc, 'message', exc)}"
    host = str(addr.hostname)
    found = await cache.get_many([keys.sums(d), keys.sums(d, scope=host)])  # a private host's has its own
    recorded = next((r for r in (records.decode(raw, SumsRecord) for raw in found) if r is not None), None)
    if recorded is None:
        return ""
    # Unsigned records are checked as the policy that stored them admitted them (listed as UNSIGNED).
    chain = VerificationChain(keyring, UnsignedPolicy(frozenset({host}), "allow-hosts"))
    try:
        sums = await asyncio.to_thread(chain.verify_sums, addr, version, d, recorded.sums, recorded.signature)
    except VerificationError as exc:
        return exc.message
    if not chain.agrees(record, d, sums):
        return "the record disagrees with the signed SHA256SUMS of its download"
    return None


async def _inventory(store: ArchiveStore) -> tuple[list[tuple[str, int]], list[Path | str]]:
    """The objects at content addresses (SHA-256, size), and what else lies where they are kept."""
    return [(o.sha256, o.size) for o in await store.list_objects()], list(await store.strays())


def summary_lines(report: VerifyReport) -> list[str]:
    lines = []
    for sha, reason in report.corrupt.items():
        moved = report.quarantined.get(sha)
        lines.append(f"CORRUPT {sha}: {reason}" + (f"; quarantined to {moved}" if moved else ""))
    lines.extend(f"stray file (not at its content address, never served): {path}" for path in report.strays)
    for folder in report.abandoned_temp_dirs:
        removed = "removed" if folder in report.removed_temp_dirs else "remove with --repair"
        lines.append(f"abandoned temp dir: {folder} ({removed})")
    lines.extend(
        f"UNSIGNED {a.provider} {a.version} {a.platform} {a.filename} sha256={a.sha256}: its registry lists "
        "no signing keys; checked against SHA256SUMS and the registry's shasum only"
        for a in report.unsigned
    )
    lines.extend(
        f"REFUSED {a.provider} {a.version} {a.platform} sha256={a.sha256}: {a.reason} (never served; fetched "
        "again when asked for)"
        for a in report.refused
    )
    lines.append(
        f"verify: {report.objects} objects ({report.bytes} bytes), {len(report.corrupt)} corrupt, "
        f"{len(report.quarantined)} quarantined, {len(report.strays)} stray, "
        f"{len(report.abandoned_temp_dirs)} abandoned temp dir(s), {report.live_temp_dirs} in use, "
        f"{report.quarantine_files} file(s) in quarantine, {len(report.unsigned)} unsigned, "
        f"{len(report.refused)} refused by the verification chain, {report.unchecked} not checkable"
    )
    return lines
