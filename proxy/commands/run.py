"""Runs the commands on a data dir's stores (`export`, `import`, `verify`, `gc`, `purge`, `rotate-secret`, `trust`)
from parsed CLI arguments and prints their summaries; `lock` and `warm` are `proxy.commands.client_run`'s."""

from __future__ import annotations

import argparse
import getpass
from pathlib import Path

from proxy.commands import CommandError
from proxy.commands.bundle import BundleReport, export_bundle, import_verified, verified_bundle
from proxy.commands.filesystem_mirror import export_filesystem_mirror
from proxy.commands.gc import collect, report_lines
from proxy.commands.rotate_secret import report_lines as rotation_lines
from proxy.commands.rotate_secret import rotate_secret
from proxy.commands.verify import check_records, summary_lines, verify_store
from proxy.errors import ProxyError
from proxy.governance.catalog import Catalog, PurgeTarget
from proxy.governance.gatekeeper import load_policy
from proxy.governance.inventory import InventoryReader, NoAccessTimes
from proxy.governance.policy import PolicyError
from proxy.metadata_store import MetadataStore
from proxy.metadata_store.embedded import FAILURES as EMBEDDED_FAILURES
from proxy.metadata_store.factory import negative_bound, open_metadata
from proxy.metadata_store.negative import NegativeBound, negative_retention
from proxy.metadata_store.redis import FAILURES as REDIS_FAILURES
from proxy.runtime.log import command_logging
from proxy.runtime.progress import Progress
from proxy.settings.config import FreshnessTtls, Settings, build
from proxy.storage import ArchiveStore, ServedTimes, archive_store


async def dispatch(args: argparse.Namespace) -> int:
    """Run the command `args` name, with its log at info (`command_logging`)."""
    with command_logging():
        return await _dispatch(args)


async def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "export":
        return await _export(args)
    if args.command == "import":
        return await _import(args)
    if args.command == "verify":
        return await _verify(args)
    if args.command == "gc":
        return await _gc(args)
    if args.command == "purge":
        return await _purge(args)
    if args.command == "rotate-secret":
        return await _rotate_secret(args)
    if args.command == "trust":
        from proxy.commands.trust import run_trust

        return await run_trust(args, _store_settings(args))
    raise CommandError(f"unknown command {args.command}")


def _progress(args: argparse.Namespace, unit: str) -> Progress:
    """The progress of the command on stderr (nothing with --quiet)."""
    return Progress(args.command, unit, quiet=args.quiet)


def _store_settings(args: argparse.Namespace) -> Settings:
    """The settings of the data dir's stores, as `serve` reads them from the same options."""
    return build(Settings, vars(args))


async def _metadata(settings: Settings) -> tuple[NegativeBound, ServedTimes]:
    """The metadata store opened (and sealed) exactly as `serve` opens it, its fleet's secret marker checked as
    `serve` checks it (ConfigError, exit 2, when the secret differs), and the archives' last-served times kept
    on the same connection."""
    backend, _, times = await open_metadata(settings)
    try:
        await backend.require_fleet()
    except BaseException:
        await backend.close()
        raise
    return negative_bound(settings, backend), times


async def _stores(args: argparse.Namespace, *, claim: bool = True) -> tuple[MetadataStore, ServedTimes, ArchiveStore]:
    """The data dir's stores: the metadata store (opened and sealed as `serve` opens it), the last-served
    times, and the archive store, opened for writing (`claim`: a temp dir of this process, dead processes'
    reaped, uploads abandoned a day ago aborted) or only to be looked at (nothing changes by opening it)."""
    settings = _store_settings(args)
    cache, times = await _metadata(settings)
    store = archive_store(settings)
    try:
        await store.open(claim=claim)
    except BaseException:
        await cache.close()
        raise
    return cache, times, store


async def _export(args: argparse.Namespace) -> int:
    out, mirror = Path(args.out), args.format == "filesystem-mirror"  # checked before (`preflight`)
    policy = None
    if getattr(args, "policy", None):
        try:
            policy = load_policy(Path(args.policy))
        except PolicyError as exc:
            raise CommandError(str(exc)) from None
    cache, _, store = await _stores(args)
    try:
        export = export_filesystem_mirror if mirror else export_bundle
        with _progress(args, "archives") as progress:
            report = await export(cache, store, out, args.only, policy, progress)
    finally:
        await cache.close()
        await store.close()
    if mirror:
        return _mirror_exported(args.out, report)
    print(
        f"exported {len(report.providers)} provider archives and {len(report.modules)} modules "
        f"({report.archives} files, {report.bytes} bytes, {report.entries} metadata entries) to {args.out}"
    )
    for fingerprint in sorted(report.signing_keys):
        print(f"signing key: {fingerprint}  (import with --trust-key {fingerprint})")
    for refused in report.denied_left_out:
        print(f"left out {refused}")
    for subject in report.unsigned_left_out:
        print(
            f"left out {subject}: unsigned (its registry lists no signing keys), so nothing in a bundle can "
            "vouch for it; the proxy behind the air gap cannot serve it"
        )
    return 0


def _mirror_exported(out: str, report: BundleReport) -> int:
    print(
        f"exported {len(report.providers)} provider archives to the filesystem mirror {out}: {report.archives} "
        f"written ({report.bytes} bytes), {report.already_present} already there"
        + (f", {report.replaced_corrupt} with other content replaced" if report.replaced_corrupt else "")
    )
    for refused in report.denied_left_out:
        print(f"left out {refused}")
    for subject in report.unsigned_left_out:
        print(f"left out {subject}: unsigned (its registry lists no signing keys), so no signature vouches for it")
    return 0


async def _import(args: argparse.Namespace) -> int:
    """Verify the bundle outside the data dir (`verified_bundle`), then open the data dir's stores and add it: a
    refused bundle leaves the data dir as it was (not even made)."""
    bundle = Path(args.bundle)  # there, with keys to trust (`proxy.commands.preflight`)
    trusted = None if args.trust_bundle_keys else {k.replace(" ", "").upper() for k in args.trust_key}
    with _progress(args, "archives") as progress, verified_bundle(bundle, trusted, progress) as verified:
        cache, _, store = await _stores(args)
        try:
            report = await import_verified(verified, cache, store, progress)
        finally:
            await cache.close()
            await store.close()
    print(
        f"imported {len(report.providers)} provider archives and {len(report.modules)} modules: "
        f"{report.archives} new files ({report.bytes} bytes), {report.already_present} already present, "
        f"{report.entries} metadata entries"
    )
    if report.replaced_corrupt:
        print(f"replaced {report.replaced_corrupt} corrupt stored archives (moved to the quarantine)")
    return 0


async def _gc(args: argparse.Namespace) -> int:
    cache, times, store = await _stores(args, claim=False)  # gc removes dead processes' temp dirs itself, or not
    try:
        if store.local and not (store.root / "sha256").is_dir():
            raise CommandError(f"{store.root} holds no archive store (is --data-dir the proxy's data directory?)")
        try:
            with _progress(args, "items") as progress:
                report = await collect(
                    cache,
                    store,
                    times,
                    grace=args.grace,
                    dry_run=args.dry_run,
                    negative_retention=negative_retention(FreshnessTtls().negative),
                    progress=progress,
                )
        except (*REDIS_FAILURES, *EMBEDDED_FAILURES) as exc:
            raise CommandError(
                f"gc stopped: the metadata store could not be read ({exc}); nothing more is removed until it can"
            ) from None
    finally:
        await cache.close()
        await store.close()
    for line in report_lines(report, dry_run=args.dry_run):
        print(line)
    return 0


async def _purge(args: argparse.Namespace) -> int:
    try:
        target = PurgeTarget.parse(args.target)
    except ProxyError as exc:
        raise CommandError(exc.message) from None
    cache, times, store = await _stores(args, claim=False)  # removing archives needs no temp dir of its own
    try:
        catalog = Catalog(cache, store, times, InventoryReader(_store_settings(args), cache, NoAccessTimes()))
        try:
            with _progress(args, "records") as progress:
                report = await catalog.purge(target, who=f"cli:{getpass.getuser()}", progress=progress)
        except ProxyError as exc:
            raise CommandError(exc.message) from None
        except (*REDIS_FAILURES, *EMBEDDED_FAILURES) as exc:
            raise CommandError(f"purge stopped: the metadata store could not be used ({exc})") from None
    finally:
        await cache.close()
        await store.close()
    print(
        f"purged {report.target}: {len(report.records)} records, {len(report.archives_removed)} archives removed "
        f"({report.freed_bytes} bytes), {len(report.archives_kept)} kept (shared by content with another address)"
    )
    if report.unreadable:
        print(f"{len(report.unreadable)} records could not be read (a wrong --metadata-secret?): no archive removed")
    return 0


async def _rotate_secret(args: argparse.Namespace) -> int:
    settings = _store_settings(args)
    backend, _, store = await open_metadata(settings)
    try:
        if backend.fleet is None or not await backend.ping():
            raise CommandError(f"the metadata store cannot be used now ({backend.problem}): nothing was changed")
        await backend.fleet.require()  # neither secret opens the marker: exit 2, nothing changed
        report = await rotate_secret(store, backend.seal, backend.fleet)
    finally:
        await backend.close()
    for line in rotation_lines(report):
        print(line)
    return 0 if report.marker else 1


async def _verify(args: argparse.Namespace) -> int:
    settings = _store_settings(args)
    root = settings.archive_dir
    if settings.archives.s3_location is None and not (root / "sha256").is_dir():
        raise CommandError(f"{root} holds no archive store (is --data-dir the proxy's data directory?)")
    store = archive_store(settings)
    await store.open(claim=False)  # nothing is written without --repair, not even by opening the store
    try:
        with _progress(args, "objects") as progress:
            report = await verify_store(store, repair=args.repair, progress=progress)
        if args.redis_url or (settings.data_dir / "metadata" / "metadata.sqlite").exists():
            cache, _ = await _metadata(settings)
            try:
                await check_records(report, cache)
            finally:
                await cache.close()
    finally:
        await store.close()
    for line in summary_lines(report):
        print(line)
    return 1 if report.failed else 0
