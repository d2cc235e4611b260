"""How configured values are written: durations, sizes, addresses, host lists, URLs, S3 locations.

Pure parsers: text in, a value out, or a `ConfigError` saying what is wrong with the text. The
message is the reason only (`not a duration: ...`); `proxy.settings.command_line` names the option and where its
value came from (a flag, a REGISTRY_PROXY_* variable or a `--config` key) in front of it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import unquote

from yarl import URL

from proxy.domain.addresses import AddressError, Hostname
from proxy.protocol.forwarded import Network


class ConfigError(ValueError):
    """A setting has an invalid value. `command`: the subcommand being configured, when known; `arguments`: its
    arguments as argparse parsed them (before the options were resolved), when known."""

    command: str | None = None
    arguments: object = None


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*\Z")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*(B|KB|KiB|MB|MiB|GB|GiB|TB|TiB)?\s*\Z", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "kib": 2**10,
    "mb": 10**6,
    "mib": 2**20,
    "gb": 10**9,
    "gib": 2**30,
    "tb": 10**12,
    "tib": 2**40,
    None: 1,
}


def parse_duration(text: str) -> float:
    """`90`, `90s`, `10m`, `1h`, `1d`, `500ms` → seconds."""
    match = _DURATION_RE.match(str(text))
    if not match:
        raise ConfigError("not a duration: use e.g. 500ms, 30s, 10m, 1h, 1d")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


def format_duration(seconds: float) -> str:
    """Seconds in the largest unit that shows them exactly: 60 → `1m`, 0.5 → `500ms`."""
    for unit in ("d", "h", "m", "s"):
        count = seconds / _DURATION_UNITS[unit]
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{seconds * 1000:g}ms"


def parse_size(text: str) -> int:
    """`1048576`, `512MiB`, `2GiB`, `10MB` → bytes."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ConfigError("not a size: use e.g. 512MiB, 2GiB, 10MB or a number of bytes")
    unit = match.group(2).lower() if match.group(2) else None
    return int(match.group(1)) * _SIZE_UNITS[unit]


def format_size(size: int) -> str:
    """Bytes in the largest binary unit that shows them exactly: 1024 → `1KiB`."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if size >= _SIZE_UNITS[unit.lower()] and size % _SIZE_UNITS[unit.lower()] == 0:
            return f"{size // _SIZE_UNITS[unit.lower()]}{unit}"
    return f"{size}B"


def human_size(size: int | float) -> str:
    """Bytes in binary units, rounded for reading, e.g. `1.5 MiB`."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - the loop returns


def parse_count(text: str) -> int:
    """A whole number written in decimal digits: `16`, ` 7 `."""
    value = str(text).strip()
    if not value.isdigit():
        raise ConfigError("not a whole number")
    return int(value)


class Listen(NamedTuple):
    """Where the server listens: a host (empty for every address) and a port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str) -> Listen:
    """`HOST:PORT` (IPv6 as `[::1]:8443`, every address as `:8443`)."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError("expected HOST:PORT with a port from 1 to 65535")
    return Listen(host.strip("[]") or "0.0.0.0", int(port))


def not_a_url(text: str) -> None:
    """Refuse a URL (`https://host/...`) where a hostname is expected, saying so."""
    if "://" in text or "/" in text:
        raise ConfigError("give a hostname, not a URL (e.g. registry.example.com)")


def parse_hostname(text: str) -> Hostname:
    """A registry hostname (optionally `:port`), normalised as the clients normalise it."""
    not_a_url(text)
    try:
        return Hostname.parse(text.strip())
    except AddressError as exc:
        raise ConfigError(str(exc)) from None


def parse_hostname_text(text: str) -> str:
    """A hostname checked like `parse_hostname`, kept as written."""
    parse_hostname(text)
    return text.strip()


def parse_private_host(text: str) -> str:
    """A host or IP, optionally with `:port`, lower-cased (`[v6]:port` becomes `v6:port`)."""
    not_a_url(text)
    entry = text.strip().lower()
    if entry.startswith("["):  # [v6]:port or [v6]
        address, _, rest = entry[1:].partition("]")
        entry = f"{address}:{rest[1:]}" if rest.startswith(":") else address
    return entry


def parse_certificate_name(text: str) -> str:
    """A name for the generated server certificate: a DNS name (`*.` allowed in front), normalised as a
    certificate holds it (IDNA, lower case), or an IP address; never a URL, a path or a port."""
    name = text.strip()
    example = "e.g. --tls-hostname proxy.example.com (the host clients connect to; no scheme, path or port)"
    if "://" in name or "/" in name:
        raise ConfigError(f"give a name, not a URL: {example}")
    try:
        return str(ipaddress.ip_address(name.removeprefix("[").removesuffix("]")))
    except ValueError:
        pass
    if ":" in name:
        raise ConfigError(f"a certificate names no port: {example}")
    wildcard = name.startswith("*.")
    try:
        return ("*." if wildcard else "") + Hostname.parse(name.removeprefix("*.")).ascii
    except AddressError as exc:
        raise ConfigError(str(exc)) from None


def parse_registry_host(text: str) -> str:
    """A registry hostname normalised (`parse_hostname`); blank stays blank (an entry to skip)."""
    return str(parse_hostname(text)) if text.strip() else ""


def nonblank(entries: Iterable[str]) -> frozenset[str]:
    """The entries that are not blank."""
    return frozenset(entry for entry in entries if entry)


def normalise_hosts(hosts: list[str]) -> frozenset[str]:
    """Normalise a list of registry hostnames as the clients would (blank entries are skipped)."""
    return nonblank(map(parse_registry_host, hosts))


def normalise_private_hosts(hosts: list[str]) -> frozenset[str]:
    """`--allow-private-host` entries: a hostname or IP, optionally with `:port`, lower-cased."""
    return nonblank(map(parse_private_host, hosts))


def parse_upstream_entry(entry: str) -> tuple[str, URL]:
    """`HOST=BASEURL` → (normalised host, base URL)."""
    host, sep, base = entry.partition("=")
    if not sep:
        raise ConfigError("expected HOST=BASEURL")
    url = URL(base.strip())
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigError("BASEURL must be an http(s) URL")
    return str(parse_hostname(host.strip())), url


def parse_upstream_map(entries: list[str]) -> dict[str, URL]:
    """`HOST=BASEURL` entries → {normalised host: base URL}."""
    return dict(map(parse_upstream_entry, entries))


def parse_network(entry: str) -> Network:
    """`10.0.0.0/8`, `192.0.2.7`, `fd00::/8` → a network (a bare address is a /32 or /128)."""
    try:
        return ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        raise ConfigError("give an IP address or CIDR, e.g. 10.0.0.0/8") from None


def parse_networks(entries: list[str]) -> frozenset[Network]:
    """Several `parse_network` entries."""
    return frozenset(map(parse_network, entries))


@dataclass(frozen=True)
class SpaceFloor:
    """Free space to keep on the data directory's filesystem: bytes, or a percentage of its size."""

    bytes: int = 2**30
    percent: float | None = None

    def __post_init__(self) -> None:
        if self.bytes < 0 or (self.percent is not None and not 0 <= self.percent < 100):
            raise ConfigError(f"invalid --min-free-space {self}: a size of 0 or more, or a percentage below 100%")

    def of(self, total: int) -> int:
        """The floor in bytes on a filesystem of `total` bytes."""
        return self.bytes if self.percent is None else int(total * self.percent / 100)

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else f"{self.bytes} bytes"


def parse_space_floor(text: str) -> SpaceFloor:
    """`1GiB`, `500MB`, `0` (no floor) or `5%` (of the filesystem's size)."""
    value = str(text).strip()
    try:
        if value.endswith("%"):
            percent = float(value[:-1])
            if percent != percent:  # NaN
                raise ValueError(value)
            return SpaceFloor(0, percent)
        return SpaceFloor(parse_size(value))
    except ValueError:
        raise ConfigError(
            "use a size (e.g. 1GiB, 0 for none) or a percentage of the disk below 100% (e.g. 5%)"
        ) from None


@dataclass(frozen=True)
class S3Location:
    """`s3://BUCKET/PREFIX`: objects are stored at `PREFIX + sha256` (PREFIX is empty or ends in "/")."""

    bucket: str
    prefix: str

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]\Z")
_PREFIX = re.compile(r"^[A-Za-z0-9!_.*'()/\-]*\Z")


def parse_s3_location(text: str) -> S3Location:
    """Parse `s3://bucket[/prefix]` (bucket rules of S3; prefix of safe key characters, no `..`)."""
    if not text.startswith("s3://"):
        raise ConfigError("use s3://BUCKET/PREFIX (or leave it out for the data dir)")
    bucket, _, prefix = text[len("s3://") :].partition("/")
    if not _BUCKET.match(bucket):
        raise ConfigError(f"invalid bucket name {bucket!r}")
    prefix = prefix.strip("/")
    if not _PREFIX.match(prefix) or ".." in prefix or "//" in prefix:
        raise ConfigError(f"invalid key prefix {prefix!r}")
    return S3Location(bucket, prefix + "/" if prefix else "")


def parse_archive_store(text: str) -> str:
    """`--archive-store`: an S3 location (`parse_s3_location`), kept as written."""
    parse_s3_location(text)
    return text


REDIS_SCHEMES = (
    "redis://",
    "rediss://",
    "unix://",
    "redis+sentinel://",
    "rediss+sentinel://",
    "redis+cluster://",
    "rediss+cluster://",
)
SENTINEL_PORT, REDIS_PORT = 26379, 6379


@dataclass(frozen=True)
class RedisTarget:
    """Where the shared metadata store is (`--redis-url`): how Redis is run and how to reach it.

    `kind` "server": one Redis, `url` as redis-py reads it (`redis://`, `rediss://`, `unix://`);
    "sentinel": the master the sentinels at `nodes` name `service` (`redis+sentinel://`); "cluster": a
    Redis Cluster, found from any of `nodes` (`redis+cluster://`). `tls` for the `rediss` forms; `username`
    and `password` are the data servers' (a sentinel's own password is an option of its own)."""

    kind: str
    url: str = field(repr=False)  # may hold a password
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    tls: bool = False
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    @property
    def cluster(self) -> bool:
        return self.kind == "cluster"


def parse_redis_target(text: str) -> RedisTarget:
    """Read a Redis URL: `redis://`, `rediss://` or `unix://` (one server); `redis+sentinel://` or
    `rediss+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB]` (sentinels, port 26379 by
    default); `redis+cluster://` or `rediss+cluster://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]` (nodes
    of a Cluster, port 6379 by default)."""
    scheme, found, rest = text.partition("://")
    if not found or f"{scheme}://" not in REDIS_SCHEMES:
        raise ConfigError("use " + ", ".join(REDIS_SCHEMES[:-1]) + " or " + REDIS_SCHEMES[-1])
    tls = scheme.startswith("rediss")
    if "+" not in scheme:
        return RedisTarget("server", text, tls=tls)
    kind = scheme.partition("+")[2]
    if "?" in rest or "#" in rest:
        raise ConfigError(f"a {scheme}:// URL takes no query or fragment: give the options as options")
    location, _, path = rest.partition("/")
    userinfo, at, hosts = location.rpartition("@")
    user, colon, secret = userinfo.partition(":")
    nodes = tuple(_redis_node(node, SENTINEL_PORT if kind == "sentinel" else REDIS_PORT) for node in hosts.split(","))
    parts = path.split("/") if path else []
    if kind == "sentinel":
        if not parts or not parts[0] or len(parts) > 2:
            raise ConfigError(f"name the master: {scheme}://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]")
        service, db = parts[0], _redis_db(parts[1] if len(parts) > 1 else "0")
    else:
        if parts not in ([], ["0"]):
            raise ConfigError(f"a Redis Cluster has one database, 0: {scheme}://HOST:PORT[,HOST:PORT...]")
        service, db = "", 0
    return RedisTarget(
        kind,
        text,
        nodes,
        unquote(service),
        db,
        tls,
        unquote(user) if at and user else None,
        unquote(secret) if at and colon else None,
    )


def _redis_node(text: str, default_port: int) -> tuple[str, int]:
    """`HOST`, `HOST:PORT`, `[IPV6]` or `[IPV6]:PORT` → (host, port)."""
    if text.startswith("["):
        host, closed, after = text[1:].partition("]")
        port = after.removeprefix(":") if closed and after[:1] in ("", ":") else "?"
    else:
        host, _, port = text.partition(":")
    if not host or any(character in host for character in "[]/@ ") or (port and not port.isdigit()):
        raise ConfigError(f"{text!r} is not HOST:PORT")
    number = int(port) if port else default_port
    if not 0 < number < 65536:
        raise ConfigError(f"{text!r}: no such port")
    return host, number


def _redis_db(text: str) -> int:
    if not text.isdigit():
        raise ConfigError(f"{text!r} is not a database number")
    return int(text)


def parse_redis_url(text: str) -> str:
    """`--redis-url`: a Redis URL (`parse_redis_target`), kept as written."""
    parse_redis_target(text)
    return text


def shown_redis_url(text: str) -> str:
    """A Redis URL as it may be shown (a message, a log): without its user, password and query (which may hold
    a password); the scheme, hosts, ports and path kept."""
    scheme, separator, rest = text.partition("://")
    if not separator:
        return text
    return f"{scheme}://{rest.partition('?')[0].rpartition('@')[2]}"  # hosts and paths hold no @; a password may


def parse_http_url(text: str) -> str:
    """An `http://` or `https://` URL."""
    url = _url(text)
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigError("give an http(s):// URL")
    return text


def parse_base_url(text: str) -> str:
    """A running proxy's base URL (`--proxy`): http(s), a host, no query or fragment."""
    url = _url(text.strip())
    if url.scheme not in ("http", "https") or not url.host or url.query_string or url.fragment:
        raise ConfigError("give the proxy's base URL, e.g. https://proxy.example:8443/")
    return text


def parse_public_url(text: str) -> str:
    """The URL clients reach the proxy at: http(s), a host, no credentials, query or fragment."""
    url = _url(text)
    if (
        url.scheme not in ("http", "https")
        or not url.host
        or url.user
        or url.password
        or url.query_string
        or url.fragment
    ):
        raise ConfigError(
            "give an http(s) URL such as https://proxy.example.com/, without credentials, query or fragment"
        )
    return text


def _url(text: str) -> URL:
    try:
        return URL(text)
    except ValueError:
        return URL()
