"""The archive store interface: what serving, publishing, the commands and eviction need of a backend.

Two backends implement it: `proxy.store.ArchiveStore` (a content-addressed directory, the default)
and `proxy.s3store.S3ArchiveStore` (S3-compatible object storage). Both stage downloads in a local
per-process temp directory and make content visible at its address (its SHA-256) only whole and
only once verified (`publish`, `publish_path`).

What gc needs is said once for both: `list_objects` (archives), `leftovers` (temp dirs of dead
processes, unfinished uploads, old quarantined objects to remove; strays to report) and
`remove_leftover`; `open(claim=False)` opens a store for looking at it without changing anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from proxy.objects import Leftover, ObjectInfo
from proxy.store import ObjectCheck, PendingArchive


class ArchiveStorage(Protocol):
    """Verified archives by SHA-256; blocking methods (call them from a worker thread in the server)."""

    local: bool  # published archives are local files (sendfile, cross-process following of downloads)
    root: Path  # the local directory: staging, temp files, download notices

    def open(self, *, claim: bool = True) -> None: ...

    def close(self) -> None: ...

    # staging: a temp file per download, in this process's own temp directory
    def begin(self) -> PendingArchive: ...

    def temp_path(self) -> Path: ...

    @property
    def temp_dir(self) -> Path: ...

    @property
    def temp_root(self) -> Path: ...

    def temp_dirs(self) -> list[Path]: ...

    def abandoned_temp_dirs(self) -> list[Path]: ...

    def remove_temp_dir(self, path: Path) -> None: ...

    def is_writable(self) -> bool: ...

    def path_for(self, sha256: str) -> Path: ...

    # objects at content addresses
    def get(self, sha256: str) -> Any | None: ...

    def publish(self, pending: PendingArchive, sha256: str) -> Any: ...

    def publish_path(self, path: Path, sha256: str) -> Any: ...

    def check(self, sha256: str, progress: Callable[[int], None] | None = None) -> ObjectCheck | None: ...

    def quarantine(self, sha256: str, ident: Any = None) -> Any | None: ...

    def quarantined(self) -> list[Leftover]: ...

    def strays(self) -> list[Any]: ...

    # what gc removes besides archives (and the strays it reports)
    def leftovers(self, before: float) -> list[Leftover]: ...

    def remove_leftover(self, item: Leftover) -> bool: ...

    def list_objects(self) -> Iterator[ObjectInfo]: ...

    def remove(self, sha256: str) -> int: ...
