"""Notices of archive downloads under way, for the processes sharing one archive store.

While a process downloads an archive others may follow, it keeps `ROOT/growing/<sha256 of the
flight key>.json`: where its temp file is, how long the archive will be, and the SHA-256 it
must have. The file is `flock`ed by that process for as long as the download lasts (taken before
the notice is renamed into place, so a notice is never seen unlocked while it is alive), and
removed when the download ends; the kernel releases the lock of a process that dies, so
a notice whose lock can be taken is void. A notice names a temp file only inside the store's
temp root. Each call is a few small blocking file operations.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Notice:
    """A download under way in some process: its temp file, final size and expected SHA-256."""

    path: Path
    size: int
    sha256: str


class DownloadNotices:
    """The notices directory of an archive store (see module docstring)."""

    def __init__(self, directory: Path, temp_root: Path) -> None:
        self._directory = directory
        self._temp_root = temp_root

    def _path(self, key: str) -> Path:
        return self._directory / f"{hashlib.sha256(key.encode()).hexdigest()}.json"

    def post(self, key: str, notice: Notice) -> int:
        """Publish `notice` for `key`, locked; returns the descriptor to hand to `take_down`."""
        self._directory.mkdir(parents=True, exist_ok=True)
        scratch = self._directory / f".{uuid.uuid4().hex}.tmp"
        descriptor = os.open(scratch, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            os.write(
                descriptor,
                json.dumps({"path": str(notice.path), "size": notice.size, "sha256": notice.sha256}).encode(),
            )
            os.replace(scratch, self._path(key))
        except BaseException:
            os.close(descriptor)
            scratch.unlink(missing_ok=True)
            raise
        return descriptor

    def take_down(self, key: str, descriptor: int) -> None:
        """Remove the notice posted with `descriptor` (unless replaced meanwhile) and release its lock."""
        try:
            with contextlib.suppress(FileNotFoundError):
                named, held = os.stat(self._path(key)), os.fstat(descriptor)
                if (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
                    self._path(key).unlink()
        finally:
            os.close(descriptor)

    def read(self, key: str) -> tuple[Notice, int] | None:
        """The live notice of `key` and a descriptor to watch its owner with (`owner_alive`; close it), or None."""
        try:
            descriptor = os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            if not owner_alive(descriptor):
                raise ValueError("a notice of a download that ended")
            fields = json.loads(os.pread(descriptor, 4096, 0))
            notice = Notice(Path(fields["path"]), int(fields["size"]), str(fields["sha256"]))
            if notice.path.parent.parent != self._temp_root or notice.path.suffix != ".part":
                raise ValueError(f"a notice of a file outside {self._temp_root}")
        except (ValueError, KeyError, TypeError):
            os.close(descriptor)
            return None
        return notice, descriptor


def owner_alive(descriptor: int) -> bool:
    """Whether the process that posted the notice open as `descriptor` still holds its lock."""
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(descriptor, fcntl.LOCK_UN)
    return False
