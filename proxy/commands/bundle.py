"""Air-gap bundles: `export` a proxy's verified cache to one file, `import` it elsewhere.

A bundle is a tar (optionally `.gz` or `.zst`) holding `manifest.json`, `metadata.jsonl`
(every metadata entry needed to serve: discovery, version lists, download metadata,
verified SHA256SUMS with signatures and keys, hashes, module records) and
`archives/<sha256>` files. Import trusts nothing in it: every provider archive is checked
again against its signed SHA256SUMS (signature, line, digest) and its `h1:` recomputed;
every module archive against its recorded digest and the archive safety rules, in a staging directory
outside the data dir (`verify_bundle`). One bad file rejects the whole bundle, naming the file, before
anything is written to the data dir (`import_verified` then adds it). Importing the same bundle twice
changes nothing.

Trust is anchored outside the bundle: a signature only counts if its key's fingerprint was
named by the operator (`--trust-key`, e.g. copied from `export`'s output or the registry's
published keys), or the operator explicitly accepted the keys the bundle carries
(`--trust-bundle-keys`). Discovery documents are imported only when every service stays on
the host that served the document, and version lists arrive stale, so a connected proxy asks again.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import gzip
import hashlib
import io
import json
import re
import shutil
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import zstandard
from yarl import URL

from proxy import __version__
from proxy.commands import CommandError
from proxy.commands.preflight import check_bundle_out
from proxy.domain.addresses import AddressError, ModuleAddr, ProviderAddr, Version
from proxy.domain.unsigned_policy import parse_unsigned_policy
from proxy.errors import ProxyError
from proxy.governance.gatekeeper import subject_of
from proxy.governance.inventory import download_info, provider_of, release_sums_key
from proxy.governance.policy import Policy
from proxy.governance.release_times import release_time_in
from proxy.metadata_store import CacheEntry, MetadataStore, keys, records
from proxy.metadata_store.records import ArchiveRecord, ModuleRecord, SumsRecord
from proxy.modules.packing import ArchiveError, check_archive
from proxy.protocol.safe_json import JSONDocumentError
from proxy.protocol.safe_json import loads as load_json
from proxy.providers.signatures import Keyring
from proxy.providers.verification import VerificationChain
from proxy.runtime.progress import Progress
from proxy.storage import ArchiveStore

FORMAT = "registry-proxy-bundle"
FORMAT_VERSION = 1
_ARCHIVE_MEMBER = re.compile(r"^archives/([0-9a-f]{64})\Z")
ZSTD_MAGIC, GZIP_MAGIC = b"\x28\xb5\x2f\xfd", b"\x1f\x8b"


@dataclass
class BundleReport:
    providers: list[str] = field(default_factory=list)
    signing_keys: set[str] = field(default_factory=set)
    modules: list[str] = field(default_factory=list)
    entries: int = 0
    archives: int = 0
    bytes: int = 0
    already_present: int = 0
    replaced_corrupt: int = 0  # files at a content address that did not hash to it: quarantined, replaced
    unsigned_left_out: list[str] = field(default_factory=list)  # export: no signature to carry them across
    denied_left_out: list[str] = field(default_factory=list)  # export: what the policy denies, with rule and reason


# ---- export ----------------------------------------------------------------------------------


async def export_bundle(
    cache: MetadataStore,
    store: ArchiveStore,
    out: Path,
    only: list[str],
    policy: Policy | None = None,
    progress: Progress | None = None,
) -> BundleReport:
    """Write every cached provider archive and module (or those matching `only`) with their metadata; what
    `policy` denies is left out (and listed in the report). `progress` counts the archives written."""
    check_bundle_out(out)
    progress = progress or Progress.silent()
    names, values = await read_cache(cache, progress)
    report = BundleReport()
    wanted: set[str] = set()
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "proxy_version": __version__,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "providers": [],
        "modules": [],
    }
    files: set[str] = set()
    for provider in await exportable_providers(names, values, store, only, policy, report):
        key, parts, record, entry = provider.key, provider.parts, provider.record, provider.download
        addr, version, platform = provider_of(parts)
        download_key = keys.DOWNLOAD.key_for(parts)
        sums_key = release_sums_key(parts, entry)
        related = [key, download_key, sums_key, keys.versions(addr), keys.discovery(addr.hostname)]
        wanted.update(k for k in related if k in values)
        siblings = [k for k in names if _same_release(keys.DOWNLOAD.parse(k), parts) and k != download_key]
        wanted.update(siblings)
        files.add(record.sha256)
        sums_record = records.decode(values.get(sums_key), SumsRecord)
        if sums_record and sums_record.fingerprint:
            report.signing_keys.add(sums_record.fingerprint)
        manifest["providers"].append(
            {
                "archive_key": key,
                "download_key": download_key,
                "sums_key": sums_key,
                "sha256": record.sha256,
                "filename": record.filename,
                "other_platforms": siblings,
            }
        )
        report.providers.append(f"{addr} {version} {platform}")
    for key in names:
        if (parts := keys.MODULE.parse(key)) and _selected(keys.MODULE.subject(key), only):
            record = records.decode(values.get(key), ModuleRecord)
            stored = await store.get(record.sha256) if record else None
            if record is None or stored is None:
                continue
            module = ModuleAddr.parse(parts["host"], parts["namespace"], parts["name"], parts["system"])
            refusal = _denied(policy, module, Version.parse(parts["version"]), None, values)
            if refusal is not None:
                report.denied_left_out.append(f"{module} {parts['version']}: {refusal}")
                continue
            versions_key = keys.MODULE_VERSIONS.key_for(parts)
            related = [key, keys.MODULE_DOWNLOAD.key_for(parts), versions_key, keys.DISCOVERY.key_for(parts)]
            wanted.update(k for k in related if k in values)
            files.add(record.sha256)
            manifest["modules"].append({"module_key": key, "sha256": record.sha256, "archive": record.archive})
            report.modules.append(f"{keys.MODULE_VERSIONS.subject(versions_key)} {parts['version']}")
    if not files:
        raise CommandError(
            "nothing to export: the cache holds no verified archives" + (f" matching {', '.join(only)}" if only else "")
        )
    progress.total(len(files))
    progress.note(f"writing {len(files)} archives and {len(wanted)} metadata entries to {out}")
    with _open_for_writing(out) as raw, tarfile.open(fileobj=raw, mode="w|") as tar:
        _add_bytes(tar, "manifest.json", json.dumps(manifest, indent=1, sort_keys=True).encode())
        lines = [json.dumps({"key": k, "value": base64.b64encode(values[k]).decode()}) for k in sorted(wanted)]
        _add_bytes(tar, "metadata.jsonl", ("\n".join(lines) + "\n").encode())
        for sha in sorted(files):
            async with store.local_copy(sha) as path:  # the store's own file, or a temp copy of the S3 object
                if path is None:
                    raise CommandError(f"archive {sha} vanished from the store during the export")
                tar.add(str(path), arcname=f"archives/{sha}", recursive=False)
                size = path.stat().st_size
                report.bytes += size
                progress.advance(bytes=size)
    report.entries, report.archives = len(wanted), len(files)
    return report


@dataclass(frozen=True)
class ExportableProvider:
    """A cached provider archive `export` carries: stored, with its download metadata, signed, allowed."""

    key: str  # its `archive:` key
    parts: dict[str, str]
    record: ArchiveRecord
    download: CacheEntry


async def read_cache(cache: MetadataStore, progress: Progress) -> tuple[list[str], dict[str, bytes]]:
    """Every key of the metadata store (sorted) and the values it still holds (noted on `progress`)."""
    names = sorted([key async for key in cache.keys()])  # noqa: SIM118 - an async iterator, not a dict
    values = {key: value for key in names if (value := await cache.get(key)) is not None}
    progress.note(f"read {len(names)} metadata entries")
    return names, values


async def exportable_providers(
    names: list[str],
    values: dict[str, bytes],
    store: ArchiveStore,
    only: list[str],
    policy: Policy | None,
    report: BundleReport,
) -> list[ExportableProvider]:
    """The verified provider archives of the cache (those matching `only`), in key order: stored, with
    download metadata, signed (nothing carries the TLS that vouched for an unsigned one across) and not
    denied by `policy`; the unsigned and the denied are listed in `report`."""
    exportable = []
    for key in names:
        if not (parts := keys.ARCHIVE.parse(key)) or not _selected(keys.ARCHIVE.subject(key), only):
            continue
        record = records.decode(values.get(key), ArchiveRecord)
        stored = await store.get(record.sha256) if record else None
        entry = CacheEntry.decode(values.get(keys.DOWNLOAD.key_for(parts)))
        if record is None or stored is None or entry is None or entry.negative:
            continue
        if record.unsigned:
            report.unsigned_left_out.append(keys.ARCHIVE.subject(key))
            continue
        addr, version, platform = provider_of(parts)
        refusal = _denied(policy, addr, version, str(platform), values)
        if refusal is not None:
            report.denied_left_out.append(f"{addr} {version} {platform}: {refusal}")
            continue
        exportable.append(ExportableProvider(key, parts, record, entry))
    return exportable


def _denied(
    policy: Policy | None, addr: ProviderAddr | ModuleAddr, version: Version, platform: str | None, values: dict
) -> str | None:
    """Why `policy` denies the artifact (rule: reason), or None. Its age: from the fleet's first-seen, baseline
    and publish times (an artifact without any has an unknown age, decided by the rule's unknown-age, as in the
    proxy)."""
    if policy is None:
        return None
    released = release_time_in(values.get(keys.first_seen(addr)), version, values.get(keys.baseline(addr)))
    decision = policy.decide(
        subject_of(addr, version, platform),
        published=released.counted_from,
        now=time.time(),
        age_source=released.decided_by,
        age_known=released.age_known,
    )
    return None if not decision.denied else f"denied by policy rule {decision.rule}: {decision.reason}"


def _selected(subject: str, only: list[str]) -> bool:
    """Whether a key's subject (`HOST/NAMESPACE/...`) is one `export --only` asked for (or all, without it)."""
    return not only or any(
        subject == o or subject.startswith(o.rstrip("/") + "/") for o in (pattern.replace("@", "/") for pattern in only)
    )


def _same_release(download: dict[str, str] | None, archive: dict[str, str]) -> bool:
    """Whether a download key's parts name the provider version of an archive key's parts."""
    return download is not None and all(download[p] == archive[p] for p in ("host", "namespace", "type", "version"))


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    info.mtime = int(dt.datetime.now(dt.UTC).timestamp())
    tar.addfile(info, io.BytesIO(data))


@contextmanager
def _open_for_writing(out: Path) -> Iterator[IO[bytes]]:
    temporary = out.with_name(f".{out.name}.partial")
    with open(temporary, "wb") as handle:
        if out.name.endswith(".zst"):
            with zstandard.ZstdCompressor(level=6).stream_writer(handle, closefd=False) as compressed:
                yield compressed
        elif out.name.endswith((".gz", ".tgz")):
            with gzip.GzipFile(fileobj=handle, mode="wb", mtime=0) as compressed:
                yield compressed
        else:
            yield handle
    temporary.replace(out)


# ---- import ----------------------------------------------------------------------------------


@dataclass
class VerifiedBundle:
    """A bundle whose every archive and record passed the checks: its archives unpacked in a staging directory
    (by digest), the metadata entries to store, and what the report says of it."""

    files: dict[str, Path]
    metadata: dict[str, bytes]
    records: dict[str, bytes]
    report: BundleReport


def verify_bundle(
    bundle: Path, staging: Path, keyring: Keyring, trusted_keys: set[str] | None, progress: Progress
) -> VerifiedBundle:
    """Unpack `bundle` into `staging` and verify everything in it (CommandError naming the first thing refused);
    nothing outside `staging` is written. `trusted_keys`: fingerprints whose signatures are accepted; None
    accepts the bundle's own keys. `progress` counts the archives unpacked (and hashed)."""
    report = BundleReport()
    progress.note(f"unpacking {bundle}")
    manifest, metadata, files = _unpack(bundle, staging, progress)
    progress.note(
        f"verifying {len(manifest.get('providers', []))} provider archives and "
        f"{len(manifest.get('modules', []))} modules"
    )
    records: dict[str, bytes] = {}
    chain = VerificationChain(keyring, parse_unsigned_policy("refuse"))  # a bundle carries no TLS across
    for entry in manifest.get("providers", []):
        key, raw, fingerprint = _verify_provider(entry, metadata, files, chain)
        report.signing_keys.add(fingerprint)
        if trusted_keys is not None and fingerprint not in trusted_keys:
            raise CommandError(
                f"bundle rejected: {keys.ARCHIVE.subject(key)} is signed by key {fingerprint}, which is not "
                "trusted; pass --trust-key with that fingerprint if it is the registry's real signing key"
            )
        records[key] = raw
        report.providers.append(keys.ARCHIVE.subject(key))
        for sibling in entry.get("other_platforms", []):
            _verify_sibling(entry, sibling, metadata, chain)
    for entry in manifest.get("modules", []):
        _verify_module(entry, metadata, files)
        report.modules.append(keys.MODULE.subject(entry["module_key"]))
    referenced = {e["sha256"] for e in manifest.get("providers", []) + manifest.get("modules", [])}
    for sha in sorted(files):
        if sha not in referenced:
            raise CommandError(f"bundle rejected: archives/{sha} is not described by the manifest")
    # Only metadata that belongs to a verified archive is taken: nothing else can be trusted.
    covered = _covered_keys(manifest)
    for key in sorted(metadata):
        if key not in covered:
            raise CommandError(f"bundle rejected: metadata entry {key!r} belongs to no archive in the manifest")
    report.entries = len(metadata)
    return VerifiedBundle(files, metadata, records, report)


@contextmanager
def verified_bundle(
    bundle: Path, trusted_keys: set[str] | None, progress: Progress | None = None
) -> Iterator[VerifiedBundle]:
    """`verify_bundle` in a staging directory of its own (in TMPDIR, removed afterwards), with a keyring of its
    own: the data dir is not touched until the bundle is known good."""
    with tempfile.TemporaryDirectory(prefix="registry-proxy-import-") as staging:
        keyring = Keyring(Path(staging) / "gnupg")
        try:
            verified = verify_bundle(bundle, Path(staging), keyring, trusted_keys, progress or Progress.silent())
        finally:
            keyring.close()
        yield verified


async def import_verified(
    verified: VerifiedBundle, cache: MetadataStore, store: ArchiveStore, progress: Progress | None = None
) -> BundleReport:
    """Add a verified bundle to the cache and the store (idempotent): its archives are moved from the staging
    directory into the store's own temp dir (renamed on the same filesystem, else copied), then published."""
    report = verified.report
    progress = progress or Progress.silent()
    arriving = store.temp_dir / "import"
    arriving.mkdir(parents=True, exist_ok=True)
    try:
        progress.note(
            f"adding {len(verified.files)} archives and {len(verified.metadata)} metadata entries to the data dir"
        )
        for sha, path in verified.files.items():
            present = await store.check(sha)  # a file already there counts only if it hashes to its address
            if present is not None and present.intact:
                report.already_present += 1
                continue
            if present is not None and await store.quarantine(sha, present.stored.version) is not None:
                report.replaced_corrupt += 1
            moved = Path(await asyncio.to_thread(shutil.move, path, arriving / sha))
            stored = await store.publish_path(moved, sha)
            report.archives += 1
            report.bytes += stored.size
        for key, value in {**_arriving_stale(verified.metadata), **verified.records}.items():
            await cache.set(key, value)
        return report
    finally:
        shutil.rmtree(arriving, ignore_errors=True)


def _unpack(
    bundle: Path, staging: Path, progress: Progress
) -> tuple[dict[str, Any], dict[str, bytes], dict[str, Path]]:
    manifest: dict[str, Any] | None = None
    metadata: dict[str, bytes] = {}
    files: dict[str, Path] = {}
    try:
        with _open_for_reading(bundle) as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
            for member in tar:
                if member.name == "manifest.json" and member.isfile():
                    manifest = _read_manifest(tar.extractfile(member).read())
                    progress.total(_archives_named(manifest))
                elif member.name == "metadata.jsonl" and member.isfile():
                    metadata = _read_metadata(tar.extractfile(member).read())
                elif (match := _ARCHIVE_MEMBER.match(member.name)) and member.isfile():
                    files[match[1]] = _extract_verified(tar, member, match[1], staging)
                    progress.advance(bytes=member.size)
                else:
                    raise CommandError(f"bundle rejected: unexpected member {member.name!r}")
    except (tarfile.TarError, zstandard.ZstdError, OSError, EOFError, ValueError) as exc:
        if isinstance(exc, CommandError):
            raise
        raise CommandError(f"bundle rejected: {bundle} is not a readable bundle: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CommandError(f"bundle rejected: {bundle} has no registry-proxy manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise CommandError(
            f"bundle rejected: format version {manifest.get('version')} is not supported "
            f"(this proxy reads version {FORMAT_VERSION})"
        )
    for section in ("providers", "modules"):
        entries = manifest.get(section, [])
        if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
            raise CommandError(f"bundle rejected: the manifest's {section!r} is not a list of entries")
    return manifest, metadata, files


def _archives_named(manifest: Any) -> int:
    """How many archives a manifest names (0 for one not well-formed, refused once the bundle is read)."""
    try:
        return len({entry["sha256"] for section in ("providers", "modules") for entry in manifest.get(section, [])})
    except (AttributeError, KeyError, TypeError):
        return 0


def _arriving_stale(metadata: dict[str, bytes]) -> dict[str, bytes]:
    """Version lists and discovery documents age out at once (a connected proxy asks again);
    a discovery document that sends a service to another host than its own is dropped."""
    result = {}
    for key, raw in metadata.items():
        kind = keys.kind_of(key)
        if kind in (keys.VERSIONS, keys.MODULE_VERSIONS, keys.DISCOVERY):
            entry = CacheEntry.decode(raw)
            if entry is None or (kind is keys.DISCOVERY and not _stays_on_host(entry)):
                continue
            raw = replace(entry, fetched_at=0.0).encode()
        result[key] = raw
    return result


def _stays_on_host(entry: CacheEntry) -> bool:
    """Every registry service of a discovery document is on the host the document came from."""
    try:
        services = load_json(entry.body)
        base = URL(entry.url)
        return isinstance(services, dict) and all(
            isinstance(v, str) and (target := base.join(URL(v))).host == base.host and target.port == base.port
            for k, v in services.items()
            if k in ("providers.v1", "modules.v1")
        )
    except (ValueError, TypeError):
        return False


def _covered_keys(manifest: dict[str, Any]) -> set[str]:
    covered: set[str] = set()
    for entry in manifest.get("providers", []):
        parts = keys.ARCHIVE.parse(entry.get("archive_key", ""))
        if parts:
            covered.update(
                {
                    entry["archive_key"],
                    entry.get("download_key", ""),
                    entry.get("sums_key", ""),
                    keys.VERSIONS.key_for(parts),
                    keys.DISCOVERY.key_for(parts),
                    *entry.get("other_platforms", []),
                }
            )
    for entry in manifest.get("modules", []):
        parts = keys.MODULE.parse(entry.get("module_key", ""))
        if parts:
            covered.update(
                {
                    entry["module_key"],
                    keys.MODULE_DOWNLOAD.key_for(parts),
                    keys.MODULE_VERSIONS.key_for(parts),
                    keys.DISCOVERY.key_for(parts),
                }
            )
    return covered


def _read_manifest(data: bytes) -> Any:
    try:
        return load_json(data)
    except JSONDocumentError as exc:
        raise CommandError(f"bundle rejected: its manifest.json {exc}") from None


def _read_metadata(data: bytes) -> dict[str, bytes]:
    result = {}
    for number, line in enumerate(data.decode().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = load_json(line)
        except JSONDocumentError as exc:
            raise CommandError(f"bundle rejected: metadata line {number} {exc}") from None
        key = item.get("key") if isinstance(item, dict) else None
        if not isinstance(key, str) or keys.kind_of(key) is None:
            raise CommandError(f"bundle rejected: metadata line {number} has an unknown key {key!r}")
        value = item.get("value")
        if not isinstance(value, str):
            raise CommandError(f"bundle rejected: metadata line {number} has no value")
        result[key] = base64.b64decode(value, validate=True)
    return result


def _extract_verified(tar: tarfile.TarFile, member: tarfile.TarInfo, sha: str, staging: Path) -> Path:
    """Copy a member out while hashing it: its content must have the digest it is named after."""
    target = staging / sha
    digest = hashlib.sha256()
    source = tar.extractfile(member)
    with open(target, "wb") as handle:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
            handle.write(chunk)
    if digest.hexdigest() != sha:
        raise CommandError(
            f"bundle rejected: archives/{sha} was modified (its content has SHA-256 {digest.hexdigest()})"
        )
    return target


def _verify_provider(
    entry: dict[str, Any], metadata: dict[str, bytes], files: dict[str, Path], chain: VerificationChain
) -> tuple[str, bytes, str]:
    """The chain, applied to a provider archive of the bundle: signature, the file's line, the archive (named
    by its digest, checked when it was unpacked) and its `h1:` hashes, recomputed."""
    name = f"{entry.get('filename')} (archives/{entry.get('sha256')})"
    try:
        parts = keys.ARCHIVE.parse(entry["archive_key"])
        if parts is None:
            raise ValueError("the manifest names no provider archive")
        if entry["download_key"] != keys.DOWNLOAD.key_for(parts):
            raise ValueError("the manifest pairs the archive with another provider's download metadata")
        addr, version, _ = provider_of(parts)
        info = download_info(parts, CacheEntry.decode(metadata[entry["download_key"]]))
        if info.unsigned:
            raise ValueError(
                "its registry lists no signing keys: a bundle cannot vouch for an unsigned provider "
                "(a proxy fetches it over TLS under --unsigned-providers)"
            )
        if entry["sums_key"] != keys.sums(info):
            raise ValueError("the manifest pairs the archive with another release's SHA256SUMS")
        carried = _sums_record(metadata, entry["sums_key"])
        sums = chain.verify_sums(addr, version, info, carried.sums, carried.signature)
        expected = chain.expected(addr, version, info, sums)
        path = files[expected.sha256]
        hashes = chain.archive_hashes(addr, version, info, path, expected)
    except KeyError as exc:
        raise CommandError(f"bundle rejected: {name}: missing {exc}") from None
    except (ProxyError, ValueError, TypeError, AttributeError, OSError) as exc:
        message = exc.message if isinstance(exc, ProxyError) else str(exc)
        raise CommandError(f"bundle rejected: {name}: {message}") from None
    if expected.sha256 != entry["sha256"]:
        raise CommandError(f"bundle rejected: {name}: the manifest's digest disagrees with the signed SHA256SUMS")
    record = hashes.record(path.stat().st_size, info.filename, unsigned=False)
    return entry["archive_key"], records.encode(record), sums.fingerprint


def _sums_record(metadata: dict[str, bytes], key: str) -> SumsRecord:
    """The SHA256SUMS and signature a bundle carries under `key` (KeyError when missing, ValueError when
    unreadable)."""
    record = records.decode(metadata[key], SumsRecord)
    if record is None:
        raise ValueError(f"the SHA256SUMS record {key} is unreadable")
    return record


def _verify_sibling(entry: dict[str, Any], key: str, metadata: dict[str, bytes], chain: VerificationChain) -> None:
    """Download metadata of another platform of a verified release: it must belong to the same signed
    SHA256SUMS (same URLs and keys) and its shasum must be the one the signed file lists."""
    parts = keys.DOWNLOAD.parse(key)
    try:
        if not _same_release(parts, keys.ARCHIVE.parse(entry["archive_key"])):
            raise ValueError("it is not a platform of the same provider version")
        addr, version, _ = provider_of(parts)
        info = download_info(parts, CacheEntry.decode(metadata[key]))
        if keys.sums(info) != entry["sums_key"]:
            raise ValueError("it does not belong to the release's signed SHA256SUMS")
        chain.expected(addr, version, info, chain.recorded_sums(info, _sums_record(metadata, entry["sums_key"])))
    except (KeyError, ValueError, TypeError, AttributeError, ProxyError) as exc:
        message = exc.message if isinstance(exc, ProxyError) else str(exc)
        raise CommandError(f"bundle rejected: metadata entry {key!r}: {message}") from None


def _verify_module(entry: dict[str, Any], metadata: dict[str, bytes], files: dict[str, Path]) -> None:
    name = f"{entry.get('module_key')} (archives/{entry.get('sha256')})"
    record = records.decode(metadata.get(entry.get("module_key", "")), ModuleRecord)
    if record is None or record.sha256 != entry.get("sha256") or record.sha256 not in files:
        raise CommandError(f"bundle rejected: {name}: its record is missing or disagrees with the archive")
    parts = keys.MODULE.parse(entry["module_key"])
    try:
        ModuleAddr.parse(parts["host"], parts["namespace"], parts["name"], parts["system"])
        check_archive(files[record.sha256], record.archive)
    except (ArchiveError, AddressError, TypeError) as exc:
        raise CommandError(f"bundle rejected: {name}: {exc}") from None


@contextmanager
def _open_for_reading(bundle: Path) -> Iterator[IO[bytes]]:
    with open(bundle, "rb") as handle:
        magic = handle.read(4)
        handle.seek(0)
        if magic.startswith(ZSTD_MAGIC):
            with zstandard.ZstdDecompressor().stream_reader(handle) as stream:
                yield stream
        elif magic.startswith(GZIP_MAGIC):
            with gzip.GzipFile(fileobj=handle) as stream:
                yield stream
        else:
            yield handle
