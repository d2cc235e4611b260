"""Choosing provider versions the way `init` does: keep what is locked, else the newest match."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from proxy.commands import CommandError
from proxy.commands.proxy_api import ProxyClient, ProxyRequestError
from proxy.commands.terraform_config import Requirements
from proxy.domain import constraints
from proxy.domain.addresses import ProviderAddr, Version
from proxy.domain.lockfile import LockedProvider


@dataclass(frozen=True)
class Selection:
    addr: ProviderAddr
    version: Version
    constraints: str  # canonical, as written to the lock file


def lock_key(addr: ProviderAddr) -> str:
    """The lock file's address form: host for display (Unicode), namespace, type."""
    return f"{addr.hostname.display}/{addr.namespace}/{addr.type}"


async def select_versions(
    requirements: Requirements, locked: dict[str, LockedProvider], client: ProxyClient, *, upgrade: bool = False
) -> list[Selection]:
    """One version per required provider, or CommandError naming what cannot be satisfied."""
    return list(
        await asyncio.gather(
            *(
                _select(addr, texts, locked.get(lock_key(addr)), client, upgrade)
                for addr, texts in sorted(requirements.providers.items(), key=lambda item: str(item[0]))
            )
        )
    )


async def _select(
    addr: ProviderAddr, texts: list[str], locked: LockedProvider | None, client: ProxyClient, upgrade: bool
) -> Selection:
    try:
        terms = [term for text in texts for term in constraints.parse(text)]
    except constraints.ConstraintError as exc:
        raise CommandError(f"provider {addr}: {exc}") from None
    canonical = constraints.canonical(terms)
    if locked is not None and not upgrade:
        version = Version.parse(locked.version)
        if not constraints.allows(terms, version):
            raise CommandError(
                f"provider {addr}: the locked version {version} does not match the constraints "
                f"{canonical!r}; run with --upgrade to select a new version"
            )
        return Selection(addr, version, canonical)
    try:
        available = await client.provider_versions(addr)
    except ProxyRequestError as exc:
        if exc.status == 404:
            raise CommandError(f"provider {addr} is unknown: {exc.message}") from None
        raise CommandError(f"provider {addr}: the proxy answered {exc.status}: {exc.message}") from None
    version = constraints.newest(terms, available)
    if version is None:
        shown = ", ".join(str(v) for v in sorted(available)[-8:]) or "none"
        raise CommandError(f"provider {addr}: no available version matches {canonical!r} (newest available: {shown})")
    return Selection(addr, version, canonical)
