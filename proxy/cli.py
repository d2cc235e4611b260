"""Command-line interface: `registry-proxy serve|doctor|lock|warm|export|import|verify|gc|purge|backup|restore|...`
(also `python -m proxy`; `registry-proxy completion SHELL` prints the shell's completion of all of it).

Every option is declared once, in `proxy.settings.config`; `proxy.settings.command_line` makes each a flag, an
environment variable `REGISTRY_PROXY_<NAME>` and a key of the optional `--config` TOML file (flags win over the
environment, which wins over the file, which wins over the defaults). This module adds each command's
own arguments, builds the Settings and runs the command.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import ssl
import sys

import structlog

from proxy import __version__
from proxy.commands import healthcheck
from proxy.commands.config_files import check_policy_file, check_tokens_file, settings_of
from proxy.settings.command_line import UNSAFE_EFFECT, OptionParser, add_command, below_safe_minimums, shown_seconds
from proxy.settings.config import CLIENT_COMMANDS, ConfigError, Settings, declared
from proxy.web.listener import bind_listener

log = structlog.get_logger("proxy.cli")
POLICY = declared("--policy")  # serve's and export's policy file, which `policy explain` reads too


def build_parser() -> OptionParser:
    """The command line: each command's declared options (proxy.settings.config) and its own arguments."""
    parser = OptionParser(
        prog="registry-proxy", description="Caching, verifying pull-through proxy for OpenTofu and Terraform providers."
    )
    parser.add_argument("--version", action="version", version=f"registry-proxy {__version__}")
    commands = parser.add_commands()
    add_command(
        commands,
        "serve",
        config=True,
        help="run the proxy",
        description="Serve the provider network mirror protocol at https://HOST:PORT/mirror/v1/.",
    )
    _add_client_commands(commands)
    _add_store_commands(commands)
    add_command(
        commands,
        "healthcheck",
        config=True,  # follows a listen address set only in serve's --config file
        help="exit 0 when the local proxy's /readyz says ready, 1 otherwise (container health checks)",
        description=_HEALTHCHECK_ABOUT,
    )
    _add_doctor_command(commands)
    _add_backup_commands(commands)
    _add_token_command(commands)
    _add_policy_command(commands)
    _add_trust_command(commands)
    completion = add_command(
        commands,
        "completion",
        help="print the shell completion script for bash, zsh or fish",
        description="Print the completion script of SHELL for every command and option; docs/usage.md says where "
        "to put it (e.g. `registry-proxy completion bash > /etc/bash_completion.d/registry-proxy`).",
    )
    completion.add_argument("shell", choices=("bash", "zsh", "fish"), metavar="bash|zsh|fish")
    return parser


def _add_doctor_command(commands) -> None:
    doctor = add_command(
        commands,
        "doctor",
        config=True,
        options_of="serve",
        help="check what serve would run with: options, files, data dir, stores, upstreams, clock (one line each)",
        description="Check, one line each (ok, warning or failed, and the fix), what `serve` would run with: its "
        "options and files parse; the data dir is writable with the free space the options keep; the archive store "
        "takes, returns and deletes a probe object; the metadata store answers (for Redis: persistence, "
        "maxmemory-policy, the fleet's secret marker); each allowed upstream's discovery answers over verified TLS "
        "(a refused certificate names the CA to trust); the clock is within the OIDC leeway of the upstreams'; "
        "with --url, the running proxy is ready and serves its discovery document. Takes the options of `serve` "
        "(the same flags, variables and --config). Exit 0: all ok; 1: warnings; 2: a check failed.",
    )
    doctor.add_argument("--url", metavar="URL", help="also check the proxy running at URL (/readyz, discovery)")
    doctor.add_argument("--json", action="store_true", help="print the checks as a JSON list, for scripts")


def _add_policy_command(commands) -> None:
    policy = add_command(commands, "policy", help="check a --policy file, or explain its decision")
    actions = policy.add_subparsers(dest="policy_command", required=True)
    check = actions.add_parser(
        "check",
        help="validate a policy file offline (exit 0 and its rules, or 2 and what is wrong)",
        description="Validate a policy file without a running proxy: exit 0 and list its rules, or exit 2 with "
        "one line naming the file, the rule and the key.",
    )
    check.add_argument("file", metavar="FILE", help="the policy file (TOML)")
    explain = actions.add_parser(
        "explain",
        help="print which rule decides about a provider or module, and why",
        description="Print, rule by rule, which rule of the policy decides about ADDRESS (a provider "
        "HOST/NAMESPACE/TYPE or a module HOST/NAMESPACE/NAME/SYSTEM), and the decision.",
    )
    explain.add_argument("address", help="HOST/NAMESPACE/TYPE[@VERSION] or HOST/NAMESPACE/NAME/SYSTEM[@VERSION]")
    explain.add_argument(
        POLICY.flag,
        dest="policy_path",
        default=os.environ.get(POLICY.env_name),  # the declared option's variable (its --config key is serve's)
        metavar="FILE",
        help=f"the policy file (default: {POLICY.env_name})",
    )
    explain.add_argument("--platform", metavar="OS_ARCH", help="the platform asked for (e.g. linux_amd64)")
    explain.add_argument("--client", default="anonymous", metavar="NAME", help="the client token's name")
    explain.add_argument(
        "--scope",
        action="append",
        metavar="HOST/NAMESPACE",
        help="a scope of the client (repeatable; HOST/* for every namespace), for rules with `scopes`",
    )
    explain.add_argument(
        "--age",
        metavar="DURATION",
        help="how long ago the proxy first saw the version (for min-age rules; default: unknown)",
    )
    explain.add_argument(
        "--published",
        metavar="DURATION",
        help="how long ago the upstream says it published the version (registry API, SHA256SUMS Last-Modified); "
        "the age counts from the later of this and --age, and the output says which decided",
    )
    baseline = add_command(
        actions,
        "baseline",
        config=True,
        options_of="serve",
        help="record the versions the upstream lists now as old, on purpose, for min-age rules",
        description="Record the versions each ADDRESS's upstream lists now (fetched as the proxy fetches them) as "
        "old, on purpose: a min-age rule then lets them through where their age is unknown (a fresh deployment, "
        "a flushed or lost metadata store). Without ADDRESS: every provider and module the store knows. A version "
        "the proxy has a first-seen time for keeps it. Takes the options of `serve` (the same flags, variables "
        "and --config); audited as `baselined` with --actor.",
    )
    baseline.add_argument("addresses", nargs="*", metavar="ADDRESS", help="HOST/NAMESPACE/TYPE or HOST/NS/NAME/SYSTEM")
    baseline.add_argument(
        "--actor", metavar="NAME", help="who baselines, for the audit trail (default: cli:USER, the OS user)"
    )


def _add_backup_commands(commands) -> None:
    backup = add_command(
        commands,
        "backup",
        config=True,
        options_of="serve",
        help="copy the metadata store and the data dir's secrets into DIR, safe while the proxy runs",
        description="Write into DIR what the data dir cannot get back by itself: the embedded metadata store (a "
        "consistent copy made with SQLite's online backup, while the proxy serves and writes), the metadata secret, "
        "the generated CA with its key and the server certificate, and manifest.json (each file's SHA-256). With "
        "--redis-url, instead of the store, the records Redis keeps that no upstream gives back (first-seen times, "
        "baselines, signing keys: metadata/kept.jsonl, sealed); the rest of Redis is the fleet's cache. The archives "
        "are a cache too, fetched again, but not behind an air gap: --archives, or `export`. Takes the options of "
        "`serve` (the same flags, variables and --config).",
    )
    backup.add_argument("directory", metavar="DIR", help="a new or empty directory (an earlier backup with --force)")
    backup.add_argument(
        "--archives",
        action="store_true",
        help="also the archives: hard links where DIR is on the data dir's filesystem, else copies",
    )
    backup.add_argument("--force", action="store_true", help="replace the backup DIR holds")
    restore = add_command(
        commands,
        "restore",
        config=True,
        options_of="serve",
        help="restore a backup into a data dir (stopped), verifying every file first",
        description="Check every file of the backup in DIR against its manifest and that the metadata secret opens "
        "its records, before anything is written; then write each file into the data dir (atomically, with its "
        "mode) and open every restored record with the secret. Refuses a data dir in use, and one that already "
        "holds a metadata store or secrets unless --force. With --redis-url, the records Redis keeps go back into "
        "it first, never over one it holds unless --force. Takes the options of `serve`.",
    )
    restore.add_argument("directory", metavar="DIR", help="a backup written by `registry-proxy backup`")
    restore.add_argument(
        "--force",
        action="store_true",
        help="replace the metadata store and secrets the data dir holds (and the kept records Redis holds)",
    )


def _add_trust_command(commands) -> None:
    trust = add_command(
        commands,
        "trust",
        config=True,
        help="list or accept the signing keys recorded for a provider (key continuity, docs/policy.md)",
        description="`trust list ADDRESS`: the signing keys the fleet recorded for a provider's releases (seen or "
        "accepted, held back), and the last key changes; exit 1 when the record cannot be read. `trust accept "
        "ADDRESS KEY_ID`: record KEY_ID as a signing key of ADDRESS, accepted on purpose, so that a release it "
        'signs is no longer a key change (with key-change = "hold", no longer refused); KEY_ID is the key id '
        "the refusal named (16 hex digits, of a key held back or seen) or the key's full fingerprint; written to "
        "the audit trail (--audit-log) with who accepted it. A [[pin]] still refuses a key it does not list. "
        "Uses the metadata store `serve` uses (the same store options).",
    )
    trust.add_argument("trust_command", choices=("list", "accept"), metavar="list|accept")
    trust.add_argument("address", metavar="ADDRESS", help="the provider, HOST/NAMESPACE/TYPE")
    trust.add_argument("key_id", nargs="?", metavar="KEY_ID", help="accept: key id (16 hex digits) or fingerprint")
    trust.add_argument(
        "--by", metavar="NAME", help="accept: who accepts it, for the audit trail (default: the OS user)"
    )


def _add_token_command(commands) -> None:
    token = add_command(commands, "token", help="make client tokens for --auth-tokens")
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
    new.add_argument("--admin", action="store_true", help="may purge what it may read (DELETE /api/v1/catalog/...)")


def _add_client_commands(commands) -> None:
    lock = add_command(
        commands,
        "lock",
        help="write .terraform.lock.hcl with hashes for every platform",
        description="Write or update DIR/.terraform.lock.hcl with each provider's h1: for every --platform and "
        "a signed zh: for every platform, through a running proxy. Keeps locked versions "
        "(like init) unless --upgrade.",
    )
    lock.add_argument(
        "directory", nargs="?", default=".", metavar="DIR", help="the root module (default: current directory)"
    )
    _platform_argument(lock)
    lock.add_argument("--upgrade", action="store_true", help="select the newest matching versions again")

    warm = add_command(
        commands,
        "warm",
        help="prefetch providers and modules into a proxy",
        description="Download through the proxy every provider version (for each --platform) and registry module "
        "that a configuration or lock file needs, so later `init`s are served from cache.",
    )
    warm.add_argument(
        "directory", nargs="?", metavar="DIR", help="configuration directory (its lock file is used if present)"
    )
    warm.add_argument("--lock-file", metavar="FILE", help="take providers and versions from this lock file instead")
    _platform_argument(warm)
    _quiet_argument(warm)


def _quiet_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="show no progress on stderr (a bar on a terminal, else a line per step or per few steps, and a "
        "summary); what the command prints on stdout is the same",
    )


def _platform_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--platform",
        action="append",
        default=[],
        metavar="OS_ARCH",
        help="target platform, repeatable (e.g. linux_amd64, darwin_arm64)",
    )


def _add_store_commands(commands) -> None:
    """The commands that open a data dir's stores as `serve` does (they take its --config file)."""
    export = add_command(
        commands,
        "export",
        config=True,
        help="write the verified cache into an air-gap bundle",
        description="Write verified archives and the metadata needed to serve them into one file "
        "(.tar, .tar.gz or .tar.zst by the name of --out), or with --format filesystem-mirror the provider "
        "archives into a directory that Terraform's and OpenTofu's `filesystem_mirror` read.",
    )
    export.add_argument(
        "--out",
        metavar="FILE|DIR",
        help="bundle file: NAME.tar, NAME.tar.gz or NAME.tar.zst; a directory for --format filesystem-mirror",
    )
    export.add_argument("destination", nargs="?", metavar="FILE|DIR", help="the same as --out")
    export.add_argument(
        "--format",
        choices=("bundle", "filesystem-mirror"),
        default="bundle",
        help="bundle (for `import` into a proxy) or filesystem-mirror (the packed layout "
        "HOST/NAMESPACE/TYPE/terraform-provider-TYPE_VERSION_OS_ARCH.zip, providers only)",
    )
    export.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="ADDRESS[@VERSION]",
        help="only this provider (HOST/NS/TYPE) or module (HOST/NS/NAME/SYSTEM), repeatable",
    )
    _quiet_argument(export)

    import_ = add_command(
        commands,
        "import",
        config=True,
        help="load an air-gap bundle into a data dir, verifying every archive",
        description="Verify every archive of the bundle FILE against its signed SHA256SUMS (providers) or recorded "
        "digest (modules), then add it to the data dir. A tampered bundle is rejected as a whole.",
    )
    import_.add_argument("bundle", metavar="FILE", help="bundle file written by `registry-proxy export`")
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
    _quiet_argument(import_)

    verify = add_command(
        commands,
        "verify",
        config=True,
        help="re-hash every archive in a data dir's store",
        description="Hash every stored archive and compare it with its content address; report corrupt files "
        "and temp dirs left by dead processes; hold every provider archive record to the verification chain "
        "again (signature, SHA256SUMS line, digest) and list those it refuses; list the provider archives stored "
        "unsigned (--unsigned-providers). Exits 1 while corruption is found and not repaired, or a record is "
        "refused.",
    )
    verify.add_argument(
        "--repair",
        action="store_true",
        help="move corrupt archives to the quarantine (the proxy fetches them again on the next "
        "request) and remove abandoned temp dirs",
    )
    _quiet_argument(verify)

    gc = add_command(
        commands,
        "gc",
        config=True,
        help="remove archives no metadata refers to, temp leftovers, old quarantined files and expired 404s",
        description="Remove what nothing needs: archives no record refers to (unless served or stored within "
        "--grace), temp dirs of dead processes, unfinished S3 multipart uploads and quarantined files "
        "older than --grace, expired remembered 404s; strays (not at a content address) are reported, "
        "never removed. Safe while replicas serve. Use the same store options as `serve`.",
    )
    gc.add_argument("--dry-run", action="store_true", help="print what would go and how many bytes; remove nothing")
    _quiet_argument(gc)

    purge = add_command(
        commands,
        "purge",
        config=True,
        help="remove a cached provider or module (or one version) from every replica",
        description="Remove the records of ADDRESS (all versions, or @VERSION) from the metadata store and their "
        "archives from the archive store (an archive another cached address shares by content stays), and make "
        "every running worker and replica drop its in-memory copies: the next request fetches it from the upstream "
        "again. Use the same store options as `serve`. Logged as catalog.purged.",
    )
    purge.add_argument(
        "target", metavar="ADDRESS[@VERSION]", help="provider HOST/NS/TYPE or module HOST/NS/NAME/SYSTEM"
    )
    _quiet_argument(purge)

    add_command(
        commands,
        "rotate-secret",
        config=True,
        help="seal the metadata store's records and marker again with a new --metadata-secret",
        description='The last step of a rotation of the metadata secret (docs/operations.md, "Rotating the '
        'metadata secret"): run with the new secret as --metadata-secret and the old one as '
        "--metadata-secret-accepted once every replica reads with both and writes with the new one. Every record "
        "the old secret sealed is sealed again with the new one (its expiry kept), then the fleet's marker: the "
        "replicas may then drop the old secret. Exits 2, changing nothing, when neither secret opens the marker.",
    )


_HEALTHCHECK_ABOUT = (
    "Ask the proxy started with the same settings (the same flags or REGISTRY_PROXY_* variables: listen address, "
    "--plain-http or TLS, data dir) for /readyz and print one line. Over TLS it trusts --ca-file, else the "
    "generated CA in DATA_DIR/tls, else the --tls-cert itself."
)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The Settings of parsed `serve` options (raises ConfigError); reads the tokens and credentials files."""
    settings = settings_of(args)
    check_tokens_file(settings)
    check_policy_file(settings.policy.policy_file)
    return settings


def given_ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The listener's TLS context of `--tls-cert` and `--tls-key` (ConfigError when they are not a matching
    PEM certificate and key); None when they are not given."""
    cert, key = settings.tls.tls_cert, settings.tls.tls_key
    if cert is None or key is None:
        return None
    return _listener_context(cert, key)


def server_ssl_context(settings: Settings, extra_names: list[str]) -> ssl.SSLContext | None:
    """TLS context for the listener; generates a local CA on first start when no cert is given."""
    if settings.tls.plain_http:
        return None
    given = given_ssl_context(settings)
    if given is not None:
        return given
    from proxy.web.local_ca import ensure_local_tls

    names = ["localhost", "127.0.0.1", "::1", socket.gethostname(), *extra_names]
    if settings.server.listen_host not in ("0.0.0.0", "::", ""):
        names.insert(0, settings.server.listen_host)
    local = ensure_local_tls(settings.tls_dir, names)
    ca_file = local.ca_cert.resolve()
    log.info(
        "tls.local_ca",
        ca_file=str(ca_file),
        created=local.created,
        ca_bundle=str(local.ca_bundle.resolve()),
        system_roots=str(local.system_roots) if local.system_roots else None,
        hint=f"clients must trust the CA: export SSL_CERT_FILE={local.ca_bundle.resolve()} (system roots + the CA)",
        cli_config=cli_snippet(mirror_url(settings, "https")),
    )
    return _listener_context(local.server_cert, local.server_key)


def _listener_context(cert, key) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(cert), str(key))
    except ssl.SSLError as exc:
        raise ConfigError(
            f"--tls-cert {cert} / --tls-key {key}: not a matching PEM certificate and key ({exc.reason or exc})"
        ) from None
    return context


def mirror_url(settings: Settings, scheme: str) -> str:
    """The network mirror URL of this proxy: under `--public-url`, else as clients on this machine reach it."""
    if settings.server.public_url:
        return settings.server.public_url.rstrip("/") + "/mirror/v1/"
    host = settings.server.listen_host
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    display_host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{display_host}:{settings.server.listen_port}/mirror/v1/"


def cli_snippet(url: str) -> str:
    """The CLI configuration block (`~/.terraformrc`, `~/.tofurc`) that makes clients use this proxy."""
    return f'provider_installation {{\n  network_mirror {{\n    url = "{url}"\n  }}\n}}\n'


def serve(args: argparse.Namespace) -> int:
    """Check everything that can be checked at once, bind the listening socket (a port in use is one line,
    exit 2), then prepare the stores and serve."""
    settings = settings_from_args(args)  # every file an option names was checked as the options were read
    given_ssl_context(settings)  # a certificate and key that do not match: refused before anything is made
    listening = bind_listener(settings.server.listen_host, settings.server.listen_port)

    from proxy.runtime.log import setup_logging
    from proxy.web.app import create_app
    from proxy.web.server import run_server

    setup_logging(settings.logging.log_format, settings.logging.log_level)
    asyncio.run(prepare_metadata_store(settings))  # first: a secret that differs from the fleet's is its one line
    warn_about_short_timings(settings, below_safe_minimums(args, "serve"))
    warn_about_plain_http_upstreams(settings)
    context = server_ssl_context(settings, sorted(settings.tls.tls_hostnames))
    url = mirror_url(settings, "http" if context is None else "https")

    def on_listening() -> None:  # called once the application accepts connections
        log.info("proxy.listening", mirror_url=url, workers=settings.server.workers)

    warn_about_access(settings)
    if settings.server.workers > 1:
        from proxy.web.workers import run_workers  # gunicorn: only for a supervisor of workers

        run_workers(settings, context, listening, on_listening=on_listening)
    else:
        run_server(
            create_app(settings),
            settings,
            context,
            listening,
            shutdown_timeout=settings.server.shutdown_grace,
            on_listening=on_listening,
        )
    return 0


async def prepare_metadata_store(settings: Settings) -> None:
    """Open the metadata store once before serving: the metadata secret is made and the embedded file checked
    (records of an older version sealed, a damaged file moved aside) by one process, the fleet's secret marker
    opened (ConfigError, exit 2, when the secret differs: `proxy.metadata_store.fleet_secret`), and a store that
    does not answer (Redis down) is said once, at start (then `/readyz` says why, and serving goes on without it;
    the marker is checked once it answers)."""
    from proxy.metadata_store.factory import open_metadata

    store, _, backend = await open_metadata(settings)
    try:
        await store.require_fleet()  # a store that does not answer is logged by the store (`redis.down`), once
        if settings.metadata.redis_url and settings.policy.policy_file is not None:
            from proxy.governance.gatekeeper import load_policy
            from proxy.governance.release_times import warn_if_records_at_risk

            policy = await asyncio.to_thread(load_policy, settings.policy.policy_file)
            await warn_if_records_at_risk(policy, backend)
    finally:
        await store.close()


def warn_about_short_timings(settings: Settings, lowered: dict) -> None:
    """The loud warning of --unsafe-short-timings, naming what is below its safe minimum."""
    if settings.unsafe_short_timings:
        log.warning(
            "config.unsafe_short_timings",
            below_safe_minimum=shown_seconds(lowered),
            effect=UNSAFE_EFFECT,
        )


def warn_about_plain_http_upstreams(settings: Settings) -> None:
    """One warning naming the `--upstream-map` hosts reached over plain http."""
    plain = sorted(host for host, base in settings.upstreams.upstream_map.items() if base.scheme == "http")
    if plain:
        log.warning(
            "config.plain_http_upstream",
            hosts=plain,
            effect="these registries are reached without TLS: anyone on the network path can change what they "
            "answer, signing keys included, so nothing from them is authenticated; map them to https:// "
            "(with --upstream-ca-file for an internal CA)",
        )


def warn_about_access(settings: Settings) -> None:
    """One warning for each way the access settings may surprise: anonymous beyond loopback, private hosts
    nobody can read."""
    private = sorted(settings.upstreams.upstream_credentials.private_hosts)
    if not settings.access.clients_required and not _loopback(settings.server.listen_host):
        log.warning(
            "auth.anonymous",
            listen=settings.server.listen_host,
            effect="no --auth-tokens or --oidc-issuers: anyone who reaches this address may use the proxy",
        )
    if private and not settings.access.clients_required:
        log.warning(
            "auth.private_hosts_refused",
            hosts=private,
            effect="these hosts have upstream credentials, and without --auth-tokens or --oidc-issuers every "
            "client is refused them",
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


def _policy_baseline(args: argparse.Namespace) -> int:
    """`policy baseline`: serve's options resolved as serve resolves them, then the baseline."""
    from proxy.commands.baseline import baseline_command
    from proxy.settings.command_line import resolve

    resolve(args, "serve", os.environ)
    return baseline_command(settings_from_args(args), args.addresses, args.actor)


def _backup_or_restore(args: argparse.Namespace) -> int:
    """`backup` and `restore`: serve's options resolved as serve resolves them (data dir, store, secret)."""
    from pathlib import Path

    from proxy.commands.backup import backup_command, restore_command
    from proxy.settings.command_line import resolve

    resolve(args, "serve", os.environ)
    settings = settings_from_args(args)
    if args.command == "backup":
        return backup_command(settings, Path(args.directory), archives=args.archives, force=args.force)
    return restore_command(settings, Path(args.directory), force=args.force)


def _token_new(args: argparse.Namespace) -> int:
    from proxy.identity.tokens import AuthConfigError, new_token, token_entry

    hosts = [h.strip() for given in args.hosts for h in given.split(",") if h.strip()] or ["*"]
    namespaces = (
        None
        if args.namespaces is None
        else [n.strip() for given in args.namespaces for n in given.split(",") if n.strip()]
    )
    token = new_token()
    try:
        entry = token_entry(args.name, token, hosts, namespaces, lock=args.lock, metrics=args.metrics, admin=args.admin)
    except AuthConfigError as exc:
        raise ConfigError(str(exc)) from None
    print(f"token (shown once; give it to the client): {token}\n")
    print("add to the --auth-tokens file, then send the proxy SIGHUP:\n")
    print(entry, end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    from proxy.commands import CommandError

    try:
        try:
            args = build_parser().parse_args(argv)
        except ConfigError as exc:
            if exc.command == "healthcheck":  # its one line, and exit 1: Docker reserves 2
                return healthcheck.refused(exc)
            if exc.command == "doctor":  # a check of its own, failed
                from proxy.commands.doctor import refused

                return refused(exc, as_json=getattr(exc.arguments, "json", False))
            raise
        if args.command == "serve":
            return serve(args)
        if getattr(args, "unsafe_short_timings", False):
            lowered = shown_seconds(below_safe_minimums(args, args.command))
            print(f"registry-proxy: warning: {UNSAFE_EFFECT} (below: {lowered or 'none'})", file=sys.stderr)
        if args.command == "healthcheck":
            return healthcheck.run(args)
        if args.command == "token":
            return _token_new(args)
        if args.command in ("backup", "restore"):
            return _backup_or_restore(args)
        if args.command == "doctor":
            from proxy.commands.doctor import doctor_command

            return doctor_command(args)
        if args.command == "completion":
            from proxy.commands.completion import script

            print(script(build_parser(), args.shell), end="")
            return 0
        if args.command == "policy" and args.policy_command == "baseline":
            return _policy_baseline(args)
        if args.command == "policy":
            from proxy.commands import policy

            return policy.run(args)
        from proxy.commands.preflight import check_arguments

        check_arguments(args)  # before the command's modules are imported: a mistake is answered at once
        if args.command in CLIENT_COMMANDS:  # through a running proxy: without the stores' modules
            from proxy.commands import client_run as run
        else:
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
