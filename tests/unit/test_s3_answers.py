"""Reading the object store's answers: a missing or ill-typed field is a StoreUnavailableError naming it."""

from __future__ import annotations

import datetime as dt
import io

import pytest

from proxy.errors import StoreUnavailableError
from proxy.storage import s3_answers

WHEN = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
OBJECT = {"Key": "archives/" + "a" * 64, "Size": 12, "LastModified": WHEN}
UPLOAD = {"Key": "archives/" + "b" * 64, "UploadId": "u-1", "Initiated": WHEN}


def test_well_formed_answers_are_read():
    assert s3_answers.size_of({"ContentLength": 0}, "HEAD k") == 0
    assert s3_answers.etag_of({"ETag": '"abc"'}, "PUT k") == '"abc"'
    assert s3_answers.objects_of({"Contents": [OBJECT]}, "list") == [
        s3_answers.Listed(OBJECT["Key"], 12, WHEN.timestamp())
    ]
    assert s3_answers.uploads_of({"Uploads": [UPLOAD]}, "uploads") == [
        s3_answers.Upload(UPLOAD["Key"], "u-1", WHEN.timestamp())
    ]
    assert s3_answers.parts_size_of({"Parts": [{"Size": 5}, {"Size": 7}]}, "parts") == 12
    assert s3_answers.objects_of({}, "list") == [] and s3_answers.uploads_of({"Uploads": None}, "uploads") == []
    body = io.BytesIO(b"x")
    assert s3_answers.body_of({"Body": body}, "GET k") is body


@pytest.mark.parametrize(
    "read, answer, field",
    [
        (lambda a: s3_answers.size_of(a, "HEAD k"), {"ETag": '"e"'}, "ContentLength missing"),
        (lambda a: s3_answers.size_of(a, "HEAD k"), {"ContentLength": "12"}, "ContentLength is not a size"),
        (lambda a: s3_answers.size_of(a, "HEAD k"), {"ContentLength": -1}, "ContentLength is not a size"),
        (lambda a: s3_answers.size_of(a, "HEAD k"), {"ContentLength": True}, "ContentLength is not a size"),
        (lambda a: s3_answers.size_of(a, "HEAD k"), None, "ContentLength missing"),
        (lambda a: s3_answers.etag_of(a, "HEAD k"), {"ContentLength": 1}, "ETag missing"),
        (lambda a: s3_answers.etag_of(a, "HEAD k"), {"ETag": ""}, "ETag is not a non-empty string"),
        (lambda a: s3_answers.etag_of(a, "HEAD k"), {"ETag": 7}, "ETag is not a non-empty string"),
        (lambda a: s3_answers.text_of(a, "UploadId", "create"), {}, "UploadId missing"),
        (lambda a: s3_answers.objects_of(a, "list"), {"Contents": "x"}, "Contents is not a list"),
        (lambda a: s3_answers.objects_of(a, "list"), {"Contents": ["x"]}, "Contents is not a list"),
        (lambda a: s3_answers.objects_of(a, "list"), {"Contents": [{**OBJECT, "Size": None}]}, "Size missing"),
        (lambda a: s3_answers.objects_of(a, "list"), {"Contents": [{**OBJECT, "Key": 3}]}, "Key is not"),
        (lambda a: s3_answers.objects_of(a, "list"), {"Contents": [{**OBJECT, "LastModified": "x"}]}, "not a time"),
        (lambda a: s3_answers.objects_of(a, "list"), [], "Contents missing"),
        (lambda a: s3_answers.uploads_of(a, "uploads"), {"Uploads": [{**UPLOAD, "UploadId": None}]}, "UploadId"),
        (lambda a: s3_answers.uploads_of(a, "uploads"), {"Uploads": [{**UPLOAD, "Initiated": 1}]}, "not a time"),
        (lambda a: s3_answers.parts_size_of(a, "parts"), {"Parts": [{"Size": "5"}]}, "Size is not a size"),
        (lambda a: s3_answers.body_of(a, "GET k"), {}, "Body missing"),
        (lambda a: s3_answers.body_of(a, "GET k"), {"Body": b"bytes"}, "Body is not a stream"),
    ],
)
def test_a_missing_or_ill_typed_field_is_a_store_error_naming_it(read, answer, field):
    with pytest.raises(StoreUnavailableError, match="malformed answer") as raised:
        read(answer)
    assert field in raised.value.message and raised.value.status == 503


@pytest.mark.parametrize(
    "response, status, error",
    [
        (
            {"ResponseMetadata": {"HTTPStatusCode": 404}, "Error": {"Code": "NoSuchKey", "Message": "gone"}},
            404,
            ("NoSuchKey", "gone"),
        ),
        ({}, 0, ("error", "")),
        ({"ResponseMetadata": {"HTTPStatusCode": "404"}, "Error": "x"}, 0, ("error", "")),
        ({"ResponseMetadata": None, "Error": {"Code": None}}, 0, ("error", "")),
        (None, 0, ("error", "")),
    ],
)
def test_error_answers_are_read_whatever_they_hold(response, status, error):
    assert s3_answers.status_of(response) == status
    assert s3_answers.error_of(response) == error
