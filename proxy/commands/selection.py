"""Choosing provider versions the way `init` does: keep what is locked, else the newest match.

Where the proxy's policy is why nothing can be chosen (the provider denied, or every matching version withheld),
the error is a `PolicyRefusedError` naming each rule and its reason: the proxy says them in a refusal's body, and
in the `warnings` of the registry protocol's version list for the versions it leaves out of lists.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from proxy.commands import CommandError, PolicyRefusedError, Refusal
from proxy.commands.proxy_api import ProxyClient, ProxyRequestError
from proxy.commands.terraform_config import Requirements
from proxy.domain import constraints
from proxy.domain.addresses import AddressError, ProviderAddr, Version
from proxy.domain.lockfile import LockedProvider
from proxy.governance.policy import WITHHELD_WARNING


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
    pending = each_selection(requirements, locked, client, upgrade=upgrade)
    return list(await asyncio.gather(*(selection for _, selection in pending)))


def each_selection(
    requirements: Requirements, locked: dict[str, LockedProvider], client: ProxyClient, *, upgrade: bool = False
) -> list[tuple[ProviderAddr, Coroutine[Any, Any, Selection]]]:
    """Each required provider (sorted by address) and its selection, to be awaited: each raises its own
    CommandError (PolicyRefusedError when the policy is why)."""
    return [
        (addr, _select(addr, texts, locked.get(lock_key(addr)), client, upgrade))
        for addr, texts in sorted(requirements.providers.items(), key=lambda item: str(item[0]))
    ]


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
        message = f"provider {addr}: the proxy answered {exc.status}: {exc.message}"
        if exc.rule is not None and exc.reason is not None:
            raise PolicyRefusedError(message, [Refusal(f"provider {addr}", exc.rule, exc.reason)]) from None
        raise CommandError(message) from None
    version = constraints.newest(terms, available)
    if version is None:
        shown = ", ".join(str(v) for v in sorted(available)[-8:]) or "none"
        message = f"provider {addr}: no available version matches {canonical!r} (newest available: {shown})"
        refusals = await _withheld(addr, terms, client)
        if refusals:
            named = "; ".join(str(refusal) for refusal in refusals)
            raise PolicyRefusedError(f"{message}; the proxy's policy withholds {named}", refusals)
        raise CommandError(message)
    return Selection(addr, version, canonical)


async def _withheld(addr: ProviderAddr, terms: list[constraints.Constraint], client: ProxyClient) -> list[Refusal]:
    """The versions matching `terms` the proxy's policy withholds from this client, each with its rule and reason
    (none when the proxy says nothing of it, or cannot be asked)."""
    try:
        warnings = await client.provider_warnings(addr)
    except ProxyRequestError:
        return []
    refusals = []
    for warning in warnings:
        found = WITHHELD_WARNING.match(warning)
        if found is None:
            continue
        try:
            version = Version.parse(found["version"])
        except AddressError:
            continue
        if constraints.allows(terms, version):
            refusals.append(Refusal(f"provider {addr} {version}", found["rule"], found["reason"]))
    return refusals
