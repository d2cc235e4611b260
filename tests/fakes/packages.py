"""Builders for tiny provider releases: zips, SHA256SUMS, signatures, and their hashes."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from dataclasses import dataclass, field

from tests.fakes.signing import SigningKey

DEFAULT_PLATFORMS = ("linux_amd64", "darwin_arm64", "windows_amd64")


def provider_zip(
    type_: str, version: str, platform: str, *, directory_entry: bool = False, padding: int = 0, noise: int = 0
) -> bytes:
    """A provider package: one executable script, optionally a `docs/` directory entry and
    `noise` bytes of incompressible data (stored, so the zip really is that large)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        script = f"#!/bin/sh\necho terraform-provider-{type_} {version} {platform}\n"
        info = zipfile.ZipInfo(f"terraform-provider-{type_}_v{version}", date_time=(2024, 1, 1, 0, 0, 0))
        info.external_attr = 0o755 << 16
        archive.writestr(info, script + "#" * padding)
        if noise:
            archive.writestr(
                zipfile.ZipInfo("noise.bin", date_time=(2024, 1, 1, 0, 0, 0)),
                os.urandom(noise),
                compress_type=zipfile.ZIP_STORED,
            )
        if directory_entry:
            archive.writestr(zipfile.ZipInfo("docs/", date_time=(2024, 1, 1, 0, 0, 0)), b"")
            archive.writestr(zipfile.ZipInfo("docs/README", date_time=(2024, 1, 1, 0, 0, 0)), b"read me\n")
    return buffer.getvalue()


@dataclass
class Release:
    """One provider version: a zip per platform, SHA256SUMS and its detached signature."""

    namespace: str
    type: str
    version: str
    key: SigningKey
    platforms: tuple[str, ...] = DEFAULT_PLATFORMS
    padding: int = 0
    noise: int = 0
    zips: dict[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for platform in self.platforms:
            self.zips[platform] = provider_zip(
                self.type, self.version, platform, padding=self.padding, noise=self.noise
            )
        self.resign()

    def filename(self, platform: str) -> str:
        return f"terraform-provider-{self.type}_{self.version}_{platform}.zip"

    @property
    def shasums_name(self) -> str:
        return f"terraform-provider-{self.type}_{self.version}_SHA256SUMS"

    def sha256(self, platform: str) -> str:
        return hashlib.sha256(self.zips[platform]).hexdigest()

    def resign(self) -> None:
        """Recompute SHA256SUMS from the current zips and sign it."""
        lines = [f"{self.sha256(p)}  {self.filename(p)}\n" for p in sorted(self.platforms)]
        self.shasums = "".join(lines).encode()
        self.signature = self.key.sign(self.shasums)


def module_tar_gz(files: dict[str, str]) -> bytes:
    """A module archive as registries serve them: a gzipped tar of the module's files."""
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1704067200, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


MODULE_FILES = {
    "main.tf": 'variable "name" {\n  default = "net"\n}\n\noutput "name" {\n  value = var.name\n}\n',
    "modules/subnet/main.tf": 'output "subnet" {\n  value = "10.0.1.0/24"\n}\n',
    "README.md": "# net module\n",
}
