"""`warm`, `export`, `import` and `verify` with the archive store in S3 (the real CLI, a real S3 API server)."""

from __future__ import annotations

import hashlib

import pytest

from tests.conftest import PROVIDER, REGISTRY_HOST, serve_proxy
from tests.fakes.packages import MODULE_FILES, module_tar_gz
from tests.fakes.process import registry_proxy_in_process
from tests.fakes.registry import ModuleRelease

ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
MODULE_ARCHIVE = "/registry/registry.example.test/modules/v1/acme/net/aws/1.0.0/archive.tar.gz"
PREFIX = "archives/"
MAIN_TF = f"""
terraform {{
  required_providers {{
    foo = {{
      source  = "{PROVIDER}"
      version = "1.0.0"
    }}
  }}
}}
module "net" {{
  source  = "{REGISTRY_HOST}/acme/net/aws"
  version = "~> 1.0"
}}
"""


def add_module(registry) -> None:
    registry.static["net.tar.gz"] = module_tar_gz(MODULE_FILES)
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.0.0", "{base}/static/net.tar.gz"))


@pytest.mark.process
async def test_warm_export_import_and_verify_on_s3(
    make_local_settings, client_ssl, registry, s3_server, tmp_path, ca_file, signing_key
):
    add_module(registry)
    release = registry.releases[("acme", "foo")]["1.0.0"]
    zip_sha = release.sha256("linux_amd64")
    module_sha = hashlib.sha256(registry.static["net.tar.gz"]).hexdigest()
    source_bucket, target_bucket = s3_server.bucket(), s3_server.bucket()
    source = make_local_settings(data_dir=tmp_path / "a", **s3_server.settings(source_bucket))
    config = tmp_path / "config"
    config.mkdir()
    (config / "main.tf").write_text(MAIN_TF)

    # warm: the running proxy fetches, verifies and uploads every archive the configuration needs
    async with serve_proxy(source, client_ssl) as running:
        code, output = await registry_proxy_in_process(
            "warm", str(config), "--proxy", running.url, "--ca-file", str(ca_file), "--platform", "linux_amd64"
        )
        assert code == 0, output
        assert "2 fetched" in output
        assert (await running.json(f"/mirror/v1/{PROVIDER}/1.0.0.json"))[0] == 200
    assert s3_server.keys(source_bucket) == sorted([PREFIX + zip_sha, PREFIX + module_sha])
    assert not (source.archive_dir / "sha256").exists() or not any((source.archive_dir / "sha256").rglob("*"))

    # export from the bucket, import into another data dir and bucket
    bundle = tmp_path / "bundle.tar.zst"
    code, output = await registry_proxy_in_process(
        "export", "--data-dir", str(source.data_dir), "--out", str(bundle), *s3_server.flags(source_bucket)
    )
    assert code == 0, output
    assert "exported 1 provider archives and 1 modules" in output
    target = make_local_settings(data_dir=tmp_path / "b", offline=True, **s3_server.settings(target_bucket))
    code, output = await registry_proxy_in_process(
        "import",
        str(bundle),
        "--data-dir",
        str(target.data_dir),
        "--trust-key",
        signing_key.fingerprint,
        *s3_server.flags(target_bucket),
    )
    assert code == 0, output
    assert "2 new files" in output
    assert s3_server.keys(target_bucket) == sorted([PREFIX + zip_sha, PREFIX + module_sha])
    code, output = await registry_proxy_in_process(
        "import",
        str(bundle),
        "--data-dir",
        str(target.data_dir),
        "--trust-key",
        signing_key.fingerprint,
        *s3_server.flags(target_bucket),
    )
    assert code == 0 and "0 new files" in output and "2 already present" in output, output
    await registry.stop()
    async with serve_proxy(target, client_ssl) as offline:
        status, _, data = await offline.get(ARCHIVE)
        assert (status, data) == (200, release.zips["linux_amd64"])
        status, _, data = await offline.get(MODULE_ARCHIVE)
        assert (status, data) == (200, registry.static["net.tar.gz"])

    # verify: intact, then a corrupt object and a stray key are reported; --repair quarantines
    flags = ["verify", "--data-dir", str(target.data_dir), *s3_server.flags(target_bucket)]
    code, output = await registry_proxy_in_process(*flags)
    assert code == 0, output
    assert "verify: 2 objects" in output and "0 corrupt" in output
    same_size = b"x" * len(release.zips["linux_amd64"])
    s3_server.client.put_object(Bucket=target_bucket, Key=PREFIX + zip_sha, Body=same_size)
    s3_server.client.put_object(Bucket=target_bucket, Key=PREFIX + "stray", Body=b"?")
    code, output = await registry_proxy_in_process(*flags)
    assert code == 1, output
    assert f"CORRUPT {zip_sha}" in output and f"{PREFIX}stray" in output and "1 stray" in output
    code, output = await registry_proxy_in_process(*flags, "--repair")
    assert code == 0, output
    assert f"quarantined to s3://{target_bucket}/{PREFIX}quarantine/{zip_sha}-" in output
    assert PREFIX + zip_sha not in s3_server.keys(target_bucket)
    code, output = await registry_proxy_in_process(*flags)
    assert code == 0 and "verify: 1 objects" in output and "1 file(s) in quarantine" in output, output
