"""Unit tests for proxy.modules.packing: deterministic tar.gz packing and archive safety checks."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import random
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.modules.packing import ArchiveError, ArchiveTooLargeError, check_archive, deterministic_tar_gz

MTIME = 1_700_000_000

# ---------------------------------------------------------------------------------------------
# deterministic_tar_gz
# ---------------------------------------------------------------------------------------------

TREE = {
    "main.tf": b'resource "null_resource" "x" {}\n',
    "variables.tf": b'variable "a" {}\n',
    "modules/vpc/main.tf": b"# vpc\n",
    "modules/vpc/outputs.tf": b"# outputs\n",
    "scripts/run.sh": b"#!/bin/sh\necho hi\n",
    "README.md": b"# readme\n",
}


def make_tree(root: Path, files: dict[str, bytes], order: list[str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in order or list(files):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[name])
        path.chmod(0o755 if name.endswith(".sh") else 0o644)
    return root


def pack(root: Path, output: Path, mtime: int = MTIME) -> bytes:
    deterministic_tar_gz(root, output, mtime)
    return output.read_bytes()


def members(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return tar.getmembers()


def test_same_tree_packed_twice_is_byte_identical(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src", TREE)
    assert pack(root, tmp_path / "a.tar.gz") == pack(root, tmp_path / "b.tar.gz")


def test_output_ignores_file_times_and_non_exec_permission_bits(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src", TREE)
    first = pack(root, tmp_path / "a.tar.gz")
    os.utime(root / "main.tf", (1, 1))
    os.utime(root / "modules", (2_000_000_000, 2_000_000_000))
    (root / "variables.tf").chmod(0o600)
    (root / "README.md").chmod(0o664)
    (root / "scripts/run.sh").chmod(0o700)
    (root / "modules").chmod(0o700)
    assert pack(root, tmp_path / "b.tar.gz") == first


def test_output_ignores_creation_order(tmp_path: Path) -> None:
    one = make_tree(tmp_path / "one", TREE)
    two = make_tree(tmp_path / "two", TREE, order=list(reversed(TREE)))
    assert pack(one, tmp_path / "a.tar.gz") == pack(two, tmp_path / "b.tar.gz")


def test_output_ignores_the_root_directory_name(tmp_path: Path) -> None:
    one = make_tree(tmp_path / "one", TREE)
    two = make_tree(tmp_path / "completely-different-name", TREE)
    assert pack(one, tmp_path / "a.tar.gz") == pack(two, tmp_path / "b.tar.gz")


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda root: (root / "main.tf").write_bytes(b"# changed\n"), id="content"),
        pytest.param(lambda root: (root / "new.tf").write_bytes(b""), id="new-empty-file"),
        pytest.param(lambda root: (root / "empty-dir").mkdir(), id="new-empty-dir"),
        pytest.param(lambda root: (root / "README.md").unlink(), id="removed-file"),
        pytest.param(lambda root: (root / "README.md").rename(root / "README.txt"), id="renamed-file"),
        pytest.param(lambda root: (root / "main.tf").chmod(0o755), id="exec-bit-set"),
        pytest.param(lambda root: (root / "scripts/run.sh").chmod(0o644), id="exec-bit-cleared"),
        pytest.param(lambda root: os.symlink("main.tf", root / "link.tf"), id="new-symlink"),
    ],
)
def test_output_changes_when_the_tree_changes(tmp_path: Path, change: Callable[[Path], object]) -> None:
    root = make_tree(tmp_path / "src", TREE)
    before = pack(root, tmp_path / "a.tar.gz")
    change(root)
    assert pack(root, tmp_path / "b.tar.gz") != before


def test_output_changes_with_the_commit_time(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src", TREE)
    assert pack(root, tmp_path / "a.tar.gz", MTIME) != pack(root, tmp_path / "b.tar.gz", MTIME + 1)


def test_gzip_header_has_no_name_or_time(tmp_path: Path) -> None:
    data = pack(make_tree(tmp_path / "src", TREE), tmp_path / "out.tar.gz")
    assert data[:2] == b"\x1f\x8b"
    flags, header_mtime = data[3], int.from_bytes(data[4:8], "little")
    assert flags & 0x08 == 0  # FNAME
    assert header_mtime == 0


def test_entries_sorted_with_fixed_owner_modes_and_times(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src", TREE)
    found = members(pack(root, tmp_path / "out.tar.gz"))
    names = [m.name for m in found]
    assert names == sorted(names, key=str.encode)
    assert names == [
        "README.md",
        "main.tf",
        "modules",
        "modules/vpc",
        "modules/vpc/main.tf",
        "modules/vpc/outputs.tf",
        "scripts",
        "scripts/run.sh",
        "variables.tf",
    ]
    by_name = {m.name: m for m in found}
    for member in found:
        assert (member.uid, member.gid, member.uname, member.gname) == (0, 0, "", "")
        assert member.mtime == MTIME
    assert by_name["modules"].isdir() and by_name["modules"].mode == 0o755
    assert by_name["modules/vpc"].isdir() and by_name["modules/vpc"].mode == 0o755
    assert by_name["main.tf"].isfile() and by_name["main.tf"].mode == 0o644
    assert by_name["scripts/run.sh"].isfile() and by_name["scripts/run.sh"].mode == 0o755


def test_contents_are_packed(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src", TREE)
    deterministic_tar_gz(root, tmp_path / "out.tar.gz", MTIME)
    with tarfile.open(tmp_path / "out.tar.gz", "r:gz") as tar:
        for name, content in TREE.items():
            extracted = tar.extractfile(name)
            assert extracted is not None
            assert extracted.read() == content


def test_top_level_git_directory_is_excluded_but_nested_one_kept(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src", TREE)
    (root / ".git/objects").mkdir(parents=True)
    (root / ".git/HEAD").write_bytes(b"ref: refs/heads/main\n")
    (root / "vendor/.git").mkdir(parents=True)
    (root / "vendor/.git/config").write_bytes(b"[core]\n")
    names = [m.name for m in members(pack(root, tmp_path / "out.tar.gz"))]
    assert not any(name == ".git" or name.startswith(".git/") for name in names)
    assert "vendor/.git" in names and "vendor/.git/config" in names


def test_top_level_git_directory_does_not_change_the_output(tmp_path: Path) -> None:
    clean = make_tree(tmp_path / "clean", TREE)
    cloned = make_tree(tmp_path / "cloned", TREE)
    (cloned / ".git").mkdir()
    (cloned / ".git/HEAD").write_bytes(b"ref: refs/heads/main\n")
    assert pack(clean, tmp_path / "a.tar.gz") == pack(cloned, tmp_path / "b.tar.gz")


def test_symlinks_inside_the_tree_are_kept(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src", TREE)
    os.symlink("main.tf", root / "alias.tf")
    os.symlink("../main.tf", root / "modules/parent.tf")
    os.symlink("modules/vpc", root / "vpc")  # a symlink to a directory: kept as a link, not followed
    found = {m.name: m for m in members(pack(root, tmp_path / "out.tar.gz"))}
    assert found["alias.tf"].issym() and found["alias.tf"].linkname == "main.tf"
    assert found["modules/parent.tf"].issym() and found["modules/parent.tf"].linkname == "../main.tf"
    assert found["vpc"].issym() and found["vpc"].linkname == "modules/vpc"
    assert not any(name.startswith("vpc/") for name in found)


@pytest.mark.parametrize(
    ("link", "target"),
    [
        ("evil", "../../etc/passwd"),
        ("evil", ".."),
        ("modules/evil", "../../outside"),
        ("modules/vpc/evil", "../../../x"),
        ("evil", "/etc/passwd"),
        ("modules/evil", "/"),
    ],
)
def test_symlinks_pointing_outside_are_refused(tmp_path: Path, link: str, target: str) -> None:
    root = make_tree(tmp_path / "src", TREE)
    os.symlink(target, root / link)
    with pytest.raises(ArchiveError):
        deterministic_tar_gz(root, tmp_path / "out.tar.gz", MTIME)


# ---------------------------------------------------------------------------------------------
# check_archive
# ---------------------------------------------------------------------------------------------


def tar_bytes(entries: list[tarfile.TarInfo | tuple[str, bytes]], mode: str = "w:gz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tar:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                tar.addfile(entry)
            else:
                name, content = entry
                info = tarfile.TarInfo(name)
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def zip_bytes(entries: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in entries:
            archive.writestr(zipfile.ZipInfo(name), content)
    return buffer.getvalue()


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def special(name: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    return info


def directory(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info


NOISE = random.Random(20240601).randbytes(4096)
FILES = [("main.tf", b"# main\n"), ("modules/vpc/main.tf", b"# vpc\n"), ("README.md", b"hi\n")]


def write(tmp_path: Path, data: bytes, name: str = "archive") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("kind", "data", "count"),
    [
        ("tar.gz", tar_bytes(FILES, "w:gz"), 3),
        ("tar.bz2", tar_bytes(FILES, "w:bz2"), 3),
        ("tar.xz", tar_bytes(FILES, "w:xz"), 3),
        ("tar", tar_bytes(FILES, "w"), 3),
        ("zip", zip_bytes(FILES), 3),
        ("tar.gz", tar_bytes([directory("modules"), *FILES]), 4),
        ("tar.gz", tar_bytes([("main.tf", b""), link("alias.tf", "main.tf")]), 2),
        ("tar.gz", tar_bytes([("a/b/main.tf", b""), link("a/b/up.tf", "../b/main.tf")]), 2),
        ("tar.gz", tar_bytes([("main.tf", b""), link("copy.tf", "main.tf", tarfile.LNKTYPE)]), 2),
        ("tar.gz", tar_bytes([("a/main.tf", b""), link("a/copy.tf", "a/main.tf", tarfile.LNKTYPE)]), 2),
        ("tar.gz", tar_bytes([("./main.tf", b"")]), 1),
        ("zip", zip_bytes([("modules/", b""), ("modules/main.tf", b"x")]), 2),
    ],
    ids=lambda value: value if isinstance(value, str | int) else "archive",  # gzip headers hold a time
)
def test_check_archive_accepts_valid_archives(tmp_path: Path, kind: str, data: bytes, count: int) -> None:
    assert check_archive(write(tmp_path, data), kind) == count


def test_check_archive_accepts_a_packed_tree(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src", TREE)
    os.symlink("main.tf", root / "alias.tf")
    output = tmp_path / "out.tar.gz"
    deterministic_tar_gz(root, output, MTIME)
    assert check_archive(output, "tar.gz") == len(members(output.read_bytes()))


def _flip(data: bytes, at: int, length: int = 1) -> bytes:
    changed = bytearray(data)
    changed[at : at + length] = bytes(b ^ 0xFF for b in changed[at : at + length])
    return bytes(changed)


def _corrupt_later_header() -> bytes:
    """A plain tar whose third member header is garbage (its first two members are fine)."""
    entries = [(f"f{i}.tf", b"x" * 10) for i in range(5)]
    raw = tar_bytes(entries, "w")
    return _flip(raw, 2 * 1024 + 100, 8)  # each member: one header block + one data block


_GZ = tar_bytes(FILES * 20)


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        pytest.param("tar.gz", tar_bytes([("../evil", b"x")]), id="tar-dotdot"),
        pytest.param("tar.gz", tar_bytes([("a/../../evil", b"x")]), id="tar-nested-dotdot"),
        pytest.param("tar.gz", tar_bytes([("/etc/x", b"x")]), id="tar-absolute"),
        pytest.param("tar.gz", tar_bytes([("..\\evil", b"x")]), id="tar-backslash-dotdot"),
        pytest.param("tar", tar_bytes([("../evil", b"x")], "w"), id="plain-tar-dotdot"),
        pytest.param("zip", zip_bytes([("../evil", b"x")]), id="zip-dotdot"),
        pytest.param("zip", zip_bytes([("/etc/x", b"x")]), id="zip-absolute"),
        pytest.param("zip", zip_bytes([("..\\evil", b"x")]), id="zip-backslash-dotdot"),
        pytest.param("zip", zip_bytes([("a\\..\\..\\evil", b"x")]), id="zip-backslash-nested-dotdot"),
        pytest.param("zip", zip_bytes([("\\evil", b"x")]), id="zip-backslash-absolute"),
        pytest.param("zip", zip_bytes([("C:/Windows/evil", b"x")]), id="zip-drive-letter"),
        pytest.param("zip", zip_bytes([("C:\\Windows\\evil", b"x")]), id="zip-drive-letter-backslash"),
        pytest.param("tar.gz", tar_bytes([link("evil", "../../etc/passwd")]), id="symlink-dotdot"),
        pytest.param("tar.gz", tar_bytes([link("a/b/evil", "../../../x")]), id="nested-symlink-dotdot"),
        pytest.param("tar.gz", tar_bytes([link("evil", "/etc/passwd")]), id="symlink-absolute"),
        pytest.param("tar.gz", tar_bytes([link("evil", "../x", tarfile.LNKTYPE)]), id="hardlink-dotdot"),
        pytest.param("tar.gz", tar_bytes([link("evil", "/etc/passwd", tarfile.LNKTYPE)]), id="hardlink-absolute"),
        # a hardlink's target is relative to the archive root, not to the link's directory
        pytest.param(
            "tar.gz", tar_bytes([link("a/b/evil", "../../etc/passwd", tarfile.LNKTYPE)]), id="nested-hardlink-dotdot"
        ),
        pytest.param("tar.gz", tar_bytes([special("dev", tarfile.CHRTYPE)]), id="char-device"),
        pytest.param("tar.gz", tar_bytes([special("dev", tarfile.BLKTYPE)]), id="block-device"),
        pytest.param("tar.gz", tar_bytes([special("fifo", tarfile.FIFOTYPE)]), id="fifo"),
        pytest.param("tar.gz", _flip(_GZ, 0, 2), id="gzip-bad-magic"),
        pytest.param("tar.gz", _flip(_GZ, 2), id="gzip-bad-method"),
        # damage after the first member: the archive is not readable to its end
        pytest.param("tar.gz", _flip(_GZ, len(_GZ) // 2, 16), id="gzip-corrupt-stream"),
        pytest.param("tar.gz", _flip(_GZ, len(_GZ) - 6), id="gzip-bad-crc"),
        pytest.param("tar", _corrupt_later_header(), id="tar-corrupt-later-header"),
        pytest.param("tar.gz", gzip.compress(_corrupt_later_header(), mtime=0), id="tar.gz-corrupt-later-header"),
        pytest.param("tar.gz", _GZ[:-40], id="truncated-gzip"),
        pytest.param("zip", zip_bytes(FILES)[:-30], id="truncated-zip"),
        pytest.param("zip", zip_bytes(FILES)[: len(zip_bytes(FILES)) // 2], id="half-zip"),
        pytest.param("tar.gz", NOISE, id="random-as-tar.gz"),
        pytest.param("tar.bz2", NOISE, id="random-as-tar.bz2"),
        pytest.param("tar.xz", NOISE, id="random-as-tar.xz"),
        pytest.param("zip", NOISE, id="random-as-zip"),
        pytest.param("tar", b"\x01" * 4096, id="garbage-as-tar"),
        pytest.param("tar.gz", b"", id="empty-as-tar.gz"),
        pytest.param("zip", b"", id="empty-as-zip"),
        pytest.param("tar.gz", zip_bytes(FILES), id="zip-as-tar.gz"),
        pytest.param("zip", tar_bytes(FILES), id="tar.gz-as-zip"),
        pytest.param("tar.bz2", tar_bytes(FILES, "w:gz"), id="tar.gz-as-tar.bz2"),
        pytest.param("tar.xz", tar_bytes(FILES, "w:bz2"), id="tar.bz2-as-tar.xz"),
        pytest.param("tar.gz", gzip.compress(b"not a tar archive at all" * 40), id="gzip-of-non-tar"),
        pytest.param("rar", tar_bytes(FILES), id="unknown-kind"),
    ],
)
def test_check_archive_refuses(tmp_path: Path, kind: str, data: bytes) -> None:
    with pytest.raises(ArchiveError):
        check_archive(write(tmp_path, data), kind)


def test_check_archive_refuses_a_zip_with_a_corrupt_member(tmp_path: Path) -> None:
    content = b"module content that is long enough to find in the archive " * 4
    # stored, not deflated, so the bytes are found as is; flip one to break the CRC
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("main.tf", content)
    data = bytearray(buffer.getvalue())
    at = data.index(content) + 10
    data[at] ^= 0xFF
    with pytest.raises(ArchiveError):
        check_archive(write(tmp_path, bytes(data)), "zip")


def test_check_archive_limits_the_number_of_entries(tmp_path: Path) -> None:
    path = write(tmp_path, tar_bytes([(f"f{i}", b"") for i in range(11)]))
    assert check_archive(path, "tar.gz", max_entries=11) == 11
    with pytest.raises(ArchiveError):
        check_archive(path, "tar.gz", max_entries=10)


def test_check_archive_refuses_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError):
        check_archive(tmp_path / "does-not-exist", "tar.gz")


def test_chained_links_that_escape_together_are_refused(tmp_path: Path) -> None:
    archive = tmp_path / "chain.tar.gz"
    archive.write_bytes(tar_bytes([link("a/s", ".."), link("a/b/esc", "../s/..")]))
    with pytest.raises(ArchiveError, match="outside"):
        check_archive(archive, "tar.gz")


def test_writing_through_an_earlier_link_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "through.tar.gz"
    archive.write_bytes(tar_bytes([link("up", ".."), ("up/evil.tf", b"x")]))
    with pytest.raises(ArchiveError, match="outside"):
        check_archive(archive, "tar.gz")


def test_zip_symlink_entries_are_checked(tmp_path: Path) -> None:
    import stat
    import zipfile

    path = tmp_path / "link.zip"
    with zipfile.ZipFile(path, "w") as archive:
        info = zipfile.ZipInfo("link")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(info, "/etc/passwd")
    with pytest.raises(ArchiveError, match="absolute"):
        check_archive(path, "zip")


# ---------------------------------------------------------------------------------------------
# decompression bombs: unpacked size and entry count
# ---------------------------------------------------------------------------------------------

MIB = 2**20


@pytest.mark.parametrize("kind", ["tar.gz", "tar.bz2", "tar.xz", "tar"])
def test_check_archive_limits_declared_unpacked_size(tmp_path: Path, kind: str) -> None:
    mode = "w" if kind == "tar" else f"w:{kind.split('.')[1]}"
    path = write(tmp_path, tar_bytes([("a.tf", bytes(MIB)), ("b.tf", bytes(MIB))], mode))
    assert check_archive(path, kind, max_unpacked_bytes=4 * MIB) == 2
    with pytest.raises(ArchiveError, match=f"unpacks to more than {MIB + MIB // 2} bytes"):
        check_archive(path, kind, max_unpacked_bytes=MIB + MIB // 2)


@pytest.mark.parametrize("kind", ["tar.gz", "tar.bz2", "tar.xz", "tar"])
def test_check_archive_counts_bytes_behind_a_lying_header(tmp_path: Path, kind: str) -> None:
    """An empty file's header, then megabytes of zeros after the end of the archive: only the
    bytes actually read show them."""
    raw = tar_bytes([("main.tf", b"")], "w") + bytes(8 * MIB)
    compress = {"tar.gz": gzip.compress, "tar.bz2": bz2.compress, "tar.xz": lzma.compress, "tar": bytes}[kind]
    path = write(tmp_path, compress(raw))
    assert check_archive(path, kind, max_unpacked_bytes=len(raw)) == 1
    with pytest.raises(ArchiveError, match=f"unpacks to more than {len(raw) - 1} bytes"):
        check_archive(path, kind, max_unpacked_bytes=len(raw) - 1)


def test_check_archive_stops_reading_at_the_unpacked_limit(tmp_path: Path) -> None:
    from tests.fakes.bombs import gzip_tar_bomb, measure_inflation

    path = write(tmp_path, gzip_tar_bomb(64 * 2**30, lying=True), "bomb.tar.gz")  # 64 GiB behind 64 MiB
    with measure_inflation("tar.gz") as inflated, pytest.raises(ArchiveError, match="unpacks to more than"):
        check_archive(path, "tar.gz", max_unpacked_bytes=8 * MIB)
    assert 8 * MIB < inflated() <= 9 * MIB  # reading it all would inflate 64 GiB


def test_check_archive_limits_zip_declared_sizes(tmp_path: Path) -> None:
    path = write(tmp_path, zip_bytes([("a.tf", bytes(MIB)), ("b.tf", bytes(MIB))]), "a.zip")
    assert check_archive(path, "zip", max_unpacked_bytes=2 * MIB) == 2
    with pytest.raises(ArchiveError, match=f"unpacks to more than {2 * MIB - 1} bytes"):
        check_archive(path, "zip", max_unpacked_bytes=2 * MIB - 1)


def test_check_archive_limits_zip_entries(tmp_path: Path) -> None:
    path = write(tmp_path, zip_bytes([(f"f{i}.tf", b"") for i in range(11)]), "a.zip")
    assert check_archive(path, "zip", max_entries=11) == 11
    with pytest.raises(ArchiveError, match="more than 10 entries"):
        check_archive(path, "zip", max_entries=10)


@pytest.mark.parametrize("kind", ["tar.gz", "tar.bz2", "tar.xz"])
def test_corrupt_compressed_data_is_an_archive_error(tmp_path: Path, kind: str) -> None:
    mode = f"w:{kind.split('.')[1]}"
    data = tar_bytes([(f"f{i}.tf", os.urandom(64) * 64) for i in range(20)], mode)
    with pytest.raises(ArchiveError):
        check_archive(write(tmp_path, _flip(data, len(data) // 2, 16)), kind)


@pytest.mark.parametrize(
    "kind, data, limits",
    [
        pytest.param("tar.gz", tar_bytes([(f"f{i}", b"") for i in range(3)]), {"max_entries": 2}, id="tar-entries"),
        pytest.param("zip", zip_bytes([(f"f{i}.tf", b"") for i in range(3)]), {"max_entries": 2}, id="zip-entries"),
        pytest.param("tar.gz", tar_bytes([("a.tf", bytes(64))]), {"max_unpacked_bytes": 63}, id="tar-declared"),
        pytest.param("zip", zip_bytes([("a.tf", bytes(64))]), {"max_unpacked_bytes": 63}, id="zip-declared"),
        pytest.param(
            "tar.gz",
            gzip.compress(tar_bytes([("main.tf", b"")], "w") + bytes(MIB)),
            {"max_unpacked_bytes": MIB},
            id="tar-inflated",
        ),
    ],
)
def test_over_the_limits_is_too_large(tmp_path: Path, kind: str, data: bytes, limits: dict) -> None:
    """Oversize is its own kind of refusal (the module service answers it as too large)."""
    with pytest.raises(ArchiveTooLargeError):
        check_archive(write(tmp_path, data, f"a.{kind}"), kind, **limits)


def test_unsafe_or_unreadable_is_not_too_large(tmp_path: Path) -> None:
    for data in (tar_bytes([("../outside.tf", b"x")]), NOISE):
        with pytest.raises(ArchiveError) as info:
            check_archive(write(tmp_path, data), "tar.gz")
        assert not isinstance(info.value, ArchiveTooLargeError)
