"""Fetching git module sources with the `git` CLI, locked down, and packing them reproducibly.

git runs with no hooks, no prompts, no credential helpers but the proxy's own for a host with an
upstream token (answering from the environment, for that origin only), only the https protocol (plus
http for operator-named hosts), no redirects, no system or user configuration, a time
limit and a size limit. The host is checked by the SSRF guard before git connects. A
shallow clone of the ref is tried first; servers that cannot do shallow clones (git's
dumb HTTP) get a full clone. The tree's sizes and entry count are checked before it is
checked out. The checkout is packed into a deterministic `.tar.gz`: the same commit
always gives the same bytes.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import structlog
from yarl import URL

from proxy.domain.credentials import UpstreamCredentials
from proxy.errors import ForbiddenAddressError, GitSourceError, UpstreamError, UpstreamTooLargeError, VerificationError
from proxy.modules.packing import DEFAULT_MAX_ENTRIES, ArchiveError, deterministic_tar_gz
from proxy.upstream.netguard import AddressPolicy, RefusedAddressError, check_resolved

log = structlog.get_logger(__name__)

TOKEN_ENV = "REGISTRY_PROXY_GIT_TOKEN"  # the token for the one host git talks to, read by the credential helper


@dataclass(frozen=True)
class PackedSource:
    commit: str
    path: Path


class GitFetcher:
    """Clones `https` git sources into a scratch dir and packs them."""

    def __init__(
        self,
        policy: AddressPolicy,
        scratch: Path,
        *,
        ca_bundle: Path | None = None,
        timeout: float = 120.0,
        max_bytes: int = 512 * 2**20,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        concurrency: int = 4,
        credentials: UpstreamCredentials | None = None,
    ) -> None:
        self._policy = policy
        self._credentials = credentials or UpstreamCredentials()
        self._scratch = scratch
        self._ca_bundle = ca_bundle
        self._timeout = timeout
        self._max_bytes = max_bytes
        self._max_entries = max_entries
        self._slots = asyncio.Semaphore(concurrency)

    async def pack(self, url: str, ref: str, output: Path) -> PackedSource:
        """Clone `url` at `ref` (default branch if empty) and write a deterministic tar.gz to `output`."""
        async with self._slots:
            return await self._pack(url, ref, output)

    async def _pack(self, url: str, ref: str, output: Path) -> PackedSource:
        pin = await self._check_host(url)
        self._scratch.mkdir(parents=True, exist_ok=True)
        work = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="git-", dir=self._scratch))
        try:
            checkout = work / "src"
            await self._clone(url, ref, checkout, work, pin)
            commit = (await self._git(["rev-parse", "HEAD"], work, cwd=checkout)).strip()
            mtime = int((await self._git(["show", "-s", "--format=%ct", "HEAD"], work, cwd=checkout)).strip())
            size = await asyncio.to_thread(_tree_size, checkout)
            if size > self._max_bytes:
                raise UpstreamTooLargeError(f"git source {url} is larger than the {self._max_bytes}-byte limit")
            try:
                await asyncio.to_thread(deterministic_tar_gz, checkout, output, mtime)
            except ArchiveError as exc:
                raise VerificationError(f"git source {url} cannot be packed safely: {exc}") from None
            return PackedSource(commit, output)
        finally:
            await asyncio.to_thread(shutil.rmtree, work, True)

    async def _clone(self, url: str, ref: str, checkout: Path, work: Path, pin: list[str]) -> None:
        pin = [*pin, *self._credential_helper(url)]
        shallow = [*pin, "clone", "--quiet", "--no-checkout", "--depth", "1", "--no-tags", "--single-branch"]
        if ref:
            shallow += ["--branch", ref]
        target = "HEAD"
        try:
            await self._git([*shallow, "--", url, str(checkout)], work, token=self._token(url))
        except UpstreamError as exc:
            log.info("git.shallow_clone_failed", url=url, ref=ref, error=exc.message)
            await asyncio.to_thread(shutil.rmtree, checkout, True)
            await self._git(
                [*pin, "clone", "--quiet", "--no-checkout", "--", url, str(checkout)], work, token=self._token(url)
            )
            target = ref or "HEAD"
        await self._check_tree(url, target, checkout, work)
        await self._git(["checkout", "--quiet", "--detach", target, "--"], work, cwd=checkout)

    async def _check_tree(self, url: str, target: str, checkout: Path, work: Path) -> None:
        """Refuse, before anything is written, a tree whose files or entries exceed the limits
        (a few MiB of repository can check out to GiBs: git compresses blobs)."""
        listing = await self._git(["ls-tree", "-r", "-t", "-l", "-z", "--full-tree", target, "--"], work, cwd=checkout)
        entries = [entry for entry in listing.split("\0") if entry]
        if len(entries) > self._max_entries:
            raise UpstreamTooLargeError(f"git source {url}: its tree has more than {self._max_entries} entries")
        size = sum(
            int(fields[3])
            for entry in entries
            if len(fields := entry.partition("\t")[0].split()) == 4 and fields[3].isdigit()
        )
        if size > self._max_bytes:
            raise UpstreamTooLargeError(f"git source {url}: its tree holds more than {self._max_bytes} bytes")

    def _token(self, url: str) -> str | None:
        try:
            return self._credentials.token_for(URL(url))
        except ValueError:
            return None

    def _credential_helper(self, url: str) -> list[str]:
        """For a host with a token: a credential helper for exactly that origin, answering with the token
        from the environment (never in the URL or the command line). Username `x-access-token` works with
        GitHub, GitLab (any username with a token) and Gitea."""
        if self._token(url) is None:
            return []
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
        helper = f'!f() {{ test "$1" = get && echo username=x-access-token && echo "password=${{{TOKEN_ENV}}}"; }}; f'
        return ["-c", f"credential.{origin}.helper={helper}"]

    async def _git(self, args: list[str], work: Path, cwd: Path | None = None, token: str | None = None) -> str:
        config = [
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "credential.helper=",
            "-c",
            "protocol.file.allow=never",
            "-c",
            "protocol.ext.allow=never",
            "-c",
            "http.followRedirects=false",
            "-c",
            "core.askPass=true",
            "-c",
            "submodule.recurse=false",
            "-c",
            "core.fsmonitor=false",
            "-c",
            "advice.detachedHead=false",
        ]
        if self._ca_bundle is not None:
            config += ["-c", f"http.sslCAInfo={self._ca_bundle}"]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(work),
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_ALLOW_PROTOCOL": "https:http",
            "GIT_LFS_SKIP_SMUDGE": "1",
            "LC_ALL": "C",
        }
        if token is not None:
            env[TOKEN_ENV] = token
        for name in ("HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy"):
            if name in os.environ:
                env[name] = os.environ[name]
        process = await asyncio.create_subprocess_exec(
            "git",
            *config,
            *args,
            cwd=cwd or work,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), self._timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise GitSourceError(f"git {args[0]} timed out after {self._timeout:.0f}s") from None
        if process.returncode != 0:
            message = err.decode(errors="replace").strip().splitlines()
            raise GitSourceError(f"git {args[0]} failed: {message[-1] if message else process.returncode}")
        return out.decode(errors="replace")

    async def _check_host(self, url: str) -> list[str]:
        """Refuse non-https and non-public hosts; returns git options pinning the checked address
        (so a second DNS answer cannot send git elsewhere)."""
        try:
            parts = urlsplit(url)
            host, port = parts.hostname or "", parts.port or 443
        except ValueError:
            raise GitSourceError(f"invalid git URL {url!r}") from None
        if parts.scheme != "https" and not (parts.scheme == "http" and self._policy.is_exempt(host, port)):
            raise ForbiddenAddressError(f"refused to fetch {url}: git sources are fetched over https only")
        try:
            addresses = await check_resolved(host, port, self._policy)
        except RefusedAddressError as exc:
            raise ForbiddenAddressError(f"refused to fetch {url}: {exc}") from None
        if not addresses:
            return []
        address = f"[{addresses[0]}]" if ":" in addresses[0] else addresses[0]
        return ["-c", f"http.curloptResolve={host}:{port}:{address}"]


def _tree_size(root: Path) -> int:
    total = 0
    for current, dirs, files in os.walk(root):
        if ".git" in dirs and Path(current) == root:
            dirs.remove(".git")
        total += sum((Path(current) / name).lstat().st_size for name in files)
    return total
