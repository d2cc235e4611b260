"""Registry pass-through: providers.v1 with rewritten URLs, modules.v1 with cached sources."""

from __future__ import annotations

import io
import json
import tarfile
import time

import pytest
from structlog.testing import capture_logs

from tests.conftest import serve_proxy
from tests.fakes.gitrepo import make_bare_repo
from tests.fakes.packages import MODULE_FILES, Release, module_tar_gz
from tests.fakes.registry import ModuleRelease

# The metadata store does not matter to what these tests check (the contract suites, the warm-path,
# freshness and failure tests run over both): the embedded store only.
pytestmark = pytest.mark.one_metadata_store


P = "/registry/registry.example.test/providers/v1/acme/foo"
M = "/registry/registry.example.test/modules/v1/acme/net/aws"


def release_of(registry) -> Release:
    return registry.releases[("acme", "foo")]["1.0.0"]


# ---- providers ------------------------------------------------------------------------------


async def test_provider_versions_are_passed_through(proxy, registry):
    status, body = await proxy.json(f"{P}/versions")
    assert status == 200
    assert {v["version"] for v in body["versions"]} == {"1.0.0", "1.1.0"}
    assert body["versions"][0]["platforms"]  # upstream fields kept


async def test_download_document_points_at_the_proxy_and_keeps_everything_else(proxy, registry):
    packages = {"linux_amd64": {"hashes": ["zh:abc"], "package_size": 1}}
    registry.extra_download_fields = {"packages": packages, "x_vendor": {"anything": [1, 2]}}
    status, body = await proxy.json(f"{P}/1.0.0/download/linux/amd64")
    assert status == 200
    release = release_of(registry)
    assert body["download_url"] == (
        "/mirror/v1/registry.example.test/acme/foo/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
    )
    assert body["shasums_url"] == f"{P}/1.0.0/download/linux/amd64/SHA256SUMS"
    assert body["shasums_signature_url"] == f"{P}/1.0.0/download/linux/amd64/SHA256SUMS.sig"
    assert body["filename"] == release.filename("linux_amd64")
    assert body["shasum"] == release.sha256("linux_amd64")
    assert body["signing_keys"]["gpg_public_keys"][0]["ascii_armor"] == release.key.armored_public_key
    assert body["protocols"] == ["5.0"] and (body["os"], body["arch"]) == ("linux", "amd64")
    assert body["packages"] == packages and body["x_vendor"] == {"anything": [1, 2]}


async def test_shasums_and_signature_are_byte_identical(proxy, registry):
    release = release_of(registry)
    _, body = await proxy.json(f"{P}/1.0.0/download/darwin/arm64")
    status, _, sums = await proxy.get(body["shasums_url"])
    assert (status, sums) == (200, release.shasums)
    status, _, signature = await proxy.get(body["shasums_signature_url"])
    assert (status, signature) == (200, release.signature)


async def test_unverifiable_shasums_are_not_served(proxy, registry, other_key):
    release_of(registry).signature = other_key.sign(release_of(registry).shasums)
    status, body = await proxy.json(f"{P}/1.0.0/download/linux/amd64/SHA256SUMS")
    assert (status, body["code"]) == (502, "signature_invalid")


async def test_registry_and_mirror_share_one_verified_archive(proxy, registry):
    _, body = await proxy.json(f"{P}/1.0.0/download/linux/amd64")
    status, _, data = await proxy.get(body["download_url"])
    assert status == 200 and data == release_of(registry).zips["linux_amd64"]
    status, _, again = await proxy.get(
        "/mirror/v1/registry.example.test/acme/foo/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
    )
    assert (status, again) == (200, data)
    assert registry.count(registry.archive_path(release_of(registry), "linux_amd64")) == 1


async def test_registry_errors(proxy, registry):
    status, body = await proxy.json(f"{P}/9.9.9/download/linux/amd64")
    assert (status, body["code"]) == (404, "version_not_found")
    status, body = await proxy.json("/registry/registry.example.test/providers/v1/acme/nope/versions")
    assert (status, body["code"]) == (404, "provider_not_found")
    before = len(registry.requests)
    status, body = await proxy.json("/registry/registry.terraform.io/providers/v1/hashicorp/aws/versions")
    assert (status, body["code"]) == (403, "host_not_allowed")
    assert len(registry.requests) == before


async def test_proxy_discovery_document_advertises_the_default_upstream(proxy):
    status, body = await proxy.json("/.well-known/terraform.json")
    assert status == 200
    assert body == {
        "providers.v1": "/registry/registry.opentofu.org/providers/v1/",
        "modules.v1": "/registry/registry.opentofu.org/modules/v1/",
    }


# ---- modules --------------------------------------------------------------------------------


@pytest.fixture
def net_module(registry):
    registry.static["net-1.0.0.tar.gz"] = module_tar_gz(MODULE_FILES)
    return registry.add_module(ModuleRelease("acme", "net", "aws", "1.0.0", "{base}/static/net-1.0.0.tar.gz"))


async def test_module_versions_are_passed_through(proxy, net_module):
    status, body = await proxy.json(f"{M}/versions")
    assert status == 200 and body == {"modules": [{"versions": [{"version": "1.0.0"}]}]}


@pytest.mark.parametrize("answer", ["header", "json", "both"])
async def test_module_download_answers_with_body_and_header(proxy, registry, net_module, answer):
    net_module.answer = answer
    async with proxy.session.get(f"{proxy.url}{M}/1.0.0/download") as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/json"
        body = await response.json()
        assert body["location"] == response.headers["X-Terraform-Get"]
        assert body["location"] == f"{M}/1.0.0/archive.tar.gz"
    status, _, data = await proxy.get(body["location"])
    assert status == 200 and data == registry.static["net-1.0.0.tar.gz"]
    assert (await proxy.get(body["location"]))[0] == 200
    assert registry.count("/static/net-1.0.0.tar.gz") == 1


@pytest.mark.parametrize("location", ["/static/net-1.0.0.tar.gz", "../../../../../../static/net-1.0.0.tar.gz"])
async def test_relative_upstream_locations_are_resolved_against_the_download_url(proxy, registry, net_module, location):
    net_module.location = location
    _, body = await proxy.json(f"{M}/1.0.0/download")
    status, _, data = await proxy.get(body["location"])
    assert status == 200 and data == registry.static["net-1.0.0.tar.gz"]


async def test_subdir_is_preserved(proxy, net_module):
    net_module.location = "{base}/static/net-1.0.0.tar.gz//modules/subnet"
    _, body = await proxy.json(f"{M}/1.0.0/download")
    assert body["location"] == f"{M}/1.0.0/archive.tar.gz//modules/subnet"
    status, _, _ = await proxy.get(body["location"].split("//")[0])
    assert status == 200


@pytest.mark.parametrize(
    "location, reason",
    [
        ("file:///etc/passwd", "file://"),
        ("git::http://example.com/repo.git", "only fetched over https"),
        ("https://user:secret@example.com/x.tar.gz", "credentials"),
        ("{base}/static/net-1.0.0.tar.gz//../../etc", "escapes"),
    ],
)
async def test_refused_module_sources(proxy, net_module, location, reason):
    net_module.location = location
    status, body = await proxy.json(f"{M}/1.0.0/download")
    assert (status, body["code"]) == (502, "module_source_refused") and reason in body["errors"][0]  # says why


async def test_unproxied_sources_pass_through_unless_denied(make_settings, client_ssl, registry, net_module):
    net_module.location = "s3::https://s3.amazonaws.com/bucket/net.zip"
    async with serve_proxy(make_settings(), client_ssl) as running:
        status, body = await running.json(f"{M}/1.0.0/download")
        assert (status, body["location"]) == (200, "s3::https://s3.amazonaws.com/bucket/net.zip")
    async with serve_proxy(make_settings(module_passthrough="deny"), client_ssl) as running:
        status, body = await running.json(f"{M}/1.0.0/download")
        assert (status, body["code"]) == (502, "module_source_refused")
        assert "--module-passthrough=deny" in body["errors"][0]  # names the option that refuses it


def escaping_tar_gz() -> bytes:
    """A module archive with an entry that would be unpacked outside the module directory."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("../../outside.tf")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"x=1"))
    return buffer.getvalue()


async def test_unsafe_module_archive_is_refused_and_not_stored(proxy, registry, net_module):
    registry.static["net-1.0.0.tar.gz"] = escaping_tar_gz()
    status, body = await proxy.json(f"{M}/1.0.0/archive.tar.gz")
    assert (status, body["code"]) == (502, "verification_failed")
    from proxy.web.app_keys import SETTINGS

    assert not [p for p in (proxy.app[SETTINGS].archive_dir / "sha256").rglob("*") if p.is_file()]


async def test_module_archive_on_a_private_address_is_refused(proxy, net_module):
    net_module.location = "https://169.254.169.254/net.tar.gz"
    status, body = await proxy.json(f"{M}/1.0.0/archive.tar.gz")
    assert (status, body["code"]) == (502, "forbidden_upstream_address")


async def test_module_archive_name_must_match(proxy, net_module):
    status, body = await proxy.json(f"{M}/1.0.0/archive.zip")
    assert (status, body["code"]) == (404, "document_not_found") and "archive.tar.gz" in body["errors"][0]


# ---- git sources ----------------------------------------------------------------------------


@pytest.fixture
def git_module(registry, tmp_path):
    bare, commit = make_bare_repo(tmp_path / "repos", "net", MODULE_FILES, "v1.2.0")
    registry.git_root = bare.parent
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.2.0", "git::{base}/git/net.git?ref=v1.2.0"))
    return commit


def tar_members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


async def test_git_source_is_cloned_at_its_ref_and_packed(proxy, registry, git_module):
    status, body = await proxy.json(f"{M}/1.2.0/download")
    assert (status, body["location"]) == (200, f"{M}/1.2.0/archive.tar.gz")
    status, headers, data = await proxy.get(body["location"])
    assert status == 200 and headers["Content-Type"] == "application/gzip"
    members = tar_members(data)
    assert set(members) == set(MODULE_FILES)  # the tagged commit, not the later one, and no .git
    assert members["main.tf"].decode() == MODULE_FILES["main.tf"]
    assert (await proxy.get(body["location"]))[2] == data


async def test_git_packing_is_deterministic_across_proxies(make_settings, client_ssl, registry, git_module, tmp_path):
    results = []
    for name in ("one", "two"):
        async with serve_proxy(make_settings(data_dir=tmp_path / name), client_ssl) as running:
            status, _, data = await running.get(f"{M}/1.2.0/archive.tar.gz")
            assert status == 200
            results.append(data)
    assert results[0] == results[1]


async def test_git_clone_failure_is_a_clear_502(proxy, registry, git_module):
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.3.0", "git::{base}/git/net.git?ref=v9.9.9"))
    status, body = await proxy.json(f"{M}/1.3.0/archive.tar.gz")
    assert (status, body["code"]) == (502, "git_failed")


async def test_module_errors(proxy, registry, net_module, monkeypatch):
    from proxy.settings.config import FreshnessTtls
    from proxy.web.app_keys import MODULES
    from tests.fakes.registry import Fault

    now = [time.time()]
    monkeypatch.setattr(proxy.app[MODULES]._documents, "clock", lambda: now[0])
    registry.faults["/v1/modules/acme/net/aws/versions"] = Fault(body=json.dumps({"modules": []}).encode())
    status, answer = await proxy.json(f"{M}/versions")
    assert (status, answer["code"]) == (502, "upstream_malformed")
    del registry.faults["/v1/modules/acme/net/aws/versions"]  # a malformed answer is not cached, only remembered
    assert (await proxy.json(f"{M}/9.9.9/download"))[0] == 502
    now[0] += FreshnessTtls().negative
    for path, status, code in (
        (f"{M}/9.9.9/download", 404, "version_not_found"),
        ("/registry/registry.example.test/modules/v1/acme/none/aws/versions", 404, "module_not_found"),
        ("/registry/registry.example.test/modules/v1/acme/net/AWS/versions", 400, "invalid_address"),
    ):
        got, answer = await proxy.json(path)
        assert (got, answer["code"]) == (status, code), path


async def test_module_checksum_is_verified(proxy, registry, net_module):
    import hashlib

    good = hashlib.sha256(registry.static["net-1.0.0.tar.gz"]).hexdigest()
    net_module.location = f"{{base}}/static/net-1.0.0.tar.gz?checksum=sha256:{good}"
    status, _, data = await proxy.get(f"{M}/1.0.0/archive.tar.gz")
    assert status == 200 and data == registry.static["net-1.0.0.tar.gz"]
    assert registry.requests[-1] == ("GET", "/static/net-1.0.0.tar.gz")  # checksum not sent upstream


async def test_module_checksum_mismatch_is_refused_and_not_stored(proxy, registry, net_module):
    net_module.location = "{base}/static/net-1.0.0.tar.gz?checksum=sha256:" + "0" * 64
    status, body = await proxy.json(f"{M}/1.0.0/archive.tar.gz")
    assert (status, body["code"]) == (502, "checksum_mismatch")
    from proxy.web.app_keys import SETTINGS

    assert not [p for p in (proxy.app[SETTINGS].archive_dir / "sha256").rglob("*") if p.is_file()]


# ---- one error model for module archives ------------------------------------------------------


async def refused_archive(running, path: str) -> tuple[int, dict, list[dict]]:
    """Status, body and the proxy's log events of a refused module archive."""
    with capture_logs() as logs:
        status, body = await running.json(path)
    return status, body, logs


def logged(logs: list[dict], event: str) -> list[dict]:
    return [entry for entry in logs if entry["event"] == event]


async def test_module_checksum_mismatch_is_a_verification_failure(proxy, net_module):
    net_module.location = "{base}/static/net-1.0.0.tar.gz?checksum=sha256:" + "0" * 64
    status, body, logs = await refused_archive(proxy, f"{M}/1.0.0/archive.tar.gz")
    assert (status, body["code"]) == (502, "checksum_mismatch")
    assert [e["code"] for e in logged(logs, "request.failed")] == ["checksum_mismatch"]
    assert [e["check"] for e in logged(logs, "security.verification_failed")] == ["module_checksum"]


async def test_unsafe_module_archive_is_a_verification_failure(proxy, registry, net_module):
    registry.static["net-1.0.0.tar.gz"] = escaping_tar_gz()
    status, body, logs = await refused_archive(proxy, f"{M}/1.0.0/archive.tar.gz")
    assert (status, body["code"]) == (502, "verification_failed")
    assert [e["code"] for e in logged(logs, "request.failed")] == ["verification_failed"]
    assert [e["check"] for e in logged(logs, "security.verification_failed")] == ["module_archive"]


@pytest.mark.parametrize(
    "limits, words",
    [
        ({"max_module_entries": 1}, "more than 1 entries"),
        ({"max_module_unpacked_bytes": 16}, "more than 16 bytes"),
    ],
)
async def test_module_archive_over_the_limits_is_too_large(make_settings, client_ssl, net_module, limits, words):
    async with serve_proxy(make_settings(**limits), client_ssl) as running:
        status, body, logs = await refused_archive(running, f"{M}/1.0.0/archive.tar.gz")
    assert (status, body["code"]) == (502, "upstream_too_large") and words in body["errors"][0]  # names the limit
    assert [e["code"] for e in logged(logs, "request.failed")] == ["upstream_too_large"]
    assert [e["check"] for e in logged(logs, "security.verification_failed")] == ["module_archive"]
