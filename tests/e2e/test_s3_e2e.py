"""The real `terraform init` through proxies that keep their archives in S3 (a real S3 API server over HTTPS).

Two replicas share a Redis and a bucket and no volume (each has its own data dir): the second
serves what the first fetched without asking the upstream again. With `--archive-redirect`,
terraform follows the presigned URL to the object store and installs the provider (the proxy served in the
test's process: the redirect is what is checked).
"""

from __future__ import annotations

import pytest

from tests.e2e.test_network_mirror_e2e import MAIN_TF, locked_hashes, mirror_config, stored_files
from tests.fakes.redis_server import METADATA_SECRET

pytestmark = pytest.mark.e2e

PREFIX = "archives/"


def trust_both(proxy, ca_file, folder):
    """A CA bundle with the proxy's generated CA and the test CA (the S3 server's), for terraform."""
    bundle = folder / "cas.pem"
    bundle.write_text(proxy.ca_file.read_text() + ca_file.read_text())
    return bundle


async def test_two_replicas_share_redis_and_the_bucket_and_no_volume(
    proxy_process, redis_server, s3_server, s3_bucket, registry, terraform, tmp_path
):
    shared = (
        "--redis-url",
        redis_server.url,
        "--redis-prefix",
        f"s3-{tmp_path.name}",
        "--metadata-secret",
        METADATA_SECRET,
        *s3_server.flags(s3_bucket),
    )
    a = await proxy_process(*shared, data_dir=tmp_path / "replica-a")
    b = await proxy_process(*shared, data_dir=tmp_path / "replica-b")
    release = registry.releases[("acme", "foo")]["1.0.0"]
    sha = release.sha256("linux_amd64")

    first = terraform.workdir("a", MAIN_TF)
    code, output = await terraform.init(first, mirror_config(a), a.ca_file)
    assert code == 0, output
    assert s3_server.keys(s3_bucket) == [PREFIX + sha]
    second = terraform.workdir("b", MAIN_TF)
    code, output = await terraform.init(second, mirror_config(b), b.ca_file)
    assert code == 0, output
    assert locked_hashes(second) == locked_hashes(first)
    assert registry.count(registry.archive_path(release, "linux_amd64")) == 1  # B served it from the bucket
    served_by_b = [e["status"] for e in b.events("request") if e["path"].endswith(".zip")]
    assert served_by_b and set(served_by_b) == {200}
    assert stored_files(a.data_dir) == stored_files(b.data_dir) == []  # nothing on either local disk


async def test_terraform_follows_the_archive_redirect_to_the_object_store(
    in_process_proxy, s3_server, s3_bucket, registry, terraform, tmp_path, ca_file
):
    proxy = await in_process_proxy(*s3_server.flags(s3_bucket), "--archive-redirect", "--archive-redirect-expiry", "2m")
    release = registry.releases[("acme", "foo")]["1.0.0"]
    cas = trust_both(proxy, ca_file, tmp_path)
    for name in ("cold", "warm"):  # the cold install streams; the warm one is redirected
        workdir = terraform.workdir(name, MAIN_TF)
        code, output = await terraform.init(workdir, mirror_config(proxy), cas)
        assert code == 0, output
        assert "Installed registry.example.test/acme/foo v1.0.0" in output
    statuses = [e["status"] for e in proxy.events("request") if e["path"].endswith(".zip")]
    assert statuses[-1] == 307, statuses
    assert registry.count(registry.archive_path(release, "linux_amd64")) == 1
