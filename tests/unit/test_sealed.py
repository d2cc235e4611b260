"""Unit tests for proxy.metadata_store.sealed: the HMAC seal, the SealedStore wrapper, and the secret."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from proxy.cli import build_parser, settings_from_args
from proxy.metadata_store import encode_record, sealed
from proxy.metadata_store.embedded import EmbeddedStore
from proxy.metadata_store.sealed import Seal, SealedStore, metadata_secret, seal, unseal
from proxy.settings.config import ConfigError, Settings

SECRET = b"unit-test-secret-0123456789abcdef"
KEY = "archive:registry.example.test/acme/foo/1.1.0/linux_amd64"
VALUE = encode_record({"sha256": "ab" * 32})


def test_seal_round_trip():
    assert unseal(SECRET, KEY, seal(SECRET, KEY, VALUE)) == (VALUE, "")


@pytest.mark.parametrize(
    "stored",
    [
        seal(SECRET, KEY.replace("1.1.0", "1.0.0"), VALUE),  # a valid record moved to another key
        seal(b"another-secret-of-another-fleet", KEY, VALUE),  # another secret
        seal(SECRET, KEY, VALUE).replace(b"ab", b"cd"),  # edited value
        seal(SECRET, KEY, VALUE)[:-1],  # cut short
    ],
)
def test_a_moved_edited_or_foreign_value_has_a_bad_seal(stored):
    value, why = unseal(SECRET, KEY, stored)
    assert value is None and why.startswith("bad seal")


@pytest.mark.parametrize("stored", [VALUE, b"", b"rps1.", b"rps1." + b"0" * 64, b"rps1." + b"0" * 64 + b"x{}"])
def test_an_unsealed_value_has_no_seal(stored):
    value, why = unseal(SECRET, KEY, stored)
    assert value is None and why.startswith("no seal")


def test_key_and_value_boundary_is_unambiguous():
    # "a" + "bc" and "ab" + "c" must not share a MAC.
    assert unseal(SECRET, "ab", seal(SECRET, "a", b"bc"))[0] is None


async def test_sealed_store_reports_a_poisoned_key_once_and_counts_every_refusal(tmp_path):
    inner = EmbeddedStore(tmp_path / "m.sqlite")
    refused: list[tuple[str, str]] = []
    store = SealedStore(inner, Seal(SECRET, store="embedded", on_reject=lambda s, r: refused.append((s, r))))
    await store.set(KEY, VALUE)
    assert await inner.get(KEY) != VALUE  # what is stored is sealed
    assert await store.get(KEY) == VALUE
    await inner.set(KEY, VALUE)  # an attacker writes an unsealed record
    with capture_logs() as logs:
        assert await store.get(KEY) is None
        assert await store.get_many([KEY, "missing"]) == [None, None]
    events = [e for e in logs if e["event"] == "security.metadata_poisoned"]
    assert [(e["key"], e["store"]) for e in events] == [(KEY, "embedded")]
    assert refused == [("embedded", "no_seal"), ("embedded", "no_seal")]
    await store.set(KEY, VALUE)  # recovered: a good value is served again, and a new poisoning is reported again
    assert await store.get(KEY) == VALUE
    await inner.set(KEY, seal(SECRET, "other", VALUE))
    with capture_logs() as logs:
        assert await store.get(KEY) is None
    assert [e["reason"][:8] for e in logs if e["event"] == "security.metadata_poisoned"] == ["bad seal"]
    await store.close()


def test_the_keys_reported_are_bounded_and_a_repeated_report_is_not_a_use(monkeypatch):
    monkeypatch.setattr(sealed, "_REPORTED_KEYS", 2)
    refused: list[str] = []
    store_seal = Seal(SECRET, store="embedded", on_reject=lambda _store, reason: refused.append(reason))
    with capture_logs() as logs:
        for key in ("a", "b", "a", "c", "a", "b"):  # "a" again is no use: "c" pushes "a" out, "a" pushes "b" out
            store_seal.refuse(key, "bad seal", "bad_seal")
    assert [e["key"] for e in logs if e["event"] == "security.metadata_poisoned"] == ["a", "b", "c", "a", "b"]
    assert len(refused) == 6  # every refusal counted


def test_embedded_secret_is_made_once_private_and_reused(tmp_path):
    settings = Settings(data_dir=tmp_path)
    first = metadata_secret(settings)
    path = tmp_path / "metadata" / "metadata.secret"
    assert len(first) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert metadata_secret(settings) == first
    assert sorted(p.name for p in path.parent.iterdir()) == ["metadata.secret"]  # no temp file left


def test_operator_secret_wins_and_files_are_stripped(tmp_path):
    assert (
        metadata_secret(Settings(data_dir=tmp_path, metadata_secret=" s3cret-s3cret-s3cret\n"))
        == b"s3cret-s3cret-s3cret"
    )
    secret_file = tmp_path / "secret"
    secret_file.write_text("s3cret-s3cret-s3cret\n")
    assert metadata_secret(Settings(data_dir=tmp_path, metadata_secret_file=secret_file)) == b"s3cret-s3cret-s3cret"
    assert not (tmp_path / "metadata" / "metadata.secret").exists()


@pytest.mark.parametrize(("content", "message"), [(None, "cannot read"), ("short\n", "at least 16 bytes")])
def test_unusable_secret_file_is_a_config_error(tmp_path, content, message):
    secret_file = tmp_path / "secret"
    if content is not None:
        secret_file.write_text(content)
    with pytest.raises(ConfigError, match=message):
        metadata_secret(Settings(data_dir=tmp_path, metadata_secret_file=secret_file))


def test_secret_is_not_in_the_settings_repr(tmp_path: Path):
    settings = Settings(data_dir=tmp_path, metadata_secret="do-not-log-me-0123456789")
    assert "do-not-log-me" not in repr(settings)


def _serve_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *flags: str, **env: str) -> Settings:
    for name in ("REDIS_URL", "METADATA_SECRET", "METADATA_SECRET_FILE"):
        monkeypatch.delenv("REGISTRY_PROXY_" + name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv("REGISTRY_PROXY_" + name, value)
    return settings_from_args(build_parser().parse_args(["serve", "--data-dir", str(tmp_path), *flags]))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--redis-url", "redis://127.0.0.1:6379/0"], "every replica the same secret"),
        (["--metadata-secret", "0123456789abcdef", "--metadata-secret-file", "f"], "not both"),
        (["--metadata-secret", "short"], "at least 16 bytes"),
    ],
)
def test_cli_refuses_a_missing_or_bad_secret(monkeypatch, tmp_path, flags, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("0123456789abcdef")  # a secret file that is there: the pair is what is wrong
    with pytest.raises(ConfigError, match=message):
        _serve_settings(monkeypatch, tmp_path, *flags)


def test_cli_takes_the_secret_from_the_environment(monkeypatch, tmp_path):
    settings = _serve_settings(
        monkeypatch, tmp_path, "--redis-url", "redis://127.0.0.1:6379/0", METADATA_SECRET="from-the-environment-0123"
    )
    assert settings.metadata.metadata_secret == "from-the-environment-0123"
    (tmp_path / "s").write_text("from-a-file-0123456789")
    settings = _serve_settings(monkeypatch, tmp_path, METADATA_SECRET_FILE=str(tmp_path / "s"))
    assert (settings.metadata.metadata_secret, settings.metadata.metadata_secret_file) == (None, tmp_path / "s")
