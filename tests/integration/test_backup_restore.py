"""`registry-proxy backup` and `restore` in the test's process, on a data dir as a proxy leaves it: a round trip keeps
the files and their modes and counts the records that do not open; a spoilt or incomplete backup, one without the
secret that sealed it, and a data dir in use or already filled are refused, with nothing written.

(A backup of a running proxy under load, restored and serving `terraform init` with the upstream down, is
tests/e2e/test_backup_restore_e2e.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.cli import prepare_metadata_store
from proxy.metadata_store.factory import open_metadata
from proxy.settings.config import Settings
from proxy.storage.staging import Staging
from proxy.web.local_ca import ensure_local_tls
from tests.fakes.process import cli_in_process

RECORDS = 5
FORGED = "versions:registry.example.test/acme/forged"
GIVEN_SECRET = "a-secret-the-operator-keeps-0123456789"


def filled_data_dir(root: Path, **settings: str) -> Path:
    """A data dir as a proxy leaves it: RECORDS sealed records and the fleet's marker, the generated CA, and one
    record forged behind the proxy's back (no seal opens it)."""

    async def fill() -> None:
        configured = Settings(data_dir=root, **settings)
        await prepare_metadata_store(configured)
        store, _, _ = await open_metadata(configured)
        for number in range(RECORDS):
            await store.set(f"versions:registry.example.test/acme/p{number}", b'{"v": 1}')
        await store.close()

    asyncio.run(fill())
    ensure_local_tls(root / "tls", ["localhost"])
    with contextlib.closing(sqlite3.connect(root / "metadata" / "metadata.sqlite")) as db:
        db.execute("INSERT INTO metadata (key, value) VALUES (?, ?)", (FORGED, b"rps1.forged"))
        db.commit()
    return root


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return filled_data_dir(tmp_path_factory.mktemp("backup") / "data")


@pytest.fixture(scope="module")
def backup_dir(data_dir) -> Path:
    target = data_dir.parent / "backup"
    code, output = cli_in_process("backup", str(target), "--data-dir", str(data_dir))
    assert code == 0, output
    assert f"records: {RECORDS} open with the metadata secret, 1 do not ({FORGED})" in output, output
    return target


@pytest.fixture
def backup(backup_dir, tmp_path) -> Path:
    """A copy of the backup, for a test to spoil."""
    return shutil.copytree(backup_dir, tmp_path / "backup")


def restore(backup: Path, data_dir: Path, *extra: str) -> tuple[int, str]:
    return cli_in_process("restore", str(backup), "--data-dir", str(data_dir), *extra)


def test_a_round_trip_keeps_the_files_and_their_modes_and_counts_what_does_not_open(data_dir, backup_dir, tmp_path):
    target = tmp_path / "restored"
    code, output = restore(backup_dir, target)
    assert code == 0, output
    assert f"records: {RECORDS} open with the metadata secret, 1 do not ({FORGED}); the fleet's marker opens" in output
    assert "1 records do not open with the metadata secret" in output, output
    for name in ("metadata/metadata.secret", "tls/ca.pem", "tls/ca-key.pem", "tls/server.pem", "tls/server-key.pem"):
        assert (target / name).read_bytes() == (data_dir / name).read_bytes(), name
        assert (target / name).stat().st_mode == (data_dir / name).stat().st_mode, name
    assert (target / "tls" / "ca-key.pem").stat().st_mode & 0o777 == 0o600
    assert [path.name for path in target.rglob("*") if ".restore-" in path.name] == []


def _modify_key(backup: Path) -> None:
    key = backup / "tls" / "ca-key.pem"
    key.write_bytes(key.read_bytes().replace(b"-----BEGIN", b"-----begin", 1))


def _name_a_path_outside(backup: Path) -> None:
    manifest = json.loads((backup / "manifest.json").read_text())
    manifest["files"][0]["path"] = "../../etc/cron.d/job"
    (backup / "manifest.json").write_text(json.dumps(manifest))


SPOILS: dict[str, tuple[Callable[[Path], None], str]] = {
    "a modified key": (_modify_key, "tls/ca-key.pem was modified (its size or SHA-256 is not the manifest's)"),
    "the secret missing": (
        lambda backup: (backup / "metadata" / "metadata.secret").unlink(),
        "metadata/metadata.secret is missing (the manifest lists it)",
    ),
    "a path outside": (_name_a_path_outside, "names '../../etc/cron.d/job', which no backup holds"),
    "no manifest (unfinished)": (
        lambda backup: (backup / "manifest.json").unlink(),
        "no manifest.json: not a backup, or one that did not finish",
    ),
}


@pytest.mark.parametrize("spoil", SPOILS)
def test_a_spoilt_backup_is_refused_before_anything_is_written(backup, tmp_path, spoil):
    change, said = SPOILS[spoil]
    change(backup)
    code, output = restore(backup, tmp_path / "restored")
    assert code == 1, output
    assert output.startswith(f"registry-proxy: error: backup {backup}: ") and said in output, output
    assert output.count("\n") == 1, output
    assert not (tmp_path / "restored").exists() or list((tmp_path / "restored").rglob("*")) == []


def test_a_backup_without_the_secret_that_sealed_it_needs_that_secret(tmp_path):
    data_dir = filled_data_dir(tmp_path / "data", metadata_secret=GIVEN_SECRET)
    code, output = cli_in_process("backup", str(tmp_path / "unsealed"), "--data-dir", str(data_dir))
    assert code == 0, output
    assert "not backed up: the metadata secret: not in the data dir (the proxy is given --metadata-secret" in output
    assert "records:" not in output, output  # nothing to open them with
    given = ("--metadata-secret", GIVEN_SECRET)
    code, output = cli_in_process("backup", str(tmp_path / "backup"), "--data-dir", str(data_dir), *given)
    assert code == 0, output
    assert "--metadata-secret: given on the command line, not the data dir's" in output, output
    assert f"records: {RECORDS} open with the metadata secret, 1 do not" in output, output
    assert not (tmp_path / "backup" / "metadata" / "metadata.secret").exists()

    target = tmp_path / "restored"
    code, output = restore(tmp_path / "backup", target)
    assert code == 2, output
    assert "holds no metadata secret (the proxy was given one): restore with the same --metadata-secret" in output
    code, output = restore(tmp_path / "backup", target, "--metadata-secret", "another-secret-0123456789")
    assert code == 2 and "--metadata-secret differs from the one that sealed" in output, output
    assert not target.exists() or list(target.rglob("*")) == []
    code, output = restore(tmp_path / "backup", target, *given)
    assert code == 0, output
    assert f"records: {RECORDS} open with the metadata secret, 1 do not" in output, output


def test_a_filled_or_used_data_dir_and_a_used_backup_dir_are_refused(data_dir, backup_dir, backup, tmp_path):
    secret = (data_dir / "metadata" / "metadata.secret").read_bytes()
    code, output = restore(backup_dir, data_dir)
    assert code == 2, output
    assert f"--data-dir {data_dir} already holds metadata/metadata.sqlite, metadata/metadata.secret" in output
    assert "or --force to replace them" in output and (data_dir / "metadata" / "metadata.secret").read_bytes() == secret

    in_use = tmp_path / "in-use"
    staging = Staging(in_use / "archives")  # what a running proxy or store command holds
    staging.open()
    try:
        code, output = restore(backup_dir, in_use, "--force")
    finally:
        staging.close()
    assert code == 1 and f"--data-dir {in_use} is in use" in output, output
    assert not (in_use / "metadata").exists()

    code, output = cli_in_process("backup", str(data_dir), "--data-dir", str(data_dir))
    assert code == 2 and "not empty, and not a backup: name a new or empty directory" in output, output
    code, output = cli_in_process("backup", str(backup), "--data-dir", str(data_dir))
    assert code == 2 and "holds a backup already: name a new directory, or --force to replace it" in output, output
    (backup / "tls" / "stale-file").write_text("from an older backup")
    code, output = cli_in_process("backup", str(backup), "--data-dir", str(data_dir), "--force")
    assert code == 0, output
    assert not (backup / "tls" / "stale-file").exists()


def test_a_damaged_store_is_not_backed_up_and_nothing_is_left_behind(tmp_path):
    database = tmp_path / "data" / "metadata" / "metadata.sqlite"
    database.parent.mkdir(parents=True)
    database.write_bytes(b"not a database, whatever its name says" * 200)
    code, output = cli_in_process("backup", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "data"))
    assert code == 1, output
    assert output == f"registry-proxy: error: {database}: could not be backed up: file is not a database\n"
    assert list((tmp_path / "backup").iterdir()) == []


def test_with_redis_unanswering_nothing_is_backed_up(data_dir, tmp_path):
    redis = ("--redis-url", "redis://127.0.0.1:1/0", "--metadata-secret", GIVEN_SECRET)
    code, output = cli_in_process("backup", str(tmp_path / "backup"), "--data-dir", str(data_dir), *redis)
    assert code == 1, output
    error = output.splitlines()[-1]  # after the store's own log line, on stderr
    assert error.startswith(
        "registry-proxy: error: Redis at redis://127.0.0.1:1/0 (prefix registry-proxy) does not answer ("
    ) and error.endswith("): nothing done"), output
    assert list((tmp_path / "backup").iterdir()) == []
