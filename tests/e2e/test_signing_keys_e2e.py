"""`terraform init` through a proxy whose policy holds a new signing key: the release signed by a key never seen for
its provider is refused with the reason in terraform's output, then installed once `registry-proxy trust accept`
accepted the key."""

from __future__ import annotations

import pytest

from tests.e2e.test_network_mirror_e2e import provider_tf
from tests.e2e.test_registry_e2e import host_config
from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST, registry_proxy_in_process

pytestmark = pytest.mark.e2e


async def test_a_held_key_change_fails_init_until_the_key_is_accepted(
    registry, other_key, in_process_proxy, terraform, tmp_path
):
    policy = tmp_path / "policy.toml"
    policy.write_text('key-change = "hold"\n')
    registry.add(Release("acme", "foo", "1.2.0", other_key))  # 1.0.0 and 1.1.0: signed by the session's key
    proxy = await in_process_proxy("--policy", str(policy))
    config = host_config(proxy)
    code, output = await terraform.init(terraform.workdir("old", provider_tf("1.0.0")), config, proxy.ca_file)
    assert code == 0, output  # the provider's first key, recorded
    workdir = terraform.workdir("new", provider_tf("~> 1.0"))
    code, output = await terraform.init(workdir, config, proxy.ca_file)
    said = " ".join(output.split())  # terraform wraps its messages
    assert code != 0 and "- Installed" not in output, output
    assert "Denied by policy rule key-change" in said and other_key.key_id in said, output
    code, printed = await registry_proxy_in_process(
        "trust", "accept", f"{REGISTRY_HOST}/acme/foo", other_key.key_id, "--data-dir", str(proxy.data_dir)
    )
    assert code == 0, printed
    code, output = await terraform.init(workdir, config, proxy.ca_file)
    assert code == 0 and f"- Installed {REGISTRY_HOST}/acme/foo v1.2.0" in output, output
