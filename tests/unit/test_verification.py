"""Unit tests for proxy.providers.verification: the verification chain of a provider package, with real gpg
signatures."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import zipfile
from collections.abc import Iterator

import pytest
from aiohttp import web
from structlog.testing import capture_logs
from yarl import URL

from proxy.domain.addresses import Platform, ProviderAddr, Version
from proxy.domain.hashes import Hash, h1_of_zip
from proxy.domain.unsigned_policy import parse_unsigned_policy
from proxy.errors import VerificationError
from proxy.metadata_store.records import ArchiveRecord
from proxy.protocol.provider_registry import DownloadInfo, parse_download
from proxy.providers.signatures import Keyring
from proxy.providers.verification import PackageHashes, SignedSums, VerificationChain
from proxy.runtime.metrics import Metrics
from proxy.web.app_keys import METRICS
from proxy.web.middlewares import request_context

ADDR = ProviderAddr.parse("registry.example.test", "acme", "x")
VERSION = Version.parse("1.0.0")
PLATFORM = Platform.parse("linux_amd64")
FILENAME = "terraform-provider-x_1.0.0_linux_amd64.zip"
OTHER_FILE = "terraform-provider-x_1.0.0_darwin_arm64.zip"
SOURCE = "https://releases.example/terraform-provider-x_1.0.0_SHA256SUMS"


@contextlib.contextmanager
def refused(code: str) -> Iterator[pytest.ExceptionInfo[VerificationError]]:
    """The block raises a VerificationError with `code` (what a client reads in the answer's `code`)."""
    with pytest.raises(VerificationError) as info:
        yield info
    assert info.value.code == code, info.value.message


def zip_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


ARCHIVE = zip_of({"terraform-provider-x_v1.0.0": b"#!/bin/sh\n"})
DIGEST = hashlib.sha256(ARCHIVE).hexdigest()
OTHER = hashlib.sha256(b"something else").hexdigest()
SUMS = f"{DIGEST}  {FILENAME}\n{OTHER}  {OTHER_FILE}\n".encode()


def package(keys: list[str], *, shasum: str = DIGEST, scheme: str = "https") -> DownloadInfo:
    """The registry's download answer for the linux_amd64 package."""
    document = {
        "os": "linux",
        "arch": "amd64",
        "filename": FILENAME,
        "shasum": shasum,
        "download_url": f"{scheme}://releases.example/{FILENAME}",
        "shasums_url": SOURCE.replace("https", scheme),
        "shasums_signature_url": SOURCE.replace("https", scheme) + ".sig",
        "signing_keys": {"gpg_public_keys": [{"ascii_armor": key} for key in keys]},
    }
    url = URL(f"{scheme}://registry.example.test/v1/providers/acme/x/1.0.0/download/linux/amd64")
    return parse_download(json.dumps(document).encode(), url, ADDR, VERSION, PLATFORM)


@pytest.fixture
def keyring(tmp_path):
    ring = Keyring(tmp_path / "keyring")
    yield ring
    ring.close()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def chain(keyring, metrics) -> VerificationChain:
    return VerificationChain(keyring, parse_unsigned_policy("opentofu-default"), metrics)


def refusals(metrics: Metrics, check: str) -> float:
    return metrics.verification_failures.labels(check)._value.get()


# ---- 1. admission ---------------------------------------------------------------------------


def test_a_registry_with_keys_is_admitted_one_without_only_where_the_policy_says(keyring, signing_key, metrics):
    refuse = VerificationChain(keyring, parse_unsigned_policy("refuse"), metrics)
    refuse.admit(ADDR, VERSION, package([signing_key.armored_public_key]))
    with refused("unsigned_refused"):  # no keys, and the host is not admitted
        refuse.admit(ADDR, VERSION, package([]))
    assert refusals(metrics, "unsigned") == 1
    admit = VerificationChain(keyring, parse_unsigned_policy("allow-hosts=registry.example.test"), metrics)
    admit.admit(ADDR, VERSION, package([]))
    with refused("unsigned_refused"):  # admitted host, but not over TLS
        admit.admit(ADDR, VERSION, package([], scheme="http"))


def test_a_stored_unsigned_archive_needs_its_host_still_admitted(keyring, metrics):
    record = ArchiveRecord(DIGEST, len(ARCHIVE), FILENAME, "h1:x", "h1:y", unsigned=True)
    VerificationChain(keyring, parse_unsigned_policy("allow-hosts=registry.example.test")).admit_stored(
        ADDR, VERSION, PLATFORM, record
    )
    with refused("unsigned_refused"):
        VerificationChain(keyring, parse_unsigned_policy("refuse"), metrics).admit_stored(
            ADDR, VERSION, PLATFORM, record
        )
    assert refusals(metrics, "unsigned") == 1


# ---- 2. the signature -----------------------------------------------------------------------


def test_signed_sums_verify_with_the_registry_key_and_name_it(chain, signing_key):
    sums = chain.verify_sums(ADDR, VERSION, package([signing_key.armored_public_key]), SUMS, signing_key.sign(SUMS))
    assert sums.fingerprint == signing_key.fingerprint and not sums.unsigned
    assert sums.lines == {FILENAME: Hash.zh(DIGEST), OTHER_FILE: Hash.zh(OTHER)}
    assert sums.hashes == {Hash.zh(DIGEST), Hash.zh(OTHER)}


def test_a_signature_by_another_key_or_over_other_bytes_is_refused(chain, signing_key, other_key, metrics):
    d = package([signing_key.armored_public_key])
    with refused("signature_invalid"):
        chain.verify_sums(ADDR, VERSION, d, SUMS, other_key.sign(SUMS))
    with refused("signature_invalid"):
        chain.verify_sums(ADDR, VERSION, d, SUMS + b"\n", signing_key.sign(SUMS))
    assert refusals(metrics, "signature") == 2


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
def test_malformed_signed_sums_are_refused_naming_their_source(chain, signing_key, document):
    with pytest.raises(VerificationError) as info:
        chain.verify_sums(
            ADDR, VERSION, package([signing_key.armored_public_key]), document, signing_key.sign(document)
        )
    assert SOURCE in info.value.message and "malformed" in info.value.message
    assert (info.value.code, info.value.status) == ("verification_failed", 502)


def test_unsigned_sums_are_only_parsed_once_admitted(keyring):
    chain = VerificationChain(keyring, parse_unsigned_policy("allow-hosts=registry.example.test"))
    sums = chain.verify_sums(ADDR, VERSION, package([]), SUMS, b"not even a signature")
    assert sums.unsigned and sums.fingerprint == "" and sums.lines[FILENAME] == Hash.zh(DIGEST)
    record = chain.sums_record(sums, SUMS, b"sig")
    assert record.unsigned and chain.recorded_sums(package([]), record) == sums


async def test_a_verification_failure_is_answered_502_and_logged_as_a_failure(aiohttp_client, chain, signing_key):
    async def handler(request: web.Request) -> web.Response:
        chain.verify_sums(ADDR, VERSION, package([signing_key.armored_public_key]), b"not a sums file\n", b"")
        return web.Response()

    app = web.Application(middlewares=[request_context])
    app[METRICS] = Metrics()
    app.router.add_get("/sums", handler)
    client = await aiohttp_client(app)
    with capture_logs() as logs:
        response = await client.get("/sums")
        body = await response.json()
    assert response.status == 502 and response.content_type == "application/json"
    assert body["code"] == "signature_invalid" and len(body["errors"]) == 1
    assert [(e["log_level"], e["code"]) for e in logs if e["event"] == "request.failed"] == [
        ("warning", "signature_invalid")
    ]


# ---- 3. the file's line ---------------------------------------------------------------------


def signed(lines: dict[str, str]) -> SignedSums:
    return SignedSums({name: Hash.zh(digest) for name, digest in lines.items()}, "KEY", "FINGERPRINT")


def test_the_line_must_exist_and_agree_with_the_registry_shasum(chain, signing_key, metrics):
    keys = [signing_key.armored_public_key]
    sums = signed({FILENAME: DIGEST, OTHER_FILE: OTHER})
    assert chain.expected(ADDR, VERSION, package(keys), sums) == Hash.zh(DIGEST)
    assert chain.expected(ADDR, VERSION, package(keys, shasum=DIGEST.upper()), sums) == Hash.zh(DIGEST)
    with refused("verification_failed"):  # no line for the file
        chain.expected(ADDR, VERSION, package(keys), signed({OTHER_FILE: OTHER}))
    with refused("checksum_mismatch") as info:  # the line and the registry's shasum disagree
        chain.expected(ADDR, VERSION, package(keys, shasum=OTHER), sums)
    assert FILENAME in info.value.message and DIGEST in info.value.message and OTHER in info.value.message
    with refused("verification_failed"):  # the file name must match exactly
        chain.expected(ADDR, VERSION, package(keys), signed({FILENAME.upper(): DIGEST, "./" + FILENAME: DIGEST}))
    assert refusals(metrics, "shasums_line") == 3


# ---- 4. the archive -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "actual",
    [OTHER, hashlib.sha256(ARCHIVE + b"\x00").hexdigest(), "", DIGEST[:-1]],
    ids=[
        "other-file",
        "archive-plus-a-byte",
        "empty",
        "digest-cut-short",
    ],  # the zip has a time stamp: ids stay stable across xdist workers
)
def test_an_archive_of_another_digest_is_refused(chain, signing_key, metrics, actual):
    d = package([signing_key.armored_public_key])
    chain.check_archive(ADDR, VERSION, d, DIGEST, Hash.zh(DIGEST))
    with refused("checksum_mismatch") as info:
        chain.check_archive(ADDR, VERSION, d, actual, Hash.zh(DIGEST))
    assert FILENAME in info.value.message and DIGEST in info.value.message and "tampered" in info.value.message
    assert refusals(metrics, "archive") == 1


def test_bytes_sent_already_must_be_the_upstream_first_bytes(chain, signing_key):
    d = package([signing_key.armored_public_key])
    head = hashlib.sha256(ARCHIVE[:10]).hexdigest()
    chain.check_sent(ADDR, VERSION, d, 10, head, head)
    with refused("checksum_mismatch"):
        chain.check_sent(ADDR, VERSION, d, 10, hashlib.sha256(b"x" * 10).hexdigest(), head)


# ---- 5. the hashes, and a stored archive ----------------------------------------------------


def test_the_hashes_of_a_verified_archive_become_its_record(chain, signing_key, metrics, tmp_path):
    path, d = tmp_path / FILENAME, package([signing_key.armored_public_key])
    path.write_bytes(ARCHIVE)
    hashes = chain.archive_hashes(ADDR, VERSION, d, path, Hash.zh(DIGEST))
    assert (hashes.h1_zip, hashes.h1_dir) == h1_of_zip(io.BytesIO(ARCHIVE))
    record = hashes.record(len(ARCHIVE), FILENAME, unsigned=False)
    assert record == ArchiveRecord(DIGEST, len(ARCHIVE), FILENAME, str(hashes.h1_zip), str(hashes.h1_dir))
    assert PackageHashes.of_record(record) == hashes
    path.write_bytes(b"not a zip")
    with refused("verification_failed"):  # not a zip
        chain.archive_hashes(ADDR, VERSION, d, path, Hash.zh(DIGEST))
    assert refusals(metrics, "archive") == 1


def test_a_record_agrees_only_with_the_line_of_its_download(chain, signing_key, tmp_path):
    path = tmp_path / FILENAME
    path.write_bytes(ARCHIVE)
    d = package([signing_key.armored_public_key])
    record = chain.archive_hashes(ADDR, VERSION, d, path, Hash.zh(DIGEST)).record(
        len(ARCHIVE), FILENAME, unsigned=False
    )
    assert chain.agrees(record, d, signed({FILENAME: DIGEST}))
    assert not chain.agrees(record, d, signed({FILENAME: OTHER}))  # another line
    assert not chain.agrees(record, package([signing_key.armored_public_key], shasum=OTHER), signed({FILENAME: DIGEST}))
    assert not chain.agrees(ArchiveRecord(OTHER, 1, FILENAME, "h1:x", "h1:y"), d, signed({FILENAME: DIGEST}))
    unsigned = ArchiveRecord(DIGEST, len(ARCHIVE), FILENAME, record.h1_zip, record.h1_dir, unsigned=True)
    assert not chain.agrees(unsigned, d, signed({FILENAME: DIGEST}))  # the download lists keys
    assert PackageHashes.of_record(ArchiveRecord(DIGEST, 1, FILENAME, "h1:not base64", "h1:y")) is None
