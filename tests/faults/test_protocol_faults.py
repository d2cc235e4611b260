"""Range and conditional requests on archives, against a real proxy process over TLS and plain HTTP.

Faults reproduced (issue 8, item 9): a Range with thousands of digits was a 500; `If-Range` with a
validator that is not ours still gave a 206; `If-None-Match: *` gave a 200; a 416 had no JSON body;
with `--plain-http` aiohttp's file response applied its own rules and its own ETag instead.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import pytest
from multidict import CIMultiDict

from tests.conftest import PROVIDER
from tests.fakes.process import ProcessClient

ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
HUGE = "9" * 5000  # Python's int() refuses more than 4,300 digits


class Client:
    """A ProcessClient whose answers' headers are case-insensitive, as HTTP's are."""

    def __init__(self, inner: ProcessClient) -> None:
        self.process = inner.process
        self._inner = inner

    async def get(self, path: str, **kwargs) -> tuple[int, CIMultiDict, bytes]:
        status, headers, body = await self._inner.get(path, **kwargs)
        return status, CIMultiDict(headers), body

    async def head(self, path: str, **kwargs) -> tuple[int, CIMultiDict]:
        status, headers = await self._inner.head(path, **kwargs)
        return status, CIMultiDict(headers)


@dataclass
class Served:
    client: Client
    data: bytes
    etag: str


@pytest.fixture(params=["tls", "plain-http"])
async def served(request, in_process_proxy, connect, registry) -> Served:
    """A proxy process (over TLS or with --plain-http) that has the archive cached."""
    process = await in_process_proxy(*(["--plain-http"] if request.param == "plain-http" else []))
    client = Client(await connect(process))
    data = registry.releases[("acme", "foo")]["1.0.0"].zips["linux_amd64"]
    status, _, body = await client.get(ARCHIVE)
    assert (status, body) == (200, data)
    return Served(client, data, f'"{hashlib.sha256(data).hexdigest()}"')


def assert_json_error(status: int, headers: CIMultiDict, body: bytes, expected: int) -> None:
    assert status == expected, body[:200]
    assert headers["Content-Type"].startswith("application/json")
    document = json.loads(body)
    assert isinstance(document["errors"], list) and document["errors"] and all(document["errors"])
    assert document["code"] == {412: "precondition_failed", 416: "range_not_satisfiable"}.get(expected), document


async def test_range_with_thousands_of_digits_is_never_a_server_error(served: Served) -> None:
    size = len(served.data)
    # first-pos beyond the end: unsatisfiable
    status, headers, body = await served.client.get(ARCHIVE, headers={"Range": f"bytes={HUGE}-"})
    assert_json_error(status, headers, body, 416)
    assert headers["Content-Range"] == f"bytes */{size}"
    both = "9" * 4000  # both sides long (the whole header must stay under aiohttp's 8,190-byte field limit)
    status, headers, body = await served.client.get(ARCHIVE, headers={"Range": f"bytes={both}-{both}9"})
    assert_json_error(status, headers, body, 416)
    # an absurd last-pos or suffix length is not an error: it is clipped to the file
    status, headers, body = await served.client.get(ARCHIVE, headers={"Range": f"bytes=5-{HUGE}"})
    assert (status, body, headers["Content-Range"]) == (206, served.data[5:], f"bytes 5-{size - 1}/{size}")
    status, headers, body = await served.client.get(ARCHIVE, headers={"Range": f"bytes=-{HUGE}"})
    assert (status, body, headers["Content-Range"]) == (206, served.data, f"bytes 0-{size - 1}/{size}")
    # leading zeros do not make a number large
    status, _, body = await served.client.get(ARCHIVE, headers={"Range": "bytes=" + "0" * 5000 + "2-3"})
    assert (status, body) == (206, served.data[2:4])
    assert not served.client.process.events("request.crashed")


async def test_unsatisfiable_range_is_a_json_416_with_the_size(served: Served) -> None:
    size = len(served.data)
    for header in (f"bytes={size}-", f"bytes={size}-{size + 10}", "bytes=-0"):
        status, headers, body = await served.client.get(ARCHIVE, headers={"Range": header})
        assert_json_error(status, headers, body, 416)
        assert headers["Content-Range"] == f"bytes */{size}"
        assert "ETag" not in headers  # an error answer is not the archive


async def test_malformed_or_multiple_ranges_are_ignored(served: Served) -> None:
    for header in ("bytes=0-1,4-5", "bytes=abc", "items=0-3", "bytes=5-2"):
        status, headers, body = await served.client.get(ARCHIVE, headers={"Range": header})
        assert (status, body) == (200, served.data), header
        assert "Content-Range" not in headers


async def test_if_range_needs_our_strong_etag(served: Served) -> None:
    size = len(served.data)
    ranged = {"Range": "bytes=0-3"}
    status, headers, body = await served.client.get(ARCHIVE, headers={**ranged, "If-Range": served.etag})
    assert (status, body, headers["Content-Range"]) == (206, served.data[:4], f"bytes 0-3/{size}")
    for validator in (
        '"not-our-etag"',
        f"W/{served.etag}",  # a weak tag never matches (RFC 9110 §13.1.5)
        "Tue, 01 Jan 2030 00:00:00 GMT",  # a date: archives have no Last-Modified to match
        "Thu, 01 Jan 1970 00:00:00 GMT",
        "garbage",
    ):
        status, headers, body = await served.client.get(ARCHIVE, headers={**ranged, "If-Range": validator})
        assert (status, body) == (200, served.data), validator
        assert "Content-Range" not in headers
    # If-Range decides only between 206 and 200: an out-of-range request with a stale validator gets it all
    status, _, body = await served.client.get(ARCHIVE, headers={"Range": f"bytes={size}-", "If-Range": '"old"'})
    assert (status, body) == (200, served.data)


async def test_if_none_match(served: Served) -> None:
    client = served.client
    for header in ("*", served.etag, f"W/{served.etag}", f'"other", {served.etag}', f'W/"x" , W/{served.etag}'):
        status, headers, body = await client.get(ARCHIVE, headers={"If-None-Match": header})
        assert (status, body) == (304, b""), header
        assert headers["ETag"] == served.etag
        status, headers = await client.head(ARCHIVE, headers={"If-None-Match": header})
        assert status == 304, header
    for header in ('"other"', "W/*", '"*"', served.etag.strip('"'), "garbage"):
        status, _, body = await client.get(ARCHIVE, headers={"If-None-Match": header})
        assert (status, body) == (200, served.data), header
    # If-None-Match is evaluated before Range
    status, _, body = await client.get(ARCHIVE, headers={"If-None-Match": "*", "Range": "bytes=0-3"})
    assert (status, body) == (304, b"")


async def test_if_match(served: Served) -> None:
    for header in ("*", served.etag, f'"other", {served.etag}'):
        status, _, body = await served.client.get(ARCHIVE, headers={"If-Match": header})
        assert (status, body) == (200, served.data), header
    for header in ('"other"', f"W/{served.etag}"):  # If-Match uses the strong comparison
        status, headers, body = await served.client.get(ARCHIVE, headers={"If-Match": header})
        assert_json_error(status, headers, body, 412)


async def test_headers_are_the_same_in_both_modes(served: Served) -> None:
    status, headers, body = await served.client.get(ARCHIVE)
    assert status == 200 and body == served.data
    assert headers["ETag"] == served.etag  # the SHA-256, also over plain HTTP
    assert "Last-Modified" not in headers  # a file time would be a second, weaker validator
    assert headers["Accept-Ranges"] == "bytes"
    assert headers["Content-Type"] == "application/zip"
    assert int(headers["Content-Length"]) == len(served.data)
    status, headers = await served.client.head(ARCHIVE, headers={"Range": "bytes=2-5"})
    assert status == 206 and headers["Content-Range"] == f"bytes 2-5/{len(served.data)}"
    assert int(headers["Content-Length"]) == 4
