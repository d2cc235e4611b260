"""Module archives: deterministic `.tar.gz` packing and safety checks of fetched archives.

Packing sorts entries, fixes owner, group, modes and times (the commit time) and writes a
gzip stream with no name or time in its header, so the same tree gives the same bytes.
Checking refuses archives the clients would unpack outside their module directory
(absolute paths, `..`, links that point out) and anything that is not a readable archive.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

GZIP_LEVEL = 6


class ArchiveError(ValueError):
    """The archive is unreadable or unsafe."""


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
    with open(output, "wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=GZIP_LEVEL) as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
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


def check_archive(path: Path, kind: str, max_entries: int = 100_000) -> int:
    """Verify that `path` is a readable, safe archive of `kind`; returns the number of entries."""
    try:
        if kind == "zip":
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
                links = _Links()
                for info in archive.infolist():
                    _check_name(info.filename)
                    links.check_path(info.filename)
                    if stat.S_ISLNK(info.external_attr >> 16):
                        links.add(info.filename, archive.read(info).decode("utf-8", "replace"))
                if archive.testzip() is not None:
                    raise ArchiveError("zip archive has a corrupt member")
                count = len(names)
        else:
            mode = {"tar.gz": "r:gz", "tar.bz2": "r:bz2", "tar.xz": "r:xz", "tar": "r:"}[kind]
            count = 0
            links = _Links()
            with tarfile.open(path, mode) as archive:
                for member in archive:
                    count += 1
                    if count > max_entries:
                        raise ArchiveError(f"archive has more than {max_entries} entries")
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
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, KeyError, ValueError) as exc:
        if isinstance(exc, ArchiveError):
            raise
        raise ArchiveError(f"not a readable {kind} archive: {exc}") from None
    return count
