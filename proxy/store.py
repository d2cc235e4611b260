"""Moved into `proxy.storage` (the disk store: `proxy.storage.disk`, `proxy.storage.staging`).

This name stays only until the branches started before the move are merged (then it goes, with
its line in setup.cfg's storage contract): nothing in the tree imports it."""

from __future__ import annotations

from proxy.storage.disk import DiskStore as ArchiveStore
from proxy.storage.disk import Identity, identity
from proxy.storage.objects import ObjectCheck, StoredArchive
from proxy.storage.staging import (
    HASH_CHUNK,
    LOCK_NAME,
    PendingArchive,
    file_digest,
    hash_stream,
    sha256_file,
    tree_size,
)

__all__ = [
    "HASH_CHUNK",
    "LOCK_NAME",
    "ArchiveStore",
    "Identity",
    "ObjectCheck",
    "PendingArchive",
    "StoredArchive",
    "file_digest",
    "hash_stream",
    "identity",
    "sha256_file",
    "tree_size",
]
