"""Reading the object store's answers: every field the S3 store uses, checked for presence and type. Pure.

botocore hands answers over as dicts built from whatever the server sent; a broken or hostile
S3-compatible server (or something in between) can leave a field out or send it in another shape.
A missing or ill-typed field is a `StoreUnavailableError` naming the request and the field, handled
like any other failure of the store (a JSON 503 for the client, a warning in the log, no traceback),
never a `KeyError` or `TypeError` in the middle of a request.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.errors import StoreUnavailableError


@dataclass(frozen=True)
class Upload:
    """An unfinished multipart upload: its key, id and when it was started (seconds since the epoch)."""

    key: str
    upload_id: str
    initiated: float


@dataclass(frozen=True)
class Listed:
    """One key of a listing: its name, size in bytes and modification time (seconds since the epoch)."""

    key: str
    size: int
    modified: float


def malformed(what: str, field: str, problem: str = "missing") -> StoreUnavailableError:
    return StoreUnavailableError(f"the archive store sent a malformed answer to {what}: {field} {problem}")


def _value(answer: object, field: str, what: str) -> Any:
    if not isinstance(answer, Mapping):
        raise malformed(what, field, f"missing (the answer is a {type(answer).__name__})")
    if answer.get(field) is None:
        raise malformed(what, field)
    return answer[field]


def size_of(answer: object, what: str, field: str = "ContentLength") -> int:
    """A byte count: a non-negative integer."""
    value = _value(answer, field, what)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise malformed(what, field, f"is not a size: {value!r:.40}")
    return value


def text_of(answer: object, field: str, what: str) -> str:
    """A non-empty string (an ETag, an upload id, a key)."""
    value = _value(answer, field, what)
    if not isinstance(value, str) or not value:
        raise malformed(what, field, f"is not a non-empty string: {value!r:.40}")
    return value


def etag_of(answer: object, what: str) -> str:
    return text_of(answer, "ETag", what)


def time_of(answer: object, field: str, what: str) -> float:
    """A timestamp (seconds since the epoch) from a datetime field."""
    value = _value(answer, field, what)
    if not isinstance(value, dt.datetime):
        raise malformed(what, field, f"is not a time: {value!r:.40}")
    return value.timestamp()


def items_of(page: object, field: str, what: str) -> list[Mapping[str, Any]]:
    """The entries of a listing page (none when the field is absent: an empty page)."""
    if not isinstance(page, Mapping):
        raise malformed(what, field, f"missing (the page is a {type(page).__name__})")
    items = page.get(field)
    if items is None:
        return []
    if not isinstance(items, list) or not all(isinstance(item, Mapping) for item in items):
        raise malformed(what, field, "is not a list of entries")
    return items


def objects_of(page: object, what: str) -> list[Listed]:
    """The keys of a `ListObjectsV2` page."""
    return [
        Listed(text_of(item, "Key", what), size_of(item, what, "Size"), time_of(item, "LastModified", what))
        for item in items_of(page, "Contents", what)
    ]


def uploads_of(page: object, what: str) -> list[Upload]:
    """The uploads of a `ListMultipartUploads` page."""
    return [
        Upload(text_of(item, "Key", what), text_of(item, "UploadId", what), time_of(item, "Initiated", what))
        for item in items_of(page, "Uploads", what)
    ]


def parts_size_of(page: object, what: str) -> int:
    """The bytes of the parts of a `ListParts` page."""
    return sum(size_of(item, what, "Size") for item in items_of(page, "Parts", what))


def body_of(answer: object, what: str) -> Any:
    """The streamed body of a `GetObject` answer."""
    body = _value(answer, "Body", what)
    if not hasattr(body, "read"):
        raise malformed(what, "Body", "is not a stream")
    return body


def status_of(response: object) -> int:
    """The HTTP status of an error answer (`ClientError.response`); 0 when it does not say."""
    meta = response.get("ResponseMetadata") if isinstance(response, Mapping) else None
    status = meta.get("HTTPStatusCode") if isinstance(meta, Mapping) else None
    return status if isinstance(status, int) and not isinstance(status, bool) else 0


def error_of(response: object) -> tuple[str, str]:
    """The code and message of an error answer (`ClientError.response`), whatever of them it has."""
    error = response.get("Error") if isinstance(response, Mapping) else None
    if not isinstance(error, Mapping):
        return "error", ""
    return str(error.get("Code") or "error"), str(error.get("Message") or "")
