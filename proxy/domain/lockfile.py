"""`.terraform.lock.hcl`: parsing, merging by the clients' trust-on-first-use rule, and rendering.

Rendering matches what `terraform init` writes byte for byte (header, one block per
provider sorted by address, aligned `version`/`constraints`, sorted `hashes`), so a
following `init` finds nothing to change. Parsing uses a real HCL parser (python-hcl2).
Which hashes the clients record: docs/protocol.md#lock-files.
Pure: text in, text out.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field

import hcl2
from hcl2.utils import SerializationOptions

from proxy.domain.addresses import AddressError, Hostname

HEADER = '# This file is maintained automatically by "terraform init".\n# Manual edits may be lost in future updates.\n'
_HCL_OPTIONS = SerializationOptions(strip_string_quotes=True, explicit_blocks=False, with_comments=False)


class LockFileError(ValueError):
    """The lock file cannot be read, or an update conflicts with what it records."""


@dataclass
class LockedProvider:
    address: str  # host/namespace/type, host in its display (Unicode) form
    version: str
    constraints: str = ""
    hashes: list[str] = field(default_factory=list)


def parse_hcl(text: str, source: str) -> dict:
    """HCL text → plain dicts and lists (strings unquoted)."""
    try:
        return hcl2.loads(text, serialization_options=_HCL_OPTIONS)
    except Exception as exc:  # python-hcl2 raises lark errors of several kinds
        raise LockFileError(f"{source}: cannot parse HCL: {str(exc).strip().splitlines()[0][:300]}") from None


def parse_lockfile(text: str, source: str = ".terraform.lock.hcl") -> dict[str, LockedProvider]:
    """The provider entries of a lock file, by address."""
    document = parse_hcl(text, source)
    result: dict[str, LockedProvider] = {}
    for block in document.get("provider", []):
        for address, body in block.items():
            if not isinstance(body, dict) or not isinstance(body.get("version"), str):
                raise LockFileError(f"{source}: provider {address!r} has no version")
            hashes = body.get("hashes") or []
            if not isinstance(hashes, list) or not all(isinstance(h, str) for h in hashes):
                raise LockFileError(f"{source}: provider {address!r} has invalid hashes")
            result[address] = LockedProvider(
                address, body["version"], str(body.get("constraints") or ""), sorted(set(hashes))
            )
    return result


def merge_hashes(locked: LockedProvider | None, version: str, new_hashes: list[str]) -> list[str]:
    """Hashes to record for `version`: trust on first use.

    A new entry (or a new version) takes the new hashes. For the version already locked,
    the new hashes are added only if at least one of them is already recorded; otherwise
    the proxy disagrees with what was trusted before, which is refused.
    """
    if locked is None or locked.version != version or not locked.hashes:
        return sorted(set(new_hashes))
    if not set(locked.hashes) & set(new_hashes):
        raise LockFileError(
            f"provider {locked.address} {version}: none of the hashes the proxy reports matches the hashes "
            "already recorded in the lock file; refusing to change it (was the upstream package replaced?)"
        )
    return sorted(set(locked.hashes) | set(new_hashes))


def render(providers: dict[str, LockedProvider]) -> str:
    """The whole lock file text, blocks ordered as the clients order them (host in ASCII form, namespace, type)."""
    blocks = [_render_block(providers[address]) for address in sorted(providers, key=_address_order)]
    return HEADER + "".join("\n" + block for block in blocks)


def _address_order(address: str) -> tuple[str, ...]:
    host, _, rest = address.partition("/")
    with contextlib.suppress(AddressError):
        host = str(Hostname.parse(host))
    return (host, *rest.split("/"))


def _render_block(entry: LockedProvider) -> str:
    lines = [f"provider {_quote(entry.address)} {{"]
    if entry.constraints:
        lines.append(f"  version     = {_quote(entry.version)}")
        lines.append(f"  constraints = {_quote(entry.constraints)}")
    else:
        lines.append(f"  version = {_quote(entry.version)}")
    if entry.hashes:
        lines.append("  hashes = [")
        lines.extend(f"    {_quote(h)}," for h in sorted(set(entry.hashes)))
        lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
