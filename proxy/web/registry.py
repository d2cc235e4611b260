"""Registry protocol pass-through for upstream host H: `/registry/H/providers/v1/` and `/registry/H/modules/v1/`.

Providers: `versions` and download metadata as the upstream sent them, with the three URLs
of a download answer pointing at the proxy; SHA256SUMS and its signature byte-identical,
served only once verified; archives from the same verified store as the network mirror.
Modules: `versions` as sent; `download` answers `200` with `{"location": X}` *and*
`X-Terraform-Get: X` (Terraform reads the header, OpenTofu the body); the cached archive.
The proxy's own URLs in these answers are root-relative, signed (grants) for the path the proxy
receives and then put under `--public-url`'s path (`proxy.protocol.proxy_urls.under`).
"""

from __future__ import annotations

from aiohttp import web

from proxy.domain.addresses import ModuleAddr, Platform, ProviderAddr, Version
from proxy.errors import DocumentNotFoundError, PolicyDeniedError
from proxy.governance.policy_documents import (
    denied_download_document,
    denied_versions_document,
    filtered_module_versions,
    filtered_versions_document,
)
from proxy.protocol.proxy_urls import rewrite_download_document, under
from proxy.web.access import url_signer
from proxy.web.app_keys import MIRROR, MODULES, RENDERINGS, SETTINGS
from proxy.web.archive_responses import Found, serve_found
from proxy.web.policy_checks import client_identity, gatekeeper, served_note, terraform_client
from proxy.web.responses import json_response, rendered_response

_FILE_URLS = ("download_url", "shasums_url", "shasums_signature_url")
PROVIDERS = "/registry/{hostname}/providers/v1/{namespace}/{type}"
MODULES_PREFIX = "/registry/{hostname}/modules/v1/{namespace}/{name}/{system}"


def _provider(request: web.Request) -> ProviderAddr:
    info = request.match_info
    return ProviderAddr.parse(info["hostname"], info["namespace"], info["type"])


def _module(request: web.Request) -> ModuleAddr:
    info = request.match_info
    return ModuleAddr.parse(info["hostname"], info["namespace"], info["name"], info["system"])


def _platform(request: web.Request) -> Platform:
    return Platform.of(request.match_info["os"], request.match_info["arch"])


def _raw_json(request: web.Request, key: tuple, body: bytes) -> web.Response:
    """An upstream's JSON answer as it sent it, with its ETag (hashed once per cached body)."""
    return rendered_response(request, request.app[RENDERINGS].body(key, body))


async def provider_versions(request: web.Request) -> web.Response:
    addr, mirror = _provider(request), request.app[MIRROR]
    gate = gatekeeper(request)
    if gate is None:
        return _raw_json(request, ("provider versions", addr), await mirror.versions_document(addr))
    client = client_identity(request)
    try:
        gate.check_address(addr, client)
    except PolicyDeniedError as exc:
        if not terraform_client(request):
            raise
        return json_response(denied_versions_document(str(addr), exc))
    versions = await mirror.provider_versions(addr)
    filtered = await gate.filter(addr, versions, client, versions)
    body = await mirror.versions_document(addr)
    key = ("provider versions", addr, gate.client_key(client))
    rendered = request.app[RENDERINGS].json(key, filtered, lambda f: filtered_versions_document(body, f, str(addr)))
    return rendered_response(request, rendered)


async def _provider_allowed(request: web.Request, addr: ProviderAddr, version: Version, platform: Platform) -> None:
    """Refuse a provider version or platform the policy denies (before anything about it is fetched)."""
    gate = gatekeeper(request)
    if gate is not None:
        mirror = request.app[MIRROR]
        await gate.check(addr, version, str(platform), client_identity(request), lambda: mirror.provider_versions(addr))


async def provider_download(request: web.Request) -> web.Response:
    addr, version, platform = _provider(request), Version.parse(request.match_info["version"]), _platform(request)
    try:
        await _provider_allowed(request, addr, version, platform)
    except PolicyDeniedError:
        if not terraform_client(request):
            raise
        # Terraform shows no reason for a refused download document, but prints the status line of a refused
        # SHA256SUMS: this answer, made here without asking the upstream, sends it there to read the reason.
        return json_response(denied_download_document(addr, version, platform))
    document = await request.app[MIRROR].download_document(addr, version, platform)
    signer = url_signer(request)
    prefix = request.app[SETTINGS].server.public_path

    def render(d: dict) -> dict:
        rewritten = rewrite_download_document(d, addr, version, platform)
        # Signed for the path the proxy receives, then put under the prefix the client uses.
        return {
            **rewritten,
            **{n: under(prefix, signer.sign(rewritten[n]) if signer else rewritten[n]) for n in _FILE_URLS},
        }

    key = ("provider download", addr, version, platform, signer and signer.key)
    rendered = request.app[RENDERINGS].json(key, document, render)
    return rendered_response(request, rendered)


async def provider_shasums(request: web.Request) -> web.Response:
    addr, version, platform = _provider(request), Version.parse(request.match_info["version"]), _platform(request)
    await _provider_allowed(request, addr, version, platform)
    gate = gatekeeper(request)
    stamp = gate.stamp if gate is not None else 0
    sums, signature = await request.app[MIRROR].signed_sums(addr, version, platform)
    if gate is not None and gate.stamp != stamp:  # a publish time learned on the way (its Last-Modified)
        await _provider_allowed(request, addr, version, platform)
    if request.match_info["file"] == "SHA256SUMS":
        return web.Response(body=sums, headers={"Content-Type": "text/plain; charset=utf-8"})
    if request.match_info["file"] == "SHA256SUMS.sig":
        return web.Response(body=signature, headers={"Content-Type": "application/octet-stream"})
    raise DocumentNotFoundError("expected SHA256SUMS or SHA256SUMS.sig")


async def module_versions(request: web.Request) -> web.Response:
    addr, modules = _module(request), request.app[MODULES]
    gate = gatekeeper(request)
    if gate is None:
        return _raw_json(request, ("module versions", addr), await modules.versions_document(addr))
    client = client_identity(request)
    gate.check_address(addr, client)
    versions = await modules.versions(addr)
    filtered = await gate.filter(addr, versions, client, versions)
    body = await modules.versions_document(addr)
    key = ("module versions", addr, gate.client_key(client))
    rendered = request.app[RENDERINGS].json(key, filtered, lambda f: filtered_module_versions(body, f))
    return rendered_response(request, rendered)


async def _module_allowed(request: web.Request, addr: ModuleAddr, version: Version) -> None:
    gate = gatekeeper(request)
    if gate is not None:
        modules = request.app[MODULES]
        await gate.check(addr, version, None, client_identity(request), lambda: modules.versions(addr))


async def module_download(request: web.Request) -> web.Response:
    addr = _module(request)
    version = Version.parse(request.match_info["version"])
    await _module_allowed(request, addr, version)
    location = await request.app[MODULES].location(addr, version)
    signer = url_signer(request)
    if location.startswith("/"):  # the proxy's own archive URL (not a passed-through source)
        location = under(request.app[SETTINGS].server.public_path, signer.sign(location) if signer else location)
    # The answer depends on the location alone: it is the key, and the source is always the same (None).
    rendered = request.app[RENDERINGS].json(("module download", location), None, lambda _: {"location": location})
    return rendered_response(request, rendered, headers={"X-Terraform-Get": location})


async def module_archive(request: web.Request) -> web.StreamResponse:
    addr, version = _module(request), Version.parse(request.match_info["version"])
    await _module_allowed(request, addr, version)

    async def find() -> Found:
        stored, record = await request.app[MODULES].archive(addr, version)
        if request.match_info["file"] != f"archive{record.extension}":
            raise DocumentNotFoundError(f"this module's archive is archive{record.extension}")
        return (
            stored,
            f"{addr.name}-{version}{record.extension}",
            _CONTENT_TYPES.get(record.archive, "application/octet-stream"),
        )

    return await serve_found(request, find, served_note(request, addr, version, None))


_CONTENT_TYPES = {
    "tar.gz": "application/gzip",
    "zip": "application/zip",
    "tar.bz2": "application/x-bzip2",
    "tar.xz": "application/x-xz",
    "tar": "application/x-tar",
}


def add_routes(app: web.Application) -> None:
    app.router.add_get(PROVIDERS + "/versions", provider_versions, name="registry_provider_versions")
    app.router.add_get(
        PROVIDERS + "/{version}/download/{os}/{arch}", provider_download, name="registry_provider_download"
    )
    app.router.add_get(
        PROVIDERS + "/{version}/download/{os}/{arch}/{file}", provider_shasums, name="registry_provider_shasums"
    )
    app.router.add_get(MODULES_PREFIX + "/versions", module_versions, name="registry_module_versions")
    app.router.add_get(MODULES_PREFIX + "/{version}/download", module_download, name="registry_module_download")
    app.router.add_get(MODULES_PREFIX + "/{version}/{file}", module_archive, name="registry_module_archive")
