"""The record types and their versioned format: today's records, yesterday's and tomorrow's."""

from __future__ import annotations

import json

import pytest
from structlog.testing import capture_logs

from proxy.metadata_store import decode_record, encode_record, records
from proxy.metadata_store.embedded import EmbeddedStore
from proxy.metadata_store.records import RECORD_VERSION, ArchiveRecord, ModuleRecord, SumsRecord
from proxy.services.documents import DocumentCache
from proxy.services.shared_fetches import SharedFetches
from proxy.settings.config import Settings

ARCHIVE = ArchiveRecord("ab" * 32, 123, "foo_1.0.0_linux_amd64.zip", "h1:zip", "h1:dir")
MODULE = ModuleRecord("cd" * 32, 456, "tar.gz", "git::https://git.example.test/net?ref=v1", "f" * 40)
SUMS = SumsRecord(b"sums\n", b"\x00signature", "KEYID", "FINGERPRINT")
EVERY = [ARCHIVE, MODULE, SUMS]


@pytest.mark.parametrize("record", EVERY, ids=lambda r: type(r).__name__)
def test_a_record_round_trips_through_the_store_format(record) -> None:
    raw = records.encode(record)
    assert records.decode(raw, type(record)) == record
    assert decode_record(raw)["v"] == RECORD_VERSION


@pytest.mark.parametrize("record", EVERY, ids=lambda r: type(r).__name__)
def test_a_record_without_a_version_is_read_as_version_1(record) -> None:
    data = record.to_dict()
    del data["v"]
    assert type(record).from_dict(data) == record
    assert records.decode(encode_record(data), type(record)) == record


def test_a_record_written_before_the_version_field_still_reads() -> None:
    stored = json.dumps(
        {
            "v": 1,
            "kind": "record",
            "data": {
                "sha256": "ab" * 32,
                "size": 123,
                "filename": "foo_1.0.0_linux_amd64.zip",
                "h1_zip": "h1:zip",
                "h1_dir": "h1:dir",
            },
        },
        sort_keys=True,
    ).encode()
    assert records.decode(stored, ArchiveRecord) == ARCHIVE


@pytest.mark.parametrize("record", EVERY, ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("version", [RECORD_VERSION + 1, 99, "2", None, 0])
def test_a_record_of_another_version_is_a_miss_not_a_crash(record, version) -> None:
    data = {**record.to_dict(), "v": version}
    assert type(record).from_dict(data) is None
    assert records.decode(encode_record(data), type(record)) is None


def test_only_higher_integer_versions_count_as_newer() -> None:
    assert records.is_newer({"v": RECORD_VERSION + 1})
    assert not records.is_newer({"v": RECORD_VERSION})
    assert not records.is_newer({})
    assert not records.is_newer({"v": "2"})
    assert not records.is_newer(None)


@pytest.mark.parametrize("raw", [None, b"", b"not json", b"[]", encode_record({}), encode_record({"sha256": 1})])
def test_missing_or_damaged_records_decode_as_none(raw) -> None:
    for kind in (ArchiveRecord, ModuleRecord, SumsRecord):
        assert records.decode(raw, kind) is None


def test_a_module_record_of_an_unknown_archive_kind_is_refused() -> None:
    assert ModuleRecord.from_dict({**MODULE.to_dict(), "archive": "rar"}) is None
    assert MODULE.extension == ".tar.gz"


def test_a_sums_record_keeps_the_bytes_as_fetched() -> None:
    data = SUMS.to_dict()
    assert (data["sums"], data["signature"]) == (b"sums\n".hex(), b"\x00signature".hex())
    assert SumsRecord.from_dict({**data, "sums": "not hex"}) is None


async def test_the_document_cache_logs_a_newer_record_and_reads_it_as_a_miss(tmp_path) -> None:
    store = EmbeddedStore(tmp_path / "metadata.sqlite")
    key = "archive:registry.example.test/acme/foo/1.0.0/linux_amd64"
    documents = DocumentCache(Settings(data_dir=tmp_path), None, store, None, SharedFetches())
    try:
        await store.set(key, encode_record({**ARCHIVE.to_dict(), "v": RECORD_VERSION + 1}))
        with capture_logs() as logs:
            assert await documents.record(key, ArchiveRecord) is None
        assert [e["version"] for e in logs if e["event"] == "cache.record_unreadable"] == [RECORD_VERSION + 1]
        await documents.put_record(key, ARCHIVE)
        assert await documents.record(key, ArchiveRecord) == ARCHIVE
        assert await documents.records([key, key + "x"], ArchiveRecord) == [ARCHIVE, None]
    finally:
        await store.close()


def test_unsigned_is_written_only_when_set_and_a_record_without_it_is_signed() -> None:
    assert "unsigned" not in ARCHIVE.to_dict() and "unsigned" not in SUMS.to_dict()
    assert not ArchiveRecord.from_dict(ARCHIVE.to_dict()).unsigned
    for record in (
        ArchiveRecord("ab" * 32, 1, "f.zip", "h1:z", "h1:d", unsigned=True),
        SumsRecord(b"sums\n", b"sig", "", "", unsigned=True),
    ):
        data = decode_record(records.encode(record))
        assert data["unsigned"] is True and data["v"] == RECORD_VERSION
        assert records.decode(records.encode(record), type(record)) == record
        assert type(record).from_dict({**data, "unsigned": "false"}) is None  # not a bool: unreadable, a miss
