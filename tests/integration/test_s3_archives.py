"""Archives kept in S3-compatible object storage (a real S3 API server: moto's server mode over HTTPS).

Served through the proxy with their size and SHA-256 checked as they stream (a corrupt object is
never delivered whole, is quarantined and fetched again), or, with `--archive-redirect`, as a
presigned URL of the object. Also the store itself: multipart uploads, aborted failures, listing,
removal, and the custom CA option.
"""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import time

import aiohttp
import pytest
from structlog.testing import capture_logs

from proxy.errors import StoreUnavailableError
from proxy.runtime.client_reads import SharedBufferReads
from proxy.settings.config import parse_s3_location
from proxy.storage import ObjectInfo
from proxy.storage.s3 import PIECE, S3Options, S3Store
from proxy.web.app_keys import ARCHIVE_USAGE, GATEKEEPER, GUARD
from tests.conftest import PROVIDER, serve_proxy
from tests.fakes.packages import Release
from tests.fakes.s3_server import REGION

ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
BIG = "/mirror/v1/registry.example.test/acme/big/2.0.0/linux_amd64/terraform-provider-big_2.0.0_linux_amd64.zip"
PREFIX = "archives/"


@pytest.fixture
def big(registry, signing_key) -> Release:
    """A provider whose archive spans many serving chunks."""
    return registry.add(Release("acme", "big", "2.0.0", signing_key, platforms=("linux_amd64",), noise=3 << 20))


@pytest.fixture
def s3_settings(make_local_settings, s3_server, s3_bucket):
    def make(**overrides):
        return make_local_settings(**{**s3_server.settings(s3_bucket), **overrides})

    return make


async def open_store(s3_server, bucket: str, root, **options) -> S3Store:
    values = {
        "endpoint_url": s3_server.url,
        "region": REGION,
        "path_style": True,
        "ca_file": s3_server.ca_file,
        **options,
    }
    store = S3Store(root, parse_s3_location(f"s3://{bucket}/archives"), S3Options(**values))
    await store.open()
    return store


def local_objects(settings) -> list:
    folder = settings.archive_dir / "sha256"
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []


async def get_or_abort(proxy, path: str, **kwargs):
    """(status, body), or (None, None) when the proxy cut the response off."""
    try:
        status, _, body = await proxy.get(path, **kwargs)
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
        return None, None
    return status, body


def corrupt_object(s3_server, bucket: str, sha: str) -> None:
    """Replace the object with bytes of the same size but one flipped bit."""
    key = PREFIX + sha
    data = bytearray(s3_server.client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0x01
    s3_server.client.put_object(Bucket=bucket, Key=key, Body=bytes(data))


async def stored_then_corrupted(settings, client_ssl, release, s3_server, bucket: str) -> tuple[bytes, str]:
    """The release's archive fetched into the bucket by one proxy, then a bit of its object flipped."""
    data, sha = release.zips["linux_amd64"], release.sha256("linux_amd64")
    async with serve_proxy(settings, client_ssl) as proxy:
        assert (await proxy.get(BIG))[0] == 200
    corrupt_object(s3_server, bucket, sha)
    return data, sha


# ---- serving ----------------------------------------------------------------------------------


async def test_archives_are_uploaded_once_verified_and_served_from_the_bucket(
    s3_settings, client_ssl, registry, big, s3_server, s3_bucket
):
    settings = s3_settings()
    data, sha = big.zips["linux_amd64"], big.sha256("linux_amd64")
    async with serve_proxy(settings, client_ssl) as proxy:
        status, headers, body = await proxy.get(BIG)
        assert (status, body) == (200, data)
        assert s3_server.keys(s3_bucket) == [PREFIX + sha]
        assert local_objects(settings) == []  # nothing kept on local disk but the staging area
        assert [p for p in settings.archive_dir.glob("tmp/*/*") if p.name != ".lock"] == []
        for _ in range(2):  # warm: from the bucket, streamed through the proxy
            status, headers, body = await proxy.get(BIG)
            assert (status, body, headers["ETag"]) == (200, data, f'"{sha}"')
    assert registry.count(registry.archive_path(big, "linux_amd64")) == 1


async def test_range_and_conditional_requests_from_the_bucket(s3_settings, client_ssl, registry, big):
    data, sha = big.zips["linux_amd64"], big.sha256("linux_amd64")
    async with serve_proxy(s3_settings(), client_ssl) as proxy:
        assert (await proxy.get(BIG))[0] == 200
        status, headers, body = await proxy.get(BIG, headers={"Range": "bytes=1000-1999999"})
        assert (status, body) == (206, data[1000:2000000])
        assert headers["Content-Range"] == f"bytes 1000-1999999/{len(data)}"
        status, _, body = await proxy.get(BIG, headers={"Range": "bytes=-5"})
        assert (status, body) == (206, data[-5:])
        status, _, body = await proxy.get(BIG, headers={"If-None-Match": f'"{sha}"'})
        assert (status, body) == (304, b"")
        async with proxy.session.head(proxy.url + BIG) as response:
            assert response.status == 200 and int(response.headers["Content-Length"]) == len(data)


async def test_plain_http_streams_from_the_bucket(s3_settings, client_ssl, registry, big):
    """No sendfile from object storage: a plain-HTTP proxy streams (and checks) the object too."""
    data = big.zips["linux_amd64"]
    async with serve_proxy(s3_settings(plain_http=True, tls_cert=None, tls_key=None), client_ssl) as proxy:
        for _ in range(3):
            status, _, body = await proxy.get(BIG)
            assert (status, body) == (200, data)
        status, _, body = await proxy.get(BIG, headers={"Range": "bytes=10-19"})
        assert (status, body) == (206, data[10:20])


async def test_a_corrupt_object_is_never_served_whole_and_is_fetched_again(
    s3_settings, client_ssl, registry, big, s3_server, s3_bucket
):
    data, sha = await stored_then_corrupted(s3_settings(), client_ssl, big, s3_server, s3_bucket)
    async with serve_proxy(s3_settings(), client_ssl) as proxy:  # a new process: nothing is trusted yet
        with capture_logs() as logs:
            status, body = await get_or_abort(proxy, BIG)
        assert body != data  # cut off before its end: the client never holds the wrong archive whole
        events = [e for e in logs if e["event"] == "security.store_corruption"]
        assert events and events[0]["sha256"] == sha and events[0]["check"] == "digest"
        quarantine = s3_server.keys(s3_bucket, PREFIX + "quarantine/")
        assert len(quarantine) == 1 and quarantine[0].startswith(f"{PREFIX}quarantine/{sha}-")
        status, _, body = await proxy.get(BIG)  # fetched and verified again
        assert (status, body) == (200, data)
    assert registry.count(registry.archive_path(big, "linux_amd64")) == 2
    got = s3_server.client.get_object(Bucket=s3_bucket, Key=PREFIX + sha)["Body"].read()
    assert hashlib.sha256(got).hexdigest() == sha


async def test_a_range_of_a_corrupt_object_is_refused_before_any_byte(
    s3_settings, client_ssl, registry, big, s3_server, s3_bucket
):
    data, _ = await stored_then_corrupted(s3_settings(), client_ssl, big, s3_server, s3_bucket)
    async with serve_proxy(s3_settings(), client_ssl) as proxy:
        status, _, body = await proxy.get(BIG, headers={"Range": "bytes=0-9"})
        # found corrupt before the status line: quarantined, fetched again within the same request
        assert (status, body) == (206, data[:10])
    assert registry.count(registry.archive_path(big, "linux_amd64")) == 2


async def test_an_object_of_the_wrong_size_is_quarantined_and_fetched_again(
    s3_settings, client_ssl, registry, s3_server, s3_bucket
):
    release = registry.releases[("acme", "foo")]["1.0.0"]
    data, sha = release.zips["linux_amd64"], release.sha256("linux_amd64")
    async with serve_proxy(s3_settings(), client_ssl) as proxy:
        assert (await proxy.get(ARCHIVE))[0] == 200
        s3_server.client.put_object(Bucket=s3_bucket, Key=PREFIX + sha, Body=data + b"tail")
        status, _, body = await proxy.get(ARCHIVE)
        assert (status, body) == (200, data)
    assert registry.count(registry.archive_path(release, "linux_amd64")) == 2


async def test_archive_redirect_answers_a_presigned_url_of_the_object(
    s3_settings, client_ssl, registry, big, s3_server
):
    data, sha = big.zips["linux_amd64"], big.sha256("linux_amd64")
    async with serve_proxy(s3_settings(archive_redirect=True, archive_redirect_expiry=60), client_ssl) as proxy:
        status, _, body = await proxy.get(BIG)  # cold: fetched, verified, uploaded (then redirected)
        assert (status, body) == (200, data)
        async with proxy.session.get(proxy.url + BIG, allow_redirects=False) as response:
            assert response.status == 307
            location = response.headers["Location"]
            assert response.headers["Cache-Control"] == "private, no-store"
        assert location.startswith(f"{s3_server.url}/") and f"{PREFIX}{sha}" in location
        assert "X-Amz-Signature=" in location and "X-Amz-Expires=60" in location
        status, _, body = await proxy.get(BIG)  # followed
        assert (status, body) == (200, data)
        status, _, body = await proxy.get(BIG, headers={"If-None-Match": f'"{sha}"'})
        assert (status, body) == (304, b"")
    assert registry.count(registry.archive_path(big, "linux_amd64")) == 1


async def test_an_archive_evicted_between_its_lookup_and_the_redirect_is_fetched_again(
    s3_settings, client_ssl, registry, big, s3_server, s3_bucket
):
    data, sha = big.zips["linux_amd64"], big.sha256("linux_amd64")
    async with serve_proxy(s3_settings(archive_redirect=True), client_ssl) as proxy:
        assert (await proxy.get(BIG))[:1] == (200,)  # cold: fetched, verified, uploaded
        guard = proxy.app[GUARD]
        presign = guard.presign

        async def evicted_meanwhile(stored, expires):  # another replica's eviction lands in this very moment
            guard.presign = presign
            s3_server.client.delete_object(Bucket=s3_bucket, Key=PREFIX + sha)
            return await presign(stored, expires)

        guard.presign = evicted_meanwhile
        async with proxy.session.get(proxy.url + BIG, allow_redirects=False) as response:
            status, location, body = response.status, response.headers.get("Location"), await response.read()
        if status == 307:  # only to an object that is there
            trust = ssl.create_default_context(cafile=str(s3_server.ca_file))
            async with aiohttp.ClientSession() as plain, plain.get(location, ssl=trust) as followed:
                status, body = followed.status, await followed.read()
        assert (status, body) == (200, data)
        assert guard.presign is presign  # the eviction did happen between the lookup and the redirect
    assert registry.count(registry.archive_path(big, "linux_amd64")) == 2


async def test_a_redirect_is_a_serve_and_head_is_answered_by_the_proxy(s3_settings, client_ssl, registry, big):
    data, sha = big.zips["linux_amd64"], big.sha256("linux_amd64")
    async with serve_proxy(s3_settings(archive_redirect=True), client_ssl) as proxy:
        assert (await proxy.get(BIG))[:1] == (200,)  # cold: relayed as it downloads
        usage = proxy.app[ARCHIVE_USAGE]
        assert list(await usage.last_served([sha])) == [sha]  # a download followed to its end is a serve
        pinned_while_redirected = []
        presign = proxy.app[GUARD].presign

        async def watched(stored, expires):
            pinned_while_redirected.append(usage.is_pinned(stored.sha256))
            return await presign(stored, expires)

        proxy.app[GUARD].presign = watched
        async with proxy.session.get(proxy.url + BIG, allow_redirects=False) as response:
            assert response.status == 307
        assert pinned_while_redirected == [True]
        assert list(await usage.last_served([sha])) == [sha]  # noted when redirected: eviction spares it
        async with proxy.session.head(proxy.url + BIG, allow_redirects=False) as response:
            assert response.status == 200, response.headers
            assert "Location" not in response.headers
            assert response.headers["Content-Length"] == str(len(data))
            assert response.headers["ETag"] == f'"{sha}"'


async def test_a_redirect_is_recorded_as_served_in_the_audit_trail(s3_settings, client_ssl, tmp_path, big):
    audit = tmp_path / "audit.log"
    async with serve_proxy(s3_settings(archive_redirect=True, audit_log=str(audit)), client_ssl) as proxy:
        assert (await proxy.get(BIG))[:1] == (200,)  # cold: fetched, relayed, served
        proxy.app[GATEKEEPER].audit.clock = lambda: time.time() + 3600  # an hour later: a serve is recorded again
        async with proxy.session.get(proxy.url + BIG, allow_redirects=False) as response:
            assert response.status == 307
    assert [json.loads(line)["event"] for line in audit.read_text().splitlines()] == ["fetched", "served", "served"]


# ---- the store ----------------------------------------------------------------------------------


async def test_large_archives_are_uploaded_in_parts(s3_server, s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setattr("proxy.storage.s3.PART_SIZE", 5 * 2**20)  # S3's smallest part
    data = os.urandom(11 * 2**20 + 123)
    sha = hashlib.sha256(data).hexdigest()
    store = await open_store(s3_server, s3_bucket, tmp_path / "a")
    try:
        pending = store.begin()
        pending.write(data)
        assert pending.finish() == sha
        stored = await store.publish(pending, sha)
        assert stored.version.strip('"').endswith("-3")  # three parts
        assert s3_server.client.get_object(Bucket=s3_bucket, Key=PREFIX + sha)["Body"].read() == data
        assert (await store.check(sha)).intact
        assert not pending.path.exists()
    finally:
        await store.close()


async def test_a_failed_multipart_upload_is_aborted_and_leaves_no_object(s3_server, s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setattr("proxy.storage.s3.PART_SIZE", 5 * 2**20)
    data = os.urandom(11 * 2**20)
    sha = hashlib.sha256(data).hexdigest()
    store = await open_store(s3_server, s3_bucket, tmp_path / "a")
    try:
        pending = store.begin()
        pending.write(data)
        pending.finish()
        client = store._client
        real_upload_part, calls = client.upload_part, []

        async def failing_upload_part(**kwargs):
            calls.append(kwargs["PartNumber"])
            if kwargs["PartNumber"] == 2:  # the connection drops in the middle of the upload
                raise ConnectionResetError("connection reset by peer")
            return await real_upload_part(**kwargs)

        monkeypatch.setattr(client, "upload_part", failing_upload_part)
        with pytest.raises(ConnectionResetError):
            await store.publish(pending, sha)
        assert calls == [1, 2]
        assert s3_server.keys(s3_bucket) == []
        assert s3_server.client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
        assert await store.get(sha) is None
        assert pending.path.exists()  # the caller discards it
    finally:
        await store.close()


async def test_an_object_is_read_through_the_shared_buffer_in_pieces_never_joined(
    s3_server, s3_bucket, tmp_path, monkeypatch
):
    """No block of 128 KiB or more per piece of a body (mapped and unmapped on its own with the pinned mmap
    threshold): the store's connections read into the process's buffer, and a chunk asked for is handed out
    in the pieces it was read in, not copied into one block."""
    data = os.urandom(3 << 20)
    sha = hashlib.sha256(data).hexdigest()
    s3_server.client.put_object(Bucket=s3_bucket, Key=PREFIX + sha, Body=data)
    buffered: list[int] = []
    hand_on = SharedBufferReads.buffer_updated
    monkeypatch.setattr(SharedBufferReads, "buffer_updated", lambda self, n: (buffered.append(n), hand_on(self, n)))
    store = await open_store(s3_server, s3_bucket, tmp_path / "a")
    try:
        stored = await store.get(sha)
        reader = await store.open_reader(stored, 0, stored.size)
        try:
            pieces = [chunk async for chunk in reader.chunks(256 * 1024)]
        finally:
            reader.close()
    finally:
        await store.close()
    assert b"".join(pieces) == data
    assert max(map(len, pieces)) <= PIECE < 128 * 1024
    assert sum(buffered) > len(data)  # the body (and the answers' heads) came through the shared buffer


async def test_list_objects_and_remove(s3_server, s3_bucket, tmp_path):
    store = await open_store(s3_server, s3_bucket, tmp_path / "a")
    try:
        shas = []
        for content in (b"one", b"two!"):
            sha = hashlib.sha256(content).hexdigest()
            path = store.temp_path()
            path.write_bytes(content)
            await store.publish_path(path, sha)
            shas.append(sha)
        s3_server.client.put_object(Bucket=s3_bucket, Key=PREFIX + "not-an-address", Body=b"x")
        s3_server.client.put_object(Bucket=s3_bucket, Key="elsewhere/" + shas[0], Body=b"x")
        listed = sorted(await store.list_objects(), key=lambda o: o.size)
        assert [(o.sha256, o.size) for o in listed] == [(shas[0], 3), (shas[1], 4)]
        assert all(isinstance(o, ObjectInfo) and o.modified > 0 for o in listed)
        assert await store.strays() == [PREFIX + "not-an-address"]
        assert await store.remove(shas[1]) == 4
        assert await store.remove(shas[1]) == 0
        assert await store.get(shas[1]) is None
        assert [o.sha256 for o in await store.list_objects()] == [shas[0]]
    finally:
        await store.close()


async def test_publishing_content_already_there_uploads_nothing(s3_server, s3_bucket, tmp_path):
    store = await open_store(s3_server, s3_bucket, tmp_path / "a")
    try:
        sha = hashlib.sha256(b"same").hexdigest()
        first = store.temp_path()
        first.write_bytes(b"same")
        stored = await store.publish_path(first, sha)
        modified = s3_server.client.head_object(Bucket=s3_bucket, Key=PREFIX + sha)["LastModified"]
        second = store.temp_path()
        second.write_bytes(b"same")
        assert await store.publish_path(second, sha) == stored
        assert s3_server.client.head_object(Bucket=s3_bucket, Key=PREFIX + sha)["LastModified"] == modified
        assert not second.exists()
    finally:
        await store.close()


async def test_the_endpoint_certificate_is_checked_against_the_custom_ca(s3_server, s3_bucket, tmp_path, monkeypatch):
    """The S3 server's certificate comes from the test CA: without --s3-ca-file (and with no such CA in the
    system store) the store refuses to talk to it; with it, it works."""
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    with pytest.raises(StoreUnavailableError, match="not reachable"):
        await open_store(s3_server, s3_bucket, tmp_path / "a", ca_file=None)
    await (await open_store(s3_server, s3_bucket, tmp_path / "b")).close()


async def test_a_missing_bucket_fails_at_start(s3_server, tmp_path):
    with pytest.raises(StoreUnavailableError, match=r"NoSuchBucket|404"):
        await open_store(s3_server, "no-such-bucket-here", tmp_path / "a")
