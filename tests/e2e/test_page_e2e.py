"""The configuration the page at `/` shows works for a real `terraform init`; the page then lists what it fetched."""

from __future__ import annotations

import re
import ssl
from html import unescape

import aiohttp
import pytest

from tests.e2e.test_network_mirror_e2e import provider_tf
from tests.fakes.packages import MODULE_FILES, module_tar_gz
from tests.fakes.process import REGISTRY_HOST
from tests.fakes.registry import ModuleRelease

pytestmark = pytest.mark.e2e

MODULE_TF = f'module "net" {{\n  source  = "{REGISTRY_HOST}/acme/net/aws"\n  version = "1.0.0"\n}}\n'


async def page(proxy) -> str:
    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    async with aiohttp.ClientSession() as session, session.get(proxy.url + "/", ssl=context) as response:
        assert response.status == 200
        return await response.text()


def snippet(html: str, name: str) -> str:
    """The text of a copy-paste snippet, as the copy button puts it on the clipboard."""
    found = re.search(rf'<pre id="{name}"><code>(.*?)</code></pre>', html, re.S)
    assert found, name
    return unescape(found.group(1))


def mirror_url(html: str) -> str:
    """The network mirror URL the page's Terraform snippet names."""
    found = re.search(r'network_mirror \{\s+url = "([^"]+)"', snippet(html, "mirror-terraform"))
    assert found, html
    return found.group(1)


@pytest.mark.parametrize("name", ["hosts-terraform", "mirror-terraform"])
async def test_init_with_the_pages_snippet_then_the_page_lists_it(registry, in_process_proxy, terraform, name):
    registry.static["net-1.0.0.tar.gz"] = module_tar_gz(MODULE_FILES)
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.0.0", "{base}/static/net-1.0.0.tar.gz"))
    proxy = await in_process_proxy()
    before = await page(proxy)
    assert "No provider cached yet" in before
    with_module = name.startswith("hosts")  # through a network mirror, modules come from their own host
    workdir = terraform.workdir("root", provider_tf("1.0.0") + (MODULE_TF if with_module else ""))
    code, output = await terraform.init(workdir, snippet(before, name), proxy.ca_file)
    assert code == 0, output
    after = (await page(proxy)).replace("<wbr>", "")
    assert f"{REGISTRY_HOST}/acme/foo</td>" in after and ">linux_amd64</span>" in after
    assert (f"{REGISTRY_HOST}/acme/net/aws</td>" in after) is with_module
