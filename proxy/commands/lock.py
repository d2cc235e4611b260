"""`registry-proxy lock DIR --proxy URL --platform OS_ARCH …`: complete lock files for every platform.

Writes `.terraform.lock.hcl` as `terraform init` would, but with the hashes of every
requested platform (from the proxy's `/lock/v1/` endpoint), so the lock file works on
Linux CI and on developers' Macs alike, without internet access.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from proxy.commands import CommandError
from proxy.commands.proxy_api import ProxyClient, ProxyRequestError
from proxy.commands.selection import lock_key, select_versions
from proxy.commands.terraform_config import ProjectConfigError, read_requirements
from proxy.domain.addresses import Platform
from proxy.domain.lockfile import LockedProvider, LockFileError, merge_hashes, parse_lockfile, render

LOCK_FILE = ".terraform.lock.hcl"


async def run_lock(
    directory: Path,
    client: ProxyClient,
    platforms: list[Platform],
    *,
    upgrade: bool = False,
    default_host: str = "registry.terraform.io",
) -> dict[str, LockedProvider]:
    """Update `directory/.terraform.lock.hcl`; returns the entries written."""
    path = directory / LOCK_FILE
    try:
        requirements = read_requirements(directory, default_host)
        existing = parse_lockfile(path.read_text(encoding="utf-8"), str(path)) if path.exists() else {}
    except (ProjectConfigError, LockFileError) as exc:
        raise CommandError(str(exc)) from None
    selections = await select_versions(requirements, existing, client, upgrade=upgrade)

    async def entry(selection) -> LockedProvider:
        key = lock_key(selection.addr)
        try:
            info = await client.lock_hashes(selection.addr, selection.version, platforms)
        except ProxyRequestError as exc:
            raise CommandError(f"provider {key} {selection.version}: {exc.message}") from None
        try:
            hashes = merge_hashes(existing.get(key), str(selection.version), info["hashes"])
        except LockFileError as exc:
            raise CommandError(str(exc)) from None
        return LockedProvider(key, str(selection.version), selection.constraints, hashes)

    entries = {e.address: e for e in await asyncio.gather(*(entry(s) for s in selections))}
    text = render(entries)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        temporary = path.with_name(f".{LOCK_FILE}.{os.getpid()}.tmp")
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    return entries
