"""Module source locations (go-getter syntax) classified into what the proxy does with them. Pure.

- `HttpArchive`: an https URL of an archive (by extension or `?archive=`): fetched and stored.
- `GitSource`: `git::https://…?ref=…` or the `github.com/owner/repo` shorthand: cloned and
  packed into a deterministic `.tar.gz`.
- `Passthrough`: forms the proxy does not fetch (`s3::`, `gcs::`, `hg::`, git over ssh, other
  http indirections): handed to the client unchanged (or refused with `--module-passthrough=deny`).
- `Refused`: never acceptable from a registry (`file://`, local paths, plain http, credentials).

A `//subdir` suffix is split off first, as go-getter does, and kept for the client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit, urlunsplit

_FORCED_GETTER = re.compile(r"^([A-Za-z0-9]+)::(.+)\Z", re.DOTALL)
_SCP_LIKE = re.compile(r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:")
ARCHIVE_EXTENSIONS = {
    ".tar.gz": "tar.gz",
    ".tgz": "tar.gz",
    ".tar.bz2": "tar.bz2",
    ".tbz2": "tar.bz2",
    ".tar.xz": "tar.xz",
    ".txz": "tar.xz",
    ".zip": "zip",
    ".tar": "tar",
}
FILE_EXTENSIONS = {"tar.gz": ".tar.gz", "tar.bz2": ".tar.bz2", "tar.xz": ".tar.xz", "zip": ".zip", "tar": ".tar"}
PASSTHROUGH_GETTERS = {"s3", "gcs", "hg", "oci"}


@dataclass(frozen=True)
class HttpArchive:
    url: str
    archive: str  # one of FILE_EXTENSIONS
    subdir: str = ""
    checksum: tuple[str, str] | None = None  # go-getter `?checksum=`: (algorithm, hex digest)


@dataclass(frozen=True)
class GitSource:
    url: str
    ref: str
    subdir: str = ""
    archive: str = "tar.gz"


@dataclass(frozen=True)
class Passthrough:
    location: str
    kind: str


@dataclass(frozen=True)
class Refused:
    location: str
    reason: str


ModuleSource = HttpArchive | GitSource | Passthrough | Refused


def split_subdir(source: str) -> tuple[str, str]:
    """go-getter's `SourceDirSubdir`: `URL//sub/dir?q` → (`URL?q`, `sub/dir`)."""
    stop = source.find("?")
    stop = len(source) if stop < 0 else stop
    scheme_end = source.find("://", 0, stop)
    offset = scheme_end + 3 if scheme_end >= 0 else 0
    index = source.find("//", offset, stop)
    if index < 0:
        return source, ""
    subdir, rest = source[index + 2 :], source[:index]
    query = subdir.find("?")
    if query >= 0:
        rest += subdir[query:]
        subdir = subdir[:query]
    return rest, subdir


def join_subdir(package: str, subdir: str) -> str:
    """The inverse of `split_subdir`: `URL?q` + `sub` → `URL//sub?q`."""
    if not subdir:
        return package
    base, sep, query = package.partition("?")
    return f"{base}//{subdir}{sep}{query}"


def classify(location: str) -> ModuleSource:
    """What the proxy does with an upstream module location (already resolved if it was relative)."""
    forced = _FORCED_GETTER.match(location)
    getter, rest = (forced.group(1).lower(), forced.group(2)) if forced else ("", location)
    package, subdir = split_subdir(rest)
    if _escapes(subdir):
        return Refused(location, "the module subdirectory escapes the package")
    if getter in PASSTHROUGH_GETTERS:
        return Passthrough(location, getter)
    if getter == "file" or package.startswith(("/", "./", "../", "file:", "\\")) or re.match(r"^[A-Za-z]:\\", package):
        return Refused(location, "local paths and file:// sources are never fetched")
    if getter == "git":
        return _git(location, package, subdir)
    if getter not in ("", "http", "https"):
        return Passthrough(location, getter)
    if _SCP_LIKE.match(package) or package.startswith("ssh://"):
        return Passthrough(location, "git-ssh")
    if package.startswith("github.com/"):
        return _github_shorthand(location, package, subdir)
    parts = urlsplit(package)
    if not parts.scheme:
        return Passthrough(location, "detector")  # bitbucket.org/…, S3 or GCS host forms
    if parts.scheme != "https":
        return Refused(location, f"only https sources are fetched, not {parts.scheme}:")
    if parts.username or parts.password:
        return Refused(location, "sources with credentials in the URL are not fetched")
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    checksum = None
    if "checksum" in params:
        checksum = _parse_checksum(params["checksum"])
        if checksum is None:
            return Passthrough(location, "checksum-file")  # `file:` checksums: the client checks them itself
    archive = params.get("archive")
    if archive is None:
        archive = next((kind for ext, kind in ARCHIVE_EXTENSIONS.items() if parts.path.lower().endswith(ext)), None)
    else:
        archive = ARCHIVE_EXTENSIONS.get("." + archive.lower())
    if archive is None:
        return Passthrough(location, "http")  # a terraform-get indirection page: the client follows it
    # Drop only go-getter's own parameters; the rest of the query stays byte for byte (it may be signed).
    query = "&".join(
        item for item in parts.query.split("&") if item and item.split("=", 1)[0] not in ("archive", "checksum")
    )
    return HttpArchive(urlunsplit(parts._replace(query=query, fragment="")), archive, subdir, checksum)


_DIGEST_LENGTHS = {32: "md5", 40: "sha1", 64: "sha256", 128: "sha512"}


def _parse_checksum(value: str) -> tuple[str, str] | None:
    """go-getter's `checksum=[type:]hex`; None for forms the proxy cannot check itself (`file:`)."""
    kind, sep, digest = value.partition(":")
    if not sep:
        kind, digest = _DIGEST_LENGTHS.get(len(value), ""), value
    digest = digest.lower()
    if (
        kind in ("md5", "sha1", "sha256", "sha512")
        and re.fullmatch(r"[0-9a-f]+", digest)
        and _DIGEST_LENGTHS.get(len(digest)) == kind
    ):
        return kind, digest
    return None


def _escapes(subdir: str) -> bool:
    return bool(subdir) and (subdir.startswith(("/", "\\")) or ".." in subdir.replace("\\", "/").split("/"))


def _git(location: str, package: str, subdir: str) -> ModuleSource:
    if _escapes(subdir):
        return Refused(location, "the module subdirectory escapes the package")
    if _SCP_LIKE.match(package):
        return Passthrough(location, "git-ssh")
    parts = urlsplit(package)
    if parts.scheme == "ssh":
        return Passthrough(location, "git-ssh")
    if parts.scheme != "https":
        return Refused(location, f"git sources are only fetched over https, not {parts.scheme or 'a local path'}")
    if parts.username or parts.password:
        return Refused(location, "git sources with credentials in the URL are not fetched")
    query = dict(parse_qsl(parts.query))
    ref = query.get("ref", "")
    if ref.startswith("-") or any(ch.isspace() or ord(ch) < 32 for ch in ref) or ".." in ref:
        return Refused(location, f"invalid git ref {ref!r}")
    url = urlunsplit(parts._replace(query="", fragment=""))
    return GitSource(url, ref, subdir)


def _github_shorthand(location: str, package: str, subdir: str) -> ModuleSource:
    path, _, query = package.partition("?")
    segments = path.split("/")
    if len(segments) < 3 or not segments[1] or not segments[2]:
        return Refused(location, "GitHub shorthand needs github.com/OWNER/REPO")
    repo = segments[2] if segments[2].endswith(".git") else segments[2] + ".git"
    extra = "/".join(segments[3:])
    subdir = "/".join(part for part in (extra, subdir) if part)
    url = f"https://github.com/{segments[1]}/{repo}" + (f"?{query}" if query else "")
    return _git(location, url, subdir)


def proxied_location(path: str, source: HttpArchive | GitSource) -> str:
    """The location the proxy hands out: its own archive URL, with the `//subdir` preserved."""
    return path + (f"//{source.subdir}" if source.subdir else "")
