"""Choosing the archive store backend from the settings: the data dir's directory, or S3."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from proxy.settings.config import Settings
from proxy.storage.disk import DiskStore
from proxy.storage.interface import ArchiveStore

if TYPE_CHECKING:
    from proxy.storage.s3 import S3Options


def archive_store(settings: Settings) -> ArchiveStore:
    """The archive store the settings name (not opened yet); staging is always under ARCHIVE_DIR."""
    location = settings.archives.s3_location
    if location is None:
        return DiskStore(settings.archive_dir)
    from proxy.storage.s3 import S3Store  # aiobotocore (a second to import) only for a proxy that uses S3

    return S3Store(settings.archive_dir, location, s3_options(settings))


def s3_options(settings: Settings) -> S3Options:
    """How to reach the object storage the settings name."""
    from proxy.storage.s3 import S3Options

    ca_file = Path(settings.archives.s3_ca_file) if settings.archives.s3_ca_file else None
    return S3Options(
        endpoint_url=settings.archives.s3_endpoint_url,
        region=settings.archives.s3_region,
        path_style=settings.archives.s3_path_style,
        ca_file=ca_file,
        timeout=settings.archives.s3_timeout,
    )
