"""Disk full: a real proxy process whose data dir is a small tmpfs, filled by a filler file.

Below the free-space floor `/readyz` is 503 and archives are relayed from the upstream without
being stored, verified on the way (the last chunk is sent only once the digest matched); a
failed temp-file write (ENOSPC) or metadata write falls back the same way; freeing space
recovers by itself.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from proxy.providers.signatures import Keyring
from tests.fakes.packages import MODULE_FILES, Release, module_tar_gz
from tests.fakes.process import wait_for
from tests.fakes.registry import ModuleRelease

MiB = 2**20
DISK = "16m"
NOT_ROOT = "disk-full faults need root to mount a tmpfs: NOT TESTED"
FLOOR_ENV = "REGISTRY_PROXY_MIN_FREE_SPACE"
MIRROR = "/mirror/v1/registry.example.test/acme"
BIG = f"{MIRROR}/big/2.0.0/linux_amd64/terraform-provider-big_2.0.0_linux_amd64.zip"
FOO = f"{MIRROR}/foo/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
MODULES = "/registry/registry.example.test/modules/v1/acme"
PROVIDERS = "/registry/registry.example.test/providers/v1/acme"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason=NOT_ROOT),
    # A file object the proxy left to the garbage collector would be closed late, reported only as this warning.
    pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A 16 MiB tmpfs as the proxy's data dir (request it before `in_process_proxy`, so it unmounts last)."""
    path = tmp_path / "proxy-data"
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"{NOT_ROOT} (mount failed: {mounted.stderr.strip()})")
    try:
        yield path
    finally:
        if (path / "gnupg").is_dir():  # the proxy's gpg-agent would keep the tmpfs busy
            subprocess.run(["gpgconf", "--homedir", str(path / "gnupg"), "--kill", "gpg-agent"], capture_output=True)
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.fixture
def big(registry, signing_key) -> Release:
    """A provider whose archive (4 MiB of stored random data) is bigger than what is left on the disk."""
    return registry.add(Release("acme", "big", "2.0.0", signing_key, platforms=("linux_amd64",), noise=4 * MiB))


def free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def fill(path: Path, leave: int, name: str = "filler") -> Path:
    """Write a file so that about `leave` bytes stay free (0: until the disk is full)."""
    filler = path / name
    remaining = max(free_bytes(path) - leave, 0)
    block = b"\0" * MiB
    with open(filler, "ab", buffering=0) as handle:
        try:
            while remaining > 0:
                handle.write(block[: min(remaining, MiB)])
                remaining -= MiB
            if leave == 0:
                while True:
                    handle.write(block[:4096])
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    return filler


def stored(data_dir: Path) -> set[str]:
    return {p.name for p in (data_dir / "archives" / "sha256").rglob("*") if p.is_file()}


def temp_files(data_dir: Path) -> list[Path]:
    """Files in the temp dirs, but the lock file each live process holds in its own."""
    return [p for p in (data_dir / "archives" / "tmp").rglob("*") if p.is_file() and p.name != ".lock"]


async def readyz(client, status: int, timeout: float = 15) -> dict:
    """Poll /readyz until it answers `status` (the proxy re-reads free space about once a second)."""
    deadline = time.monotonic() + timeout
    while True:
        code, _, body = await client.get("/readyz")
        if code == status:
            import json

            return json.loads(body)
        assert time.monotonic() < deadline, f"/readyz stayed {code}: {body!r}"
        await asyncio.sleep(0.1)


async def passthrough_count(client, kind: str, outcome: str) -> float:
    _, _, body = await client.get("/metrics")
    for line in body.decode().splitlines():
        if line.startswith(f'registry_proxy_archive_passthrough_total{{kind="{kind}",outcome="{outcome}"}}'):
            return float(line.split()[-1])
    return 0.0


async def test_below_the_floor_archives_are_relayed_verified_and_not_stored(
    small_disk, in_process_proxy, connect, registry, big, monkeypatch
):
    monkeypatch.setenv(FLOOR_ENV, "6MiB")
    proc = await in_process_proxy(data_dir=small_disk)
    client = await connect(proc)
    assert (await readyz(client, 200))["status"] == "ready"
    filler = fill(small_disk, leave=2 * MiB)

    ready = await readyz(client, 503)
    assert ready["status"] == "not ready" and ready["checks"]["disk_space"] is False
    assert 0 < ready["disk_space"]["free_bytes"] < 6 * MiB == ready["disk_space"]["min_free_bytes"]

    before = stored(small_disk)
    status, headers, data = await client.get(BIG)
    assert status == 200, data[:300]
    assert hashlib.sha256(data).hexdigest() == big.sha256("linux_amd64")
    assert int(headers["Content-Length"]) == len(data)
    assert stored(small_disk) == before and not temp_files(small_disk)
    assert await passthrough_count(client, "provider", "complete") == 1
    assert proc.events("archive.passthrough")

    for document in ("big/index.json", "big/2.0.0.json", "foo/index.json", "foo/1.0.0.json"):
        status, _, body = await client.get(f"{MIRROR}/{document}")
        assert status == 200, (document, body)

    registry.tampered.add(big.filename("linux_amd64"))
    with pytest.raises(aiohttp.ClientPayloadError):
        await client.get(BIG)
    assert await passthrough_count(client, "provider", "verification_failed") == 1
    assert stored(small_disk) == before and not temp_files(small_disk)
    registry.tampered.clear()

    status, _, body = await client.get("/lock/v1/registry.example.test/acme/foo/1.0.0?platform=linux_amd64")
    assert (status, json.loads(body)["code"]) == (503, "disk_full"), body

    filler.unlink()
    assert (await readyz(client, 200))["checks"]["disk_space"] is True
    status, _, data = await client.get(BIG)
    assert status == 200 and hashlib.sha256(data).hexdigest() == big.sha256("linux_amd64")
    assert big.sha256("linux_amd64") in stored(small_disk)
    assert await passthrough_count(client, "provider", "complete") == 1


async def test_enospc_while_downloading_and_failed_metadata_writes(
    small_disk, in_process_proxy, connect, registry, big, monkeypatch
):
    monkeypatch.setenv(FLOOR_ENV, "0")  # no floor: only the write errors tell the proxy the disk is full
    registry.chunked_archives = True  # no Content-Length: the proxy cannot see it will not fit
    proc = await in_process_proxy(data_dir=small_disk)
    client = await connect(proc)
    await readyz(client, 200)  # the metadata store exists before the disk fills
    filler = fill(small_disk, leave=1 * MiB)

    status, headers, data = await client.get(BIG)
    assert status == 200, data[:300]
    assert hashlib.sha256(data).hexdigest() == big.sha256("linux_amd64")
    assert "Content-Length" not in headers
    assert not stored(small_disk) and not temp_files(small_disk)

    registry.tampered.add(big.filename("linux_amd64"))
    with pytest.raises(aiohttp.ClientPayloadError):
        await client.get(BIG)
    registry.tampered.clear()

    # foo 1.1.0's SHA256SUMS is verified while there is room (gpg needs a little); 1.0.0's is not
    status, _, _ = await client.get(f"{PROVIDERS}/foo/1.1.0/download/linux/amd64/SHA256SUMS")
    assert status == 200
    more = fill(small_disk, leave=0, name="filler2")
    assert free_bytes(small_disk) < 64 * 1024
    for document in ("foo/index.json", "foo/1.1.0.json"):  # not fetched yet: their metadata writes fail
        status, _, body = await client.get(f"{MIRROR}/{document}")
        assert status == 200, (document, body)
    status, _, data = await client.get(f"{MIRROR}/foo/1.1.0/linux_amd64/terraform-provider-foo_1.1.0_linux_amd64.zip")
    assert status == 200, data[:300]
    assert hashlib.sha256(data).hexdigest() == registry.releases[("acme", "foo")]["1.1.0"].sha256("linux_amd64")
    # Logged once per full-disk spell: by the embedded store's breaker (which catches its own write
    # errors), or by the disk-full guard in front of a store that raises them.
    skipped = proc.events("storage.metadata_write_skipped") + [
        e for e in proc.events("metadata_store.down") if "full" in e.get("error", "")
    ]
    assert len(skipped) == 1, skipped

    status, headers, body = await client.get(f"{MIRROR}/foo/1.0.0.json")
    assert status == 503 and headers["Content-Type"] == "application/json", body
    assert json.loads(body)["code"] == "disk_full", body
    assert not [e for e in proc.events("security.verification_failed") if e["check"] == "signature"]
    assert not stored(small_disk) and not temp_files(small_disk)

    filler.unlink()
    more.unlink()
    status, _, data = await client.get(BIG)
    assert status == 200 and hashlib.sha256(data).hexdigest() == big.sha256("linux_amd64")
    assert stored(small_disk) == {big.sha256("linux_amd64")}


def test_a_signature_that_cannot_be_written_leaves_no_file_behind(small_disk, signing_key):
    keyring = Keyring(small_disk / "gnupg")
    try:
        keyring.import_keys([signing_key.armored_public_key])
        fill(small_disk, leave=0)
        with pytest.raises(OSError) as raised:
            keyring.verify_detached(b"data", signing_key.sign(b"data"), [signing_key.armored_public_key])
        assert raised.value.errno == errno.ENOSPC
        assert list((small_disk / "gnupg").glob("sig-*")) == []  # removed now, not by the garbage collector
    finally:
        keyring.close()


async def test_a_client_following_a_cold_download_gets_it_whole_when_the_disk_fills(
    small_disk, in_process_proxy, connect, registry, big, monkeypatch
):
    """The disk fills while a cold archive downloads (issue 18, item 8): the client that follows the
    download (the first, with the Content-Length announced) gets the rest relayed from the upstream and
    verified, not a cut body; nothing is stored."""
    monkeypatch.setenv(FLOOR_ENV, "0")  # only the failing write tells the proxy the disk is full
    hold = registry.hold(registry.archive_path(big, "linux_amd64"))
    proc = await in_process_proxy(data_dir=small_disk)
    client = await connect(proc)
    await readyz(client, 200)

    first = asyncio.ensure_future(client.get(BIG))
    notices = small_disk / "archives" / "growing"
    await wait_for(lambda: any(notices.glob("*.json")), 15, "the download to be announced for followers")
    filler = fill(small_disk, leave=2 * MiB)  # about half of the 4 MiB archive fits
    hold.release.set()
    status, headers, data = await first
    assert status == 200, data[:300]
    assert int(headers["Content-Length"]) == len(data)
    assert hashlib.sha256(data).hexdigest() == big.sha256("linux_amd64")
    assert proc.events("storage.disk_full")  # the write did fail midway
    assert [e["sent_bytes"] > 0 for e in proc.events("archive.rest_relayed")] == [True]  # after what was written
    assert await passthrough_count(client, "provider", "complete") == 1
    assert not stored(small_disk) and not temp_files(small_disk)

    filler.unlink()
    status, _, data = await client.get(BIG)
    assert status == 200 and hashlib.sha256(data).hexdigest() == big.sha256("linux_amd64")
    assert stored(small_disk) == {big.sha256("linux_amd64")}


async def test_modules_are_relayed_only_with_a_checksum_pin(
    small_disk, in_process_proxy, connect, registry, monkeypatch
):
    monkeypatch.setenv(FLOOR_ENV, "100MiB")  # more than the whole 16 MiB disk: always below the floor
    archive = module_tar_gz(MODULE_FILES)
    registry.static["net.tar.gz"] = archive
    pin = hashlib.sha256(archive).hexdigest()
    pinned = f"{{base}}/static/net.tar.gz?checksum=sha256:{pin}"
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.0.0", pinned))
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.1.0", "{base}/static/net.tar.gz"))
    proc = await in_process_proxy(data_dir=small_disk)
    client = await connect(proc)
    await readyz(client, 503)

    status, _, data = await client.get(f"{MODULES}/net/aws/1.0.0/archive.tar.gz")
    assert status == 200 and data == archive
    assert await passthrough_count(client, "module", "complete") == 1

    status, headers, body = await client.get(f"{MODULES}/net/aws/1.1.0/archive.tar.gz")
    assert status == 503 and headers["Content-Type"] == "application/json", body
    assert json.loads(body)["code"] == "disk_full" and b"checksum" in body  # says a ?checksum= pin would do
    assert not stored(small_disk) and not temp_files(small_disk)

    # a tampered archive of one chunk is withheld whole: nothing was sent, so the answer is a clean 502
    registry.static["net.tar.gz"] = archive[:-1] + bytes([archive[-1] ^ 1])
    status, _, body = await client.get(f"{MODULES}/net/aws/1.0.0/archive.tar.gz")
    assert (status, json.loads(body)["code"]) == (502, "checksum_mismatch"), body
    assert await passthrough_count(client, "module", "verification_failed") == 1
