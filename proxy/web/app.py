"""The composition root: builds the application, its resources and its routes."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import ssl
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import structlog
from aiohttp import web

from proxy.governance.audit import AuditLog
from proxy.governance.catalog import Catalog
from proxy.governance.gatekeeper import Gatekeeper, load_policy
from proxy.governance.inventory import InventoryReader
from proxy.governance.key_trust import DEFAULT_TRUST
from proxy.governance.release_times import FirstSeen, PublishDates
from proxy.governance.signing_keys import SigningKeys
from proxy.identity.grant_cipher import create_grants
from proxy.identity.oidc import FETCH_DEADLINE, IssuerKeys, OidcAuthenticator
from proxy.identity.tokens import grant_key
from proxy.metadata_store import MetadataStore
from proxy.metadata_store.factory import negative_bound, open_metadata
from proxy.metadata_store.full_disk import SkipWritesWhenFull
from proxy.metadata_store.memory import MemoryFront
from proxy.metadata_store.sealed import SealedStore, accepted_secrets, metadata_secret
from proxy.modules.git_sources import GitFetcher
from proxy.modules.mirror import ModuleMirror
from proxy.providers.mirror import Mirror
from proxy.providers.signatures import Keyring
from proxy.runtime.coalescing import FleetLocks
from proxy.runtime.log import flush_access_log
from proxy.runtime.metrics import Metrics
from proxy.services.documents import DocumentCache
from proxy.services.downloader import Downloader
from proxy.services.shared_fetches import SharedFetches
from proxy.settings.config import Settings
from proxy.storage import ArchiveGuard, ArchiveStore, ArchiveUsage, DiskSpace, Evictor, ServedTimes, archive_store
from proxy.upstream.client import UpstreamClient, create_ssl_context
from proxy.upstream.netguard import AddressPolicy
from proxy.web import catalog_api, health, home, lock_hashes, network_mirror, registry, well_known
from proxy.web.access import ACCESS, Access, access_control
from proxy.web.aiohttp_internals import FRONT
from proxy.web.app_keys import (
    ARCHIVE_USAGE,
    CATALOG,
    FLEET_SECRET,
    GATEKEEPER,
    GUARD,
    INVENTORY,
    MEMORY_FRONT,
    METRICS,
    MIRROR,
    MODULES,
    PUBLISH_DATES,
    RENDERINGS,
    SETTINGS,
    SIGNING_KEYS,
    WARM_ANSWERS,
)
from proxy.web.eventloop import loop_name
from proxy.web.front_door import FrontDoor
from proxy.web.middlewares import request_context, server_header
from proxy.web.renderings import Renderings
from proxy.web.warm_answers import WarmAnswers

log = structlog.get_logger(__name__)


def create_app(settings: Settings) -> web.Application:
    """A ready-to-run application; resources open on start-up and close on shutdown.

    Each resource has its own cleanup context, in the order they open. When one fails to open (or start-up
    is cancelled, a stop signal while booting), the runner's cleanup closes every one opened before it, in
    reverse order (`proxy.web.server.serve_app`). File and process work runs in threads, off the event loop.
    """
    app = web.Application(
        middlewares=[request_context, access_control],
        client_max_size=64 * 1024,
    )
    app.on_response_prepare.append(server_header)
    app[SETTINGS] = settings
    app[METRICS] = Metrics()
    app[RENDERINGS] = Renderings()
    app[FRONT] = FrontDoor(app)  # put before the middlewares by the server (`proxy.web.server.serve_app`)
    app[ON_SIGHUP] = []
    app.cleanup_ctx.extend(
        [
            archive_store_ctx,
            metadata_store_ctx,
            upstream_ctx,
            access_ctx,
            oidc_keys_ctx,
            keyring_ctx,
            shared_fetches_ctx,
            services_ctx,
            policy_ctx,
            reload_ctx,
            evictor_ctx,
        ]
    )
    app.on_startup.append(_log_started)  # after every cleanup context has opened its resource
    app.on_shutdown.append(_begin_shutdown)
    app.on_cleanup.append(_settle_tallies)  # after the cleanup contexts: every request is over
    health.add_routes(app)
    well_known.add_routes(app)
    network_mirror.add_routes(app)
    registry.add_routes(app)
    lock_hashes.add_routes(app)
    home.add_routes(app)
    catalog_api.add_routes(app)
    return app


# Resources handed from one cleanup context to the next (handlers use the keys of proxy.web.app_keys).
ARCHIVE_STORE = web.AppKey("archive_store", ArchiveStore)
DISK_SPACE = web.AppKey("disk_space", DiskSpace)
SERVED_TIMES = web.AppKey("served_times", ServedTimes)
METADATA_BACKEND = web.AppKey("metadata_backend", MetadataStore)  # sealed, without the memory front
METADATA_CACHE = web.AppKey("metadata_cache", MetadataStore)
FLEET_LOCKS = web.AppKey("fleet_locks", FleetLocks)
UPSTREAM = web.AppKey("upstream", UpstreamClient)
KEYRING = web.AppKey("keyring", Keyring)
SHARED_FETCHES = web.AppKey("shared_fetches", SharedFetches)
DOWNLOADER = web.AppKey("downloader", Downloader)
ON_SIGHUP = web.AppKey("on_sighup", list)  # what SIGHUP reads again (`reload_ctx`)


async def archive_store_ctx(app: web.Application) -> AsyncIterator[None]:
    """The archive store: its layout, this process's temp dir (removed on close)."""
    settings = app[SETTINGS]
    store = archive_store(settings)
    await asyncio.to_thread(settings.data_dir.mkdir, parents=True, exist_ok=True)
    await store.open()  # (a store that fails to open closes what it had opened)
    app[ARCHIVE_STORE] = store
    app[DISK_SPACE] = DiskSpace(store.root, settings.archives.min_free_space)
    try:
        yield
    finally:
        await store.close()


async def metadata_store_ctx(app: web.Application) -> AsyncIterator[None]:
    """The metadata store (embedded or Redis) and the fleet's locks, behind the memory front and the 404 store."""
    settings, metrics = app[SETTINGS], app[METRICS]
    backend, locks, served_times = await open_metadata(settings, metrics)
    outermost: MetadataStore = backend  # closed whatever fails once the backend is open (closing passes inwards)
    try:
        front = app[MEMORY_FRONT] = MemoryFront(
            SkipWritesWhenFull(backend), remember_absence=settings.sole_metadata_writer
        )
        await front.follow_purges()  # the purge mark as of now: later purges make this process forget
        outermost = cache = negative_bound(settings, backend, metrics, front=front)
        app[METADATA_BACKEND], app[METADATA_CACHE] = backend, cache
        if backend.fleet is not None:
            app[FLEET_SECRET] = backend.fleet
        app[FLEET_LOCKS], app[SERVED_TIMES] = locks, served_times
        yield
    finally:
        await outermost.close()


async def upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    """The upstream HTTP session (its trust store read off the loop)."""
    settings = app[SETTINGS]
    tls = await asyncio.to_thread(create_ssl_context, settings.upstreams.upstream_ca_file)
    policy = AddressPolicy(settings.upstreams.private_host_exceptions)
    upstream = UpstreamClient.create(policy, settings.limits, tls, credentials=settings.upstreams.upstream_credentials)
    upstream.observe = app[METRICS].observe_upstream
    app[UPSTREAM] = upstream
    try:
        yield
    finally:
        await upstream.close()


async def access_ctx(app: web.Application) -> AsyncIterator[None]:
    """Client tokens, OIDC issuers and archive grants; with a tokens or issuers file, SIGHUP reads them again
    (`reload_ctx`)."""
    settings = app[SETTINGS]
    secret, accepted = await asyncio.to_thread(lambda: (metadata_secret(settings), accepted_secrets(settings)))
    rotating = tuple(create_grants(grant_key(old)) for old in accepted)
    access = app[ACCESS] = await asyncio.to_thread(Access, settings, create_grants(grant_key(secret)), rotating)
    if settings.access.clients_required:
        app[ON_SIGHUP].append(access.reload)
    yield


async def policy_ctx(app: web.Application) -> AsyncIterator[None]:
    """The policy (`--policy`, read again on SIGHUP) and the audit trail (`--audit-log`, reopened on SIGHUP), closed
    on shutdown."""
    settings = app[SETTINGS]
    path = settings.policy.policy_file
    policy = await asyncio.to_thread(load_policy, path) if path is not None else None
    audit = await asyncio.to_thread(
        AuditLog.open,
        settings.policy.audit_log,
        required=settings.policy.audit_required,
        on_dropped=app[METRICS].audit_dropped.inc,
    )
    try:
        first_seen = FirstSeen(app[METADATA_BACKEND], app[SHARED_FETCHES], time.time, app[PUBLISH_DATES])
        gate = app[GATEKEEPER] = Gatekeeper(policy, path=path, first_seen=first_seen, audit=audit, metrics=app[METRICS])
        backend = app[METADATA_BACKEND]
        assert isinstance(backend, SealedStore)  # (`open_metadata`): a record present but unsealed is told apart
        signing = app[SIGNING_KEYS] = SigningKeys(
            backend,
            app[FLEET_LOCKS],
            trust=lambda: DEFAULT_TRUST if gate.policy is None else gate.policy.keys,  # the policy in force
            audit=audit,
            metrics=app[METRICS],
        )
        app[MIRROR].on_signed(signing.check, signing.check_pin, signing.pinned)
        app[MIRROR].on_dated(gate.dated, gate.dates_wanted)
        if audit.enabled:
            app[MIRROR].on_fetched(gate.fetched)
            app[MODULES].on_fetched = gate.fetched
            app[ON_SIGHUP].append(audit.reopen)  # after a rotation, the events go to a new file
        if path is not None:
            app[ON_SIGHUP].append(gate.reload)
            log.info("policy.loaded", file=str(path), rules=len(policy.rules), mode=policy.mode)
        yield
    finally:
        audit.close()


async def reload_ctx(app: web.Application) -> AsyncIterator[None]:
    """SIGHUP reads the tokens file and the policy again and reopens the audit log, in every worker (the supervisor
    passes its SIGHUP on: proxy.web.workers), off the loop."""
    reloaders = list(app[ON_SIGHUP])
    if not reloaders:
        yield
        return
    loop = asyncio.get_running_loop()
    reloads = Reloads(lambda: [reload() for reload in reloaders])
    loop.add_signal_handler(signal.SIGHUP, reloads.request)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        await reloads.close()


class Reloads:
    """Runs a blocking `reload` in a thread on request, one at a time (a request while one runs: once more after)."""

    def __init__(self, reload: Callable[[], object]) -> None:
        self._reload = reload
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def request(self) -> None:
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        self._again = True
        while self._again:
            self._again = False
            await asyncio.to_thread(self._reload)

    async def close(self) -> None:
        if self._task is not None:
            self._again = False
            await self._task


async def keyring_ctx(app: web.Application) -> AsyncIterator[None]:
    """The GnuPG home that verifies signatures (its daemons stopped on close)."""
    keyring = await asyncio.to_thread(Keyring, app[SETTINGS].gnupg_home)
    app[KEYRING] = keyring
    try:
        yield
    finally:
        await asyncio.to_thread(keyring.close)


async def shared_fetches_ctx(app: web.Application) -> AsyncIterator[None]:
    """The process's shared fetches (cancelled, and their clean-up awaited, on close)."""
    shared_fetches = app[SHARED_FETCHES] = SharedFetches(app[FLEET_LOCKS])
    try:
        yield
    finally:
        await shared_fetches.close()


async def services_ctx(app: web.Application) -> AsyncIterator[None]:
    """The services the handlers call, over the resources above; the downloader stops following other
    processes' downloads on close."""
    settings, metrics = app[SETTINGS], app[METRICS]
    store, space, cache, shared_fetches = app[ARCHIVE_STORE], app[DISK_SPACE], app[METADATA_CACHE], app[SHARED_FETCHES]
    upstream = app[UPSTREAM]
    ca_bundle = await asyncio.to_thread(write_ca_bundle, settings)
    guard = app[GUARD] = ArchiveGuard(store, metrics)
    documents = DocumentCache(settings, upstream, cache, metrics, shared_fetches)
    # Reused answers are judged by the clock the documents' freshness is (`documents.clock`, looked up each time).
    app[WARM_ANSWERS] = WarmAnswers(app[MEMORY_FRONT].generation, clock=lambda: documents.clock())
    app[PUBLISH_DATES] = PublishDates(settings, documents)
    downloader = app[DOWNLOADER] = Downloader(settings, upstream, store, guard, space, metrics)
    try:
        app[MIRROR] = Mirror(
            settings,
            documents,
            downloader,
            shared_fetches,
            app[KEYRING],
            cache=cache,
            store=store,
            space=space,
            metrics=metrics,
        )
        usage = app[ARCHIVE_USAGE] = ArchiveUsage(app[SERVED_TIMES], grace=settings.archives.eviction_grace)
        inventory = app[INVENTORY] = InventoryReader(settings, cache, usage)
        app[CATALOG] = Catalog(cache, store, app[SERVED_TIMES], inventory)
        git = GitFetcher(
            AddressPolicy(settings.upstreams.private_host_exceptions),
            store.temp_dir / "git",
            ca_bundle=ca_bundle,
            timeout=settings.modules.git_timeout,
            max_bytes=settings.modules.max_module_bytes,
            max_entries=settings.modules.max_module_entries,
            credentials=settings.upstreams.upstream_credentials,
        )
        app[MODULES] = ModuleMirror(
            settings, documents, downloader, shared_fetches, git, store=store, space=space, metrics=metrics
        )
        yield
    finally:
        await downloader.close()


async def evictor_ctx(app: web.Application) -> AsyncIterator[None]:
    """The evictor's loop, which keeps the store under --max-store-size and the free-space floor."""
    settings = app[SETTINGS]
    evictor = Evictor(
        app[ARCHIVE_STORE],
        app[ARCHIVE_USAGE],
        app[SERVED_TIMES],
        app[FLEET_LOCKS],
        app[DISK_SPACE],
        app[METRICS],
        cap=settings.archives.max_store_size,
        grace=settings.archives.eviction_grace,
        interval=settings.archives.eviction_interval,
    )
    app[DOWNLOADER].on_stored = evictor.stored
    evictor.start()
    try:
        yield
    finally:
        await evictor.close()


async def _log_started(app: web.Application) -> None:
    settings = app[SETTINGS]
    log.info(
        "proxy.started",
        data_dir=str(settings.data_dir),
        allowed_hosts=sorted(settings.upstreams.all_allowed_hosts),
        metadata_store="redis" if settings.metadata.redis_url else "embedded",
        offline=settings.upstreams.offline,
        event_loop=loop_name(asyncio.get_running_loop()),
        access_log=settings.logging.access_log,
        max_store_size=settings.archives.max_store_size,
    )


async def _begin_shutdown(app: web.Application) -> None:
    """Requests in flight may wait for the shared fetches as long as the server gives them (--shutdown-grace)."""
    if SHARED_FETCHES in app:
        app[SHARED_FETCHES].begin_shutdown(app[SETTINGS].server.shutdown_grace)


async def _settle_tallies(app: web.Application) -> None:
    """What this process gathered per request goes out before it ends: the metrics' tallies into the shared values,
    the access-log lines into the log."""
    app[METRICS].fold()
    flush_access_log()


async def oidc_keys_ctx(app: web.Application) -> AsyncIterator[None]:
    """With --oidc-issuers: the issuers' key cache (shared through the metadata store) and its own upstream
    session, which never carries upstream credentials, with a short timeout (a token waits on it at most once
    a minute, when it names a key not held): one deadline for a fetch's discovery document and key set together,
    at most 8 s and --request-deadline, so a hanging issuer's 503 comes before Terraform gives up (10 s)."""
    settings, access = app[SETTINGS], app[ACCESS]
    if settings.access.oidc_issuers is None:
        yield
        return
    limits = dataclasses.replace(
        settings.limits,
        metadata_timeout=min(settings.limits.metadata_timeout, settings.limits.request_deadline, FETCH_DEADLINE),
    )
    tls = await asyncio.to_thread(create_ssl_context, settings.upstreams.upstream_ca_file)
    upstream = UpstreamClient.create(AddressPolicy(settings.upstreams.private_host_exceptions), limits, tls)
    try:
        keys = IssuerKeys(
            upstream,
            app[METADATA_BACKEND],
            app[METRICS],
            refresh_interval=settings.access.oidc_keys_refresh,
            fetch_deadline=limits.metadata_timeout,
        )
        try:
            access.oidc = OidcAuthenticator(keys, app[METRICS])
            yield
        finally:
            access.oidc = None
            await keys.close()
    finally:
        await upstream.close()


def write_ca_bundle(settings: Settings) -> Path | None:
    """A single CA file for git: the system bundle plus the operator's extra CAs (None: git's default).
    Blocking: call it off the loop."""
    if settings.upstreams.upstream_ca_file is None:
        return None
    system = ssl.get_default_verify_paths().cafile
    parts = [Path(system).read_bytes()] if system and Path(system).exists() else []
    parts.append(settings.upstreams.upstream_ca_file.read_bytes())
    bundle = settings.upstream_ca_bundle
    bundle.parent.mkdir(parents=True, exist_ok=True)
    bundle.write_bytes(b"\n".join(parts))
    return bundle
