"""The real `terraform init` against a proxy that requires client tokens, given in a `credentials` block.

Terraform sends the token of the mirror's host to the network mirror, and the token of the
registry host to the services a `host` block names for it, but no token when it downloads
the archives, SHA256SUMS and module packages those documents list: the proxy's signed URLs
(grants) carry the permission there.
"""

from __future__ import annotations

import pytest

from proxy.identity.tokens import hash_token
from tests.e2e.test_network_mirror_e2e import locked_hashes, mirror_config
from tests.e2e.test_registry_e2e import MAIN_TF, host_config, installed_signed_by
from tests.fakes.packages import MODULE_FILES
from tests.fakes.process import REGISTRY_HOST

pytestmark = pytest.mark.e2e

TOKEN = "rpt_e2e-client-token-0123456789"


def credentials(host: str, token: str) -> str:
    return f'credentials "{host}" {{\n  token = "{token}"\n}}\n'


@pytest.fixture
def tokens_file(tmp_path):
    path = tmp_path / "tokens.toml"
    path.write_text(f'[tokens.ci]\nhash = "{hash_token(TOKEN)}"\nhosts = ["{REGISTRY_HOST}"]\n')
    return path


def proxy_host(proxy) -> str:
    return proxy.url.removeprefix("https://")


async def test_network_mirror_with_a_credentials_block(registry, proxy_process, terraform, tokens_file):
    proxy = await proxy_process("--auth-tokens", str(tokens_file))
    workdir = terraform.workdir("mirror", MAIN_TF.split("module")[0])
    config = mirror_config(proxy) + credentials(proxy_host(proxy), TOKEN)
    code, output = await terraform.init(workdir, config, proxy.ca_file)
    assert code == 0, output
    assert len(locked_hashes(workdir)) == 1
    assert TOKEN not in proxy.log_path.read_text()

    refused = terraform.workdir("mirror-no-token", MAIN_TF.split("module")[0])
    code, output = await terraform.init(refused, mirror_config(proxy), proxy.ca_file)
    said = " ".join(output.split())
    assert code != 0 and "- Installed" not in output
    assert f"host {proxy_host(proxy)} rejected the given authentication credentials" in said, output  # 401

    wrong = terraform.workdir("mirror-wrong-token", MAIN_TF.split("module")[0])
    code, output = await terraform.init(
        wrong, mirror_config(proxy) + credentials(proxy_host(proxy), "rpt_wrong"), proxy.ca_file
    )
    assert code != 0 and "rejected the given authentication credentials" in " ".join(output.split()), output


async def test_host_blocks_with_a_credentials_block_for_the_registry_host(
    registry,
    git_modules,
    proxy_process,
    terraform,
    tokens_file,
):
    proxy = await proxy_process("--auth-tokens", str(tokens_file))
    workdir = terraform.workdir("hosts", MAIN_TF)
    code, output = await terraform.init(workdir, host_config(proxy) + credentials(REGISTRY_HOST, TOKEN), proxy.ca_file)
    assert code == 0, output
    release = registry.releases[("acme", "foo")]["1.0.0"]
    assert installed_signed_by(output, release), output
    assert (workdir / ".terraform/modules/net/main.tf").read_text() == MODULE_FILES["main.tf"]
    assert TOKEN not in proxy.log_path.read_text()

    refused = terraform.workdir("hosts-no-token", MAIN_TF)
    code, output = await terraform.init(refused, host_config(proxy), proxy.ca_file)
    assert code != 0 and "- Installed" not in output
    assert "error looking up module versions: 401 Unauthorized" in " ".join(output.split()), output

    providers_only = terraform.workdir("hosts-providers-no-token", MAIN_TF.split("module")[0])
    code, output = await terraform.init(providers_only, host_config(proxy), proxy.ca_file)
    assert code != 0 and "- Installed" not in output
    assert f"host {REGISTRY_HOST} requires authentication credentials" in " ".join(output.split()), output
