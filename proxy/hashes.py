"""Package hashes as the clients compute them: `zh:` (SHA-256 of the zip) and `h1:` (Go dirhash).

Also parses SHA256SUMS documents. Pure: callers hand in bytes, names and file-like
objects; nothing here opens files or sockets.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from collections.abc import Iterable
from typing import IO

_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
MAX_SHASUMS_LINES = 10_000


class HashFormatError(ValueError):
    """A hash string or SHA256SUMS document is malformed."""


def zh_hash(sha256_hex: str) -> str:
    """The `zh:` form of an archive's SHA-256 hex digest."""
    if not _HEX64.match(sha256_hex):
        raise HashFormatError(f"not a SHA-256 hex digest: {sha256_hex[:80]!r}")
    return "zh:" + sha256_hex


def h1_from_digests(entries: Iterable[tuple[str, str]]) -> str:
    """Go's dirhash Hash1 over `(name, sha256 hex of content)` pairs."""
    summary = hashlib.sha256()
    for name, digest in sorted(entries, key=lambda item: item[0].encode("utf-8")):
        if "\n" in name:
            raise HashFormatError(f"file name contains a newline: {name!r}")
        summary.update(f"{digest}  {name}\n".encode())
    return "h1:" + base64.b64encode(summary.digest()).decode("ascii")


def h1_of_files(files: dict[str, bytes]) -> str:
    """`h1:` of an in-memory set of files (name → content)."""
    return h1_from_digests((name, hashlib.sha256(data).hexdigest()) for name, data in files.items())


def h1_of_zip(fileobj: IO[bytes]) -> tuple[str, str]:
    """Both `h1:` forms of a provider zip: `(zip_form, dir_form)`.

    The zip form (dirhash `HashZip`) lists every entry as stored, directory entries
    included; the directory form (`HashDir` of the unpacked package, which is what the
    clients record in lock files) lists only files. They differ when the zip has
    directory entries (docs/protocol.md#h1-hashes).
    """
    with zipfile.ZipFile(fileobj) as archive:
        contents: dict[str, str] = {}
        names: list[str] = []
        for info in archive.infolist():
            names.append(info.filename)
            contents[info.filename] = _sha256_member(archive, info)
    return h1_forms(names, contents)


def h1_forms(names: list[str], contents: dict[str, str]) -> tuple[str, str]:
    """`(zip_form, dir_form)` of a zip's entry names in order and each name's content SHA-256 hex."""
    zip_form = h1_from_digests((name, contents[name]) for name in names)
    dir_form = h1_from_digests((name, digest) for name, digest in contents.items() if not name.endswith("/"))
    return zip_form, dir_form


def _sha256_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> str:
    digest = hashlib.sha256()
    with archive.open(info) as member:
        while chunk := member.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def parse_shasums(document: bytes) -> dict[str, str]:
    """Parse a SHA256SUMS document into `{filename: sha256 hex}`.

    Lines are `<64 hex>  <filename>` (one or two spaces; `*` binary marker tolerated).
    Any malformed line makes the whole document invalid, as it does for the clients.
    """
    try:
        text = document.decode("utf-8")
    except UnicodeDecodeError:
        raise HashFormatError("SHA256SUMS is not UTF-8 text") from None
    sums: dict[str, str] = {}
    lines = text.splitlines()
    if len(lines) > MAX_SHASUMS_LINES:
        raise HashFormatError(f"SHA256SUMS has more than {MAX_SHASUMS_LINES} lines")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            if number == len(lines):
                continue
            raise HashFormatError(f"SHA256SUMS line {number} is empty")
        fields = line.split()
        if len(fields) != 2 or not _HEX64.match(fields[0].lower()):
            raise HashFormatError(f"SHA256SUMS line {number} is not '<sha256>  <filename>'")
        name = fields[1].removeprefix("*")
        if name in sums and sums[name] != fields[0].lower():
            raise HashFormatError(f"SHA256SUMS lists {name!r} twice with different digests")
        sums[name] = fields[0].lower()
    if not sums:
        raise HashFormatError("SHA256SUMS is empty")
    return sums
