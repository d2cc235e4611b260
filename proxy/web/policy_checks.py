"""The policy in the handlers: who the client is, and the checks each route makes before its service call.

`client_identity` is the one place the audit trail and the policy's `clients` and `scopes` globs learn who asked
(the token's name, the address, an OIDC subject, the scope as `HOST/NAMESPACE` texts). The checks raise
`PolicyDeniedError` (403 naming the rule and its reason) before the service is asked for anything, so
nothing denied is fetched from an upstream.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from proxy.domain.addresses import Version
from proxy.governance.audit import ClientIdentity
from proxy.governance.gatekeeper import Address, Gatekeeper
from proxy.web.access import CLIENT
from proxy.web.app_keys import GATEKEEPER

ANONYMOUS = ClientIdentity()


def client_identity(request: web.Request) -> ClientIdentity:
    """Who sent `request`: its token's name (`anonymous` without one), its address (the audit trail adds the
    request id of the log)."""
    client = request.get(CLIENT)  # also the holder of a download's grant
    if client is None:
        return ClientIdentity(ANONYMOUS.name, request.remote)
    identity = getattr(client, "identity", None)  # an OIDC client: its issuer and subject
    subject = identity.name if identity is not None and identity.kind == "oidc" else None
    return ClientIdentity(client.name, request.remote, subject, scopes=client.scope_texts)


def gatekeeper(request: web.Request) -> Gatekeeper | None:
    """The gatekeeper when a policy is in force (None: every request passes without a look)."""
    return app_gatekeeper(request.app)


def app_gatekeeper(app: web.Application) -> Gatekeeper | None:
    """`gatekeeper` for a handler that holds the application already."""
    gate = app.get(GATEKEEPER)
    return gate if gate is not None and gate.active else None


def served_note(
    request: web.Request, addr: Address, version: Version, platform: str | None
) -> Callable[[], None] | None:
    """The audit trail's `served` event for an archive about to be sent (once per client, artifact and hour), for
    `serve_found`'s `on_body`: written before the body, so that under `--audit-required` an event that cannot be
    written refuses the request (None: no audit trail)."""
    gate = request.app.get(GATEKEEPER)
    if gate is None or not gate.audit.enabled:
        return None
    return lambda: gate.served(addr, version, platform, client_identity(request))


def terraform_client(request: web.Request) -> bool:
    """Whether the request comes from Terraform or OpenTofu (which show a refused SHA256SUMS's status line)."""
    return request.headers.get("User-Agent", "").startswith(("Terraform/", "OpenTofu/"))
