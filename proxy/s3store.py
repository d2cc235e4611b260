"""Verified archives in S3-compatible object storage (AWS S3, MinIO, Ceph RGW, GCS in S3 mode).

Object key = PREFIX + SHA-256 hex. Downloads stage in a local `proxy.store.ArchiveStore` (its
per-process temp directory, reaped after a crash, and the cold streaming of growing files) and
are uploaded only once verified (`publish_path`): one PUT up to `PART_SIZE`, a multipart upload
above it; a failed multipart upload is aborted, so no half object is ever visible (S3 shows an
object only once its upload completed). Publishing content that is already there (same key,
same size) uploads nothing. Reads stream with Range and `If-Match` (the ETag the object had
when it was checked), so a range is never cut from a different object than the one verified.
Objects found corrupt are copied to `PREFIX + quarantine/` and deleted.

Credentials come from botocore's default chain (environment, shared config and credentials
files, container and instance roles); the proxy has no flags for secrets. The aiobotocore client
runs on an event loop of its own in a daemon thread, so the blocking API (commands, worker
threads) and the server's async reads share one client and its connection pool.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from proxy.config import S3Location
from proxy.errors import StoreCorruptionError, StoreUnavailableError
from proxy.objects import QUARANTINE as QUARANTINED
from proxy.objects import STRAY, TEMP, UPLOAD, Leftover, ObjectInfo, quarantined_at
from proxy.s3answers import (
    Upload,
    body_of,
    error_of,
    etag_of,
    objects_of,
    parts_size_of,
    size_of,
    status_of,
    text_of,
    uploads_of,
)
from proxy.store import HASH_CHUNK, VERIFIED_FACTS, ArchiveStore, ObjectCheck, PendingArchive, StoredArchive

_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
PART_SIZE = 16 * 2**20  # above this, a multipart upload in parts of this size (S3's minimum is 5 MiB)
ABANDONED_UPLOAD_AFTER = 24 * 3600.0
QUARANTINE = "quarantine/"
ATTEMPTS = 2  # per request: the first try and one retry (timeouts, connection errors, throttling, 5xx)
T = TypeVar("T")


@dataclass(frozen=True)
class S3Options:
    """How to reach the object storage: endpoint (None: AWS), region, path-style addressing, extra CA."""

    endpoint_url: str | None = None
    region: str | None = None
    path_style: bool = False
    ca_file: Path | None = None
    timeout: float = 20.0  # seconds: each read (response head or more body) within it, connecting within half


@dataclass(frozen=True)
class RemoteArchive:
    """An archive stored as an object: its address, size, key and the ETag of the object seen."""

    sha256: str
    size: int
    key: str
    etag: str
    path: None = None  # no local file: served by streaming it, never with sendfile


class S3ArchiveStore:
    """Verified archives by SHA-256 in a bucket; blocking API (call from a worker thread where it matters),
    plus `stream` and `presign` for the server's event loop."""

    local = False

    def __init__(self, root: Path, location: S3Location, options: S3Options = S3Options()) -> None:
        self.staging = ArchiveStore(root)
        self.root = root
        self.location = location
        self._options = options
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._client_context: Any = None
        self._verified: dict[str, str] = {}
        self._lock = threading.Lock()

    # ---- life cycle ---------------------------------------------------------------------------

    def open(self, *, claim: bool = True) -> None:
        """Start the client and check the bucket is reachable; with `claim` (a store written to), also open
        the staging area (this process's temp dir, dead processes' reaped) and abort uploads abandoned a day
        ago. Without it (gc, verify: a store only looked at) nothing is changed by opening."""
        if claim:
            self.staging.open()
        loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="s3-client", daemon=True)
        self._thread.start()
        self._loop = loop
        self._run(self._start())
        if claim:
            self._run(self._abort_abandoned_uploads())

    def close(self) -> None:
        if self._loop is not None:
            try:
                self._run(self._stop())
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                if self._thread is not None:
                    self._thread.join(10)
                self._loop.close()
                self._loop = None
        self.staging.close()

    async def _start(self) -> None:
        o = self._options
        # Explicit timeouts and one retry (botocore's defaults are 60 s each, and "max_attempts": 3 meant
        # 4 attempts: 4 minutes): a stalled store fails a request within about 2 x timeout, a stalled body is cut off.
        # Bodies read are checked by their SHA-256 (`proxy.s3integrity`), a mismatch quarantined; botocore's own
        # check of an object's CRC (only whole objects uploaded in one part have one) would add nothing but a
        # second, different failure for the same wrong bytes. Uploads still carry a checksum the store verifies.
        config = AioConfig(
            s3={"addressing_style": "path" if o.path_style else "auto"},
            signature_version="s3v4",
            max_pool_connections=64,
            connect_timeout=o.timeout / 2,
            read_timeout=o.timeout,
            retries={"total_max_attempts": ATTEMPTS, "mode": "standard"},
            response_checksum_validation="when_required",
        )
        self._client_context = get_session().create_client(
            "s3",
            endpoint_url=o.endpoint_url,
            region_name=o.region,
            config=config,
            verify=str(o.ca_file) if o.ca_file else None,
        )
        self._client = await self._client_context.__aenter__()
        try:
            await self._client.head_bucket(Bucket=self.location.bucket)
        except (ClientError, BotoCoreError) as exc:
            await self._stop()
            raise StoreUnavailableError(f"archive store {self.location} is not reachable: {_reason(exc)}") from None

    async def _stop(self) -> None:
        if self._client_context is not None:
            context, self._client_context, self._client = self._client_context, None, None
            await context.__aexit__(None, None, None)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the client's loop and wait for it (blocking; never call from that loop)."""
        assert self._loop is not None, "the store is not open"
        return asyncio.run_coroutine_threadsafe(_translated(coro), self._loop).result()

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the client's loop and await it from another event loop."""
        assert self._loop is not None, "the store is not open"
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_translated(coro), self._loop))

    # ---- staging (local) ---------------------------------------------------------------------

    def begin(self) -> PendingArchive:
        return self.staging.begin()

    def temp_path(self) -> Path:
        return self.staging.temp_path()

    @property
    def temp_root(self) -> Path:
        return self.staging.temp_root

    @property
    def temp_dir(self) -> Path:
        return self.staging.temp_dir

    def temp_dirs(self) -> list[Path]:
        return self.staging.temp_dirs()

    def abandoned_temp_dirs(self) -> list[Path]:
        return self.staging.abandoned_temp_dirs()

    def remove_temp_dir(self, path: Path) -> None:
        self.staging.remove_temp_dir(path)

    def is_writable(self) -> bool:
        return self.staging.is_writable()

    def path_for(self, sha256: str) -> Path:
        """The local staging address (never holds a published archive: those are in the bucket)."""
        return self.staging.path_for(sha256)

    def key_for(self, sha256: str) -> str:
        if not _HEX64.match(sha256):
            raise ValueError(f"not a SHA-256 hex digest: {sha256!r}")
        return self.location.prefix + sha256

    # ---- objects -------------------------------------------------------------------------------

    def get(self, sha256: str) -> RemoteArchive | None:
        return self._run(self._head(sha256))

    async def head(self, sha256: str) -> RemoteArchive | None:
        """`get` for an event loop."""
        return await self._call(self._head(sha256))

    async def _head(self, sha256: str) -> RemoteArchive | None:
        key = self.key_for(sha256)
        try:
            answer = await self._client.head_object(Bucket=self.location.bucket, Key=key)
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise
        what = f"HEAD {key}"
        return RemoteArchive(sha256, size_of(answer, what), key, etag_of(answer, what))

    def publish(self, pending: PendingArchive, sha256: str) -> RemoteArchive:
        """Upload a finished, verified temp file to its content address, then remove the temp file."""
        return self.publish_path(pending.path, sha256)

    def publish_path(self, path: Path, sha256: str) -> RemoteArchive:
        """Upload a verified file (unless the same-size object is there already) and remove it."""
        self.key_for(sha256)  # a hostile address is refused before anything is sent
        stored = self._run(self._upload(path, sha256))
        path.unlink(missing_ok=True)
        self.remember_verified(sha256, stored.etag)
        return stored

    async def _upload(self, path: Path, sha256: str) -> RemoteArchive:
        size = (await asyncio.to_thread(path.stat)).st_size
        present = await self._head(sha256)
        if present is not None and present.size == size:
            return present
        key, bucket = self.key_for(sha256), self.location.bucket
        if size <= PART_SIZE:
            body = await asyncio.to_thread(path.read_bytes)
            answer = await self._client.put_object(Bucket=bucket, Key=key, Body=body)
            return RemoteArchive(sha256, size, key, etag_of(answer, f"PUT {key}"))
        upload = await self._client.create_multipart_upload(Bucket=bucket, Key=key)
        upload_id = text_of(upload, "UploadId", f"CreateMultipartUpload {key}")
        try:
            parts = []
            with open(path, "rb") as handle:  # noqa: ASYNC230 - each read is one part, in a thread
                number = 1
                while chunk := await asyncio.to_thread(handle.read, PART_SIZE):
                    part = await self._client.upload_part(
                        Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=chunk
                    )
                    parts.append({"PartNumber": number, "ETag": etag_of(part, f"UploadPart {number} of {key}")})
                    number += 1
            answer = await self._client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            await asyncio.shield(self._client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id))
            raise
        return RemoteArchive(sha256, size, key, etag_of(answer, f"CompleteMultipartUpload {key}"))

    async def _abort_abandoned_uploads(self) -> None:
        """Abort multipart uploads under the prefix started over a day ago (by a process that died)."""
        for upload in await self._uploads():
            if time.time() - upload.initiated > ABANDONED_UPLOAD_AFTER:
                await self._client.abort_multipart_upload(
                    Bucket=self.location.bucket, Key=upload.key, UploadId=upload.upload_id
                )

    def unfinished_uploads(self) -> list[str]:
        """Keys of multipart uploads under the prefix not yet completed or aborted."""
        return [upload.key for upload in self._run(self._uploads())]

    async def _uploads(self) -> list[Upload]:
        found: list[Upload] = []
        paginator = self._client.get_paginator("list_multipart_uploads")
        async for page in paginator.paginate(Bucket=self.location.bucket, Prefix=self.location.prefix):
            found.extend(uploads_of(page, f"ListMultipartUploads {self.location.prefix}"))
        return found

    async def _uploads_before(self, before: float) -> list[Leftover]:
        """Unfinished multipart uploads under the prefix started before `before`, with the bytes of their parts."""
        found = []
        for upload in await self._uploads():
            if upload.initiated >= before:
                continue
            size = 0
            paginator = self._client.get_paginator("list_parts")
            try:
                async for page in paginator.paginate(
                    Bucket=self.location.bucket, Key=upload.key, UploadId=upload.upload_id
                ):
                    size += parts_size_of(page, f"ListParts {upload.key}")
            except ClientError as exc:
                if _status(exc) == 404:  # completed or aborted meanwhile
                    continue
                raise
            name = f"{self._url(upload.key)}?uploadId={upload.upload_id}"
            found.append(Leftover(UPLOAD, name, size, upload.initiated))
        return found

    def _url(self, key: str) -> str:
        return f"s3://{self.location.bucket}/{key}"

    def _key_of(self, name: str, under: str) -> str | None:
        """The key an s3:// URL of this bucket names, if it is under `under` (None otherwise)."""
        base = self._url("")
        key = name[len(base) :] if name.startswith(base) else ""
        return key if key.startswith(under) and len(key) > len(under) else None

    def list_objects(self) -> Iterator[ObjectInfo]:
        """Every object at a content address under the prefix (not the quarantine, not other keys)."""
        for key, size, modified in self._run(self._list(self.location.prefix)):
            name = key[len(self.location.prefix) :]
            if _HEX64.match(name):
                yield ObjectInfo(name, size, modified)

    def strays(self) -> list[str]:
        """Keys directly under the prefix that are not content addresses."""
        prefix = self.location.prefix
        return [key for key, _, _ in self._run(self._list(prefix)) if not _HEX64.match(key[len(prefix) :])]

    def leftovers(self, before: float) -> list[Leftover]:
        """What gc may remove besides archives: the staging area's temp dirs of dead processes, multipart
        uploads started before `before` and objects quarantined before it; and the strays (keys under the
        prefix that are not content addresses), which it only reports: the proxy never writes such keys, so
        they are not clearly its own (with an empty or shared prefix they are someone else's)."""
        found = [item for item in self.staging.leftovers(before) if item.kind == TEMP]
        found += self._run(self._uploads_before(before))
        found += [item for item in self.quarantined() if item.since < before]
        prefix = self.location.prefix
        listed = self._run(self._list(prefix))
        found += [
            Leftover(STRAY, self._url(key), size, modified)
            for key, size, modified in listed
            if not _HEX64.match(key[len(prefix) :])
        ]
        return found

    def remove_leftover(self, item: Leftover) -> bool:
        """Remove a dead process's temp dir, abort an unfinished upload or delete a quarantined object;
        whether it is gone. Strays and anything not under this store's prefix stay."""
        if item.kind == TEMP:
            return self.staging.remove_leftover(item)
        if item.kind == UPLOAD:
            name, _, upload_id = item.name.rpartition("?uploadId=")
            key = self._key_of(name, self.location.prefix)
            return bool(key and upload_id) and self._run(self._abort(key, upload_id))
        if item.kind == QUARANTINED:
            key = self._key_of(item.name, self.location.prefix + QUARANTINE)
            if key is None:
                return False
            self._run(self._client.delete_object(Bucket=self.location.bucket, Key=key))
            return True
        return False

    async def _abort(self, key: str, upload_id: str) -> bool:
        try:
            await self._client.abort_multipart_upload(Bucket=self.location.bucket, Key=key, UploadId=upload_id)
        except ClientError as exc:
            if _status(exc) != 404:  # NoSuchUpload: completed or aborted meanwhile
                raise
        return True

    async def _list(self, prefix: str) -> list[tuple[str, int, float]]:
        found: list[tuple[str, int, float]] = []
        paginator = self._client.get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=self.location.bucket, Prefix=prefix, Delimiter="/"):
            found.extend((item.key, item.size, item.modified) for item in objects_of(page, f"ListObjectsV2 {prefix}"))
        return found

    def remove(self, sha256: str) -> int:
        """Delete the object at `sha256`'s address; the bytes freed (0 if there was none)."""
        return self._run(self._remove(sha256))

    async def _remove(self, sha256: str) -> int:
        present = await self._head(sha256)
        if present is None:
            return 0
        await self._client.delete_object(Bucket=self.location.bucket, Key=present.key)
        with self._lock:
            self._verified.pop(sha256, None)
        return present.size

    # ---- integrity -----------------------------------------------------------------------------

    def check(self, sha256: str, progress: Callable[[int], None] | None = None) -> ObjectCheck | None:
        """Hash the object at `sha256`'s address (None if there is none); remembered if intact."""
        return self._run(self._check(sha256, progress))

    async def check_async(self, sha256: str) -> ObjectCheck | None:
        return await self._call(self._check(sha256, None))

    async def _check(self, sha256: str, progress: Callable[[int], None] | None) -> ObjectCheck | None:
        present = await self._head(sha256)
        if present is None:
            return None
        digest = hashlib.sha256()
        try:
            answer = await self._client.get_object(Bucket=self.location.bucket, Key=present.key, IfMatch=present.etag)
        except ClientError as exc:
            if _status(exc) in (404, 412):  # replaced or removed meanwhile: look again
                return await self._check(sha256, progress) if _status(exc) == 412 else None
            raise
        async with body_of(answer, f"GET {present.key}") as body:
            while chunk := await body.read(HASH_CHUNK):
                digest.update(chunk)
                if progress is not None:
                    progress(len(chunk))
        result = ObjectCheck(present, digest.hexdigest(), present.etag)  # type: ignore[arg-type]
        if result.intact:
            self.remember_verified(sha256, present.etag)
        return result

    def remember_verified(self, sha256: str, etag: str) -> None:
        """Record that the object with this ETag hashed to its address."""
        with self._lock:
            if len(self._verified) >= VERIFIED_FACTS and sha256 not in self._verified:
                self._verified.pop(next(iter(self._verified)), None)
            self._verified[sha256] = etag

    def was_found_intact(self, sha256: str, etag: str) -> bool:
        return self._verified.get(sha256) == etag

    def is_verified(self, stored: RemoteArchive | StoredArchive) -> bool:
        return isinstance(stored, RemoteArchive) and self.was_found_intact(stored.sha256, stored.etag)

    def quarantine(self, sha256: str, ident: str | None = None) -> str | None:
        """Move the object at `sha256`'s address to `PREFIX + quarantine/`; None if it is gone already.

        With `ident` (an ETag), only that very object is moved: a fresh copy published meanwhile stays."""
        return self._run(self._quarantine(sha256, ident))

    async def quarantine_async(self, sha256: str, ident: str | None = None) -> str | None:
        return await self._call(self._quarantine(sha256, ident))

    async def _quarantine(self, sha256: str, ident: str | None) -> str | None:
        key, bucket = self.key_for(sha256), self.location.bucket
        with self._lock:
            self._verified.pop(sha256, None)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = f"{self.location.prefix}{QUARANTINE}{sha256}-{stamp}-{uuid.uuid4().hex[:6]}"
        source: dict[str, Any] = {"Bucket": bucket, "Key": key}
        try:
            copy = {"CopySourceIfMatch": ident} if ident else {}
            await self._client.copy_object(Bucket=bucket, Key=target, CopySource=source, **copy)
        except ClientError as exc:
            if _status(exc) in (404, 412):
                return None
            raise
        present = await self._head(sha256)
        if present is not None and (ident is None or present.etag == ident):
            await self._client.delete_object(Bucket=bucket, Key=key)
        return f"s3://{bucket}/{target}"

    def quarantined(self) -> list[Leftover]:
        """Every object under `PREFIX + quarantine/`, with its size and when it was moved there."""
        return [
            Leftover(QUARANTINED, self._url(key), size, quarantined_at(key, modified))
            for key, size, modified in self._run(self._list(self.location.prefix + QUARANTINE))
        ]

    # ---- serving -------------------------------------------------------------------------------

    async def stream(self, stored: RemoteArchive, start: int, length: int, chunk: int) -> AsyncGenerator[bytes, None]:
        """`length` bytes from `start` of the very object `stored` names (its ETag), in chunks of at most
        `chunk` bytes, read on the client's loop and handed to the caller's. A replaced object raises
        StoreCorruptionError before the first byte (looked up again by the caller)."""
        answer = await self._call(self._get_range(stored, start, length))
        body = body_of(answer, f"GET {stored.key}")
        try:
            while data := await self._call(_read_up_to(body, chunk)):
                yield data
        finally:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(body.close)

    async def _get_range(self, stored: RemoteArchive, start: int, length: int) -> dict[str, Any]:
        try:
            return await self._client.get_object(
                Bucket=self.location.bucket,
                Key=stored.key,
                IfMatch=stored.etag,
                Range=f"bytes={start}-{start + length - 1}",
            )
        except ClientError as exc:
            if _status(exc) in (404, 412, 416):
                raise StoreCorruptionError(
                    f"archive {stored.sha256} changed or vanished in the object store; it is looked up again"
                ) from None
            raise

    async def presign(self, stored: RemoteArchive, expires: float) -> str:
        """A GET URL of the object valid for `expires` seconds (signed with the proxy's credentials)."""
        return await self._call(
            self._client.generate_presigned_url(
                "get_object", Params={"Bucket": self.location.bucket, "Key": stored.key}, ExpiresIn=int(expires)
            )
        )

    def download_to(self, sha256: str, path: Path) -> RemoteArchive | None:
        """Copy the object at `sha256`'s address into the local file `path` (None if there is none)."""
        return self._run(self._download_to(sha256, path))

    async def _download_to(self, sha256: str, path: Path) -> RemoteArchive | None:
        present = await self._head(sha256)
        if present is None:
            return None
        answer = await self._client.get_object(Bucket=self.location.bucket, Key=present.key, IfMatch=present.etag)
        with open(path, "wb") as handle:  # noqa: ASYNC230 - commands only
            async with body_of(answer, f"GET {present.key}") as body:
                while chunk := await body.read(HASH_CHUNK):
                    await asyncio.to_thread(handle.write, chunk)
        return present


async def _read_up_to(body: Any, size: int) -> bytes:
    """`size` bytes of a streamed body (fewer only at its end): one hop between the loops per chunk,
    however small the network's reads are."""
    parts, have = [], 0
    while have < size and (part := await body.read(size - have)):
        parts.append(part)
        have += len(part)
    return b"".join(parts)


async def _translated(coro: Coroutine[Any, Any, T]) -> T:
    """Connection failures, server errors and unreadable answers of the object store as StoreUnavailableError."""
    try:
        return await coro
    except BotoCoreError as exc:
        raise StoreUnavailableError(f"the archive store is not reachable: {_reason(exc)}") from None
    except ClientError as exc:
        raise StoreUnavailableError(f"the archive store refused a request: {_reason(exc)}") from None
    except ResponseParserError as exc:
        raise StoreUnavailableError(f"the archive store sent an answer that cannot be read: {exc}") from None


def _status(exc: ClientError) -> int:
    return status_of(exc.response)


def _reason(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        code, message = error_of(exc.response)
        return f"{code} ({_status(exc)}): {message}".strip()
    return str(exc)
