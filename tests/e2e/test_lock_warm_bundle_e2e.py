"""Complete lock files, cache warming and air-gap bundles, with the real `terraform`."""

from __future__ import annotations

import io
import shutil
import tarfile

import pytest

from tests.conftest import PROVIDER, REGISTRY_HOST
from tests.e2e.test_network_mirror_e2e import mirror_config, provider_tf, stored_files
from tests.e2e.test_registry_e2e import host_config
from tests.fakes.packages import Release
from tests.fakes.process import registry_proxy_in_process

pytestmark = pytest.mark.e2e

PLATFORMS = ("linux_amd64", "darwin_amd64", "darwin_arm64", "windows_amd64")
MAIN_TF = provider_tf("~> 2.0")


def upstream_config(registry) -> str:
    """CLI config that sends terraform straight to the fake upstream registry (no proxy)."""
    return (
        f'host "{REGISTRY_HOST}" {{\n  services = {{\n    "providers.v1" = "{registry.url}/v1/providers/"\n  }}\n}}\n'
    )


@pytest.fixture
def release4(registry, signing_key):
    return registry.add(Release("acme", "foo", "2.0.0", signing_key, platforms=PLATFORMS))


async def test_lock_command_matches_terraform_providers_lock_and_init_keeps_it(
    registry, release4, in_process_proxy, terraform, ca_file
):
    direct = terraform.workdir("direct", MAIN_TF)
    platform_args = [f"-platform={p}" for p in PLATFORMS]
    code, output = await terraform.run(
        direct, ["providers", "lock", "-no-color", *platform_args], upstream_config(registry), ca_file
    )
    assert code == 0, output
    expected = (direct / ".terraform.lock.hcl").read_text()

    proxy = await in_process_proxy()
    ours = terraform.workdir("ours", MAIN_TF)
    code, output = await registry_proxy_in_process(
        "lock",
        str(ours),
        "--proxy",
        proxy.url,
        "--ca-file",
        str(proxy.ca_file),
        "--default-registry",
        REGISTRY_HOST,
        *(arg for p in PLATFORMS for arg in ("--platform", p)),
    )
    assert code == 0, output
    written = (ours / ".terraform.lock.hcl").read_text()
    assert written == expected  # same hashes, and byte-identical formatting

    code, output = await terraform.init(ours, mirror_config(proxy), proxy.ca_file)
    assert code == 0, output
    assert "Incomplete lock file information" not in output
    assert (ours / ".terraform.lock.hcl").read_text() == written


async def test_warmed_cold_proxy_serves_init_with_the_upstream_down(registry, git_modules, in_process_proxy, terraform):
    from tests.e2e.test_registry_e2e import MAIN_TF as CONFIG_WITH_MODULES

    proxy = await in_process_proxy()
    config = terraform.workdir("config", CONFIG_WITH_MODULES)
    code, output = await registry_proxy_in_process(
        "warm",
        str(config),
        "--proxy",
        proxy.url,
        "--ca-file",
        str(proxy.ca_file),
        "--default-registry",
        REGISTRY_HOST,
        "--platform",
        "linux_amd64",
        "--platform",
        "darwin_arm64",
    )
    assert code == 0, output
    assert "4 fetched" in output and "0 failed" in output, output
    await registry.stop()
    workdir = terraform.workdir("init", CONFIG_WITH_MODULES)
    code, output = await terraform.init(workdir, host_config(proxy), proxy.ca_file)
    assert code == 0, output


async def test_warm_names_what_failed(registry, in_process_proxy, terraform):
    proxy = await in_process_proxy()
    config = terraform.workdir("config", MAIN_TF.replace("~> 2.0", "1.0.0"))
    code, output = await registry_proxy_in_process(
        "warm",
        str(config),
        "--proxy",
        proxy.url,
        "--ca-file",
        str(proxy.ca_file),
        "--default-registry",
        REGISTRY_HOST,
        "--platform",
        "linux_amd64",
        "--platform",
        "plan9_mips",
    )
    assert code == 1
    assert f"FAILED provider {PROVIDER} 1.0.0 plan9_mips" in output


async def test_export_import_and_offline_init(registry, release4, in_process_proxy, terraform, tmp_path, signing_key):
    online = await in_process_proxy(data_dir=tmp_path / "a")
    first = terraform.workdir("first", MAIN_TF)
    code, output = await terraform.init(first, mirror_config(online), online.ca_file)
    assert code == 0, output
    await online.stop()
    bundle = tmp_path / "bundle.tar.zst"
    code, output = await registry_proxy_in_process("export", "--data-dir", str(tmp_path / "a"), "--out", str(bundle))
    assert code == 0, output
    assert f"--trust-key {signing_key.fingerprint}" in output
    await registry.stop()

    code, output = await registry_proxy_in_process("import", str(bundle), "--data-dir", str(tmp_path / "b"))
    assert code == 2 and "--trust-key" in output  # trust must be named
    assert not (tmp_path / "b").exists()  # refused before the data dir was made
    trust = ("--trust-key", signing_key.fingerprint)
    code, output = await registry_proxy_in_process("import", str(bundle), "--data-dir", str(tmp_path / "b"), *trust)
    assert code == 0, output
    assert "gpg.verified" not in output and "[debug" not in output, output  # commands log at info
    code, again = await registry_proxy_in_process("import", str(bundle), "--data-dir", str(tmp_path / "b"), *trust)
    assert code == 0 and "0 new files" in again, again
    offline = await in_process_proxy("--offline", data_dir=tmp_path / "b", upstream=False)
    second = terraform.workdir("second", MAIN_TF)
    shutil.copy(first / ".terraform.lock.hcl", second / ".terraform.lock.hcl")
    code, output = await terraform.init(second, mirror_config(offline), offline.ca_file)
    assert code == 0, output


async def test_tampered_bundle_is_rejected(registry, in_process_proxy, tmp_path):
    online = await in_process_proxy(data_dir=tmp_path / "a")
    import ssl

    import aiohttp

    context = ssl.create_default_context(cafile=str(online.ca_file))
    async with aiohttp.ClientSession() as session:
        for path in (
            f"/mirror/v1/{PROVIDER}/1.0.0.json",
            f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip",
        ):
            async with session.get(online.url + path, ssl=context) as response:
                assert response.status == 200
    await online.stop()
    bundle = tmp_path / "bundle.tar"
    code, output = await registry_proxy_in_process("export", "--data-dir", str(tmp_path / "a"), "--out", str(bundle))
    assert code == 0, output

    tampered = tmp_path / "tampered.tar"
    with tarfile.open(bundle) as source, tarfile.open(tampered, "w") as target:
        for member in source:
            data = source.extractfile(member).read()
            if member.name.startswith("archives/"):
                data = data.replace(b"terraform-provider-foo", b"terraform-provider-bar")
            member.size = len(data)
            target.addfile(member, io.BytesIO(data))
    code, output = await registry_proxy_in_process(
        "import", str(tampered), "--data-dir", str(tmp_path / "b"), "--trust-bundle-keys"
    )
    assert code == 1
    assert "bundle rejected: archives/" in output and "was modified" in output, output
    assert stored_files(tmp_path / "b") == []
