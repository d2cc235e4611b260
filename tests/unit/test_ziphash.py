"""Unit tests for proxy.domain.ziphash: the streamed `h1:` is `h1_of_zip`'s, or refused for the fallback.

Generated zips (Python's writer, seekable and not, stored and deflated, zip64, directories, empty
and unicode names, any chunking) must stream to exactly `h1_of_zip`'s answer. Hand-built zips add
what Python does not write (Go-style data descriptors) and what an attacker would: local headers that
disagree with the central directory, prepended junk, duplicate names, hidden members, a zip bomb.
Those must raise StreamedZipMismatchError, so the caller hashes from the central directory instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import struct
import zipfile
import zlib
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.domain.hashes import h1_of_zip
from proxy.domain.ziphash import StreamedZipMismatchError, ZipStreamHasher, h1_of_streamed_zip


def streamed_h1(data: bytes, chunk: int = 1 << 20, *, max_unpacked: int | None = None) -> tuple[str, str]:
    """Feed `data` in `chunk`-byte pieces, then confirm against its central directory."""
    hasher = ZipStreamHasher() if max_unpacked is None else ZipStreamHasher(max_unpacked)
    for start in range(0, len(data), chunk):
        hasher.feed(data[start : start + chunk])
    hasher.finish()
    return h1_of_streamed_zip(hasher, io.BytesIO(data))


def reference(data: bytes) -> tuple[str, str]:
    return h1_of_zip(io.BytesIO(data))


class Unseekable(io.RawIOBase):
    """A write-only stream, so zipfile writes data descriptors."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        self.data += b
        return len(b)


names = st.text(
    st.characters(blacklist_categories=("Cs", "Cc")) | st.sampled_from("/-._aé日"), min_size=1, max_size=12
).filter(lambda n: not n.startswith("/") and "\x00" not in n)
contents = st.one_of(
    st.just(b""),
    st.binary(max_size=3000),
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=8), st.integers(1, 5000)),
)
members = st.lists(
    st.tuples(
        names, contents, st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]), st.booleans(), st.booleans()
    ),
    max_size=8,
    unique_by=lambda m: m[0],
)


def python_zip(entries: list[tuple[str, bytes, int, bool, bool]], seekable: bool) -> bytes:
    target: io.BytesIO | Unseekable = io.BytesIO() if seekable else Unseekable()
    with zipfile.ZipFile(target, "w") as archive:
        for name, data, method, is_dir, zip64 in entries:
            if is_dir:
                archive.writestr(zipfile.ZipInfo(name.rstrip("/") + "/"), b"")
                continue
            info = zipfile.ZipInfo(name)
            info.compress_type = method
            with archive.open(info, "w", force_zip64=zip64) as member:
                member.write(data)
    return target.getvalue() if isinstance(target, io.BytesIO) else bytes(target.data)


@given(members, st.integers(1, 700))
def test_generated_seekable_zips_stream_to_h1_of_zip(entries, chunk):
    data = python_zip(entries, seekable=True)
    names_seen = [n.rstrip("/") + "/" if d else n for n, _, _, d, _ in entries]
    if len(set(names_seen)) != len(names_seen):  # a file and a directory of the same name: duplicates
        return
    assert streamed_h1(data, chunk) == reference(data)


@given(members, st.integers(1, 700))
def test_generated_streamed_zips_with_data_descriptors(entries, chunk):
    """Written to an unseekable stream, every member has a data descriptor: deflated ones stream; a stored
    one (whose end only the central directory knows) is refused, never answered wrongly."""
    data = python_zip(entries, seekable=False)
    names_seen = [n.rstrip("/") + "/" if d else n for n, _, _, d, _ in entries]
    if len(set(names_seen)) != len(names_seen):
        return
    stored = any(m == zipfile.ZIP_STORED or d for _, _, m, d, _ in entries)
    if stored:
        with pytest.raises(StreamedZipMismatchError):
            streamed_h1(data, chunk)
    else:
        assert streamed_h1(data, chunk) == reference(data)


def test_a_provider_like_archive_in_one_megabyte_chunks():
    data = python_zip(
        [
            ("terraform-provider-big_v1.0.0", bytes(range(256)) * 20_000, zipfile.ZIP_DEFLATED, False, False),
            ("LICENSE", b"MPL", zipfile.ZIP_STORED, False, False),
            ("docs", b"", zipfile.ZIP_STORED, True, False),
        ],
        seekable=True,
    )
    assert streamed_h1(data) == reference(data)
    assert streamed_h1(data, 1) == reference(data)


# Hand-built zips: what Python's writer does not produce.


@dataclass
class Member:
    name: bytes
    data: bytes
    method: int = zipfile.ZIP_DEFLATED
    descriptor: str | None = None  # "sig4", "sig8", "4", "8": a data descriptor of that layout
    flags: int = 0
    local_name: bytes | None = None  # a different name in the local header
    local_size: int | None = None  # a different size in the local header
    descriptor_crc: int | None = None  # a different CRC-32 in the data descriptor


def build(
    members: list[Member],
    *,
    junk: bytes = b"",
    central: list[int] | None = None,
    central_crc: dict[int, int] | None = None,
) -> bytes:
    """A zip of `members`; the central directory lists `central` (indexes, in that order; all by default)."""
    out = bytearray(junk)
    records = []
    for member in members:
        packed = member.data
        if member.method == zipfile.ZIP_DEFLATED:
            compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
            packed = compressor.compress(member.data) + compressor.flush()
        crc, flags = zlib.crc32(member.data), member.flags | (0x08 if member.descriptor else 0)
        size = len(member.data) if member.local_size is None else member.local_size
        local_name = member.name if member.local_name is None else member.local_name
        offset = len(out) - len(junk)
        header_values = (0, 0, 0) if member.descriptor else (crc, len(packed), size)
        out += (
            struct.pack(
                "<4sHHHHHIIIHH", b"PK\x03\x04", 20, flags, member.method, 0, 0x21, *header_values, len(local_name), 0
            )
            + local_name
            + packed
        )
        if member.descriptor:
            sig = b"PK\x07\x08" if member.descriptor.startswith("sig") else b""
            fmt = "<IQQ" if member.descriptor.endswith("8") else "<III"
            crc_said = crc if member.descriptor_crc is None else member.descriptor_crc
            out += sig + struct.pack(fmt, crc_said, len(packed), len(member.data))
        records.append((member, flags, crc, len(packed), offset))
    start = len(out) - len(junk)
    listed = range(len(members)) if central is None else central
    for index in listed:
        member, flags, crc, packed_size, offset = records[index]
        crc = (central_crc or {}).get(index, crc)
        out += (
            struct.pack(
                "<4sHHHHHHIIIHHHHHII",
                b"PK\x01\x02",
                20,
                20,
                flags,
                member.method,
                0,
                0x21,
                crc,
                packed_size,
                len(member.data),
                len(member.name),
                0,
                0,
                0,
                0,
                0,
                offset,
            )
            + member.name
        )
    out += struct.pack(
        "<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(listed), len(listed), len(out) - len(junk) - start, start, 0
    )
    return bytes(out)


BIN = Member(b"terraform-provider-x", b"\x7fELF" + bytes(range(256)) * 300)
README = Member(b"README.md", b"# hello\n" * 50, zipfile.ZIP_STORED)


@pytest.mark.parametrize("layout", ["sig4", "sig8", "4", "8"])
@pytest.mark.parametrize("chunk", [1, 5, 4096])
def test_data_descriptors_of_every_layout(layout, chunk):
    """With or without the signature, 4- or 8-byte sizes (Go writes 8 without a zip64 extra field)."""
    data = build([Member(BIN.name, BIN.data, descriptor=layout), README, Member(b"empty", b"", descriptor=layout)])
    assert streamed_h1(data, chunk) == reference(data)


def test_a_well_formed_hand_built_zip_streams():
    """The builder makes zips the stream accepts, so the refusals below are about what each one changes."""
    data = build([BIN, README])
    assert streamed_h1(data, 3) == reference(data)


ADVERSARIAL = {
    "local name differs": ([Member(BIN.name, BIN.data, local_name=b"terraform-provider-y"), README], {}),
    "prepended junk": ([BIN, README], {"junk": b"MZ" + b"\x00" * 100}),
    "duplicate names": ([BIN, Member(BIN.name, b"other content", zipfile.ZIP_STORED)], {}),
    "hidden member between two listed": ([BIN, Member(b"evil", b"payload"), README], {"central": [0, 2]}),
    "central directory reordered": ([BIN, README], {"central": [1, 0]}),
    "hidden member after the listed ones": ([BIN, README, Member(b"evil", b"payload")], {"central": [0, 1]}),
    "data descriptor disagrees with the data": (
        [Member(BIN.name, BIN.data, descriptor="sig4", descriptor_crc=7), README],
        {},
    ),
    "one local header listed twice": ([BIN, README], {"central": [0, 0, 1]}),
    "central CRC-32 wrong": ([BIN, README], {"central_crc": {0: 1234}}),
    "local size of a stored member wrong": (
        [BIN, Member(README.name, README.data, zipfile.ZIP_STORED, local_size=len(README.data) - 1)],
        {},
    ),
    "encrypted flag": ([Member(BIN.name, BIN.data, flags=0x01), README], {}),
    "stored member with a data descriptor": (
        [Member(README.name, README.data, zipfile.ZIP_STORED, descriptor="sig4")],
        {},
    ),
}


@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
def test_disagreements_are_refused_for_the_central_directory_answer(case):
    members, options = ADVERSARIAL[case]
    data = build(members, **options)
    with pytest.raises(StreamedZipMismatchError):
        streamed_h1(data, 7)
    with contextlib.suppress(zipfile.BadZipFile, RuntimeError):  # the fallback's answer, or its refusal
        reference(data)


def test_the_fallback_answers_from_the_central_directory_where_the_stream_would_differ():
    """A member hidden from the central directory is in the stream, not in the clients' h1."""
    data = build([BIN, Member(b"evil", b"payload"), README], central=[0, 2])
    assert reference(data) == h1_of_zip(io.BytesIO(build([BIN, README])))


def test_a_zip_bomb_stops_the_streaming_pass():
    bomb = Member(b"bomb", bytes(10 << 20))
    data = build([bomb])
    assert len(data) < 20_000  # a thousandth of what it unpacks to
    with pytest.raises(StreamedZipMismatchError, match="limit"):
        streamed_h1(data, max_unpacked=2 << 20)
    assert streamed_h1(data, max_unpacked=12 << 20) == reference(data)


def test_a_truncated_stream_is_refused():
    data = build([BIN, README])
    hasher = ZipStreamHasher()
    hasher.feed(data[: len(data) // 2])
    hasher.finish()
    assert hasher.failure == "the archive ended inside a member"
    with pytest.raises(StreamedZipMismatchError):
        h1_of_streamed_zip(hasher, io.BytesIO(data))


def test_not_a_zip_is_refused():
    hasher = ZipStreamHasher()
    hasher.feed(b"<html>not found</html>" * 10)
    hasher.finish()
    assert hasher.failure is not None and "no local file header" in hasher.failure


def test_the_digests_are_of_the_unpacked_contents():
    data = build([BIN, README])
    hasher = ZipStreamHasher()
    hasher.feed(data)
    assert [(e.raw_name, e.sha256) for e in hasher.entries] == [
        (BIN.name, hashlib.sha256(BIN.data).hexdigest()),
        (README.name, hashlib.sha256(README.data).hexdigest()),
    ]
