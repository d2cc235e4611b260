"""`registry-proxy gc`: remove what nothing needs from a data dir's archive store and metadata.

Goes: archives no metadata record refers to (and served and stored longer ago than the grace),
temp dirs of dead processes, unfinished multipart uploads (object storage) and quarantined objects
older than the grace, and expired remembered 404s
(Redis's bookkeeping of them, and any left in the persistent store by older versions). Safe next to
running replicas: a referenced archive is never removed; an unreferenced one served or stored within
the grace (a record being written, a response under way elsewhere) stays; a temp dir whose process
lives (it holds its lock) is never touched, so no download is. When any archive record cannot be
read (a wrong --metadata-secret, a forged value), no archive is removed: it might be that record's.
Strays (files or keys where archives are kept that are not at a content address) are reported, never
removed: the proxy writes none, so they are nobody's it knows of. With `dry_run` nothing is removed;
the report says what would go. The store says what it holds (`ArchiveStore.leftovers`), so gc is the
same for a directory and a bucket.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from proxy.metadata_store import CacheEntry, MetadataStore
from proxy.metadata_store import keys as key_scheme
from proxy.metadata_store.negative import NegativeBound, is_negative
from proxy.metadata_store.records import ArchiveRecord, ModuleRecord, decode
from proxy.runtime.progress import Progress
from proxy.storage import REMOVABLE, STRAY, ArchiveStore, Leftover, ServedTimes, orphans

_RECORD_KINDS = ((key_scheme.ARCHIVE, ArchiveRecord), (key_scheme.MODULE, ModuleRecord))


@dataclass(frozen=True)
class Garbage:
    """One thing gc removes: its kind, what names it, and the bytes it frees."""

    kind: str  # "archive", "temp", "upload", "quarantine", "negative" (Redis), "old-negative" (persistent store)
    name: str
    bytes: int
    leftover: Leftover | None = None  # what the store names it by, for all but archives and 404s


@dataclass
class GcReport:
    garbage: list[Garbage] = field(default_factory=list)
    removed: list[Garbage] = field(default_factory=list)
    referenced: int = 0
    kept_recent: int = 0  # unreferenced archives used within the grace
    unreadable: list[str] = field(default_factory=list)  # archive/module record keys that could not be read
    strays: list[Leftover] = field(default_factory=list)  # reported, never removed

    @property
    def bytes(self) -> int:
        return sum(item.bytes for item in self.garbage)


async def collect(
    metadata: NegativeBound,
    store: ArchiveStore,
    times: ServedTimes,
    *,
    grace: float,
    negative_retention: float,
    dry_run: bool,
    now: float | None = None,
    progress: Progress | None = None,
) -> GcReport:
    """Find (and unless `dry_run`, remove) the garbage of `store` and `metadata` (the archives' last-served
    `times` keep recently used ones); raises if the metadata cannot be listed (a partial listing must never
    make referenced archives look orphaned). `progress` counts the items removed (found, in a dry run)."""
    now = time.time() if now is None else now
    progress = progress or Progress.silent()
    report = GcReport()
    progress.note("reading the archive and module records")
    referenced = await _referenced(metadata, report)
    served = await times.served_times()
    objects = await store.list_objects()
    report.referenced = sum(1 for obj in objects if obj.sha256 in referenced)
    progress.note(f"{len(objects)} archives stored, {report.referenced} of them referenced by a record")
    unreferenced = [obj for obj in objects if obj.sha256 not in referenced]
    unused = [] if report.unreadable else orphans(unreferenced, referenced, served, now=now, grace=grace)
    report.kept_recent = 0 if report.unreadable else len(unreferenced) - len(unused)
    report.garbage += [Garbage("archive", obj.sha256, obj.size) for obj in unused]
    leftovers = await store.leftovers(now - grace)
    report.garbage += [Garbage(item.kind, item.name, item.size, item) for item in leftovers if item.kind in REMOVABLE]
    report.strays = [item for item in leftovers if item.kind == STRAY]
    progress.note("looking for expired 404s")
    report.garbage += await _expired_negatives(metadata, now, negative_retention)
    progress.total(len(report.garbage))
    if dry_run:
        progress.advance(len(report.garbage), bytes=report.bytes)
    else:
        progress.note(f"removing {len(report.garbage)} items ({report.bytes} bytes)")
        await _remove(metadata, store, times, report, progress)
    return report


async def _referenced(metadata: MetadataStore, report: GcReport) -> set[str]:
    """The SHA-256 of every archive an archive or module record names."""
    found: set[str] = set()
    for pattern, kind in _RECORD_KINDS:
        names = [key async for key in metadata.keys(pattern.prefix)]
        values = await metadata.get_many(names) if names else []
        for name, raw in zip(names, values, strict=True):
            record = decode(raw, kind) if raw is not None else None
            if record is None:  # listed, yet unreadable: refused by the seal, or not a record (or gone meanwhile)
                report.unreadable.append(name)
                continue
            if record.sha256:
                found.add(record.sha256)
    return found


async def _expired_negatives(metadata: NegativeBound, now: float, retention: float) -> list[Garbage]:
    garbage = [Garbage("negative", name, size) for name, size in await metadata.negatives.expired(now)]
    # remembered 404s that older versions wrote into the persistent store itself
    names = [key async for key in metadata.keys()]  # noqa: SIM118 - an async iterator, not a dict
    for offset in range(0, len(names), 500):
        batch = names[offset : offset + 500]
        for name, raw in zip(batch, await metadata.get_many(batch), strict=True):
            if raw is None or not is_negative(raw):
                continue
            entry = CacheEntry.decode(raw)
            if entry is not None and not 0 <= now - entry.fetched_at < retention:
                garbage.append(Garbage("old-negative", name, len(name) + len(raw)))
    return garbage


async def _remove(
    metadata: NegativeBound, store: ArchiveStore, times: ServedTimes, report: GcReport, progress: Progress
) -> None:
    archives: list[str] = []
    for item in report.garbage:
        removed = len(report.removed)
        if item.kind == "archive":
            if await store.remove(item.name):
                archives.append(item.name)
                report.removed.append(item)
        elif item.leftover is not None:  # a temp dir only if still abandoned
            if await store.remove_leftover(item.leftover):
                report.removed.append(item)
        elif item.kind == "negative":
            await metadata.negatives.discard(item.name)
            report.removed.append(item)
        elif item.kind == "old-negative":
            await metadata.delete(item.name)
            report.removed.append(item)
        progress.advance(bytes=item.bytes if len(report.removed) > removed else 0)
    await times.forget_served(archives)


def report_lines(report: GcReport, *, dry_run: bool) -> list[str]:
    """One line per object (what, bytes, name), then the total."""
    verb = "would remove" if dry_run else "removed"
    items = report.garbage if dry_run else report.removed
    lines = [f"{verb:<12}  {item.kind:<12}  {item.bytes:>14}  {item.name}" for item in items]
    lines += [f"{'kept':<12}  {'stray':<12}  {item.size:>14}  {item.name}" for item in report.strays]
    for key in report.unreadable:
        lines.append(f"unreadable record (no archive is removed while one is): {key}")
    freed = sum(item.bytes for item in items)
    lines.append(
        f"gc: {len(items)} item(s), {freed} bytes {'would be freed' if dry_run else 'freed'}; "
        f"{report.referenced} referenced archive(s) kept, {report.kept_recent} unreferenced archive(s) "
        "kept as used within the grace"
    )
    return lines
