"""`Cache-Control` and `Vary` on the metadata answers (`proxy.protocol.cache_control` says which), so a shared cache in
front of the proxy keeps each only as long as the proxy would, and never one that depends on the client.

Applied to the answers of `METADATA_ROUTES` only, errors included; archives set their own
(`proxy.web.archive_responses`).
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web
from aiohttp.hdrs import AUTHORIZATION

from proxy.governance.gatekeeper import Gatekeeper
from proxy.identity.tokens import GRANT_PARAM, Client
from proxy.protocol.cache_control import StaleWindows, cache_control
from proxy.services.freshness import request_fresh_for
from proxy.settings.config import Settings

METADATA_ROUTES = frozenset(
    {
        "mirror_json",
        "registry_provider_versions",
        "registry_provider_download",
        "registry_module_versions",
        "registry_module_download",
        "discovery",
    }
)


def client_dependent(request: web.BaseRequest, client: Client | None, gate: Gatekeeper | None) -> bool:
    """Whether the answer may differ by client: a token or a grant was shown (`client`: who showed it), or a policy
    judges the client (`gate`: the gatekeeper when a policy is in force, `proxy.web.policy_checks.app_gatekeeper`)."""
    return shown_client(request.headers, client, gate) or GRANT_PARAM in request.query


def shown_client(headers: Mapping[str, str], client: Client | None, gate: Gatekeeper | None) -> bool:
    """`client_dependent` for a request without a query (no grant in it): a token shown, or a policy judging."""
    return client is not None or gate is not None or AUTHORIZATION in headers


_last_windows: tuple[Settings, StaleWindows] | None = None


def stale_windows(settings: Settings) -> StaleWindows:
    """The stale windows of `settings` (frozen: made once per settings object, not per request)."""
    global _last_windows
    last = _last_windows
    if last is None or last[0] is not settings:
        last = _last_windows = (settings, StaleWindows(settings.metadata.redis_retention, settings.freshness.negative))
    return last[1]


def add_cache_headers(
    request: web.Request,
    response: web.StreamResponse,
    route: str,
    client: Client | None,
    settings: Settings | None,
    gate: Gatekeeper | None,
) -> None:
    """Set the metadata answer's `Cache-Control` and `Vary: Authorization` (other routes: left alone); `route`: the
    request's route name, `client`: who it came from (`proxy.web.access.CLIENT`), `settings`: the application's,
    `gate`: its gatekeeper when a policy is in force. The answer stays fresh as long as the request noted
    (`proxy.services.freshness.request_fresh_for`)."""
    if route not in METADATA_ROUTES or response.prepared or settings is None:
        return
    headers = response.headers
    private = client_dependent(request, client, gate)
    headers["Cache-Control"] = cache_control(response.status, request_fresh_for(), private, stale_windows(settings))
    headers["Vary"] = "Authorization"
