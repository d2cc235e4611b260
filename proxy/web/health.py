"""`/healthz` (the process answers), `/readyz` (stores reachable, free space above the floor) and `/metrics`."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from proxy.web.access import shown_host
from proxy.web.app_keys import FLEET_SECRET, METRICS, MIRROR, SETTINGS
from proxy.web.responses import json_response


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """503 when archives cannot be stored (unwritable, or below --min-free-space) or when the metadata secret
    differs from the fleet's (its marker read again now); a metadata store outage is "degraded" but serving."""
    mirror = request.app[MIRROR]
    checks = await mirror.ready()
    space = await mirror.disk_space()
    fleet = request.app.get(FLEET_SECRET)
    if fleet is not None and checks["metadata_store"]:
        await fleet.check()
    mismatched = fleet is not None and fleet.problem is not None
    if mismatched:
        checks["metadata_store"] = False
    if not checks["archive_store"] or not checks["disk_space"] or mismatched:
        status, code = "not ready", 503
    elif not checks["metadata_store"]:
        status, code = "degraded", 200
    else:
        status, code = "ready", 200
    body: dict = {
        "status": status,
        "checks": checks,
        "disk_space": {"free_bytes": space.free_bytes, "min_free_bytes": space.min_free_bytes},
    }
    if not checks["metadata_store"]:
        body["reasons"] = {"metadata_store": mirror.metadata_problem() or "the metadata store did not answer"}
    return json_response(body, status=code)


async def metrics(request: web.Request) -> web.Response:
    """The exposition (the store's size as the evictor last listed it) and, with Redis, whether it answers;
    a private registry's series only for a token that may read it."""
    registry, mirror = request.app[METRICS], request.app[MIRROR]
    if request.app[SETTINGS].metadata.redis_url:
        registry.redis_up(await mirror.metadata_store_up())
    body = registry.exposition(shown_host(request))
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz, name="healthz")
    app.router.add_get("/readyz", readyz, name="readyz")
    app.router.add_get("/metrics", metrics, name="metrics")
