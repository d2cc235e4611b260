"""Moved into `proxy.storage` (the S3 store: `proxy.storage.s3`).

This name stays only until the branches started before the move are merged (then it goes, with
its line in setup.cfg's storage contract): nothing in the tree imports it."""

from __future__ import annotations

from proxy.storage.objects import StoredArchive as RemoteArchive
from proxy.storage.s3 import ATTEMPTS, PART_SIZE, S3Options
from proxy.storage.s3 import S3Store as S3ArchiveStore

__all__ = ["ATTEMPTS", "PART_SIZE", "RemoteArchive", "S3ArchiveStore", "S3Options"]
