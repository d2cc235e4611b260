"""The metadata store as `serve` and the CLI commands open it: same retention for every kind of entry."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from proxy.cli import build_parser
from proxy.commands import run
from proxy.metadata_store import CacheEntry
from proxy.metadata_store.embedded import EmbeddedStore
from proxy.metadata_store.factory import negative_bound
from proxy.metadata_store.memory import MemoryFront
from proxy.metadata_store.negative import MemoryNegatives, NegativeBound
from proxy.metadata_store.sealed import Seal, SealedStore
from proxy.settings.config import Settings


def sealed_embedded(folder: Path) -> SealedStore:
    """The embedded store as `open_metadata_store` gives it: sealed."""
    return SealedStore(
        EmbeddedStore(folder / "metadata.sqlite"), Seal(b"factory-test-secret-0123456789", store="embedded")
    )


NEGATIVE = CacheEntry(404, b"", "https://registry.example.test/v1/providers/acme/nope/versions", 1.0).encode()


@pytest.mark.parametrize("command", [["export", "--out", "bundle.tar"], ["import", "bundle.tar"]])
def test_export_and_import_take_the_redis_retention_serve_has(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REGISTRY_PROXY_REDIS_RETENTION", raising=False)
    assert build_parser().parse_args(command).redis_retention == 90 * 86400
    assert build_parser().parse_args([*command, "--redis-retention", "7d"]).redis_retention == 7 * 86400


async def test_the_cli_opens_the_store_with_its_retention_and_negative_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Settings] = []

    async def open_metadata(settings: Settings, metrics=None):
        opened.append(settings)
        embedded = EmbeddedStore(tmp_path / "metadata.sqlite")
        return SealedStore(embedded, Seal(b"factory-test-secret-0123456789", store="embedded")), None, embedded

    monkeypatch.setattr(run, "open_metadata", open_metadata)
    args = build_parser().parse_args(
        [
            "export",
            "--out",
            "b.tar",
            "--data-dir",
            str(tmp_path),
            "--redis-retention",
            "7d",
            "--metadata-secret",
            "s" * 32,
        ]
    )
    cache, _, store = await run._stores(args)
    try:
        assert opened[0].metadata.redis_retention == 7 * 86400
        assert isinstance(cache, NegativeBound)
    finally:
        await cache.close()
        await store.close()


async def test_negative_bound_keeps_remembered_404s_out_of_the_backend(tmp_path: Path) -> None:
    backend = sealed_embedded(tmp_path)
    defaults = Settings(data_dir=tmp_path)
    settings = replace(defaults, freshness=replace(defaults.freshness, negative=7200.0))
    cache = negative_bound(settings, backend)
    try:
        assert isinstance(cache.negatives, MemoryNegatives)
        await cache.set("versions:registry.example.test/acme/nope", NEGATIVE)
        assert await backend.get("versions:registry.example.test/acme/nope") is None
        assert await cache.get("versions:registry.example.test/acme/nope") == NEGATIVE
    finally:
        await cache.close()


def test_negative_bound_wraps_the_front_it_is_given(tmp_path: Path) -> None:
    backend = sealed_embedded(tmp_path)
    front = MemoryFront(backend)
    assert negative_bound(Settings(data_dir=tmp_path), backend, front=front).inner is front
