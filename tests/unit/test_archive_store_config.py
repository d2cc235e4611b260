"""Unit tests for the archive store settings: `--archive-store s3://…`, the `--s3-*` flags, `--archive-redirect`."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli import build_parser, settings_from_args
from proxy.settings.config import ConfigError, S3Location, Settings, parse_s3_location
from proxy.storage import s3_options


@pytest.mark.parametrize(
    ("text", "bucket", "prefix"),
    [
        ("s3://bucket", "bucket", ""),
        ("s3://bucket/", "bucket", ""),
        ("s3://my.bucket-1/archives", "my.bucket-1", "archives/"),
        ("s3://bucket/team/proxy/", "bucket", "team/proxy/"),
    ],
)
def test_parse_s3_location(text: str, bucket: str, prefix: str) -> None:
    assert parse_s3_location(text) == S3Location(bucket, prefix)


@pytest.mark.parametrize(
    "text",
    [
        "bucket/prefix",
        "https://bucket/prefix",
        "s3://",
        "s3://B/upper",
        "s3://a/x",
        "s3://bucket/../etc",
        "s3://bucket/a//b",
        "s3://bucket/with space",
        "s3://bucket/new\nline",
        "s3://bucket_under/x",
        "s3://" + "b" * 64,
    ],
)
def test_parse_s3_location_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_s3_location(text)


def test_the_default_store_is_the_data_dir() -> None:
    settings = Settings(data_dir=Path("/d"))
    assert settings.archives.s3_location is None and settings.archive_dir == Path("/d/archives")


@pytest.mark.parametrize(
    "extra",
    [
        {"archive_redirect": True},
        {"s3_endpoint_url": "https://minio:9000"},
        {"s3_path_style": True},
        {"s3_region": "eu-west-1"},
        {"s3_ca_file": Path("/ca.pem")},
    ],
)
def test_s3_options_need_an_s3_store(extra: dict) -> None:
    with pytest.raises(ConfigError, match="--archive-store s3://"):
        Settings(data_dir=Path("/d"), **extra)


def test_endpoint_and_redirect_expiry_are_checked() -> None:
    with pytest.raises(ConfigError, match="--s3-endpoint-url"):
        build_parser().parse_args(["serve", "--archive-store", "s3://bucket", "--s3-endpoint-url", "minio:9000"])
    with pytest.raises(ConfigError, match="--archive-redirect-expiry"):
        build_parser().parse_args(["serve", "--archive-store", "s3://bucket", "--archive-redirect-expiry", "0"])


def test_flags_and_environment(monkeypatch, ca_file) -> None:
    monkeypatch.setenv("REGISTRY_PROXY_S3_PATH_STYLE", "true")
    monkeypatch.setenv("REGISTRY_PROXY_ARCHIVE_STORE", "s3://bucket/archives")
    args = build_parser().parse_args(
        [
            "serve",
            "--s3-endpoint-url",
            "https://minio.internal:9000",
            "--s3-region",
            "eu-central-1",
            "--s3-ca-file",
            str(ca_file),
            "--archive-redirect",
            "--archive-redirect-expiry",
            "2m",
        ]
    )
    settings = settings_from_args(args)
    assert settings.archives.s3_location == S3Location("bucket", "archives/")
    assert (
        settings.archives.s3_endpoint_url,
        settings.archives.s3_region,
        settings.archives.s3_path_style,
        settings.archives.s3_ca_file,
    ) == (
        "https://minio.internal:9000",
        "eu-central-1",
        True,
        ca_file,
    )
    assert (settings.archives.archive_redirect, settings.archives.archive_redirect_expiry) == (True, 120.0)


@pytest.mark.parametrize("command", ["export", "import", "verify"])
def test_the_commands_take_the_archive_store_flags(command: str) -> None:
    extra = ["bundle.tar"] if command == "import" else ["--out", "b.tar"] if command == "export" else []
    args = build_parser().parse_args([command, *extra, "--archive-store", "s3://bucket/x", "--s3-path-style"])
    assert (args.archive_store, args.s3_path_style) == ("s3://bucket/x", True)


def test_s3_timeout_flag_environment_and_default(monkeypatch) -> None:
    assert Settings(data_dir=Path("/d")).archives.s3_timeout == 20.0
    args = build_parser().parse_args(["serve", "--archive-store", "s3://bucket/x", "--s3-timeout", "5s"])
    settings = settings_from_args(args)
    assert settings.archives.s3_timeout == 5.0 and s3_options(settings).timeout == 5.0
    monkeypatch.setenv("REGISTRY_PROXY_S3_TIMEOUT", "1m")
    assert (
        settings_from_args(build_parser().parse_args(["serve", "--archive-store", "s3://bucket/x"])).archives.s3_timeout
        == 60
    )
    args = build_parser().parse_args(["verify", "--archive-store", "s3://bucket/x", "--s3-timeout", "7s"])
    assert args.s3_timeout == 7.0


@pytest.mark.parametrize("timeout", ["0", "-1s", "3601s"])
def test_s3_timeout_is_checked(timeout: str) -> None:
    with pytest.raises(ConfigError, match="--s3-timeout"):
        build_parser().parse_args(["serve", "--archive-store", "s3://bucket", f"--s3-timeout={timeout}"])
