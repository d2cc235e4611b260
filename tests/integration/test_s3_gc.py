"""`registry-proxy gc --archive-store s3://…` (the CLI, in process) against a bucket on a real S3 API server.

The bucket holds a live archive (its record written by the proxy; old, but referenced), an old orphan,
an old orphan served a minute ago (within the grace), an orphan stored a moment ago, an old and a
fresh quarantined object, an abandoned multipart upload and a stray key; the local staging disk holds
the temp dir of a killed process and the download of a live one; the metadata store (embedded, and
Redis) an expired remembered 404. A dry run removes nothing, not even by opening the store.
"""

from __future__ import annotations

import hashlib
import time

import pytest

from proxy.metadata_store import CacheEntry
from proxy.metadata_store.factory import open_metadata
from tests.conftest import serve_proxy
from tests.fakes.process import registry_proxy_in_process
from tests.fakes.store_holder import StoreHolder
from tests.integration.test_gc import ARCHIVE, GONE_KEY, LONG_AGO, check_after_gc, gc, lines_of

PREFIX = "archives/"
HOLDER = "tests.fakes.s3_server:test_store"


def put(s3_server, bucket: str, data: bytes, age: float = 0) -> str:
    """An object at its content address (as the proxy uploads them), `age` seconds old."""
    sha = hashlib.sha256(data).hexdigest()
    s3_server.client.put_object(Bucket=bucket, Key=PREFIX + sha, Body=data)
    if age:
        s3_server.age(bucket, PREFIX + sha, age)
    return sha


def uploads(s3_server, bucket: str) -> list[str]:
    return [u["UploadId"] for u in s3_server.client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


@pytest.mark.one_metadata_store
@pytest.mark.process
async def test_gc_on_s3_dry_run_then_for_real(make_settings, client_ssl, registry, s3_server, s3_bucket):
    settings = make_settings(**s3_server.settings(s3_bucket))
    flags = s3_server.flags(s3_bucket)
    async with serve_proxy(settings, client_ssl) as proxy:
        status, _, body = await proxy.get(ARCHIVE)
        assert status == 200
    live = hashlib.sha256(body).hexdigest()
    s3_server.age(s3_bucket, PREFIX + live, LONG_AGO)  # referenced: kept however old

    now = time.time()
    orphan = put(s3_server, s3_bucket, b"an orphan" * 1000, LONG_AGO)
    served_orphan = put(s3_server, s3_bucket, b"an orphan served a minute ago", LONG_AGO)
    fresh_orphan = put(s3_server, s3_bucket, b"an orphan stored a moment ago")
    old_quarantined = f"{PREFIX}quarantine/{'1' * 64}-20200101T000000Z-abcdef"
    new_quarantined = f"{PREFIX}quarantine/{'2' * 64}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-abcdef"
    s3_server.client.put_object(Bucket=s3_bucket, Key=old_quarantined, Body=b"x" * 777)
    s3_server.client.put_object(Bucket=s3_bucket, Key=new_quarantined, Body=b"y" * 10)
    stray = PREFIX + "notes.txt"  # not the proxy's: reported, never removed
    s3_server.client.put_object(Bucket=s3_bucket, Key=stray, Body=b"someone else's")

    metadata, _, times = await open_metadata(settings)
    await times.note_served({served_orphan: now - 60, orphan: now - LONG_AGO})
    expired = CacheEntry(404, b"", f"{registry.url}/v1/providers/acme/gone/versions", now - 7200)
    await metadata.set(GONE_KEY, expired.encode())
    await metadata.close()

    with (
        StoreHolder(HOLDER, settings.archive_dir, 4096) as dead,
        StoreHolder(HOLDER, settings.archive_dir, 2048) as alive,
    ):
        dead.kill()
        dead_dir = dead.part.parent
        # after the holders opened the store (opening for writing aborts uploads a day old, as all are on moto)
        upload = s3_server.client.create_multipart_upload(Bucket=s3_bucket, Key=PREFIX + "f" * 64)["UploadId"]
        s3_server.client.upload_part(
            Bucket=s3_bucket, Key=PREFIX + "f" * 64, UploadId=upload, PartNumber=1, Body=b"z" * 3000
        )
        before = s3_server.keys(s3_bucket)
        assert dead_dir.exists()

        code, dry = await gc(settings, *flags, "--dry-run")
        assert code == 0, dry
        assert [line[-1] for line in lines_of(dry, "archive")] == [orphan]
        assert [line[-1] for line in lines_of(dry, "temp")] == [str(dead_dir)]
        assert [(line[-2], line[-1]) for line in lines_of(dry, "upload")] == [
            ("3000", f"s3://{s3_bucket}/{PREFIX}{'f' * 64}?uploadId={upload}")
        ]
        assert [line[-1] for line in lines_of(dry, "quarantine")] == [f"s3://{s3_bucket}/{old_quarantined}"]
        assert [line[:2] + line[-1:] for line in lines_of(dry, "stray")] == [
            ["kept", "stray", f"s3://{s3_bucket}/{stray}"]
        ]
        assert GONE_KEY in [line[-1] for line in lines_of(dry, "old-negative")]
        total = sum(int(line.split()[-2]) for line in dry.splitlines() if line.startswith("would remove"))
        assert total >= 9000 + 4096 + 3000 + 777
        assert f"{total} bytes would be freed" in dry.splitlines()[-1]
        assert "1 referenced archive(s) kept, 2 unreferenced archive(s) kept as used within the grace" in dry
        # a dry run removes nothing
        assert s3_server.keys(s3_bucket) == before and uploads(s3_server, s3_bucket) == [upload]
        assert dead_dir.exists()

        code, real = await gc(settings, *flags)
        assert code == 0, real
        assert [line[-1] for line in lines_of(real, "archive")] == [orphan]
        assert len(lines_of(real, "upload")) == 1 and len(lines_of(real, "quarantine")) == 1
        assert s3_server.keys(s3_bucket) == sorted(
            [PREFIX + live, PREFIX + served_orphan, PREFIX + fresh_orphan, new_quarantined, stray]
        )
        assert uploads(s3_server, s3_bucket) == []
        assert not dead_dir.exists()
        assert alive.part.exists()  # a live process's download is never touched

    await check_after_gc(settings, client_ssl, registry, orphan, body, *flags)


@pytest.mark.process
async def test_verify_without_repair_changes_nothing_on_s3(make_local_settings, s3_server, s3_bucket):
    """Opening the store to look at it aborts no upload and reaps no temp dir: that is --repair's (and gc's)."""
    settings = make_local_settings(**s3_server.settings(s3_bucket))
    with StoreHolder(HOLDER, settings.archive_dir, 1024) as dead:
        dead.kill()
        upload = s3_server.client.create_multipart_upload(Bucket=s3_bucket, Key=PREFIX + "e" * 64)["UploadId"]
        flags = s3_server.flags(s3_bucket)
        code, out = await registry_proxy_in_process("verify", "--data-dir", str(settings.data_dir), *flags)
        assert code == 0, out
        assert f"abandoned temp dir: {dead.part.parent} (remove with --repair)" in out
        assert dead.part.parent.exists() and uploads(s3_server, s3_bucket) == [upload]
