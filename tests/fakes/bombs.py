"""Decompression bombs for module-archive tests, built in seconds without ever holding the expansion.

`gzip_tar_bomb` is a valid `.tar.gz` (gzip allows several members back to back, RFC 1952 §2.2;
Python and Go read them as one stream): a tar header for one file of `unpacked` zero bytes, the
zeros as repeats of one compressed 64 MiB block (~1030:1), and the end-of-archive blocks.
`measure_inflation` shows how many bytes `proxy.modules.packing.check_archive` decompressed.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import io
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from typing import IO
from unittest import mock

from proxy.modules import packing

BLOCK = 64 * 2**20


def gzip_tar_bomb(unpacked: int, name: str = "main.tf", *, lying: bool = False) -> bytes:
    """A `.tar.gz` of one file of `unpacked` zero bytes (a multiple of 64 MiB).

    `lying`: the header declares an empty file, so the zeros follow the end of the archive
    (tar readers stop there; a checker that reads to the end inflates them all).
    """
    assert unpacked % BLOCK == 0
    info = tarfile.TarInfo(name)
    info.size = 0 if lying else unpacked
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    zeros = _compressed_zeros()
    end = gzip.compress(bytes(2 * tarfile.BLOCKSIZE + tarfile.RECORDSIZE), mtime=0)
    return gzip.compress(header, mtime=0) + zeros * (unpacked // BLOCK) + end


@functools.cache
def _compressed_zeros() -> bytes:
    """One gzip member of BLOCK zero bytes (compressing 64 MiB takes a good fraction of a second)."""
    return gzip.compress(bytes(BLOCK), compresslevel=9, mtime=0)


def many_entries_tar_gz(count: int) -> bytes:
    """A `.tar.gz` of `count` empty files."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for index in range(count):
            tar.addfile(tarfile.TarInfo(f"f{index}.tf"))
    return buffer.getvalue()


def zip_of_zeros(members: int, size: int) -> bytes:
    """A `.zip` of `members` deflated files of `size` zero bytes each."""
    buffer = io.BytesIO()
    chunk = bytes(min(size, 2**20))
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for index in range(members):
            with archive.open(f"f{index}.tf", "w", force_zip64=True) as member:
                for _ in range(size // len(chunk)):
                    member.write(chunk)
    return buffer.getvalue()


class _HighWater:
    """A decompressed stream that remembers the furthest offset it was read or skipped to: the
    bytes inflated (give or take the decompressor's own small buffer)."""

    def __init__(self, inner: IO[bytes]) -> None:
        self._inner = inner
        self.furthest = 0

    def _note(self) -> None:
        self.furthest = max(self.furthest, self._inner.tell())

    def read(self, size: int = -1) -> bytes:
        data = self._inner.read(size)
        self._note()
        return data

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        position = self._inner.seek(offset, whence)
        self._note()
        return position

    def tell(self) -> int:
        return self._inner.tell()

    def __enter__(self) -> _HighWater:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._inner.close()


@contextlib.contextmanager
def measure_inflation(kind: str) -> Iterator[Callable[[], int]]:
    """While the block runs, `check_archive` reads `kind` archives through streams that remember how
    far they got; yields a function giving the most bytes any of them decompressed."""
    streams: list[_HighWater] = []
    opener = packing._DECOMPRESSORS[kind]

    def open_measured(path, mode: str) -> _HighWater:
        streams.append(_HighWater(opener(path, mode)))
        return streams[-1]

    with mock.patch.dict(packing._DECOMPRESSORS, {kind: open_measured}):
        yield lambda: max((stream.furthest for stream in streams), default=0)
