"""Bundle import rules that need no bundle: which discovery documents and version lists are taken."""

from __future__ import annotations

import json

from proxy.commands.bundle import _arriving_stale
from proxy.metadata_store import CacheEntry


def discovery(services: dict, url: str = "https://registry.example.test/.well-known/terraform.json") -> bytes:
    return CacheEntry(200, json.dumps(services).encode(), url, 1234.0, None, "application/json").encode()


def test_discovery_on_its_own_host_is_kept_but_stale():
    kept = _arriving_stale({"discovery:registry.example.test": discovery({"providers.v1": "/v1/providers/"})})
    assert CacheEntry.decode(kept["discovery:registry.example.test"]).fetched_at == 0.0


def test_discovery_pointing_at_another_host_is_dropped():
    planted = discovery({"providers.v1": "https://evil.example/v1/providers/"})
    assert _arriving_stale({"discovery:registry.example.test": planted}) == {}


def test_discovery_pointing_at_another_port_is_dropped():
    planted = discovery({"modules.v1": "https://registry.example.test:8443/v1/modules/"})
    assert _arriving_stale({"discovery:registry.example.test": planted}) == {}


def test_version_lists_arrive_stale_and_records_unchanged():
    versions = CacheEntry(200, b'{"versions": []}', "https://r/v1/x", 99.0).encode()
    result = _arriving_stale({"versions:r/a/b": versions, "archive:r/a/b/1.0.0/linux_amd64": b"record"})
    assert CacheEntry.decode(result["versions:r/a/b"]).fetched_at == 0.0
    assert result["archive:r/a/b/1.0.0/linux_amd64"] == b"record"
