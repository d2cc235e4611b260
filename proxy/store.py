"""Content-addressed archive store on disk.

Layout: `ROOT/sha256/ab/cd/<sha256>`. New files are written to a temp directory of the
process's own (`ROOT/tmp/<host>-<pid>-<id>/`, so replicas sharing one volume never touch
each other's downloads), hashed while written, fsynced, and renamed into place only by
`publish` after the caller verified them: a partial or unverified file is never visible
under its final name.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
ABANDONED_AFTER = 24 * 3600.0


@dataclass(frozen=True)
class StoredArchive:
    sha256: str
    path: Path
    size: int


class PendingArchive:
    """A temp file being written; knows its SHA-256 and size so far."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "wb")  # noqa: SIM115 - closed by finish()/discard()
        self._digest = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self._file.write(chunk)
        self._digest.update(chunk)
        self.size += len(chunk)

    def finish(self) -> str:
        """Flush and fsync; returns the SHA-256 hex of everything written."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return self._digest.hexdigest()

    def discard(self) -> None:
        """Close and remove the temp file; buffered bytes that cannot be flushed (disk full) are dropped."""
        try:
            if not self._file.closed:
                self._file.close()
        except OSError:
            pass  # close() still releases the descriptor when its flush fails
        finally:
            self.path.unlink(missing_ok=True)


class ArchiveStore:
    """Verified archives by SHA-256. Blocking file I/O: call from a worker thread where it matters."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._host = socket.gethostname()
        self._tmp_root = root / "tmp"
        self._tmp = self._tmp_root / f"{self._host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._objects = root / "sha256"

    def open(self) -> None:
        """Create the layout and remove temp files left by crashed processes."""
        self._objects.mkdir(parents=True, exist_ok=True)
        self._tmp_root.mkdir(parents=True, exist_ok=True)
        for leftover in self._tmp_root.iterdir():
            if self._abandoned(leftover):
                shutil.rmtree(leftover, ignore_errors=True)
        self._tmp.mkdir(exist_ok=True)

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _abandoned(self, path: Path) -> bool:
        """A temp dir of a dead process on this host, or one of another host untouched for a day.

        A live process's directory on this host is never removed, however old; another host's
        process that lost its directory recreates it (`temp_path`).
        """
        host, _, rest = path.name.rpartition("-")[0].rpartition("-")
        if host == self._host and rest.isdigit():
            return not _pid_alive(int(rest))
        try:
            return time.time() - path.stat().st_mtime > ABANDONED_AFTER
        except FileNotFoundError:
            return False

    def path_for(self, sha256: str) -> Path:
        if not _HEX64.match(sha256):
            raise ValueError(f"not a SHA-256 hex digest: {sha256!r}")
        return self._objects / sha256[:2] / sha256[2:4] / sha256

    def get(self, sha256: str) -> StoredArchive | None:
        path = self.path_for(sha256)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return None
        return StoredArchive(sha256, path, size)

    def begin(self) -> PendingArchive:
        return PendingArchive(self.temp_path())

    @property
    def temp_dir(self) -> Path:
        """This process's scratch directory (removed at close, or at the next start after a crash)."""
        return self._tmp

    def temp_path(self) -> Path:
        """A fresh path in this process's temp directory, for producers that write files themselves."""
        self._tmp.mkdir(parents=True, exist_ok=True)  # recreated if another host's start-up reaped it
        return self._tmp / f"{uuid.uuid4().hex}.part"

    def publish(self, pending: PendingArchive, sha256: str) -> StoredArchive:
        """Move a finished, verified temp file to its content address (atomic rename)."""
        return self.publish_path(pending.path, sha256)

    def publish_path(self, path: Path, sha256: str) -> StoredArchive:
        """Fsync and move a verified file from the temp directory to its content address."""
        with open(path, "rb+") as handle:
            os.fsync(handle.fileno())
        final = self.path_for(sha256)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, final)
        _fsync_dir(final.parent)
        return StoredArchive(sha256, final, final.stat().st_size)

    def is_writable(self) -> bool:
        probe = self._tmp / f".probe-{uuid.uuid4().hex}"
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError:
            return False
        return True


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file, read in 1 MiB chunks (blocking: call from a worker thread)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, algorithm).hexdigest()


def sha256_file(path: Path) -> str:
    return file_digest(path, "sha256")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
