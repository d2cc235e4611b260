"""`registry-proxy backup DIR` and `registry-proxy restore DIR`: what a data dir cannot get back by itself.

A backup is a directory laid out as the data dir, with `manifest.json` written last:

- `metadata/metadata.sqlite`, the embedded metadata store, copied with SQLite's online backup API in one step:
  one read transaction, so the copy is the store at one moment while the proxy goes on reading and writing (WAL
  mode: a reader blocks no writer), then made a self-contained file (no WAL beside it) and checked;
- the data dir's key material: `metadata/metadata.secret` (every record's seal and the archive grants' key derive
  from it) and the generated CA with its key and the server certificate (`tls/`), which clients trust;
- with `--archives`, the verified archives (hard links where the backup is on the data dir's filesystem: an
  archive is never rewritten in place; else copies). Without, they are a cache, fetched again on the next
  request; behind an air gap they cannot be, and `registry-proxy export` carries them across;
- `manifest.json`: the format, when, the proxy's version, the metadata store's kind, what was left out and why,
  and each file's path, size, mode and SHA-256.

With Redis the metadata store is the fleet's cache and is not backed up: only the data dir's key material is.
The operator's own files (`--metadata-secret-file`, `--auth-tokens`, `--oidc-issuers`, `--policy`, `--tls-cert`,
`--tls-key`) are named in the output and the manifest, not copied: they belong with the configuration.

A restore reads the manifest, checks each path is one a backup holds and each file's size and SHA-256, and that
the secret it will run with opens the backup's records, before it writes anything; it refuses a data dir a
proxy (or a store command) is using, and without `force` one that already holds what it would write. Each file
is written under a temporary name with its recorded mode and fsynced, then all are renamed into place (the old
database's WAL removed first: it would be replayed into the restored file). Last, every record of the restored
store is opened with the secret in force, and those that do not open are counted.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import secrets
import shutil
import sqlite3
import stat
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from proxy import __version__
from proxy.commands import CommandError
from proxy.metadata_store.embedded import BUSY_TIMEOUT, DATABASE_FILE, TABLE
from proxy.metadata_store.keys import FLEET_SECRET
from proxy.metadata_store.sealed import SECRET_FILE, Seal, accepted_secrets, given_secret, metadata_secret
from proxy.settings.config import ConfigError, Settings
from proxy.storage import archive_store, sha256_file

FORMAT = 1
CHUNK = 1 << 20
MANIFEST = "manifest.json"
DATABASE = f"metadata/{DATABASE_FILE}"
SECRET = f"metadata/{SECRET_FILE}"
TLS_FILES = {
    "tls/ca.pem": "the generated CA's certificate (clients trust it)",
    "tls/ca-key.pem": "the generated CA's key",
    "tls/server.pem": "the server certificate the CA signed",
    "tls/server-key.pem": "the server certificate's key",
}
_ARCHIVE = re.compile(r"archives/sha256/([0-9a-f]{2})/([0-9a-f]{2})/(\1\2[0-9a-f]{60})\Z")
# The operator's files: named in a backup's output, never copied (they belong with the configuration).
_OPERATOR_FILES: tuple[tuple[str, Callable[[Settings], Path | None]], ...] = (
    ("--metadata-secret-file", lambda s: s.metadata.metadata_secret_file),
    ("--auth-tokens", lambda s: s.access.auth_tokens),
    ("--oidc-issuers", lambda s: s.access.oidc_issuers),
    ("--policy", lambda s: s.policy.policy_file),
    ("--tls-cert", lambda s: s.tls.tls_cert),
    ("--tls-key", lambda s: s.tls.tls_key),
)


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
    """What a path of a backup holds ("metadata", "secret", "tls", "archive"); None: nothing a backup holds (a
    manifest naming it is refused, so that no restore writes outside these paths)."""
    if path == DATABASE:
        return "metadata"
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
    opened, refused, marker = 0, [], None
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            for key, raw in db.execute(f"SELECT key, value FROM `{TABLE}` ORDER BY key"):
                stored = bytes(raw) if isinstance(raw, bytes | memoryview) else str(raw).encode()
                opens = seal.unseal(key, stored)[0] is not None
                if key == FLEET_SECRET:
                    marker = opens
                elif opens:
                    opened += 1
                else:
                    refused.append(key)
    except sqlite3.Error as exc:
        raise CommandError(f"{database}: not a readable metadata store ({exc})") from None
    return SealCount(opened, refused, marker)


# --- backup -------------------------------------------------------------------------------------------------


@dataclass
class BackupReport:
    manifest: Manifest
    records: SealCount | None = None  # the copied store's records opened with the metadata secret
    linked: int = 0  # archives hard-linked (the others copied)
    corrupt: list[str] = field(default_factory=list)  # archives left out: not what their address says


def backup(settings: Settings, target: Path, *, archives: bool, force: bool) -> BackupReport:
    """Back the data dir of `settings` up into `target` (new or empty; or, with `force`, an earlier backup)."""
    if archives and settings.archives.s3_location is not None:
        raise ConfigError(
            "--archives: the archives are in object storage (--archive-store): back the bucket up with its own tools"
        )
    _clear_target(target, force)
    report = BackupReport(Manifest("redis" if settings.metadata.redis_url else "embedded", archives=archives))
    try:
        _write_backup(settings, target, report)
    except BaseException:
        _empty(target)  # nothing half-written is left for the next run to refuse
        raise
    return report


def _write_backup(settings: Settings, target: Path, report: BackupReport) -> None:
    manifest = report.manifest
    database = settings.data_dir / DATABASE
    if manifest.store == "redis":
        manifest.left_out.append(
            "the metadata store: Redis, the fleet's cache (the replicas fetch it again); only the data dir's "
            "secrets are backed up"
        )
    elif database.is_file():
        manifest.files.append(_copy_database(database, target / DATABASE))
        secret = given_secret(settings) or _read_secret(settings.data_dir / SECRET)
        if secret is not None:
            seal = Seal(secret, store="embedded", accepted=accepted_secrets(settings))
            report.records = count_sealed(target / DATABASE, seal)
        else:
            manifest.left_out.append(
                "the metadata secret: not in the data dir (the proxy is given --metadata-secret or "
                "--metadata-secret-file, which this backup was not): keep it with the configuration; restore needs it"
            )
    else:
        manifest.left_out.append(f"the metadata store: {database} does not exist (yet)")
    for path in (SECRET, *TLS_FILES):
        if (settings.data_dir / path).is_file():
            manifest.files.append(_copy(settings.data_dir / path, target / path, path))
    if manifest.archives:
        _back_up_archives(settings.data_dir, target, report)
    else:
        manifest.left_out.append(
            "the archives: a cache, fetched again from the upstreams on the next request; behind an air gap they "
            "cannot be: carry them with `registry-proxy export`, or back them up with --archives"
        )
    manifest.left_out += _operator_files(settings)
    manifest.created = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    _write_atomically(target / MANIFEST, manifest.dump(), 0o600)


def _clear_target(target: Path, force: bool) -> None:
    """Make `target` an empty directory: refuse a file, a non-empty directory that is not a backup, and an
    earlier backup without `force` (whose manifest goes first: a backup replaced halfway is never taken for
    whole)."""
    if target.exists() and not target.is_dir():
        raise ConfigError(f"backup {target}: not a directory")
    entries = sorted(target.iterdir()) if target.is_dir() else []
    if entries:
        if not (target / MANIFEST).is_file():
            raise ConfigError(f"backup {target}: not empty, and not a backup: name a new or empty directory")
        if not force:
            raise ConfigError(
                f"backup {target}: holds a backup already: name a new directory, or --force to replace it"
            )
        (target / MANIFEST).unlink()
        _empty(target)
    target.mkdir(parents=True, exist_ok=True, mode=0o700)


def _empty(directory: Path) -> None:
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink(missing_ok=True)


def _copy_database(source: Path, dest: Path) -> Entry:
    """The store at one moment (SQLite's online backup, in one step), as one file with no WAL, checked."""
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = dest.with_name(f".{dest.name}.partial")
    partial.unlink(missing_ok=True)
    try:
        with (
            contextlib.closing(sqlite3.connect(source, timeout=BUSY_TIMEOUT)) as reader,
            contextlib.closing(sqlite3.connect(partial)) as writer,
        ):
            reader.backup(writer)
            writer.execute("PRAGMA journal_mode=DELETE")
            problems = [row[0] for row in writer.execute("PRAGMA quick_check")]
    except sqlite3.Error as exc:
        partial.unlink(missing_ok=True)
        raise CommandError(f"{source}: could not be backed up: {exc}") from None
    if problems != ["ok"]:
        partial.unlink(missing_ok=True)
        raise CommandError(
            f"{source}: damaged ({'; '.join(problems[:3])}): not backed up; the proxy moves a damaged file aside on "
            "its next start (docs/operations.md, 'A damaged metadata file')"
        )
    mode = stat.S_IMODE(source.stat().st_mode)
    os.chmod(partial, mode)
    _fsync(partial)
    os.replace(partial, dest)
    return Entry(DATABASE, dest.stat().st_size, mode, sha256_file(dest))


def _back_up_archives(data_dir: Path, target: Path, report: BackupReport) -> None:
    """Every archive at its content address, hard-linked or copied, hashed: one that is not what its address says
    is left out (and named)."""
    for source in sorted((data_dir / "archives" / "sha256").glob("*/*/*")):
        path = source.relative_to(data_dir).as_posix()
        if kind_of(path) != "archive" or not source.is_file():
            continue
        entry, linked = _link_or_copy(source, target / path, path)
        if entry.sha256 != source.name:
            (target / path).unlink()
            report.corrupt.append(path)
            continue
        report.manifest.files.append(entry)
        report.linked += linked


def _link_or_copy(source: Path, dest: Path, path: str) -> tuple[Entry, bool]:
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.link(source, dest)
    except OSError:  # another filesystem, or links refused
        return _copy(source, dest, path), False
    st = dest.stat()
    return Entry(path, st.st_size, stat.S_IMODE(st.st_mode), sha256_file(dest)), True


def _operator_files(settings: Settings) -> list[str]:
    lines = [
        f"{flag} {path}: the operator's file, not the data dir's: keep it with the configuration"
        for flag, path_of in _OPERATOR_FILES
        if (path := path_of(settings)) is not None
    ]
    if settings.metadata.metadata_secret:
        lines.append("--metadata-secret: given on the command line, not the data dir's: keep it with the configuration")
    return lines


# --- restore ------------------------------------------------------------------------------------------------


@dataclass
class RestoreReport:
    manifest: Manifest
    written: list[Entry] = field(default_factory=list)
    kept: int = 0  # archives the data dir had already (at the same content address)
    records: SealCount | None = None  # the restored store's records opened with the secret in force


def restore(settings: Settings, source: Path, *, force: bool) -> RestoreReport:
    """Restore the backup in `source` into the data dir of `settings` (see the module docstring)."""
    if not source.is_dir():
        raise ConfigError(f"backup {source}: no such directory")
    manifest = Manifest.load(source)
    _check_target(settings, manifest, force)
    for entry in manifest.files:
        _check_file(source, entry)
    if DATABASE in manifest.paths:
        _check_seals(settings, source, manifest)
    report = RestoreReport(manifest)
    _write_all(source, settings.data_dir, report)
    if DATABASE in manifest.paths:
        seal = Seal(metadata_secret(settings), store="embedded", accepted=accepted_secrets(settings))
        report.records = count_sealed(settings.data_dir / DATABASE, seal)
    return report


def _check_file(source: Path, entry: Entry) -> None:
    path = source / entry.path
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CommandError(
            f"backup {source}: {entry.path} is missing (the manifest lists it): nothing restored"
        ) from None
    if size != entry.size or sha256_file(path) != entry.sha256:
        raise CommandError(
            f"backup {source}: {entry.path} was modified (its size or SHA-256 is not the manifest's): nothing restored"
        )


def _check_seals(settings: Settings, source: Path, manifest: Manifest) -> None:
    """The secret the restored store will be read with opens the backup's fleet marker (ConfigError otherwise)."""
    given = given_secret(settings)
    secret = given or (_read_secret(source / SECRET) if SECRET in manifest.paths else None)
    if secret is None:
        raise ConfigError(
            f"backup {source}: holds no metadata secret (the proxy was given one): restore with the same "
            "--metadata-secret or --metadata-secret-file"
        )
    count = count_sealed(source / DATABASE, Seal(secret, store="embedded", accepted=accepted_secrets(settings)))
    if count.marker is False:
        raise ConfigError(
            f"--metadata-secret differs from the one that sealed {source / DATABASE}: nothing restored"
            if given
            else f"backup {source}: its metadata store was not sealed with its {SECRET} (the proxy ran with "
            "--metadata-secret): restore with the same --metadata-secret or --metadata-secret-file"
        )


def _check_target(settings: Settings, manifest: Manifest, force: bool) -> None:
    """Refuse a data dir in use (a live process holds its staging lock), or holding what the restore would
    replace unless `force`."""
    data_dir = settings.data_dir
    if data_dir.exists() and not data_dir.is_dir():
        raise ConfigError(f"--data-dir {data_dir}: not a directory")
    store = archive_store(settings)  # not opened: its staging area is only looked at
    abandoned = set(store.abandoned_temp_dirs())
    if any(path not in abandoned for path in store.temp_dirs()):
        raise CommandError(
            f"--data-dir {data_dir} is in use (a running proxy, or an import or export, holds a temp dir in "
            f"{store.temp_root}): stop it, then restore"
        )
    present = [
        entry.path for entry in manifest.files if kind_of(entry.path) != "archive" and (data_dir / entry.path).exists()
    ]
    if present and not force:
        raise ConfigError(
            f"--data-dir {data_dir} already holds {', '.join(present)}: restore into a new data dir, or --force to "
            "replace them"
        )


def _write_all(source: Path, data_dir: Path, report: RestoreReport) -> None:
    """Every file under a temporary name beside its place (verified again as copied), then renamed into place."""
    token = secrets.token_hex(4)
    staged: list[tuple[Path, Path]] = []
    try:
        for entry in report.manifest.files:
            dest = data_dir / entry.path
            archive = kind_of(entry.path) == "archive"
            if archive and dest.is_file():  # at its content address: the same archive
                report.kept += 1
                continue
            dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            temporary = dest.with_name(f".{dest.name}.restore-{token}")
            staged.append((temporary, dest))
            if archive:
                written, _ = _link_or_copy(source / entry.path, temporary, entry.path)
            else:
                written = _copy(source / entry.path, temporary, entry.path, mode=entry.mode)
            if written.sha256 != entry.sha256:
                raise CommandError(f"backup {source}: {entry.path} changed while it was restored: nothing restored")
            report.written.append(entry)
    except BaseException:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
        raise
    if DATABASE in report.manifest.paths:
        for suffix in ("-wal", "-shm", "-journal"):  # the replaced database's: replayed into the restored one
            (data_dir / f"{DATABASE}{suffix}").unlink(missing_ok=True)
    for temporary, dest in staged:
        os.replace(temporary, dest)
    for folder in {dest.parent for _, dest in staged}:
        _fsync(folder)


# --- files --------------------------------------------------------------------------------------------------


def _copy(source: Path, dest: Path, path: str, *, mode: int | None = None) -> Entry:
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


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    temporary = path.with_name(f".{path.name}.partial")
    temporary.unlink(missing_ok=True)
    with _created(temporary, mode) as handle:
        handle.write(data)
    os.replace(temporary, path)
    _fsync(path.parent)


def _fsync(path: Path) -> None:
    """Flush a file's or a directory's entries to the disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _read_secret(path: Path) -> bytes | None:
    """The data dir's own metadata secret, if it has one (never made here: `metadata_secret` would)."""
    try:
        return path.read_bytes().strip() or None
    except FileNotFoundError:
        return None


# --- the commands' output -------------------------------------------------------------------------------------

_DESCRIPTIONS = {
    DATABASE: "the embedded metadata store",
    SECRET: "the data dir's metadata secret (seals the embedded store's records)",
    **TLS_FILES,
}


def backup_command(settings: Settings, target: Path, *, archives: bool, force: bool) -> int:
    report = backup(settings, target, archives=archives, force=force)
    for line in backup_lines(report, target):
        print(line)
    for path in report.corrupt:
        print(f"left out {path}: not what its content address says (`registry-proxy verify --repair`)", file=sys.stderr)
    return 0


def backup_lines(report: BackupReport, target: Path) -> list[str]:
    manifest = report.manifest
    lines = []
    for entry in manifest.files:
        if entry.path in _DESCRIPTIONS:
            lines.append(f"backed up {entry.path} ({entry.size} bytes): {_DESCRIPTIONS[entry.path]}")
        if entry.path == DATABASE and report.records is not None:
            lines.append(f"  {_records_line(report.records)}")
    archives = [entry for entry in manifest.files if kind_of(entry.path) == "archive"]
    if manifest.archives:
        lines.append(
            f"backed up {len(archives)} archives ({sum(e.size for e in archives)} bytes; {report.linked} hard-linked, "
            f"{len(archives) - report.linked} copied)"
        )
    lines += [f"not backed up: {reason}" for reason in manifest.left_out]
    lines.append(
        f"backup: {target / MANIFEST} lists {len(manifest.files)} files ({sum(e.size for e in manifest.files)} bytes); "
        f"restore with `registry-proxy restore {target}`"
    )
    return lines


def restore_command(settings: Settings, source: Path, *, force: bool) -> int:
    report = restore(settings, source, force=force)
    written = sum(entry.size for entry in report.written)
    print(
        f"restored {len(report.written)} files ({written} bytes) from {source} into {settings.data_dir}"
        + (f"; {report.kept} archives were there already" if report.kept else "")
    )
    if report.records is not None:
        print(_records_line(report.records))
        if report.records.refused:
            print(
                f"registry-proxy: warning: {len(report.records.refused)} records do not open with the metadata "
                "secret: they are fetched again when asked for",
                file=sys.stderr,
            )
    return 0


def _records_line(count: SealCount) -> str:
    refused = len(count.refused)
    marker = {True: "the fleet's marker opens", False: "the fleet's marker does NOT open", None: "no fleet marker"}
    return (
        f"records: {count.opened} open with the metadata secret, {refused} do not"
        + (f" ({', '.join(count.refused[:5])}{', ...' if refused > 5 else ''})" if refused else "")
        + f"; {marker[count.marker]}"
    )
