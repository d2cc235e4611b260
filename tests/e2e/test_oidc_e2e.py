"""The real `terraform init` signing in with an OIDC workload token in `TF_TOKEN_<host>`, as a CI job does
(or in a `credentials` block of the CLI config): against the network mirror (the token of the mirror's host)
and through `host` blocks (the token of the registry host), with a fake issuer over HTTPS that mints real
RS256 and ES256 tokens.
"""

from __future__ import annotations

import pytest

from tests.e2e.test_auth_e2e import credentials
from tests.e2e.test_network_mirror_e2e import locked_hashes, mirror_config
from tests.e2e.test_registry_e2e import MAIN_TF, host_config, installed_signed_by
from tests.fakes.packages import MODULE_FILES
from tests.fakes.process import REGISTRY_HOST, wait_for
from tests.integration.test_oidc import issuer, issuers_file  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e

PROVIDER_ONLY = MAIN_TF.split("module")[0]


def tf_token(host: str) -> str:
    """`TF_TOKEN_<host>` as the CLIs decode it (`.` as `_`); a port stays as it is (`env` can set such a name)."""
    return "TF_TOKEN_" + host.replace(".", "_")


@pytest.fixture
async def oidc_proxy(proxy_process, issuer, issuers_file):  # noqa: F811
    return await proxy_process("--oidc-issuers", str(issuers_file), "--allow-private-host", issuer.allow)


async def test_network_mirror_with_the_jwt_in_tf_token(registry, oidc_proxy, terraform, issuer):  # noqa: F811
    proxy = oidc_proxy
    mirror_host = proxy.url.removeprefix("https://")
    token = issuer.mint("ES256")
    workdir = terraform.workdir("mirror", PROVIDER_ONLY)
    code, output = await terraform.init(workdir, mirror_config(proxy), proxy.ca_file, {tf_token(mirror_host): token})
    assert code == 0, output
    assert len(locked_hashes(workdir)) == 1
    log = proxy.log_path.read_text()
    assert token not in log and token.split(".")[2] not in log

    # the archive was downloaded with the grant made for the job's identity (logged a moment after the answer)
    def archive_downloads() -> list[dict]:
        return [r for r in proxy.events("request") if r["path"].endswith(".zip") and r["method"] == "GET"]

    await wait_for(lambda: bool(archive_downloads()), 10, "the archive download logged")
    downloads = archive_downloads()
    assert downloads and all(r["client"]["subject"] == "repo:acme/infra:ref:refs/heads/main" for r in downloads)

    block = terraform.workdir("mirror-credentials-block", PROVIDER_ONLY)  # the JWT in a credentials block
    config = mirror_config(proxy) + credentials(mirror_host, issuer.mint("RS256"))
    code, output = await terraform.init(block, config, proxy.ca_file)
    assert code == 0, output
    assert len(locked_hashes(block)) == 1

    expired = terraform.workdir("mirror-expired", PROVIDER_ONLY)
    stale = issuer.mint(exp=1_700_000_000, iat=1_699_999_000, nbf=1_699_999_000)
    code, output = await terraform.init(expired, mirror_config(proxy), proxy.ca_file, {tf_token(mirror_host): stale})
    assert code != 0 and "- Installed" not in output
    assert f"host {mirror_host} rejected the given authentication credentials" in " ".join(output.split()), output
    assert [r["reason"] for r in proxy.events("auth.refused")] == ["oidc expired"]


async def test_host_blocks_with_the_jwt_in_tf_token_for_the_registry_host(
    registry,
    git_modules,
    oidc_proxy,
    terraform,
    issuer,  # noqa: F811
):
    proxy = oidc_proxy
    workdir = terraform.workdir("hosts", MAIN_TF)
    env = {tf_token(REGISTRY_HOST): issuer.mint("RS256")}
    code, output = await terraform.init(workdir, host_config(proxy), proxy.ca_file, env)
    assert code == 0, output
    assert installed_signed_by(output, registry.releases[("acme", "foo")]["1.0.0"]), output
    assert (workdir / ".terraform/modules/net/main.tf").read_text() == MODULE_FILES["main.tf"]

    other = terraform.workdir("hosts-other-owner", PROVIDER_ONLY)  # a valid token of another owner: 403
    env = {tf_token(REGISTRY_HOST): issuer.mint("RS256", repository_owner="someone-else")}
    code, output = await terraform.init(other, host_config(proxy), proxy.ca_file, env)
    assert code != 0 and "- Installed" not in output, output
    said = " ".join(output.split())  # terraform words a 403 of the registry like a 401
    assert f"host {REGISTRY_HOST} rejected the given authentication credentials" in said, output
    [refused] = proxy.events("auth.refused")
    assert refused["client"]["rules"] == [] and refused["reason"].startswith("this token may not read")
