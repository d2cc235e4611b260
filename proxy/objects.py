"""What an archive store lists about what it holds (the same for every backend)."""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass

TEMP = "temp"  # a dead process's temp directory of the local staging area
UPLOAD = "upload"  # an unfinished multipart upload (object storage)
QUARANTINE = "quarantine"  # an object moved aside after it failed its integrity check
STRAY = "stray"  # something where objects are kept that is not at a content address: reported, never removed
REMOVABLE = (TEMP, UPLOAD, QUARANTINE)


@dataclass(frozen=True)
class ObjectInfo:
    """One object at a content address: its SHA-256 (the address), size in bytes, and modification
    time (seconds since the epoch)."""

    sha256: str
    size: int
    modified: float


@dataclass(frozen=True)
class Leftover:
    """Something a store holds besides its objects: its kind (`TEMP`, `UPLOAD`, `QUARANTINE`, `STRAY`),
    the name the store removes it by (a path, or an s3:// URL), its size in bytes and since when it is
    there (made, quarantined or last modified; seconds since the epoch)."""

    kind: str
    name: str
    size: int
    since: float


def quarantined_at(name: str, fallback: float) -> float:
    """When a quarantined object was moved, by the UTC time in its name (`<sha256>-<YYYYmmddTHHMMSSZ>-<id>`),
    else `fallback` (its modification time)."""
    parts = name.rpartition("/")[2].split("-")
    if len(parts) >= 2:
        try:
            return calendar.timegm(time.strptime(parts[1], "%Y%m%dT%H%M%SZ"))
        except ValueError:
            pass
    return fallback
