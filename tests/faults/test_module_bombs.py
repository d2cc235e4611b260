"""Module archives are bounded by what they unpack to, not only by their compressed size (issue 8, item 10).

A 4 MiB `.tar.gz` that expands to 4 GiB was inflated completely by the check and then cached;
every client would have written 4 GiB into `.terraform/modules`. Now the check counts the
decompressed bytes as it reads (and the sizes the headers declare) and stops at
`--max-module-unpacked-size`; `--max-module-entries` bounds the number of entries.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.modules.packing import ArchiveTooLargeError, check_archive
from proxy.settings.config import parse_size
from tests.fakes.bombs import gzip_tar_bomb, many_entries_tar_gz, measure_inflation, zip_of_zeros
from tests.fakes.gitrepo import make_bare_repo
from tests.fakes.registry import ModuleRelease

M = "/registry/registry.example.test/modules/v1/acme/net/aws"
GIB = 2**30
_BOMBS: dict[tuple[int, bool], bytes] = {}


def bomb(gib: int, *, lying: bool = False) -> bytes:
    """`gib` GiB of zeros in a `.tar.gz` of about `gib` MiB (built once)."""
    if (gib, lying) not in _BOMBS:
        _BOMBS[gib, lying] = gzip_tar_bomb(gib * GIB, lying=lying)
    return _BOMBS[gib, lying]


def serve_module(registry, name: str, data: bytes) -> str:
    registry.static[name] = data
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.0.0", "{base}/static/" + name))
    return f"/static/{name}"


def stored_files(data_dir: Path) -> list[Path]:
    return [p for p in (data_dir / "archives").rglob("*") if p.is_file() and "sha256" in p.parts]


def assert_refused(status: int, body: bytes, words: str) -> None:
    """Refused as too large (502, `upstream_too_large`), the message naming the limit it broke."""
    assert status == 502, body[:300]
    document = json.loads(body)
    assert document["code"] == "upstream_too_large" and words in document["errors"][0], document


async def test_gzip_bomb_is_refused_and_not_stored(in_process_proxy, connect, registry):
    upstream = serve_module(registry, "net.tar.gz", bomb(4))
    assert len(registry.static["net.tar.gz"]) < 5 * 2**20  # well under --max-module-size
    process = await in_process_proxy()
    client = await connect(process, timeout=120)
    status, _, body = await client.get(f"{M}/1.0.0/archive.tar.gz")
    assert_refused(status, body, f"more than {GIB} bytes")
    assert stored_files(process.data_dir) == []
    events = process.events("security.verification_failed")
    assert events and events[-1]["check"] == "module_archive"
    status, _, _ = await client.get(f"{M}/1.0.0/archive.tar.gz")  # nothing was cached: asked again
    assert status == 502 and registry.count(upstream) == 2


@pytest.mark.parametrize("limit", ["32MiB", "8MiB"])
async def test_bomb_behind_a_lying_header_is_counted_as_inflated(in_process_proxy, connect, registry, tmp_path, limit):
    """The tar header declares an empty file and 8 GiB of zeros follow: only the bytes actually
    inflated show it, and the check stops inflating at the limit (the proxy's check, run here on
    the same archive, is measured in bytes: no timing, which a loaded machine stretches). Two limits
    far below the 8 GiB, so that stopping at each shows (the default, 1 GiB, is checked in test_config:
    inflating it twice cost 13 s of CPU)."""
    data = bomb(8, lying=True)
    serve_module(registry, "net.tar.gz", data)
    process = await in_process_proxy("--max-module-unpacked-size", limit)
    client = await connect(process, timeout=120)
    status, _, body = await client.get(f"{M}/1.0.0/archive.tar.gz")
    assert_refused(status, body, f"more than {parse_size(limit)} bytes")
    assert stored_files(process.data_dir) == []

    archive = tmp_path / "net.tar.gz"
    archive.write_bytes(data)
    with measure_inflation("tar.gz") as inflated, pytest.raises(ArchiveTooLargeError):
        check_archive(archive, "tar.gz", max_unpacked_bytes=parse_size(limit))
    # reading on to the end would inflate all 8 GiB; stopping at the limit overshoots by at most a read
    assert parse_size(limit) < inflated() <= parse_size(limit) + 2**20, inflated()


async def test_too_many_entries_are_refused(in_process_proxy, connect, registry):
    serve_module(registry, "net.tar.gz", many_entries_tar_gz(1001))
    process = await in_process_proxy("--max-module-entries", "1000")
    client = await connect(process)
    status, _, body = await client.get(f"{M}/1.0.0/archive.tar.gz")
    assert_refused(status, body, "more than 1000 entries")
    assert stored_files(process.data_dir) == []


async def test_zip_bomb_is_refused_by_declared_sizes(in_process_proxy, connect, registry):
    serve_module(registry, "net.zip", zip_of_zeros(3, 16 * 2**20))
    process = await in_process_proxy("--max-module-unpacked-size", "32MiB")
    client = await connect(process)
    status, _, body = await client.get(f"{M}/1.0.0/archive.zip")
    assert_refused(status, body, f"more than {32 * 2**20} bytes")
    assert stored_files(process.data_dir) == []


async def test_archives_within_the_limits_are_served(in_process_proxy, connect, registry):
    data = zip_of_zeros(2, 16 * 2**20)
    serve_module(registry, "net.zip", data)
    process = await in_process_proxy("--max-module-unpacked-size", "32MiB", "--max-module-entries", "2")
    client = await connect(process)
    status, _, body = await client.get(f"{M}/1.0.0/archive.zip")
    assert (status, body) == (200, data)


@pytest.mark.parametrize(
    ("files", "flags", "words"),
    [
        (
            {"main.tf": "", "big.bin": "\0" * (16 * 2**20)},
            ["--max-module-size", "4MiB"],
            f"its tree holds more than {4 * 2**20} bytes",
        ),
        ({f"f{i}.tf": "" for i in range(30)}, ["--max-module-entries", "20"], "its tree has more than 20 entries"),
    ],
    ids=["size", "entries"],
)
async def test_git_source_over_the_limits_is_refused_before_checkout(
    in_process_proxy, connect, registry, tmp_path, files, flags, words
):
    """A repository of a few hundred KiB can check out to GiBs (git compresses blobs): the tree is
    measured with `git ls-tree` before anything is written."""
    bare, _ = make_bare_repo(tmp_path / "repos", "net", files, "v1.2.0")
    registry.git_root = bare.parent
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.2.0", "git::{base}/git/net.git?ref=v1.2.0"))
    process = await in_process_proxy(*flags)
    client = await connect(process, timeout=120)
    status, _, body = await client.get(f"{M}/1.2.0/archive.tar.gz")
    assert status == 502, body[:300]
    document = json.loads(body)
    assert document["code"] == "upstream_too_large" and words in document["errors"][0], document  # names the limit
    assert stored_files(process.data_dir) == []
