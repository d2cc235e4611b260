"""The proxy's own `/.well-known/terraform.json`: registry services for the default upstream.

With it, `source = "PROXYHOST/namespace/name/system"` works for modules without any CLI
configuration (module registry hosts must contain a dot or be an IP address, e.g.
`127.0.0.1:8443/...`). The service URLs are root-relative, under `--public-url`'s path when it has one.
"""

from __future__ import annotations

from aiohttp import web

from proxy.protocol.proxy_urls import registry_base, under
from proxy.services.freshness import note_fresh_for
from proxy.web.app_keys import SETTINGS
from proxy.web.responses import json_response

SERVICES = {"providers.v1": "providers", "modules.v1": "modules"}


async def well_known(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    upstream, prefix = settings.upstreams.default_upstream, settings.server.public_path
    note_fresh_for(settings.freshness.discovery)  # made from the configuration: fresh as a discovery document
    return json_response({service: under(prefix, registry_base(upstream, name)) for service, name in SERVICES.items()})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/.well-known/terraform.json", well_known, name="discovery")
