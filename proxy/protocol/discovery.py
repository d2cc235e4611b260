"""Remote service discovery (`/.well-known/terraform.json`), as the clients do it.

Pure helpers: where to ask for a host (or the operator's `--upstream-map` base URL),
how to validate the answer, and how to resolve a service URL against the final
(post-redirect) discovery URL (docs/protocol.md#service-discovery). Fetching and caching are
`proxy.fetch`'s job.
"""

from __future__ import annotations

from yarl import URL

from proxy.domain.addresses import Hostname
from proxy.errors import ServiceNotFoundError, UpstreamMalformedError
from proxy.protocol.safe_json import JSONDocumentError, loads

WELL_KNOWN_PATH = "/.well-known/terraform.json"
MAX_REDIRECTS = 3  # Terraform's discovery client follows at most three


def discovery_url(hostname: Hostname, upstream_map: dict[str, URL]) -> URL:
    """`https://HOST[:PORT]/.well-known/terraform.json`, or under the mapped base URL."""
    base = upstream_map.get(str(hostname))
    if base is not None:
        return base.with_path(base.path.rstrip("/") + WELL_KNOWN_PATH, encoded=False)
    return URL.build(scheme="https", host=hostname.ascii, port=hostname.port, path=WELL_KNOWN_PATH)


def parse_discovery(body: bytes, content_type: str, hostname: Hostname) -> dict[str, object]:
    """Validate a discovery document: `application/json`, a JSON object."""
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise UpstreamMalformedError(
            f"discovery document of {hostname} has content type {content_type!r}, not application/json"
        )
    try:
        document = loads(body)
    except JSONDocumentError as exc:
        raise UpstreamMalformedError(f"discovery document of {hostname} {exc}") from None
    if not isinstance(document, dict):
        raise UpstreamMalformedError(f"discovery document of {hostname} is not a JSON object")
    return document


def service_url(services: dict[str, object], service: str, final_url: URL, hostname: Hostname) -> URL:
    """Resolve `service` (e.g. `providers.v1`) against the final discovery URL."""
    value = services.get(service)
    if value is None:
        name = service.split(".", 1)[0]
        others = sorted(key for key in services if key.startswith(name + "."))
        detail = f" (it offers {', '.join(others)})" if others else ""
        raise ServiceNotFoundError(f"host {hostname} does not provide a {service} service{detail}")
    if not isinstance(value, str):
        raise UpstreamMalformedError(f"discovery document of {hostname}: {service} is not a string")
    try:
        url = final_url.join(URL(value)).with_fragment(None)
    except ValueError:
        raise UpstreamMalformedError(f"discovery document of {hostname}: {service} is not a URL") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise UpstreamMalformedError(f"discovery document of {hostname}: {service} must be an http(s) URL")
    if url.user or url.password:
        raise UpstreamMalformedError(f"discovery document of {hostname}: {service} URL must not carry credentials")
    return url
