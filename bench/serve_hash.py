"""What hashing every served archive costs: the store's read loop with and without its hashes, one run.

```
.venv/bin/python bench/serve_hash.py [--size-mib 200] [--s3-size-mib 64] [--repeats 5] [--no-s3]
```

Every whole-body serve of a stored archive is hashed (docs/integrity.md#archive-stores). This measures,
in one process and interleaved, the reader the server uses (`ArchiveReader.chunks(CHUNK)`, what
`web/archive_responses.py` writes to the client) reading a whole archive in three ways, for both backends:

- `first serve`: the SHA-256 checked, and the BLAKE3 fingerprint of the content taken on the way (a
  process's first whole read of an archive),
- `later serves`: the fingerprint checked alone (every whole read after that),
- `not hashed`: no hash (a range of a verified copy; what serving cost before every serve was hashed,
  for a file found intact before).

- disk: an archive of `--size-mib` MiB in the page cache (the warm case: the hash is the main cost),
- S3: an object of `--s3-size-mib` MiB in moto's S3 server over HTTPS (`tests/fakes/s3_server.py`, a
  child process; moto is slow, so the hash is a small part of the time there).

Reported per mode: medians of this process's CPU seconds per GiB (all its threads) and MiB/s.
No network to a client and no TLS towards one: those cost the same with and without the hash.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trustme

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.runtime.metrics import Metrics
from proxy.settings.config import parse_s3_location
from proxy.storage import ArchiveGuard, ArchiveReader, ArchiveStore, StoredArchive
from proxy.storage.disk import DiskStore
from proxy.storage.s3 import S3Options, S3Store
from proxy.web.archive_responses import CHUNK
from tests.fakes.s3_server import CREDENTIALS, REGION, S3Server

MIB = 1 << 20


async def drain(guard: ArchiveGuard, stored: StoredArchive, check: bool) -> None:
    """Read the whole archive through the guard's reader, checked (as the guard knows it) or not."""
    reader = ArchiveReader(
        guard, stored, await guard.store.open_reader(stored, 0, stored.size), stored.size, check=check
    )
    total = 0
    try:
        async for chunk in reader.chunks(CHUNK):
            total += len(chunk)
    finally:
        reader.close()
    assert total == stored.size, (total, stored.size)


async def publish(store: ArchiveStore, data: bytes) -> StoredArchive:
    path = store.temp_path()
    path.write_bytes(data)
    return await store.publish_path(path, hashlib.sha256(data).hexdigest())


MODES = ("first serve", "later serves", "not hashed")


async def measure(
    store: ArchiveStore, stored: StoredArchive, size: int, repeats: int
) -> dict[str, tuple[float, float]]:
    """Median (CPU s per GiB, MiB/s) of each mode, interleaved."""
    known = ArchiveGuard(store, Metrics())
    await drain(known, stored, True)  # the fingerprint taken (and the file in the page cache)
    runs: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for _ in range(repeats):
        for label in MODES:
            guard = ArchiveGuard(store, Metrics()) if label == "first serve" else known
            cpu, wall = time.process_time(), time.perf_counter()
            await drain(guard, stored, label != "not hashed")
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            runs[label].append((cpu / (size / 2**30), size / MIB / wall))
    return {
        label: (statistics.median(c for c, _ in values), statistics.median(m for _, m in values))
        for label, values in runs.items()
    }


async def disk(root: Path, size: int, repeats: int) -> dict[str, tuple[float, float]]:
    store = DiskStore(root / "disk")
    await store.open()
    try:
        return await measure(store, await publish(store, os.urandom(size)), size, repeats)
    finally:
        await store.close()


async def s3(root: Path, size: int, repeats: int) -> dict[str, tuple[float, float]]:
    ca = trustme.CA()
    ca_file, cert_file, key_file = root / "ca.pem", root / "cert.pem", root / "key.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    os.environ.update(CREDENTIALS)
    server = await asyncio.to_thread(S3Server, cert_file, key_file, ca_file)
    bucket = server.bucket()
    store = S3Store(
        root / "s3",
        parse_s3_location(f"s3://{bucket}/archives"),
        S3Options(endpoint_url=server.url, region=REGION, path_style=True, ca_file=ca_file),
    )
    try:
        await store.open()
        return await measure(store, await publish(store, os.urandom(size)), size, repeats)
    finally:
        await store.close()
        server.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=200, help="the archive on disk (default 200)")
    parser.add_argument("--s3-size-mib", type=int, default=64, help="the object in S3 (default 64)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-s3", action="store_true", help="skip the S3 backend")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="serve-hash-") as tmp:
        root = Path(tmp)
        backends = [("disk (page cache)", args.size_mib, disk)]
        if not args.no_s3:
            backends.append(("S3 (moto over HTTPS)", args.s3_size_mib, s3))
        for label, mib, run in backends:
            print(f"{label}, {mib} MiB, {args.repeats} rounds (load {os.getloadavg()[0]:.1f}):")
            results = await run(root, mib * MIB, args.repeats)
            for mode, (cpu_gib, mib_s) in results.items():
                print(f"  {mode:12} CPU {cpu_gib:5.2f} s per GiB  {mib_s:7.0f} MiB/s")
            base = results["not hashed"][0]
            print(
                f"  the hashes add {results['first serve'][0] - base:.2f} CPU s per GiB on a first serve, "
                f"{results['later serves'][0] - base:.2f} on later ones"
            )


if __name__ == "__main__":
    asyncio.run(main())
