"""S3Store against a stand-in client that answers wrongly: every answer the store reads is checked (a malformed
one is a StoreUnavailableError naming it, never a KeyError), and an object that keeps changing between its HEAD
and its GET is looked at a bounded number of times."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from proxy.errors import StoreUnavailableError
from proxy.settings.config import parse_s3_location
from proxy.storage import Leftover
from proxy.storage.s3 import LOOKS, S3Store

SHA = hashlib.sha256(b"archive").hexdigest()
KEY = f"archives/{SHA}"
WHEN = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
GOOD_HEAD = {"ContentLength": 7, "ETag": '"e1"'}


class Pages:
    def __init__(self, pages: list[Any]) -> None:
        self._pages = pages

    def paginate(self, **_: Any) -> Any:
        async def pages() -> Any:
            for page in self._pages:
                yield page

        return pages()


class Client:
    """Answers each call from `answers` (a value, or an exception to raise); records the calls."""

    def __init__(self, **answers: Any) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def get_paginator(self, name: str) -> Pages:
        return Pages(self.answers.get(name, [{}]))

    def __getattr__(self, name: str) -> Callable[..., Any]:
        async def call(**_: Any) -> Any:
            self.calls.append(name)
            answer = self.answers.get(name, {})
            if isinstance(answer, Exception):
                raise answer
            return answer

        return call


def store_with(tmp_path, client: Client) -> S3Store:
    store = S3Store(tmp_path, parse_s3_location("s3://bucket/archives"))
    store._client = client  # opened: the client is all a call needs
    return store


def refused(status: int) -> ClientError:
    return ClientError({"Error": {"Code": str(status)}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")


async def publish(store: S3Store) -> Any:
    path = store.temp_path()
    path.write_bytes(b"archive")
    return await store.publish_path(path, SHA)


async def upload_size(store: S3Store) -> Any:
    return await store.leftovers(before=WHEN.timestamp() + 1)


@pytest.mark.parametrize(
    "answers, action, field",
    [
        ({"head_object": {"ETag": '"e"'}}, lambda s: s.get(SHA), "ContentLength missing"),
        ({"head_object": {"ContentLength": "7", "ETag": '"e"'}}, lambda s: s.get(SHA), "ContentLength is not a size"),
        ({"head_object": {"ContentLength": 7}}, lambda s: s.get(SHA), "ETag missing"),
        ({"head_object": refused(404), "put_object": {}}, publish, "ETag missing"),
        ({"head_object": GOOD_HEAD, "get_object": {}}, lambda s: s.check(SHA), "Body missing"),
        ({"list_objects_v2": [{"Contents": [{"Key": KEY, "Size": 7}]}]}, lambda s: s.list_objects(), "LastModified"),
        ({"list_objects_v2": [{"Contents": [{"Size": 7, "LastModified": WHEN}]}]}, lambda s: s.strays(), "Key"),
        ({"list_objects_v2": [{"Contents": {"Key": KEY}}]}, lambda s: s.quarantined(), "Contents is not a list"),
        ({"list_multipart_uploads": [{"Uploads": [{"Key": KEY}]}]}, lambda s: s.unfinished_uploads(), "UploadId"),
        (
            {
                "list_multipart_uploads": [{"Uploads": [{"Key": KEY, "UploadId": "u", "Initiated": WHEN}]}],
                "list_parts": [{"Parts": [{"Size": None}]}],
            },
            upload_size,
            "Size missing",
        ),
        (
            {"head_object": GOOD_HEAD},
            lambda s: s.remove_leftover(Leftover("upload", f"s3://bucket/{KEY}?uploadId=", 0, 0)),
            None,
        ),
    ],
)
async def test_a_malformed_answer_is_a_store_error_naming_the_field(tmp_path, answers, action, field):
    store = store_with(tmp_path, Client(**answers))
    if field is None:  # an upload name without an id is not this store's: nothing is sent
        assert await action(store) is False
        return
    with pytest.raises(StoreUnavailableError, match="malformed answer") as raised:
        await action(store)
    assert field in raised.value.message


async def test_an_object_that_keeps_changing_is_looked_at_a_bounded_number_of_times(tmp_path):
    client = Client(head_object=GOOD_HEAD, get_object=refused(412))
    store = store_with(tmp_path, client)
    with pytest.raises(StoreUnavailableError, match="kept changing"):
        await store.check(SHA)
    assert client.calls.count("get_object") == LOOKS == client.calls.count("head_object")


async def test_an_error_answer_of_any_shape_is_a_store_error(tmp_path):
    odd = ClientError({"Error": {}, "ResponseMetadata": {"HTTPStatusCode": "500"}}, "HeadObject")
    store = store_with(tmp_path, Client(head_object=odd))
    with pytest.raises(StoreUnavailableError, match="refused a request"):
        await store.get(SHA)
