"""Moved into `proxy.storage` (`proxy.storage.factory`; the guard is `proxy.storage.ArchiveGuard` for every backend).

This name stays only until the branches started before the move are merged (then it goes, with
its line in setup.cfg's storage contract): nothing in the tree imports it."""

from __future__ import annotations

from proxy.metrics import Metrics
from proxy.storage.factory import archive_store, s3_options
from proxy.storage.guard import ArchiveGuard
from proxy.storage.protocol import ArchiveStore


def store_guard(store: ArchiveStore, metrics: Metrics) -> ArchiveGuard:
    return ArchiveGuard(store, metrics)


__all__ = ["archive_store", "s3_options", "store_guard"]
