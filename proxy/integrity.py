"""Moved into `proxy.storage` (one guard for every backend: `proxy.storage.guard`).

This name stays only until the branches started before the move are merged (then it goes, with
its line in setup.cfg's storage contract): nothing in the tree imports it."""

from __future__ import annotations

from proxy.storage.guard import ArchiveGuard as StoreGuard
from proxy.storage.guard import ArchiveReader

__all__ = ["ArchiveReader", "StoreGuard"]
