"""The derived records the proxy keeps in the metadata store, and their versioned format.

`ArchiveRecord` (under `archive:` keys): the verified facts of a stored provider archive.
`ModuleRecord` (`module:`): a stored module archive and where it came from.
`SumsRecord` (`sums:`): a release's SHA256SUMS and signature as fetched, kept only once verified.
A provider whose registry lists no signing keys (admitted by `--unsigned-providers`) has its
`ArchiveRecord` and `SumsRecord` marked `"unsigned": true`; a record without the field is signed
(every record written before the field existed), and signed records are written without it.
Each record's dict carries `"v"` (`RECORD_VERSION`); a dict without it is version 1 (what stores
written before the field hold). A record of another version, or of a shape that does not parse, reads
as None, a cache miss: it is fetched again, never a crash. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from proxy.domain.module_sources import FILE_EXTENSIONS
from proxy.metadata_store import decode_record, encode_record

RECORD_VERSION = 1
R = TypeVar("R", bound="Record")


class Record(Protocol):
    """What every record type offers."""

    def to_dict(self) -> dict[str, Any]: ...

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any] | None) -> R | None: ...


def version_of(data: dict[str, Any]) -> Any:
    """The format version a record dict was written in (no field: version 1)."""
    return data.get("v", 1)


def is_newer(data: dict[str, Any] | None) -> bool:
    """Whether a record dict was written by a newer proxy (a version this one cannot read)."""
    if data is None:
        return False
    version = version_of(data)
    return isinstance(version, int) and version > RECORD_VERSION


def _read(data: dict[str, Any] | None, build: Callable[[dict[str, Any]], R | None]) -> R | None:
    """`build(data)` for a dict of this version; None for another version or a shape `build` cannot read."""
    if not isinstance(data, dict) or version_of(data) != RECORD_VERSION:
        return None
    try:
        return build(data)
    except (KeyError, TypeError, ValueError):
        return None


def _mark_unsigned(data: dict[str, Any], unsigned: bool) -> dict[str, Any]:
    """`data` with `"unsigned": true` added for an unsigned record (signed ones stay as they always were)."""
    return {**data, "unsigned": True} if unsigned else data


def _unsigned(data: dict[str, Any]) -> bool:
    """Whether a record dict is marked unsigned; no field (older records) is signed, anything but a bool fails."""
    value = data.get("unsigned", False)
    if not isinstance(value, bool):
        raise ValueError(f"'unsigned' must be a boolean, not {value!r}")
    return value


@dataclass(frozen=True)
class ArchiveRecord:
    """The verified facts about a stored provider archive."""

    sha256: str
    size: int
    filename: str
    h1_zip: str
    h1_dir: str
    unsigned: bool = False  # its registry listed no signing keys: checked against SHA256SUMS and shasum only

    def to_dict(self) -> dict[str, Any]:
        return _mark_unsigned(
            {
                "v": RECORD_VERSION,
                "sha256": self.sha256,
                "size": self.size,
                "filename": self.filename,
                "h1_zip": self.h1_zip,
                "h1_dir": self.h1_dir,
            },
            self.unsigned,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ArchiveRecord | None:
        return _read(
            data,
            lambda d: cls(
                str(d["sha256"]), int(d["size"]), str(d["filename"]), str(d["h1_zip"]), str(d["h1_dir"]), _unsigned(d)
            ),
        )


@dataclass(frozen=True)
class ModuleRecord:
    """A stored module archive: its digest and size, its kind of archive and its source."""

    sha256: str
    size: int
    archive: str  # a key of modsource.FILE_EXTENSIONS
    source: str
    commit: str = ""

    @property
    def extension(self) -> str:
        return FILE_EXTENSIONS[self.archive]

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": RECORD_VERSION,
            "sha256": self.sha256,
            "size": self.size,
            "archive": self.archive,
            "source": self.source,
            "commit": self.commit,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ModuleRecord | None:
        record = _read(
            data,
            lambda d: cls(
                str(d["sha256"]), int(d["size"]), str(d["archive"]), str(d["source"]), str(d.get("commit", ""))
            ),
        )
        return record if record is not None and record.archive in FILE_EXTENSIONS else None


@dataclass(frozen=True)
class SumsRecord:
    """A release's SHA256SUMS and detached signature, byte for byte, and the key that signed them."""

    sums: bytes
    signature: bytes
    key_id: str
    fingerprint: str
    unsigned: bool = False  # no signing keys: the signature (kept as sent, for the clients) was not checked

    def to_dict(self) -> dict[str, Any]:
        return _mark_unsigned(
            {
                "v": RECORD_VERSION,
                "sums": self.sums.hex(),
                "signature": self.signature.hex(),
                "key_id": self.key_id,
                "fingerprint": self.fingerprint,
            },
            self.unsigned,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SumsRecord | None:
        return _read(
            data,
            lambda d: cls(
                bytes.fromhex(d["sums"]),
                bytes.fromhex(d["signature"]),
                str(d.get("key_id", "")),
                str(d.get("fingerprint", "")),
                _unsigned(d),
            ),
        )


def encode(record: Record) -> bytes:
    """A record as the metadata store keeps it."""
    return encode_record(record.to_dict())


def decode(raw: bytes | None, kind: type[R]) -> R | None:
    """The record of type `kind` stored as `raw`, or None (missing, damaged or of another version)."""
    return kind.from_dict(decode_record(raw))
