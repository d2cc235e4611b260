"""`registry-proxy policy baseline [ADDRESS...]`: record the versions listed now as old, on purpose.

A min-age rule holds back a version whose age the proxy cannot establish (`unknown-age = "hold"`, the default):
on a fresh deployment, after the metadata store was flushed or a record lost, every version of a provider the
upstream gives no publish times for. An operator who knows those versions are old says so here: the command
fetches each address's version list as the proxy does (the same document cache, stores and upstream client,
with `serve`'s options), and records the versions it lists in the address's baseline record
(`proxy.governance.release_times`), naming who did it in the audit trail and the log. A version the proxy has
a first-seen time for keeps it (a baseline never shortens a cooldown the proxy is counting); the publish time
the upstream gives still counts (a baselined version published lately is still held back).

Without ADDRESS: every provider and module the store already has a first-seen record or a cached version list
for.
"""

from __future__ import annotations

import asyncio
import getpass
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import structlog

from proxy.commands import CommandError
from proxy.domain.addresses import AddressError, ModuleAddr, ProviderAddr, Version
from proxy.errors import ProxyError, RegistryModuleNotFoundError
from proxy.governance.audit import AuditLog
from proxy.governance.gatekeeper import artifact_of, subject_of
from proxy.governance.release_times import FirstSeen
from proxy.metadata_store import MetadataStore, keys
from proxy.metadata_store.factory import negative_bound, open_metadata_store
from proxy.modules.metadata import module_versions
from proxy.providers.metadata import ProviderMetadata
from proxy.runtime.log import command_logging
from proxy.runtime.metrics import Metrics
from proxy.services.documents import DocumentCache
from proxy.services.shared_fetches import SharedFetches
from proxy.settings.config import Settings
from proxy.upstream.client import UpstreamClient, create_ssl_context
from proxy.upstream.netguard import AddressPolicy

log = structlog.get_logger(__name__)
Address = ProviderAddr | ModuleAddr
# the kinds of key whose addresses a baseline without ADDRESS covers
_KNOWN = (keys.FIRST_SEEN, keys.MODULE_FIRST_SEEN, keys.VERSIONS, keys.MODULE_VERSIONS)


@dataclass
class BaselineReport:
    """Per address: the versions recorded as old, and those kept with their first-seen time; what failed."""

    recorded: dict[str, list[Version]] = field(default_factory=dict)
    kept: dict[str, list[Version]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def parse_address(text: str) -> Address:
    """`HOST/NAMESPACE/TYPE` (a provider) or `HOST/NAMESPACE/NAME/SYSTEM` (a module); CommandError otherwise."""
    if "@" in text:
        raise CommandError(f"{text!r}: a baseline records every version listed now: name the address, no @VERSION")
    parts = text.strip().split("/")
    try:
        if len(parts) == 3:
            return ProviderAddr.parse(*parts)
        if len(parts) == 4:
            return ModuleAddr.parse(*parts)
    except AddressError as exc:
        raise CommandError(str(exc)) from None
    raise CommandError(f"{text!r}: expected HOST/NAMESPACE/TYPE or HOST/NAMESPACE/NAME/SYSTEM")


def baseline_command(settings: Settings, addresses: list[str], actor: str | None) -> int:
    """Run the baseline and print what it recorded (exit 1 when an address failed)."""
    with command_logging():  # the policy.baselined records on stderr
        report = asyncio.run(run_baseline(settings, addresses, actor or f"cli:{getpass.getuser()}"))
    for address, versions in report.recorded.items():
        kept = report.kept.get(address, [])
        print(
            f"baselined {address}: {len(versions)} versions recorded as old"
            + (f" ({', '.join(map(str, versions))})" if versions else "")
            + (f"; {len(kept)} kept with their first-seen time ({', '.join(map(str, kept))})" if kept else "")
        )
    for address, reason in report.failed.items():
        print(f"FAILED {address}: {reason}", file=sys.stderr)
    return 1 if report.failed else 0


async def run_baseline(settings: Settings, addresses: list[str], actor: str) -> BaselineReport:
    """Baseline `addresses` (every known one when empty) with `serve`'s settings; `actor` names who did it."""
    wanted = [parse_address(text) for text in addresses]
    store, locks = await open_metadata_store(settings)
    tls = await asyncio.to_thread(create_ssl_context, settings.upstreams.upstream_ca_file)
    upstream = UpstreamClient.create(
        AddressPolicy(settings.upstreams.private_host_exceptions),
        settings.limits,
        tls,
        credentials=settings.upstreams.upstream_credentials,
    )
    shared_fetches = SharedFetches(locks)
    audit = await asyncio.to_thread(AuditLog.open, settings.policy.audit_log)
    try:
        await store.require_fleet()  # another fleet's secret: exit 2, nothing recorded (its writes would be skipped)
        documents = DocumentCache(settings, upstream, negative_bound(settings, store), Metrics(), shared_fetches)
        lists = _VersionLists(settings, documents)
        first_seen = FirstSeen(store, shared_fetches, time.time)
        targets = wanted or await known_addresses(store)
        if not targets:
            raise CommandError("nothing to baseline: the store knows no provider or module yet; name ADDRESS...")
        report = BaselineReport()
        for addr in targets:
            try:
                versions = await lists.versions(addr)
            except ProxyError as exc:
                report.failed[str(addr)] = exc.message
                continue
            except CommandError as exc:
                report.failed[str(addr)] = str(exc)
                continue
            record = (await first_seen.releases(addr)).record
            kept = sorted(v for v in versions if v in record.seen)
            recorded = sorted(v for v in versions if v not in record.seen)
            await first_seen.record_baseline(addr, recorded, actor)
            report.recorded[str(addr)], report.kept[str(addr)] = recorded, kept
            audit.write(
                "baselined",
                artifact=artifact_of(subject_of(addr)),
                versions=[str(v) for v in recorded],
                client=actor,
            )
            log.warning(
                "policy.baselined",
                artifact=str(addr),
                versions=[str(v) for v in recorded],
                kept_first_seen=[str(v) for v in kept],
                who=actor,
                effect="these versions count as old for min-age rules (a publish time still counts)",
            )
        return report
    finally:
        audit.close()
        await shared_fetches.close()
        await upstream.close()
        await store.close()


async def known_addresses(store: MetadataStore) -> list[Address]:
    """Every provider and module the store has a first-seen record or a cached version list for."""
    found: dict[str, Address] = {}
    for pattern in _KNOWN:
        async for key in store.keys(pattern.prefix):
            parts = pattern.parse(key)
            if parts is None:
                continue
            text = pattern.subject(key)
            if text not in found:
                try:
                    found[text] = parse_address(text)
                except CommandError:
                    continue
    return [found[text] for text in sorted(found)]


class _VersionLists:
    """The upstream's version lists, through the document cache as the proxy reads them."""

    def __init__(self, settings: Settings, documents: DocumentCache) -> None:
        self._settings = settings
        self._documents = documents
        self._providers = ProviderMetadata(settings, documents)

    async def versions(self, addr: Address) -> Iterable[Version]:
        if isinstance(addr, ProviderAddr):
            return (await self._providers.versions(addr)).keys()
        try:
            return (await module_versions(self._settings, self._documents, addr))[1]
        except RegistryModuleNotFoundError as exc:
            raise CommandError(exc.message) from None
