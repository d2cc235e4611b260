"""Unit tests for proxy.domain.hashes: the Hash type, zh:/h1: hashes and SHA256SUMS parsing.

The h1: vectors come from Go's golang.org/x/mod/sumdb/dirhash tests and OpenTofu's
getproviders hash tests.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile

import pytest

from proxy.domain.hashes import (
    MAX_SHASUMS_LINES,
    Hash,
    HashFormatError,
    HashScheme,
    h1_from_digests,
    h1_of_files,
    h1_of_zip,
    parse_shasums,
)

EMPTY_H1 = Hash.parse("h1:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=")
ABC_XYZ_H1 = Hash.parse("h1:EP6WfDoQTSk9klnxcjriWJOGztueJUywHNmWeq+efB8=")
PREFIXED_H1 = Hash.parse("h1:rLyfpGMAgqOnGE2aKOY5Xb6cOc0/YQhPjHBHBwkblhs=")

ABC_XYZ = {"abc": b"data for abc", "xyz": b"data for xyz"}
PREFIXED = {"prefix/abc": b"data for abc", "prefix/xyz": b"data for xyz"}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _zip(entries: list[tuple[str, bytes | None]]) -> io.BytesIO:
    """An in-memory zip; a None content makes a directory entry."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            if data is None:
                archive.writestr(zipfile.ZipInfo(name), b"")
            else:
                archive.writestr(name, data)
    buffer.seek(0)
    return buffer


# ---------------------------------------------------------------------------------------------
# h1 vectors
# ---------------------------------------------------------------------------------------------


def test_h1_empty_vector() -> None:
    assert h1_from_digests([]) == EMPTY_H1
    assert h1_of_files({}) == EMPTY_H1
    # Independently: the empty summary is SHA-256 of nothing.
    assert "h1:" + base64.b64encode(hashlib.sha256(b"").digest()).decode() == str(EMPTY_H1)


def test_h1_abc_xyz_vector() -> None:
    assert h1_of_files(ABC_XYZ) == ABC_XYZ_H1
    assert h1_from_digests([(name, _sha(data)) for name, data in ABC_XYZ.items()]) == ABC_XYZ_H1


def test_h1_prefixed_vector() -> None:
    assert h1_of_files(PREFIXED) == PREFIXED_H1


def test_h1_summary_format_matches_dirhash_definition() -> None:
    # dirhash Hash1: SHA-256 over "<hex>  <name>\n" lines sorted by name, base64 with "h1:" prefix.
    summary = "".join(f"{_sha(ABC_XYZ[name])}  {name}\n" for name in sorted(ABC_XYZ))
    expected = "h1:" + base64.b64encode(hashlib.sha256(summary.encode()).digest()).decode()
    assert expected == str(ABC_XYZ_H1)
    assert str(h1_of_files(ABC_XYZ)) == expected


def test_h1_order_of_input_does_not_matter() -> None:
    entries = [(name, _sha(data)) for name, data in ABC_XYZ.items()]
    assert h1_from_digests(entries) == h1_from_digests(list(reversed(entries))) == ABC_XYZ_H1
    assert h1_of_files({"xyz": b"data for xyz", "abc": b"data for abc"}) == ABC_XYZ_H1


def test_h1_sorts_by_bytes_not_by_locale_or_case() -> None:
    # Go sorts the file names as byte strings: "B" (0x42) < "a" (0x61) < "é" (0xc3 0xa9).
    files = {"a": b"1", "B": b"2", "é": b"3"}
    summary = "".join(f"{_sha(files[name])}  {name}\n" for name in ("B", "a", "é"))
    expected = "h1:" + base64.b64encode(hashlib.sha256(summary.encode()).digest()).decode()
    assert str(h1_of_files(files)) == expected


def test_h1_depends_on_content_and_names() -> None:
    assert h1_of_files({"abc": b"data for abc", "xyz": b"data for xyz!"}) != ABC_XYZ_H1
    assert h1_of_files({"abd": b"data for abc", "xyz": b"data for xyz"}) != ABC_XYZ_H1
    assert h1_of_files({"abc": b"data for abc"}) != ABC_XYZ_H1


def test_h1_newline_in_name_is_rejected() -> None:
    with pytest.raises(HashFormatError):
        h1_from_digests([("bad\nname", _sha(b""))])
    with pytest.raises(HashFormatError):
        h1_of_files({"ok": b"", "bad\nname": b"x"})


# ---------------------------------------------------------------------------------------------
# h1_of_zip
# ---------------------------------------------------------------------------------------------


def test_h1_of_zip_plain_files() -> None:
    zip_form, dir_form = h1_of_zip(_zip([("abc", b"data for abc"), ("xyz", b"data for xyz")]))
    assert zip_form == ABC_XYZ_H1
    assert dir_form == ABC_XYZ_H1


def test_h1_of_zip_entry_order_does_not_matter() -> None:
    zip_form, dir_form = h1_of_zip(_zip([("xyz", b"data for xyz"), ("abc", b"data for abc")]))
    assert zip_form == dir_form == ABC_XYZ_H1


def test_h1_of_zip_stored_without_compression() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in ABC_XYZ.items():
            archive.writestr(name, data)
    buffer.seek(0)
    assert h1_of_zip(buffer) == (ABC_XYZ_H1, ABC_XYZ_H1)


def test_h1_of_zip_with_directory_entry() -> None:
    archive = _zip([("prefix/", None), ("prefix/abc", b"data for abc"), ("prefix/xyz", b"data for xyz")])
    zip_form, dir_form = h1_of_zip(archive)
    assert dir_form == PREFIXED_H1
    assert zip_form != dir_form
    assert zip_form == h1_from_digests(
        [
            ("prefix/", hashlib.sha256(b"").hexdigest()),
            ("prefix/abc", _sha(b"data for abc")),
            ("prefix/xyz", _sha(b"data for xyz")),
        ]
    )


def test_h1_of_zip_without_directory_entry_forms_agree() -> None:
    zip_form, dir_form = h1_of_zip(_zip([("prefix/abc", b"data for abc"), ("prefix/xyz", b"data for xyz")]))
    assert zip_form == dir_form == PREFIXED_H1


def test_h1_of_zip_empty_archive() -> None:
    assert h1_of_zip(_zip([])) == (EMPTY_H1, EMPTY_H1)


def test_h1_of_zip_larger_than_one_chunk() -> None:
    big = bytes(range(256)) * 5000  # 1.28 MB, more than the 1 MiB read chunk
    zip_form, dir_form = h1_of_zip(_zip([("big", big)]))
    assert zip_form == dir_form == h1_from_digests([("big", _sha(big))])


def test_h1_of_zip_newline_in_name_is_rejected() -> None:
    with pytest.raises(HashFormatError):
        h1_of_zip(_zip([("abc", b"data for abc"), ("evil\nname", b"x")]))


def test_h1_of_zip_not_a_zip() -> None:
    with pytest.raises(zipfile.BadZipFile):
        h1_of_zip(io.BytesIO(b"this is not a zip archive"))


# ---------------------------------------------------------------------------------------------
# Hash
# ---------------------------------------------------------------------------------------------


def test_zh_hash_valid() -> None:
    digest = _sha(b"archive bytes")
    assert str(Hash.zh(digest)) == "zh:" + digest
    assert Hash.zh(digest).sha256 == digest
    assert Hash.zh("0" * 64) == Hash.parse("zh:" + "0" * 64) == Hash(HashScheme.ZH, "0" * 64)


@pytest.mark.parametrize(
    "given",
    [
        "",
        "0" * 63,
        "0" * 65,
        "A" * 64,  # the zh: form uses lower-case hex only
        _sha(b"x").upper(),
        "g" * 64,
        "zh:" + "0" * 64,
        " " + "0" * 63,
        "0" * 64 + "\n",  # `$` in a regex must not accept a trailing newline
        "0" * 64 + " ",
        "0" * 32,
    ],
)
def test_zh_hash_invalid(given: str) -> None:
    with pytest.raises(HashFormatError):
        Hash.zh(given)


def test_hashes_parse_and_print_as_the_clients_write_them() -> None:
    for text in (str(EMPTY_H1), "zh:" + _sha(b"x")):
        assert str(Hash.parse(text)) == text
    assert Hash.parse(str(ABC_XYZ_H1)).scheme is HashScheme.H1
    assert Hash.parse("zh:" + _sha(b"x")).scheme is HashScheme.ZH


@pytest.mark.parametrize(
    "text",
    [
        "",
        "h1:",
        "zh:",
        "h1" + str(EMPTY_H1)[2:].replace(":", ""),  # no colon
        "h2:" + str(EMPTY_H1)[3:],  # an unknown scheme
        "H1:" + str(EMPTY_H1)[3:],
        "h1:" + _sha(b"x"),  # hex where base64 belongs
        "zh:" + str(EMPTY_H1)[3:],  # base64 where hex belongs
        str(EMPTY_H1)[:-1],
        str(EMPTY_H1) + "=",
        str(EMPTY_H1) + "\n",
        " " + str(EMPTY_H1),
    ],
)
def test_malformed_hashes_are_refused(text: str) -> None:
    with pytest.raises(HashFormatError):
        Hash.parse(text)


def test_hashes_compare_and_sort_as_values() -> None:
    zh = Hash.zh(_sha(b"x"))
    assert Hash.parse(str(zh)) == zh and len({zh, Hash.parse(str(zh))}) == 1
    assert sorted([zh, ABC_XYZ_H1, EMPTY_H1]) == [Hash.parse(t) for t in sorted(map(str, [zh, ABC_XYZ_H1, EMPTY_H1]))]
    with pytest.raises(HashFormatError):
        _ = EMPTY_H1.sha256  # an h1: hash is no archive digest


def test_zip_with_a_newline_in_a_member_name_is_refused_as_a_value_error() -> None:
    """The mirror treats a ValueError from `h1_of_zip` as a zip that fails verification."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("terraform-provider-foo\nabc", b"data")
    buffer.seek(0)
    with pytest.raises(ValueError, match="newline"):
        h1_of_zip(buffer)


# ---------------------------------------------------------------------------------------------
# parse_shasums
# ---------------------------------------------------------------------------------------------

D1 = _sha(b"one")
D2 = _sha(b"two")
D3 = _sha(b"three")
F1 = "terraform-provider-x_1.0.0_linux_amd64.zip"
F2 = "terraform-provider-x_1.0.0_darwin_arm64.zip"
F3 = "terraform-provider-x_1.0.0_manifest.json"


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (f"{D1}  {F1}\n{D2}  {F2}\n".encode(), {F1: D1, F2: D2}),
        (f"{D1}  {F1}\n{D2}  {F2}".encode(), {F1: D1, F2: D2}),
        (f"{D1} {F1}\n{D2} {F2}\n".encode(), {F1: D1, F2: D2}),
        (f"{D1} *{F1}\n{D2}  *{F2}\n".encode(), {F1: D1, F2: D2}),
        (f"{D1}  {F1}\r\n{D2}  {F2}\r\n".encode(), {F1: D1, F2: D2}),
        (f"{D1}  {F1}\n{D2}  {F2}\n{D3}  {F3}\n".encode(), {F1: D1, F2: D2, F3: D3}),
        (f"{D1.upper()}  {F1}\n".encode(), {F1: D1}),
        (f"{D1}  {F1}\n\n".encode(), {F1: D1}),
        (f"{D1}  {F1}\n{D1}  {F1}\n".encode(), {F1: D1}),
    ],
    ids=[
        "two-space",
        "no-trailing-newline",
        "one-space",
        "binary-marker",
        "crlf",
        "three",
        "upper-hex",
        "trailing-blank-line",
        "duplicate-same-digest",
    ],
)
def test_parse_shasums_valid(document: bytes, expected: dict[str, str]) -> None:
    assert parse_shasums(document) == {name: Hash.zh(digest) for name, digest in expected.items()}


@pytest.mark.parametrize(
    "document",
    [
        b"",
        b"\n",
        b"   \n",
        f"{D1}  {F1}\n\n{D2}  {F2}\n".encode(),
        f"{D1}  {F1}\n   \n{D2}  {F2}\n".encode(),
        f"\n{D1}  {F1}\n".encode(),
        f"{D1}\n".encode(),
        f"{D1}  {F1}  extra\n".encode(),
        f"{D1}  two words.zip\n".encode(),
        f"{D1[:-1]}  {F1}\n".encode(),
        f"{D1}0  {F1}\n".encode(),
        f"{'z' * 64}  {F1}\n".encode(),
        f"{D1[:-1]}g  {F1}\n".encode(),
        f"sha256:{D1}  {F1}\n".encode(),
        f"{F1}  {D1}\n".encode(),
        f"{D1}  {F1}\nnot a checksum line\n".encode(),
        f"{D1}  {F1}\n{D2}  {F1}\n".encode(),
        b"\xff\xfe" + f"{D1}  {F1}\n".encode(),
        f"{D1}  caf\xe9.zip\n".encode("latin-1"),
    ],
    ids=[
        "empty",
        "only-newline",
        "only-blank",
        "empty-middle-line",
        "blank-middle-line",
        "leading-empty-line",
        "digest-only",
        "three-fields",
        "space-in-name",
        "short-digest",
        "long-digest",
        "non-hex",
        "one-non-hex-char",
        "prefixed-digest",
        "swapped",
        "malformed-second-line",
        "duplicate-different",
        "utf16-bom",
        "latin-1",
    ],
)
def test_parse_shasums_invalid(document: bytes) -> None:
    with pytest.raises(HashFormatError):
        parse_shasums(document)


def test_parse_shasums_returns_lowercase_digests() -> None:
    sums = parse_shasums(f"{D1.upper()}  {F1}\n{D2}  {F2}\n".encode())
    assert sums[F1] == Hash.zh(D1)
    assert all(h.value == h.value.lower() for h in sums.values())


def test_parse_shasums_duplicate_case_insensitive_digest_ok() -> None:
    assert parse_shasums(f"{D1}  {F1}\n{D1.upper()}  {F1}\n".encode()) == {F1: Hash.zh(D1)}


def test_parse_shasums_messages() -> None:
    with pytest.raises(HashFormatError, match="line 2"):
        parse_shasums(f"{D1}  {F1}\n\n{D2}  {F2}\n".encode())
    with pytest.raises(HashFormatError, match="line 2"):
        parse_shasums(f"{D1}  {F1}\nbogus\n".encode())
    with pytest.raises(HashFormatError, match="twice"):
        parse_shasums(f"{D1}  {F1}\n{D2}  {F1}\n".encode())
    with pytest.raises(HashFormatError, match="UTF-8"):
        parse_shasums(b"\xff" * 70)


def test_parse_shasums_line_limit() -> None:
    lines = [f"{D1}  file{i}.zip" for i in range(MAX_SHASUMS_LINES)]
    assert len(parse_shasums("\n".join(lines).encode())) == MAX_SHASUMS_LINES
    lines.append(f"{D1}  one-too-many.zip")
    with pytest.raises(HashFormatError):
        parse_shasums("\n".join(lines).encode())
