"""Upstream credentials, read as Terraform and OpenTofu read them, and where they may be sent. Pure.

Sources: `credentials "HOST" { token = "…" }` blocks of a CLI configuration file
(`--upstream-credentials`), and `TF_TOKEN_<host>` environment variables, decoded like the CLIs
(`collectCredentialsFromEnv`): `__` is a hyphen, then `_` a dot; the host is normalised to its
IDNA comparison form. As in the CLIs (`CredentialsSource.ForHost`), a `TF_TOKEN_` variable wins over
the file's block for the same host.

A token is sent only while the proxy fetches on behalf of its own registry host (`acting_for`,
set per request from the host the client named) and only to that host's own origin (its name and
port, or the base URL `--upstream-map` gives it): never on a redirect to another origin, never to
another registry's discovery, and never for a public registry whose documents point at the
private host (the proxy would otherwise be a confused deputy).
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from yarl import URL

from proxy.domain.addresses import AddressError, Hostname

ENV_PREFIX = "TF_TOKEN_"

# The registry host the current request reads (set by the web layer; inherited by the tasks it starts).
acting_for: contextvars.ContextVar[str | None] = contextvars.ContextVar("acting_for", default=None)


class CredentialsError(ValueError):
    """The credentials file or a TF_TOKEN_ variable is malformed."""


@contextmanager
def on_behalf_of(host: str | None) -> Iterator[None]:
    """Fetches made inside (and tasks started inside) may use `host`'s credentials."""
    reset = acting_for.set(host)
    try:
        yield
    finally:
        acting_for.reset(reset)


def env_host(name: str) -> str:
    """`TF_TOKEN_xn____caf__dma_fr` → `xn--caf-dma.fr` (the host in comparison form)."""
    raw = name[len(ENV_PREFIX) :].replace("__", "-").replace("_", ".")
    return _host(raw, f"environment variable {name}")


def _host(text: str, where: str) -> str:
    try:
        return str(Hostname.parse(text))
    except AddressError as exc:
        raise CredentialsError(f"{where}: {exc}") from None


def parse_cli_config(text: str, source: str = "credentials file") -> dict[str, str]:
    """The `credentials "HOST" { token = "…" }` blocks of a CLI configuration → {host: token}; a CredentialsError
    names `source` and the line (`SOURCE:LINE:COLUMN: …`, as compilers do) of what is wrong."""
    import hcl2  # only with --upstream-credentials: the HCL parser (lark) costs a process start ~0.2 s of CPU
    from hcl2.utils import SerializationOptions

    options = SerializationOptions(strip_string_quotes=True, explicit_blocks=False, with_comments=False)
    try:
        data = hcl2.loads(text, serialization_options=options)
    except Exception as exc:  # python-hcl2 raises lark errors of several kinds
        raise CredentialsError(f"{source}{_position(exc)}: not valid HCL{_unexpected(exc)}") from None
    tokens: dict[str, str] = {}
    for block in data.get("credentials", []):
        for host, body in block.items():
            host = host.strip('"')
            where = f'{source}{_block_line(text, host)}: credentials "{host}"'
            token = body.get("token") if isinstance(body, dict) else None
            if not isinstance(token, str) or not token:
                raise CredentialsError(f'{where}: needs token = "…"')
            tokens[_host(host, where)] = token
    return tokens


def _position(exc: Exception) -> str:
    """`:LINE:COLUMN` of a parse error that knows where it is (lark's do), else nothing."""
    line, column = getattr(exc, "line", None), getattr(exc, "column", None)
    if not isinstance(line, int) or line < 1:
        return ""
    return f":{line}:{column}" if isinstance(column, int) and column > 0 else f":{line}"


def _unexpected(exc: Exception) -> str:
    """What the parser did not expect, shortly (lark's own message lists every token it would have taken)."""
    token = getattr(exc, "token", None)
    if token is None:
        return ""
    if getattr(token, "type", "") == "$END":
        return " (unexpected end of file)"
    shown = str(token).splitlines()[0].strip() if str(token).strip() else ""
    return f" (unexpected {shown[:20]!r})" if shown else " (unexpected end of line)"


def _block_line(text: str, host: str) -> str:
    """`:LINE` of the first `credentials "HOST"` block in `text` (nothing if it cannot be found)."""
    found = re.search(rf'^[ \t]*credentials\s+"{re.escape(host)}"', text, re.MULTILINE)
    return f":{text.count(chr(10), 0, found.start()) + 1}" if found else ""


def from_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`TF_TOKEN_*` variables → {host: token}."""
    return {
        env_host(name): value
        for name, value in environ.items()
        if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX) and value
    }


@dataclass(frozen=True)
class UpstreamCredentials:
    """Bearer tokens per registry host, and the origins each may be sent to."""

    tokens: Mapping[str, str] = field(default_factory=dict, repr=False)  # never logged
    mapped: Mapping[str, URL] = field(default_factory=dict)  # --upstream-map

    @property
    def private_hosts(self) -> frozenset[str]:
        """Hosts fetched with credentials: their content is only for clients granted them."""
        return frozenset(self.tokens)

    def token_for(self, url: URL) -> str | None:
        """The token to send with a request to `url` now: the acting host's, if `url` is its own origin."""
        host = acting_for.get()
        token = self.tokens.get(host) if host else None
        if token is None or url.scheme not in ("https", "http") or not url.host:
            return None
        return token if _origin(url) in self._origins(host) else None

    def counted_as(self, url: URL) -> str:
        """The host an upstream request for `url` is counted under (metrics): the registry host the proxy
        acts for when it is private (so a private registry's origin, or the CDN it sends archives from, is
        never named, and its series can be shown only to clients that may read it), else `url`'s host."""
        host = acting_for.get()
        return host if host is not None and host in self.tokens else url.host or ""

    def _origins(self, host: str) -> set[tuple[str, int]]:
        parsed = Hostname.parse(host)
        origins = {(parsed.ascii, parsed.port or 443)}
        base = self.mapped.get(host)
        if base is not None and base.host:
            origins.add(_origin(base))
        return origins


def _origin(url: URL) -> tuple[str, int]:
    try:
        name = Hostname.parse(url.host or "").ascii
    except AddressError:
        name = (url.host or "").lower()
    return name, url.port or (443 if url.scheme == "https" else 80)


def merged(file_tokens: Mapping[str, str], env_tokens: Mapping[str, str]) -> dict[str, str]:
    """`TF_TOKEN_*` wins over the file's block for the same host, as in the CLIs."""
    return {**file_tokens, **env_tokens}
