"""Module archives: deterministic `.tar.gz` packing and safety checks of fetched archives.

Packing sorts entries, fixes owner, group, modes and times (the commit time) and writes a
gzip stream with no name or time in its header, so the same tree gives the same bytes.
Checking refuses archives the clients would unpack outside their module directory
(absolute paths, `..`, links that point out), decompression bombs (too many entries, or
more bytes unpacked than a limit) and anything that is not a readable archive.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import stat
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import IO

GZIP_LEVEL = 6


class ArchiveError(ValueError):
    """The archive is unreadable or unsafe."""


class ArchiveTooLargeError(ArchiveError):
    """The archive has more entries, or unpacks to more bytes, than the limits allow."""


def deterministic_tar_gz(root: Path, output: Path, mtime: int, exclude: frozenset[str] = frozenset({".git"})) -> None:
    """Pack the tree under `root` into `output` reproducibly."""
    entries = []
    for current, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in exclude or Path(current) != root)
        relative_dir = Path(current).relative_to(root)
        for name in sorted(files + [d for d in dirs if (Path(current) / d).is_symlink()]):
            entries.append(relative_dir / name)
        for name in dirs:
            if not (Path(current) / name).is_symlink():
                entries.append(relative_dir / name)
    entries.sort(key=lambda p: p.as_posix().encode())
    with (
        open(output, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=GZIP_LEVEL) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        links = _Links()
        for relative in entries:
            info, content = _tar_entry(root / relative, relative.as_posix(), mtime)
            if info.issym():
                links.add(info.name, info.linkname)
            tar.addfile(info, content)


def _tar_entry(path: Path, name: str, mtime: int) -> tuple[tarfile.TarInfo, io.BufferedReader | None]:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "", ""
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        target = os.readlink(path)
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
        return info, None
    if stat.S_ISDIR(mode):
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        return info, None
    info.mode = 0o755 if mode & stat.S_IXUSR else 0o644
    info.size = path.stat().st_size
    return info, open(path, "rb")


def _check_name(name: str) -> None:
    pure = PurePosixPath(name.replace("\\", "/"))
    drive = bool(pure.parts) and ":" in pure.parts[0]
    if pure.is_absolute() or ".." in pure.parts or name.startswith(("/", "\\")) or drive:
        raise ArchiveError(f"archive entry {name!r} would be unpacked outside the module directory")


class _Links:
    """Symbolic links seen so far in an archive, to resolve paths the way unpacking would.

    A path or link target is resolved component by component, following the links already
    unpacked, so chains of individually harmless links cannot reach outside the module.
    """

    MAX_HOPS = 40

    def __init__(self) -> None:
        self._links: dict[str, str] = {}

    def add(self, name: str, target: str) -> None:
        if target.startswith(("/", "\\")) or target[1:2] == ":":
            raise ArchiveError(f"link {name!r} points to an absolute path")
        parent = PurePosixPath(name.replace("\\", "/")).parent.as_posix()
        self._resolve(f"{parent}/{target}", name)
        self._links[self._resolve(name, name, final=False)] = target

    def check_path(self, name: str) -> None:
        self._resolve(PurePosixPath(name.replace("\\", "/")).parent.as_posix(), name)

    def _resolve(self, path: str, name: str, final: bool = True, hops: int = 0) -> str:
        if path.startswith(("/", "\\")) or (path[1:2] == ":"):
            raise ArchiveError(f"{name!r} points to an absolute path")
        parts: list[str] = []
        pending = [p for p in path.split("/") if p not in ("", ".")]
        while pending:
            part = pending.pop(0)
            if part == "..":
                if not parts:
                    raise ArchiveError(f"{name!r} reaches outside the module directory")
                parts.pop()
                continue
            parts.append(part)
            target = self._links.get("/".join(parts))
            if target is not None and (pending or final):
                hops += 1
                if hops > self.MAX_HOPS or target.startswith(("/", "\\")):
                    raise ArchiveError(f"{name!r} follows a link outside the module directory")
                parts.pop()
                pending = [p for p in target.split("/") if p not in ("", ".")] + pending
        return "/".join(parts)


def _check_trailer(archive: tarfile.TarFile) -> None:
    """tarfile stops quietly at the first bad header: what follows the last member must be zero
    padding, read to the very end (which also checks the compressed stream's length and checksum)."""
    archive.fileobj.seek(archive.offset)
    while chunk := archive.fileobj.read(1 << 20):
        if chunk.strip(b"\0"):
            raise ArchiveError("archive has data after its last readable entry (corrupt or truncated)")


DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_MAX_UNPACKED_BYTES = 1 << 30
_DECOMPRESSORS = {"tar.gz": gzip.open, "tar.bz2": bz2.open, "tar.xz": lzma.open, "tar": open}


class _Capped:
    """A decompressed stream that refuses to be read or skipped past `limit` bytes.

    The tar checks go through this, so what is measured is the bytes actually inflated
    (whatever the member headers claim), and inflating stops at the limit.
    """

    def __init__(self, inner: IO[bytes], limit: int) -> None:
        self._inner = inner
        self._limit = limit

    def _refuse(self) -> ArchiveTooLargeError:
        return ArchiveTooLargeError(f"archive unpacks to more than {self._limit} bytes")

    def read(self, size: int = -1) -> bytes:
        room = self._limit - self._inner.tell() + 1  # one byte more shows that there is more
        data = self._inner.read(room if size < 0 else min(size, room))
        if self._inner.tell() > self._limit:
            raise self._refuse()
        return data

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = offset if whence == io.SEEK_SET else self._inner.tell() + offset
        if whence == io.SEEK_END or target > self._limit:
            raise self._refuse()
        return self._inner.seek(target)

    def tell(self) -> int:
        return self._inner.tell()


def check_archive(
    path: Path, kind: str, max_entries: int = DEFAULT_MAX_ENTRIES, max_unpacked_bytes: int = DEFAULT_MAX_UNPACKED_BYTES
) -> int:
    """Verify that `path` is a readable, safe archive of `kind`; returns the number of entries.

    Bounded without unpacking anything to disk or memory: at most `max_entries` entries, and at
    most `max_unpacked_bytes` both as declared by the entries (sparse tar files, zip headers) and
    as actually decompressed (the stream is counted while it is read, and reading stops there).
    """
    try:
        if kind == "zip":
            count = _check_zip(path, max_entries, max_unpacked_bytes)
        else:
            count = _check_tar(path, kind, max_entries, max_unpacked_bytes)
    except (
        tarfile.TarError,
        zipfile.BadZipFile,
        EOFError,
        OSError,
        KeyError,
        ValueError,
        zlib.error,
        lzma.LZMAError,
    ) as exc:
        if isinstance(exc, ArchiveError):
            raise
        raise ArchiveError(f"not a readable {kind} archive: {exc}") from None
    return count


def _check_zip(path: Path, max_entries: int, max_unpacked_bytes: int) -> int:
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        if len(infos) > max_entries:
            raise ArchiveTooLargeError(f"archive has more than {max_entries} entries")
        # zipfile inflates no member beyond its declared size, so this bounds testzip() too
        if sum(info.file_size for info in infos) > max_unpacked_bytes:
            raise ArchiveTooLargeError(f"archive unpacks to more than {max_unpacked_bytes} bytes")
        links = _Links()
        for info in infos:
            _check_name(info.filename)
            links.check_path(info.filename)
            if stat.S_ISLNK(info.external_attr >> 16):
                links.add(info.filename, archive.read(info).decode("utf-8", "replace"))
        if archive.testzip() is not None:
            raise ArchiveError("zip archive has a corrupt member")
        return len(infos)


def _check_tar(path: Path, kind: str, max_entries: int, max_unpacked_bytes: int) -> int:
    count = declared = 0
    links = _Links()
    with (
        _DECOMPRESSORS[kind](path, "rb") as stream,
        tarfile.open(fileobj=_Capped(stream, max_unpacked_bytes), mode="r:") as archive,
    ):
        for member in archive:
            count += 1
            if count > max_entries:
                raise ArchiveTooLargeError(f"archive has more than {max_entries} entries")
            declared += member.size if member.isreg() else 0  # a sparse file's size is its unpacked size
            if declared > max_unpacked_bytes:
                raise ArchiveTooLargeError(f"archive unpacks to more than {max_unpacked_bytes} bytes")
            _check_name(member.name)
            links.check_path(member.name)
            if member.issym():
                links.add(member.name, member.linkname)
            elif member.islnk():
                _check_name(member.linkname)  # hard link targets are relative to the archive root
                links.check_path(member.linkname + "/x")
            if member.isdev():
                raise ArchiveError(f"archive entry {member.name!r} is a device file")
        _check_trailer(archive)
    return count
