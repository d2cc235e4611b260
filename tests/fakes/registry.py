"""A fake upstream registry that speaks the real protocols over HTTPS.

Serves discovery, `providers.v1` (versions, download metadata) and the release files
(archives, SHA256SUMS, signatures) with real GPG signatures, and the public registry's
per-version documents (`published_at`) and a SHA256SUMS `Last-Modified` where a test sets
them; records every request; and
has fault knobs: per-path status/body/content type/delay, tampered archives, swapped
signing keys, slow archive streaming, trickling (bytes per second) and stalling archives,
archives held after their headers until the test releases them, any answer held until a test's
gate opens (`gates`), archives without a Content-Length (chunked), and a round-trip latency added
to every answer (`latency`, a WAN stand-in: the same for every client) with a timeline of each
request's arrival and answer (`timeline`). A private registry (`require_token`) answers 401
unless a request carries its token (as a bearer token, or as git's basic-auth password); every request's
`Authorization` header is recorded (`authorizations`).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from tests.fakes.packages import Release


@dataclass
class ModuleRelease:
    """A module version: where its download answer points, and how the answer is shaped.

    `answer`: "header" (204 + X-Terraform-Get), "json" (200 + {"location"}), "both".
    """

    namespace: str
    name: str
    system: str
    version: str
    location: str
    answer: str = "header"


@dataclass
class Fault:
    status: int | None = None
    body: bytes | None = None
    content_type: str = "application/json"
    delay: float = 0.0
    headers: dict[str, str] | None = None


@dataclass(frozen=True)
class Served:
    """One request as the registry saw it: wall-clock arrival and answer (`time.time()`: comparable with
    the proxy's log timestamps), the answer's end for a streamed archive."""

    method: str
    path: str
    arrived: float
    answered: float
    status: int


@dataclass
class Hold:
    """An archive answer held after its headers: `started` is set once they went out (the
    download is under way), the body follows when the test sets `release`."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


class FakeRegistry:
    """An HTTPS registry on 127.0.0.1; `url` is its base, e.g. `https://127.0.0.1:PORT`."""

    def __init__(self, ssl_context: ssl.SSLContext, host: str = "127.0.0.1") -> None:
        self._ssl = ssl_context
        self.host = host
        self.port = 0
        self.releases: dict[tuple[str, str], dict[str, Release]] = {}
        self.requests: list[tuple[str, str]] = []
        self.faults: dict[str, Fault] = {}
        self.tampered: set[str] = set()
        self.signing_keys_override: list[str] | None = None  # [] lists no keys (an unsigned provider)
        self.omit_signing_keys = False  # the download answer has no `signing_keys` at all
        self.files_base: str | None = None
        self.extra_download_fields: dict = {}
        self.archive_chunk_delay = 0.0
        self.trickle: dict[str, int] = {}  # archive path -> bytes per second
        self.stall: dict[str, int] = {}  # archive path -> bytes sent before the answer stalls for good
        self.holds: dict[str, Hold] = {}  # archive path -> its answer waits for the test after the headers
        self.gates: dict[str, asyncio.Event] = {}  # any path -> its answer waits until the test sets the event
        self.completed: list[tuple[str, str]] = []  # requests whose handler returned, in order
        self.latency = 0.0  # seconds every answer waits before it is made (a WAN round trip)
        self.timeline: list[Served] = []
        self.chunked_archives = False  # send provider archives chunked, without a Content-Length
        self.discovery: dict[str, str] = {"providers.v1": "/v1/providers/", "modules.v1": "/v1/modules/"}
        self.modules: dict[tuple[str, str, str], dict[str, ModuleRelease]] = {}
        self.static: dict[str, bytes] = {}
        self.git_root: Path | None = None
        self.require_token: str | None = None
        # The public registry's per-version documents (`GET /v1/providers/NS/TYPE/VERSION`, `GET
        # /v1/modules/NS/NAME/SYSTEM/VERSION`): their `published_at` by (NS, TYPE, VERSION) or (NS, NAME, SYSTEM,
        # VERSION); a listed version without one answers a document without a date.
        self.published_at: dict[tuple[str, ...], str] = {}
        self.sums_last_modified: dict[tuple[str, str, str], str] = {}  # (NS, TYPE, VERSION) -> Last-Modified
        self.authorizations: list[tuple[str, str | None]] = []  # (path, Authorization header) per request
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def add(self, release: Release) -> Release:
        self.releases.setdefault((release.namespace, release.type), {})[release.version] = release
        return release

    def add_module(self, release: ModuleRelease) -> ModuleRelease:
        self.modules.setdefault((release.namespace, release.name, release.system), {})[release.version] = release
        return release

    def count(self, path: str, method: str = "GET") -> int:
        return Counter(self.requests)[(method, path)]

    def completed_count(self, path: str, method: str = "GET") -> int:
        """How many requests for `path` have been answered (not just received)."""
        return Counter(self.completed)[(method, path)]

    def hold(self, path: str) -> Hold:
        """Hold every answer for the archive at `path` after its headers until `release` is set."""
        return self.holds.setdefault(path, Hold())

    def archive_path(self, release: Release, platform: str) -> str:
        return f"/files/{release.namespace}/{release.type}/{release.version}/{release.filename(platform)}"

    # ---- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application(middlewares=[self._record_and_fault])
        app.router.add_get("/.well-known/terraform.json", self._discovery)
        app.router.add_get("/v1/providers/{ns}/{type}/versions", self._versions)
        app.router.add_get("/v1/providers/{ns}/{type}/{version}", self._provider_version)
        app.router.add_get("/v1/providers/{ns}/{type}/{version}/download/{os}/{arch}", self._download)
        app.router.add_get("/files/{ns}/{type}/{version}/{name}", self._file)
        app.router.add_get("/v1/modules/{ns}/{name}/{system}/versions", self._module_versions)
        app.router.add_get("/v1/modules/{ns}/{name}/{system}/{version}", self._module_version)
        app.router.add_get("/v1/modules/{ns}/{name}/{system}/{version}/download", self._module_download)
        app.router.add_get("/static/{path:.+}", self._static)
        app.router.add_get("/git/{path:.+}", self._git)
        # Slow or trickling handlers must not hold a test's teardown for aiohttp's default 60 s.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self._ssl, reuse_address=True)
        await site.start()
        if not self.port:
            self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---- handlers ---------------------------------------------------------------------

    @web.middleware
    async def _record_and_fault(self, request: web.Request, handler):
        arrived = time.time()
        status = 500
        try:
            response = await self._answer(request, handler)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            self.timeline.append(Served(request.method, request.path, arrived, time.time(), status))

    async def _answer(self, request: web.Request, handler):
        self.requests.append((request.method, request.path))
        if self.latency:
            await asyncio.sleep(self.latency)
        gate = self.gates.get(request.path)
        if gate is not None:
            await gate.wait()
        self.authorizations.append((request.path, request.headers.get("Authorization")))
        if self.require_token is not None and not self._authorized(request.headers.get("Authorization", "")):
            return web.json_response(
                {"errors": ["Unauthorized"]}, status=401, headers={"WWW-Authenticate": 'Basic realm="fake"'}
            )
        fault = self.faults.get(request.path)
        if fault is not None:
            if fault.delay:
                await asyncio.sleep(fault.delay)
            if fault.status is not None or fault.body is not None:
                self.completed.append((request.method, request.path))
                return web.Response(
                    status=fault.status or 200,
                    body=fault.body or b"",
                    headers={"Content-Type": fault.content_type, **(fault.headers or {})},
                )
        response = await handler(request)
        self.completed.append((request.method, request.path))
        return response

    def _authorized(self, header: str) -> bool:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer":
            return value == self.require_token
        if scheme.lower() == "basic":
            return base64.b64decode(value).decode(errors="replace").partition(":")[2] == self.require_token
        return False

    def with_authorization(self) -> list[str]:
        """The paths of the requests that carried an Authorization header."""
        return [path for path, header in self.authorizations if header is not None]

    async def _discovery(self, request: web.Request) -> web.Response:
        return web.json_response(self.discovery)

    def _release_set(self, request: web.Request) -> dict[str, Release]:
        releases = self.releases.get((request.match_info["ns"], request.match_info["type"]))
        if not releases:
            raise web.HTTPNotFound(text='{"errors":["Not Found"]}', content_type="application/json")
        return releases

    async def _versions(self, request: web.Request) -> web.Response:
        releases = self._release_set(request)
        return web.json_response(
            {
                "versions": [
                    {
                        "version": r.version,
                        "protocols": ["5.0"],
                        "platforms": [{"os": p.split("_")[0], "arch": p.split("_")[1]} for p in r.platforms],
                    }
                    for r in releases.values()
                ]
            }
        )

    def _version_document(self, request: web.Request, listed: bool, *address: str) -> web.Response:
        """A per-version document of the public registry's API (not part of providers.v1 or modules.v1)."""
        if not listed:
            raise web.HTTPNotFound(text='{"errors":["Not Found"]}', content_type="application/json")
        version = request.match_info["version"]
        document = {"id": "/".join((*address, version)), "version": version}
        published = self.published_at.get((*address, version))
        if published is not None:
            document["published_at"] = published
        return web.json_response(document)

    async def _provider_version(self, request: web.Request) -> web.Response:
        info = request.match_info
        listed = info["version"] in self._release_set(request)
        return self._version_document(request, listed, info["ns"], info["type"])

    async def _module_version(self, request: web.Request) -> web.Response:
        info = request.match_info
        listed = info["version"] in self._module_set(request)
        return self._version_document(request, listed, info["ns"], info["name"], info["system"])

    async def _download(self, request: web.Request) -> web.Response:
        release = self._release_set(request).get(request.match_info["version"])
        platform = f"{request.match_info['os']}_{request.match_info['arch']}"
        if release is None or platform not in release.platforms:
            raise web.HTTPNotFound(text='{"errors":["Not Found"]}', content_type="application/json")
        files = self.files_base or self.url
        prefix = f"{files}/files/{release.namespace}/{release.type}/{release.version}"
        keys = [release.key.armored_public_key] if self.signing_keys_override is None else self.signing_keys_override
        document = {
            "protocols": ["5.0"],
            "os": request.match_info["os"],
            "arch": request.match_info["arch"],
            "filename": release.filename(platform),
            "download_url": f"{prefix}/{release.filename(platform)}",
            "shasums_url": f"{prefix}/{release.shasums_name}",
            "shasums_signature_url": f"{prefix}/{release.shasums_name}.sig",
            "shasum": release.sha256(platform),
            "signing_keys": {"gpg_public_keys": [{"key_id": "X", "ascii_armor": k} for k in keys]},
            **self.extra_download_fields,
        }
        if self.omit_signing_keys:
            del document["signing_keys"]
        return web.json_response(document)

    def _module_set(self, request: web.Request) -> dict[str, ModuleRelease]:
        info = request.match_info
        releases = self.modules.get((info["ns"], info["name"], info["system"]))
        if not releases:
            raise web.HTTPNotFound(text='{"errors":["Not Found"]}', content_type="application/json")
        return releases

    async def _module_versions(self, request: web.Request) -> web.Response:
        releases = self._module_set(request)
        return web.json_response({"modules": [{"versions": [{"version": v} for v in releases]}]})

    async def _module_download(self, request: web.Request) -> web.Response:
        release = self._module_set(request).get(request.match_info["version"])
        if release is None:
            raise web.HTTPNotFound(text='{"errors":["Not Found"]}', content_type="application/json")
        location = release.location.replace("{base}", self.url)
        if release.answer == "header":
            return web.Response(status=204, headers={"X-Terraform-Get": location})
        headers = {"X-Terraform-Get": location} if release.answer == "both" else {}
        return web.json_response({"location": location}, headers=headers)

    async def _static(self, request: web.Request) -> web.Response:
        body = self.static.get(request.match_info["path"])
        if body is None:
            raise web.HTTPNotFound()
        return web.Response(body=body, content_type="application/octet-stream")

    async def _git(self, request: web.Request) -> web.StreamResponse:
        """git's dumb HTTP protocol: plain files of a bare repository (after `git update-server-info`)."""
        if self.git_root is None:
            raise web.HTTPNotFound()
        path = (self.git_root / request.match_info["path"]).resolve()
        if not path.is_relative_to(self.git_root.resolve()) or not path.is_file():
            raise web.HTTPNotFound()
        return web.Response(body=path.read_bytes(), content_type="application/octet-stream")

    async def _file(self, request: web.Request) -> web.StreamResponse:
        release = self._release_set(request).get(request.match_info["version"])
        name = request.match_info["name"]
        if release is None:
            raise web.HTTPNotFound()
        if name == release.shasums_name:
            dated = self.sums_last_modified.get((release.namespace, release.type, release.version))
            headers = {"Last-Modified": dated} if dated else None
            return web.Response(body=release.shasums, content_type="text/plain", headers=headers)
        if name == release.shasums_name + ".sig":
            return web.Response(body=release.signature, content_type="application/octet-stream")
        platform = next((p for p in release.platforms if release.filename(p) == name), None)
        if platform is None:
            raise web.HTTPNotFound()
        body = release.zips[platform]
        if name in self.tampered:
            body = body[:-1] + bytes([body[-1] ^ 0xFF])
        response = web.StreamResponse(headers={"Content-Type": "application/zip"})
        if self.chunked_archives:
            response.enable_chunked_encoding()
        else:
            response.content_length = len(body)
        await response.prepare(request)
        if request.method == "HEAD":  # terraform's go-getter sends HEAD before GET
            await response.write_eof()
            return response
        hold = self.holds.get(request.path)
        if hold is not None:
            hold.started.set()
            await hold.release.wait()
        if request.path in self.stall:
            await response.write(body[: self.stall[request.path]])
            await asyncio.sleep(3600)
        rate = self.trickle.get(request.path)
        step = max(1, rate // 10) if rate else 256 * 1024
        for offset in range(0, len(body), step):
            if rate:
                await asyncio.sleep(0.1)
            elif self.archive_chunk_delay:
                await asyncio.sleep(self.archive_chunk_delay)
            await response.write(body[offset : offset + step])
        await response.write_eof()
        return response
