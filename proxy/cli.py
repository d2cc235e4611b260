"""Command-line interface: `registry-proxy serve|lock|warm|export|import|verify|gc|healthcheck|token`
(also `python -m proxy`).

Every `serve` flag, and the connection and data-dir options of the other commands, has an
environment variable `REGISTRY_PROXY_<NAME>` and a key in the optional `--config` TOML file
(`proxy.options`); flags win over the environment, which wins over the file, which wins over
the defaults. Repeatable flags take a comma-separated list in the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import ssl
import sys
from pathlib import Path

import platformdirs
import structlog

from proxy import __version__
from proxy.addrs import AddressError, Hostname
from proxy.config import (
    DEFAULT_ALLOWED_HOSTS,
    ConfigError,
    FreshnessTtls,
    Limits,
    Settings,
    archive_store_settings,
    metadata_secret_settings,
    normalise_hosts,
    normalise_private_hosts,
    not_a_url,
    parse_duration,
    parse_listen,
    parse_networks,
    parse_size,
    parse_space_floor,
    parse_unsigned_providers,
    parse_upstream_map,
)
from proxy.options import OptionParser, config_option, dest, option

log = structlog.get_logger("proxy.cli")


def _option(
    parser: argparse.ArgumentParser,
    flag: str,
    help_text: str,
    *,
    default=None,
    repeat: bool = False,
    switch: bool = False,
    metavar: str | None = None,
) -> None:
    option(parser, flag, help_text, default=default, repeat=repeat, switch=switch, metavar=metavar)


def _repeated(args: argparse.Namespace, flag: str) -> list[str]:
    return list(getattr(args, dest(flag)))


def build_parser() -> argparse.ArgumentParser:
    parser = OptionParser(
        prog="registry-proxy", description="Caching, verifying pull-through proxy for OpenTofu and Terraform providers."
    )
    parser.add_argument("--version", action="version", version=f"registry-proxy {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the proxy",
        description="Serve the provider network mirror protocol at https://HOST:PORT/mirror/v1/.",
    )
    default_data = platformdirs.user_cache_dir("registry-proxy")
    config_option(serve)
    _option(serve, "--listen", "address to listen on, HOST:PORT", default="127.0.0.1:8443", metavar="HOST:PORT")
    _option(
        serve, "--data-dir", "archives, metadata, keyring and generated TLS files", default=default_data, metavar="DIR"
    )
    _option(
        serve,
        "--tls-cert",
        "server certificate (PEM, may include the chain); with neither this nor "
        "--plain-http a local CA and certificate are generated in DATA_DIR/tls",
        metavar="FILE",
    )
    _option(serve, "--tls-key", "private key for --tls-cert (PEM)", metavar="FILE")
    _option(serve, "--tls-hostname", "extra name for the generated server certificate", repeat=True, metavar="NAME")
    _option(serve, "--plain-http", "serve plain HTTP (behind a TLS-terminating load balancer)", switch=True)
    _option(
        serve,
        "--allow-host",
        "registry hostname clients may ask for",
        repeat=True,
        default=list(DEFAULT_ALLOWED_HOSTS),
        metavar="HOST",
    )
    _option(
        serve,
        "--upstream-map",
        "discover HOST at BASEURL/.well-known/terraform.json instead of "
        "https://HOST/ (internal registries, tests); a mapped host is allowed",
        repeat=True,
        metavar="HOST=BASEURL",
    )
    _option(serve, "--upstream-ca-file", "extra CA bundle trusted for upstream TLS", metavar="FILE")
    _option(
        serve,
        "--allow-private-host",
        "upstream host (or host:port) that may resolve to a private or loopback address",
        repeat=True,
        metavar="HOST",
    )
    _option(
        serve,
        "--redis-url",
        "shared metadata store for several replicas: redis://[:PASSWORD@]HOST:PORT/DB "
        "or rediss:// (TLS); without it an embedded SQLite store in DATA_DIR is used",
        metavar="URL",
    )
    _option(serve, "--redis-password", "Redis password, if not in the URL", metavar="PASSWORD")
    _option(serve, "--redis-prefix", "namespace for every Redis key", default="registry-proxy")
    _option(serve, "--redis-retention", "TTL of Redis entries, renewed on every read and write", default="90d")
    _option(
        serve,
        "--fleet-lock-ttl",
        "expiry of the fleet-wide fetch lock (renewed while a download runs; "
        "a crashed replica's lock frees after this)",
        default="15s",
    )
    _option(
        serve,
        "--default-upstream",
        "registry whose providers.v1 and modules.v1 the proxy's own /.well-known/terraform.json advertises",
        default="registry.opentofu.org",
        metavar="HOST",
    )
    _option(
        serve,
        "--module-passthrough",
        "module sources the proxy does not cache (s3::, gcs::, hg::, git over "
        "ssh): 'allow' hands them to the client unchanged, 'deny' answers an error",
        default="allow",
    )
    _option(serve, "--max-module-size", "largest module archive or git checkout accepted", default="512MiB")
    _option(serve, "--git-timeout", "time limit for cloning a git module source", default="120s")
    _option(serve, "--ttl-discovery", "how long a discovery document is fresh", default="1h")
    _option(serve, "--ttl-versions", "how long a version list is fresh", default="10m")
    _option(serve, "--ttl-negative", "how long an upstream 404 is remembered", default="1m")
    _option(serve, "--max-archive-size", "largest provider archive accepted", default="4GiB")
    _option(serve, "--max-metadata-size", "largest JSON/SHA256SUMS document accepted", default="8MiB")
    _option(serve, "--upstream-timeout", "timeout for metadata requests (and connect/read of downloads)", default="30s")
    _option(serve, "--upstream-concurrency", "upstream requests in flight at most, per worker", default="16")
    _option(
        serve,
        "--offline",
        "never contact an upstream: serve what is cached; a miss answers 404 "
        "(air-gapped networks; fill the cache with `import`)",
        switch=True,
    )
    # --- module archive bombs ---
    _option(
        serve,
        "--max-module-unpacked-size",
        "largest total a module archive may unpack to (counted while it is checked, before it is stored)",
        default="1GiB",
    )
    _option(
        serve,
        "--max-module-entries",
        "most entries (files, directories, links) a module archive may hold",
        default="100000",
    )
    # --- server limits ---
    _option(
        serve,
        "--workers",
        "worker processes serving the one listening socket, under a supervisor that "
        "restarts a crashed worker; 'auto': one per available CPU; 1 serves in this process",
        default="auto",
        metavar="N|auto",
    )
    _option(
        serve,
        "--max-connections",
        "client connections open at once, per worker; beyond it a new connection "
        "gets a 503 and is closed (nginx: worker_connections)",
        default="1024",
    )
    _option(
        serve,
        "--client-header-timeout",
        "time from accepting a connection to a complete request head, "
        "TLS handshake included (nginx: client_header_timeout)",
        default="10s",
    )
    _option(
        serve,
        "--keepalive-timeout",
        "how long an idle connection is kept open between requests (nginx: keepalive_timeout)",
        default="15s",
    )
    _option(
        serve,
        "--send-timeout",
        "longest wait for a client to take more of a response; a client that "
        "stops reading is dropped after it (nginx: send_timeout)",
        default="60s",
    )
    # --- upstream deadlines ---
    _option(
        serve,
        "--stale-deadline",
        "with a stale cached copy, wait at most this long (from the request's start) "
        "for the refresh, then answer the stale copy while the refresh goes on",
        default="2s",
    )
    _option(
        serve,
        "--request-deadline",
        "wait at most this long for upstream metadata the cache lacks, then "
        "answer 504 (the fetch goes on; downloads themselves are bounded by the rate rules)",
        default="8s",
    )
    _option(serve, "--download-idle-timeout", "abort a download that sends nothing for this long", default="30s")
    _option(
        serve,
        "--min-download-rate",
        "abort a download slower than this per second over "
        "--download-rate-window (checked after one window); 0 turns it off",
        default="32KiB",
    )
    _option(serve, "--download-rate-window", "window of the minimum download rate", default="30s")
    _option(serve, "--download-slot-wait", "wait at most this long for a download slot, then answer 503", default="30s")
    _option(
        serve,
        "--upstream-host-concurrency",
        "upstream requests in flight to one host at most (within --upstream-concurrency)",
        default="8",
    )
    _option(
        serve,
        "--shutdown-grace",
        "on SIGTERM, let requests finish for at most this long, then cancel upstream fetches and exit",
        default="15s",
    )
    # --- negative cache ---
    _option(
        serve,
        "--negative-cache-entries",
        "remembered upstream 404s (made-up names) kept at most, fleet-wide "
        "with Redis; the least recently written are dropped first",
        default="10000",
    )
    _option(serve, "--negative-cache-bytes", "total size of remembered upstream 404s at most", default="16MiB")
    # --- metadata trust ---
    _metadata_secret_options(serve)
    # --- disk space ---
    _option(
        serve,
        "--min-free-space",
        "free space to keep in DATA_DIR (a size, or a percentage of the disk "
        "such as 5%%; 0: none): below it /readyz is 503 and uncached archives are relayed from the upstream, "
        "verified, without being stored",
        default="1GiB",
        metavar="SIZE|PERCENT",
    )
    # --- archive store size cap and eviction ---
    _option(
        serve,
        "--max-store-size",
        "largest total size of the archive store (e.g. 200GiB); beyond it (and "
        "below --min-free-space) the least recently served archives are removed, fetched again when asked "
        "for (default: no cap)",
        metavar="SIZE",
    )
    _option(
        serve,
        "--eviction-grace",
        "never evict an archive served or stored within this long, by any replica "
        "(keep it above 1m: replicas write served times once a minute)",
        default="10m",
    )
    _option(
        serve,
        "--eviction-interval",
        "check the store's size this often (also after every store that passes the cap)",
        default="5m",
    )
    _option(serve, "--log-format", "auto (JSON unless on a terminal), json or console", default="auto")
    _option(serve, "--log-level", "debug, info, warning or error", default="info")
    _option(
        serve,
        "--access-log",
        "one log line per request: all, errors (status 400 and above, and requests slower than 1 s) or off",
        default="all",
    )
    _option(
        serve,
        "--event-loop",
        "auto (uvloop when installed), uvloop or asyncio",
        default="auto",
    )
    # --- unsigned providers ---
    _option(
        serve,
        "--unsigned-providers",
        "providers whose registry lists no signing keys: 'opentofu-default' "
        "accepts them from registry.opentofu.org only (as tofu does), 'allow-hosts=H,…' from the hosts named, "
        "'refuse' from none (also when cached); they are still checked against SHA256SUMS fetched over "
        "verified TLS and the registry's shasum",
        default="opentofu-default",
        metavar="refuse|opentofu-default|allow-hosts=H,…",
    )
    # --- the page at / ---
    _option(
        serve,
        "--public-url",
        "the URL clients reach this proxy at (e.g. https://proxy.example.com/ behind a "
        "load balancer), used in the configuration the page at / shows; default: the request's scheme and "
        "Host",
        metavar="URL",
    )
    # --- access control and upstream credentials ---
    _option(
        serve,
        "--auth-tokens",
        "client tokens file (TOML, hashed tokens with scopes; see `registry-proxy token "
        "new`): clients then need `Authorization: Bearer TOKEN`; reloaded on SIGHUP",
        metavar="FILE",
    )
    _option(serve, "--metrics-token-required", "/metrics needs a token with metrics = true", switch=True)
    _option(
        serve,
        "--upstream-credentials",
        'CLI configuration file whose `credentials "HOST" { token = ... }` '
        "blocks are sent to those upstream hosts (TF_TOKEN_<host> variables too); such hosts are private",
        metavar="FILE",
    )
    _archive_store_options(serve)
    _archive_redirect_options(serve)
    # --- operations: client addresses behind reverse proxies ---
    _option(
        serve,
        "--trusted-proxies",
        "reverse proxies (IP or CIDR) whose X-Forwarded-For is believed: the client "
        "is the right-most address not in this list; from any other peer the header is ignored",
        repeat=True,
        metavar="CIDR",
    )
    _add_client_commands(commands, default_data, serve)
    _add_token_command(commands)
    return parser


def _add_token_command(commands) -> None:
    token = commands.add_parser("token", help="make client tokens for --auth-tokens")
    actions = token.add_subparsers(dest="token_command", required=True)
    new = actions.add_parser(
        "new",
        help="print a fresh random token and its --auth-tokens entry",
        description="Print a fresh random token (shown once: give it to the client) and the entry to add to the "
        "--auth-tokens file, which stores only its SHA-256.",
    )
    new.add_argument("name", help="the token's name (appears in the proxy's log, never the token)")
    new.add_argument(
        "--hosts",
        action="append",
        default=[],
        metavar="HOST",
        help="upstream host it may read, globs allowed (repeatable or comma-separated; default: *)",
    )
    new.add_argument(
        "--namespaces",
        action="append",
        default=None,
        metavar="NAMESPACE",
        help="only these namespaces (repeatable or comma-separated; default: all)",
    )
    new.add_argument("--lock", action="store_true", help="may call /lock/v1 (`registry-proxy lock`)")
    new.add_argument("--metrics", action="store_true", help="may read /metrics")


def _archive_store_options(parser: argparse.ArgumentParser) -> None:
    """Where verified archives are kept: the data dir, or S3-compatible object storage (serve and the commands)."""
    _option(
        parser,
        "--archive-store",
        "s3://BUCKET/PREFIX to keep archives in S3-compatible object storage "
        "(credentials from the AWS environment/profile chain); default: DATA_DIR/archives",
        metavar="URL",
    )
    _option(parser, "--s3-endpoint-url", "S3 API endpoint (MinIO, Ceph RGW, GCS); default: AWS", metavar="URL")
    _option(parser, "--s3-region", "S3 region (default: from the AWS configuration)", metavar="REGION")
    _option(
        parser,
        "--s3-path-style",
        "path-style addressing (https://ENDPOINT/BUCKET/KEY), for MinIO and most non-AWS endpoints",
        switch=True,
    )
    _option(parser, "--s3-ca-file", "extra CA bundle trusted for the S3 endpoint's TLS", metavar="FILE")
    _option(
        parser,
        "--s3-timeout",
        "longest wait for the object store to answer a request or send more of a "
        "body (connecting gets half of it); a request is tried twice at most, then fails with 503, and a "
        "body that stalls is cut off",
        default="20s",
    )


def _archive_redirect_options(parser: argparse.ArgumentParser) -> None:
    _option(
        parser,
        "--archive-redirect",
        "answer archive requests with a short-lived presigned URL of the S3 "
        "object (307) instead of streaming it; clients must reach the object store",
        switch=True,
    )
    _option(parser, "--archive-redirect-expiry", "how long a presigned archive URL is valid", default="5m")


def _add_client_commands(commands, default_data: str, serve: OptionParser) -> None:
    lock = commands.add_parser(
        "lock",
        help="write .terraform.lock.hcl with hashes for every platform",
        description="Write or update DIR/.terraform.lock.hcl with each provider's h1: for every --platform and "
        "a signed zh: for every platform, through a running proxy. Keeps locked versions "
        "(like init) unless --upgrade.",
    )
    lock.add_argument("directory", nargs="?", default=".", help="the root module (default: current directory)")
    _client_options(lock)
    lock.add_argument("--upgrade", action="store_true", help="select the newest matching versions again")

    warm = commands.add_parser(
        "warm",
        help="prefetch providers and modules into a proxy",
        description="Download through the proxy every provider version (for each --platform) and registry module "
        "that a configuration or lock file needs, so later `init`s are served from cache.",
    )
    warm.add_argument("directory", nargs="?", help="configuration directory (its lock file is used if present)")
    warm.add_argument("--lock-file", help="take providers and versions from this lock file instead")
    _client_options(warm)
    _option(warm, "--jobs", "downloads in parallel", default="4")

    export = commands.add_parser(
        "export",
        help="write the verified cache into an air-gap bundle",
        description="Write verified archives and the metadata needed to serve them into one file "
        "(.tar, .tar.gz or .tar.zst by the name of --out).",
    )
    _store_options(export, default_data, serve)
    export.add_argument("--out", required=True, help="bundle file: NAME.tar, NAME.tar.gz or NAME.tar.zst")
    export.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="ADDRESS[@VERSION]",
        help="only this provider (HOST/NS/TYPE) or module (HOST/NS/NAME/SYSTEM), repeatable",
    )

    import_ = commands.add_parser(
        "import",
        help="load an air-gap bundle into a data dir, verifying every archive",
        description="Verify every archive of BUNDLE against its signed SHA256SUMS (providers) or recorded digest "
        "(modules), then add it to the data dir. A tampered bundle is rejected as a whole.",
    )
    import_.add_argument("bundle", help="bundle file written by `registry-proxy export`")
    _store_options(import_, default_data, serve)
    import_.add_argument(
        "--trust-key",
        action="append",
        default=[],
        metavar="FINGERPRINT",
        help="accept provider signatures by this OpenPGP key (repeatable; `export` prints them)",
    )
    import_.add_argument(
        "--trust-bundle-keys",
        action="store_true",
        help="accept the signing keys the bundle itself carries (only for bundles you made)",
    )

    _add_healthcheck(commands, default_data, serve)

    verify = commands.add_parser(
        "verify",
        help="re-hash every archive in a data dir's store",
        description="Hash every stored archive and compare it with its content address; report corrupt files "
        "and temp dirs left by dead processes; list the provider archives stored unsigned "
        "(--unsigned-providers). Exits 1 while corruption is found and not repaired.",
    )
    _store_options(verify, default_data, serve)  # the archive store, and the metadata store (to list unsigned archives)
    verify.add_argument(
        "--repair",
        action="store_true",
        help="move corrupt archives to the quarantine (the proxy fetches them again on the next "
        "request) and remove abandoned temp dirs",
    )

    gc = commands.add_parser(
        "gc",
        help="remove archives no metadata refers to, temp leftovers, old quarantined files and expired 404s",
        description="Remove what nothing needs: archives no record refers to (unless served or stored within "
        "--grace), temp dirs of dead processes, unfinished S3 multipart uploads and quarantined files "
        "older than --grace, expired remembered 404s; strays (not at a content address) are reported, "
        "never removed. Safe while replicas serve. Use the same store options as `serve`.",
    )
    _store_options(gc, default_data, serve)
    gc.add_argument("--dry-run", action="store_true", help="print what would go and how many bytes; remove nothing")
    gc.add_argument(
        "--grace",
        default="30m",
        help="keep unreferenced archives served or stored, uploads started "
        "and quarantined files moved, within this long (default: 30m)",
    )


_HEALTHCHECK_ABOUT = (
    "Ask the proxy started with the same settings (the same flags or REGISTRY_PROXY_* variables: listen address, "
    "--plain-http or TLS, data dir) for /readyz and print one line. Over TLS it trusts --ca-file, else the "
    "generated CA in DATA_DIR/tls, else the --tls-cert itself."
)


def _add_healthcheck(commands, default_data: str, serve: OptionParser) -> None:
    summary = "exit 0 when the local proxy's /readyz says ready, 1 otherwise (container health checks)"
    health = commands.add_parser("healthcheck", help=summary, description=_HEALTHCHECK_ABOUT)
    config_option(health, serve.option_specs)  # follows a listen address set only in serve's --config file
    _option(
        health,
        "--listen",
        "the server's listen address (a wildcard address is probed on loopback)",
        default="127.0.0.1:8443",
        metavar="HOST:PORT",
    )
    _option(health, "--plain-http", "the server serves plain HTTP", switch=True)
    _option(health, "--tls-cert", "the server's configured certificate (trusted as it is)", metavar="FILE")
    _option(
        health,
        "--data-dir",
        "the server's data directory (its generated CA is in DATA_DIR/tls)",
        default=default_data,
        metavar="DIR",
    )
    _option(health, "--ca-file", "CA certificate to trust for the server instead", metavar="FILE")
    health.add_argument("--timeout", default="5s", help="give up after this long (default: 5s)")


def _client_options(parser: argparse.ArgumentParser) -> None:
    _option(parser, "--proxy", "base URL of the running proxy, e.g. https://127.0.0.1:8443/", metavar="URL")
    parser.add_argument(
        "--platform",
        action="append",
        default=[],
        metavar="OS_ARCH",
        help="target platform, repeatable (e.g. linux_amd64, darwin_arm64)",
    )
    _option(
        parser,
        "--ca-file",
        "CA certificate to trust for the proxy (default: SSL_CERT_FILE or the system store)",
        metavar="FILE",
    )
    _option(
        parser,
        "--default-registry",
        "registry host of provider and module sources without one",
        default="registry.terraform.io",
        metavar="HOST",
    )
    _option(
        parser,
        "--token",
        "client token for a proxy with --auth-tokens (needs lock = true for `lock`); "
        "prefer the environment variable, a flag shows in the process list",
        metavar="TOKEN",
    )


def _store_options(parser: OptionParser, default_data: str, serve: OptionParser) -> None:
    """The data dir and metadata store options, and a --config file that takes `serve`'s keys."""
    config_option(parser, serve.option_specs)
    _option(parser, "--data-dir", "the proxy's data directory", default=default_data, metavar="DIR")
    _archive_store_options(parser)
    _option(
        parser,
        "--redis-url",
        "the metadata store is Redis at this URL (else the data dir's embedded one)",
        metavar="URL",
    )
    _option(parser, "--redis-password", "Redis password, if not in the URL", metavar="PASSWORD")
    _option(parser, "--redis-prefix", "namespace of the proxy's Redis keys", default="registry-proxy")
    _option(
        parser,
        "--redis-retention",
        "TTL of Redis entries, renewed on every read and write (as `serve` has it)",
        default="90d",
    )
    _metadata_secret_options(parser)


def _metadata_secret_options(parser: argparse.ArgumentParser) -> None:
    _option(
        parser,
        "--metadata-secret",
        "secret that seals every metadata record (HMAC), so a writer to the "
        "store cannot make the proxy serve other archives or hashes; required with --redis-url, the same on "
        "every replica (e.g. `openssl rand -hex 32`); without it the embedded store makes its own in "
        "DATA_DIR/metadata",
        metavar="SECRET",
    )
    _option(parser, "--metadata-secret-file", "read --metadata-secret from this file instead", metavar="FILE")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Validate the parsed flags into Settings (raises ConfigError)."""
    host, port = parse_listen(args.listen)
    timeout = parse_duration(args.upstream_timeout)
    concurrency = int(args.upstream_concurrency) if str(args.upstream_concurrency).isdigit() else 0
    if concurrency < 1:
        raise ConfigError("--upstream-concurrency must be a positive integer")
    host_concurrency = int(args.upstream_host_concurrency) if str(args.upstream_host_concurrency).isdigit() else 0
    upstream_map = parse_upstream_map(_repeated(args, "--upstream-map"))
    return Settings(
        data_dir=Path(args.data_dir).expanduser(),
        listen_host=host,
        listen_port=port,
        tls_cert=Path(args.tls_cert) if args.tls_cert else None,
        tls_key=Path(args.tls_key) if args.tls_key else None,
        plain_http=bool(args.plain_http),
        allowed_hosts=normalise_hosts(_repeated(args, "--allow-host")),
        upstream_map=upstream_map,
        upstream_ca_file=Path(args.upstream_ca_file) if args.upstream_ca_file else None,
        allowed_private_hosts=normalise_private_hosts(_repeated(args, "--allow-private-host")),
        freshness=FreshnessTtls(
            discovery=parse_duration(args.ttl_discovery),
            versions=parse_duration(args.ttl_versions),
            negative=parse_duration(args.ttl_negative),
        ),
        limits=Limits(
            max_archive_bytes=parse_size(args.max_archive_size),
            max_metadata_bytes=parse_size(args.max_metadata_size),
            metadata_timeout=timeout,
            read_timeout=parse_duration(args.download_idle_timeout),
            connect_timeout=min(timeout, 10.0),
            upstream_concurrency=concurrency,
            min_download_rate=parse_size(args.min_download_rate),
            download_rate_window=parse_duration(args.download_rate_window),
            download_slot_wait=parse_duration(args.download_slot_wait),
            upstream_host_concurrency=host_concurrency,
        ),
        default_upstream=_hostname_setting(args.default_upstream, "--default-upstream"),
        module_passthrough=args.module_passthrough,
        max_module_bytes=parse_size(args.max_module_size),
        git_timeout=parse_duration(args.git_timeout),
        offline=bool(args.offline),
        redis_url=args.redis_url or None,
        redis_password=args.redis_password or None,
        redis_prefix=args.redis_prefix,
        redis_retention=parse_duration(args.redis_retention),
        fleet_lock_ttl=parse_duration(args.fleet_lock_ttl),
        log_format=args.log_format,
        log_level=str(args.log_level).strip().lower(),
        access_log=args.access_log,
        event_loop=args.event_loop,
        max_module_unpacked_bytes=parse_size(args.max_module_unpacked_size),
        max_module_entries=_count(args.max_module_entries, "--max-module-entries"),
        max_connections=_count(args.max_connections, "--max-connections"),
        client_header_timeout=parse_duration(args.client_header_timeout),
        keepalive_timeout=parse_duration(args.keepalive_timeout),
        send_timeout=parse_duration(args.send_timeout),
        stale_deadline=parse_duration(args.stale_deadline),
        request_deadline=parse_duration(args.request_deadline),
        shutdown_grace=parse_duration(args.shutdown_grace),
        negative_cache_entries=_count(args.negative_cache_entries, "--negative-cache-entries"),
        negative_cache_bytes=parse_size(args.negative_cache_bytes),
        min_free_space=parse_space_floor(args.min_free_space),
        workers=available_cpus() if args.workers == "auto" else _count(args.workers, "--workers"),
        trusted_proxies=parse_networks(_repeated(args, "--trusted-proxies"), "--trusted-proxies"),
        **metadata_secret_settings(args.metadata_secret, args.metadata_secret_file),
        unsigned_providers=parse_unsigned_providers(args.unsigned_providers),
        public_url=args.public_url or None,
        **access_settings(args, upstream_map),
        **archive_store_settings(args),
        archive_redirect=bool(args.archive_redirect),
        archive_redirect_expiry=parse_duration(args.archive_redirect_expiry),
        max_store_size=parse_size(args.max_store_size) if args.max_store_size else None,
        eviction_grace=parse_duration(args.eviction_grace),
        eviction_interval=parse_duration(args.eviction_interval),
    )


def access_settings(args: argparse.Namespace, upstream_map: dict) -> dict:
    """`auth_tokens`, `metrics_token_required` and `upstream_credentials` (the file's blocks and TF_TOKEN_*)."""
    from proxy.auth import AuthConfigError, parse_tokens
    from proxy.credentials import CredentialsError, UpstreamCredentials, from_environment, merged, parse_cli_config

    tokens_file = Path(args.auth_tokens).expanduser() if args.auth_tokens else None
    try:
        if tokens_file is not None:
            parse_tokens(tokens_file.read_text(encoding="utf-8"))  # a broken file stops start-up
        file_tokens = {}
        if args.upstream_credentials:
            file_tokens = parse_cli_config(Path(args.upstream_credentials).expanduser().read_text(encoding="utf-8"))
        upstream = merged(file_tokens, from_environment(os.environ))
    except (AuthConfigError, CredentialsError) as exc:
        raise ConfigError(str(exc)) from None
    return {
        "auth_tokens": tokens_file,
        "metrics_token_required": bool(args.metrics_token_required),
        "upstream_credentials": UpstreamCredentials(upstream, upstream_map),
    }


def _count(text: str, flag: str) -> int:
    if not str(text).strip().isdigit() or int(text) < 1:
        raise ConfigError(f"{flag} must be a positive integer, not {text!r}")
    return int(str(text).strip())


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. a container's cpuset)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _hostname_setting(text: str, flag: str) -> Hostname:
    not_a_url(text, flag)
    try:
        return Hostname.parse(text)
    except AddressError as exc:
        raise ConfigError(f"invalid {flag}: {exc}") from None


def server_ssl_context(settings: Settings, extra_names: list[str]) -> ssl.SSLContext | None:
    """TLS context for the listener; generates a local CA on first start when no cert is given."""
    if settings.plain_http:
        return None
    cert, key = settings.tls_cert, settings.tls_key
    if cert is None or key is None:
        from proxy.certs import ensure_local_tls

        names = ["localhost", "127.0.0.1", "::1", socket.gethostname(), *extra_names]
        if settings.listen_host not in ("0.0.0.0", "::", ""):
            names.insert(0, settings.listen_host)
        local = ensure_local_tls(settings.tls_dir, names)
        cert, key = local.server_cert, local.server_key
        ca_file = local.ca_cert.resolve()
        log.info(
            "tls.local_ca",
            ca_file=str(ca_file),
            created=local.created,
            hint=f"clients must trust the CA: export SSL_CERT_FILE={ca_file}",
            cli_config=cli_snippet(mirror_url(settings, "https")),
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(cert), str(key))
    except ssl.SSLError as exc:
        raise ConfigError(
            f"--tls-cert {cert} / --tls-key {key}: not a matching PEM certificate and key ({exc.reason or exc})"
        ) from None
    return context


def mirror_url(settings: Settings, scheme: str) -> str:
    """The network mirror URL of this proxy as clients on this machine reach it."""
    host = settings.listen_host
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    display_host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{display_host}:{settings.listen_port}/mirror/v1/"


def cli_snippet(url: str) -> str:
    """The CLI configuration block (`~/.terraformrc`, `~/.tofurc`) that makes clients use this proxy."""
    return f'provider_installation {{\n  network_mirror {{\n    url = "{url}"\n  }}\n}}\n'


def check_files(settings: Settings) -> None:
    """Every file a flag names must exist and be readable before start-up goes on."""
    for flag, path in (
        ("--tls-cert", settings.tls_cert),
        ("--tls-key", settings.tls_key),
        ("--upstream-ca-file", settings.upstream_ca_file),
        ("--metadata-secret-file", settings.metadata_secret_file),
    ):
        if path is None:
            continue
        if not path.is_file():
            reason = "is a directory" if path.is_dir() else "no such file"
            raise ConfigError(f"{flag} {path}: {reason}")
        if not os.access(path, os.R_OK):
            raise ConfigError(f"{flag} {path}: not readable by this user")


def serve(args: argparse.Namespace) -> int:
    from proxy.log import setup_logging
    from proxy.web.app import create_app
    from proxy.web.server import run_server
    from proxy.web.workers import run_workers

    settings = settings_from_args(args)
    check_files(settings)
    setup_logging(settings.log_format, settings.log_level)
    context = server_ssl_context(settings, _repeated(args, "--tls-hostname"))
    url = mirror_url(settings, "http" if context is None else "https")

    def listening() -> None:  # called once the socket is bound
        log.info("proxy.listening", mirror_url=url, workers=settings.workers)

    warn_about_access(settings)
    if settings.workers > 1:
        run_workers(settings, context, on_listening=listening)
    else:
        run_server(
            create_app(settings), settings, context, shutdown_timeout=settings.shutdown_grace, on_listening=listening
        )
    return 0


def warn_about_access(settings: Settings) -> None:
    """One warning for each way the access settings may surprise: anonymous beyond loopback, private hosts
    nobody can read."""
    private = sorted(settings.upstream_credentials.private_hosts)
    if settings.auth_tokens is None and not _loopback(settings.listen_host):
        log.warning(
            "auth.anonymous",
            listen=settings.listen_host,
            effect="no --auth-tokens: anyone who reaches this address may use the proxy",
        )
    if private and settings.auth_tokens is None:
        log.warning(
            "auth.private_hosts_refused",
            hosts=private,
            effect="these hosts have upstream credentials, and without --auth-tokens every client is refused them",
        )
    elif private:
        log.info("auth.private_hosts", hosts=private, effect="served only to tokens granting them")


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _token_new(args: argparse.Namespace) -> int:
    from proxy.auth import AuthConfigError, new_token, token_entry

    hosts = [h.strip() for given in args.hosts for h in given.split(",") if h.strip()] or ["*"]
    namespaces = (
        None
        if args.namespaces is None
        else [n.strip() for given in args.namespaces for n in given.split(",") if n.strip()]
    )
    token = new_token()
    try:
        entry = token_entry(args.name, token, hosts, namespaces, lock=args.lock, metrics=args.metrics)
    except AuthConfigError as exc:
        raise ConfigError(str(exc)) from None
    print(f"token (shown once; give it to the client): {token}\n")
    print("add to the --auth-tokens file, then send the proxy SIGHUP:\n")
    print(entry, end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    from proxy.commands import CommandError

    try:
        args = build_parser().parse_args(argv)
        if args.command == "serve":
            return serve(args)
        if args.command == "healthcheck":
            from proxy.commands import healthcheck

            return healthcheck.run(args)
        if args.command == "token":
            return _token_new(args)
        from proxy.commands import run

        return asyncio.run(run.dispatch(args))
    except ConfigError as exc:
        print(f"registry-proxy: error: {exc}", file=sys.stderr)
        return 2
    except CommandError as exc:
        print(f"registry-proxy: error: {exc}", file=sys.stderr)
        return 1
    except (OSError, ssl.SSLError) as exc:
        print(f"registry-proxy: error: {_os_error(exc)}", file=sys.stderr)
        return 1


def _os_error(exc: OSError | ssl.SSLError) -> str:
    """One line for an OS error, naming the file when it has one (`[Errno 2] ...` alone names none)."""
    filename = getattr(exc, "filename", None)
    reason = getattr(exc, "strerror", None) or str(exc)
    return f"{filename}: {reason}" if filename else reason
