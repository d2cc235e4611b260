"""Choosing the archive store backend from the settings: the data dir's directory, or S3."""

from __future__ import annotations

from pathlib import Path

from proxy.config import Settings
from proxy.integrity import StoreGuard
from proxy.metrics import Metrics
from proxy.s3integrity import S3Guard
from proxy.s3store import S3ArchiveStore, S3Options
from proxy.storage import ArchiveStorage
from proxy.store import ArchiveStore


def archive_store(settings: Settings) -> ArchiveStorage:
    """The archive store the settings name (not opened yet); staging is always under ARCHIVE_DIR."""
    location = settings.archives.s3_location
    if location is None:
        return ArchiveStore(settings.archive_dir)
    return S3ArchiveStore(settings.archive_dir, location, s3_options(settings))


def s3_options(settings: Settings) -> S3Options:
    ca_file = Path(settings.archives.s3_ca_file) if settings.archives.s3_ca_file else None
    return S3Options(
        endpoint_url=settings.archives.s3_endpoint_url,
        region=settings.archives.s3_region,
        path_style=settings.archives.s3_path_style,
        ca_file=ca_file,
        timeout=settings.archives.s3_timeout,
    )


def store_guard(store: ArchiveStorage, metrics: Metrics) -> StoreGuard | S3Guard:
    """The integrity checks that go with the backend."""
    if isinstance(store, S3ArchiveStore):
        return S3Guard(store, metrics)
    assert isinstance(store, ArchiveStore)
    return StoreGuard(store, metrics)
