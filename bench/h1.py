"""CPU cost of a provider zip's `h1:`: hashed from the stream as it arrives, or read back after the download.

```
.venv/bin/python bench/h1.py [--size-mib 200] [--repeats 3]
```

Two archives of `--size-mib` MiB each: one stored member of random bytes (like the bench's big provider),
and one deflated member of compressible bytes (like a real provider's executable). For each, in one
process on one thread, medians of `--repeats`:

- `stream`: `ZipStreamHasher.feed` over 1 MiB chunks (the work the download's tap thread does while the
  archive arrives, overlapped with the download),
- `confirm`: `h1_of_streamed_zip` (what is left after the last byte: the central directory read and checked),
- `h1_of_zip`: the whole file read back and hashed (what followed the download before).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.domain.hashes import h1_of_zip
from proxy.domain.ziphash import ZipStreamHasher, h1_of_streamed_zip

CHUNK = 1 << 20
T = TypeVar("T")


def make_zip(path: Path, size: int, method: int) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        info = zipfile.ZipInfo("terraform-provider-bench_v1.0.0")
        info.compress_type = method
        with archive.open(info, "w", force_zip64=True) as member:
            block = os.urandom(CHUNK) if method == zipfile.ZIP_STORED else None
            for written in range(0, size, CHUNK):
                data = block if block is not None else _compressible(written)
                member.write(data[: min(CHUNK, size - written)])
        archive.writestr("LICENSE", b"MPL-2.0\n")


def _compressible(seed: int) -> bytes:
    """About 4:1 under deflate (a Go executable is nearer 3:1)."""
    return (os.urandom(CHUNK // 4) + bytes(seed % 251 for _ in range(64)) * (3 * CHUNK // 256))[:CHUNK]


def cpu(action: Callable[[], T]) -> tuple[T, float, float]:
    """What `action` returns, its CPU seconds in this thread and its wall seconds."""
    started, wall = time.thread_time(), time.perf_counter()
    result = action()
    return result, time.thread_time() - started, time.perf_counter() - wall


def stream(hasher: ZipStreamHasher, chunks: list[bytes]) -> None:
    for chunk in chunks:
        hasher.feed(chunk)
    hasher.finish()


def confirm(hasher: ZipStreamHasher, path: Path) -> tuple[str, str]:
    with open(path, "rb") as handle:
        return h1_of_streamed_zip(hasher, handle)


def read_back(path: Path) -> tuple[str, str]:
    with open(path, "rb") as handle:
        return h1_of_zip(handle)


def measure(path: Path, repeats: int) -> dict[str, tuple[float, float]]:
    data = path.read_bytes()
    chunks = [data[start : start + CHUNK] for start in range(0, len(data), CHUNK)]  # as the download hands them on
    results: dict[str, list[tuple[float, float]]] = {"stream": [], "confirm": [], "h1_of_zip": []}
    for _ in range(repeats):
        hasher = ZipStreamHasher()
        _, *streaming = cpu(functools.partial(stream, hasher, chunks))
        streamed, *confirming = cpu(functools.partial(confirm, hasher, path))
        full, *reading = cpu(functools.partial(read_back, path))
        assert streamed == full, "the streamed h1 differs from h1_of_zip"
        for name, (cpu_s, wall_s) in (("stream", streaming), ("confirm", confirming), ("h1_of_zip", reading)):
            results[name].append((cpu_s, wall_s))
    return {
        name: (statistics.median(c for c, _ in runs), statistics.median(w for _, w in runs))
        for name, runs in results.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    size = args.size_mib << 20
    with tempfile.TemporaryDirectory() as tmp:
        for label, method in (("stored, random", zipfile.ZIP_STORED), ("deflated, ~4:1", zipfile.ZIP_DEFLATED)):
            path = Path(tmp) / "provider.zip"
            make_zip(path, size, method)
            archive_gib, unpacked_gib = path.stat().st_size / 2**30, size / 2**30
            print(
                f"{args.size_mib} MiB unpacked, {label}: archive {path.stat().st_size / 2**20:.0f} MiB "
                f"(load {os.getloadavg()[0]:.1f})"
            )
            for name, (cpu_s, wall_s) in measure(path, args.repeats).items():
                print(
                    f"  {name:10} CPU {cpu_s * 1000:7.1f} ms  wall {wall_s * 1000:7.1f} ms  CPU per GiB of archive "
                    f"{cpu_s / archive_gib:5.2f} s, of unpacked {cpu_s / unpacked_gib:5.2f} s"
                )


if __name__ == "__main__":
    main()
