"""`Downloader.pass_through`: a relay that stores nothing; resumed after bytes a client has, it sends only
what follows them, and only once they are the upstream's first bytes (a fake upstream, no network)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from yarl import URL

from proxy.errors import VerificationError
from proxy.runtime.metrics import Metrics
from proxy.services.downloader import Downloader
from proxy.settings.config import Settings

BODY = os.urandom(5 * 65536 + 123)
URL_ = URL("https://releases.example/terraform-provider-x_1.0.0_linux_amd64.zip")


class Upstream:
    """Streams `body` in 64 KiB chunks, as the upstream client hands them to its sink."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def download(self, url, sink, *, max_bytes, on_response=None) -> None:
        if on_response is not None:
            await on_response(len(self.body))
        for offset in range(0, len(self.body), 65536):
            await sink(self.body[offset : offset + 65536])


def downloader(body: bytes) -> Downloader:
    store = SimpleNamespace(local=False)  # a relay touches no store
    return Downloader(Settings(data_dir=Path("unused")), Upstream(body), store, None, None, Metrics())


class Client:
    def __init__(self) -> None:
        self.received = b""
        self.length: int | None = None

    async def begin(self, length: int | None) -> None:
        self.length = length

    async def send(self, chunk: bytes) -> None:
        self.received += chunk


def check_digest(expected: str):
    def check(actual: str) -> None:
        if actual != expected:
            raise VerificationError("not the expected archive")

    return check


def relay(body: bytes, sent: bytes | None = None):
    skip = None
    if sent is not None:
        skip = (len(sent), check_digest(hashlib.sha256(sent).hexdigest()))
    return downloader(body).pass_through(
        URL_,
        max_bytes=2**30,
        algorithm="sha256",
        kind="provider",
        check=check_digest(hashlib.sha256(BODY).hexdigest()),
        etag=None,
        skip=skip,
    )


async def test_a_whole_relay_holds_the_last_chunk_until_verified():
    client = Client()
    await relay(BODY).stream(client.begin, client.send)
    assert client.received == BODY and client.length == len(BODY)
    tampered, client = BODY[:-1] + bytes([BODY[-1] ^ 1]), Client()
    with pytest.raises(VerificationError):
        await relay(tampered).stream(client.begin, client.send)
    assert client.received == BODY[:-123]  # all but the last chunk


@pytest.mark.parametrize("length", [1, 65536, 65537, 3 * 65536 + 5, len(BODY) - 1])
async def test_a_resumed_relay_sends_only_what_follows_the_bytes_sent(length):
    client = Client()
    await relay(BODY, sent=BODY[:length]).stream(client.begin, client.send)
    assert client.received == BODY[length:]


async def test_a_resumed_relay_sends_nothing_unless_the_bytes_sent_were_the_upstream_first_ones():
    for sent in (bytes([BODY[0] ^ 0xFF]) + BODY[1:70000], BODY + b"more than the whole archive"):  # first byte off
        client = Client()
        with pytest.raises(VerificationError):
            await relay(BODY, sent=sent).stream(client.begin, client.send)
        assert client.received == b""
