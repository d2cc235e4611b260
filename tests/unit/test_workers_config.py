"""`--workers`: its default and validation, and what several workers change in the metadata set-up."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proxy.cli import build_parser, settings_from_args
from proxy.metadata_store.factory import open_metadata_store
from proxy.metadata_store.file_locks import FileLocks
from proxy.runtime.coalescing import LocalLocks
from proxy.settings.config import ConfigError, Settings


def _settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *flags: str) -> Settings:
    monkeypatch.delenv("REGISTRY_PROXY_WORKERS", raising=False)
    return settings_from_args(build_parser().parse_args(["serve", "--data-dir", str(tmp_path), *flags]))


def test_the_default_is_one_worker_per_available_cpu(monkeypatch, tmp_path) -> None:
    assert _settings(monkeypatch, tmp_path).server.workers == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(("flag", "workers"), [("1", 1), ("4", 4), ("auto", len(os.sched_getaffinity(0)))])
def test_workers_flag(monkeypatch, tmp_path, flag: str, workers: int) -> None:
    assert _settings(monkeypatch, tmp_path, "--workers", flag).server.workers == workers


@pytest.mark.parametrize("flag", ["0", "-1", "two", ""])
def test_workers_flag_rejects(monkeypatch, tmp_path, flag: str) -> None:
    with pytest.raises(ConfigError, match="--workers"):
        _settings(monkeypatch, tmp_path, "--workers", flag)


def test_no_workers_are_refused_from_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("REGISTRY_PROXY_WORKERS", "0")
    with pytest.raises(ConfigError, match=r"--workers '0' \(from REGISTRY_PROXY_WORKERS\): must be at least 1"):
        build_parser().parse_args(["serve", "--data-dir", str(tmp_path)])


def test_only_one_worker_on_the_embedded_store_may_remember_absences(tmp_path) -> None:
    assert Settings(data_dir=tmp_path).sole_metadata_writer
    assert not Settings(data_dir=tmp_path, workers=2).sole_metadata_writer
    assert not Settings(
        data_dir=tmp_path, redis_url="redis://127.0.0.1:1/0", metadata_secret="0123456789abcdef"
    ).sole_metadata_writer


@pytest.mark.parametrize(("workers", "locks"), [(1, LocalLocks), (2, FileLocks)])
async def test_several_workers_on_the_embedded_store_use_lock_files(tmp_path, workers: int, locks: type) -> None:
    store, chosen = await open_metadata_store(Settings(data_dir=tmp_path, workers=workers))
    await store.close()
    assert type(chosen) is locks
