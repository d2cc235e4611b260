"""`export --format filesystem-mirror`: the verified cache as a directory the clients' `filesystem_mirror` reads.

For an air-gapped side that cannot run the proxy. The packed layout only (proxy.protocol.mirror_layout): each
archive is the registry's zip byte for byte, so both hashes a lock file records for it hold (`zh:`, the
SHA-256 the signed SHA256SUMS lists, and `h1:`); an unpacked directory would keep only the `h1:`. The archives
are those a bundle carries (stored, signed, allowed by the policy), each hashed again while it is copied, and
each written to a temp file beside its place and renamed into it; a file already there with the same content
is left alone, one with other content replaced.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from proxy.commands import CommandError
from proxy.commands.bundle import BundleReport, exportable_providers, read_cache
from proxy.commands.preflight import check_mirror_directory
from proxy.governance.inventory import provider_of
from proxy.governance.policy import Policy
from proxy.metadata_store import MetadataStore
from proxy.protocol.mirror_layout import packed_path
from proxy.runtime.progress import Progress
from proxy.storage import ArchiveStore


async def export_filesystem_mirror(
    cache: MetadataStore,
    store: ArchiveStore,
    out: Path,
    only: list[str],
    policy: Policy | None = None,
    progress: Progress | None = None,
) -> BundleReport:
    """Write every verified provider archive of the cache (or those matching `only`) into `out` in the packed
    layout; `report.archives` counts the files written, `already_present` those left as they were,
    `replaced_corrupt` those whose other content was replaced."""
    check_mirror_directory(out)
    progress = progress or Progress.silent()
    names, values = await read_cache(cache, progress)
    report = BundleReport()
    providers = await exportable_providers(names, values, store, only, policy, report)
    if not providers:
        raise CommandError(
            "nothing to export: the cache holds no verified provider archives"
            + (f" matching {', '.join(only)}" if only else "")
        )
    progress.total(len(providers))
    progress.note(f"writing {len(providers)} provider archives into {out}")
    for provider in providers:
        addr, version, platform = provider_of(provider.parts)
        target = out / packed_path(addr, version, platform)
        sha256 = provider.record.sha256
        report.providers.append(f"{addr} {version} {platform}")
        try:
            present = _digest_of(target)
            if present == sha256:
                report.already_present += 1
                progress.advance()
                continue
            async with store.local_copy(sha256) as path:  # the store's own file, or a temp copy of the S3 object
                if path is None:
                    raise CommandError(f"archive {sha256} vanished from the store during the export")
                report.bytes += _copy_verified(path, target, sha256)
        except OSError as exc:
            raise CommandError(f"--out {out}: cannot write {target}: {exc.strerror or exc}") from None
        report.archives += 1
        report.replaced_corrupt += present is not None
        progress.advance(bytes=target.stat().st_size)
    return report


def _digest_of(path: Path) -> str | None:
    """The SHA-256 of the file at `path`, None where there is none."""
    try:
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except FileNotFoundError:
        return None


def _copy_verified(source: Path, target: Path, sha256: str) -> int:
    """Copy `source` to `target` through a temp file beside it, renamed into place only if the bytes have the
    SHA-256 `sha256`; the size copied."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")  # no `terraform-provider-` name: the clients skip it
    digest, size = hashlib.sha256(), 0
    try:
        with open(source, "rb") as reader, open(partial, "wb") as writer:
            while chunk := reader.read(1 << 20):
                digest.update(chunk)
                writer.write(chunk)
                size += len(chunk)
            writer.flush()
            os.fsync(writer.fileno())
        if digest.hexdigest() != sha256:
            raise CommandError(
                f"archive {sha256} is corrupt in the store (its content has SHA-256 {digest.hexdigest()}): "
                f"{target.name} was not written; run `registry-proxy verify --repair`"
            )
        partial.chmod(0o644)
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return size
