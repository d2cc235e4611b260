"""Content-addressed archive store on disk.

Layout: `ROOT/sha256/ab/cd/<sha256>`. New files are written to a temp directory of the
process's own (`ROOT/tmp/<host>-<pid>-<id>/`, so replicas sharing one volume never touch
each other's downloads), hashed while written, fsynced, and renamed into place only by
`publish` after the caller verified them: a partial or unverified file is never visible
under its final name.

A process holds an `flock` on `.lock` inside its temp directory for as long as it lives;
a directory whose lock can be taken belongs to a dead process and is reaped (PIDs are no
evidence: in a container every proxy is PID 1). Files that fail verification after they
were stored are moved to `ROOT/quarantine/<sha256>-<time>`. The store remembers, per
object, the file identity (device, inode, size, mtime, ctime) it last hashed and found
intact, so a file changed since is never trusted without being hashed again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from proxy.objects import QUARANTINE, STRAY, TEMP, Leftover, ObjectInfo, quarantined_at

_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
ABANDONED_AFTER = 24 * 3600.0
LOCK_NAME = ".lock"
HASH_CHUNK = 1 << 20
VERIFIED_FACTS = 100_000


@dataclass(frozen=True)
class StoredArchive:
    sha256: str
    path: Path
    size: int


Identity = tuple[int, int, int, int, int]
"""What changes whenever a file is written or replaced: (device, inode, size, mtime_ns, ctime_ns)."""


def identity(st: os.stat_result) -> Identity:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


@dataclass(frozen=True)
class ObjectCheck:
    """The outcome of hashing a stored object: what its content hashes to, and which file that was."""

    stored: StoredArchive
    actual: str
    identity: Identity

    @property
    def intact(self) -> bool:
        return self.actual == self.stored.sha256


class PendingArchive:
    """A temp file being written; knows its SHA-256 and size so far. Each write is flushed, so the
    file can be read as it grows (`proxy.growing`)."""

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


class ArchiveStore:
    """Verified archives by SHA-256. Blocking file I/O: call from a worker thread where it matters."""

    local = True  # published archives are local files (served with sendfile, followed across processes)

    def __init__(self, root: Path) -> None:
        self.root = root
        self._host = socket.gethostname()
        self._tmp_root = root / "tmp"
        self._tmp = self._tmp_root / f"{self._host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._objects = root / "sha256"
        self._quarantine = root / "quarantine"
        self._lock_fd: int | None = None
        self._verified: dict[str, Identity] = {}
        self._lock = threading.Lock()

    def open(self, *, claim: bool = True) -> None:
        """Create the layout, claim this process's temp dir and remove those of dead processes; without
        `claim` (a store only looked at: gc, verify), nothing: a directory needs no opening to be read."""
        if not claim:
            return
        self._objects.mkdir(parents=True, exist_ok=True)
        self._tmp_root.mkdir(parents=True, exist_ok=True)
        for leftover in self.abandoned_temp_dirs():
            self.remove_temp_dir(leftover)
        self._claim_tmp()

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _claim_tmp(self) -> None:
        """Create this process's temp dir and hold the lock inside it for the life of the process."""
        self._tmp.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._tmp / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        self._lock_fd = fd

    def temp_dirs(self) -> list[Path]:
        """Every process temp dir under `ROOT/tmp`."""
        try:
            return sorted(p for p in self._tmp_root.iterdir() if p.is_dir())
        except FileNotFoundError:
            return []

    def abandoned_temp_dirs(self) -> list[Path]:
        return [path for path in self.temp_dirs() if path != self._tmp and self._abandoned(path)]

    def remove_temp_dir(self, path: Path) -> None:
        """Remove another process's temp dir if it is (still) abandoned."""
        if path != self._tmp and self._abandoned(path):
            shutil.rmtree(path, ignore_errors=True)

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
            return self._idle(path)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)
        host = path.name.rpartition("-")[0].rpartition("-")[0]
        return host == self._host or self._idle(path)

    @staticmethod
    def _idle(path: Path) -> bool:
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

    def objects(self) -> Iterator[Path]:
        """Every file under `ROOT/sha256/` (named by content or not), in a stable order."""
        for path in sorted(self._objects.rglob("*")):
            if path.is_file():
                yield path

    def check(self, sha256: str, progress: Callable[[int], None] | None = None) -> ObjectCheck | None:
        """Hash the object stored at `sha256`'s address (None if there is none); remembered if intact."""
        path = self.path_for(sha256)
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return None
        with handle:
            st = os.fstat(handle.fileno())
            actual = hash_stream(handle, progress)
        result = ObjectCheck(StoredArchive(sha256, path, st.st_size), actual, identity(st))
        if result.intact:
            self.remember_verified(sha256, result.identity)
        return result

    def remember_verified(self, sha256: str, ident: Identity) -> None:
        """Record that the file with this identity hashed to its address."""
        with self._lock:
            if len(self._verified) >= VERIFIED_FACTS and sha256 not in self._verified:
                self._verified.pop(next(iter(self._verified)), None)
            self._verified[sha256] = ident

    def is_verified(self, stored: StoredArchive) -> bool:
        """Whether the file at `stored.path` is the very file last found intact, unchanged since."""
        if stored.sha256 not in self._verified:
            return False
        try:
            return self.was_found_intact(stored.sha256, identity(stored.path.stat()))
        except FileNotFoundError:
            return False

    def was_found_intact(self, sha256: str, ident: Identity) -> bool:
        """Whether the file with this identity (from a stat of a path or of an open file) is the one
        last hashed to `sha256`'s address: no I/O."""
        return self._verified.get(sha256) == ident

    def quarantine(self, sha256: str, ident: Identity | None = None) -> Path | None:
        """Move the object at `sha256`'s address to `ROOT/quarantine/`; None if it is gone already.

        With `ident`, only that very file is moved: a fresh copy published meanwhile stays.
        """
        path = self.path_for(sha256)
        with self._lock:
            try:
                st = path.stat()
            except FileNotFoundError:
                return None
            if ident is not None and (st.st_dev, st.st_ino) != ident[:2]:
                return None
            self._verified.pop(sha256, None)
            self._quarantine.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            target = self._quarantine / f"{sha256}-{stamp}-{uuid.uuid4().hex[:6]}"
            try:
                os.replace(path, target)
            except FileNotFoundError:
                return None
            _fsync_dir(path.parent)
            return target

    def quarantined(self) -> list[Leftover]:
        """Every file in `ROOT/quarantine/`, with its size and when it was moved there."""
        try:
            paths = sorted(p for p in self._quarantine.iterdir() if p.is_file())
        except FileNotFoundError:
            return []
        found = []
        for path in paths:
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            found.append(Leftover(QUARANTINE, str(path), st.st_size, quarantined_at(path.name, st.st_mtime)))
        return found

    def strays(self) -> list[Path]:
        """Files under `ROOT/sha256/` that are not at their content address (never served)."""
        return [path for path in self.objects() if not _HEX64.match(path.name) or self.path_for(path.name) != path]

    def leftovers(self, before: float) -> list[Leftover]:
        """What gc may remove besides archives: temp dirs of dead processes (by their lock, whatever their
        age) and files quarantined before `before`; and the strays, which it only reports."""
        found = [Leftover(TEMP, str(path), tree_size(path), _mtime(path)) for path in self.abandoned_temp_dirs()]
        found += [item for item in self.quarantined() if item.since < before]
        for path in self.strays():
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                found.append(Leftover(STRAY, str(path), st.st_size, st.st_mtime))
        return found

    def remove_leftover(self, item: Leftover) -> bool:
        """Remove a temp dir (only if still abandoned) or a quarantined file; whether it is gone. Strays stay."""
        path = Path(item.name)
        if item.kind == TEMP and path.parent == self._tmp_root:
            self.remove_temp_dir(path)
            return not path.exists()
        if item.kind == QUARANTINE and path.parent == self._quarantine:
            path.unlink(missing_ok=True)
            return True
        return False

    def begin(self) -> PendingArchive:
        return PendingArchive(self.temp_path())

    @property
    def temp_root(self) -> Path:
        """Where every process's temp directory is (`ROOT/tmp`)."""
        return self._tmp_root

    @property
    def temp_dir(self) -> Path:
        """This process's scratch directory (removed at close, or at the next start after a crash)."""
        return self._tmp

    def temp_path(self) -> Path:
        """A fresh path in this process's temp directory, for producers that write files themselves."""
        if not self._tmp.is_dir():  # recreated (and locked again) if another host's start-up reaped it
            with self._lock:
                self._claim_tmp()
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
        st = final.stat()
        self.remember_verified(sha256, identity(st))
        return StoredArchive(sha256, final, st.st_size)

    def is_writable(self) -> bool:
        probe = self._tmp / f".probe-{uuid.uuid4().hex}"
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError:
            return False
        return True

    def list_objects(self) -> Iterator[ObjectInfo]:
        """Every object at its content address (files named otherwise are `objects()`' strays, not listed)."""
        for path in self.objects():
            sha = path.name
            if not _HEX64.match(sha) or self.path_for(sha) != path:
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                continue  # removed meanwhile
            yield ObjectInfo(sha, st.st_size, st.st_mtime)

    def remove(self, sha256: str) -> int:
        """Delete the object at `sha256`'s address; the bytes freed (0 if there was none).

        A reader that opened the file before keeps reading it (POSIX); a later lookup finds nothing,
        so the archive is fetched and verified again."""
        path = self.path_for(sha256)
        with self._lock:
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                return 0
            self._verified.pop(sha256, None)
        _fsync_dir(path.parent)
        return size


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


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
