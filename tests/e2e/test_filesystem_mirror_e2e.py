"""`export --format filesystem-mirror`, read by the real `terraform` with neither the proxy nor a registry."""

from __future__ import annotations

import hashlib

import pytest

from proxy.domain.lockfile import parse_lockfile
from tests.conftest import PROVIDER, REGISTRY_HOST
from tests.e2e.test_network_mirror_e2e import provider_tf
from tests.e2e.test_registry_e2e import host_config
from tests.fakes.packages import Release
from tests.fakes.process import registry_proxy_in_process

pytestmark = pytest.mark.e2e

RELEASED = ("linux_amd64", "darwin_amd64", "darwin_arm64", "windows_amd64")
EXPORTED = ("darwin_arm64", "linux_amd64")  # this machine's platform and another
MAIN_TF = provider_tf("~> 2.0")


def filesystem_mirror_config(path) -> str:
    """CLI config with a filesystem mirror as the only installation method (no `direct`: no network)."""
    return f'provider_installation {{\n  filesystem_mirror {{\n    path = "{path}"\n  }}\n}}\n'


def locked_hashes(workdir) -> list[str]:
    """The hashes the workdir's lock file records for the provider (sorted)."""
    return parse_lockfile((workdir / ".terraform.lock.hcl").read_text())[PROVIDER].hashes


async def test_terraform_installs_from_the_exported_mirror_with_the_registrys_lock_file(
    registry, signing_key, in_process_proxy, terraform, tmp_path
):
    release = registry.add(Release("acme", "foo", "2.0.0", signing_key, platforms=RELEASED))
    data_dir, mirror = tmp_path / "data", tmp_path / "mirror"
    proxy = await in_process_proxy(data_dir=data_dir)
    # terraform fills the proxy through the registry protocol: `init` for this platform, `providers lock` for both
    direct = terraform.workdir("direct", MAIN_TF)
    code, output = await terraform.init(direct, host_config(proxy), proxy.ca_file)
    assert code == 0, output
    both = terraform.workdir("both", MAIN_TF)
    platforms = [f"-platform={p}" for p in EXPORTED]
    code, output = await terraform.run(
        both, ["providers", "lock", "-no-color", *platforms], host_config(proxy), proxy.ca_file
    )
    assert code == 0, output
    await proxy.stop()
    await registry.stop()

    export = ("export", "--format", "filesystem-mirror", "--data-dir", str(data_dir), "--out", str(mirror))
    code, output = await registry_proxy_in_process(*export)
    assert code == 0 and "2 written" in output, output
    written = sorted(str(p.relative_to(mirror)) for p in mirror.rglob("*") if p.is_file())
    assert written == [f"{REGISTRY_HOST}/acme/foo/terraform-provider-foo_2.0.0_{p}.zip" for p in EXPORTED]
    for platform in EXPORTED:  # the registry's zips, byte for byte: their SHA-256 is the zh: of the signed sums
        data = (mirror / REGISTRY_HOST / "acme" / "foo" / f"terraform-provider-foo_2.0.0_{platform}.zip").read_bytes()
        assert data == release.zips[platform]
        assert f"zh:{hashlib.sha256(data).hexdigest()}" in locked_hashes(both)
    code, output = await registry_proxy_in_process(*export[:-2], str(mirror))  # DIR as the last argument
    assert code == 0 and "0 written" in output and "2 already there" in output, output
    code, output = await registry_proxy_in_process(*export[:-2], str(mirror / written[0]))
    assert code == 2 and "not a directory" in output, output
    code, output = await registry_proxy_in_process(*export, str(mirror))
    assert code == 2 and "give the destination once" in output, output

    config = filesystem_mirror_config(mirror)
    # The lock file made through the registry (both platforms' h1:, a zh: for all four) holds as it is.
    committed = terraform.workdir("committed", MAIN_TF)
    (committed / ".terraform.lock.hcl").write_text((both / ".terraform.lock.hcl").read_text())
    code, output = await terraform.init(committed, config, proxy.ca_file)
    assert code == 0, output
    assert (committed / ".terraform.lock.hcl").read_text() == (both / ".terraform.lock.hcl").read_text()
    # Without one, `init` records the h1: of this platform: the one the direct `init` recorded beside its zh:.
    fresh = terraform.workdir("fresh", MAIN_TF)
    code, output = await terraform.init(fresh, config, proxy.ca_file)
    assert code == 0, output
    assert locked_hashes(fresh) == [h for h in locked_hashes(direct) if h.startswith("h1:")]
    # `providers lock -fs-mirror` for both platforms: each one's h1:, as through the registry.
    locked = terraform.workdir("locked", MAIN_TF)
    code, output = await terraform.run(
        locked, ["providers", "lock", "-no-color", f"-fs-mirror={mirror}", *platforms], config, proxy.ca_file
    )
    assert code == 0, output
    assert locked_hashes(locked) == [h for h in locked_hashes(both) if h.startswith("h1:")]
