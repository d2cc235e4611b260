"""The composition root: builds the application, its resources and its routes."""

from __future__ import annotations

import asyncio
import signal
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import structlog
from aiohttp import web

from proxy.auth import Grants, grant_key
from proxy.cache.factory import negative_bound, open_metadata
from proxy.cache.fullguard import SkipWritesWhenFull
from proxy.cache.memory import MemoryFront
from proxy.cache.sealed import metadata_secret
from proxy.config import Settings
from proxy.documents import DocumentCache
from proxy.downloader import Downloader
from proxy.flights import Flights
from proxy.gpg import Keyring
from proxy.inventory import InventoryReader
from proxy.metrics import Metrics
from proxy.mirror import Mirror
from proxy.module_mirror import ModuleMirror
from proxy.rendered import RenderedDocuments
from proxy.storage import ArchiveGuard, DiskSpace, Evictor, ServedArchives, archive_store
from proxy.upstream.client import UpstreamClient
from proxy.upstream.git import GitFetcher
from proxy.upstream.netguard import AddressPolicy
from proxy.web import discovery, health, lockfile, network_mirror, page, registry
from proxy.web.access import ACCESS, Access, access_control
from proxy.web.eventloop import loop_name
from proxy.web.keys import GUARD, INVENTORY, METRICS, MIRROR, MODULES, RENDERED, SERVED, SETTINGS
from proxy.web.middlewares import client_address, request_context, server_header

log = structlog.get_logger(__name__)


def create_app(settings: Settings) -> web.Application:
    """A ready-to-run application; resources open on start-up and close on shutdown."""
    app = web.Application(middlewares=[client_address, request_context, access_control], client_max_size=64 * 1024)
    app.on_response_prepare.append(server_header)
    app[SETTINGS] = settings
    app[METRICS] = Metrics()
    app[RENDERED] = RenderedDocuments()
    app.cleanup_ctx.append(_mirror_ctx)
    health.add_routes(app)
    discovery.add_routes(app)
    network_mirror.add_routes(app)
    registry.add_routes(app)
    lockfile.add_routes(app)
    page.add_routes(app)
    return app


async def _mirror_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = archive_store(settings)
    await store.open()
    metrics = app[METRICS]
    backend, locks, served_times = await open_metadata(settings, metrics)
    front = MemoryFront(SkipWritesWhenFull(backend), remember_absence=settings.sole_metadata_writer)
    cache = negative_bound(settings, backend, metrics, front=front)
    policy = AddressPolicy(settings.private_host_exceptions)
    upstream = UpstreamClient.create(
        policy, settings.limits, settings.upstream_ca_file, credentials=settings.upstream_credentials
    )
    upstream.observe = metrics.observe_upstream
    app[ACCESS] = Access(settings, Grants(grant_key(await asyncio.to_thread(metadata_secret, settings))))
    reload_on_sighup = settings.auth_tokens is not None
    if reload_on_sighup:  # in every worker: the supervisor passes its SIGHUP on (proxy.web.workers)
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, app[ACCESS].reload)
    flights = Flights(locks)
    space = DiskSpace(store.root, settings.min_free_space)
    guard = ArchiveGuard(store, metrics)
    documents = DocumentCache(settings, upstream, cache, metrics, flights)
    downloader = Downloader(settings, upstream, store, guard, space, metrics)
    keyring = Keyring(settings.gnupg_home)
    app[MIRROR] = Mirror(
        settings, documents, downloader, flights, keyring, cache=cache, store=store, space=space, metrics=metrics
    )
    app[GUARD] = guard
    served = app[SERVED] = ServedArchives(served_times)
    evictor = Evictor(
        store,
        served,
        served_times,
        locks,
        space,
        metrics,
        cap=settings.max_store_size,
        grace=settings.eviction_grace,
        interval=settings.eviction_interval,
    )
    downloader.on_stored = evictor.stored
    app[INVENTORY] = InventoryReader(settings, cache, served)
    git = GitFetcher(
        policy,
        store.temp_dir / "git",
        ca_bundle=write_ca_bundle(settings),
        timeout=settings.git_timeout,
        max_bytes=settings.max_module_bytes,
        max_entries=settings.max_module_entries,
        credentials=settings.upstream_credentials,
    )
    app[MODULES] = ModuleMirror(
        settings, documents, downloader, flights, git, store=store, space=space, metrics=metrics
    )

    async def begin_shutdown(_: web.Application) -> None:
        flights.begin_shutdown(settings.shutdown_grace)  # the server gives requests the same grace

    app.on_shutdown.append(begin_shutdown)
    log.info(
        "proxy.started",
        data_dir=str(settings.data_dir),
        allowed_hosts=sorted(settings.all_allowed_hosts),
        metadata_store="redis" if settings.redis_url else "embedded",
        offline=settings.offline,
        event_loop=loop_name(asyncio.get_running_loop()),
        access_log=settings.access_log,
        max_store_size=settings.max_store_size,
    )
    evictor.start()
    try:
        yield
    finally:
        if reload_on_sighup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        await evictor.close()
        await downloader.close()
        await flights.close()
        await upstream.close()
        await cache.close()
        await store.close()
        await asyncio.to_thread(keyring.close)


def write_ca_bundle(settings: Settings) -> Path | None:
    """A single CA file for git: the system bundle plus the operator's extra CAs (None: git's default)."""
    if settings.upstream_ca_file is None:
        return None
    system = ssl.get_default_verify_paths().cafile
    parts = [Path(system).read_bytes()] if system and Path(system).exists() else []
    parts.append(settings.upstream_ca_file.read_bytes())
    bundle = settings.upstream_ca_bundle
    bundle.parent.mkdir(parents=True, exist_ok=True)
    bundle.write_bytes(b"\n".join(parts))
    return bundle
