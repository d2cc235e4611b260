"""`h1:` of a zip computed while it streams in, confirmed against its central directory at the end.

`ZipStreamHasher.feed` takes the archive's bytes in order and walks its local file headers,
decompressing each member (stored or deflated; data descriptors; zip64) and hashing its content
with SHA-256 and CRC-32 as it goes. `h1_of_streamed_zip` then reads only the central directory
(which is what the clients hash from) and accepts the streamed digests only if every entry agrees
with what the stream saw: same order and count, local header offset, name as `zipfile` would check
it, method, sizes and CRC-32, the central directory right after the last member, no duplicate
names. Anything else (a parse failure, encryption, another method, the unpacked-size cap) raises
`StreamedZipMismatchError`; the caller then hashes the file the slow way (`proxy.domain.hashes.h1_of_zip`), so
the answer is always the one the central directory gives. Pure: bytes and file-like objects in.
"""

from __future__ import annotations

import hashlib
import struct
import zipfile
import zlib
from dataclasses import dataclass
from typing import IO

from proxy.domain.hashes import Hash, h1_forms

DEFAULT_MAX_UNPACKED_BYTES = 2 << 30  # the streaming pass stops beyond this (a zip bomb); the fallback decides
MAX_ENTRIES = 200_000
_OUT_CHUNK = 1 << 20  # largest piece of decompressed output held at once

_LOCAL = b"PK\x03\x04"
_DESCRIPTOR = b"PK\x07\x08"
_ENDS = (b"PK\x01\x02", b"PK\x05\x06", b"PK\x06\x06")  # central directory, end records: members are over
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_UNSUPPORTED_FLAGS = 0x01 | 0x20 | 0x40  # encrypted, patched, strong encryption: zipfile refuses them too


class StreamedZipMismatchError(ValueError):
    """The streamed digests cannot stand for the archive (the reason says why); hash the file instead."""


@dataclass(frozen=True)
class StreamedEntry:
    """One member as the stream saw it."""

    offset: int  # of its local header
    raw_name: bytes
    flags: int
    method: int
    compressed_size: int
    size: int
    crc: int
    sha256: str


class ZipStreamHasher:
    """Feed a zip's bytes in order; afterwards `entries` holds each member's digest, or `failure` why not.

    `feed` never raises: a failure (a malformed or unsupported archive, more than `max_unpacked`
    bytes unpacked) is recorded and the remaining bytes are ignored.
    """

    def __init__(self, max_unpacked: int = DEFAULT_MAX_UNPACKED_BYTES) -> None:
        self.entries: list[StreamedEntry] = []
        self.failure: str | None = None
        self.end: int | None = None  # offset where the members ended (the central directory, normally)
        self._max_unpacked = max_unpacked
        self._unpacked = 0
        self._buf = bytearray()
        self._base = 0  # archive offset of _buf[0]
        self._member: _Member | None = None

    def feed(self, chunk: bytes) -> None:
        """The next bytes of the archive."""
        if self.failure is not None or self.end is not None:
            return
        self._buf += chunk
        try:
            used = self._consume()
        except StreamedZipMismatchError as exc:
            self._fail(str(exc))
            return
        except Exception as exc:  # any failure means: hash the file afterwards instead
            self._fail(f"{type(exc).__name__}: {exc}")
            return
        if self.end is not None:  # the rest is the central directory: read from the file at the end
            self._buf = bytearray()
            return
        del self._buf[:used]
        self._base += used

    def finish(self) -> None:
        """The archive is complete: a member or header left unfinished is a failure."""
        if self.failure is None and self.end is None:
            self._fail(
                "the archive ended inside a member" if self._member else "no central directory after the members"
            )

    def _fail(self, reason: str) -> None:
        self.failure = reason
        self._buf = bytearray()
        self._member = None

    def _consume(self) -> int:
        """Process as much of the buffer as possible; how many bytes of it are done with."""
        pos = 0
        while self.end is None:
            if self._member is None:
                header = self._header(pos)
                if header is None:
                    break
                pos = header
            else:
                done = self._member.take(self._buf, pos)
                pos = done.pos
                if not done.finished:
                    break
                self._unpacked += self._member.unpacked
                self.entries.append(self._member.entry())
                self._member = None
        return pos

    def _header(self, pos: int) -> int | None:
        """Parse the header at `pos`: the position after it, or None until more bytes arrive."""
        buf = self._buf
        if len(buf) - pos < 4:
            return None
        signature = bytes(buf[pos : pos + 4])
        if signature in _ENDS:
            self.end = self._base + pos
            return pos
        if signature != _LOCAL:
            raise StreamedZipMismatchError(f"no local file header at offset {self._base + pos}")
        if len(buf) - pos < _LOCAL_HEADER.size:
            return None
        (_, _, flags, method, _, _, crc, compressed, size, name_len, extra_len) = _LOCAL_HEADER.unpack_from(buf, pos)
        end = pos + _LOCAL_HEADER.size + name_len + extra_len
        if len(buf) < end:
            return None
        if flags & _UNSUPPORTED_FLAGS:
            raise StreamedZipMismatchError(f"member flags {flags:#x} (encryption) are not streamed")
        if method not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise StreamedZipMismatchError(f"compression method {method} is not streamed")
        if len(self.entries) >= MAX_ENTRIES:
            raise StreamedZipMismatchError(f"more than {MAX_ENTRIES} members")
        name = bytes(buf[pos + _LOCAL_HEADER.size : pos + _LOCAL_HEADER.size + name_len])
        extra = bytes(buf[pos + _LOCAL_HEADER.size + name_len : end])
        zip64 = _zip64_sizes(extra, size, compressed)
        if zip64 is not None:
            size, compressed = zip64
        described = bool(flags & 0x08)
        if described and method == zipfile.ZIP_STORED:
            raise StreamedZipMismatchError("a stored member with a data descriptor has no known end")
        if not described and method == zipfile.ZIP_STORED and compressed != size:
            raise StreamedZipMismatchError("a stored member whose sizes differ")
        self._member = _Member(
            self._base + pos,
            name,
            flags,
            method,
            None if described else compressed,
            None if described else (size, crc),
            zip64 is not None,
            self._max_unpacked - self._unpacked,
        )
        return end


def _zip64_sizes(extra: bytes, size: int, compressed: int) -> tuple[int, int] | None:
    """The sizes of a local header's zip64 extra field, where the header says they are there."""
    if size != 0xFFFFFFFF and compressed != 0xFFFFFFFF:
        return None
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        if tag == 1:
            data = extra[pos + 4 : pos + 4 + length]
            values = [struct.unpack_from("<Q", data, i)[0] for i in range(0, len(data) - 7, 8)]
            if size == 0xFFFFFFFF:
                if not values:
                    break
                size = values.pop(0)
            if compressed == 0xFFFFFFFF:
                if not values:
                    break
                compressed = values.pop(0)
            return size, compressed
        pos += 4 + length
    raise StreamedZipMismatchError("a zip64 size without its zip64 extra field")


@dataclass
class _Taken:
    pos: int
    finished: bool


class _Member:
    """The member being streamed: its data hashed as it arrives, then its data descriptor if it has one."""

    def __init__(
        self,
        offset: int,
        name: bytes,
        flags: int,
        method: int,
        compressed: int | None,
        declared: tuple[int, int] | None,
        zip64: bool,
        budget: int,
    ) -> None:
        self.offset, self.name, self.flags, self.method = offset, name, flags, method
        self.compressed_left = compressed  # None: up to the end of the deflate stream (data descriptor)
        self.declared = declared
        self.zip64 = zip64
        self.budget = budget  # the most bytes it may unpack to
        self.consumed = 0
        self.unpacked = 0
        self.crc = 0
        self.sha = hashlib.sha256()
        self.inflater = zlib.decompressobj(-15) if method == zipfile.ZIP_DEFLATED else None
        self.data_done = False

    def take(self, buf: bytearray, pos: int) -> _Taken:
        if not self.data_done:
            pos = self._data(buf, pos)
            if not self.data_done:
                return _Taken(pos, False)
        if self.declared is None:
            return self._descriptor(buf, pos)
        size, crc = self.declared
        if (size, crc) != (self.unpacked, self.crc):
            raise StreamedZipMismatchError(
                f"member at offset {self.offset}: its local header's size or CRC-32 is wrong"
            )
        return _Taken(pos, True)

    def _data(self, buf: bytearray, pos: int) -> int:
        available = len(buf) - pos
        if self.compressed_left is not None:
            available = min(available, self.compressed_left)
        with memoryview(buf) as view, view[pos : pos + available] as data:
            if self.inflater is None:
                self._out(data)
                used = available
            else:
                used = self._inflate(data)
        self.consumed += used
        if self.compressed_left is not None:
            self.compressed_left -= used
            if self.compressed_left == 0 and not self.data_done:
                if self.inflater is not None:  # as zipfile: a stream cut at the member's end is flushed
                    self._out(self.inflater.flush())
                self.data_done = True
        return pos + used

    def _inflate(self, data: memoryview) -> int:
        inflater = self.inflater
        assert inflater is not None
        pending: bytes | memoryview = data
        while pending and not inflater.eof:
            self._out(inflater.decompress(pending, _OUT_CHUNK))
            pending = inflater.unconsumed_tail
        if inflater.eof:
            self.data_done = True
            used = len(data) - len(inflater.unused_data)
            if self.compressed_left is not None and used != self.compressed_left:
                raise StreamedZipMismatchError(
                    f"member at offset {self.offset}: its deflate stream ends before its size"
                )
            return used
        return len(data)

    def _out(self, data: bytes | memoryview) -> None:
        if len(data) > self.budget - self.unpacked:
            raise StreamedZipMismatchError("the archive unpacks to more than the streaming pass's limit")
        self.sha.update(data)
        self.crc = zlib.crc32(data, self.crc)
        self.unpacked += len(data)

    def _descriptor(self, buf: bytearray, pos: int) -> _Taken:
        """The data descriptor after the data: with or without its signature, 4- or 8-byte sizes
        (some writers use 8 without a zip64 extra field); the layout whose values match, followed by
        another header's signature."""
        left = len(buf) - pos
        if left < 28:  # the longest layout and the next signature, or the end of the archive
            return _Taken(pos, False)
        layouts = (
            ((True, 8), (True, 4), (False, 8), (False, 4))
            if self.zip64
            else ((True, 4), (True, 8), (False, 4), (False, 8))
        )
        for signed, width in layouts:
            start = pos + (4 if signed else 0)
            if signed and bytes(buf[pos : pos + 4]) != _DESCRIPTOR:
                continue
            fmt = "<IQQ" if width == 8 else "<III"
            crc, compressed, size = struct.unpack_from(fmt, buf, start)
            end = start + struct.calcsize(fmt)
            following = bytes(buf[end : end + 4])
            if (crc, compressed, size) == (self.crc, self.consumed, self.unpacked) and (
                following == _LOCAL or following in _ENDS
            ):
                return _Taken(end, True)
        raise StreamedZipMismatchError(f"member at offset {self.offset}: no data descriptor matches its data")

    def entry(self) -> StreamedEntry:
        return StreamedEntry(
            self.offset,
            self.name,
            self.flags,
            self.method,
            self.consumed,
            self.unpacked,
            self.crc,
            self.sha.hexdigest(),
        )


def h1_of_streamed_zip(hasher: ZipStreamHasher, fileobj: IO[bytes]) -> tuple[Hash, Hash]:
    """Both `h1:` forms (as `h1_of_zip`) from the streamed digests, once the central directory of
    the complete archive in `fileobj` confirms every entry; raises StreamedZipMismatchError if it does not."""
    if hasher.failure is not None:
        raise StreamedZipMismatchError(hasher.failure)
    if hasher.end is None:
        raise StreamedZipMismatchError("the stream did not reach the central directory")
    try:
        with zipfile.ZipFile(fileobj) as archive:
            infos = archive.infolist()
            start_dir = archive.start_dir
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise StreamedZipMismatchError(f"unreadable central directory: {exc}") from None
    if len(infos) != len(hasher.entries):
        raise StreamedZipMismatchError(
            f"the central directory lists {len(infos)} entries, the stream had {len(hasher.entries)}"
        )
    if start_dir != hasher.end:
        raise StreamedZipMismatchError(f"the central directory starts at {start_dir}, the members end at {hasher.end}")
    names = [info.filename for info in infos]
    if len(set(names)) != len(names):
        raise StreamedZipMismatchError("duplicate names")
    for info, seen in zip(infos, hasher.entries, strict=True):
        _confirm(info, seen)
    return h1_forms(names, {info.filename: seen.sha256 for info, seen in zip(infos, hasher.entries, strict=True)})


def _confirm(info: zipfile.ZipInfo, seen: StreamedEntry) -> None:
    """The central directory entry describes the member the stream hashed, as `zipfile` would read it."""
    try:
        local_name = seen.raw_name.decode("utf-8" if seen.flags & 0x800 else "cp437")
    except UnicodeDecodeError:
        raise StreamedZipMismatchError(f"entry {info.filename!r}: its local name is not UTF-8") from None
    checks = {
        "local header offset": (info.header_offset, seen.offset),
        "name": (info.orig_filename, local_name),
        "compression method": (info.compress_type, seen.method),
        "compressed size": (info.compress_size, seen.compressed_size),
        "size": (info.file_size, seen.size),
        "CRC-32": (info.CRC, seen.crc),
    }
    for what, (central, local) in checks.items():
        if central != local:
            raise StreamedZipMismatchError(
                f"entry {info.filename!r}: {what} {central!r} in the central directory, {local!r} in the stream"
            )
    if info.flag_bits & _UNSUPPORTED_FLAGS:
        raise StreamedZipMismatchError(f"entry {info.filename!r}: flags {info.flag_bits:#x}")
