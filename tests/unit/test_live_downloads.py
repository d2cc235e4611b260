"""Following a growing download: the end is held back until verified; a failure withholds it for good."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

from proxy.errors import (
    DiskFullError,
    FollowedDownloadLostError,
    ShuttingDownError,
    UpstreamError,
    VerificationError,
)
from proxy.services.download_notices import DownloadNotices, Notice
from proxy.services.live_downloads import HOLD_BACK, LiveDownload, LiveDownloads
from proxy.services.relay import UpstreamRelay

WAIT = 10
BODY = os.urandom(3 * HOLD_BACK + 1000)
SHA = hashlib.sha256(BODY).hexdigest()


class Client:
    """What a follower sends to one client."""

    def __init__(self) -> None:
        self.length: int | None = None
        self.received = b""
        self.moved = asyncio.Event()

    async def begin(self, length: int | None) -> None:
        self.length = length

    async def send(self, chunk: bytes) -> None:
        self.received += chunk
        self.moved.set()

    async def has(self, size: int) -> None:
        while len(self.received) < size:
            self.moved.clear()
            await asyncio.wait_for(self.moved.wait(), WAIT)


@pytest.fixture
def temp(tmp_path):
    path = tmp_path / "download.part"
    handle = open(path, "wb")  # noqa: SIM115 - closed below
    yield path, handle
    handle.close()


def write(handle, growing: LiveDownload, data: bytes) -> None:
    handle.write(data)
    handle.flush()
    growing.advance(len(data))


async def written_and_followed(temp, growing: LiveDownload) -> tuple[Client, asyncio.Task]:
    """A client following `growing` once all of BODY is written: it has all but the held-back end."""
    _, handle = temp
    client = Client()
    follower = asyncio.create_task(growing.relay().stream(client.begin, client.send))
    write(handle, growing, BODY)
    await client.has(len(BODY) - HOLD_BACK)
    await asyncio.sleep(0.05)
    return client, follower


async def test_the_end_waits_for_verification(temp):
    path, _ = temp
    growing = LiveDownload(path, len(BODY), SHA)
    client, follower = await written_and_followed(temp, growing)
    assert client.length == len(BODY) and client.received == BODY[:-HOLD_BACK] and not follower.done()
    growing.publish(path)
    await asyncio.wait_for(follower, WAIT)
    assert client.received == BODY


async def test_a_failure_withholds_the_end(temp):
    path, _ = temp
    growing = LiveDownload(path, len(BODY), SHA)
    client, follower = await written_and_followed(temp, growing)
    growing.fail(UpstreamError("tampered"))
    with pytest.raises(UpstreamError):
        await asyncio.wait_for(follower, WAIT)
    assert client.received == BODY[:-HOLD_BACK]


def upstream_rest(body: bytes, asked: list[tuple[int, str]]):
    """A `rest` relay of `body` after the bytes sent (its first ones must hash to what the follower sent)."""

    def rest(sent: int, sent_sha256: str) -> UpstreamRelay:
        asked.append((sent, sent_sha256))

        async def stream(begin, send) -> None:
            if hashlib.sha256(body[:sent]).hexdigest() != sent_sha256:
                raise VerificationError("not the bytes sent")
            await send(body[sent:])

        return UpstreamRelay(None, stream)

    return rest


async def test_a_full_disk_hands_the_rest_to_the_relay(temp):
    path, _ = temp
    growing = LiveDownload(path, len(BODY), SHA)
    client = Client()
    asked: list[tuple[int, str]] = []
    follower = asyncio.create_task(growing.relay(upstream_rest(BODY, asked)).stream(client.begin, client.send))
    _, handle = temp
    write(handle, growing, BODY[: 2 * HOLD_BACK])
    await client.has(HOLD_BACK)
    growing.fail(DiskFullError("the proxy's disk is full"))
    await asyncio.wait_for(follower, WAIT)
    assert client.received == BODY and client.length == len(BODY)
    assert asked == [(2 * HOLD_BACK, hashlib.sha256(BODY[: 2 * HOLD_BACK]).hexdigest())]  # all it had, then the rest


async def test_other_failures_are_not_relayed(temp):
    path, _ = temp
    growing = LiveDownload(path, len(BODY), SHA)
    asked: list[tuple[int, str]] = []
    growing.fail(UpstreamError("tampered"))
    with pytest.raises(UpstreamError):
        await growing.relay(upstream_rest(BODY, asked)).stream(Client().begin, Client().send)
    assert asked == []


async def test_cancelled_downloads_tell_followers_the_proxy_is_shutting_down(temp):
    path, _ = temp
    growing = LiveDownload(path, len(BODY), SHA)
    growing.fail(asyncio.CancelledError())
    with pytest.raises(ShuttingDownError):
        await growing.relay().stream(Client().begin, Client().send)


async def test_bytes_changed_on_disk_are_never_completed(temp):
    path, handle = temp
    growing = LiveDownload(path, len(BODY), SHA)
    write(handle, growing, BODY[:-1] + bytes([BODY[-1] ^ 1]))  # the file no longer holds what was verified
    growing.publish(path)
    client = Client()
    with pytest.raises(VerificationError):
        await growing.relay().stream(client.begin, client.send)
    assert len(client.received) < len(BODY)


async def test_waiters_get_the_download_once_it_is_announced_or_the_result_first(temp):
    path, _ = temp
    downloads = LiveDownloads()
    growing = LiveDownload(path, len(BODY), SHA)
    never = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(downloads.result_or_growing("key", SHA, never))
    await asyncio.sleep(0)
    downloads.announce("key", growing)
    assert await asyncio.wait_for(waiting, WAIT) is growing
    assert never.cancelled()  # only this wait: a real flight is shielded
    assert await downloads.result_or_growing("key", SHA, asyncio.sleep(0, "stored")) in ("stored", growing)
    downloads.withdraw("key", growing)
    assert await downloads.result_or_growing("key", SHA, asyncio.sleep(0, "stored")) == "stored"
    growing.fail(UpstreamError("done"))


def two_processes(tmp_path) -> tuple[LiveDownloads, LiveDownloads]:
    """Two processes' views of one archive store (flocks of separate descriptors conflict in one process too)."""

    def published(sha256: str):
        return tmp_path / "sha256" / sha256

    return (
        LiveDownloads(DownloadNotices(tmp_path / "growing", tmp_path.parent), published, poll=0.005),
        LiveDownloads(DownloadNotices(tmp_path / "growing", tmp_path.parent), published, poll=0.005),
    )


async def test_another_process_follows_until_the_archive_is_published(tmp_path, temp):
    path, handle = temp
    owner, other = two_processes(tmp_path)
    growing = LiveDownload(path, len(BODY), SHA)
    owner.announce("key", growing)
    followed = await asyncio.wait_for(other.started("key", SHA), WAIT)
    assert followed is not growing and (followed.path, followed.size) == (path, len(BODY))
    client = Client()
    follower = asyncio.create_task(followed.relay().stream(client.begin, client.send))
    write(handle, growing, BODY)
    await client.has(len(BODY) - HOLD_BACK)
    await asyncio.sleep(0.05)
    assert client.received == BODY[:-HOLD_BACK] and not follower.done()
    final = tmp_path / "sha256" / SHA
    final.parent.mkdir()
    os.replace(path, final)
    growing.publish(final)
    owner.withdraw("key", growing)
    await asyncio.wait_for(follower, WAIT)
    assert client.received == BODY
    assert list((tmp_path / "growing").iterdir()) == []
    await other.close()


async def test_another_process_aborts_when_the_download_ends_unpublished(tmp_path, temp):
    path, handle = temp
    owner, other = two_processes(tmp_path)
    growing = LiveDownload(path, len(BODY), SHA)
    owner.announce("key", growing)
    with pytest.raises(TimeoutError):  # a notice for other bytes is not followed
        await asyncio.wait_for(other.started("key", "0" * 64), 0.05)
    followed = await asyncio.wait_for(other.started("key", SHA), WAIT)
    client = Client()
    follower = asyncio.create_task(followed.relay().stream(client.begin, client.send))
    write(handle, growing, BODY)
    await client.has(len(BODY) - HOLD_BACK)
    growing.fail(UpstreamError("tampered"))
    owner.withdraw("key", growing)
    with pytest.raises(FollowedDownloadLostError):
        await asyncio.wait_for(follower, WAIT)
    assert client.received == BODY[:-HOLD_BACK]
    await other.close()


async def test_a_download_lost_in_another_process_hands_the_rest_to_the_relay(tmp_path, temp):
    """Why it ended stays in the other process (a full disk there, most likely); the rest relay is
    verified as a whole, so relaying is safe whatever it was."""
    path, handle = temp
    owner, other = two_processes(tmp_path)
    growing = LiveDownload(path, len(BODY), SHA)
    owner.announce("key", growing)
    followed = await asyncio.wait_for(other.started("key", SHA), WAIT)
    client, asked = Client(), []
    relay = followed.relay(upstream_rest(BODY, asked))
    follower = asyncio.create_task(relay.stream(client.begin, client.send))
    write(handle, growing, BODY[:HOLD_BACK])
    await client.has(HOLD_BACK)
    growing.fail(DiskFullError("the proxy's disk is full"))
    owner.withdraw("key", growing)
    await asyncio.wait_for(follower, WAIT)
    assert client.received == BODY and [sent for sent, _ in asked] == [HOLD_BACK]
    await other.close()


def test_a_notice_names_only_a_temp_file_of_the_store(tmp_path):
    notices = DownloadNotices(tmp_path / "growing", tmp_path / "tmp")
    inside = tmp_path / "tmp" / "host-1-abc" / "x.part"
    for path, seen in ((inside, True), (tmp_path / "etc" / "passwd", False), (inside.with_suffix(".zip"), False)):
        descriptor = notices.post("key", Notice(path, 10, SHA))
        found = DownloadNotices(tmp_path / "growing", tmp_path / "tmp").read("key")
        assert (found is not None) == seen
        if found is not None:
            os.close(found[1])
        notices.take_down("key", descriptor)
    assert notices.read("key") is None
