"""Archive storage: verified archives by SHA-256, and everything that keeps them.

This module is the package's only public face (an import-linter contract keeps the rest inside):

- `ArchiveStore`, the interface of a backend (`interface`), and `archive_store(settings)`, which picks
  one (`factory`): a content-addressed directory (`disk`, reading through a reused buffer:
  `read_buffer`) or S3-compatible object storage (`s3`, its answers read by `s3_answers`). Both stage
  downloads in a per-process temp directory (`staging`) and publish only verified content, whole.
- `ArchiveGuard`, the one integrity check between a store and a client (`guard`): sizes on every
  lookup, the SHA-256 of every whole body served, quarantine of what fails.
- `ArchiveUsage` (`usage`: pins while an archive is sent, last-served times through a
  `ServedTimes`), `Evictor` (`size_cap`: the size cap) and its pure choice of victims and of gc's
  orphans (`victims`), and `DiskSpace` (`space`: the free-space floor, "disk full" errors).
- What a store says it holds (`objects`): `StoredArchive`, `ObjectInfo`, `Leftover` and its kinds.

docs/integrity.md#archive-stores says what the stores guarantee.
"""

from __future__ import annotations

from proxy.storage.factory import archive_store, s3_options
from proxy.storage.guard import ArchiveGuard, ArchiveReader
from proxy.storage.interface import ArchiveStore, ServedTimes
from proxy.storage.objects import (
    QUARANTINE,
    REMOVABLE,
    STRAY,
    TEMP,
    UPLOAD,
    Leftover,
    ObjectCheck,
    ObjectInfo,
    StoredArchive,
)
from proxy.storage.size_cap import EvictionRun, Evictor
from proxy.storage.space import DiskSpace, SpaceReport, is_disk_full
from proxy.storage.staging import LOCK_NAME, PendingArchive, file_digest, fsync_path, sha256_file
from proxy.storage.usage import ArchiveUsage
from proxy.storage.victims import orphans

__all__ = [
    "LOCK_NAME",
    "QUARANTINE",
    "REMOVABLE",
    "STRAY",
    "TEMP",
    "UPLOAD",
    "ArchiveGuard",
    "ArchiveReader",
    "ArchiveStore",
    "ArchiveUsage",
    "DiskSpace",
    "EvictionRun",
    "Evictor",
    "Leftover",
    "ObjectCheck",
    "ObjectInfo",
    "PendingArchive",
    "ServedTimes",
    "SpaceReport",
    "StoredArchive",
    "archive_store",
    "file_digest",
    "fsync_path",
    "is_disk_full",
    "orphans",
    "s3_options",
    "sha256_file",
]
