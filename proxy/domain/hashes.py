"""Package hashes as the clients compute them: `zh:` (SHA-256 of the zip) and `h1:` (Go dirhash).

`Hash` is the one value type for them (OpenTofu's `getproviders.Hash`): a scheme and a value,
parsed and validated once (`Hash.parse`, `Hash.zh`), compared as values, written as
`scheme:value`. Also parses SHA256SUMS documents (each line a file's `zh:` hash). Pure: callers
hand in bytes, names and file-like objects; nothing here opens files or sockets.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import IO

_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
_BASE64_SHA256 = re.compile(r"^[A-Za-z0-9+/]{43}=\Z")
MAX_SHASUMS_LINES = 10_000


class HashFormatError(ValueError):
    """A hash string or SHA256SUMS document is malformed."""


class HashScheme(StrEnum):
    """The kinds of package hash the clients record in lock files (docs/protocol.md#lock-files)."""

    H1 = "h1:"  # dirhash Hash1 of the package's files: base64 of a SHA-256
    ZH = "zh:"  # SHA-256 of the zip archive (what SHA256SUMS lists): hex


@dataclass(frozen=True, order=True)
class Hash:
    """A package hash: `scheme:value`, valid for its scheme (build it with `parse`, `zh` or the h1 functions)."""

    scheme: HashScheme
    value: str

    def __post_init__(self) -> None:
        pattern = _HEX64 if self.scheme is HashScheme.ZH else _BASE64_SHA256
        if not isinstance(self.value, str) or not pattern.match(self.value):
            raise HashFormatError(f"not a valid {self.scheme} hash: {str(self.value)[:80]!r}")

    @classmethod
    def parse(cls, text: str) -> Hash:
        """A hash as written in lock files and mirror documents, e.g. `zh:0123…` or `h1:AbC…=`."""
        scheme, colon, value = text.partition(":")
        try:
            return cls(HashScheme(scheme + colon), value)
        except ValueError:
            raise HashFormatError(f"not an h1: or zh: hash: {text[:80]!r}") from None

    @classmethod
    def zh(cls, sha256_hex: str) -> Hash:
        """The `zh:` hash of an archive whose SHA-256 is `sha256_hex` (lower-case hex, as SHA256SUMS has it)."""
        return cls(HashScheme.ZH, sha256_hex)

    @property
    def sha256(self) -> str:
        """The archive's SHA-256 in hex (a `zh:` hash only)."""
        if self.scheme is not HashScheme.ZH:
            raise HashFormatError(f"{self} is no SHA-256 of an archive")
        return self.value

    def __str__(self) -> str:
        return f"{self.scheme}{self.value}"


def h1_from_digests(entries: Iterable[tuple[str, str]]) -> Hash:
    """Go's dirhash Hash1 over `(name, sha256 hex of content)` pairs."""
    summary = hashlib.sha256()
    for name, digest in sorted(entries, key=lambda item: item[0].encode("utf-8")):
        if "\n" in name:
            raise HashFormatError(f"file name contains a newline: {name!r}")
        summary.update(f"{digest}  {name}\n".encode())
    return Hash(HashScheme.H1, base64.b64encode(summary.digest()).decode("ascii"))


def h1_of_files(files: dict[str, bytes]) -> Hash:
    """`h1:` of an in-memory set of files (name → content)."""
    return h1_from_digests((name, hashlib.sha256(data).hexdigest()) for name, data in files.items())


def h1_of_zip(fileobj: IO[bytes]) -> tuple[Hash, Hash]:
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


def h1_forms(names: list[str], contents: dict[str, str]) -> tuple[Hash, Hash]:
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


def parse_shasums(document: bytes) -> dict[str, Hash]:
    """Parse a SHA256SUMS document into `{filename: its zh: hash}`.

    Lines are `<64 hex>  <filename>` (one or two spaces; `*` binary marker tolerated).
    Any malformed line makes the whole document invalid, as it does for the clients.
    """
    try:
        text = document.decode("utf-8")
    except UnicodeDecodeError:
        raise HashFormatError("SHA256SUMS is not UTF-8 text") from None
    sums: dict[str, Hash] = {}
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
        name, listed = fields[1].removeprefix("*"), Hash.zh(fields[0].lower())
        if sums.setdefault(name, listed) != listed:
            raise HashFormatError(f"SHA256SUMS lists {name!r} twice with different digests")
    if not sums:
        raise HashFormatError("SHA256SUMS is empty")
    return sums
