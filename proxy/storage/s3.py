"""Verified archives in S3-compatible object storage (AWS S3, MinIO, Ceph RGW, GCS in S3 mode).

Object key = PREFIX + SHA-256 hex. Downloads stage in the local staging area (this process's temp
directory, reaped after a crash, and the cold streaming of growing files) and are uploaded only once
verified (`publish_path`): one PUT up to `PART_SIZE`, a multipart upload above it; a failed multipart
upload is aborted, so no half object is ever visible (S3 shows an object only once its upload
completed). Publishing content that is already there (same key, same size) uploads nothing. Reads name
the ETag of the object looked up (`If-Match`), so a body is never cut from another object than the one
seen. Objects found corrupt are copied to `PREFIX + quarantine/` and deleted. A copy's `version` is its
ETag.

The aiobotocore client lives on the event loop that opened the store (the server's, or a command's):
every method touching the bucket is a coroutine of that loop. Every field read from an answer is
checked (`proxy.storage.s3_answers`); connection failures, refusals and malformed answers are
StoreUnavailableError. Credentials come from botocore's default chain (environment, shared config and
credentials files, container and instance roles); the proxy has no flags for secrets.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from aiobotocore.config import AioConfig
from aiobotocore.httpsession import AIOHTTPSession
from aiobotocore.session import get_session
from aiohttp import ClientPayloadError
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.parsers import ResponseParserError

from proxy.errors import StoreCorruptionError, StoreUnavailableError
from proxy.runtime.client_reads import read_into_shared_buffer
from proxy.runtime.shared_reads import PIECE
from proxy.settings.config import S3Location
from proxy.storage.objects import QUARANTINE as QUARANTINED
from proxy.storage.objects import (
    STRAY,
    UPLOAD,
    Leftover,
    ObjectCheck,
    ObjectInfo,
    StoredArchive,
    checked_address,
    is_address,
    quarantine_name,
    quarantined_at,
)
from proxy.storage.s3_answers import (
    Listed,
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
from proxy.storage.staging import HASH_CHUNK, PendingArchive, Staged, Staging

log = structlog.get_logger(__name__)
PART_SIZE = 16 * 2**20  # above this, a multipart upload in parts of this size (S3's minimum is 5 MiB)
ABANDONED_UPLOAD_AFTER = 24 * 3600.0
QUARANTINE = "quarantine/"
ATTEMPTS = 2  # per request: the first try and one retry (timeouts, connection errors, throttling, 5xx)
LOOKS = 3  # an object replaced between its HEAD and its GET is looked at again, this many times in all
RESUMES = 8  # a body cut off before its end is taken up again where it stopped, at most this many times
EAGER = 1 << 20  # the rest of a body taken up again is read in pieces this large


@dataclass(frozen=True)
class S3Options:
    """How to reach the object storage: endpoint (None: AWS), region, path-style addressing, extra CA."""

    endpoint_url: str | None = None
    region: str | None = None
    path_style: bool = False
    ca_file: Path | None = None
    timeout: float = 20.0  # seconds: each read (response head or more body) within it, connecting within half


class S3Store(Staged):
    """Verified archives by SHA-256 in a bucket."""

    local = False
    adopts = False  # a copy without a record is fetched and verified again; its upload then finds it there

    def __init__(self, root: Path, location: S3Location, options: S3Options = S3Options()) -> None:
        self.root = root
        self.staging = Staging(root)
        self.location = location
        self._options = options
        self._client: Any = None
        self._client_context: Any = None

    # ---- life cycle ---------------------------------------------------------------------------

    async def open(self, *, claim: bool = True) -> None:
        """Start the client and check the bucket is reachable; with `claim` (a store written to), also open
        the staging area (this process's temp dir, dead processes' reaped) and abort uploads abandoned a day
        ago. Without it (gc, verify: a store only looked at) nothing is changed by opening."""
        if claim:
            await asyncio.to_thread(self.staging.open)
        try:
            await self._start()
            if claim:
                with _translated():
                    await self._abort_abandoned_uploads()
        except BaseException:  # nothing stays open when opening fails
            await self.close()
            raise

    async def close(self) -> None:
        try:
            await self._stop()
        finally:
            await asyncio.to_thread(self.staging.close)

    async def _start(self) -> None:
        o = self._options
        # Explicit timeouts and one retry (botocore's defaults are 60 s each, and "max_attempts": 3 meant
        # 4 attempts: 4 minutes): a stalled store fails a request within about 2 x timeout, a stalled body is cut off.
        # Bodies read are checked by their SHA-256 (`proxy.storage.guard`), a mismatch quarantined; botocore's own
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
            http_session_cls=SharedBufferSession,
        )
        context = get_session().create_client(
            "s3",
            endpoint_url=o.endpoint_url,
            region_name=o.region,
            config=config,
            verify=str(o.ca_file) if o.ca_file else None,
        )
        # kept only once entered: a context cancelled while it makes its client (credentials) cannot be exited
        self._client = await context.__aenter__()
        self._client_context = context
        try:
            await self._client.head_bucket(Bucket=self.location.bucket)
        except (ClientError, BotoCoreError) as exc:
            await self._stop()
            raise StoreUnavailableError(f"archive store {self.location} is not reachable: {_reason(exc)}") from None

    async def _stop(self) -> None:
        if self._client_context is not None:
            context, self._client_context, self._client = self._client_context, None, None
            await context.__aexit__(None, None, None)

    @property
    def _s3(self) -> Any:
        assert self._client is not None, "the store is not open"
        return self._client

    def path_for(self, sha256: str) -> Path:
        """The local staging address (never holds a published archive: those are in the bucket)."""
        checked_address(sha256)
        return self.root / "sha256" / sha256[:2] / sha256[2:4] / sha256

    def key_for(self, sha256: str) -> str:
        return self.location.prefix + checked_address(sha256)

    def _url(self, key: str) -> str:
        return f"s3://{self.location.bucket}/{key}"

    def _stored(self, sha256: str, size: int, key: str, etag: str) -> StoredArchive:
        return StoredArchive(sha256, size, etag, self._url(key))

    # ---- objects -------------------------------------------------------------------------------

    async def get(self, sha256: str) -> StoredArchive | None:
        key = self.key_for(sha256)
        with _translated():
            return await self._head(sha256, key)

    async def _head(self, sha256: str, key: str) -> StoredArchive | None:
        try:
            answer = await self._s3.head_object(Bucket=self.location.bucket, Key=key)
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise
        what = f"HEAD {key}"
        return self._stored(sha256, size_of(answer, what), key, etag_of(answer, what))

    async def publish(self, pending: PendingArchive, sha256: str) -> StoredArchive:
        return await self.publish_path(pending.path, sha256)

    async def publish_path(self, path: Path, sha256: str) -> StoredArchive:
        """Upload a verified file (unless the same-size object is there already) and remove it."""
        key = self.key_for(sha256)  # a hostile address is refused before anything is sent
        with _translated():
            stored = await self._upload(path, sha256, key)
        await asyncio.to_thread(path.unlink, missing_ok=True)
        return stored

    async def _upload(self, path: Path, sha256: str, key: str) -> StoredArchive:
        size = (await asyncio.to_thread(path.stat)).st_size
        present = await self._head(sha256, key)
        if present is not None and present.size == size:
            return present
        bucket = self.location.bucket
        if size <= PART_SIZE:
            body = await asyncio.to_thread(path.read_bytes)
            answer = await self._s3.put_object(Bucket=bucket, Key=key, Body=body)
            return self._stored(sha256, size, key, etag_of(answer, f"PUT {key}"))
        upload = await self._s3.create_multipart_upload(Bucket=bucket, Key=key)
        upload_id = text_of(upload, "UploadId", f"CreateMultipartUpload {key}")
        try:
            parts = []
            with open(path, "rb") as handle:  # noqa: ASYNC230 - each read is one part, in a thread
                number = 1
                while chunk := await asyncio.to_thread(handle.read, PART_SIZE):
                    part = await self._s3.upload_part(
                        Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=chunk
                    )
                    parts.append({"PartNumber": number, "ETag": etag_of(part, f"UploadPart {number} of {key}")})
                    number += 1
            answer = await self._s3.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            await asyncio.shield(self._s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id))
            raise
        return self._stored(sha256, size, key, etag_of(answer, f"CompleteMultipartUpload {key}"))

    async def open_reader(self, stored: StoredArchive, start: int, length: int) -> ObjectReader:
        """A GET of the span from the very object `stored` names (its ETag), answered before this returns:
        a replaced or removed object raises StoreCorruptionError before a byte is sent (looked up again)."""
        reader = ObjectReader(self, stored, start, length)
        await reader.get(start)
        return reader

    async def _get_range(self, stored: StoredArchive, start: int, end: int) -> Any:
        """The body of bytes `start` to `end` (exclusive) of the very object `stored` names."""
        key = self.key_for(stored.sha256)
        with _translated():
            try:
                answer = await self._s3.get_object(
                    Bucket=self.location.bucket, Key=key, IfMatch=str(stored.version), Range=f"bytes={start}-{end - 1}"
                )
            except ClientError as exc:
                if _status(exc) in (404, 412, 416):
                    raise StoreCorruptionError(
                        f"archive {stored.sha256} changed or vanished in the object store; it is looked up again"
                    ) from None
                raise
        return body_of(answer, f"GET {key}")

    async def check(self, sha256: str, progress: Callable[[int], None] | None = None) -> ObjectCheck | None:
        """Hash the object at `sha256`'s address (None if there is none). An object replaced between its
        HEAD and its GET is looked at again, `LOOKS` times in all; then the store is taken as unusable."""
        key = self.key_for(sha256)
        with _translated():
            for _ in range(LOOKS):
                present = await self._head(sha256, key)
                if present is None:
                    return None
                try:
                    answer = await self._s3.get_object(Bucket=self.location.bucket, Key=key, IfMatch=present.version)
                except ClientError as exc:
                    if _status(exc) == 404:  # removed meanwhile
                        return None
                    if _status(exc) == 412:  # replaced meanwhile: look again
                        continue
                    raise
                digest = hashlib.sha256()
                async with body_of(answer, f"GET {key}") as body:
                    while chunk := await body.read(HASH_CHUNK):
                        digest.update(chunk)
                        if progress is not None:
                            progress(len(chunk))
                return ObjectCheck(present, digest.hexdigest())
        raise StoreUnavailableError(f"archive {sha256} kept changing in the object store while it was read")

    async def quarantine(self, sha256: str, version: Hashable | None = None) -> str | None:
        """Copy the object to `PREFIX + quarantine/` and delete it (with `version`, an ETag, only that very
        object); where it went, or None if it is gone (or replaced) already."""
        key, bucket = self.key_for(sha256), self.location.bucket
        target = f"{self.location.prefix}{QUARANTINE}{quarantine_name(sha256, uuid.uuid4().hex[:6])}"
        with _translated():
            present = await self._head(sha256, key)
            if present is None or (version is not None and present.version != version):
                return None
            try:
                await self._s3.copy_object(
                    Bucket=bucket,
                    Key=target,
                    CopySource={"Bucket": bucket, "Key": key},
                    CopySourceIfMatch=str(present.version),
                )
            except ClientError as exc:
                if _status(exc) in (404, 412):  # removed or replaced since the HEAD
                    return None
                raise
            current = await self._head(sha256, key)
            if current is not None and current.version == present.version:
                await self._s3.delete_object(Bucket=bucket, Key=key)
        return self._url(target)

    async def quarantined(self) -> list[Leftover]:
        """Every object under `PREFIX + quarantine/`, with its size and when it was moved there."""
        with _translated():
            listed = await self._list(self.location.prefix + QUARANTINE)
        return [
            Leftover(QUARANTINED, self._url(item.key), item.size, quarantined_at(item.key, item.modified))
            for item in listed
        ]

    async def strays(self) -> list[str]:
        """Keys directly under the prefix that are not content addresses."""
        return [item.key for item in await self._listed() if not self._is_object(item)]

    async def list_objects(self) -> list[ObjectInfo]:
        """Every object at a content address under the prefix (not the quarantine, not other keys)."""
        prefix = self.location.prefix
        return [
            ObjectInfo(item.key[len(prefix) :], item.size, item.modified)
            for item in await self._listed()
            if self._is_object(item)
        ]

    def _is_object(self, item: Listed) -> bool:
        return is_address(item.key[len(self.location.prefix) :])

    async def _listed(self) -> list[Listed]:
        with _translated():
            return await self._list(self.location.prefix)

    async def _list(self, prefix: str) -> list[Listed]:
        found: list[Listed] = []
        paginator = self._s3.get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=self.location.bucket, Prefix=prefix, Delimiter="/"):
            found.extend(objects_of(page, f"ListObjectsV2 {prefix}"))
        return found

    async def remove(self, sha256: str) -> int:
        """Delete the object at `sha256`'s address; the bytes freed (0 if there was none)."""
        key = self.key_for(sha256)
        with _translated():
            present = await self._head(sha256, key)
            if present is None:
                return 0
            await self._s3.delete_object(Bucket=self.location.bucket, Key=key)
        return present.size

    # ---- what gc removes -------------------------------------------------------------------------

    async def leftovers(self, before: float) -> list[Leftover]:
        """What gc may remove besides archives: the staging area's temp dirs of dead processes, multipart
        uploads started before `before` and objects quarantined before it; and the strays (keys under the
        prefix that are not content addresses), which it only reports: the proxy never writes such keys, so
        they are not clearly its own (with an empty or shared prefix they are someone else's)."""
        found = await asyncio.to_thread(self.staging.leftovers)
        with _translated():
            found += await self._uploads_before(before)
        found += [item for item in await self.quarantined() if item.since < before]
        found += [
            Leftover(STRAY, self._url(item.key), item.size, item.modified)
            for item in await self._listed()
            if not self._is_object(item)
        ]
        return found

    async def remove_leftover(self, item: Leftover) -> bool:
        """Remove a dead process's temp dir, abort an unfinished upload or delete a quarantined object;
        whether it is gone. Strays and anything not under this store's prefix stay."""
        if item.kind == UPLOAD:
            name, _, upload_id = item.name.rpartition("?uploadId=")
            key = self._key_of(name, self.location.prefix)
            if not (key and upload_id):
                return False
            with _translated():
                await self._abort(key, upload_id)
            return True
        if item.kind == QUARANTINED:
            key = self._key_of(item.name, self.location.prefix + QUARANTINE)
            if key is None:
                return False
            with _translated():
                await self._s3.delete_object(Bucket=self.location.bucket, Key=key)
            return True
        return await asyncio.to_thread(self.staging.remove_leftover, item)

    def _key_of(self, name: str, under: str) -> str | None:
        """The key an s3:// URL of this bucket names, if it is under `under` (None otherwise)."""
        base = self._url("")
        key = name[len(base) :] if name.startswith(base) else ""
        return key if key.startswith(under) and len(key) > len(under) else None

    async def unfinished_uploads(self) -> list[str]:
        """Keys of multipart uploads under the prefix not yet completed or aborted."""
        with _translated():
            return [upload.key for upload in await self._uploads()]

    async def _uploads(self) -> list[Upload]:
        found: list[Upload] = []
        paginator = self._s3.get_paginator("list_multipart_uploads")
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
            paginator = self._s3.get_paginator("list_parts")
            try:
                async for page in paginator.paginate(
                    Bucket=self.location.bucket, Key=upload.key, UploadId=upload.upload_id
                ):
                    size += parts_size_of(page, f"ListParts {upload.key}")
            except ClientError as exc:
                if _status(exc) == 404:  # completed or aborted meanwhile
                    continue
                raise
            found.append(
                Leftover(UPLOAD, f"{self._url(upload.key)}?uploadId={upload.upload_id}", size, upload.initiated)
            )
        return found

    async def _abort_abandoned_uploads(self) -> None:
        """Abort multipart uploads under the prefix started over a day ago (by a process that died)."""
        for upload in await self._uploads():
            if time.time() - upload.initiated > ABANDONED_UPLOAD_AFTER:
                await self._abort(upload.key, upload.upload_id)

    async def _abort(self, key: str, upload_id: str) -> None:
        try:
            await self._s3.abort_multipart_upload(Bucket=self.location.bucket, Key=key, UploadId=upload_id)
        except ClientError as exc:
            if _status(exc) != 404:  # NoSuchUpload: completed or aborted meanwhile
                raise

    # ---- copies and URLs ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def local_copy(self, sha256: str) -> AsyncIterator[Path | None]:
        """The object downloaded into this process's temp directory while the block runs (removed after)."""
        key = self.key_for(sha256)
        path = await asyncio.to_thread(self.staging.temp_path)
        try:
            with _translated():
                present = await self._head(sha256, key)
                if present is not None:
                    answer = await self._s3.get_object(Bucket=self.location.bucket, Key=key, IfMatch=present.version)
                    with open(path, "wb") as handle:  # noqa: ASYNC230 - each write in a thread
                        async with body_of(answer, f"GET {key}") as body:
                            while chunk := await body.read(HASH_CHUNK):
                                await asyncio.to_thread(handle.write, chunk)
            yield None if present is None else path
        finally:
            await asyncio.to_thread(path.unlink, missing_ok=True)

    async def presign(self, stored: StoredArchive, expires: float) -> str | None:
        """A GET URL of the object valid for `expires` seconds (signed with the proxy's credentials)."""
        params = {"Bucket": self.location.bucket, "Key": self.key_for(stored.sha256)}
        with _translated():
            return await self._s3.generate_presigned_url("get_object", Params=params, ExpiresIn=int(expires))


class SharedBufferSession(AIOHTTPSession):
    """aiobotocore's HTTP session, its connections reading into one buffer of the process
    (`proxy.runtime.client_reads`: without it every TLS record of a body read costs an mmap and an munmap)."""

    async def _create_connector(self, proxy_url: str | None) -> Any:
        return read_into_shared_buffer(await super()._create_connector(proxy_url))


class ObjectReader:
    """A span of one object read with ranged GETs naming its ETag, a chunk of the size asked for at a time
    (a hop per chunk, however small the network's reads are), handed out in the pieces it was read in
    (`PIECE` at most: never copied into one block).

    A body cut off before its end (the connection closed early) is taken up again where it stopped, with
    another GET of the rest of the span from the same object, up to `RESUMES` times: uvloop drops what
    it had received but not yet handed on when the store closes the connection while reading is paused
    for a slow client (MagicStack/uvloop#661), and stores close connections when they like. The rest,
    once it is small (`EAGER`), is read in one go, so that no pause falls on its end. A stall is not
    resumed: it fails after `--s3-timeout` as before."""

    def __init__(self, store: S3Store, stored: StoredArchive, start: int, length: int) -> None:
        self._store = store
        self._stored = stored
        self._start = start
        self._end = start + length
        self._body: Any = None
        self.size = stored.size  # `If-Match`: the very object looked up
        self.version = stored.version

    async def get(self, offset: int) -> None:
        """(Re)open the body at `offset` of the span."""
        self.close()
        self._body = await self._store._get_range(self._stored, offset, self._end)

    async def chunks(self, size: int) -> AsyncGenerator[bytes, None]:
        # A body is read `PIECE` at a time at most: aiohttp joins what it holds up to the amount asked for into one
        # new block, and one of 128 KiB or more is mapped and unmapped on its own (the pinned mmap threshold).
        offset, resumes, piece = self._start, 0, min(size, PIECE)
        while offset < self._end:
            want = min(size, self._end - offset) if resumes == 0 else min(max(size, EAGER), self._end - offset)
            parts: list[bytes] = []
            try:
                with _translated(reading=True):
                    await _read_into(self._body, want, piece, parts)
            except StoreUnavailableError as exc:
                if not _cut(exc.__cause__) or resumes >= RESUMES:
                    raise
                resumes += 1
                got = sum(map(len, parts))
                log.info("storage.s3_body_resumed", sha256=self._stored.sha256, at=offset + got, error=str(exc))
                await self.get(offset + got)
                if not got:
                    continue
            if not parts:
                return  # the object ended early: the caller sees fewer bytes than it asked for
            for part in parts:  # as they came: never joined into one block (mapped on its own from 128 KiB)
                offset += len(part)
                yield part

    def close(self) -> None:
        if self._body is not None:
            self._body.close()


async def _read_into(body: Any, size: int, piece: int, parts: list[bytes]) -> None:
    """Up to `size` bytes of a streamed body into `parts`, `piece` bytes at most each (fewer in all only at its
    end); what was read before a failure stays in `parts`."""
    have = 0
    while have < size and (part := await body.read(min(piece, size - have))):
        parts.append(part)
        have += len(part)


@contextlib.contextmanager
def _translated(*, reading: bool = False) -> Iterator[None]:
    """Connection failures, refusals and unreadable answers of the object store as StoreUnavailableError
    (`reading`: any failure while a body streams, the connection lost mid-way included)."""
    try:
        yield
    except BotoCoreError as exc:
        if reading and _cut(exc):  # the cause stays: a reader takes up a cut body again
            raise StoreUnavailableError(f"reading from the archive store failed: {_reason(exc)}") from exc
        raise StoreUnavailableError(f"the archive store is not reachable: {_reason(exc)}") from None
    except ClientError as exc:
        raise StoreUnavailableError(f"the archive store refused a request: {_reason(exc)}") from None
    except ResponseParserError as exc:
        raise StoreUnavailableError(f"the archive store sent an answer that cannot be read: {exc}") from None
    except (StoreUnavailableError, StoreCorruptionError):
        raise
    except Exception as exc:
        if not reading:
            raise
        raise StoreUnavailableError(f"reading from the archive store failed: {exc!r}") from exc


def _cut(exc: BaseException | None) -> bool:
    """A body cut off before its end: the connection closed (aiohttp's errors, as they are or as aiobotocore
    wraps them), or the body ended before its length. A timeout (a stalled store) is not one: some of
    botocore's are OSErrors too."""
    if isinstance(exc, ReadTimeoutError | ConnectTimeoutError | TimeoutError):
        return False
    return isinstance(exc, ResponseStreamingError | IncompleteReadError | ConnectionError | ClientPayloadError)


def _status(exc: ClientError) -> int:
    return status_of(exc.response)


def _reason(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        code, message = error_of(exc.response)
        return f"{code} ({_status(exc)}): {message}".strip()
    return str(exc)
