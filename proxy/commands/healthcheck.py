"""`registry-proxy healthcheck`: ask the local proxy's `/readyz`, for container and service health checks.

It reads the same settings as `serve` (`--listen`, `--plain-http`, `--tls-cert`, `--data-dir`, or their
REGISTRY_PROXY_* variables), so the image's HEALTHCHECK follows whatever the container was started with.
Over TLS it trusts `--ca-file` if given, else the generated CA in DATA_DIR/tls, else the configured
`--tls-cert` itself (pinned: the probe connects by address, which that certificate need not name).
Exit 0 when `/readyz` answers 200 (ready, or degraded but serving), 1 otherwise; one line either way
(Docker reserves exit code 2, so even a bad setting exits 1).
"""

from __future__ import annotations

import http.client
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from proxy.protocol.safe_json import loads as load_json
from proxy.settings.config import ConfigError, Settings

_WILDCARDS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}


@dataclass(frozen=True)
class Probe:
    """Where and how to reach the local proxy's `/readyz`."""

    host: str
    port: int
    context: ssl.SSLContext | None
    timeout: float

    @property
    def url(self) -> str:
        return f"{'https' if self.context else 'http'}://{_address(self.host, self.port)}/readyz"


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _nothing_listens(host: str, port: int) -> str:
    return f"unhealthy: nothing listens at {_address(host, port)} (connection refused): is the proxy running there?"


def _probe_host(args) -> str:
    return _WILDCARDS.get(args.listen.host, args.listen.host)


def probe_from_args(args) -> Probe:
    """The probe for the parsed healthcheck options (raises ConfigError)."""
    host = _probe_host(args)
    if args.plain_http:
        return Probe(host, args.listen.port, None, args.timeout)
    context = _client_context(Settings(data_dir=args.data_dir).tls_dir, args.tls_cert, args.ca_file)
    return Probe(host, args.listen.port, context, args.timeout)


def _client_context(tls_dir: Path, tls_cert: Path | None, ca_file: Path | None) -> ssl.SSLContext:
    if ca_file is not None:
        context = _trusting(ca_file, "--ca-file")
        context.check_hostname = False  # an operator's CA: its certificate may not name the loopback address
        return context
    if tls_cert is None:
        # the generated server certificate names localhost, 127.0.0.1 and ::1: verified in full
        return _trusting(tls_dir / "ca.pem", "the generated CA (is --data-dir the server's?)")
    context = _trusting(tls_cert, "--tls-cert")
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the configured certificate itself is the anchor
    context.check_hostname = False
    return context


def _trusting(path: Path, what: str) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=str(path))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None


def check(probe: Probe) -> tuple[bool, str]:
    """GET /readyz once: (healthy, the one line to print)."""
    if probe.context is None:
        connection = http.client.HTTPConnection(probe.host, probe.port, timeout=probe.timeout)
    else:
        connection = http.client.HTTPSConnection(probe.host, probe.port, timeout=probe.timeout, context=probe.context)
    try:
        connection.request("GET", "/readyz", headers={"User-Agent": "registry-proxy-healthcheck"})
        response = connection.getresponse()
        body = response.read(65536)
    except ssl.SSLError as exc:
        return False, f"unhealthy: TLS to {probe.url} failed: {exc.reason or exc}"
    except ConnectionRefusedError:
        return False, _nothing_listens(probe.host, probe.port)
    except TimeoutError:
        return False, f"unhealthy: {probe.url} did not answer within {probe.timeout:g}s"
    except (OSError, http.client.HTTPException) as exc:
        return False, f"unhealthy: cannot reach {probe.url}: {getattr(exc, 'strerror', None) or exc}"
    finally:
        connection.close()
    return verdict(probe.url, response.status, body)


def verdict(url: str, status: int, body: bytes) -> tuple[bool, str]:
    """(healthy, the one line) of a `/readyz` answer: 200 is healthy (ready, or degraded but serving)."""
    try:
        document = load_json(body)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        return False, f"unhealthy: {url} answered {status} without a readiness document"
    state = str(document.get("status", "unknown"))
    reasons = document.get("reasons") or {}
    failed = [name for name, ok in (document.get("checks") or {}).items() if not ok]
    detail = "; ".join(f"{name}: {why}" for name, why in reasons.items()) if isinstance(reasons, dict) else ""
    if not detail and failed:
        detail = "failed checks: " + ", ".join(sorted(failed))
    line = f"{state}: {url} answered {status}" + (f" ({detail})" if detail else "")
    return status == 200, line if status == 200 else f"unhealthy: {line}"


def run(args) -> int:
    """The `healthcheck` command: print one line, return 0 when ready, else 1."""
    try:
        healthy, line = check(probe_from_args(args))
    except ConfigError as exc:  # the CA it would trust cannot be read: first, does anything listen?
        host = _probe_host(args)
        if _refused(host, args.listen.port, args.timeout):
            print(f"registry-proxy healthcheck: {_nothing_listens(host, args.listen.port)}")
            return 1
        return refused(exc)
    print(f"registry-proxy healthcheck: {line}")
    return 0 if healthy else 1


def _refused(host: str, port: int, timeout: float) -> bool:
    """Whether a connection to HOST:PORT is refused (nothing listens there)."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


def refused(exc: ConfigError) -> int:
    """A bad setting: the one unhealthy line, and exit 1 (Docker reserves 2)."""
    print(f"registry-proxy healthcheck: unhealthy: {exc}")
    return 1
