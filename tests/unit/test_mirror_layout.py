"""Where `export --format filesystem-mirror` puts each archive: the packed layout of the clients' filesystem mirror."""

from __future__ import annotations

import pytest

from proxy.domain.addresses import Platform, ProviderAddr, Version
from proxy.protocol.mirror_layout import packed_path


@pytest.mark.parametrize(
    ("host", "namespace", "type_", "version", "platform", "expected"),
    [
        (
            "registry.terraform.io",
            "hashicorp",
            "aws",
            "5.0.0",
            "linux_amd64",
            "registry.terraform.io/hashicorp/aws/terraform-provider-aws_5.0.0_linux_amd64.zip",
        ),
        # as the clients name it: lower case, the host in its display form, a port kept unless 443
        (
            "Registry.OpenTofu.org:443",
            "HashiCorp",
            "Null",
            "3.2.1-beta.1",
            "darwin_arm64",
            "registry.opentofu.org/hashicorp/null/terraform-provider-null_3.2.1-beta.1_darwin_arm64.zip",
        ),
        (
            "xn--mnchen-3ya.de:8443",
            "acme",
            "foo",
            "1.0.0",
            "windows_386",
            "münchen.de:8443/acme/foo/terraform-provider-foo_1.0.0_windows_386.zip",
        ),
    ],
)
def test_packed_path(host, namespace, type_, version, platform, expected):
    path = packed_path(ProviderAddr.parse(host, namespace, type_), Version.parse(version), Platform.parse(platform))
    assert str(path) == expected
