"""A module's version list from its registry, through the document cache: what the module service and the
commands that list versions (`policy baseline`) read alike."""

from __future__ import annotations

from proxy.domain.addresses import ModuleAddr, Version
from proxy.errors import RegistryModuleNotFoundError
from proxy.metadata_store import CacheEntry, keys
from proxy.protocol import module_registry
from proxy.protocol.offers import list_ttl
from proxy.services.documents import DocumentCache
from proxy.settings.config import Settings


async def module_versions(
    settings: Settings, documents: DocumentCache, addr: ModuleAddr, max_age: float | None = None
) -> tuple[CacheEntry, frozenset[Version]]:
    """The registry's `versions` answer for `addr` and the versions it lists (RegistryModuleNotFoundError when
    the registry does not know the module)."""
    documents.check_allowed(addr.hostname)
    base = await documents.service_url(addr.hostname, "modules.v1")
    entry, versions = await documents.document(
        keys.module_versions(addr),
        module_registry.versions_url(base, addr),
        ttl=list_ttl(settings.freshness.versions, max_age),
        parse=lambda e: frozenset(module_registry.parse_versions(e.body, addr)),
    )
    if versions is None:
        raise RegistryModuleNotFoundError(f"module {addr} is not known to its registry")
    return entry, versions
