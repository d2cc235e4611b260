"""`terraform init` through the proxy as a network mirror: cold, warm-offline, and refusals.

Cold and offline after a restart go through `python -m proxy serve`; the refusals through `serve` in the
test's process (what they check is the verification, the same in both)."""

from __future__ import annotations

import re
import shutil

import pytest

from proxy.domain.hashes import h1_of_zip
from tests.conftest import PROVIDER
from tests.fakes.packages import Release

pytestmark = pytest.mark.e2e


def provider_tf(constraint: str) -> str:
    """A root module that requires the fake provider with `constraint`."""
    return (
        f'terraform {{\n  required_providers {{\n    foo = {{\n      source  = "{PROVIDER}"\n'
        f'      version = "{constraint}"\n    }}\n  }}\n}}\n'
    )


MAIN_TF = provider_tf("1.0.0")


def mirror_config(proxy) -> str:
    return f'provider_installation {{\n  network_mirror {{\n    url = "{proxy.url}/mirror/v1/"\n  }}\n}}\n'


def assert_refused_by_the_proxy(output: str, refusal: str) -> None:
    """terraform failed to install the provider, saying `refusal` (a regex) about the proxy's answer."""
    said = " ".join(output.split())  # terraform wraps its messages
    assert f"Error while installing {PROVIDER} v1.0.0" in said, output
    assert re.search(refusal, said), output
    assert "- Installed" not in output, output


def locked_hashes(workdir) -> list[str]:
    text = (workdir / ".terraform.lock.hcl").read_text()
    return re.findall(r'"((?:h1|zh):[^"]+)"', text)


def stored_files(data_dir) -> list:
    return [p for p in (data_dir / "archives" / "sha256").rglob("*") if p.is_file()]


async def test_init_cold_then_offline_after_restart(registry, proxy_process, terraform, tmp_path):
    import io

    proxy = await proxy_process()
    first = terraform.workdir("first", MAIN_TF)
    code, output = await terraform.init(first, mirror_config(proxy), proxy.ca_file)
    assert code == 0, output
    release = registry.releases[("acme", "foo")]["1.0.0"]
    expected_h1 = str(h1_of_zip(io.BytesIO(release.zips["linux_amd64"]))[1])
    assert locked_hashes(first) == [expected_h1]
    assert registry.count(registry.archive_path(release, "linux_amd64")) == 1

    await registry.stop()
    await proxy.stop()
    await proxy.start()
    second = terraform.workdir("second", MAIN_TF)
    shutil.copy(first / ".terraform.lock.hcl", second / ".terraform.lock.hcl")
    code, output = await terraform.init(second, mirror_config(proxy), proxy.ca_file)
    assert code == 0, output
    assert locked_hashes(second) == [expected_h1]


async def test_init_fails_and_caches_nothing_for_tampered_zip(registry, in_process_proxy, terraform):
    release = registry.releases[("acme", "foo")]["1.0.0"]
    registry.tampered.add(release.filename("linux_amd64"))
    proxy = await in_process_proxy()
    code, output = await terraform.init(terraform.workdir("w", MAIN_TF), mirror_config(proxy), proxy.ca_file)
    assert code != 0
    assert_refused_by_the_proxy(output, r"127\.0\.0\.1:\d+: bad response code: 502")  # the archive
    assert {e["check"] for e in proxy.events("security.verification_failed")} == {"archive"}
    assert stored_files(proxy.data_dir) == []


async def test_init_fails_and_caches_nothing_for_bad_signature(
    registry, in_process_proxy, terraform, other_key, signing_key
):
    registry.add(Release("acme", "foo", "1.0.0", other_key))  # signed by a key the registry does not list
    registry.signing_keys_override = [signing_key.armored_public_key]
    proxy = await in_process_proxy()
    code, output = await terraform.init(terraform.workdir("w", MAIN_TF), mirror_config(proxy), proxy.ca_file)
    assert code != 0
    assert_refused_by_the_proxy(
        output,
        r"failed to query provider mirror .*: 502 Bad Gateway returned from "
        r"127\.0\.0\.1:\d+",
    )  # the version document
    assert {e["check"] for e in proxy.events("security.verification_failed")} == {"signature"}
    assert stored_files(proxy.data_dir) == []
