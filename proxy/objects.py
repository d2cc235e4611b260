"""What an archive store lists about one stored object (the same for every backend)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ObjectInfo:
    """One object at a content address: its SHA-256 (the address), size in bytes, and modification
    time (seconds since the epoch)."""

    sha256: str
    size: int
    modified: float
