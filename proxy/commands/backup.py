"""`registry-proxy backup DIR` and `registry-proxy restore DIR`: what a data dir cannot get back by itself.

A backup is a directory laid out as the data dir, with `manifest.json` written last:

- `metadata/metadata.sqlite`, the embedded metadata store, copied with SQLite's online backup API in one step:
  one read transaction, so the copy is the store at one moment while the proxy goes on reading and writing (WAL
  mode: a reader blocks no writer), then made a self-contained file (no WAL beside it) and checked;
- with Redis, the records it keeps that no upstream gives back (`metadata/kept.jsonl`: the cooldown's first-seen
  times and baselines, the providers' signing keys; `proxy.commands.backup_kept`), sealed as Redis holds them;
- the data dir's key material: `metadata/metadata.secret` (every record's seal and the archive grants' key derive
  from it) and the generated CA with its key and the server certificate (`tls/`), which clients trust;
- with `--archives`, the verified archives (hard links where the backup is on the data dir's filesystem: an
  archive is never rewritten in place; else copies). Without, they are a cache, fetched again on the next
  request; behind an air gap they cannot be, and `registry-proxy export` carries them across;
- `manifest.json`: the format, when, the proxy's version, the metadata store's kind, what was left out and why,
  and each file's path, size, mode and SHA-256.

With Redis the rest of the metadata store is the fleet's cache, fetched again, and is not backed up.
The operator's own files (`--metadata-secret-file`, `--auth-tokens`, `--oidc-issuers`, `--policy`, `--tls-cert`,
`--tls-key`) are named in the output and the manifest, not copied: they belong with the configuration.

A restore reads the manifest, checks each path is one a backup holds and each file's size and SHA-256, and that
the secret it will run with opens the backup's records, before it writes anything; it refuses a data dir a
proxy (or a store command) is using, and without `force` one that already holds what it would write. The records
Redis keeps go back into the fleet's Redis first (a record Redis holds is kept, unless `force`). Each file
is written under a temporary name with its recorded mode and fsynced, then all are renamed into place (the old
database's WAL removed first: it would be replayed into the restored file). Last, every record of the restored
store (or those put back into Redis) is opened with the secret in force, and those that do not open are counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import os
import secrets
import shutil
import sqlite3
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from proxy.commands import CommandError
from proxy.commands.backup_files import (
    DATABASE,
    KEPT_RECORDS,
    MANIFEST,
    SECRET,
    TLS_FILES,
    Entry,
    Manifest,
    SealCount,
    copy_file,
    count_sealed,
    kind_of,
    link_or_copy,
    read_secret,
    write_atomically,
)
from proxy.commands.backup_kept import KeptRecords, KeptRestore, read_kept, where, write_kept
from proxy.metadata_store.embedded import BUSY_TIMEOUT
from proxy.metadata_store.sealed import Seal, accepted_secrets, given_secret, metadata_secret
from proxy.runtime.log import command_logging
from proxy.settings.config import ConfigError, Settings
from proxy.storage import archive_store, fsync_path, sha256_file

# The operator's files: named in a backup's output, never copied (they belong with the configuration).
_OPERATOR_FILES: tuple[tuple[str, Callable[[Settings], Path | None]], ...] = (
    ("--metadata-secret-file", lambda s: s.metadata.metadata_secret_file),
    ("--auth-tokens", lambda s: s.access.auth_tokens),
    ("--oidc-issuers", lambda s: s.access.oidc_issuers),
    ("--policy", lambda s: s.policy.policy_file),
    ("--tls-cert", lambda s: s.tls.tls_cert),
    ("--tls-key", lambda s: s.tls.tls_key),
)


# --- backup -------------------------------------------------------------------------------------------------


@dataclass
class BackupReport:
    manifest: Manifest
    records: SealCount | None = None  # the copied store's records (or Redis's kept ones) opened with the secret
    kept: KeptRecords | None = None  # with Redis: the records it keeps
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
        with command_logging():  # the store's own lines (Redis down, a marker written) on stderr
            report.kept, report.records = asyncio.run(read_kept(settings))
        (target / KEPT_RECORDS).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = report.kept.dump()
        write_atomically(target / KEPT_RECORDS, data, 0o600)
        manifest.files.append(Entry(KEPT_RECORDS, len(data), 0o600, hashlib.sha256(data).hexdigest()))
        manifest.left_out.append(
            f"the rest of the metadata store: Redis at {where(settings)}, the fleet's cache (the replicas fetch it "
            f"again); only the records no upstream gives back are ({KEPT_RECORDS})"
        )
    elif database.is_file():
        manifest.files.append(_copy_database(database, target / DATABASE))
        secret = given_secret(settings) or read_secret(settings.data_dir / SECRET)
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
            manifest.files.append(copy_file(settings.data_dir / path, target / path, path))
    if manifest.archives:
        _back_up_archives(settings.data_dir, target, report)
    else:
        manifest.left_out.append(
            "the archives: a cache, fetched again from the upstreams on the next request; behind an air gap they "
            "cannot be: carry them with `registry-proxy export`, or back them up with --archives"
        )
    manifest.left_out += _operator_files(settings)
    manifest.created = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    write_atomically(target / MANIFEST, manifest.dump(), 0o600)


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
    fsync_path(partial)
    os.replace(partial, dest)
    return Entry(DATABASE, dest.stat().st_size, mode, sha256_file(dest))


def _back_up_archives(data_dir: Path, target: Path, report: BackupReport) -> None:
    """Every archive at its content address, hard-linked or copied, hashed: one that is not what its address says
    is left out (and named)."""
    for source in sorted((data_dir / "archives" / "sha256").glob("*/*/*")):
        path = source.relative_to(data_dir).as_posix()
        if kind_of(path) != "archive" or not source.is_file():
            continue
        entry, linked = link_or_copy(source, target / path, path)
        if entry.sha256 != source.name:
            (target / path).unlink()
            report.corrupt.append(path)
            continue
        report.manifest.files.append(entry)
        report.linked += linked


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
    redis: KeptRestore | None = None  # with Redis: the kept records put back


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
    found = _checked_kept(settings, source) if KEPT_RECORDS in manifest.paths else None
    report = RestoreReport(manifest)
    if found is not None:
        with command_logging():
            report.redis = asyncio.run(write_kept(settings, found, force=force))
        report.records = report.redis.records
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
    secret = given or (read_secret(source / SECRET) if SECRET in manifest.paths else None)
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


def _checked_kept(settings: Settings, source: Path) -> KeptRecords:
    """The records Redis keeps, of the backup in `source`: restored only into Redis, and only when the secret in
    force opens the backup's marker (ConfigError otherwise)."""
    if not settings.metadata.redis_url:
        raise ConfigError(
            f"backup {source}: holds the records a fleet's Redis keeps ({KEPT_RECORDS}): restore it with the "
            "fleet's --redis-url and --metadata-secret (or --metadata-secret-file)"
        )
    found = KeptRecords.parse((source / KEPT_RECORDS).read_bytes(), f"backup {source}: {KEPT_RECORDS}")
    seal = Seal(metadata_secret(settings), store="redis", accepted=accepted_secrets(settings))
    marker = found.count(seal).marker
    if marker is None:
        raise CommandError(f"backup {source}: {KEPT_RECORDS} holds no fleet marker: nothing restored")
    if not marker:
        raise ConfigError(
            f"--metadata-secret differs from the one that sealed {source / KEPT_RECORDS} (the fleet's marker in it "
            "does not open): nothing restored"
        )
    return found


def _check_target(settings: Settings, manifest: Manifest, force: bool) -> None:
    """Refuse a data dir in use (a live process holds its staging lock), or holding what the restore would
    replace unless `force`; nothing of it when all the restore writes goes into Redis (a fleet's replicas go on
    serving meanwhile)."""
    data_dir = settings.data_dir
    if all(kind_of(entry.path) == "kept" for entry in manifest.files):
        return
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
        entry.path
        for entry in manifest.files
        if kind_of(entry.path) not in ("archive", "kept") and (data_dir / entry.path).exists()
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
            if kind_of(entry.path) == "kept":  # written back into Redis, not the data dir
                continue
            dest = data_dir / entry.path
            archive = kind_of(entry.path) == "archive"
            if archive and dest.is_file():  # at its content address: the same archive
                report.kept += 1
                continue
            dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            temporary = dest.with_name(f".{dest.name}.restore-{token}")
            staged.append((temporary, dest))
            if archive:
                written, _ = link_or_copy(source / entry.path, temporary, entry.path)
            else:
                written = copy_file(source / entry.path, temporary, entry.path, mode=entry.mode)
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
        fsync_path(folder)


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
        if entry.path == KEPT_RECORDS and report.kept is not None:
            lines.append(
                f"backed up {entry.path} ({entry.size} bytes): the {len(report.kept.records)} records Redis keeps that "
                f"no upstream gives back ({report.kept.kinds()}), sealed as they are"
            )
        if entry.path in (DATABASE, KEPT_RECORDS) and report.records is not None:
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
    if report.redis is not None:
        print(
            f"restored {report.redis.written} records Redis keeps into {where(settings)}"
            + (
                f"; {report.redis.present} it held already were kept (--force replaces them)"
                if report.redis.present
                else ""
            )
        )
    if report.redis is None or any(kind_of(entry.path) != "kept" for entry in report.manifest.files):
        print(
            f"restored {len(report.written)} files ({written} bytes) from {source} into {settings.data_dir}"
            + (f"; {report.kept} archives were there already" if report.kept else "")
        )
    if report.records is not None:
        print(_records_line(report.records))
        if report.records.refused:
            print(
                f"registry-proxy: warning: {len(report.records.refused)} records do not open with the metadata "
                "secret: "
                + (
                    "they count as lost (a min-age rule holds those versions until baselined; a signing key is new "
                    "again)"
                    if report.redis is not None
                    else "they are fetched again when asked for"
                ),
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
