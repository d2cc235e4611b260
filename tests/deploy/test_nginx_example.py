"""deploy/nginx.conf in front of a real proxy process: the client's address, scheme and host reach the
proxy, which writes its URLs for them; a client-forged forwarding header never does (real nginx-light)."""

from __future__ import annotations

import json
import re

import pytest

from proxy.identity.tokens import hash_token
from tests.e2e.test_auth_e2e import credentials
from tests.e2e.test_network_mirror_e2e import provider_tf
from tests.e2e.test_page_e2e import mirror_url, snippet
from tests.fakes.packages import MODULE_FILES, module_tar_gz
from tests.fakes.process import REGISTRY_HOST, REPO_ROOT, TERRAFORM, Terraform
from tests.fakes.registry import ModuleRelease

FORGED = {
    "X-Forwarded-For": "6.6.6.6",
    "X-Forwarded-Proto": "http",
    "X-Forwarded-Host": "evil.example",
    "Forwarded": "for=6.6.6.6;proto=http;host=evil.example",
}
pytestmark = pytest.mark.process


def test_nginx_example_sets_the_forwarded_headers_from_its_own_view():
    text = (REPO_ROOT / "deploy" / "nginx.conf").read_text()
    headers = dict(re.findall(r"^\s*proxy_set_header\s+(\S+)\s+(\S+);", text, re.MULTILINE))
    assert headers["X-Forwarded-For"] == "$remote_addr"  # not $proxy_add_x_forwarded_for: the edge overwrites
    assert headers["X-Forwarded-Proto"] == "$scheme"
    assert headers["X-Forwarded-Host"] == "$http_host"  # the host:port the client used, never one it forged
    assert headers["X-Request-Id"] == "$request_id"
    assert "--public-url https://mirror.example.internal/" in text  # how the proxy behind it is started


async def test_behind_nginx_the_page_shows_the_url_the_client_used_and_forged_headers_are_not_believed(
    behind_nginx,
) -> None:
    setup = await behind_nginx()
    status, html = await setup.get(setup.nginx.url)
    assert status == 200
    assert mirror_url(html) == f"https://localhost:{setup.nginx.port}/mirror/v1/"  # not http://, not nginx's view
    host_block = snippet(html, "hosts-terraform")
    assert f'"providers.v1" = "https://localhost:{setup.nginx.port}/registry/' in host_block
    assert setup.remotes("/") == ["127.0.0.1"]  # the client, not nginx (127.0.0.2)

    # A client forging the headers through nginx: nginx replaces them (Forwarded is not read by default).
    status, html = await setup.get(setup.nginx.url + "?via=nginx", **FORGED)
    assert status == 200 and mirror_url(html) == f"https://localhost:{setup.nginx.port}/mirror/v1/"
    assert "evil.example" not in html
    # The same headers sent straight to the proxy, from a peer that is not a trusted proxy: ignored.
    status, html = await setup.get(setup.proxy.url + "/", **FORGED)
    assert status == 200 and mirror_url(html) == f"http://127.0.0.1:{setup.proxy.port}/mirror/v1/"
    assert "evil.example" not in html
    assert setup.remotes("/") == ["127.0.0.1"] * 3  # never 6.6.6.6


async def test_the_public_url_wins_over_the_forwarding_headers(behind_nginx) -> None:
    setup = await behind_nginx("--public-url", "https://mirror.example.internal/")
    _, html = await setup.get(setup.nginx.url)
    assert mirror_url(html) == "https://mirror.example.internal/mirror/v1/"


@pytest.mark.e2e
@pytest.mark.skipif(TERRAFORM is None, reason="terraform binary NOT FOUND on PATH: this end-to-end test is SKIPPED")
async def test_terraform_init_behind_nginx_with_the_pages_snippet(behind_nginx, tmp_path, ca_file) -> None:
    """The page's snippet as a client behind the load balancer sees it is one terraform accepts (https) and that
    installs through nginx."""
    terraform = Terraform(tmp_path / "tf")
    setup = await behind_nginx()
    _, html = await setup.get(setup.nginx.url)
    workdir = terraform.workdir("root", provider_tf("1.0.0"))
    code, output = await terraform.init(workdir, snippet(html, "mirror-terraform"), ca_file)
    assert code == 0, output
    assert f"- Installed {REGISTRY_HOST}/acme/foo v1.0.0" in output, output


TOKEN = "rpt_prefix-client-token-0123456789"


@pytest.mark.e2e
@pytest.mark.skipif(TERRAFORM is None, reason="terraform binary NOT FOUND on PATH: this end-to-end test is SKIPPED")
async def test_terraform_init_under_a_path_prefix_the_balancer_strips(
    behind_nginx, registry, tmp_path, ca_file
) -> None:
    """`--public-url https://HOST/tf/` behind a balancer that strips `/tf`: the page's snippets, the discovery
    document, the download URLs and module locations of the documents, and their grants (a token is required)
    all work for terraform under the prefix."""
    registry.static["net-1.0.0.tar.gz"] = module_tar_gz(MODULE_FILES)
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.0.0", "{base}/static/net-1.0.0.tar.gz"))
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[tokens.ci]\nhash = "{hash_token(TOKEN)}"\nhosts = ["{REGISTRY_HOST}"]\n')
    setup = await behind_nginx("--auth-tokens", str(tokens), "--default-upstream", REGISTRY_HOST, prefix="/tf/")
    status, html = await setup.get(setup.nginx.url, Authorization=f"Bearer {TOKEN}")
    assert status == 200
    root = f"https://localhost:{setup.nginx.port}"
    assert mirror_url(html) == f"{root}/tf/mirror/v1/"
    status, discovery = await setup.get(f"{root}/.well-known/terraform.json")
    assert status == 200 and json.loads(discovery) == {
        "providers.v1": f"/tf/registry/{REGISTRY_HOST}/providers/v1/",
        "modules.v1": f"/tf/registry/{REGISTRY_HOST}/modules/v1/",
    }

    terraform = Terraform(tmp_path / "tf")
    module = f'module "net" {{\n  source  = "{REGISTRY_HOST}/acme/net/aws"\n  version = "1.0.0"\n}}\n'
    hosts = terraform.workdir("hosts", provider_tf("1.0.0") + module)
    config = snippet(html, "hosts-terraform") + credentials(REGISTRY_HOST, TOKEN)
    code, output = await terraform.init(hosts, config, ca_file)
    assert code == 0, output
    assert f"- Installed {REGISTRY_HOST}/acme/foo v1.0.0" in output, output
    assert (hosts / ".terraform/modules/net/main.tf").read_text() == MODULE_FILES["main.tf"]

    mirror = terraform.workdir("mirror", provider_tf("1.1.0"))
    config = snippet(html, "mirror-terraform") + credentials(f"localhost:{setup.nginx.port}", TOKEN)
    code, output = await terraform.init(mirror, config, ca_file)
    assert code == 0, output
    assert f"- Installed {REGISTRY_HOST}/acme/foo v1.1.0" in output, output
