"""The proxy's own `/.well-known/terraform.json`: registry services for the default upstream.

With it, `source = "PROXYHOST/namespace/name/system"` works for modules without any CLI
configuration (module registry hosts must contain a dot or be an IP address, e.g.
`127.0.0.1:8443/...`).
"""

from __future__ import annotations

from aiohttp import web

from proxy.rewrite import registry_base
from proxy.web.keys import SETTINGS
from proxy.web.responses import json_response


async def well_known(request: web.Request) -> web.Response:
    upstream = request.app[SETTINGS].upstreams.default_upstream
    return json_response(
        {"providers.v1": registry_base(upstream, "providers"), "modules.v1": registry_base(upstream, "modules")}
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/.well-known/terraform.json", well_known, name="discovery")
