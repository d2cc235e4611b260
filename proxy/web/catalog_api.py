"""`GET /api/v1/catalog`: what the proxy caches, as JSON, a page at a time, only what the client may read; and
`DELETE /api/v1/catalog/ADDRESS[@VERSION]`: the purge, for a client token with `admin = true` that may read
the address (`proxy.governance.catalog`). Every request of every process sees a purge made anywhere
(`proxy.web.middlewares.request_context`, through `proxy.metadata_store.memory.MemoryFront.follow_purges`)."""

from __future__ import annotations

import structlog
from aiohttp import web

from proxy.errors import AdminScopeError, ProxyError, StoreUnavailableError
from proxy.governance.catalog import Catalog, PurgeTarget, parse_limit
from proxy.web.access import CLIENT, readable
from proxy.web.app_keys import CATALOG
from proxy.web.responses import json_response

log = structlog.get_logger(__name__)
NO_STORE = {"Cache-Control": "no-store"}


async def catalog_page(request: web.Request) -> web.Response:
    limit = parse_limit(request.query.get("limit"))
    visible = readable(request)
    catalog: Catalog = request.app[CATALOG]
    try:
        page = await catalog.page(
            lambda host, namespace: visible(host, namespace), after=request.query.get("cursor"), limit=limit
        )
    except ProxyError:
        raise
    except Exception as exc:
        raise StoreUnavailableError(f"the catalog could not be read: {str(exc) or type(exc).__name__}") from exc
    return json_response(page.document(), headers=NO_STORE)


async def purge(request: web.Request) -> web.Response:
    client = request.get(CLIENT)
    target = PurgeTarget.parse(request.match_info["target"])
    if client is None or not client.may_purge(target.host, target.namespace):
        raise AdminScopeError(
            f"purging {target.host}/{target.namespace} needs a client token with `admin = true` that may read it "
            "(without client tokens: `registry-proxy purge`)"
        )
    report = await request.app[CATALOG].purge(target, who=f"token:{client.name}")  # static tokens only purge
    return json_response(report.document(), headers=NO_STORE)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/catalog", catalog_page, name="catalog")
    app.router.add_delete("/api/v1/catalog/{target:.+}", purge, name="catalog_purge")
