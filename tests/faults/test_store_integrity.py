"""Store integrity against a real proxy process: a corrupted archive on disk is never served.

Faults injected into the data dir of a running (or restarted) `python -m proxy serve`: a
flipped byte, a file truncated to 0 bytes, a wrong file dropped at a content address after
the metadata was lost, and temp dirs of dead processes whose PID is alive again.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import socket
import time
from pathlib import Path

import aiohttp
import pytest

from tests.fakes.packages import MODULE_FILES, Release, module_tar_gz
from tests.fakes.process import ProxyProcess, registry_proxy_in_process
from tests.fakes.registry import FakeRegistry, ModuleRelease

PROVIDER = "registry.example.test/acme/foo"
SMALL = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
BIG = "/mirror/v1/registry.example.test/acme/big/2.0.0/linux_amd64/terraform-provider-big_2.0.0_linux_amd64.zip"
MODULE = "/registry/registry.example.test/modules/v1/acme/net/aws/1.0.0/archive.tar.gz"


@pytest.fixture
def big(registry: FakeRegistry, signing_key) -> Release:
    """A provider whose archive spans several 1 MiB serving chunks."""
    return registry.add(Release("acme", "big", "2.0.0", signing_key, platforms=("linux_amd64",), noise=3 << 20))


def small_release(registry: FakeRegistry) -> Release:
    return registry.releases[("acme", "foo")]["1.0.0"]


def object_path(proc: ProxyProcess, sha: str) -> Path:
    return proc.data_dir / "archives" / "sha256" / sha[:2] / sha[2:4] / sha


def quarantined(proc: ProxyProcess, sha: str) -> list[Path]:
    folder = proc.data_dir / "archives" / "quarantine"
    return sorted(folder.glob(f"{sha}-*")) if folder.is_dir() else []


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x01]))


def append_bytes(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def hold_lock(path: Path):
    """An exclusive flock on `path`, held until the returned file is closed."""
    handle = open(path, "w")  # noqa: SIM115 - the caller closes it
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return handle


def can_lock(path: Path) -> bool:
    with open(path) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


async def get_or_abort(client, path: str, **kwargs) -> tuple[int | None, bytes | None]:
    """(status, body), or (None, None) when the proxy cut the response off."""
    try:
        status, _, body = await client.get(path, **kwargs)
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
        return None, None
    return status, body


async def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def assert_corruption_logged(proc: ProxyProcess, sha: str) -> None:
    events = [e for e in proc.events("security.store_corruption") if e.get("sha256") == sha]
    assert events, "security.store_corruption was not logged"
    assert {"path", "size", "expected_size"} <= set(events[0])


# ---- byte flips and truncation, TLS and plain HTTP ------------------------------------------------


@pytest.mark.parametrize("offset", ["first", "last"])
async def test_flipped_byte_is_never_served_and_is_refetched(in_process_proxy, connect, registry, big, offset):
    proc = await in_process_proxy()
    client = await connect(proc)
    good = big.zips["linux_amd64"]
    sha = big.sha256("linux_amd64")
    assert await get_or_abort(client, BIG) == (200, good)
    flip_byte(object_path(proc, sha), 10 if offset == "first" else len(good) - 10)

    status, body = await get_or_abort(client, BIG)
    assert (status, body) in ((None, None), (200, good)), "a corrupted archive went out as a complete answer"
    await wait_for(lambda: quarantined(proc, sha))
    assert_corruption_logged(proc, sha)

    assert await get_or_abort(client, BIG) == (200, good)
    assert registry.count(registry.archive_path(big, "linux_amd64")) == 2
    assert (await asyncio.to_thread(object_path(proc, sha).read_bytes)) == good


async def test_clients_leaving_mid_stream_leave_no_open_file_behind(in_process_proxy, connect, registry, signing_key):
    """The hashing reader reads ahead in a worker thread; a client leaving must still close the file."""
    huge = registry.add(Release("acme", "big", "2.0.0", signing_key, platforms=("linux_amd64",), noise=48 << 20))
    proc = await in_process_proxy()
    client = await connect(proc)
    good, sha = huge.zips["linux_amd64"], huge.sha256("linux_amd64")
    assert await get_or_abort(client, BIG) == (200, good)

    async def leave_early() -> None:
        async with client.session.get(proc.url + BIG) as response:
            assert response.status == 200
            await response.content.readexactly(1 << 20)
            response.close()

    await asyncio.gather(*(leave_early() for _ in range(8)))
    target = str(object_path(proc, sha))

    def open_handles() -> int:
        fds = Path(f"/proc/{proc.pid}/fd")
        return sum(1 for fd in fds.iterdir() if _link(fd) == target)

    await wait_for(lambda: open_handles() == 0)
    complete = [
        e
        for e in proc.events("request")
        if e.get("path") == BIG and e.get("bytes") == len(good) and e.get("status") == 200
    ]
    assert len(complete) < 1 + 8, "no client left while the proxy was still sending"
    assert await get_or_abort(client, BIG) == (200, good)
    assert not proc.events("security.store_corruption")


@pytest.mark.parametrize("plain", [False, True], ids=["tls", "plain-http"])
async def test_a_file_rewritten_while_a_slow_reader_reads_it_never_goes_out_whole(
    in_process_proxy, connect, registry, signing_key, plain
):
    """An archive verified (served) before, changed in place while a slow client is half-way through it:
    the client never gets the changed archive whole, over TLS or plain HTTP."""
    huge = registry.add(Release("acme", "big", "2.0.0", signing_key, platforms=("linux_amd64",), noise=32 << 20))
    proc = await in_process_proxy(*(("--plain-http",) if plain else ()))
    client = await connect(proc)
    good, sha = huge.zips["linux_amd64"], huge.sha256("linux_amd64")
    assert await get_or_abort(client, BIG) == (200, good)  # fetched and verified
    assert await get_or_abort(client, BIG) == (200, good)  # served from the store, found intact

    received = b""
    with pytest.raises((aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
        async with client.session.get(proc.url + BIG) as response:
            assert response.status == 200
            received = await response.content.readexactly(1 << 20)  # then it stops reading for a while:
            # the proxy is far from the end (socket buffers hold a few MiB) when the file changes under it
            await asyncio.to_thread(flip_byte, object_path(proc, sha), len(good) - 100)
            received += await response.read()
    assert received != good, "the changed archive went out as a complete answer"
    await wait_for(lambda: quarantined(proc, sha))
    assert_corruption_logged(proc, sha)
    assert await get_or_abort(client, BIG) == (200, good)  # fetched and verified again
    assert registry.count(registry.archive_path(huge, "linux_amd64")) == 2


def _link(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


async def test_truncated_to_zero_is_refetched_within_the_same_request(in_process_proxy, connect, registry):
    proc = await in_process_proxy()
    client = await connect(proc)
    release = small_release(registry)
    good, sha = release.zips["linux_amd64"], release.sha256("linux_amd64")
    assert await get_or_abort(client, SMALL) == (200, good)
    os.truncate(object_path(proc, sha), 0)

    status, headers, body = await client.get(SMALL)
    assert (status, body) == (200, good)
    assert {k.lower(): v for k, v in headers.items()}["etag"] == f'"{sha}"'
    assert quarantined(proc, sha)
    assert_corruption_logged(proc, sha)
    assert registry.count(registry.archive_path(release, "linux_amd64")) == 2


async def test_flipped_byte_is_not_served_in_plain_http_mode(in_process_proxy, connect, registry, big):
    """Plain HTTP hashes what it sends as TLS does (no sendfile), even with the mtime restored."""
    proc = await in_process_proxy("--plain-http")
    assert proc.url.startswith("http://")
    client = await connect(proc)
    good, sha = big.zips["linux_amd64"], big.sha256("linux_amd64")
    assert await get_or_abort(client, BIG) == (200, good)
    assert await get_or_abort(client, BIG) == (200, good)
    path = object_path(proc, sha)
    before = path.stat()
    flip_byte(path, len(good) // 2)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # an attacker restoring mtime: ctime still moves

    status, body = await get_or_abort(client, BIG)
    assert (status, body) in ((None, None), (200, good))
    await wait_for(lambda: quarantined(proc, sha))
    assert_corruption_logged(proc, sha)
    assert await get_or_abort(client, BIG) == (200, good)
    assert registry.count(registry.archive_path(big, "linux_amd64")) == 2


async def test_plain_http_after_restart_hashes_before_trusting_a_file(in_process_proxy, connect, registry, big):
    proc = await in_process_proxy("--plain-http")
    client = await connect(proc)
    good, sha = big.zips["linux_amd64"], big.sha256("linux_amd64")
    assert await get_or_abort(client, BIG) == (200, good)
    await proc.stop()
    flip_byte(object_path(proc, sha), 5)

    again = await in_process_proxy("--plain-http", data_dir=proc.data_dir)
    client = await connect(again)
    status, body = await get_or_abort(client, BIG)
    assert (status, body) in ((None, None), (200, good))
    await wait_for(lambda: quarantined(again, sha))
    assert_corruption_logged(again, sha)
    assert await get_or_abort(client, BIG) == (200, good)


@pytest.mark.parametrize("plain", [False, True], ids=["tls", "plain-http"])
async def test_range_from_a_corrupted_file_is_served_from_a_fresh_copy(in_process_proxy, connect, registry, big, plain):
    """A range cannot be hashed alone: the whole file is verified first (once per change of the file)."""
    extra = ("--plain-http",) if plain else ()
    proc = await in_process_proxy(*extra)
    client = await connect(proc)
    good, sha = big.zips["linux_amd64"], big.sha256("linux_amd64")
    assert await get_or_abort(client, BIG) == (200, good)
    await proc.stop()
    flip_byte(object_path(proc, sha), 100)

    again = await in_process_proxy(*extra, data_dir=proc.data_dir)
    client = await connect(again)
    status, _, body = await client.get(BIG, headers={"Range": "bytes=90-109"})
    assert (status, body) == (206, good[90:110])
    assert quarantined(again, sha)
    assert_corruption_logged(again, sha)
    assert registry.count(registry.archive_path(big, "linux_amd64")) == 2


async def test_truncated_module_archive_is_refetched(in_process_proxy, connect, registry):
    registry.static["net-1.0.0.tar.gz"] = module_tar_gz(MODULE_FILES)
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.0.0", "{base}/static/net-1.0.0.tar.gz"))
    good = registry.static["net-1.0.0.tar.gz"]
    proc = await in_process_proxy()
    client = await connect(proc)
    assert await get_or_abort(client, MODULE) == (200, good)
    sha = hashlib.sha256(good).hexdigest()
    append_bytes(object_path(proc, sha), b"appended")

    assert await get_or_abort(client, MODULE) == (200, good)
    assert quarantined(proc, sha)
    assert_corruption_logged(proc, sha)
    assert registry.count("/static/net-1.0.0.tar.gz") == 2


# ---- adoption after metadata loss -----------------------------------------------------------------


async def test_wrong_file_at_a_content_address_is_not_adopted_after_metadata_loss(in_process_proxy, connect, registry):
    proc = await in_process_proxy()
    client = await connect(proc)
    release = small_release(registry)
    good, sha = release.zips["linux_amd64"], release.sha256("linux_amd64")
    assert await get_or_abort(client, SMALL) == (200, good)
    await proc.stop()
    # Another valid zip (so h1 hashing alone would accept it) dropped at 1.0.0's address, metadata gone.
    object_path(proc, sha).write_bytes(registry.releases[("acme", "foo")]["1.1.0"].zips["linux_amd64"])
    for leftover in (proc.data_dir / "metadata").iterdir():
        leftover.unlink()

    again = await in_process_proxy(data_dir=proc.data_dir)
    client = await connect(again)
    assert await get_or_abort(client, SMALL) == (200, good)
    assert quarantined(again, sha)
    assert_corruption_logged(again, sha)
    assert registry.count(registry.archive_path(release, "linux_amd64")) == 2
    assert object_path(again, sha).read_bytes() == good


async def test_intact_file_is_adopted_after_metadata_loss_without_a_download(in_process_proxy, connect, registry):
    proc = await in_process_proxy()
    client = await connect(proc)
    release = small_release(registry)
    assert await get_or_abort(client, SMALL) == (200, release.zips["linux_amd64"])
    await proc.stop()
    for leftover in (proc.data_dir / "metadata").iterdir():
        leftover.unlink()
    again = await in_process_proxy(data_dir=proc.data_dir)
    client = await connect(again)
    assert await get_or_abort(client, SMALL) == (200, release.zips["linux_amd64"])
    assert registry.count(registry.archive_path(release, "linux_amd64")) == 1
    assert not again.events("security.store_corruption")


# ---- registry-proxy verify ------------------------------------------------------------------------


async def test_verify_finds_a_flipped_byte_and_repair_moves_it_aside(in_process_proxy, connect, registry, big):
    proc = await in_process_proxy()
    client = await connect(proc)
    good, sha = big.zips["linux_amd64"], big.sha256("linux_amd64")
    small = small_release(registry)
    assert await get_or_abort(client, BIG) == (200, good)
    assert await get_or_abort(client, SMALL) == (200, small.zips["linux_amd64"])

    code, output = await registry_proxy_in_process("verify", "--data-dir", str(proc.data_dir))
    assert code == 0, output
    assert "2 objects" in output and "0 corrupt" in output

    flip_byte(object_path(proc, sha), 1234)
    code, output = await registry_proxy_in_process("verify", "--data-dir", str(proc.data_dir))
    assert code == 1, output
    assert sha in output and "1 corrupt" in output
    assert object_path(proc, sha).exists(), "verify without --repair must not move anything"

    code, output = await registry_proxy_in_process("verify", "--data-dir", str(proc.data_dir), "--repair")
    assert code == 0, output
    assert sha in output and "quarantined" in output
    assert not object_path(proc, sha).exists() and quarantined(proc, sha)

    code, output = await registry_proxy_in_process("verify", "--data-dir", str(proc.data_dir))
    assert code == 0 and "1 objects" in output, output
    # The running proxy fetches it again on the next request.
    assert await get_or_abort(client, BIG) == (200, good)
    assert registry.count(registry.archive_path(big, "linux_amd64")) == 2


async def test_verify_reports_leftover_temp_dirs(tmp_path):
    data = tmp_path / "verify-data"
    leftover = data / "archives" / "tmp" / f"{socket.gethostname()}-1-0badf00d"
    leftover.mkdir(parents=True)
    (leftover / ".lock").touch()
    (leftover / "x.part").write_bytes(b"x" * 100)
    (data / "archives" / "sha256").mkdir(parents=True)
    code, output = await registry_proxy_in_process("verify", "--data-dir", str(data))
    assert code == 0, output
    assert "1 abandoned temp dir" in output
    code, output = await registry_proxy_in_process("verify", "--data-dir", str(data), "--repair")
    assert code == 0 and not leftover.exists(), output


# ---- temp dirs: locks, not PIDs ---------------------------------------------------------------------


def _temp_dirs(data_dir: Path) -> set[str]:
    return {p.name for p in (data_dir / "archives" / "tmp").iterdir() if p.is_dir()}


async def test_temp_dir_of_a_dead_process_with_a_reused_pid_is_reaped(in_process_proxy, tmp_path):
    data = tmp_path / "proxy-data"
    tmp = data / "archives" / "tmp"
    # PID 1 and this test's PID (the proxy's own, served in this process) are alive, yet nobody holds these
    # directories' locks.
    stale = [tmp / f"{socket.gethostname()}-1-0badf00d", tmp / f"{socket.gethostname()}-{os.getpid()}-0badcafe"]
    for folder in stale:
        folder.mkdir(parents=True)
        (folder / ".lock").touch()
        (folder / "half.part").write_bytes(b"partial download")
    await in_process_proxy(data_dir=data)
    assert not any(folder.exists() for folder in stale)
    own = _temp_dirs(data)
    assert len(own) == 1 and own.pop().startswith(f"{socket.gethostname()}-{os.getpid()}-")


async def test_a_live_process_temp_dir_is_never_reaped(proxy_process, in_process_proxy, tmp_path):
    """A proxy process, then proxies served in this process (their start-up reaping is what is checked; a
    lock taken through another open file conflicts within one process too) beside it and after its crash."""
    data = tmp_path / "proxy-data"
    tmp = data / "archives" / "tmp"
    # Held by a live process elsewhere (here: this test), named for another host, untouched for two days.
    held = tmp / "elsewhere-1-0c0ffee0"
    held.mkdir(parents=True)
    lock = hold_lock(held / ".lock")
    two_days_ago = time.time() - 2 * 86400
    os.utime(held, (two_days_ago, two_days_ago))
    try:
        first = await proxy_process(data_dir=data)
        first_dirs = _temp_dirs(data) - {held.name}
        assert held.exists() and len(first_dirs) == 1
        # The running proxy holds its own dir's lock.
        assert not can_lock(tmp / next(iter(first_dirs)) / ".lock")
        second = await in_process_proxy(data_dir=data)
        assert first_dirs <= _temp_dirs(data), "a live process's temp dir was reaped"
        assert held.exists()
        await second.stop()
        await first.kill()  # a crash: its dir stays behind, its lock is released by the kernel
        third = await in_process_proxy(data_dir=data)
        assert not (first_dirs & _temp_dirs(data)), "the crashed process's temp dir was not reaped"
        assert held.exists()
        await third.stop()
    finally:
        lock.close()
