"""`GET /lock/v1/:hostname/:namespace/:type/:version?platform=OS_ARCH&…`: hashes for lock files.

Answers what `terraform providers lock -platform=…` would record: the `h1:` of each
requested platform (computed from the verified archive, fetched if needed) and a `zh:` for
every line of the signed SHA256SUMS. `hashes` is the sorted union. A platform the version does
not offer (per the provider's version list) is a 404 naming it, before anything is fetched,
as `providers lock` fails for a platform the provider has no package for.
"""

from __future__ import annotations

from aiohttp import web

from proxy.domain.addresses import Platform, ProviderAddr, Version
from proxy.errors import InvalidRequestError
from proxy.web.app_keys import MIRROR
from proxy.web.policy_checks import client_identity, gatekeeper
from proxy.web.responses import json_response

MAX_PLATFORMS = 64


async def lock_hashes(request: web.Request) -> web.Response:
    info = request.match_info
    addr = ProviderAddr.parse(info["hostname"], info["namespace"], info["type"])
    version = Version.parse(info["version"])
    requested = request.query.getall("platform", [])
    if len(requested) > MAX_PLATFORMS:
        raise InvalidRequestError(f"at most {MAX_PLATFORMS} platforms per request")
    platforms = list(dict.fromkeys(Platform.parse(p) for p in requested))
    mirror = request.app[MIRROR]
    gate = gatekeeper(request)

    async def check() -> int:
        """`registry-proxy lock` obeys the policy: a denied version or platform is refused."""
        if gate is None:
            return 0
        client = client_identity(request)
        for platform in platforms or [None]:
            await gate.check(addr, version, platform and str(platform), client, lambda: mirror.provider_versions(addr))
        return gate.stamp

    stamp = await check()
    result = await mirror.lock_hashes(addr, version, platforms)
    if gate is not None and gate.stamp != stamp:  # a publish time learned on the way (its SHA256SUMS's date)
        await check()
    return json_response(
        {
            "provider": str(addr),
            "version": str(version),
            "platforms": {p: {"h1": str(result.h1[p]), "zh": str(result.zh[p])} for p in result.h1},
            "signed_zh": [str(h) for h in result.signed],
            "hashes": [str(h) for h in result.all],
        }
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/lock/v1/{hostname}/{namespace}/{type}/{version}", lock_hashes, name="lock")
