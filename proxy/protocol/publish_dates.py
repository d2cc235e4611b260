"""Publish dates from the upstream: the public registry's per-version documents, and HTTP `Last-Modified`. Pure.

The public Terraform Registry answers `GET /v1/providers/NS/TYPE/VERSION` and
`GET /v1/modules/NS/NAME/SYSTEM/VERSION` with a document whose `published_at` is the version's publish time.
This is no part of `providers.v1` or `modules.v1` (which report no dates): it is asked only of a host whose
discovery lists the public registry's bases on its own origin (`registry_api_url`). Whatever a date source
says that cannot be read is no date (None), never an error.
"""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from yarl import URL

from proxy.domain.addresses import AddressError, ModuleAddr, ProviderAddr, Version
from proxy.protocol.safe_json import JSONDocumentError, loads

REGISTRY_API = "registry-api"  # the sources of a publish time, as records name them
LAST_MODIFIED = "sha256sums-last-modified"
# The sources in the order they are trusted, with what `policy explain` and refusals call them.
SOURCES = {REGISTRY_API: "the registry API's published_at", LAST_MODIFIED: "the SHA256SUMS's Last-Modified"}
_BASES = {ProviderAddr: "/v1/providers/", ModuleAddr: "/v1/modules/"}
_EARLIEST = datetime(2000, 1, 1, tzinfo=UTC).timestamp()  # before any registry: a date earlier is not believed


def registry_api_url(base: URL, discovered_at: URL, addr: ProviderAddr | ModuleAddr, version: Version) -> URL | None:
    """The per-version document's URL, when the host's discovery lists the public registry's base for the
    service (`/v1/providers/` or `/v1/modules/`) on the origin of the discovery document itself; else None."""
    if base.origin() != discovered_at.origin() or base.path != _BASES[type(addr)]:
        return None
    if isinstance(addr, ModuleAddr):
        return base.join(URL(f"{addr.namespace}/{addr.name}/{addr.system}/{version}"))
    return base.join(URL(f"{addr.namespace}/{addr.type}/{version}"))


def parse_published_at(body: bytes, version: Version) -> float | None:
    """The `published_at` of a per-version document (epoch seconds), None when the document is not one for
    `version` or has no readable date."""
    try:
        document = loads(body)
    except JSONDocumentError:
        return None
    if not isinstance(document, dict) or not _names(document.get("version"), version):
        return None
    text = document.get("published_at")
    if not isinstance(text, str) or len(text) > 64:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return _plausible(when)


def parse_last_modified(header: str | None) -> float | None:
    """An HTTP `Last-Modified` date (epoch seconds), None when absent or unreadable."""
    if not header or len(header) > 64:
        return None
    try:
        when = parsedate_to_datetime(header)
    except (TypeError, ValueError, IndexError):
        return None
    return _plausible(when)


def _names(text: object, version: Version) -> bool:
    """Whether a document's `version` is `version` (the document is about the version asked for)."""
    if not isinstance(text, str) or len(text) > 128:
        return False
    try:
        return Version.parse(text.removeprefix("v")) == version
    except AddressError:
        return False


def _plausible(when: datetime) -> float | None:
    if when.tzinfo is None:
        return None
    epoch = when.timestamp()
    return epoch if epoch >= _EARLIEST else None
