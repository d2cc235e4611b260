"""Opening the metadata store from Settings: one place for the server and the CLI commands."""

from __future__ import annotations

from proxy.cache import MetadataStore
from proxy.cache.embedded import EmbeddedStore
from proxy.cache.redis import RedisFleetLocks, RedisStore
from proxy.cache.sealed import SealedStore, metadata_secret
from proxy.config import Settings
from proxy.metrics import Metrics
from proxy.singleflight import FleetLocks, LocalLocks


def open_metadata_store(settings: Settings, metrics: Metrics | None = None) -> tuple[MetadataStore, FleetLocks]:
    """Redis (shared by a fleet, with fleet-wide locks) when configured, else the embedded store;
    either sealed with the metadata secret (raises ConfigError when it cannot be had)."""
    secret = metadata_secret(settings)
    on_reject = None
    if metrics is not None:
        def on_reject(store: str, reason: str) -> None:
            metrics.metadata_rejected.labels(store, reason).inc()
    if settings.redis_url:
        redis_store = RedisStore(settings.redis_url, prefix=settings.redis_prefix,
                                 password=settings.redis_password, retention=settings.redis_retention)
        return (SealedStore(redis_store, secret, name="redis", on_reject=on_reject),
                RedisFleetLocks(redis_store, ttl=settings.fleet_lock_ttl))
    embedded = EmbeddedStore(settings.cache_dir / "metadata.sqlite")
    return SealedStore(embedded, secret, name="embedded", on_reject=on_reject), LocalLocks()
