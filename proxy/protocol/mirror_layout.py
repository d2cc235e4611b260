"""Where a provider archive goes in the packed layout of the clients' `filesystem_mirror`. Pure.

`HOST/NAMESPACE/TYPE/terraform-provider-TYPE_VERSION_OS_ARCH.zip` under the mirror's directory, HOST the
provider's source host in its display form (Unicode, `:port` kept unless 443), as `terraform providers mirror`
writes it (Terraform and OpenTofu read the host back in either form).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from proxy.domain.addresses import Platform, ProviderAddr, Version
from proxy.protocol.proxy_urls import archive_filename


def packed_path(addr: ProviderAddr, version: Version, platform: Platform) -> PurePosixPath:
    """The archive's path relative to the mirror's directory."""
    return PurePosixPath(addr.hostname.display, addr.namespace, addr.type, archive_filename(addr, version, platform))
