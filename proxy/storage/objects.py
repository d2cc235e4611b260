"""What an archive store says about what it holds (the same for every backend). Pure."""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path

TEMP = "temp"  # a dead process's temp directory of the local staging area
UPLOAD = "upload"  # an unfinished multipart upload (object storage)
QUARANTINE = "quarantine"  # an object moved aside after it failed its integrity check
STRAY = "stray"  # something where objects are kept that is not at a content address: reported, never removed
REMOVABLE = (TEMP, UPLOAD, QUARANTINE)

_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")


def is_address(name: str) -> bool:
    """Whether `name` is a content address: a SHA-256 in lower-case hex, nothing else."""
    return bool(_HEX64.match(name))


def checked_address(sha256: str) -> str:
    """`sha256` if it is a content address; ValueError otherwise (before any path or key is built of it)."""
    if not is_address(sha256):
        raise ValueError(f"not a SHA-256 hex digest: {sha256!r}")
    return sha256


@dataclass(frozen=True)
class StoredArchive:
    """An object at its content address, as one lookup saw it: its SHA-256, size, which copy it was
    (`version`: a file's identity, an object's ETag; a changed or replaced copy has another), where it
    is (for logs), and its local file when the backend keeps one (None in object storage)."""

    sha256: str
    size: int
    version: Hashable
    location: str
    path: Path | None = None


@dataclass(frozen=True)
class ObjectCheck:
    """The outcome of hashing a stored object whole: the copy hashed and what its content hashes to."""

    stored: StoredArchive
    actual: str

    @property
    def intact(self) -> bool:
        return self.actual == self.stored.sha256


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


def quarantine_name(sha256: str, token: str) -> str:
    """The name a quarantined copy gets: its address, the UTC time it was moved and `token` (unique)."""
    return f"{sha256}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{token}"
