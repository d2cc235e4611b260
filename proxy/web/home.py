"""`GET /`: the page for humans (`proxy.web.home_page`), and `GET /ca.pem`: the CA the proxy generated.

The page carries a strict Content-Security-Policy: nothing loads from anywhere, and the one
inline style sheet and script run only with this response's nonce.
"""

from __future__ import annotations

import secrets
import time

from aiohttp import web

from proxy import __version__
from proxy.errors import CaNotFoundError
from proxy.web import home_page
from proxy.web.access import readable
from proxy.web.app_keys import GATEKEEPER, INVENTORY, METRICS, MIRROR, SETTINGS, SIGNING_KEYS
from proxy.web.middlewares import client_origin

MAX_QUERY = 200  # characters of a search kept
CA_FILE_NAME = "registry-proxy-ca.pem"


def content_security_policy(nonce: str) -> str:
    return (
        f"default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; img-src data:; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    )


async def index(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    inventory = request.app[INVENTORY]
    query = request.query.get("q", "")[:MAX_QUERY].strip()
    fallback = home_page.listen_address(settings.server.listen_host, settings.server.listen_port)
    nonce = secrets.token_urlsafe(18)
    visible = readable(request)
    data = home_page.PageData(
        version=__version__,
        base=home_page.base_url(settings.server.public_url, *client_origin(request), fallback),
        ca_url="ca.pem" if _generated_ca(request) else None,
        hosts=await inventory.hosts(visible=lambda host: visible(host, None)),
        inventory=await inventory.scan(query, visible=visible),
        query=query,
        totals=request.app[METRICS].totals(),
        offline=settings.upstreams.offline,
        metadata_problem=request.app[MIRROR].metadata_problem(),
        nonce=nonce,
        now=time.time(),
        policy=_policy_view(request, visible),
        key_events=_key_events(request, visible),
    )
    return web.Response(
        text=home_page.render(data),
        content_type="text/html",
        charset="utf-8",
        headers={
            "Content-Security-Policy": content_security_policy(nonce),
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "X-Frame-Options": "DENY",
        },
    )


def _policy_view(request: web.Request, visible) -> home_page.PolicyView | None:
    """The policy's rules and recent denials, of the hosts (and namespaces) this client may read."""
    gate = request.app.get(GATEKEEPER)
    if gate is None or gate.policy is None:
        return None
    audit = gate.audit
    rules = [(rule.name, rule.action, audit.blocked[rule.name]) for rule in gate.policy.rules]
    rules.append(("default", gate.policy.default_action, audit.blocked["default"]))

    def shown(artifact: str) -> bool:
        host, _, rest = artifact.partition("/")
        return visible(host, rest.partition("/")[0])

    return home_page.PolicyView(gate.policy.mode, rules, [d for d in audit.recent if shown(d.artifact)])


def _key_events(request: web.Request, visible) -> list:
    """The signing-key changes and pin refusals of this server process, of the hosts (and namespaces) this client
    may read."""
    signing = request.app.get(SIGNING_KEYS)
    if signing is None:
        return []
    return [e for e in signing.recent if visible(*e.address.split("/")[:2])]


def _generated_ca(request: web.Request) -> bool:
    settings = request.app[SETTINGS]
    return settings.tls.tls_cert is None and not settings.tls.plain_http and (settings.tls_dir / "ca.pem").is_file()


async def ca_pem(request: web.Request) -> web.FileResponse:
    """The local CA certificate (never its key), only when the proxy serves TLS with the certificate it made."""
    if not _generated_ca(request):
        raise CaNotFoundError(
            "this proxy did not generate its certificate: there is no CA to download "
            "(ask its operator which CA signed it)"
        )
    return web.FileResponse(
        request.app[SETTINGS].tls_dir / "ca.pem",
        headers={
            "Content-Type": "application/x-pem-file",
            "Content-Disposition": f'attachment; filename="{CA_FILE_NAME}"',
            "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff",
        },
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", index, name="page")
    app.router.add_get("/ca.pem", ca_pem, name="ca_pem")
