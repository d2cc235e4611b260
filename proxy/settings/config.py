"""Settings: one frozen object built at start-up from defaults < config file < environment < flags,
grouped by area (`settings.server`, `.tls`, `.upstreams`, `.limits`, `.freshness`, `.modules`,
`.metadata`, `.archives`, `.logging`, `.access`).

This module is the table of options: each setting is declared once, on its field, with `option()`
(`proxy.settings.optionspec`): its flag, the kind of value with its bounds, its default and help. The command
line (`proxy.settings.command_line`), the `REGISTRY_PROXY_*` variables, the `--config` keys, the checks and the
reference in docs/configuration.md all come from these declarations.

What a user configures is checked against the declared bounds before a Settings is built (zero,
negative and below-minimum values stop start-up). Settings built in code (tests) are trusted with any
value; the areas' `__post_init__` check only what no single option can: how settings fit together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yarl import URL

from proxy.domain.addresses import Hostname
from proxy.domain.credentials import UpstreamCredentials
from proxy.domain.unsigned_policy import UnsignedPolicy, parse_unsigned_policy
from proxy.protocol.forwarded import Network
from proxy.settings.optionspec import (
    ENV_PREFIX,
    REQUIRED,
    USER_CACHE_DIR,
    Choice,
    Count,
    Duration,
    Each,
    LocalPath,
    Parsed,
    Size,
    Switch,
    Text,
    Workers,
    area,
    build,
    env_name,
    nest,
    option,
    options_of,
)
from proxy.settings.values import (
    ConfigError,
    Listen,
    RedisTarget,
    S3Location,
    SpaceFloor,
    nonblank,
    normalise_hosts,
    normalise_private_hosts,
    not_a_url,
    parse_archive_store,
    parse_base_url,
    parse_certificate_name,
    parse_duration,
    parse_hostname,
    parse_hostname_text,
    parse_http_url,
    parse_listen,
    parse_network,
    parse_networks,
    parse_private_host,
    parse_public_url,
    parse_redis_target,
    parse_redis_url,
    parse_registry_host,
    parse_s3_location,
    parse_size,
    parse_space_floor,
    parse_upstream_entry,
    parse_upstream_map,
)

__all__ = [  # the parsers and value types are imported from here by the rest of the code
    "ENV_PREFIX",
    "ConfigError",
    "Listen",
    "RedisTarget",
    "S3Location",
    "SpaceFloor",
    "build",
    "env_name",
    "normalise_hosts",
    "normalise_private_hosts",
    "not_a_url",
    "parse_duration",
    "parse_listen",
    "parse_networks",
    "parse_redis_target",
    "parse_s3_location",
    "parse_size",
    "parse_space_floor",
    "parse_upstream_map",
]

DEFAULT_ALLOWED_HOSTS = ("registry.opentofu.org", "registry.terraform.io")
DEFAULT_UPSTREAM = Hostname("registry.opentofu.org")
LOG_LEVELS = ("debug", "info", "warning", "error")
# The files of the generated CA and server certificate in the data dir's TLS folder (`Settings.tls_dir`)
CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY = "ca.pem", "ca-key.pem", "server.pem", "server-key.pem"

# Which commands take an option besides `serve` (they read the same variables and --config file).
STORE_COMMANDS = (
    "export",
    "import",
    "verify",
    "gc",
    "purge",
    "rotate-secret",
    "trust",
)  # open the data dir's stores as `serve` does
CLIENT_COMMANDS = ("lock", "warm")  # talk to a running proxy
SERVE_AND_STORE = ("serve", *STORE_COMMANDS)

# Kinds of values several options take.
FILE = LocalPath(lambda text: Path(text).expanduser(), "a file path")
CERTIFICATES = LocalPath(lambda text: Path(text).expanduser(), "a file of PEM certificates", "certificates")
DIRECTORY = LocalPath(lambda text: Path(text).expanduser(), "a directory path", "directory")
HOSTNAME = Parsed(parse_hostname, "a hostname (not a URL), optionally with :port")
SECONDS = Duration()  # at least 1s: a network operation or a cache's life shorter than that is a mistake
SIZE = Size()  # at least 1 byte
COUNT = Count()  # at least 1

_SERVED_TIMES = "replicas record when they served an archive once a minute, so a shorter grace can remove one in use"


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """Serving clients.

    Where the proxy listens, its worker processes and event loop, and the limits on client connections.
    """

    listen: Listen = option(
        "--listen",
        Parsed(parse_listen, "HOST:PORT (IPv6 as [::1]:8443; :PORT for every address)"),
        "address to listen on, HOST:PORT (healthcheck: the address it probes, a wildcard on loopback)",
        default="127.0.0.1:8443",
        metavar="HOST:PORT",
        commands=("serve", "healthcheck"),
    )
    workers: int = option(
        "--workers",
        Workers(),
        "worker processes serving the one listening socket, under a supervisor that restarts a crashed "
        "worker; 'auto': one per available CPU; 1 serves in this process",
        default="auto",
        metavar="N|auto",
        code_default=1,
    )
    event_loop: str = option(
        "--event-loop",
        Choice(("auto", "uvloop", "asyncio")),
        "auto (uvloop when installed), uvloop or asyncio",
        default="auto",
    )
    max_connections: int = option(
        "--max-connections",
        COUNT,
        "client connections open at once, per worker; beyond it a new connection gets a 503 and is closed "
        "(nginx: worker_connections)",
        default="1024",
    )
    client_header_timeout: float = option(
        "--client-header-timeout",
        SECONDS,
        "time from accepting a connection to a complete request head, TLS handshake included "
        "(nginx: client_header_timeout)",
        default="10s",
    )
    keepalive_timeout: float = option(
        "--keepalive-timeout",
        SECONDS,
        "how long an idle connection is kept open between requests (nginx: keepalive_timeout)",
        default="15s",
    )
    send_timeout: float = option(
        "--send-timeout",
        SECONDS,
        "longest wait for a client to take more of a response; a client that stops reading is dropped after "
        "it (nginx: send_timeout)",
        default="60s",
    )
    shutdown_grace: float = option(
        "--shutdown-grace",
        SECONDS,
        "on SIGTERM, let requests finish for at most this long, then cancel upstream fetches and exit",
        default="15s",
    )
    public_url: str | None = option(  # the URL clients reach the proxy at: every URL the proxy writes uses it
        "--public-url",
        Parsed(parse_public_url, "an http(s) URL without credentials, query or fragment"),
        "the URL clients reach this proxy at (e.g. https://proxy.example.com/ behind a load balancer, or "
        "https://lb.example.com/tf/ under a path the balancer strips); wins over the forwarding headers; default: "
        "the request's scheme and Host (from a trusted proxy, its forwarding headers)",
        metavar="URL",
    )
    trusted_proxies: frozenset[Network] = option(
        "--trusted-proxies",
        Each(parse_network, "an IP address or CIDR", frozenset),
        "reverse proxies (IP or CIDR) whose forwarding headers (--forwarded-headers) are believed: the client "
        "is the right-most address not in this list, its scheme and host the ones those proxies say; from any "
        "other peer the headers are ignored",
        metavar="CIDR",
    )
    forwarded_headers: str = option(
        "--forwarded-headers",
        Choice(("x-forwarded", "forwarded")),
        "which headers the --trusted-proxies set: x-forwarded (X-Forwarded-For, -Proto and -Host: nginx, "
        "ingress-nginx, Traefik, AWS ALB) or forwarded (RFC 7239 Forwarded: HAProxy's option forwarded); "
        "the other kind is ignored, since a proxy passes on unchanged what it does not set",
        default="x-forwarded",
    )

    @property
    def public_path(self) -> str:
        """The path clients reach the proxy under, ending in `/`: `--public-url`'s (a prefix the balancer
        strips), else `/`."""
        path = URL(self.public_url).raw_path if self.public_url else "/"
        return path.rstrip("/") + "/"

    @property
    def listen_host(self) -> str:
        return self.listen.host

    @property
    def listen_port(self) -> int:
        return self.listen.port


@dataclass(frozen=True, kw_only=True)
class TlsSettings:
    """TLS.

    The server's certificate, or the local CA generated in DATA_DIR/tls, or plain HTTP behind a load
    balancer that terminates TLS.
    """

    tls_cert: Path | None = option(
        "--tls-cert",
        FILE,
        "server certificate (PEM, may include the chain); with neither this nor --plain-http a local CA and "
        "certificate are generated in DATA_DIR/tls (healthcheck: trusted as it is)",
        metavar="FILE",
        commands=("serve", "healthcheck"),
    )
    tls_key: Path | None = option("--tls-key", FILE, "private key for --tls-cert (PEM)", metavar="FILE")
    tls_hostnames: frozenset[str] = option(
        "--tls-hostname",
        Each(parse_certificate_name, "a DNS name or IP address (not a URL)", nonblank),
        "extra name (DNS name or IP address) for the generated server certificate",
        metavar="NAME",
    )
    plain_http: bool = option(
        "--plain-http",
        Switch(),
        "serve plain HTTP (behind a TLS-terminating load balancer)",
        commands=("serve", "healthcheck"),
    )

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key must be given together")
        if self.plain_http and self.tls_cert:
            raise ConfigError("--plain-http and --tls-cert exclude each other")


@dataclass(frozen=True, kw_only=True)
class UpstreamSettings:
    """Upstream registries.

    Which registries clients may reach through the proxy, how the proxy reaches them, the credentials it
    sends them, and which providers it accepts without signing keys.
    """

    allowed_hosts: frozenset[str] = option(
        "--allow-host",
        Each(parse_registry_host, "a registry hostname", nonblank),
        "registry hostname clients may ask for",
        default=DEFAULT_ALLOWED_HOSTS,
        metavar="HOST",
    )
    upstream_map: dict[str, URL] = option(
        "--upstream-map",
        Each(parse_upstream_entry, "HOST=BASEURL", dict),
        "discover HOST at BASEURL/.well-known/terraform.json instead of https://HOST/ (internal registries, "
        "tests); a mapped host is allowed",
        metavar="HOST=BASEURL",
    )
    upstream_ca_file: Path | None = option(
        "--upstream-ca-file", CERTIFICATES, "extra CA bundle trusted for upstream TLS", metavar="FILE"
    )
    allowed_private_hosts: frozenset[str] = option(
        "--allow-private-host",
        Each(parse_private_host, "a host or host:port", nonblank),
        "upstream host (or host:port) that may resolve to a private or loopback address",
        metavar="HOST",
    )
    default_upstream: Hostname = option(
        "--default-upstream",
        HOSTNAME,
        "registry whose providers.v1 and modules.v1 the proxy's own /.well-known/terraform.json advertises",
        default="registry.opentofu.org",
        metavar="HOST",
    )
    offline: bool = option(
        "--offline",
        Switch(),
        "never contact an upstream: serve what is cached; a miss answers 404 (air-gapped networks; fill the "
        "cache with `import`)",
    )
    unsigned_providers: UnsignedPolicy = option(
        "--unsigned-providers",
        Parsed(parse_unsigned_policy, "refuse, opentofu-default or allow-hosts=HOST,…"),
        "providers whose registry lists no signing keys: 'opentofu-default' accepts them from "
        "registry.opentofu.org only (as tofu does), 'allow-hosts=H,…' from the hosts named, 'refuse' from none "
        "(also when cached); they are still checked against SHA256SUMS fetched over verified TLS and the "
        "registry's shasum",
        default="opentofu-default",
        metavar="refuse|opentofu-default|allow-hosts=H,…",
    )
    upstream_credentials_file: Path | None = option(
        "--upstream-credentials",
        FILE,
        'CLI configuration file whose `credentials "HOST" { token = ... }` blocks are sent to those upstream '
        "hosts (TF_TOKEN_<host> variables too); such hosts are private",
        metavar="FILE",
    )
    upstream_credentials: UpstreamCredentials = field(default_factory=UpstreamCredentials)  # the file and TF_TOKEN_*

    @property
    def all_allowed_hosts(self) -> frozenset[str]:
        """Registry hostnames clients may ask for: the allowlist plus every mapped host."""
        return self.allowed_hosts | frozenset(self.upstream_map)

    @property
    def private_host_exceptions(self) -> frozenset[str]:
        """`host` or `host:port` entries the SSRF guard lets through to private addresses."""
        mapped = {f"{url.host}:{url.port}" for url in self.upstream_map.values()}
        return self.allowed_private_hosts | frozenset(mapped)


@dataclass(frozen=True, kw_only=True)
class FreshnessTtls:
    """Freshness of upstream metadata.

    How long each kind of upstream metadata is served without asking the upstream again, and how many
    upstream 404s are remembered. Per-version download metadata, SHA256SUMS and signatures never change:
    they have no TTL.
    """

    discovery: float = option("--ttl-discovery", SECONDS, "how long a discovery document is fresh", default="1h")
    versions: float = option("--ttl-versions", SECONDS, "how long a version list is fresh", default="10m")
    negative: float = option("--ttl-negative", SECONDS, "how long an upstream 404 is remembered", default="1m")
    negative_cache_entries: int = option(
        "--negative-cache-entries",
        COUNT,
        "remembered upstream 404s (made-up names) kept at most, fleet-wide with Redis; the least recently "
        "written are dropped first",
        default="10000",
    )
    negative_cache_bytes: int = option(
        "--negative-cache-bytes",
        Size(minimum="1KiB"),
        "total size of remembered upstream 404s at most",
        default="16MiB",
    )


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Upstream limits and deadlines.

    Bounds on what the proxy accepts from upstreams, and on how long a client waits for them.
    """

    max_archive_bytes: int = option("--max-archive-size", SIZE, "largest provider archive accepted", default="4GiB")
    max_metadata_bytes: int = option(
        "--max-metadata-size", SIZE, "largest JSON/SHA256SUMS document accepted", default="8MiB"
    )
    max_discovery_bytes: int = 1 * 2**20
    read_timeout: float = option(  # a download that sends nothing this long is aborted
        "--download-idle-timeout", SECONDS, "abort a download that sends nothing for this long", default="30s"
    )
    metadata_timeout: float = option(  # one metadata fetch, its retry included
        "--upstream-timeout", SECONDS, "timeout for metadata requests (and connect/read of downloads)", default="30s"
    )
    max_redirects: int = 5
    upstream_concurrency: int = option(
        "--upstream-concurrency", COUNT, "upstream requests in flight at most, per worker", default="16"
    )
    min_download_rate: int = option(  # bytes/s over download_rate_window (after as long again); 0: off
        "--min-download-rate",
        Size(minimum="0"),
        "abort a download slower than this per second over --download-rate-window (checked after one window); "
        "0 turns it off",
        default="32KiB",
    )
    download_rate_window: float = option(
        "--download-rate-window", SECONDS, "window of the minimum download rate", default="30s"
    )
    download_slot_wait: float = option(
        "--download-slot-wait", SECONDS, "wait at most this long for a download slot, then answer 503", default="30s"
    )
    upstream_host_concurrency: int = option(
        "--upstream-host-concurrency",
        COUNT,
        "upstream requests in flight to one host at most (within --upstream-concurrency)",
        default="8",
    )
    stale_deadline: float = option(
        "--stale-deadline",
        Duration(minimum="0"),
        "with a stale cached copy, wait at most this long (from the request's start) for the refresh, then "
        "answer the stale copy while the refresh goes on (0: answer it at once; at most --request-deadline)",
        default="2s",
    )
    request_deadline: float = option(
        "--request-deadline",
        SECONDS,
        "wait at most this long for upstream metadata the cache lacks, then answer 504 (the fetch goes on; "
        "downloads themselves are bounded by the rate rules)",
        default="8s",
    )

    def __post_init__(self) -> None:
        if not 0 <= self.stale_deadline <= self.request_deadline:
            raise ConfigError("--stale-deadline must be between 0 and --request-deadline")

    @property
    def connect_timeout(self) -> float:
        """Connecting to an upstream: within the metadata timeout, at most 10 s."""
        return min(self.metadata_timeout, 10.0)


@dataclass(frozen=True, kw_only=True)
class ModuleSettings:
    """Modules.

    Module sources the proxy does not cache, and the bounds on module archives and git checkouts.
    """

    module_passthrough: str = option(
        "--module-passthrough",
        Choice(("allow", "deny")),
        "module sources the proxy does not cache (s3::, gcs::, hg::, git over ssh): 'allow' hands them to the "
        "client unchanged, 'deny' answers an error",
        default="allow",
    )
    max_module_bytes: int = option(
        "--max-module-size", SIZE, "largest module archive or git checkout accepted", default="512MiB"
    )
    max_module_unpacked_bytes: int = option(
        "--max-module-unpacked-size",
        SIZE,
        "largest total a module archive may unpack to (counted while it is checked, before it is stored)",
        default="1GiB",
    )
    max_module_entries: int = option(
        "--max-module-entries",
        COUNT,
        "most entries (files, directories, links) a module archive may hold",
        default="100000",
    )
    git_timeout: float = option("--git-timeout", SECONDS, "time limit for cloning a git module source", default="120s")


@dataclass(frozen=True, kw_only=True)
class MetadataSettings:
    """The metadata store.

    The embedded store in DATA_DIR/metadata, or Redis shared by a fleet of replicas, and the secret that
    seals every record in it.
    """

    redis_url: str | None = option(
        "--redis-url",
        Parsed(parse_redis_url, "a redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// URL"),
        "shared metadata store for several replicas: redis://[:PASSWORD@]HOST:PORT/DB; "
        "redis+sentinel://[:PASSWORD@]SENTINEL:PORT[,SENTINEL:PORT...]/SERVICE[/DB] for the master the sentinels "
        "name SERVICE; redis+cluster://[:PASSWORD@]NODE:PORT[,NODE:PORT...] for a Redis Cluster; rediss, "
        "rediss+sentinel, rediss+cluster for TLS; without it an embedded SQLite store in DATA_DIR is used",
        metavar="URL",
        commands=SERVE_AND_STORE,
    )
    redis_password: str | None = option(
        "--redis-password",
        Text(),
        "Redis password, if not in the URL (the servers', or the cluster nodes')",
        metavar="PASSWORD",
        commands=SERVE_AND_STORE,
        secret=True,
    )
    redis_sentinel_password: str | None = option(
        "--redis-sentinel-password",
        Text(),
        "the sentinels' own password (their requirepass), with a redis+sentinel:// URL",
        metavar="PASSWORD",
        commands=SERVE_AND_STORE,
        secret=True,
    )
    redis_ca_file: Path | None = option(
        "--redis-ca-file",
        CERTIFICATES,
        "CA bundle that Redis's TLS certificates (the servers', sentinels' and cluster nodes') are checked "
        "against, with a rediss URL; default: the system's",
        metavar="FILE",
        commands=SERVE_AND_STORE,
    )
    redis_prefix: str = option(
        "--redis-prefix", Text(), "namespace for every Redis key", default="registry-proxy", commands=SERVE_AND_STORE
    )
    redis_retention: float = option(
        "--redis-retention",
        Duration(minimum="1h", why="shorter, a fleet forgets what it verified faster than it refreshes it"),
        "TTL of Redis entries, renewed on every read and write (export and import: pass the fleet's value)",
        default="90d",
        commands=SERVE_AND_STORE,
    )
    fleet_lock_ttl: float = option(
        "--fleet-lock-ttl",
        SECONDS,
        "lease of the fleet-wide fetch lock (renewed every quarter of it while a fetch runs; a crashed "
        "replica's lock frees after this, and waiters take over)",
        default="2s",
    )
    metadata_secret: str | None = option(
        "--metadata-secret",
        Text(min_bytes=16, hint="e.g. `openssl rand -hex 32`"),
        "secret that seals every metadata record (HMAC), so a writer to the store cannot make the proxy serve "
        "other archives or hashes; required with --redis-url, the same on every replica (e.g. "
        "`openssl rand -hex 32`); without it the embedded store makes its own in DATA_DIR/metadata",
        metavar="SECRET",
        commands=SERVE_AND_STORE,
        secret=True,
    )
    metadata_secret_file: Path | None = option(
        "--metadata-secret-file",
        FILE,
        "read --metadata-secret from this file instead",
        metavar="FILE",
        commands=SERVE_AND_STORE,
    )
    metadata_secret_accepted: str | None = option(
        "--metadata-secret-accepted",
        Text(min_bytes=16, hint="the fleet's secret before or after a rotation"),
        "another secret whose seals are accepted when reading, never written with: the other half of a rotation "
        'of --metadata-secret (docs/operations.md, "Rotating the metadata secret")',
        metavar="SECRET",
        commands=SERVE_AND_STORE,
        secret=True,
    )
    metadata_secret_accepted_file: Path | None = option(
        "--metadata-secret-accepted-file",
        FILE,
        "read --metadata-secret-accepted from this file instead",
        metavar="FILE",
        commands=SERVE_AND_STORE,
    )

    def __post_init__(self) -> None:
        if self.metadata_secret is not None and self.metadata_secret_file is not None:
            raise ConfigError("give either --metadata-secret or --metadata-secret-file, not both")
        if self.metadata_secret_accepted is not None and self.metadata_secret_accepted_file is not None:
            raise ConfigError("give either --metadata-secret-accepted or --metadata-secret-accepted-file, not both")
        target = parse_redis_target(self.redis_url) if self.redis_url else None
        if self.redis_sentinel_password is not None and (target is None or target.kind != "sentinel"):
            raise ConfigError(
                "--redis-sentinel-password is for a redis+sentinel:// (or rediss+sentinel://) --redis-url"
            )
        if self.redis_ca_file is not None and (target is None or not target.tls):
            raise ConfigError(
                "--redis-ca-file is for Redis over TLS: a rediss, rediss+sentinel or rediss+cluster --redis-url"
            )
        if target is not None and target.cluster and self.redis_prefix.startswith("}"):
            raise ConfigError(
                "--redis-prefix must not start with '}' with a Redis Cluster: the remembered 404s are kept in one "
                "slot by the hash tag {PREFIX}, which it would leave empty"
            )
        if self.redis_url and self.metadata_secret is None and self.metadata_secret_file is None:
            raise ConfigError(
                "--redis-url needs --metadata-secret or --metadata-secret-file (REGISTRY_PROXY_METADATA_SECRET): "
                "records in a shared Redis are sealed with this secret so that whoever can write to Redis cannot "
                "make the proxy serve other archives or hashes; give every replica the same secret "
                "(e.g. `openssl rand -hex 32`)"
            )


@dataclass(frozen=True, kw_only=True)
class ArchiveSettings:
    """The archive store.

    Where verified archives are kept (DATA_DIR/archives or S3-compatible object storage), how they are
    handed out, the store's size cap with eviction, and the free space kept on the disk.
    """

    archive_store: str = option(  # "": ARCHIVE_DIR; "s3://bucket/prefix"
        "--archive-store",
        Parsed(parse_archive_store, "s3://BUCKET/PREFIX"),
        "s3://BUCKET/PREFIX to keep archives in S3-compatible object storage (credentials from the AWS "
        "environment/profile chain); default: DATA_DIR/archives",
        metavar="URL",
        commands=SERVE_AND_STORE,
        code_default="",
    )
    s3_endpoint_url: str | None = option(
        "--s3-endpoint-url",
        Parsed(parse_http_url, "an http(s):// URL"),
        "S3 API endpoint (MinIO, Ceph RGW, GCS); default: AWS",
        metavar="URL",
        commands=SERVE_AND_STORE,
    )
    s3_region: str | None = option(
        "--s3-region",
        Text(),
        "S3 region (default: from the AWS configuration)",
        metavar="REGION",
        commands=SERVE_AND_STORE,
    )
    s3_path_style: bool = option(
        "--s3-path-style",
        Switch(),
        "path-style addressing (https://ENDPOINT/BUCKET/KEY), for MinIO and most non-AWS endpoints",
        commands=SERVE_AND_STORE,
    )
    s3_ca_file: Path | None = option(
        "--s3-ca-file",
        CERTIFICATES,
        "extra CA bundle trusted for the S3 endpoint's TLS",
        metavar="FILE",
        commands=SERVE_AND_STORE,
    )
    s3_timeout: float = option(  # connect within half of it, each read within it; two attempts per request
        "--s3-timeout",
        Duration(maximum="1h"),
        "longest wait for the object store to answer a request or send more of a body (connecting gets half "
        "of it); a request is tried twice at most, then fails with 503, and a body that stalls is cut off",
        default="20s",
        commands=SERVE_AND_STORE,
    )
    archive_redirect: bool = option(
        "--archive-redirect",
        Switch(),
        "answer archive requests with a short-lived presigned URL of the S3 object (307) instead of streaming "
        "it; clients must reach the object store",
    )
    archive_redirect_expiry: float = option(
        "--archive-redirect-expiry",
        Duration(maximum="7d"),
        "how long a presigned archive URL is valid",
        default="5m",
    )
    max_store_size: int | None = option(
        "--max-store-size",
        SIZE,
        "largest total size of the archive store (e.g. 200GiB); beyond it (and below --min-free-space) the "
        "least recently served archives are removed, fetched again when asked for (default: no cap)",
        metavar="SIZE",
    )
    eviction_grace: float = option(
        "--eviction-grace",
        Duration(minimum="1m", why=_SERVED_TIMES),
        "never evict an archive served or stored within this long, by any replica",
        default="10m",
    )
    eviction_interval: float = option(
        "--eviction-interval",
        SECONDS,
        "check the store's size this often (also after every store that passes the cap)",
        default="5m",
    )
    min_free_space: SpaceFloor = option(
        "--min-free-space",
        Parsed(parse_space_floor, "a size, or a percentage of the disk below 100% (0: none)"),
        "free space to keep in DATA_DIR (a size, or a percentage of the disk such as 5%; 0: none): below it "
        "/readyz is 503 and uncached archives are relayed from the upstream, verified, without being stored",
        default="1GiB",
        metavar="SIZE|PERCENT",
    )

    def __post_init__(self) -> None:
        location = self.s3_location  # raises ConfigError when malformed
        if location is None and (
            self.archive_redirect or self.s3_endpoint_url or self.s3_ca_file or self.s3_path_style or self.s3_region
        ):
            raise ConfigError("--archive-redirect and the --s3-* options need --archive-store s3://BUCKET/PREFIX")

    @property
    def s3_location(self) -> S3Location | None:
        """The bucket and key prefix of `--archive-store s3://…`; None for the local directory."""
        return parse_s3_location(self.archive_store) if self.archive_store else None


@dataclass(frozen=True, kw_only=True)
class LogSettings:
    """Logging.

    The format and level of the log, and which requests get an access-log line.
    """

    log_format: str = option(
        "--log-format",
        Choice(("auto", "json", "console")),
        "auto (JSON unless on a terminal), json or console (in colour only on a terminal and without NO_COLOR)",
        default="auto",
    )
    log_level: str = option("--log-level", Choice(LOG_LEVELS), "debug, info, warning or error", default="info")
    access_log: str = option(
        "--access-log",
        Choice(("all", "errors", "off")),
        "one log line per request: all, errors (status 400 and above, and requests slower than 1 s) or off",
        default="all",
    )


@dataclass(frozen=True, kw_only=True)
class AccessSettings:
    """Access control.

    The client tokens a proxy requires (static tokens, OIDC workload tokens), and whether /metrics needs one.
    """

    auth_tokens: Path | None = option(
        "--auth-tokens",
        FILE,
        "client tokens file (TOML, hashed tokens with scopes; see `registry-proxy token new`): clients then "
        "need `Authorization: Bearer TOKEN`; reloaded on SIGHUP",
        metavar="FILE",
    )
    oidc_issuers: Path | None = option(
        "--oidc-issuers",
        FILE,
        "OIDC issuers file (TOML: each issuer's URL, audiences, algorithms, leeway, and rules mapping claims to "
        "scopes; see docs/oidc.md): CI jobs then sign in with their workload tokens (JWTs) as bearer tokens, "
        "beside the --auth-tokens; reloaded on SIGHUP",
        metavar="FILE",
    )
    oidc_keys_refresh: float = option(
        "--oidc-keys-refresh",
        Duration(minimum="1m", why="a stream of tokens naming made-up keys must not make the proxy hammer an issuer"),
        "fetch an OIDC issuer's keys again for a token naming a key not held at most this often, per process "
        "(and not while the keys in the store are younger)",
        default="1m",
    )
    metrics_token_required: bool = option(
        "--metrics-token-required", Switch(), "/metrics needs a token with metrics = true"
    )

    def __post_init__(self) -> None:
        if self.metrics_token_required and self.auth_tokens is None and self.oidc_issuers is None:
            raise ConfigError(
                "--metrics-token-required needs --auth-tokens (a token with metrics = true) or --oidc-issuers "
                "(a rule with metrics = true)"
            )

    @property
    def clients_required(self) -> bool:
        """Every request naming an upstream needs a client token (static or OIDC)."""
        return self.auth_tokens is not None or self.oidc_issuers is not None


@dataclass(frozen=True, kw_only=True)
class PolicySettings:
    """Policy and audit trail.

    Which providers, modules, versions and platforms may enter (docs/policy.md), and the stream of
    decisions that matter: what was fetched, served and denied, to whom.
    """

    policy_file: Path | None = option(
        "--policy",
        FILE,
        "policy file (TOML, see docs/policy.md): ordered rules that deny or hold back providers and modules by "
        "address, version, platform, age and client; reloaded on SIGHUP (a broken file keeps the old policy); "
        "`export` leaves out what it denies",
        metavar="FILE",
        commands=("serve", "export"),
    )
    audit_log: str | None = option(
        "--audit-log",
        LocalPath(str.strip, "a file path or stdout", "appendable"),
        "write the audit trail (JSON lines: fetched from upstream, served per client and hour, every denial) "
        "to FILE (appended) or to stdout; separate from the access log",
        metavar="FILE|stdout",
        commands=("serve", "trust"),
    )
    audit_required: bool = option(
        "--audit-required",
        Switch(),
        "refuse (503 audit_unavailable) every request that would produce an audit event while --audit-log cannot "
        "be written (a full disk): nothing is served unaudited; without it, serving goes on and the events that "
        "could not be written are dropped and counted",
    )

    def __post_init__(self) -> None:
        if self.audit_required and self.audit_log is None:
            raise ConfigError("--audit-required needs --audit-log")


@dataclass(frozen=True, kw_only=True, init=False)
class Settings:
    """Everything the proxy needs to run, by area; built once by the CLI (or tests) and passed down.

    Built with any setting by its own name, whichever its area (`Settings(data_dir=..., redis_url=...)`),
    or with a whole area by the area's name (`limits=Limits(...)`).
    """

    data_dir: Path = option(
        "--data-dir",
        DIRECTORY,
        "archives, metadata, keyring and generated TLS files",
        default=USER_CACHE_DIR,
        metavar="DIR",
        commands=(*SERVE_AND_STORE, "healthcheck"),
        code_default=REQUIRED,
    )
    server: ServerSettings = area(ServerSettings)
    tls: TlsSettings = area(TlsSettings)
    upstreams: UpstreamSettings = area(UpstreamSettings)
    limits: Limits = area(Limits)
    freshness: FreshnessTtls = area(FreshnessTtls)
    modules: ModuleSettings = area(ModuleSettings)
    metadata: MetadataSettings = area(MetadataSettings)
    archives: ArchiveSettings = area(ArchiveSettings)
    logging: LogSettings = area(LogSettings)
    access: AccessSettings = area(AccessSettings)
    policy: PolicySettings = area(PolicySettings)
    unsafe_short_timings: bool = option(
        "--unsafe-short-timings",
        Switch(),
        "FOR TESTS ONLY: every duration may be as short as 1ms, below its safe minimum (a loud warning is "
        "logged at start)",
        commands=(*SERVE_AND_STORE, "healthcheck"),
        hidden=True,
    )

    def __init__(self, **settings: Any) -> None:
        for name, value in nest(type(self), settings).items():
            object.__setattr__(self, name, value)

    @property
    def sole_metadata_writer(self) -> bool:
        """No other process writes this proxy's metadata store (the embedded store, one worker), so an
        absence it saw stays true until it writes the key itself."""
        return self.metadata.redis_url is None and self.server.workers == 1

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
        """The generated CA and server certificate: CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY."""
        return self.data_dir / "tls"

    @property
    def lock_dir(self) -> Path:
        """Lock files by which the worker processes sharing this data dir fetch each artifact once."""
        return self.data_dir / "locks"


@dataclass(frozen=True, kw_only=True)
class ClientOptions:
    """How `lock` and `warm` reach a running proxy (and which CA `healthcheck` trusts)."""

    proxy: str | None = option(
        "--proxy",
        Parsed(parse_base_url, "an http(s) base URL"),
        "base URL of the running proxy, e.g. https://127.0.0.1:8443/",
        metavar="URL",
        commands=CLIENT_COMMANDS,
    )
    ca_file: Path | None = option(
        "--ca-file",
        CERTIFICATES,
        "CA certificate to trust for the proxy (default: SSL_CERT_FILE or the system store; healthcheck: the "
        "generated CA in DATA_DIR/tls, else --tls-cert; doctor --url: the generated CA, unless serve's options "
        "name a --tls-cert or --plain-http)",
        metavar="FILE",
        commands=(*CLIENT_COMMANDS, "healthcheck", "doctor"),
    )
    default_registry: str = option(
        "--default-registry",
        Parsed(parse_hostname_text, "a hostname (not a URL)"),
        "registry host of provider and module sources without one",
        default="registry.terraform.io",
        metavar="HOST",
        commands=CLIENT_COMMANDS,
    )
    token: str | None = option(
        "--token",
        Text(),
        "client token for a proxy with --auth-tokens (needs lock = true for `lock`); prefer the environment "
        "variable, a flag shows in the process list",
        metavar="TOKEN",
        commands=CLIENT_COMMANDS,
        secret=True,
    )
    jobs: int = option("--jobs", COUNT, "downloads in parallel", default="4", commands=("warm",))


@dataclass(frozen=True, kw_only=True)
class CheckOptions:
    """How long `healthcheck` waits, and what `gc` keeps (flags only)."""

    timeout: float = option(
        "--timeout", SECONDS, "give up after this long", default="5s", commands=("healthcheck",), env=False
    )
    grace: float = option(
        "--grace",
        Duration(minimum="1m", why=_SERVED_TIMES),
        "keep unreferenced archives served or stored, uploads started and quarantined files moved, within this long",
        default="30m",
        commands=("gc",),
        env=False,
    )


OPTIONS = (*options_of(Settings), *options_of(ClientOptions), *options_of(CheckOptions))


def options_for(command: str) -> tuple[Any, ...]:
    """The options `command` takes, in the order they are declared."""
    return tuple(spec for spec in OPTIONS if command in spec.commands)


def declared(flag: str) -> Any:
    """The option declared with `flag` (an Option; StopIteration if none is: a renamed option fails loudly)."""
    return next(spec for spec in OPTIONS if spec.flag == flag)
