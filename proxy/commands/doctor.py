"""`registry-proxy doctor`: what an operator checks when something is off, in one command that takes the options,
REGISTRY_PROXY_* variables and --config file of `serve` (plus `--url` of a running proxy).

The checks, one line each (`proxy.commands.doctor_report`), the independent ones at once, each within
`CHECK_TIMEOUT` (a hung upstream, Redis or bucket is a failed line, not a hung doctor):

- configuration: serve's options parse (when they do not, that one failed line, and nothing else is checked);
- policy, auth-tokens, oidc-issuers: the files parse, read by the readers `serve` uses (`config_files`);
- data-dir: a writable directory (a probe file written and removed), or one `serve` can make;
  disk-space: the free space --min-free-space keeps, and room on the disk for --max-store-size above it;
- archive-store: a probe object put, read back and deleted (the directory, or the S3 bucket);
- metadata-store: it answers; the embedded file whole (SQLite's quick_check, read-only); for Redis,
  redis-durability: persistence and maxmemory-policy (`durability_risks`: a warning where a min-age rule depends
  on the records); fleet-secret: the store's marker opens with the metadata secret;
- upstream:HOST, each allowed upstream: its discovery document answers over TLS verified as the proxy verifies it
  (the system's CAs and --upstream-ca-file); a certificate refused names its issuer, the CA to trust
  (`proxy.upstream.certificates`);
- clock: this host's clock against the upstreams' `Date`, within the OIDC issuers' leeway;
- with --url: proxy-ready (its /readyz) and proxy-discovery (its /.well-known/terraform.json, which it serves
  without asking an upstream).

Nothing a running proxy depends on is changed: the probes are a file and an object of their own, removed at once;
the fleet's marker is only read (a diagnosed secret must not mark a flushed store as its fleet's); the embedded
file is checked read-only (`serve` moves a damaged one aside, the doctor says so).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import ssl
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import structlog
from yarl import URL

from proxy.commands.config_files import read_issuers, read_policy, read_tokens, settings_of
from proxy.commands.doctor_report import Finding, counted, exit_code, failed, json_text, ok, text_lines, warning
from proxy.commands.healthcheck import verdict
from proxy.commands.proxy_api import ProxyClient, ProxyRequestError, ProxyUnreachableError
from proxy.domain.addresses import Hostname
from proxy.errors import ForbiddenAddressError, ProxyError, UpstreamError
from proxy.identity.issuers import DEFAULT_LEEWAY
from proxy.metadata_store.embedded import FAILURES as EMBEDDED_FAILURES
from proxy.metadata_store.embedded import integrity_problems, is_corruption
from proxy.metadata_store.factory import open_metadata
from proxy.metadata_store.fleet_secret import Standing
from proxy.protocol.discovery import MAX_REDIRECTS, discovery_url, parse_discovery, service_url
from proxy.runtime.log import setup_logging
from proxy.settings.command_line import CONFIG_ENV, resolve
from proxy.settings.config import ConfigError, Settings
from proxy.settings.values import format_size, human_size, shown_redis_url
from proxy.storage import ArchiveStore, DiskSpace, SpaceReport, archive_store
from proxy.upstream.certificates import PresentedCertificate, presented_certificate
from proxy.upstream.client import UpstreamClient, UpstreamResponse, create_ssl_context
from proxy.upstream.netguard import AddressPolicy, uses_egress_proxy

if TYPE_CHECKING:
    from proxy.governance.policy import Policy
    from proxy.identity.issuers import IssuerBook
    from proxy.metadata_store.sealed import SealedStore

CHECK_TIMEOUT = 5.0  # seconds, each check
SERVICES = ("providers.v1", "modules.v1")
PROBE = b"registry-proxy doctor probe "
_HOSTNAME_MISMATCH, _EXPIRED, _NOT_YET_VALID = 62, 10, 9  # OpenSSL's X509_V_ERR_* codes
_REACH = "check that it is reachable from here (DNS, firewall, HTTPS_PROXY), or map it with --upstream-map HOST=BASEURL"
_NTP = "synchronise this host's clock (NTP: chronyd, systemd-timesyncd)"

T = TypeVar("T")  # what a file an option names holds, read


def doctor_command(args: argparse.Namespace) -> int:
    """The `doctor` command: resolve serve's options as `serve` does, run the checks, print them; the exit code."""
    if not structlog.is_configured():  # (run inside a test's process, it logs where that process does)
        setup_logging("auto", "error")  # the stores' own warnings would repeat the lines, on stderr
    try:
        resolve(args, "serve", os.environ)
        settings = settings_of(args)
    except ConfigError as exc:
        return refused(exc, as_json=args.json)
    findings = asyncio.run(run_doctor(settings, url=args.url, ca_file=args.ca_file))
    return show([configured(args), *findings], as_json=args.json)


def refused(exc: ConfigError, *, as_json: bool = False) -> int:
    """serve's options do not parse: that one failed line (exit 2)."""
    return show([failed("configuration", str(exc), "correct the option, variable or --config key it names")], as_json)


def show(findings: list[Finding], as_json: bool) -> int:
    """Print the findings (lines, or the JSON list); the exit code they make."""
    print(json_text(findings) if as_json else "\n".join(text_lines(findings)))
    sys.stdout.flush()
    return exit_code(findings)


def configured(args: argparse.Namespace) -> Finding:
    config = args.config or os.environ.get(CONFIG_ENV)
    where = f" (flags, REGISTRY_PROXY_* variables, --config {config})" if config else ""
    return ok("configuration", f"serve's options parse{where}")


async def run_doctor(
    settings: Settings,
    *,
    url: str | None = None,
    ca_file: Path | None = None,
    clock: Callable[[], float] = time.time,
    timeout: float = CHECK_TIMEOUT,
) -> list[Finding]:
    """Every check of `settings` (and of the proxy at `url`), in the order they are shown; `clock`: this host's
    wall clock, compared with the upstreams'."""
    files, policy, issuers = await asyncio.to_thread(_files, settings)
    # the stores' libraries (a second of imports, for redis-py and aiobotocore) loaded before any check's time runs
    store = await asyncio.to_thread(_backends, settings)

    def bounded(check: str, work: Awaitable[list[Finding]], fix: str) -> Awaitable[list[Finding]]:
        return _bounded(check, work, timeout, fix)

    local, archives, metadata, running, (upstreams, dates) = await asyncio.gather(
        bounded("data-dir", _data_dir(settings), "a hung disk or network mount under --data-dir?"),
        bounded(
            "archive-store", _archive_store(settings, store), "see data-dir; for S3: --s3-endpoint-url, --s3-timeout"
        ),
        bounded("metadata-store", _metadata_store(settings, policy), "is --redis-url's server up and reachable?"),
        bounded("proxy-ready", _running_proxy(settings, url, ca_file, timeout), "is --url the proxy's?")
        if url
        else _nothing(),
        _upstreams(settings, clock, timeout),
    )
    return [*files, *local, *archives, *metadata, *upstreams, _clock(settings, issuers, dates), *running]


def _backends(settings: Settings) -> ArchiveStore:
    """The archive store (not opened), and the Redis client's library imported when Redis is configured."""
    if settings.metadata.redis_url:
        import proxy.metadata_store.redis  # noqa: F401
    return archive_store(settings)


async def _bounded(check: str, work: Awaitable[list[Finding]], timeout: float, fix: str) -> list[Finding]:
    """`work`'s findings, or one failed line when it takes longer than `timeout` or fails unforeseen."""
    try:
        async with asyncio.timeout(timeout):
            return await work
    except TimeoutError:
        return [failed(check, f"no answer within {timeout:g}s", fix)]
    except ConfigError as exc:
        return [failed(check, str(exc), "correct the option or file it names")]
    except ProxyError as exc:
        return [failed(check, exc.message, fix)]
    except Exception as exc:  # a doctor reports what it meets, never a traceback
        return [failed(check, _reason(exc), fix)]


async def _nothing() -> list[Finding]:
    return []


def _reason(exc: BaseException) -> str:
    filename = getattr(exc, "filename", None)
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return f"{filename}: {reason}" if filename else reason


# ---- the files ---------------------------------------------------------------------------------------------


def _files(settings: Settings) -> tuple[list[Finding], Policy | None, IssuerBook | None]:
    """The policy, tokens and issuers files, read as `serve` reads them; the policy and issuers when they parse."""
    policy_finding, policy = _file(
        "policy",
        settings.policy.policy_file,
        read_policy,
        lambda read: (
            f"{counted(len(read.rules), 'rule')}, {sum(r.min_age is not None for r in read.rules)} with a min-age"
        ),
        "correct the rule and key it names (`policy check FILE`)",
    )
    tokens_finding, _ = _file(
        "auth-tokens",
        settings.access.auth_tokens,
        read_tokens,
        lambda read: counted(len(read.tokens), "token"),
        "correct the entry it names (`registry-proxy token new`)",
    )
    issuers_finding, issuers = _file(
        "oidc-issuers",
        settings.access.oidc_issuers,
        read_issuers,
        lambda read: counted(len(read.issuers), "issuer"),
        "correct the issuer and key it names (docs/oidc.md)",
    )
    return [policy_finding, tokens_finding, issuers_finding], policy, issuers


def _file(
    check: str, path: Path | None, read: Callable[[Path], T], summary: Callable[[T], str], fix: str
) -> tuple[Finding, T | None]:
    """One file an option names (the option is the check's name): read as `serve` reads it, and what it holds."""
    if path is None:
        return ok(check, f"none (--{check})"), None
    try:
        parsed = read(path)
    except ConfigError as exc:
        return failed(check, str(exc), fix), None
    return ok(check, f"{path}: {summary(parsed)}"), parsed


# ---- the data dir and its disk -------------------------------------------------------------------------------


async def _data_dir(settings: Settings) -> list[Finding]:
    found, measured = await asyncio.to_thread(_writable, settings.data_dir)
    space = await DiskSpace(measured, settings.archives.min_free_space).report()
    return [found, _disk_space(settings, space, measured)]


def _writable(path: Path) -> tuple[Finding, Path]:
    """Whether `path` is a directory this user may write in (or may make); and where its disk is to be measured."""
    existing = next(folder for folder in (path, *path.parents) if folder.exists())
    if existing == path and not path.is_dir():
        return failed("data-dir", f"{path} is not a directory", "name a directory with --data-dir"), path.parent
    if existing != path:
        if os.access(existing, os.W_OK | os.X_OK):
            return ok("data-dir", f"{path} does not exist yet: serve makes it (in {existing})"), existing
        return failed(
            "data-dir",
            f"{path} does not exist, and {existing} is not writable by this user: serve cannot make it",
            "make the directory for the user that runs the proxy, or name another --data-dir",
        ), existing
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".doctor-probe-") as probe:
            probe.write(PROBE)
            probe.flush()
    except OSError as exc:
        return failed(
            "data-dir",
            f"{path} is not writable by this user: {exc.strerror or exc}",
            "give the user that runs the proxy write access (chown; in Kubernetes the volume's fsGroup), or name "
            "another --data-dir",
        ), path
    return ok("data-dir", f"{path} is a writable directory"), path


def _disk_space(settings: Settings, space: SpaceReport, where: Path) -> Finding:
    floor = human_size(space.min_free_bytes)
    free = f"{human_size(space.free_bytes)} free of {human_size(space.total_bytes)} at {where}"
    if not space.ok:
        return failed(
            "disk-space",
            f"{free}, below --min-free-space ({floor}): /readyz answers 503 and uncached archives are relayed "
            "without being stored",
            "free space or grow the disk, or lower --min-free-space",
        )
    cap, room = settings.archives.max_store_size, space.total_bytes - space.min_free_bytes
    if cap is not None and settings.archives.s3_location is None and cap > room:
        return warning(
            "disk-space",
            f"{free}: --max-store-size {format_size(cap)} is more than the disk holds above --min-free-space "
            f"({human_size(room)}), so the floor, not the cap, bounds the store",
            f"lower --max-store-size to {human_size(room)} at most, or grow the disk",
        )
    capped = f"; --max-store-size {format_size(cap)} fits" if cap is not None else ""
    return ok("disk-space", f"{free}, above --min-free-space ({floor}){capped}")


# ---- the archive store -------------------------------------------------------------------------------------


async def _archive_store(settings: Settings, store: ArchiveStore) -> list[Finding]:
    """A probe object put, read back and deleted, where `serve` keeps archives."""
    where = str(settings.archives.s3_location or settings.archive_dir)
    fix = (
        "check --archive-store, --s3-endpoint-url, --s3-region, --s3-ca-file and the AWS credentials"
        if settings.archives.s3_location
        else "see data-dir"
    )
    if settings.archives.s3_location is None and not await asyncio.to_thread(settings.data_dir.is_dir):
        return [ok("archive-store", f"{where} does not exist yet: serve makes it (see data-dir)")]
    started = time.monotonic()
    try:
        await store.open(claim=False)  # nothing of other processes touched; the probe's temp dir is its own
        try:
            problem = await _probe(store)
        finally:
            await store.close()
    except (ProxyError, OSError) as exc:
        return [failed("archive-store", f"{where}: {_reason(exc) if isinstance(exc, OSError) else exc}", fix)]
    if problem:
        return [failed("archive-store", f"{where}: {problem}", fix)]
    took = (time.monotonic() - started) * 1000
    return [ok("archive-store", f"{where}: a probe object put, read back and deleted in {took:.0f} ms")]


async def _probe(store: ArchiveStore) -> str:
    """Put, read back and delete an object of random bytes; what went wrong (empty: nothing)."""
    body = PROBE + secrets.token_hex(16).encode()
    pending = await asyncio.to_thread(store.begin)
    try:
        await asyncio.to_thread(pending.write, body)
        sha256 = await asyncio.to_thread(pending.finish)
        stored = await store.publish(pending, sha256)
    finally:
        await asyncio.to_thread(pending.discard)
    try:
        reader = await store.open_reader(stored, 0, len(body))
        try:
            read = b"".join([bytes(chunk) async for chunk in reader.chunks(1 << 16)])
        finally:
            reader.close()
    finally:
        await store.remove(sha256)
        if store.local:  # the probe's shard directories, unless an archive shares them
            await asyncio.to_thread(_remove_empty, store.path_for(sha256).parent, 2)
    if read != body:
        return f"the probe object read back as {len(read)} other bytes than the {len(body)} put"
    if await store.get(sha256) is not None:
        return "the probe object is still there after it was deleted"
    return ""


def _remove_empty(folder: Path, levels: int) -> None:
    """Remove `folder` and up to `levels - 1` of its parents while they are empty."""
    for empty in (folder, *folder.parents)[:levels]:
        try:
            empty.rmdir()
        except OSError:
            return


# ---- the metadata store ------------------------------------------------------------------------------------


async def _metadata_store(settings: Settings, policy: Policy | None) -> list[Finding]:
    if settings.metadata.redis_url:
        return await _redis(settings, policy)
    database = settings.cache_dir / "metadata.sqlite"
    if not await asyncio.to_thread(database.exists):
        return [ok("metadata-store", f"{database} is not made yet: serve makes it at its first start")]
    try:
        problems = await integrity_problems(database)
    except EMBEDDED_FAILURES as exc:
        if not is_corruption(exc):
            return [
                failed("metadata-store", f"{database} cannot be read: {exc}", "let the proxy's user read and write it")
            ]
        problems = [str(exc)]
    if problems:
        return [
            failed(
                "metadata-store",
                f"{database} is damaged (SQLite: {'; '.join(problems[:3])})",
                "serve moves it aside at its next start and begins a fresh one (the metadata is fetched again; "
                "archives are kept)",
            )
        ]
    store, _, _ = await open_metadata(settings)
    try:
        if not await store.ping():
            return [failed("metadata-store", f"{database}: {store.problem}", "see data-dir")]
        return [ok("metadata-store", f"{database} opens, and SQLite finds it whole"), await _fleet_secret(store)]
    finally:
        await store.close()


async def _redis(settings: Settings, policy: Policy | None) -> list[Finding]:
    from proxy.metadata_store.redis import RedisStore, durability_risks  # redis-py: only with Redis

    shown = shown_redis_url(settings.metadata.redis_url or "")
    store, _, backend = await open_metadata(settings)
    try:
        if not await store.ping():
            return [
                failed(
                    "metadata-store",
                    f"Redis at {shown} does not answer ({store.problem})",
                    "start it, or correct --redis-url and --redis-password (meanwhile a proxy serves without it, "
                    "/readyz degraded)",
                )
            ]
        assert isinstance(backend, RedisStore)
        config = await backend.durability()
        return [
            ok("metadata-store", f"Redis at {shown} answers (prefix {settings.metadata.redis_prefix})"),
            _durability(config, durability_risks(config), policy),
            await _fleet_secret(store),
        ]
    finally:
        await store.close()


def _durability(config: dict[str, str] | None, risks: list[str], policy: Policy | None) -> Finding:
    """Whether Redis keeps what it is given: a warning where it may lose what a min-age rule depends on."""
    described = "CONFIG GET refused"
    if config is not None:
        described = ", ".join(f"{name} {config[name]!r}" for name in ("maxmemory-policy", "save", "appendonly"))
    if not risks:
        return ok("redis-durability", f"{described}: it keeps the records no TTL expires")
    if policy is not None and policy.ages:
        return warning(
            "redis-durability",
            f"{'; '.join(risks)}; and a min-age rule of --policy depends on those records (lost, the versions' "
            "ages are unknown and held back)",
            "give Redis persistence (appendonly yes, or RDB save points) and maxmemory-policy noeviction or "
            "volatile-*; after a loss, `registry-proxy policy baseline`",
        )
    return ok("redis-durability", f"{described}: a cache, which no min-age rule of --policy depends on")


async def _fleet_secret(store: SealedStore) -> Finding:
    """Whether the store's secret marker opens with this proxy's secret (read only: none is written)."""
    assert store.fleet is not None
    standing = await store.fleet.inspect()
    if standing is None:
        return ok("fleet-secret", "no marker yet: the first proxy to start writes it, sealed with its secret")
    if standing is Standing.OWN:
        return ok("fleet-secret", "the store's marker opens with this proxy's metadata secret")
    if standing is Standing.ACCEPTED:
        return warning(
            "fleet-secret",
            "the store's marker opens only with --metadata-secret-accepted: a rotation is under way",
            'finish it with `registry-proxy rotate-secret` (docs/operations.md, "Rotating the metadata secret")',
        )
    return failed(
        "fleet-secret",
        f"{store.fleet.mismatch}: a proxy so configured neither reads nor writes the store, and /readyz answers 503",
        "give it the fleet's --metadata-secret (every replica the same); to change it, rotate it "
        '(docs/operations.md, "Rotating the metadata secret")',
    )


# ---- the upstreams and the clock ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ClockReading:
    """An upstream's `Date` against this host's clock: how far ahead it is (negative: behind), and the error of
    that measure (the header's one-second steps, half the round trip)."""

    host: str
    ahead: float
    error: float

    @property
    def beyond(self) -> float:
        """The skew that is certain, whatever the error."""
        return max(0.0, abs(self.ahead) - self.error)


async def _upstreams(
    settings: Settings, clock: Callable[[], float], timeout: float
) -> tuple[list[Finding], list[ClockReading]]:
    upstreams = settings.upstreams
    if upstreams.offline:
        return [ok("upstreams", "--offline: no upstream is contacted")], []
    try:
        tls = await asyncio.to_thread(create_ssl_context, upstreams.upstream_ca_file)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        reason = exc.reason.lower().replace("_", " ") if isinstance(exc, ssl.SSLError) and exc.reason else _reason(exc)
        return [
            failed(
                "upstream-ca-file",
                f"--upstream-ca-file {upstreams.upstream_ca_file}: not a readable PEM bundle of CA certificates "
                f"({reason})",
                "name a file of PEM certificates (-----BEGIN CERTIFICATE-----)",
            )
        ], []
    limits = replace(settings.limits, metadata_timeout=timeout * 0.75)  # the rest for the certificate's issuer
    client = UpstreamClient.create(
        AddressPolicy(upstreams.private_host_exceptions), limits, tls, credentials=upstreams.upstream_credentials
    )
    try:
        outcomes = await asyncio.gather(
            *(_upstream(settings, client, tls, host, clock, timeout) for host in sorted(upstreams.all_allowed_hosts))
        )
    finally:
        await client.close()
    return [finding for finding, _ in outcomes], [reading for _, reading in outcomes if reading is not None]


async def _upstream(
    settings: Settings,
    client: UpstreamClient,
    tls: ssl.SSLContext,
    host: str,
    clock: Callable[[], float],
    timeout: float,
) -> tuple[Finding, ClockReading | None]:
    """The discovery document of `host`, fetched as the proxy fetches it; its `Date` against `clock`."""
    check = f"upstream:{host}"
    hostname = Hostname.parse(host)
    url = discovery_url(hostname, settings.upstreams.upstream_map)
    give_up = asyncio.get_running_loop().time() + timeout
    try:
        async with asyncio.timeout(timeout):
            sent = clock()
            answer = await client.get(url, max_bytes=settings.limits.max_discovery_bytes, max_redirects=MAX_REDIRECTS)
            received = clock()
    except TimeoutError:
        return failed(check, f"{url} did not answer within {timeout:g}s", _REACH), None
    except UpstreamError as exc:
        left = give_up - asyncio.get_running_loop().time()
        return await _unreachable(settings, check, url, exc, tls, max(left, 0.5)), None
    except Exception as exc:  # a doctor reports what it meets, never a traceback
        return failed(check, f"{url}: {_reason(exc)}", _REACH), None
    return _discovered(check, url, hostname, answer, received - sent), _reading(host, answer, sent, received)


def _discovered(check: str, url: URL, hostname: Hostname, answer: UpstreamResponse, took: float) -> Finding:
    if answer.status != 200:
        return failed(
            check,
            f"{url} answered {answer.status}: no registry there",
            "check the host's name, or point --upstream-map HOST=BASEURL at the registry",
        )
    try:
        services = parse_discovery(answer.body, answer.content_type, hostname)
        offered = [name for name in SERVICES if name in services]
        for name in offered:
            service_url(services, name, answer.final_url, hostname)
    except UpstreamError as exc:
        return failed(check, exc.message, "the upstream's discovery document is not one a registry serves")
    if not offered:
        return failed(check, f"{url} offers neither providers.v1 nor modules.v1", "is it a registry?")
    what = f"{url} answered ({', '.join(offered)}) in {took * 1000:.0f} ms"
    if url.scheme == "http":
        return warning(
            check,
            f"{what}, over plain http: nothing it answers is authenticated",
            "map it to https:// (with --upstream-ca-file for an internal CA)",
        )
    return ok(check, f"{what}, its TLS certificate verified")


async def _unreachable(
    settings: Settings, check: str, url: URL, exc: UpstreamError, tls: ssl.SSLContext, bound: float
) -> Finding:
    """The line of an upstream that could not be asked; a certificate refused names its issuer."""
    if isinstance(exc, ForbiddenAddressError):
        return failed(
            check,
            exc.message,
            "an internal registry? allow its address with --allow-private-host HOST (or map it with --upstream-map)",
        )
    presented = None
    if url.scheme == "https" and url.host and not uses_egress_proxy(url):
        try:
            async with asyncio.timeout(bound):
                presented = await presented_certificate(url.host, url.port or 443, tls)
        except (OSError, TimeoutError, ssl.SSLError, ValueError):
            presented = None
    if presented is None or presented.verified:
        return failed(check, exc.message, _REACH)
    return failed(check, *_refused_certificate(settings, url, presented))


def _refused_certificate(settings: Settings, url: URL, presented: PresentedCertificate) -> tuple[str, str]:
    """The detail and the fix of a certificate the proxy's trust refuses."""
    what = f"the TLS certificate of {url.host} is refused ({presented.error})"
    if presented.code == _HOSTNAME_MISMATCH:
        return (
            f"{what}: it is for {presented.subject or 'another name'}",
            f"the upstream must present a certificate for {url.host}, or --upstream-map the host to a name its "
            "certificate has",
        )
    if presented.code in (_EXPIRED, _NOT_YET_VALID):
        return what, f"the upstream must renew its certificate, or this host's clock is wrong (see clock): {_NTP}"
    ca_file = settings.upstreams.upstream_ca_file
    held = f" ({ca_file} does not hold it)" if ca_file else ""
    return (
        f"{what}: it was issued by {presented.issuer or 'an unnamed issuer'}",
        f"trust that CA: add its certificate (PEM) to --upstream-ca-file{held}",
    )


def _reading(host: str, answer: UpstreamResponse, sent: float, received: float) -> ClockReading | None:
    try:
        said = parsedate_to_datetime(answer.date).timestamp() if answer.date else None
    except (TypeError, ValueError):
        said = None
    if said is None:
        return None
    # the header counts whole seconds: the upstream's time was in [said, said + 1) when it answered
    return ClockReading(host, said + 0.5 - (sent + received) / 2, 0.5 + (received - sent) / 2)


def _clock(settings: Settings, issuers: IssuerBook | None, readings: list[ClockReading]) -> Finding:
    """This host's clock against the upstreams': beyond the OIDC leeway, workload tokens are refused."""
    if settings.upstreams.offline:
        return ok("clock", "not compared: --offline")
    if not readings:
        return warning("clock", "not compared: no upstream answered with a Date", "see the upstream lines")
    oidc = issuers is not None and bool(issuers.issuers)
    leeway = min((issuer.leeway for issuer in issuers.issuers), default=DEFAULT_LEEWAY) if oidc else DEFAULT_LEEWAY
    worst = max(readings, key=lambda reading: reading.beyond)
    said = f"leeway {leeway:g}s" if oidc else f"the default OIDC leeway of {leeway:g}s"
    if worst.beyond <= leeway:
        skew = max(abs(reading.ahead) for reading in readings)
        return ok("clock", f"within {skew:.1f}s of the Date of {counted(len(readings), 'upstream')} ({said})")
    direction = "behind" if worst.ahead > 0 else "ahead of"
    detail = f"this host's clock is {abs(worst.ahead):.0f}s {direction} {worst.host}'s Date, beyond the {said}"
    if oidc:
        return failed("clock", f"{detail}: workload tokens are refused as expired or not yet valid", _NTP)
    return warning("clock", f"{detail}: min-age ages and expiries are counted off, OIDC tokens would be refused", _NTP)


# ---- a running proxy ---------------------------------------------------------------------------------------


async def _running_proxy(settings: Settings, url: str, ca_file: Path | None, timeout: float) -> list[Finding]:
    """/readyz of the proxy at `url`, and its discovery document (served without asking an upstream)."""
    generated = settings.tls_dir / "ca.pem"
    if ca_file is None and settings.tls.tls_cert is None and not settings.tls.plain_http and generated.exists():
        ca_file = generated  # the CA `serve` made for its certificate
    fix = "start it, or correct --url (and --ca-file for its TLS)"
    try:
        client = ProxyClient(url, ca_file, timeout=timeout)
    except ProxyUnreachableError as exc:
        return [failed("proxy-ready", str(exc), fix)]
    try:
        async with client:
            status, body = await client.readiness()
            ready, line = verdict(str(client.url("readyz")), status, body)
            line = line.removeprefix("unhealthy: ")
            if line.startswith("ready:"):
                found = [ok("proxy-ready", line)]
            elif ready:
                found = [warning("proxy-ready", line, "see metadata-store")]
            else:
                found = [failed("proxy-ready", line, "see the lines above: data-dir, disk-space, fleet-secret")]
            found.append(await _served_discovery(client))
            return found
    except ProxyUnreachableError as exc:
        return [failed("proxy-ready", str(exc), fix)]


async def _served_discovery(client: ProxyClient) -> Finding:
    where = client.url(".well-known/terraform.json")
    try:
        document = await client.json(".well-known/terraform.json")
    except ProxyRequestError as exc:
        return failed("proxy-discovery", f"{where} answered {exc.status}: {exc.message}", "see its log")
    if not isinstance(document, dict) or not isinstance(document.get("providers.v1"), str):
        return failed("proxy-discovery", f"{where} is no discovery document", "is --url a registry-proxy?")
    return ok("proxy-discovery", f"{where} serves providers.v1 at {document['providers.v1']}")
