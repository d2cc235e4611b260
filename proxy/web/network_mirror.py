"""Provider Network Mirror protocol: `index.json`, `:version.json` and the archives they list.

URL contract: `/mirror/v1/:hostname/:namespace/:type/index.json`, `.../:version.json`, and
archives at `.../:version/:os_:arch/terraform-provider-:type_:version_:os_:arch.zip`
(listed as relative URLs, so they resolve under whatever base URL the client used).
See docs/protocol.md#network-mirror-protocol.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from aiohttp import web

from proxy.domain.addresses import Platform, ProviderAddr, Version
from proxy.errors import DocumentNotFoundError, InvalidRequestError
from proxy.governance.audit import ClientIdentity
from proxy.governance.gatekeeper import Gatekeeper
from proxy.identity.tokens import Client
from proxy.protocol.proxy_urls import archive_filename
from proxy.providers.mirror import PlatformArchive
from proxy.services.freshness import note_fresh_for, request_fresh_for
from proxy.web.access import ACCESS, CLIENT, UrlSigner, signer_for
from proxy.web.app_keys import MIRROR, RENDERINGS, WARM_ANSWERS
from proxy.web.archive_responses import Found, may_follow, serve_found
from proxy.web.policy_checks import app_gatekeeper, client_identity, gatekeeper, served_note
from proxy.web.renderings import Rendering
from proxy.web.responses import rendered_response

PREFIX = "/mirror/v1/{hostname}/{namespace}/{type}"
MIRROR_ROUTE = "mirror_json"  # the route of `index.json` and `:version.json`


def _addr(request: web.Request) -> ProviderAddr:
    info = request.match_info
    return ProviderAddr.parse(info["hostname"], info["namespace"], info["type"])


async def json_document(request: web.Request) -> web.Response:
    """`index.json` (version list) or `:version.json` (archives of one version), from rendered bytes when warm,
    and for a moment from the very answer made last time (`proxy.web.warm_answers`, also sent by
    `proxy.web.front_door` before this handler is reached)."""
    name = request.match_info["document"]
    if not name.endswith(".json"):
        _addr(request)  # a malformed address is a 400 first
        raise DocumentNotFoundError(f"no such document {name!r}: expected index.json or VERSION.json")
    app = request.app
    reuse = reuse_of(app, request, name, request.get(CLIENT), app_gatekeeper(app))
    if (kept := reused(app, reuse)) is not None:
        rendered, fresh_for = kept
        note_fresh_for(fresh_for)
        return rendered_response(request, rendered)
    warm = app[WARM_ANSWERS]
    mark = warm.mark()
    rendered, valid_until = await _render(request, _addr(request), name, reuse.gate, reuse.client, reuse.signer)
    if reuse.reusable:
        warm.put(reuse.key, rendered, request_fresh_for(), mark, reuse.policy, valid_until, reuse.stamp)
    return rendered_response(request, rendered)


class Reuse(NamedTuple):
    """What reusing (or keeping) a document's answer depends on besides its path."""

    key: tuple  # the request's path, the signed URLs' key, the policy's view of the client
    reusable: bool  # not under a policy in warn mode (which records a would-be denial on every request)
    gate: Gatekeeper | None
    client: ClientIdentity | None
    signer: UrlSigner | None
    policy: object
    policy_now: float
    stamp: int


def reuse_of(
    app: web.Application, request: web.Request, name: str, token: Client | None, gate: Gatekeeper | None
) -> Reuse:
    """The reuse key and conditions of document `name` for this request of `app` from `token`'s holder (None:
    anonymous; `request[CLIENT]`), under `gate` (`app_gatekeeper(app)`)."""
    signer = (
        signer_for(app[ACCESS].grants, token, request.rel_url) if token is not None and name != "index.json" else None
    )
    if gate is None:
        return Reuse((request.path, signer and signer.key, None), True, None, None, signer, None, 0.0, 0)
    client = client_identity(request)
    policy = gate.policy
    key = (request.path, signer and signer.key, gate.client_key(client))
    reusable = policy is None or policy.mode == "enforce"
    return Reuse(key, reusable, gate, client, signer, policy, gate.clock(), gate.stamp)


def reused(app: web.Application, reuse: Reuse) -> tuple[Rendering, float] | None:
    """The answer kept for `reuse` and how long it stays fresh, counted as the cache hit it stands for; None when
    none may be reused now."""
    kept = warm_document(app, reuse)
    if kept is not None:
        app[MIRROR].count_reused()
    return kept


def warm_document(app: web.Application, reuse: Reuse) -> tuple[Rendering, float] | None:
    """The answer kept for `reuse` (`reuse_of` the request) and how long it stays fresh, not counted (the caller
    counts the cache hit it stands for: `proxy.web.middlewares.record_request`); None when none may be reused now."""
    if not reuse.reusable:
        return None
    return app[WARM_ANSWERS].get(reuse.key, reuse.policy, reuse.policy_now, reuse.stamp)


async def _render(
    request: web.Request,
    addr: ProviderAddr,
    name: str,
    gate: Gatekeeper | None,
    client: ClientIdentity | None,
    signer: UrlSigner | None,
) -> tuple[Rendering, float]:
    """The answer, and until when (the policy's clock) the policy's decisions in it hold (infinite without one)."""
    mirror, rendered = request.app[MIRROR], request.app[RENDERINGS]
    if name == "index.json":
        if gate is None or client is None:
            versions = await mirror.provider_versions(addr)
            return rendered.json(("index.json", addr), versions, _index_document), math.inf
        gate.check_address(addr, client)
        versions = await mirror.provider_versions(addr)
        filtered = await gate.filter(addr, versions, client, versions)
        key = ("index.json", addr, gate.client_key(client))
        valid_until = math.inf if filtered is None else filtered.valid_until
        return rendered.json(key, filtered, lambda f: _index_document(f.allowed)), valid_until
    version = Version.parse(name.removesuffix(".json"))
    only, stamp = None, 0
    if gate is not None and client is not None:
        only = await gate.version_platforms(addr, version, client, lambda: mirror.provider_versions(addr))
        stamp = gate.stamp
    archives = await mirror.version_archives(addr, version, only)
    if gate is not None and client is not None and gate.stamp != stamp:  # a publish time learned on the way
        await gate.version_platforms(addr, version, client, lambda: mirror.provider_versions(addr))
    answer = rendered.json(
        ("version.json", addr, version, signer and signer.key, only),
        archives,
        lambda a: _version_document(addr, version, a, signer),
    )
    return answer, math.inf


def _index_document(versions: Iterable[Version]) -> dict:
    return {"versions": {str(v): {} for v in sorted(versions, key=Version.precedence)}}


def _version_document(
    addr: ProviderAddr, version: Version, archives: Iterable[PlatformArchive], signer: UrlSigner | None
) -> dict:
    def url(platform: Platform) -> str:
        relative = f"{version}/{platform}/{archive_filename(addr, version, platform)}"
        return signer.sign(relative) if signer else relative

    return {
        "archives": {str(a.platform): {"url": url(a.platform), "hashes": [str(h) for h in a.hashes]} for a in archives}
    }


async def archive(request: web.Request) -> web.StreamResponse:
    """GET/HEAD of a verified provider archive."""
    addr = _addr(request)
    version = Version.parse(request.match_info["version"])
    platform = Platform.parse(request.match_info["platform"])
    if request.match_info["filename"] != archive_filename(addr, version, platform):
        raise InvalidRequestError(f"archive name must be {archive_filename(addr, version, platform)}")

    gate = gatekeeper(request)
    if gate is not None:
        client = client_identity(request)
        mirror = request.app[MIRROR]
        await gate.check(addr, version, str(platform), client, lambda: mirror.provider_versions(addr))

    async def find() -> Found:
        archive_or_relay, filename = await request.app[MIRROR].archive_for_client(
            addr, version, platform, follow=may_follow(request)
        )
        return archive_or_relay, filename, "application/zip"

    return await serve_found(request, find, served_note(request, addr, version, str(platform)))


def add_routes(app: web.Application) -> None:
    app.router.add_get(PREFIX + "/{document}", json_document, name=MIRROR_ROUTE)
    app.router.add_get(PREFIX + "/{version}/{platform}/{filename}", archive, name="mirror_archive")
