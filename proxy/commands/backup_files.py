"""A backup's layout and its files (`proxy.commands.backup`): the manifest, the paths a backup may hold, the
records of a metadata store (a file's, or those Redis keeps) opened with a seal, and files copied with their
modes, hashed and fsynced."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sqlite3
import stat
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from proxy import __version__
from proxy.commands import CommandError
from proxy.metadata_store.embedded import DATABASE_FILE, TABLE
from proxy.metadata_store.keys import FLEET_SECRET
from proxy.metadata_store.sealed import SECRET_FILE, Seal
from proxy.settings.config import CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY
from proxy.storage import fsync_path, sha256_file

FORMAT = 1
CHUNK = 1 << 20
MANIFEST = "manifest.json"
DATABASE = f"metadata/{DATABASE_FILE}"
SECRET = f"metadata/{SECRET_FILE}"
KEPT_RECORDS = "metadata/kept.jsonl"  # with Redis: the records no upstream gives back (`proxy.commands.backup_kept`)
TLS_FILES = {
    f"tls/{CA_CERT}": "the generated CA's certificate (clients trust it)",
    f"tls/{CA_KEY}": "the generated CA's key",
    f"tls/{SERVER_CERT}": "the server certificate the CA signed",
    f"tls/{SERVER_KEY}": "the server certificate's key",
}
_ARCHIVE = re.compile(r"archives/sha256/([0-9a-f]{2})/([0-9a-f]{2})/(\1\2[0-9a-f]{60})\Z")


@dataclass(frozen=True)
class Entry:
    """One file of a backup: its path (in the backup and the data dir alike), size, mode and SHA-256."""

    path: str
    size: int
    mode: int
    sha256: str


@dataclass
class Manifest:
    store: str  # "embedded" or "redis"
    files: list[Entry] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    archives: bool = False  # whether the archives were asked for (--archives)
    created: str = ""
    proxy_version: str = __version__
    format: int = FORMAT

    def dump(self) -> bytes:
        document = asdict(self)
        document["files"] = [{**asdict(entry), "mode": f"{entry.mode:04o}"} for entry in self.files]
        return json.dumps(document, indent=1).encode() + b"\n"

    @classmethod
    def load(cls, directory: Path) -> Manifest:
        """The manifest of the backup in `directory` (CommandError: none, or not one a backup writes)."""
        try:
            document = json.loads((directory / MANIFEST).read_bytes())
        except FileNotFoundError:
            raise CommandError(f"backup {directory}: no {MANIFEST}: not a backup, or one that did not finish") from None
        except ValueError as exc:
            raise CommandError(f"backup {directory}: {MANIFEST} is not JSON ({exc})") from None
        try:
            if document["format"] > FORMAT:
                raise CommandError(
                    f"backup {directory}: format {document['format']} is newer than this version reads ({FORMAT}): "
                    f"restore it with the version that wrote it ({document.get('proxy_version')})"
                )
            files = [
                Entry(str(f["path"]), int(f["size"]), int(f["mode"], 8), str(f["sha256"])) for f in document["files"]
            ]
            manifest = cls(
                store=str(document["store"]),
                files=files,
                left_out=[str(reason) for reason in document["left_out"]],
                archives=bool(document["archives"]),
                created=str(document["created"]),
                proxy_version=str(document["proxy_version"]),
                format=int(document["format"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CommandError(f"backup {directory}: {MANIFEST} is not a backup manifest ({exc!r})") from None
        for entry in manifest.files:
            if kind_of(entry.path) is None:
                raise CommandError(f"backup {directory}: {MANIFEST} names {entry.path!r}, which no backup holds")
        return manifest

    @property
    def paths(self) -> set[str]:
        return {entry.path for entry in self.files}


def kind_of(path: str) -> str | None:
    """What a path of a backup holds ("metadata", "kept" (written back into Redis, not the data dir), "secret",
    "tls", "archive"); None: nothing a backup holds (a manifest naming it is refused, so that no restore writes
    outside these paths)."""
    if path == DATABASE:
        return "metadata"
    if path == KEPT_RECORDS:
        return "kept"
    if path == SECRET:
        return "secret"
    if path in TLS_FILES:
        return "tls"
    return "archive" if _ARCHIVE.match(path) else None


@dataclass(frozen=True)
class SealCount:
    """The records of a metadata store, opened with a seal: how many open, the keys of those that do not, and
    whether the fleet's marker opens (None: there is none)."""

    opened: int
    refused: list[str]
    marker: bool | None


def count_sealed(database: Path, seal: Seal) -> SealCount:
    """Open every record of the metadata store file `database` (read as a file nobody writes: nothing is
    created beside it) with `seal`."""
    uri = f"{database.resolve().as_uri()}?immutable=1"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            rows = db.execute(f"SELECT key, value FROM `{TABLE}` ORDER BY key")
            # (a row written by anyone but the proxy may have any type)
            return count_records(
                (
                    (str(key), bytes(raw) if isinstance(raw, bytes | memoryview) else str(raw).encode())
                    for key, raw in rows
                ),
                seal,
            )
    except sqlite3.Error as exc:
        raise CommandError(f"{database}: not a readable metadata store ({exc})") from None


def count_records(records: Iterable[tuple[str, bytes]], seal: Seal) -> SealCount:
    """Open every `(key, stored value)` of `records` (the fleet's marker among them, if it is there) with `seal`."""
    opened, refused, marker = 0, [], None
    for key, stored in records:
        opens = seal.unseal(key, stored)[0] is not None
        if key == FLEET_SECRET:
            marker = opens
        elif opens:
            opened += 1
        else:
            refused.append(key)
    return SealCount(opened, refused, marker)


def link_or_copy(source: Path, dest: Path, path: str) -> tuple[Entry, bool]:
    """A hard link of `source` at `dest` (for an archive: never rewritten in place, so a link is a snapshot), else
    a copy; its Entry, hashed, and whether it is a link."""
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.link(source, dest)
    except OSError:  # another filesystem, or links refused
        return copy_file(source, dest, path), False
    st = dest.stat()
    return Entry(path, st.st_size, stat.S_IMODE(st.st_mode), sha256_file(dest)), True


def copy_file(source: Path, dest: Path, path: str, *, mode: int | None = None) -> Entry:
    """Copy `source` to the new file `dest` (with `mode`, by default the source's), hashing it, fsynced."""
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = stat.S_IMODE(source.stat().st_mode) if mode is None else mode
    digest, size = hashlib.sha256(), 0
    with open(source, "rb") as reader, _created(dest, mode) as writer:
        while chunk := reader.read(CHUNK):
            digest.update(chunk)
            writer.write(chunk)
            size += len(chunk)
    return Entry(path, size, mode, digest.hexdigest())


@contextlib.contextmanager
def _created(path: Path, mode: int) -> Iterator[IO[bytes]]:
    """A new file with exactly `mode` (whatever the umask), fsynced when done, removed when writing failed."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode & 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            yield handle
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def write_atomically(path: Path, data: bytes, mode: int) -> None:
    """`data` as the file `path` with `mode`, whole or not at all."""
    temporary = path.with_name(f".{path.name}.partial")
    temporary.unlink(missing_ok=True)
    with _created(temporary, mode) as handle:
        handle.write(data)
    os.replace(temporary, path)
    fsync_path(path.parent)


def read_secret(path: Path) -> bytes | None:
    """The data dir's own metadata secret, if it has one (never made here: `metadata_secret` would)."""
    try:
        return path.read_bytes().strip() or None
    except FileNotFoundError:
        return None
