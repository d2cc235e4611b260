"""Opening the metadata store from Settings: one place for the server and the CLI commands.

Both open the same backend (sealed, with Redis's retention) and bound remembered 404s the same
way (`negative_bound`), so a command run against a data dir or a fleet's Redis keeps the
retention the server gives each kind of entry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from proxy.metadata_store import MetadataStore
from proxy.metadata_store.embedded import DATABASE_FILE, EmbeddedStore
from proxy.metadata_store.file_locks import FileLocks
from proxy.metadata_store.fleet_secret import FleetSecret
from proxy.metadata_store.negative import MemoryNegatives, NegativeBound, NegativeStore, negative_retention
from proxy.metadata_store.sealed import SECRET_FILE, Seal, SealedStore, accepted_secrets, metadata_secret
from proxy.runtime.coalescing import FleetLocks, LocalLocks
from proxy.runtime.metrics import Metrics
from proxy.settings.config import Settings
from proxy.settings.values import shown_redis_url

if TYPE_CHECKING:
    from proxy.metadata_store.redis import RedisStore

log = structlog.get_logger(__name__)


async def open_metadata_store(settings: Settings, metrics: Metrics | None = None) -> tuple[SealedStore, FleetLocks]:
    """The metadata store and its fleet locks (`open_metadata`, without the served times)."""
    store, locks, _ = await open_metadata(settings, metrics)
    return store, locks


async def open_metadata(
    settings: Settings, metrics: Metrics | None = None
) -> tuple[SealedStore, FleetLocks, RedisStore | EmbeddedStore]:
    """Redis (shared by a fleet, with fleet-wide locks) when configured, else the embedded store (with
    lock files in the data dir when several workers share it); either sealed with the metadata secret
    (ConfigError when it cannot be had). The embedded file is checked now, before the first request.
    Third, the same connection's last-served times of archives (`proxy.storage.ServedTimes`: eviction's
    bookkeeping, not metadata, so not behind the seal and the other wrappers)."""
    on_reject = None
    if metrics is not None:

        def on_reject(store: str, reason: str) -> None:
            metrics.metadata_rejected.labels(store, reason).inc()

    if settings.metadata.redis_url:
        from proxy.metadata_store.redis import RedisFleetLocks, RedisStore  # redis-py: only for a store in Redis

        seal = await _seal(settings, "redis", on_reject)
        ca_file = settings.metadata.redis_ca_file
        redis_store = RedisStore(
            settings.metadata.redis_url,
            prefix=settings.metadata.redis_prefix,
            password=settings.metadata.redis_password,
            sentinel_password=settings.metadata.redis_sentinel_password,
            ca_file=str(ca_file) if ca_file is not None else None,
            retention=settings.metadata.redis_retention,
            refuse=seal.refuse,
        )
        redis_store.follow_failovers()
        mismatch = f"--metadata-secret differs from the fleet's in {shown_redis_url(settings.metadata.redis_url)}"
        return (
            SealedStore(redis_store, seal, FleetSecret(redis_store, seal, mismatch=mismatch)),
            RedisFleetLocks(redis_store, ttl=settings.metadata.fleet_lock_ttl),
            redis_store,
        )
    database = settings.cache_dir / DATABASE_FILE
    upgrading = (
        not settings.metadata.metadata_secret
        and not settings.metadata.metadata_secret_file
        and await asyncio.to_thread(lambda: database.exists() and not (settings.cache_dir / SECRET_FILE).exists())
    )
    seal = await _seal(settings, "embedded", on_reject)
    embedded = EmbeddedStore(database)
    mismatch = f"--metadata-secret differs from the one that sealed {database}"
    sealed = SealedStore(embedded, seal, FleetSecret(embedded, seal, mismatch=mismatch))
    if await sealed.ping() and upgrading:  # the ping also checks the file (and moves a damaged one aside)
        log.info(
            "metadata.records_sealed",
            records=await sealed.adopt_unsealed(),
            reason="first start with sealed metadata: the existing records of this data dir were sealed",
        )
    return sealed, FileLocks(settings.lock_dir) if settings.server.workers > 1 else LocalLocks(), embedded


async def _seal(settings: Settings, store: str, on_reject: Callable[[str, str], None] | None) -> Seal:
    """The seal of the metadata secret, opening also what the accepted secrets sealed (ConfigError when one
    cannot be had)."""
    secret, accepted = await asyncio.to_thread(lambda: (metadata_secret(settings), accepted_secrets(settings)))
    return Seal(secret, store=store, accepted=accepted, on_reject=on_reject)


def negative_bound(
    settings: Settings, backend: SealedStore, metrics: Metrics | None = None, *, front: MetadataStore | None = None
) -> NegativeBound:
    """`front` (by default the backend itself) with every remembered 404 sent to a store of its own:
    Redis's for a fleet (sealed with the backend's seal), else process memory; bounded in count and bytes,
    each kept `negative_retention`. Anything but a remembered 404 read from it is refused through the seal."""
    return NegativeBound(
        backend if front is None else front, _negative_store(settings, backend, metrics), refuse=backend.seal.refuse
    )


def _negative_store(settings: Settings, backend: SealedStore, metrics: Metrics | None) -> NegativeStore:
    report = None
    if metrics is not None:

        def report(entries: int, size: int) -> None:
            metrics.negative_entries.set(entries)
            metrics.negative_bytes.set(size)

    bounds = (
        settings.freshness.negative_cache_entries,
        settings.freshness.negative_cache_bytes,
        negative_retention(settings.freshness.negative),
    )
    if settings.metadata.redis_url:
        from proxy.metadata_store.redis import RedisNegatives, RedisStore

        if isinstance(backend.inner, RedisStore):
            return RedisNegatives(backend.inner, backend.seal, *bounds, report=report, usable=backend.usable)
    return MemoryNegatives(*bounds, report=report)
