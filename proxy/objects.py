"""Moved into `proxy.storage` (`proxy.storage.objects`).

This name stays only until the branches started before the move are merged (then it goes, with
its line in setup.cfg's storage contract): nothing in the tree imports it."""

from __future__ import annotations

from proxy.storage.objects import QUARANTINE, REMOVABLE, STRAY, TEMP, UPLOAD, Leftover, ObjectInfo, quarantined_at

__all__ = ["QUARANTINE", "REMOVABLE", "STRAY", "TEMP", "UPLOAD", "Leftover", "ObjectInfo", "quarantined_at"]
