"""The page for humans at `/`: what this proxy is, how to configure a client for it, what it holds.

Rendering on the server from `templates/index.html` with Jinja2, autoescaping everything (names,
versions and module sources come from upstream registries: attacker-controlled). The CLI
configuration is built here for the URL clients reach the proxy at: `--public-url` when set,
else the scheme and host the client used (`proxy.protocol.forwarded`; the host accepted only when it is a
plain host[:port]).
No I/O but reading the template once.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from markupsafe import Markup, escape

from proxy.governance.inventory import CachedModule, CachedProvider, HostHealth, Inventory
from proxy.protocol.forwarded import plain_host
from proxy.protocol.proxy_urls import registry_base
from proxy.runtime.metrics import Totals
from proxy.settings.values import human_size

if TYPE_CHECKING:
    from jinja2 import Environment

CLIENTS = (("Terraform", "~/.terraformrc"), ("OpenTofu", "~/.tofurc"))


def base_url(public_url: str | None, scheme: str, host: str | None, fallback: str) -> str:
    """The proxy's URL as clients reach it, ending in `/`: the configured public URL, else the scheme and
    host the client used; `fallback` (the listen address) when the host is not a plain host[:port]."""
    if public_url:
        return public_url.rstrip("/") + "/"
    return f"{'https' if scheme == 'https' else 'http'}://{plain_host(host) or fallback}/"


def listen_address(host: str, port: int) -> str:
    """host:port for a listen address, with a wildcard address shown as the loopback one."""
    shown = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}.get(host, host)
    return f"[{shown}]:{port}" if ":" in shown and not shown.startswith("[") else f"{shown}:{port}"


@dataclass(frozen=True)
class Snippet:
    """One copy-paste CLI configuration."""

    id: str
    client: str
    file: str
    text: str


def mirror_config(base: str) -> str:
    """The `provider_installation` block naming this proxy as the network mirror."""
    return f'provider_installation {{\n  network_mirror {{\n    url = "{base}mirror/v1/"\n  }}\n}}\n'


def host_config(base: str, hosts: list[str]) -> str:
    """`host` blocks sending each registry host's providers.v1 and modules.v1 through this proxy."""
    root = base.rstrip("/")
    blocks = []
    for host in hosts:
        blocks.append(
            f'host "{host}" {{\n'
            "  services = {\n"
            f'    "providers.v1" = "{root}{registry_base(host, "providers")}"\n'
            f'    "modules.v1"   = "{root}{registry_base(host, "modules")}"\n'
            "  }\n"
            "}\n"
        )
    return "\n".join(blocks)


def snippets(base: str, hosts: list[str]) -> dict[str, list[Snippet]]:
    """The network mirror and host-block configurations, for each client and its config file."""
    made: dict[str, list[Snippet]] = {"mirror": [], "hosts": []}
    for client, path in CLIENTS:
        header = f"# {path}\n"
        made["mirror"].append(Snippet(f"mirror-{client.lower()}", client, path, header + mirror_config(base)))
        first = "registry.opentofu.org" if client == "OpenTofu" else "registry.terraform.io"
        ordered = sorted(hosts, key=lambda h, first=first: (h != first, h))
        made["hosts"].append(Snippet(f"hosts-{client.lower()}", client, path, header + host_config(base, ordered)))
    return made


@dataclass
class ProviderRelease:
    """The cached platforms of one provider version, as one row of the page."""

    address: str
    version: str
    archives: list[CachedProvider] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(a.size for a in self.archives)

    @property
    def signers(self) -> list[str]:
        return sorted({a.signed_by for a in self.archives if a.signed_by})

    @property
    def last_served(self) -> float | None:
        return max((a.last_served for a in self.archives if a.last_served is not None), default=None)

    @property
    def search_text(self) -> str:
        return " ".join([self.address, f"{self.address}/{self.version}", *(a.platform for a in self.archives)]).lower()


def releases(providers: list[CachedProvider]) -> list[ProviderRelease]:
    """Provider archives grouped by provider version (in address, then version order)."""
    grouped: dict[tuple[str, str], ProviderRelease] = {}
    for archive in providers:
        key = (archive.address, archive.version)
        grouped.setdefault(key, ProviderRelease(*key)).archives.append(archive)
    return [grouped[key] for key in sorted(grouped, key=lambda k: (k[0], _version_key(k[1])))]


def _version_key(version: str) -> tuple:
    core, _, pre = version.partition("-")
    numbers = tuple(int(p) if p.isdigit() else 0 for p in core.split("."))
    return (numbers, pre == "", pre)


def module_search_text(module: CachedModule) -> str:
    return f"{module.address} {module.address}/{module.version}".lower()


@dataclass(frozen=True)
class PageData:
    """Everything the page shows; gathered by the handler, rendered here."""

    version: str
    base: str
    ca_url: str | None
    hosts: list[HostHealth]
    inventory: Inventory
    query: str
    totals: Totals
    offline: bool
    metadata_problem: str | None
    nonce: str
    now: float
    policy: PolicyView | None = None
    key_events: list[Any] = field(default_factory=list)  # proxy.governance.signing_keys.KeyEvent, newest first


@dataclass(frozen=True)
class PolicyView:
    """The policy in force for the page: its mode, each rule with what it blocked, and the recent denials
    (of this server process; the audit trail has them all)."""

    mode: str
    rules: list[tuple[str, str, int]]  # name, action, blocked since start
    denials: list[Any]  # proxy.governance.audit.Denial, newest first


def when(timestamp: float | None) -> str:
    """A UTC time for humans, or an em dash."""
    if timestamp is None:
        return "—"
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def ago(timestamp: float | None, now: float) -> str:
    """How long ago, roughly (`5 min ago`)."""
    if timestamp is None:
        return ""
    seconds = max(0, int(now - timestamp))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def breakable(text: str) -> Markup:
    """`text` escaped, with a line-break opportunity after each slash (for long addresses and URLs)."""
    return Markup(str(escape(text)).replace("/", "/<wbr>"))


def number(value: int) -> str:
    return f"{value:,}".replace(",", "\u202f")


@functools.cache
def _environment() -> Environment:
    """The template environment, made when the page is first rendered (jinja2 is not imported at start-up)."""
    from jinja2 import Environment, PackageLoader, StrictUndefined

    environment = Environment(
        loader=PackageLoader("proxy", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    environment.filters.update(size=human_size, when=when, number=number, breakable=breakable)
    return environment


def render(data: PageData) -> str:
    """The whole HTML page."""
    hosts = sorted(h.host for h in data.hosts if "allowed" in h.roles or "mapped" in h.roles)
    template = _environment().get_template("index.html")
    return template.render(
        page=data,
        snippets=snippets(data.base, hosts),
        releases=releases(data.inventory.providers),
        module_search_text=module_search_text,
        ago=lambda t: ago(t, data.now),
        module_host=module_host(data.base),
    )


def module_host(base: str) -> str | None:
    """The host[:port] to write into module sources for the proxy as module host (None: the proxy is not at
    the root of its URL, where clients look for its discovery document)."""
    authority, _, path = base.split("://", 1)[1].partition("/")
    return authority if not path else None
