"""The real `terraform init` through the network mirror for a provider whose registry lists no signing
keys: installed from `registry.opentofu.org` (the default `--unsigned-providers opentofu-default`), refused
with `--unsigned-providers refuse`. The mirror protocol carries only hashes, so terraform checks the
archive against them and never sees that there were no keys."""

from __future__ import annotations

import io

import pytest

from proxy.domain.hashes import h1_of_zip
from tests.e2e.test_network_mirror_e2e import locked_hashes, mirror_config, stored_files

pytestmark = pytest.mark.e2e

TOFU_PROVIDER = "registry.opentofu.org/acme/foo"
MAIN_TF = (
    f'terraform {{\n  required_providers {{\n    foo = {{\n      source  = "{TOFU_PROVIDER}"\n'
    '      version = "1.0.0"\n    }\n  }\n}\n'
)


@pytest.fixture
def unsigned_registry(registry):
    registry.signing_keys_override = []  # "gpg_public_keys": []
    return registry


async def test_init_installs_an_unsigned_provider_of_the_opentofu_registry(
    unsigned_registry, in_process_proxy, terraform
):
    proxy = await in_process_proxy("--upstream-map", f"registry.opentofu.org={unsigned_registry.url}")
    workdir = terraform.workdir("w", MAIN_TF)
    code, output = await terraform.init(workdir, mirror_config(proxy), proxy.ca_file)
    assert code == 0, output
    assert f"Installed {TOFU_PROVIDER} v1.0.0" in output, output
    release = unsigned_registry.releases[("acme", "foo")]["1.0.0"]
    assert locked_hashes(workdir) == [str(h1_of_zip(io.BytesIO(release.zips["linux_amd64"]))[1])]
    stored = proxy.events("archive.unsigned_stored")
    assert [(e["provider"], e["sha256"]) for e in stored] == [(TOFU_PROVIDER, release.sha256("linux_amd64"))]


async def test_init_is_refused_an_unsigned_provider_with_refuse(unsigned_registry, in_process_proxy, terraform):
    proxy = await in_process_proxy(
        "--upstream-map", f"registry.opentofu.org={unsigned_registry.url}", "--unsigned-providers", "refuse"
    )
    code, output = await terraform.init(terraform.workdir("w", MAIN_TF), mirror_config(proxy), proxy.ca_file)
    said = " ".join(output.split())
    assert code != 0 and f"Error while installing {TOFU_PROVIDER} v1.0.0" in said, output
    assert "502 Bad Gateway" in said, output
    assert {e["check"] for e in proxy.events("security.verification_failed")} == {"unsigned"}
    assert stored_files(proxy.data_dir) == []
