"""A small client for a running registry-proxy, used by the `lock` and `warm` commands.

TLS trust comes from `--ca-file`, else `SSL_CERT_FILE`, else the system store, so the
same set-up that makes `terraform` trust the proxy makes these commands trust it. A client
token (`--token`, for a proxy with `--auth-tokens`) is sent with every request, all to the proxy.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from yarl import URL

from proxy import __version__
from proxy.domain.addresses import AddressError, ModuleAddr, Platform, ProviderAddr, Version
from proxy.protocol.safe_json import JSONDocumentError
from proxy.protocol.safe_json import loads as load_json
from proxy.settings.values import ConfigError, parse_base_url


class ProxyRequestError(Exception):
    """The proxy answered with an error (its message is kept; a policy's refusal: its rule and reason too)."""

    def __init__(self, status: int, message: str, rule: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.rule = rule
        self.reason = reason


class ProxyUnreachableError(Exception):
    """The proxy cannot be used at all: a bad URL, a CA file that cannot be read, no connection, an
    untrusted certificate. The message is one line for the user."""


class ProxyClient:
    def __init__(
        self, base_url: str, ca_file: Path | None = None, timeout: float = 3600, token: str | None = None
    ) -> None:
        self.base = _base_url(base_url)
        cafile = str(ca_file) if ca_file else os.environ.get("SSL_CERT_FILE")
        try:
            context = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
        except (OSError, ssl.SSLError) as exc:
            source = "--ca-file" if ca_file else "SSL_CERT_FILE"
            raise ProxyUnreachableError(
                f"cannot read the CA file {cafile} ({source}): {getattr(exc, 'strerror', None) or exc}"
            ) from None
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context, limit=32),
            timeout=aiohttp.ClientTimeout(total=timeout, connect=30),
            headers={
                "User-Agent": f"registry-proxy-cli/{__version__}",
                **({"Authorization": f"Bearer {token}"} if token else {}),
            },
        )

    async def __aenter__(self) -> ProxyClient:
        try:
            await self.probe()
        except BaseException:
            await self._session.close()
            raise
        return self

    async def probe(self) -> None:
        """Check that the proxy answers at its URL over trusted TLS (before any work starts); an http:// URL of
        a port that speaks TLS is said to be one, with the https:// URL to give instead."""
        try:
            async with self._request(self.url("healthz")) as response:
                await response.read()
        except ProxyUnreachableError as exc:
            if self.base.scheme == "http" and await _speaks_tls(self.base.host or "", self.base.port or 80):
                raise ProxyUnreachableError(
                    f"{exc}: {self.base.host}:{self.base.port} speaks TLS: use --proxy {self.base.with_scheme('https')}"
                ) from None
            raise
        if response.status != 200:
            raise ProxyUnreachableError(
                f"{self.base} does not look like a registry-proxy: GET /healthz answered HTTP {response.status}"
            )

    async def readiness(self) -> tuple[int, bytes]:
        """GET /readyz: its status and body (a 503, not ready, is an answer too)."""
        async with self._request(self.url("readyz")) as response:
            return response.status, await response.read()

    @asynccontextmanager
    async def _request(
        self, url: URL, params: list[tuple[str, str]] | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A GET whose connection failures become ProxyUnreachableError with one clear line."""
        try:
            async with self._session.get(url, params=params) as response:
                yield response
        except aiohttp.ClientConnectorCertificateError as exc:
            raise ProxyUnreachableError(
                f"the TLS certificate of {self.base} is not trusted ({exc.certificate_error}); "
                "give its CA with --ca-file or SSL_CERT_FILE"
            ) from None
        except aiohttp.ClientConnectorError as exc:
            raise ProxyUnreachableError(
                f"cannot connect to the proxy at {self.base}: {exc.os_error.strerror or exc}"
            ) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise ProxyUnreachableError(
                f"the connection to the proxy at {self.base} failed: {str(exc) or type(exc).__name__}"
            ) from None

    async def __aexit__(self, *exc: object) -> None:
        await self._session.close()

    def url(self, path: str) -> URL:
        return self.base.join(URL(path.lstrip("/"), encoded=True))

    async def json(self, path: str, params: list[tuple[str, str]] | None = None) -> Any:
        async with self._request(self.url(path), params) as response:
            body = await response.read()
            if response.status != 200:
                raise _request_error(response.status, body)
            try:
                return load_json(body)
            except JSONDocumentError as exc:
                raise ProxyRequestError(response.status, f"the proxy's answer {exc}") from None

    async def provider_versions(self, addr: ProviderAddr) -> list[Version]:
        document = await self.json(f"mirror/v1/{_path(addr)}/index.json")
        versions = []
        for text in document.get("versions") or {}:
            try:
                versions.append(Version.parse(text))
            except AddressError:
                continue
        return versions

    async def provider_warnings(self, addr: ProviderAddr) -> list[str]:
        """The `warnings` of the registry protocol's version list (the proxy names there the versions its policy
        withholds from this client, and why)."""
        host, namespace, type_ = (quote(part, safe="") for part in (str(addr.hostname), addr.namespace, addr.type))
        document = await self.json(f"registry/{host}/providers/v1/{namespace}/{type_}/versions")
        return [w for w in document.get("warnings") or [] if isinstance(w, str)]

    async def lock_hashes(self, addr: ProviderAddr, version: Version, platforms: list[Platform]) -> dict[str, Any]:
        return await self.json(f"lock/v1/{_path(addr)}/{version}", [("platform", str(p)) for p in platforms])

    async def version_archives(self, addr: ProviderAddr, version: Version) -> dict[str, Any]:
        return (await self.json(f"mirror/v1/{_path(addr)}/{version}.json")).get("archives") or {}

    async def module_versions(self, addr: ModuleAddr) -> list[Version]:
        document = await self.json(f"{_module_path(addr)}/versions")
        versions = []
        for module in document.get("modules") or []:
            for entry in module.get("versions") or []:
                try:
                    versions.append(Version.parse(entry.get("version", "")))
                except AddressError:
                    continue
        return versions

    async def module_location(self, addr: ModuleAddr, version: Version) -> str:
        return (await self.json(f"{_module_path(addr)}/{version}/download")).get("location") or ""

    async def download(self, path: str, progress: Callable[[int], None] | None = None, base: URL | None = None) -> int:
        """GET a file and discard it, reporting bytes as they arrive; returns the size."""
        url = (base or self.base).join(URL(path, encoded=True)) if not path.startswith("/") else self.url(path)
        async with self._request(url) as response:
            if response.status != 200:
                raise _request_error(response.status, await response.read())
            total = 0
            async for chunk in response.content.iter_chunked(1 << 20):
                total += len(chunk)
                if progress:
                    progress(len(chunk))
            return total


async def _speaks_tls(host: str, port: int, timeout: float = 5) -> bool:
    """Whether HOST:PORT completes a TLS handshake (its certificate unchecked: only the protocol is asked)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=context), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


def _base_url(text: str) -> URL:
    """The proxy's base URL, which must be an absolute http(s) URL (`--proxy` is read so already; this client
    may be given any text)."""
    try:
        parse_base_url(text)
    except ConfigError as exc:
        raise ProxyUnreachableError(f"invalid --proxy {text!r}: {exc}") from None
    return URL(text.strip().rstrip("/") + "/")


def _path(addr: ProviderAddr) -> str:
    return "/".join(quote(part, safe="") for part in (str(addr.hostname), addr.namespace, addr.type))


def _module_path(addr: ModuleAddr) -> str:
    parts = (addr.namespace, addr.name, addr.system)
    return f"registry/{quote(str(addr.hostname), safe='')}/modules/v1/" + "/".join(quote(p, safe="") for p in parts)


def _request_error(status: int, body: bytes) -> ProxyRequestError:
    """The error of an answer with `status`: the messages of its `{"errors": [...]}` body, and the rule and reason
    of a policy's refusal."""
    try:
        document = load_json(body)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        return ProxyRequestError(status, f"HTTP {status}")
    errors = document.get("errors")
    message = "; ".join(str(e) for e in errors) if isinstance(errors, list) and errors else f"HTTP {status}"
    rule, reason = document.get("rule"), document.get("reason")
    if isinstance(rule, str) and isinstance(reason, str):
        return ProxyRequestError(status, message, rule, reason)
    return ProxyRequestError(status, message)
