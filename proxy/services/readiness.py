"""Whether the proxy can serve and store now: the metadata store, the archive store, the free space."""

from __future__ import annotations

import asyncio

from proxy.metadata_store import MetadataStore
from proxy.storage import ArchiveStore, DiskSpace, SpaceReport


class Readiness:
    """The checks behind `/readyz` and the Redis gauge of `/metrics`."""

    def __init__(self, cache: MetadataStore, store: ArchiveStore, space: DiskSpace) -> None:
        self._cache = cache
        self._store = store
        self._space = space

    async def ready(self) -> dict[str, bool]:
        """Readiness of the metadata store, the data directory and its free space."""
        return {
            "metadata_store": await self._cache.ping(),
            "archive_store": await asyncio.to_thread(self._store.is_writable),
            "disk_space": (await self.disk_space()).ok,
        }

    async def metadata_store_up(self) -> bool:
        """Whether the metadata store answers now."""
        return await self._cache.ping()

    async def disk_space(self) -> SpaceReport:
        """Free space of the data directory against `--min-free-space` (measured at most once a second)."""
        return await self._space.report()

    def metadata_problem(self) -> str | None:
        """Why the metadata store is unusable now (for /readyz), or None."""
        return self._cache.problem
