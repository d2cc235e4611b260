"""Settings: one frozen object built at start-up from defaults < config file < environment < flags.

Every setting has a flag `--name` and an environment variable `REGISTRY_PROXY_NAME`
(dashes become underscores); repeatable flags take a comma-separated list in the
environment. Values are validated here, once; invalid values stop start-up.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yarl import URL

from proxy.addrs import AddressError, Hostname
from proxy.credentials import UpstreamCredentials
from proxy.forwarded import Network
from proxy.unsigned import UnsignedPolicy, UnsignedPolicyError, parse_unsigned_policy

ENV_PREFIX = "REGISTRY_PROXY_"
DEFAULT_ALLOWED_HOSTS = ("registry.opentofu.org", "registry.terraform.io")
DEFAULT_UPSTREAM = Hostname("registry.opentofu.org")

LOG_LEVELS = ("debug", "info", "warning", "error")
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


class ConfigError(ValueError):
    """A setting has an invalid value."""


def env_name(flag: str) -> str:
    """`--upstream-map` → `REGISTRY_PROXY_UPSTREAM_MAP`."""
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def parse_duration(text: str) -> float:
    """`90`, `90s`, `10m`, `1h`, `1d`, `500ms` → seconds."""
    match = _DURATION_RE.match(str(text))
    if not match:
        raise ConfigError(f"invalid duration {text!r}: use e.g. 30s, 10m, 1h")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


def parse_size(text: str) -> int:
    """`1048576`, `512MiB`, `2GiB`, `10MB` → bytes."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ConfigError(f"invalid size {text!r}: use e.g. 512MiB, 2GiB")
    unit = match.group(2).lower() if match.group(2) else None
    return int(match.group(1)) * _SIZE_UNITS[unit]


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:8443`) → (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"invalid --listen {text!r}: expected HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_upstream_map(entries: list[str]) -> dict[str, URL]:
    """`HOST=BASEURL` entries → {normalised host: base URL}."""
    mapping: dict[str, URL] = {}
    for entry in entries:
        host, sep, base = entry.partition("=")
        if not sep:
            raise ConfigError(f"invalid --upstream-map {entry!r}: expected HOST=BASEURL")
        url = URL(base.strip())
        if url.scheme not in ("http", "https") or not url.host:
            raise ConfigError(f"invalid --upstream-map {entry!r}: BASEURL must be an http(s) URL")
        mapping[str(_hostname(host.strip(), "--upstream-map"))] = url
    return mapping


def _hostname(text: str, flag: str = "") -> Hostname:
    not_a_url(text, flag)
    try:
        return Hostname.parse(text)
    except AddressError as exc:
        raise ConfigError(f"invalid {flag}: {exc}" if flag else str(exc)) from None


def not_a_url(text: str, flag: str) -> None:
    """Refuse a URL (`https://host/...`) where a hostname is expected, saying so."""
    if "://" in text or "/" in text:
        where = f"{flag} " if flag else ""
        raise ConfigError(f"invalid {where}{text.strip()!r}: give a hostname, not a URL (e.g. registry.example.com)")


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
    except (ConfigError, ValueError):
        raise ConfigError(
            f"invalid --min-free-space {text!r}: use a size (e.g. 1GiB, 0 for none) "
            "or a percentage of the disk (e.g. 5%)"
        ) from None


@dataclass(frozen=True)
class FreshnessTtls:
    """How long each kind of upstream metadata is served without asking the upstream again."""

    discovery: float = 3600.0
    versions: float = 600.0
    negative: float = 60.0
    # Per-version download metadata, SHA256SUMS and signatures are immutable: no TTL.


@dataclass(frozen=True)
class Limits:
    """Bounds on what the proxy accepts from upstreams."""

    max_archive_bytes: int = 4 * 2**30
    max_metadata_bytes: int = 8 * 2**20
    max_discovery_bytes: int = 1 * 2**20
    connect_timeout: float = 10.0
    read_timeout: float = 30.0  # a download that sends nothing this long is aborted
    metadata_timeout: float = 30.0  # one metadata fetch, its retry included
    max_redirects: int = 5
    upstream_concurrency: int = 16
    min_download_rate: int = 32 * 2**10  # bytes/s over download_rate_window (after as long again); 0: off
    download_rate_window: float = 30.0
    download_slot_wait: float = 30.0
    upstream_host_concurrency: int = 8

    def __post_init__(self) -> None:
        if self.min_download_rate < 0:
            raise ConfigError("--min-download-rate must not be negative (0 turns it off)")
        if self.download_rate_window <= 0:
            raise ConfigError("--download-rate-window must be positive")
        if self.read_timeout <= 0:
            raise ConfigError("--download-idle-timeout must be positive")
        if self.download_slot_wait <= 0:
            raise ConfigError("--download-slot-wait must be positive")
        if self.upstream_host_concurrency < 1:
            raise ConfigError("--upstream-host-concurrency must be a positive integer")


@dataclass(frozen=True)
class Settings:
    """Everything the proxy needs to run; built once by the CLI (or tests) and passed down."""

    data_dir: Path
    listen_host: str = "127.0.0.1"
    listen_port: int = 8443
    tls_cert: Path | None = None
    tls_key: Path | None = None
    plain_http: bool = False
    allowed_hosts: frozenset[str] = frozenset(DEFAULT_ALLOWED_HOSTS)
    upstream_map: dict[str, URL] = field(default_factory=dict)
    upstream_ca_file: Path | None = None
    allowed_private_hosts: frozenset[str] = frozenset()
    redis_url: str | None = None
    redis_password: str | None = None
    redis_prefix: str = "registry-proxy"
    redis_retention: float = 90 * 86400.0
    fleet_lock_ttl: float = 2.0
    default_upstream: Hostname = DEFAULT_UPSTREAM
    offline: bool = False
    module_passthrough: str = "allow"
    max_module_bytes: int = 512 * 2**20
    git_timeout: float = 120.0
    freshness: FreshnessTtls = FreshnessTtls()
    limits: Limits = Limits()
    log_format: str = "auto"
    log_level: str = "info"
    max_module_unpacked_bytes: int = 1 * 2**30
    max_module_entries: int = 100_000
    max_connections: int = 1024
    client_header_timeout: float = 10.0
    keepalive_timeout: float = 15.0
    send_timeout: float = 60.0
    stale_deadline: float = 2.0
    request_deadline: float = 8.0
    shutdown_grace: float = 15.0
    negative_cache_entries: int = 10_000
    negative_cache_bytes: int = 16 * 2**20
    metadata_secret: str | None = field(default=None, repr=False)  # never logged
    metadata_secret_file: Path | None = None
    min_free_space: SpaceFloor = SpaceFloor()
    workers: int = 1
    event_loop: str = "auto"
    access_log: str = "all"
    unsigned_providers: UnsignedPolicy = field(default_factory=UnsignedPolicy)
    public_url: str | None = None  # the URL clients reach the proxy at (the page at / shows it)
    # --- access control (client tokens) and upstream credentials ---
    auth_tokens: Path | None = None
    metrics_token_required: bool = False
    upstream_credentials: UpstreamCredentials = field(default_factory=UpstreamCredentials)
    # --- archive store (local directory, or S3-compatible object storage) ---
    archive_store: str = ""  # "": ARCHIVE_DIR; "s3://bucket/prefix"
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_path_style: bool = False
    s3_ca_file: Path | None = None
    s3_timeout: float = 20.0  # connect within half of it, each read within it; two attempts per request
    archive_redirect: bool = False
    archive_redirect_expiry: float = 300.0
    # --- archive store size cap and eviction ---
    max_store_size: int | None = None
    eviction_grace: float = 600.0
    eviction_interval: float = 300.0
    # --- operations ---
    trusted_proxies: frozenset[Network] = frozenset()

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key must be given together")
        if self.plain_http and self.tls_cert:
            raise ConfigError("--plain-http and --tls-cert exclude each other")
        if self.redis_url is not None and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"invalid --redis-url {self.redis_url!r}: use redis://, rediss:// or unix://")
        if self.fleet_lock_ttl < 1:
            raise ConfigError("--fleet-lock-ttl must be at least 1s")
        if self.module_passthrough not in ("allow", "deny"):
            raise ConfigError(f"invalid --module-passthrough {self.module_passthrough!r}: allow or deny")
        if self.max_module_unpacked_bytes < 1:
            raise ConfigError("--max-module-unpacked-size must be at least 1 byte")
        if self.max_module_entries < 1:
            raise ConfigError("--max-module-entries must be a positive integer")
        if self.log_format not in ("auto", "json", "console"):
            raise ConfigError(f"invalid --log-format {self.log_format!r}: auto, json or console")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"invalid --log-level {self.log_level!r}: {', '.join(LOG_LEVELS)}")
        if self.event_loop not in ("auto", "uvloop", "asyncio"):
            raise ConfigError(f"invalid --event-loop {self.event_loop!r}: auto, uvloop or asyncio")
        if self.access_log not in ("all", "errors", "off"):
            raise ConfigError(f"invalid --access-log {self.access_log!r}: all, errors or off")
        if self.max_connections < 1:
            raise ConfigError("--max-connections must be a positive integer")
        for flag, seconds in (
            ("--client-header-timeout", self.client_header_timeout),
            ("--keepalive-timeout", self.keepalive_timeout),
            ("--send-timeout", self.send_timeout),
        ):
            if seconds <= 0:
                raise ConfigError(f"{flag} must be more than 0s")
        if self.request_deadline <= 0:
            raise ConfigError("--request-deadline must be positive")
        if not 0 <= self.stale_deadline <= self.request_deadline:
            raise ConfigError("--stale-deadline must be between 0 and --request-deadline")
        if self.shutdown_grace < 0:
            raise ConfigError("--shutdown-grace must not be negative")
        if self.workers < 1:
            raise ConfigError("--workers must be a positive integer")
        if self.negative_cache_entries < 1:
            raise ConfigError("--negative-cache-entries must be a positive integer")
        if self.negative_cache_bytes < 1024:
            raise ConfigError("--negative-cache-bytes must be at least 1KiB")
        if self.metrics_token_required and self.auth_tokens is None:
            raise ConfigError("--metrics-token-required needs --auth-tokens (a token with metrics = true)")
        self._check_eviction()
        self._check_metadata_secret()
        self._check_public_url()
        self._check_archive_store()

    def _check_archive_store(self) -> None:
        location = self.s3_location  # raises ConfigError when malformed
        if location is None and (
            self.archive_redirect or self.s3_endpoint_url or self.s3_ca_file or self.s3_path_style or self.s3_region
        ):
            raise ConfigError("--archive-redirect and the --s3-* options need --archive-store s3://BUCKET/PREFIX")
        if self.s3_endpoint_url is not None and not self.s3_endpoint_url.startswith(("https://", "http://")):
            raise ConfigError(f"invalid --s3-endpoint-url {self.s3_endpoint_url!r}: an http(s):// URL")
        if not 0 < self.s3_timeout <= 3600:
            raise ConfigError("--s3-timeout must be more than 0s and at most 1h")
        if not 1 <= self.archive_redirect_expiry <= 7 * 86400:
            raise ConfigError("--archive-redirect-expiry must be between 1s and 7d")

    @property
    def s3_location(self) -> S3Location | None:
        """The bucket and key prefix of `--archive-store s3://…`; None for the local directory."""
        return parse_s3_location(self.archive_store) if self.archive_store else None

    def _check_eviction(self) -> None:
        if self.max_store_size is not None and self.max_store_size < 1:
            raise ConfigError("--max-store-size must be at least 1 byte")
        if self.eviction_grace < 0:
            raise ConfigError("--eviction-grace must not be negative")
        if self.eviction_interval <= 0:
            raise ConfigError("--eviction-interval must be positive")

    def _check_metadata_secret(self) -> None:
        if self.metadata_secret is not None and self.metadata_secret_file is not None:
            raise ConfigError("give either --metadata-secret or --metadata-secret-file, not both")
        if self.metadata_secret is not None and len(self.metadata_secret.strip().encode()) < 16:
            raise ConfigError("--metadata-secret must be at least 16 bytes (e.g. `openssl rand -hex 32`)")
        if self.redis_url and self.metadata_secret is None and self.metadata_secret_file is None:
            raise ConfigError(
                "--redis-url needs --metadata-secret or --metadata-secret-file (REGISTRY_PROXY_METADATA_SECRET): "
                "records in a shared Redis are sealed with this secret so that whoever can write to Redis cannot "
                "make the proxy serve other archives or hashes; give every replica the same secret "
                "(e.g. `openssl rand -hex 32`)"
            )

    def _check_public_url(self) -> None:
        if self.public_url is None:
            return
        try:
            url = URL(self.public_url)
        except ValueError:
            url = URL()
        if (
            url.scheme not in ("http", "https")
            or not url.host
            or url.user
            or url.password
            or url.query_string
            or url.fragment
        ):
            raise ConfigError(
                f"invalid --public-url {self.public_url!r}: give an http(s) URL such as "
                "https://proxy.example.com/, without credentials, query or fragment"
            )

    @property
    def all_allowed_hosts(self) -> frozenset[str]:
        """Registry hostnames clients may ask for: the allowlist plus every mapped host."""
        return self.allowed_hosts | frozenset(self.upstream_map)

    @property
    def private_host_exceptions(self) -> frozenset[str]:
        """`host` or `host:port` entries the SSRF guard lets through to private addresses."""
        mapped = {f"{url.host}:{url.port}" for url in self.upstream_map.values()}
        return self.allowed_private_hosts | frozenset(mapped)

    @property
    def sole_metadata_writer(self) -> bool:
        """No other process writes this proxy's metadata store (the embedded store, one worker), so an
        absence it saw stays true until it writes the key itself."""
        return self.redis_url is None and self.workers == 1

    @property
    def upstream_ca_bundle(self) -> Path:
        """System CAs plus `--upstream-ca-file`, for tools (git) that take a single bundle."""
        return self.data_dir / "tls" / "upstream-ca-bundle.pem"

    @property
    def cache_dir(self) -> Path:
        return self.data_dir / "metadata"

    @property
    def archive_dir(self) -> Path:
        return self.data_dir / "archives"

    @property
    def gnupg_home(self) -> Path:
        return self.data_dir / "gnupg"

    @property
    def tls_dir(self) -> Path:
        return self.data_dir / "tls"

    @property
    def lock_dir(self) -> Path:
        """Lock files by which the worker processes sharing this data dir fetch each artifact once."""
        return self.data_dir / "locks"


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
        raise ConfigError(f"invalid --archive-store {text!r}: s3://BUCKET/PREFIX (or leave it out for the data dir)")
    bucket, _, prefix = text[len("s3://") :].partition("/")
    if not _BUCKET.match(bucket):
        raise ConfigError(f"invalid bucket name {bucket!r} in --archive-store")
    prefix = prefix.strip("/")
    if not _PREFIX.match(prefix) or ".." in prefix or "//" in prefix:
        raise ConfigError(f"invalid key prefix {prefix!r} in --archive-store")
    return S3Location(bucket, prefix + "/" if prefix else "")


def normalise_hosts(hosts: list[str], flag: str = "--allow-host") -> frozenset[str]:
    """Normalise a list of registry hostnames as the clients would."""
    return frozenset(str(_hostname(host, flag)) for host in hosts if host.strip())


def normalise_private_hosts(hosts: list[str]) -> frozenset[str]:
    """`--allow-private-host` entries: a hostname or IP, optionally with `:port`, lower-cased."""
    result = set()
    for entry in hosts:
        not_a_url(entry, "--allow-private-host")
        entry = entry.strip().lower()
        if entry.startswith("["):  # [v6]:port or [v6]
            address, _, rest = entry[1:].partition("]")
            entry = f"{address}:{rest[1:]}" if rest.startswith(":") else address
        if entry:
            result.add(entry)
    return frozenset(result)


def parse_unsigned_providers(text: str) -> UnsignedPolicy:
    """`--unsigned-providers`: refuse, opentofu-default or allow-hosts=H,… (see proxy.unsigned)."""
    try:
        return parse_unsigned_policy(text)
    except UnsignedPolicyError as exc:
        raise ConfigError(str(exc)) from None


def archive_store_settings(args: Any) -> dict[str, Any]:
    """The Settings fields of the archive store flags (`--archive-store`, `--s3-*`) of parsed CLI arguments."""
    return {
        "archive_store": args.archive_store or "",
        "s3_endpoint_url": args.s3_endpoint_url or None,
        "s3_region": args.s3_region or None,
        "s3_path_style": bool(args.s3_path_style),
        "s3_ca_file": Path(args.s3_ca_file) if args.s3_ca_file else None,
        "s3_timeout": parse_duration(args.s3_timeout),
    }


def parse_networks(entries: list[str], flag: str) -> frozenset[Network]:
    """`10.0.0.0/8`, `192.0.2.7`, `fd00::/8` entries → networks (a bare address is a /32 or /128)."""
    networks = set()
    for entry in entries:
        try:
            networks.add(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ConfigError(
                f"invalid {flag} {entry.strip()!r}: give an IP address or CIDR, e.g. 10.0.0.0/8"
            ) from None
    return frozenset(networks)


def metadata_secret_settings(secret: str | None, secret_file: str | None) -> dict[str, str | Path | None]:
    """The `metadata_secret`/`metadata_secret_file` keywords of Settings from the flags' text (empty is unset)."""
    return {"metadata_secret": secret or None, "metadata_secret_file": Path(secret_file) if secret_file else None}
