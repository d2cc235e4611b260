"""Free space of the data directory against the `--min-free-space` floor, and "disk full" errors.

`DiskSpace.report` reads `statvfs` in a worker thread at most about once a second (callers
in between share the last reading), so request paths never block on it. Below the floor the
proxy stores no new archives and `/readyz` answers 503; above it again, it stores as before:
nothing to reset. A write that fails with ENOSPC (or SQLite's "database or disk is full") is
recognised by `is_disk_full`.
"""

from __future__ import annotations

import asyncio
import errno
import math
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from proxy.errors import DiskFullError
from proxy.settings.config import SpaceFloor

log = structlog.get_logger(__name__)
MAX_AGE = 1.0


@dataclass(frozen=True)
class SpaceReport:
    free_bytes: int
    min_free_bytes: int
    total_bytes: int = 0  # the disk's size (0: not measured)

    @property
    def ok(self) -> bool:
        return self.free_bytes >= self.min_free_bytes


class DiskSpace:
    """The data directory's free space, measured at most once per `max_age` seconds."""

    def __init__(
        self, path: Path, floor: SpaceFloor, *, max_age: float = MAX_AGE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._path = path
        self._floor = floor
        self._max_age = max_age
        self._clock = clock
        self._report: SpaceReport | None = None
        self._measured_at = -math.inf
        self._lock = asyncio.Lock()

    async def report(self) -> SpaceReport:
        """The latest reading, re-measured (in a thread, once for all waiters) when older than `max_age`."""
        if self._report is not None and self._clock() - self._measured_at < self._max_age:
            return self._report
        async with self._lock:
            if self._report is None or self._clock() - self._measured_at >= self._max_age:
                report = await asyncio.to_thread(self._measure)
                self._note_change(self._report, report)
                self._report, self._measured_at = report, self._clock()
            return self._report

    async def require_room(self, what: str, needed: int = 0) -> None:
        """Raise DiskFullError unless `needed` more bytes keep the disk at or above the floor."""
        report = await self.report()
        if report.free_bytes - needed < report.min_free_bytes:
            raise DiskFullError(f"the proxy's disk is full: cannot store {what} ({_room(report, needed)})")

    def full(self, exc: BaseException, action: str) -> DiskFullError:
        """A write failed for lack of space: log it, re-measure at the next check, and say so."""
        self._measured_at = -math.inf
        log.warning("storage.disk_full", action=action, error=str(exc))
        return DiskFullError(f"the proxy's disk is full: cannot {action} (a write failed: {exc})")

    def _measure(self) -> SpaceReport:
        try:
            stats = os.statvfs(self._path)
        except OSError as exc:
            log.error("storage.statvfs_failed", error=str(exc))
            return SpaceReport(0, self._floor.of(0))
        total = stats.f_blocks * stats.f_frsize
        return SpaceReport(stats.f_bavail * stats.f_frsize, self._floor.of(total), total)

    @staticmethod
    def _note_change(before: SpaceReport | None, after: SpaceReport) -> None:
        if not after.ok and (before is None or before.ok):
            log.warning(
                "storage.below_min_free_space", free_bytes=after.free_bytes, min_free_bytes=after.min_free_bytes
            )
        elif after.ok and before is not None and not before.ok:
            log.info("storage.space_recovered", free_bytes=after.free_bytes, min_free_bytes=after.min_free_bytes)


def is_disk_full(exc: BaseException) -> bool:
    """An OSError for lack of space or quota, or SQLite's "database or disk is full"."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if isinstance(exc, sqlite3.Error):
        return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_FULL or "disk is full" in str(exc)
    return False


def _room(report: SpaceReport, needed: int) -> str:
    wanted = f", {needed} bytes needed" if needed else ""
    return f"{report.free_bytes} bytes free{wanted}, --min-free-space is {report.min_free_bytes} bytes"
