"""`registry-proxy verify`: re-hash every object of a data dir's archive store (directory or S3).

An object is intact when its content hashes to its name (`sha256/ab/cd/<sha256>`, or the key
`PREFIX<sha256>` in object storage). With
`--repair` corrupt objects are moved to the quarantine (a running proxy fetches and
verifies them again on the next request) and abandoned temp dirs are removed. Safe to run
next to a running proxy: nothing is written without `--repair`, and a live process's temp
dir is recognised by its lock. With the data dir's metadata store (or the fleet's Redis), it also
lists the provider archives stored unsigned (`--unsigned-providers`: their registry lists no signing
keys), so an operator sees what was admitted on TLS and checksums alone.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from proxy import records
from proxy.cache import MetadataStore, keys
from proxy.records import ArchiveRecord
from proxy.storage import ArchiveStore


@dataclass(frozen=True, order=True)
class UnsignedArchive:
    """A stored provider archive whose registry listed no signing keys."""

    provider: str  # HOST/NAMESPACE/TYPE
    version: str
    platform: str
    filename: str
    sha256: str


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

    @property
    def unrepaired(self) -> int:
        return len(set(self.corrupt) - set(self.quarantined))


async def verify_store(store: ArchiveStore, *, repair: bool = False, progress: bool | None = None) -> VerifyReport:
    """Hash every stored object; with `repair`, quarantine corrupt ones and reap temp dirs."""
    report = VerifyReport()
    objects, report.strays = await _inventory(store)
    total = sum(size for _, size in objects)
    show = sys.stderr.isatty() if progress is None else progress
    with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="verify", disable=not show) as bar:
        for sha, _ in objects:
            result = await store.check(sha, bar.update)
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


async def unsigned_archives(cache: MetadataStore) -> list[UnsignedArchive]:
    """Every provider archive record of the metadata store marked unsigned, sorted."""
    found = []
    async for key in cache.keys():
        parts = keys.ARCHIVE.parse(key)
        if parts is None:
            continue
        record = records.decode(await cache.get(key), ArchiveRecord)
        if record is not None and record.unsigned:
            found.append(
                UnsignedArchive(
                    f"{parts['host']}/{parts['namespace']}/{parts['type']}",
                    parts["version"],
                    parts["platform"],
                    record.filename,
                    record.sha256,
                )
            )
    return sorted(found)


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
    lines.append(
        f"verify: {report.objects} objects ({report.bytes} bytes), {len(report.corrupt)} corrupt, "
        f"{len(report.quarantined)} quarantined, {len(report.strays)} stray, "
        f"{len(report.abandoned_temp_dirs)} abandoned temp dir(s), {report.live_temp_dirs} in use, "
        f"{report.quarantine_files} file(s) in quarantine, {len(report.unsigned)} unsigned"
    )
    return lines
