"""Registry documents as the policy lets a client see them. Pure: bytes and decisions in, documents out.

A `versions` answer keeps only the allowed versions, and says in its `warnings` (which Terraform prints)
which versions were withheld and why. Terraform prints neither the body nor the reason phrase of a
refused `versions` or download answer, but it does print the `warnings` of a non-empty `versions` answer
and the status line of a refused SHA256SUMS: a denied provider is answered to Terraform and OpenTofu with
such documents, made without asking the upstream (`denied_versions_document`, `denied_download_document`).
"""

from __future__ import annotations

import json
from typing import Any

from proxy.domain.addresses import AddressError, Platform, ProviderAddr, Version
from proxy.governance.policy import Filtered
from proxy.protocol.proxy_urls import archive_filename, rewrite_download_document

PLACEHOLDER_VERSION = "0.0.0"  # listed for a denied provider so that the client asks for it, and reads why not
_NO_DIGEST = "0" * 64


def _allowed(entry: object, filtered: Filtered) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("version"), str):
        return False
    try:
        return Version.parse(entry["version"]) in filtered.allowed
    except AddressError:
        return False


def filtered_versions_document(body: bytes, filtered: Filtered, address: str) -> dict[str, Any]:
    """A provider `versions` answer with only the allowed versions, and a warning per withheld one."""
    document = json.loads(body)
    document["versions"] = [entry for entry in document.get("versions", []) if _allowed(entry, filtered)]
    warnings = [w for w in document.get("warnings") or [] if isinstance(w, str)] + filtered.warnings(address)
    if warnings:
        document["warnings"] = warnings
    return document


def filtered_module_versions(body: bytes, filtered: Filtered) -> dict[str, Any]:
    """A module `versions` answer with only the allowed versions."""
    document = json.loads(body)
    for module in document.get("modules", []):
        if isinstance(module, dict):
            module["versions"] = [entry for entry in module.get("versions", []) if _allowed(entry, filtered)]
    return document


def denied_versions_document(address: str, error: Any) -> dict[str, Any]:
    """The `versions` answer for a provider the policy denies whole: one placeholder version (with no
    platforms), and the reason in `warnings`."""
    return {
        "versions": [{"version": PLACEHOLDER_VERSION, "protocols": ["5.0"], "platforms": []}],
        "warnings": [f"registry-proxy policy: {address} is denied by rule {error.rule}: {error.reason}"],
    }


def denied_download_document(addr: ProviderAddr, version: Version, platform: Platform) -> dict[str, Any]:
    """A download answer whose SHA256SUMS (at the proxy) is refused with the policy's reason in its status line."""
    document = {
        "protocols": ["5.0"],
        "os": platform.os,
        "arch": platform.arch,
        "filename": archive_filename(addr, version, platform),
        "shasum": _NO_DIGEST,
        "signing_keys": {"gpg_public_keys": []},
    }
    return rewrite_download_document(document, addr, version, platform)
