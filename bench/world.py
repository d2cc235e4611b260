"""The benchmark's world: a signing key, a test CA, provider releases and the fake upstream.

Everything listens on 127.0.0.1. The big and the mid release each hold one incompressible
(ZIP_STORED, random bytes) archive, so its size on the wire is its size on disk.
"""

from __future__ import annotations

import os
import ssl
import zipfile
from dataclasses import dataclass
from pathlib import Path

import trustme

from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST
from tests.fakes.registry import FakeRegistry
from tests.fakes.signing import SigningKey

MIB = 1 << 20
PLATFORM = "linux_amd64"  # the platform `terraform init` asks for on this machine


def mirror_path(release: Release, document: str) -> str:
    """A network-mirror path for a release: `index.json`, `VERSION.json` or an archive."""
    return f"/mirror/v1/{REGISTRY_HOST}/{release.namespace}/{release.type}/{document}"


def archive_document(release: Release, platform: str = PLATFORM) -> str:
    return f"{release.version}/{platform}/{release.filename(platform)}"


def write_random_zip(path: Path, type_: str, version: str, size: int) -> None:
    """A provider zip whose single member is `size` random bytes, stored uncompressed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    info = zipfile.ZipInfo(f"terraform-provider-{type_}_v{version}", date_time=(2024, 1, 1, 0, 0, 0))
    info.external_attr = 0o755 << 16
    info.compress_type = zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive, archive.open(info, "w") as member:
        remaining = size
        while remaining:
            block = os.urandom(min(8 * MIB, remaining))
            member.write(block)
            remaining -= len(block)


def policy_text(rules: int) -> str:
    """`rules` rules of every kind (namespace, version and client denials, a min-age and a platform list); none
    denies a release of the world (acme/foo, acme/big, acme/mid 1.0.0) on linux_amd64."""
    kinds = [
        '[[rule]]\nname = "cooldown"\nproviders = ["*/*/*"]\nmodules = ["*/*/*/*"]\nmin-age = "72h"\n',
        '[[rule]]\nname = "platforms"\nproviders = ["*/*/*"]\nplatforms = ["linux_amd64", "linux_arm64", '
        '"darwin_arm64"]\n',
    ]
    for index in range(rules - len(kinds)):
        if index % 3 == 0:
            kinds.insert(
                0,
                f'[[rule]]\nname = "bad-{index}"\nproviders = ["{REGISTRY_HOST}/acme/foo"]\n'
                f'versions = "= 9.{index}.0"\naction = "deny"\nreason = "known bad"\n',
            )
        elif index % 3 == 1:
            kinds.insert(0, f'[[rule]]\nname = "ns-{index}"\nproviders = ["*/vendor{index}/*"]\naction = "deny"\n')
        else:
            kinds.insert(
                0,
                f'[[rule]]\nname = "team-{index}"\nproviders = ["*/*/tool{index}*"]\nclients = ["team{index}-*"]\n'
                'action = "deny"\n',
            )
    return "\n".join(kinds) + '\n[default]\naction = "allow"\n'


@dataclass
class World:
    root: Path
    ca: trustme.CA
    ca_file: Path
    cert_file: Path  # for 127.0.0.1, signed by `ca` (used by nginx)
    key_file: Path
    small: Release
    big: Release
    big_zip: Path
    mid: Release  # the fleet benchmark's archive, cold for every proxy until then
    registry: FakeRegistry

    def client_ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))


def random_release(root: Path, key: SigningKey, type_: str, size: int) -> tuple[Release, Path]:
    """A one-platform release whose archive is a random ZIP_STORED member of `size` bytes."""
    release = Release("acme", type_, "1.0.0", key, platforms=(PLATFORM,))
    path = root / type_ / release.filename(PLATFORM)
    write_random_zip(path, type_, release.version, size)
    release.zips[PLATFORM] = path.read_bytes()
    release.resign()
    return release, path


async def build_world(root: Path, big_bytes: int, mid_bytes: int) -> World:
    """Create the key, CA, releases (small `acme/foo`, big `acme/big`, mid `acme/mid`), start the fake registry."""
    key = SigningKey(root / "gpg", "Bench Release Signer")
    ca = trustme.CA()
    ca_file = root / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = root / "server.pem", root / "server-key.pem"
    for index, pem in enumerate(leaf.cert_chain_pems):
        pem.write_to_path(str(cert_file), append=index > 0)
    leaf.private_key_pem.write_to_path(str(key_file))

    small = Release("acme", "foo", "1.0.0", key)
    big, big_zip = random_release(root, key, "big", big_bytes)
    mid, _ = random_release(root, key, "mid", mid_bytes)

    upstream_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    leaf.configure_cert(upstream_ssl)
    registry = FakeRegistry(upstream_ssl)
    registry.add(small)
    registry.add(big)
    registry.add(mid)
    await registry.start()
    return World(root, ca, ca_file, cert_file, key_file, small, big, big_zip, mid, registry)
