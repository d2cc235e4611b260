"""`registry-proxy backup` and `restore` with Redis, in the test's process on the session's real redis-server: the
records Redis keeps that no upstream gives back (a first-seen record, a baseline, a provider's signing keys, written
by the code that writes them) are backed up sealed as they are, and after the fleet's Redis lost everything they
are back byte for byte, without a TTL, read again by the proxy's own readers; a record Redis holds is kept unless
--force. A modified kept.jsonl, and a backup sealed with another secret, are refused before Redis is written to.
With the embedded store the same records are rows of the store's copy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sqlite3
import uuid
from pathlib import Path

import pytest
import redis

from proxy.cli import prepare_metadata_store
from proxy.domain.addresses import ProviderAddr, Version
from proxy.governance.release_times import FirstSeen
from proxy.governance.signing_keys import SigningKeys
from proxy.metadata_store import keys
from proxy.metadata_store.factory import open_metadata_store
from proxy.services.shared_fetches import SharedFetches
from proxy.settings.config import Settings
from proxy.storage.staging import Staging
from tests.fakes.process import cli_in_process
from tests.fakes.redis_server import METADATA_SECRET

PROVIDER = ProviderAddr.parse("registry.example.test", "acme", "foo")
VERSIONS = [Version.parse("1.0.0"), Version.parse("1.1.0")]
FINGERPRINT = "0123456789ABCDEF0123456789ABCDEF01234567"
KEPT = [keys.first_seen(PROVIDER), keys.baseline(PROVIDER), keys.signing_keys(PROVIDER)]


class Fleet:
    """The session's Redis under a prefix of this module's, with the options `serve` would be given."""

    def __init__(self, url: str, data_dir: Path) -> None:
        self.prefix = f"test-{uuid.uuid4().hex[:12]}"
        self.settings = {"redis_url": url, "redis_prefix": self.prefix, "metadata_secret": METADATA_SECRET}
        self.options = ("--redis-url", url, "--redis-prefix", self.prefix, "--metadata-secret", METADATA_SECRET)
        self.data_dir = data_dir
        self.client = redis.Redis.from_url(url)
        self.backed_up: dict[str, bytes | None] = {}

    def name(self, key: str) -> str:
        return f"{self.prefix}:{key}"

    def stored(self) -> dict[str, bytes | None]:
        return {key: self.client.get(self.name(key)) for key in KEPT}

    def lose_everything(self) -> None:
        """What FLUSHDB does to the fleet's keys (the session's server is shared: only this prefix's)."""
        names = list(self.client.scan_iter(match=f"{self.prefix}:*"))
        if names:
            self.client.delete(*names)

    def restore(self, backup: Path, *extra: str, secret: str = METADATA_SECRET) -> tuple[int, str]:
        """`restore` with the fleet's options but for the secret (by default, the fleet's)."""
        options = (*self.options[:4], "--metadata-secret", secret)
        return cli_in_process("restore", str(backup), "--data-dir", str(self.data_dir / "restored"), *options, *extra)


async def write_kept_records(settings: Settings) -> None:
    """A first-seen record, a baseline and a provider's signing keys, as the proxy and `policy baseline` write them;
    and a cached document, which is Redis's cache and not backed up."""
    store, locks = await open_metadata_store(settings)
    try:
        await store.require_fleet()
        first_seen = FirstSeen(store, SharedFetches(locks), lambda: 1_700_000_000.0)
        await first_seen.times(PROVIDER, VERSIONS)
        await first_seen.record_baseline(PROVIDER, VERSIONS[:1], "cli:operator")
        await SigningKeys(store, locks, clock=lambda: 1_700_000_000.0).check(
            PROVIDER, VERSIONS[1], FINGERPRINT[-16:], FINGERPRINT
        )
        await store.set(keys.versions(PROVIDER), b'{"v": 1}')
    finally:
        await store.close()


async def read_back(settings: Settings) -> tuple[frozenset[Version], frozenset[Version], list[str]]:
    """The versions with an age and those baselined, and the known signing keys, as the policy and the key checks
    read them."""
    store, locks = await open_metadata_store(settings)
    try:
        releases = await FirstSeen(store, SharedFetches(locks), lambda: 1_700_000_000.0).releases(PROVIDER)
        signing = (await SigningKeys(store, locks).read(PROVIDER)).record
    finally:
        await store.close()
    return releases.record.listed(), frozenset(releases.baseline.versions), list(signing.known) if signing else []


@pytest.fixture(scope="module")
def fleet(redis_server, tmp_path_factory) -> Fleet:
    fleet = Fleet(redis_server.url, tmp_path_factory.mktemp("kept"))
    asyncio.run(write_kept_records(Settings(data_dir=fleet.data_dir / "data", **fleet.settings)))
    yield fleet
    fleet.lose_everything()
    fleet.client.close()


@pytest.fixture(scope="module")
def backup_dir(fleet) -> Path:
    target = fleet.data_dir / "backup"
    code, output = cli_in_process("backup", str(target), "--data-dir", str(fleet.data_dir / "data"), *fleet.options)
    assert code == 0, output
    assert "the 3 records Redis keeps that no upstream gives back (1 first-seen, 1 baseline, 1 signing-keys)" in output
    assert "records: 3 open with the metadata secret, 0 do not; the fleet's marker opens" in output, output
    assert "not backed up: the rest of the metadata store: Redis at redis://" in output, output
    fleet.backed_up = fleet.stored()  # what the tests after it compare with (they lose it)
    return target


@pytest.fixture
def backup(backup_dir, tmp_path) -> Path:
    """A copy of the backup, for a test to spoil."""
    return shutil.copytree(backup_dir, tmp_path / "backup")


def test_the_kept_records_come_back_byte_for_byte_after_redis_lost_them(fleet, backup_dir):
    before = fleet.backed_up
    assert all(before.values()), before
    manifest = json.loads((backup_dir / "manifest.json").read_text())
    assert manifest["store"] == "redis"
    assert [entry["path"] for entry in manifest["files"]] == ["metadata/kept.jsonl"]
    lines = [json.loads(line) for line in (backup_dir / "metadata" / "kept.jsonl").read_text().splitlines()]
    assert [line["key"] for line in lines] == ["fleet-secret", *sorted(KEPT)]  # the cached document is not there

    fleet.lose_everything()
    staging = Staging(fleet.data_dir / "restored" / "archives")  # a replica serving on the data dir: all goes to Redis
    staging.open()
    try:
        code, output = fleet.restore(backup_dir)
    finally:
        staging.close()
    assert code == 0, output
    assert f"restored 3 records Redis keeps into {fleet.settings['redis_url']} (prefix {fleet.prefix})\n" in output
    assert "records: 3 open with the metadata secret, 0 do not; the fleet's marker opens" in output, output
    assert fleet.stored() == before
    assert [fleet.client.ttl(fleet.name(key)) for key in KEPT] == [-1, -1, -1]  # never to expire, as written
    settings = Settings(data_dir=fleet.data_dir / "restored", **fleet.settings)
    assert asyncio.run(read_back(settings)) == (frozenset(VERSIONS), frozenset(VERSIONS[:1]), [FINGERPRINT])

    newer = b"a record a replica wrote since"
    fleet.client.set(fleet.name(keys.baseline(PROVIDER)), newer)
    code, output = fleet.restore(backup_dir)
    assert code == 0, output
    assert fleet.stored()[keys.baseline(PROVIDER)] == newer
    assert "restored 0 records Redis keeps into " in output, output
    assert "; 3 it held already were kept (--force replaces them)\n" in output, output
    assert "records: 2 open with the metadata secret, 1 do not (baseline:registry.example.test/acme/foo)" in output
    code, output = fleet.restore(backup_dir, "--force")
    assert code == 0 and "restored 3 records Redis keeps" in output, output
    assert fleet.stored() == before


def test_a_modified_kept_file_is_refused_before_redis_is_written(fleet, backup):
    kept = backup / "metadata" / "kept.jsonl"
    kept.write_bytes(kept.read_bytes().replace(b'"key": "baseline:', b'"key": "first-seen:', 1))
    fleet.lose_everything()
    code, output = fleet.restore(backup)
    assert code == 1, output
    assert output == (
        f"registry-proxy: error: backup {backup}: metadata/kept.jsonl was modified (its size or SHA-256 is not the "
        "manifest's): nothing restored\n"
    )
    assert list(fleet.client.scan_iter(match=f"{fleet.prefix}:*")) == []


def test_a_backup_sealed_with_another_secret_is_refused_before_redis_is_written(fleet, backup):
    fleet.lose_everything()
    code, output = fleet.restore(backup, secret="another-fleets-secret-0123456789")
    assert code == 2, output
    assert output == (
        f"registry-proxy: error: --metadata-secret differs from the one that sealed {backup}/metadata/kept.jsonl "
        "(the fleet's marker in it does not open): nothing restored\n"
    )
    assert list(fleet.client.scan_iter(match=f"{fleet.prefix}:*")) == []  # not even a marker
    code, output = cli_in_process("restore", str(backup), "--data-dir", str(fleet.data_dir / "embedded"))
    assert code == 2 and "restore it with the fleet's --redis-url and --metadata-secret" in output, output


def test_with_the_embedded_store_they_are_rows_of_its_copy(tmp_path):
    settings = Settings(data_dir=tmp_path / "data")

    async def fill() -> None:
        await prepare_metadata_store(settings)
        await write_kept_records(settings)

    asyncio.run(fill())
    code, output = cli_in_process("backup", str(tmp_path / "backup"), "--data-dir", str(settings.data_dir))
    assert code == 0 and "records: 4 open with the metadata secret, 0 do not" in output, output
    with contextlib.closing(sqlite3.connect(tmp_path / "backup" / "metadata" / "metadata.sqlite")) as db:
        copied = {key for (key,) in db.execute("SELECT key FROM metadata")}
    assert set(KEPT) <= copied and not (tmp_path / "backup" / "metadata" / "kept.jsonl").exists()
