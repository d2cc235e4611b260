"""`registry-proxy warm --proxy URL [DIR | --lock-file F] --platform …`: fill the cache ahead of need.

Downloads, through the proxy, every provider version (for each requested platform) and
every registry module a configuration or lock file needs, a bounded number at a time.
The proxy verifies and stores each one as it passes, shown by a `Progress` (a bar on a terminal,
one line per item otherwise, on stderr). Returns a `WarmReport`: what was done,
what the proxy's policy refused (each with its rule and reason), what failed and why, what
was skipped, and the bytes fetched. Nothing refused or failed stops the rest: every other
provider and module is still warmed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from proxy.commands import CommandError, PolicyRefusedError, Refusal
from proxy.commands.proxy_api import ProxyClient, ProxyRequestError
from proxy.commands.selection import Selection, each_selection
from proxy.commands.terraform_config import ModuleCall, ProjectConfigError, Requirements, read_requirements
from proxy.domain import constraints
from proxy.domain.addresses import AddressError, ModuleAddr, Platform, ProviderAddr, Version
from proxy.domain.lockfile import LockedProvider, LockFileError, parse_lockfile
from proxy.protocol.offers import no_package_message
from proxy.runtime.progress import Progress


@dataclass
class WarmReport:
    done: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    refused: list[Refusal] = field(default_factory=list)  # by the proxy's policy, each with its rule and reason
    bytes: int = 0


async def run_warm(
    client: ProxyClient,
    platforms: list[Platform],
    *,
    directory: Path | None = None,
    lock_file: Path | None = None,
    jobs: int = 4,
    default_host: str = "registry.terraform.io",
    progress: Progress | None = None,
) -> WarmReport:
    progress = progress or Progress.silent()
    report = WarmReport()
    selections, modules = await _targets(client, directory, lock_file, default_host, report, progress)
    items: list[tuple[str, Callable[[Callable[[int], None]], Awaitable[int | None]]]] = []
    for s in selections:
        for platform in platforms:
            items.append((f"provider {s.addr} {s.version} {platform}", _provider_job(client, s, platform)))
    for call in modules:
        items.append((f"module {call.source} {call.version or '(newest)'}", _module_job(client, call)))
    progress.total(len(items))
    slots = asyncio.Semaphore(max(1, jobs))

    def count(n: int) -> None:
        report.bytes += n
        progress.advance(0, bytes=n)

    async def run(name: str, job) -> None:
        async with slots:
            try:
                size = await job(count)
            except ProxyRequestError as exc:
                if exc.rule is not None and exc.reason is not None:
                    report.refused.append(Refusal(name, exc.rule, exc.reason))
                    outcome = f"refused by policy rule {exc.rule}: {exc.reason}"
                else:
                    report.failed[name] = exc.message
                    outcome = f"FAILED: {exc.message}"
            except CommandError as exc:
                report.failed[name] = str(exc)
                outcome = f"FAILED: {exc}"
            else:
                if size is None:
                    report.skipped[name] = "its source is not cached by the proxy (passed through)"
                    outcome = "skipped: source passed through, not cached"
                else:
                    report.done.append(name)
                    outcome = f"ok ({size} bytes)"
            progress.advance(note=f"{name}: {outcome}")

    await asyncio.gather(*(run(name, job) for name, job in items))
    return report


async def _targets(
    client: ProxyClient,
    directory: Path | None,
    lock_file: Path | None,
    default_host: str,
    report: WarmReport,
    progress: Progress,
) -> tuple[list[Selection], list[ModuleCall]]:
    """The provider versions and modules to warm; a provider whose version cannot be chosen goes into `report`
    (refused by the policy, or failed) and the others are warmed."""
    if directory is None and lock_file is None:
        raise CommandError("name a configuration directory or --lock-file")
    locked, requirements = await asyncio.to_thread(_read_inputs, directory, lock_file, default_host)
    if requirements is None:
        return [_from_lock(key, entry.version) for key, entry in sorted(locked.items())], []
    selections = []
    pending = each_selection(requirements, locked, client)
    outcomes = await asyncio.gather(*(selection for _, selection in pending), return_exceptions=True)
    for (addr, _), outcome in zip(pending, outcomes, strict=True):
        if isinstance(outcome, PolicyRefusedError):
            report.refused.extend(outcome.refusals)
            for refusal in outcome.refusals:
                progress.note(f"{refusal.what}: refused by policy rule {refusal.rule}: {refusal.reason}")
        elif isinstance(outcome, CommandError):
            report.failed[f"provider {addr}"] = str(outcome)
            progress.note(f"FAILED: {outcome}")
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            selections.append(outcome)
    return selections, requirements.modules


def _read_inputs(
    directory: Path | None, lock_file: Path | None, default_host: str
) -> tuple[dict[str, LockedProvider], Requirements | None]:
    try:
        locked = parse_lockfile(lock_file.read_text(encoding="utf-8"), str(lock_file)) if lock_file else {}
        if directory is None:
            return locked, None
        lock_path = directory / ".terraform.lock.hcl"
        if not locked and lock_path.exists():
            locked = parse_lockfile(lock_path.read_text(encoding="utf-8"), str(lock_path))
        return locked, read_requirements(directory, default_host)
    except (ProjectConfigError, LockFileError, OSError) as exc:
        raise CommandError(str(exc)) from None


def _from_lock(key: str, version: str) -> Selection:
    try:
        host, namespace, type_ = key.split("/")
        return Selection(ProviderAddr.parse(host, namespace, type_), Version.parse(version), "")
    except (ValueError, AddressError) as exc:
        raise CommandError(f"lock file entry {key!r}: {exc}") from None


def _provider_job(client: ProxyClient, selection: Selection, platform: Platform):
    async def job(progress: Callable[[int], None]) -> int:
        archives = await client.version_archives(selection.addr, selection.version)
        entry = archives.get(str(platform))
        if entry is None:
            raise CommandError(no_package_message("the version", [platform], sorted(archives)))
        base = client.url(f"mirror/v1/{selection.addr.hostname}/{selection.addr.namespace}/{selection.addr.type}/")
        return await client.download(entry["url"], progress, base=base)

    return job


def _module_job(client: ProxyClient, call: ModuleCall):
    async def job(progress: Callable[[int], None]) -> int | None:
        try:
            host, namespace, name, system = call.source.split("//", 1)[0].split("/")
            addr = ModuleAddr.parse(host, namespace, name, system)
            terms = constraints.parse(call.version)
        except (ValueError, AddressError, constraints.ConstraintError) as exc:
            raise CommandError(f"module source {call.source!r} in {call.caller}: {exc}") from None
        version = constraints.newest(terms, await client.module_versions(addr))
        if version is None:
            raise CommandError(f"no version matches {call.version!r}")
        location = await client.module_location(addr, version)
        if not location.startswith("/registry/"):
            return None
        return await client.download(location.split("//", 1)[0], progress)

    return job
