"""The local staging area every archive store writes downloads into before it publishes them.

Each process has a temp directory of its own, `ROOT/tmp/<host>-<pid>-<id>/` (so replicas sharing one
volume never touch each other's downloads), and holds an `flock` on `.lock` inside it for as long as
it lives; a directory whose lock can be taken belongs to a dead process and is reaped (PIDs are no
evidence: in a container every proxy is PID 1). A download is written to a file there, hashed while
written (`PendingArchive`), and only published (renamed to its content address, or uploaded) once the
caller verified it. Blocking file I/O: call from a worker thread where it matters.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO

from proxy.storage.objects import TEMP, Leftover

ABANDONED_AFTER = 24 * 3600.0
LOCK_NAME = ".lock"
HASH_CHUNK = 1 << 20


class PendingArchive:
    """A temp file being written; knows its SHA-256 and size so far. Each write is flushed, so the
    file can be read as it grows (`proxy.services.live_downloads`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "wb")  # noqa: SIM115 - closed by finish()/discard()
        self._digest = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self._file.write(chunk)
        self._file.flush()
        self._digest.update(chunk)
        self.size += len(chunk)

    def sha256(self) -> str:
        """The SHA-256 hex of everything written so far."""
        return self._digest.hexdigest()

    def finish(self) -> str:
        """Flush and fsync; returns the SHA-256 hex of everything written."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return self.sha256()

    def discard(self) -> None:
        """Close and remove the temp file; buffered bytes that cannot be flushed (disk full) are dropped."""
        try:
            if not self._file.closed:
                self._file.close()
        except OSError:
            pass  # close() still releases the descriptor when its flush fails
        finally:
            self.path.unlink(missing_ok=True)


class Staging:
    """This process's temp directory under `ROOT/tmp`, and the reaping of dead processes' ones."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._host = socket.gethostname()
        self.temp_root = root / "tmp"
        self.temp_dir = self.temp_root / f"{self._host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._lock_fd: int | None = None
        self._lock = threading.Lock()

    def open(self) -> None:
        """Claim this process's temp dir (created and locked) and remove those of dead processes."""
        self.temp_root.mkdir(parents=True, exist_ok=True)
        for leftover in self.abandoned_temp_dirs():
            self.remove_temp_dir(leftover)
        self._claim()

    def close(self) -> None:
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _claim(self) -> None:
        """Create this process's temp dir and hold the lock inside it for the life of the process."""
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.temp_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        self._lock_fd = fd

    def begin(self) -> PendingArchive:
        """A new download's temp file."""
        return PendingArchive(self.temp_path())

    def temp_path(self) -> Path:
        """A fresh path in this process's temp directory, for producers that write files themselves."""
        if not self.temp_dir.is_dir():  # recreated (and locked again) if another host's start-up reaped it
            with self._lock:
                self._claim()
        return self.temp_dir / f"{uuid.uuid4().hex}.part"

    def is_writable(self) -> bool:
        probe = self.temp_dir / f".probe-{uuid.uuid4().hex}"
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError:
            return False
        return True

    def temp_dirs(self) -> list[Path]:
        """Every process temp dir under `ROOT/tmp`."""
        try:
            return sorted(p for p in self.temp_root.iterdir() if p.is_dir())
        except FileNotFoundError:
            return []

    def abandoned_temp_dirs(self) -> list[Path]:
        return [path for path in self.temp_dirs() if path != self.temp_dir and self._abandoned(path)]

    def remove_temp_dir(self, path: Path) -> None:
        """Remove another process's temp dir if it is (still) abandoned."""
        if path != self.temp_dir and self._abandoned(path):
            shutil.rmtree(path, ignore_errors=True)

    def leftovers(self) -> list[Leftover]:
        """The temp dirs of dead processes (by their lock, whatever their age), as gc lists them."""
        return [Leftover(TEMP, str(path), tree_size(path), _mtime(path)) for path in self.abandoned_temp_dirs()]

    def remove_leftover(self, item: Leftover) -> bool:
        """Remove a dead process's temp dir (only if still abandoned); whether it is gone."""
        path = Path(item.name)
        if item.kind != TEMP or path.parent != self.temp_root:
            return False
        self.remove_temp_dir(path)
        return not path.exists()

    def _abandoned(self, path: Path) -> bool:
        """A temp dir nobody holds the lock of: on this host, at once; of another host, once untouched for a day.

        A held lock always means a live process, whatever its PID or age. Another host's lock
        may not be visible on every shared filesystem, so its directory also has to be idle
        for a day (its process recreates it if it was alive after all, `temp_path`). A
        directory without a lock file (an older version's, or one being created this very
        moment) is left alone for a day as well.
        """
        try:
            fd = os.open(path / LOCK_NAME, os.O_RDONLY)
        except FileNotFoundError:
            return _idle(path)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)
        host = path.name.rpartition("-")[0].rpartition("-")[0]
        return host == self._host or _idle(path)


class Staged:
    """What every store does with its staging area (the same for each backend): hand out temp files, list
    and reap temp dirs, say whether the area takes files."""

    staging: Staging

    @property
    def temp_root(self) -> Path:
        return self.staging.temp_root

    @property
    def temp_dir(self) -> Path:
        return self.staging.temp_dir

    def begin(self) -> PendingArchive:
        return self.staging.begin()

    def temp_path(self) -> Path:
        return self.staging.temp_path()

    def temp_dirs(self) -> list[Path]:
        return self.staging.temp_dirs()

    def abandoned_temp_dirs(self) -> list[Path]:
        return self.staging.abandoned_temp_dirs()

    def remove_temp_dir(self, path: Path) -> None:
        self.staging.remove_temp_dir(path)

    def is_writable(self) -> bool:
        return self.staging.is_writable()


def hash_stream(handle: IO[bytes], progress: Callable[[int], None] | None = None) -> str:
    """SHA-256 hex of the rest of `handle`, read in 1 MiB chunks; `progress(n)` after each."""
    digest = hashlib.sha256()
    while chunk := handle.read(HASH_CHUNK):
        digest.update(chunk)
        if progress is not None:
            progress(len(chunk))
    return digest.hexdigest()


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file, read in 1 MiB chunks (blocking: call from a worker thread)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, algorithm).hexdigest()


def sha256_file(path: Path) -> str:
    return file_digest(path, "sha256")


def tree_size(path: Path) -> int:
    """The bytes of the files under `path` (0 if it is gone)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def fsync_path(path: Path) -> None:
    """Flush a file, or a directory's entries, to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _idle(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime > ABANDONED_AFTER
    except FileNotFoundError:
        return False


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
