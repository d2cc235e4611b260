"""`terraform init` through the registry pass-through: `host` blocks, and the proxy as module host.

`host` blocks with the upstream going away go through `python -m proxy serve`; the refused archive and the
proxy as module host through `serve` in the test's process (what they check is not the process)."""

from __future__ import annotations

import re
import shutil

import pytest

from tests.e2e.test_network_mirror_e2e import locked_hashes, provider_tf, stored_files
from tests.fakes.packages import MODULE_FILES
from tests.fakes.process import REGISTRY_HOST

pytestmark = pytest.mark.e2e

MAIN_TF = (
    provider_tf("1.0.0")
    + f"""
module "net" {{
  source  = "{REGISTRY_HOST}/acme/net/aws"
  version = "1.2.0"
}}

module "subnet" {{
  source  = "{REGISTRY_HOST}/acme/subnet/aws"
  version = "1.2.0"
}}
"""
)


def installed_signed_by(output: str, release) -> bool:
    """terraform's own line: the provider was installed with its signature checked against the release key."""
    line = f"- Installed {REGISTRY_HOST}/acme/foo v{release.version} (self-signed, key ID {release.key.key_id})"
    return re.search(rf"^{re.escape(line)}$", output, re.MULTILINE) is not None


def host_config(proxy) -> str:
    base = f"{proxy.url}/registry/{REGISTRY_HOST}"
    return (
        f'host "{REGISTRY_HOST}" {{\n  services = {{\n'
        f'    "providers.v1" = "{base}/providers/v1/"\n    "modules.v1" = "{base}/modules/v1/"\n  }}\n}}\n'
    )


async def test_init_with_host_blocks_then_offline(registry, git_modules, proxy_process, terraform):
    proxy = await proxy_process()
    first = terraform.workdir("first", MAIN_TF)
    code, output = await terraform.init(first, host_config(proxy), proxy.ca_file)
    assert code == 0, output
    release = registry.releases[("acme", "foo")]["1.0.0"]
    hashes = locked_hashes(first)
    assert sorted(h for h in hashes if h.startswith("zh:")) == sorted(
        f"zh:{release.sha256(p)}" for p in release.platforms
    )
    assert len([h for h in hashes if h.startswith("h1:")]) == 1
    assert (first / ".terraform/modules/net/main.tf").read_text() == MODULE_FILES["main.tf"]
    assert (first / ".terraform/modules/subnet/modules/subnet/main.tf").exists()
    assert installed_signed_by(output, release), output

    await registry.stop()
    second = terraform.workdir("second", MAIN_TF)
    shutil.copy(first / ".terraform.lock.hcl", second / ".terraform.lock.hcl")
    code, output = await terraform.init(second, host_config(proxy), proxy.ca_file)
    assert code == 0, output
    assert locked_hashes(second) == hashes
    assert installed_signed_by(output, release), output


async def test_init_fails_for_a_tampered_archive_through_the_registry(
    registry, git_modules, in_process_proxy, terraform
):
    release = registry.releases[("acme", "foo")]["1.0.0"]
    registry.tampered.add(release.filename("linux_amd64"))
    proxy = await in_process_proxy()
    code, output = await terraform.init(terraform.workdir("w", MAIN_TF), host_config(proxy), proxy.ca_file)
    assert code != 0
    assert f"Error while installing {REGISTRY_HOST}/acme/foo v1.0.0" in output, output
    assert re.search(r"127\.0\.0\.1:\d+: bad response code: 502", output), output  # the proxy refused it
    assert "- Installed" not in output, output
    failures = proxy.events("security.verification_failed")
    assert {(e["check"], e["filename"]) for e in failures} == {("archive", release.filename("linux_amd64"))}
    # Only the module archive (gzip) was stored; no provider zip, tampered or not.
    assert [p.read_bytes()[:2] for p in stored_files(proxy.data_dir)] == [b"\x1f\x8b"]


async def test_proxy_hostname_as_module_registry_without_cli_config(registry, git_modules, in_process_proxy, terraform):
    proxy = await in_process_proxy("--default-upstream", REGISTRY_HOST)
    main_tf = f'module "net" {{\n  source  = "127.0.0.1:{proxy.port}/acme/net/aws"\n  version = "1.2.0"\n}}\n'
    workdir = terraform.workdir("w", main_tf)
    code, output = await terraform.init(workdir, "", proxy.ca_file)
    assert code == 0, output
    assert (workdir / ".terraform/modules/net/main.tf").read_text() == MODULE_FILES["main.tf"]
