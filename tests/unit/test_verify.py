"""Unit tests for proxy.verify: the SHA256SUMS / shasum / archive digest chain."""

from __future__ import annotations

import hashlib

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from proxy.errors import ChecksumMismatchError, VerificationError
from proxy.metrics import Metrics
from proxy.verify import check_archive_digest, expected_digest, parse_signed_sums
from proxy.web.keys import METRICS
from proxy.web.middlewares import request_context

ARCHIVE = b"PK\x03\x04 pretend this is a provider zip"
DIGEST = hashlib.sha256(ARCHIVE).hexdigest()
OTHER = hashlib.sha256(b"something else").hexdigest()
FILENAME = "terraform-provider-x_1.0.0_linux_amd64.zip"
OTHER_FILE = "terraform-provider-x_1.0.0_darwin_arm64.zip"
SUMS = {FILENAME: DIGEST, OTHER_FILE: OTHER}
SOURCE = "https://releases.example/terraform-provider-x_1.0.0_SHA256SUMS"


# ---------------------------------------------------------------------------------------------
# parse_signed_sums
# ---------------------------------------------------------------------------------------------


def test_parse_signed_sums_valid() -> None:
    document = f"{DIGEST}  {FILENAME}\n{OTHER}  {OTHER_FILE}\n".encode()
    assert parse_signed_sums(document, SOURCE) == SUMS


@pytest.mark.parametrize(
    "document",
    [
        b"",
        b"not a sums file\n",
        f"{DIGEST}  {FILENAME}\n\n{OTHER}  {OTHER_FILE}\n".encode(),
        b"\xff\xfe\xfd",
        f"{DIGEST}  {FILENAME}\n{OTHER}  {FILENAME}\n".encode(),
    ],
)
def test_parse_signed_sums_malformed_names_source(document: bytes) -> None:
    with pytest.raises(VerificationError) as info:
        parse_signed_sums(document, SOURCE)
    assert SOURCE in info.value.message
    assert "malformed" in info.value.message
    assert info.value.code == "verification_failed"
    assert info.value.status == 502


async def test_a_verification_failure_is_answered_502_and_logged_as_a_failure(aiohttp_client) -> None:
    async def handler(request: web.Request) -> web.Response:
        parse_signed_sums(b"not a sums file\n", SOURCE)
        return web.Response()

    app = web.Application(middlewares=[request_context])
    app[METRICS] = Metrics()
    app.router.add_get("/sums", handler)
    client = await aiohttp_client(app)
    with capture_logs() as logs:
        response = await client.get("/sums")
        body = await response.json()
    assert response.status == 502 and response.content_type == "application/json"
    assert SOURCE in body["errors"][0]
    assert [(e["log_level"], e["code"]) for e in logs if e["event"] == "request.failed"] == [
        ("warning", "verification_failed")
    ]


# ---------------------------------------------------------------------------------------------
# expected_digest
# ---------------------------------------------------------------------------------------------


def test_expected_digest_match() -> None:
    assert expected_digest(SUMS, FILENAME, DIGEST) == DIGEST
    assert expected_digest(SUMS, OTHER_FILE, OTHER) == OTHER


def test_expected_digest_registry_shasum_case_insensitive() -> None:
    assert expected_digest(SUMS, FILENAME, DIGEST.upper()) == DIGEST


def test_expected_digest_missing_line_names_file() -> None:
    with pytest.raises(VerificationError) as info:
        expected_digest(SUMS, "terraform-provider-x_1.0.0_windows_386.zip", DIGEST)
    assert "terraform-provider-x_1.0.0_windows_386.zip" in info.value.message
    assert "no line" in info.value.message


def test_expected_digest_empty_sums() -> None:
    with pytest.raises(VerificationError, match=FILENAME):
        expected_digest({}, FILENAME, DIGEST)


def test_expected_digest_mismatch_names_file_and_both_digests() -> None:
    with pytest.raises(ChecksumMismatchError) as info:
        expected_digest(SUMS, FILENAME, OTHER)
    message = info.value.message
    assert FILENAME in message
    assert DIGEST in message
    assert OTHER in message


def test_expected_digest_is_exact_filename_match() -> None:
    with pytest.raises(VerificationError):
        expected_digest(SUMS, FILENAME.upper(), DIGEST)
    with pytest.raises(VerificationError):
        expected_digest(SUMS, "./" + FILENAME, DIGEST)


# ---------------------------------------------------------------------------------------------
# check_archive_digest
# ---------------------------------------------------------------------------------------------


def test_check_archive_digest_match() -> None:
    assert check_archive_digest(hashlib.sha256(ARCHIVE).hexdigest(), DIGEST, FILENAME) is None


@pytest.mark.parametrize("actual", [OTHER, hashlib.sha256(ARCHIVE + b"\x00").hexdigest(), "", DIGEST[:-1]])
def test_check_archive_digest_mismatch(actual: str) -> None:
    with pytest.raises(ChecksumMismatchError) as info:
        check_archive_digest(actual, DIGEST, FILENAME)
    message = info.value.message
    assert info.value.code == "checksum_mismatch"
    assert FILENAME in message and DIGEST in message  # names the archive and the digest it should have


def test_full_chain_accepts_good_archive_and_refuses_tampered_one() -> None:
    sums = parse_signed_sums(f"{DIGEST}  {FILENAME}\n".encode(), SOURCE)
    want = expected_digest(sums, FILENAME, DIGEST)
    check_archive_digest(hashlib.sha256(ARCHIVE).hexdigest(), want, FILENAME)
    with pytest.raises(VerificationError):
        check_archive_digest(hashlib.sha256(ARCHIVE.replace(b"zip", b"zap")).hexdigest(), want, FILENAME)
