"""Moved into `proxy.storage` (`proxy.storage.served`).

This name stays only until the branches started before the move are merged (then it goes, with
its line in setup.cfg's storage contract): nothing in the tree imports it."""

from __future__ import annotations

from proxy.storage.served import ServedArchives

__all__ = ["ServedArchives"]
