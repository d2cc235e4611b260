"""Lock endpoint, offline mode, the lock and warm commands, and air-gap bundles, in process."""

from __future__ import annotations

import io
import re
import tarfile

import pytest

from proxy.commands import CommandError
from proxy.commands.bundle import export_bundle, import_verified, verified_bundle
from proxy.commands.lock import run_lock
from proxy.commands.proxy_api import ProxyClient
from proxy.commands.warm import run_warm
from proxy.domain.addresses import Platform
from proxy.domain.hashes import h1_of_zip
from proxy.domain.lockfile import parse_lockfile
from proxy.metadata_store.factory import open_metadata_store
from proxy.runtime.progress import Progress
from proxy.settings.config import Settings
from proxy.storage.disk import DiskStore
from tests.conftest import PROVIDER, REGISTRY_HOST, serve_proxy
from tests.fakes.packages import MODULE_FILES, module_tar_gz
from tests.fakes.registry import ModuleRelease

LINUX, DARWIN = Platform.parse("linux_amd64"), Platform.parse("darwin_arm64")
ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
MAIN_TF = f"""
terraform {{
  required_providers {{
    foo = {{
      source  = "{PROVIDER}"
      version = "~> 1.0, != 1.1.0"
    }}
  }}
}}
module "net" {{
  source  = "{REGISTRY_HOST}/acme/net/aws"
  version = "~> 1.0"
}}
"""


def dir_h1(data: bytes) -> str:
    return str(h1_of_zip(io.BytesIO(data))[1])


@pytest.fixture
def config_dir(tmp_path, registry):
    registry.static["net.tar.gz"] = module_tar_gz(MODULE_FILES)
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.0.0", "{base}/static/net.tar.gz"))
    directory = tmp_path / "config"
    directory.mkdir()
    (directory / "main.tf").write_text(MAIN_TF)
    return directory


# ---- lock endpoint ---------------------------------------------------------------------------


async def test_lock_endpoint_gives_h1_per_platform_and_every_signed_zh(proxy, registry):
    release = registry.releases[("acme", "foo")]["1.0.0"]
    status, body = await proxy.json(f"/lock/v1/{PROVIDER}/1.0.0?platform=linux_amd64&platform=darwin_arm64")
    assert status == 200
    assert body["platforms"] == {
        p: {"h1": dir_h1(release.zips[p]), "zh": f"zh:{release.sha256(p)}"} for p in ("linux_amd64", "darwin_arm64")
    }
    assert body["signed_zh"] == sorted(f"zh:{release.sha256(p)}" for p in release.platforms)
    assert body["hashes"] == sorted(
        {*body["signed_zh"], dir_h1(release.zips["linux_amd64"]), dir_h1(release.zips["darwin_arm64"])}
    )


@pytest.mark.parametrize(
    "path, status, code",
    [
        (f"/lock/v1/{PROVIDER}/1.0.0?platform=plan9_mips", 404, "package_not_found"),
        (f"/lock/v1/{PROVIDER}/7.7.7?platform=linux_amd64", 404, "version_not_found"),
        (f"/lock/v1/{PROVIDER}/1.0.0?platform=linux", 400, "invalid_address"),
    ],
)
@pytest.mark.one_metadata_store
async def test_lock_endpoint_errors(proxy, path, status, code):
    got, body = await proxy.json(path)
    assert (got, body["code"]) == (status, code) and body["errors"]


# ---- offline -----------------------------------------------------------------------------------


async def test_offline_serves_the_cache_and_misses_are_404(make_settings, client_ssl, registry):
    async with serve_proxy(make_settings(), client_ssl) as online:
        assert (await online.get(ARCHIVE))[0] == 200
        assert (await online.json(f"/mirror/v1/{PROVIDER}/index.json"))[0] == 200
    seen = len(registry.requests)
    async with serve_proxy(make_settings(offline=True), client_ssl) as offline:
        assert (await offline.get(ARCHIVE))[0] == 200
        assert (await offline.json(f"/mirror/v1/{PROVIDER}/index.json"))[0] == 200
        name = "terraform-provider-foo_1.1.0_linux_amd64.zip"
        status, body = await offline.json(f"/mirror/v1/{PROVIDER}/1.1.0/linux_amd64/{name}")
        assert (status, body["code"]) == (404, "offline_miss")
        status, body = await offline.json(f"/mirror/v1/{REGISTRY_HOST}/acme/other/index.json")
        assert (status, body["code"]) == (404, "offline_miss")
    assert len(registry.requests) == seen


# ---- lock and warm commands ---------------------------------------------------------------------


async def test_lock_command_writes_complete_entries_and_is_stable(proxy, registry, config_dir, ca_file):
    release = registry.releases[("acme", "foo")]["1.0.0"]
    async with ProxyClient(proxy.url, ca_file) as client:
        await run_lock(config_dir, client, [LINUX, DARWIN])
        first = (config_dir / ".terraform.lock.hcl").read_text()
        entry = parse_lockfile(first)[PROVIDER]
        assert entry.version == "1.0.0"  # 1.1.0 is excluded by != 1.1.0
        assert entry.constraints == "~> 1.0, != 1.1.0"
        assert entry.hashes == sorted(
            {
                dir_h1(release.zips["linux_amd64"]),
                dir_h1(release.zips["darwin_arm64"]),
                *(f"zh:{release.sha256(p)}" for p in release.platforms),
            }
        )
        await run_lock(config_dir, client, [LINUX, DARWIN])
        assert (config_dir / ".terraform.lock.hcl").read_text() == first


async def test_lock_command_refuses_hashes_that_disagree_with_the_lock(proxy, config_dir, ca_file):
    (config_dir / ".terraform.lock.hcl").write_text(
        f'provider "{PROVIDER}" {{\n  version = "1.0.0"\n  hashes = ["zh:{"0" * 64}"]\n}}\n'
    )
    async with ProxyClient(proxy.url, ca_file) as client:
        with pytest.raises(CommandError, match="none of the hashes"):
            await run_lock(config_dir, client, [LINUX])


@pytest.mark.one_metadata_store
async def test_lock_command_explains_unsatisfiable_and_unknown(proxy, config_dir, ca_file):
    async with ProxyClient(proxy.url, ca_file) as client:
        (config_dir / "main.tf").write_text(MAIN_TF.replace("~> 1.0, != 1.1.0", ">= 5.0"))
        with pytest.raises(CommandError, match=r"no available version matches '>= 5\.0\.0'"):
            await run_lock(config_dir, client, [LINUX])
        (config_dir / "main.tf").write_text(MAIN_TF.replace("acme/foo", "acme/missing"))
        with pytest.raises(CommandError, match="unknown"):
            await run_lock(config_dir, client, [LINUX])
        (config_dir / "main.tf").write_text("terraform {")
        with pytest.raises(CommandError, match=r"main\.tf"):
            await run_lock(config_dir, client, [LINUX])


async def test_warm_fetches_every_platform_and_module_once(proxy, registry, config_dir, ca_file):
    release = registry.releases[("acme", "foo")]["1.0.0"]
    shown = io.StringIO()  # not a terminal: plain lines
    async with ProxyClient(proxy.url, ca_file) as client:
        with Progress("warm", stream=shown) as progress:
            report = await run_warm(client, [LINUX, DARWIN], directory=config_dir, progress=progress)
    assert report.failed == {} and len(report.done) == 3
    lines = shown.getvalue().splitlines()
    assert sorted(line.split("] ")[1] for line in lines[:-1]) == [
        f"module {REGISTRY_HOST}/acme/net/aws ~> 1.0: ok ({len(registry.static['net.tar.gz'])} bytes)",
        *(f"provider {PROVIDER} 1.0.0 {p}: ok ({len(release.zips[str(p)])} bytes)" for p in (DARWIN, LINUX)),
    ]
    assert {line.split("] ")[0] for line in lines[:-1]} == {"warm: [1/3", "warm: [2/3", "warm: [3/3"}
    assert re.fullmatch(rf"warm: done: 3 items, {report.bytes} bytes in \d+\.\ds", lines[-1]), lines
    for platform in ("linux_amd64", "darwin_arm64"):
        assert registry.count(registry.archive_path(release, platform)) == 1
    assert registry.count("/static/net.tar.gz") == 1
    assert report.bytes == sum(len(release.zips[p]) for p in ("linux_amd64", "darwin_arm64")) + len(
        registry.static["net.tar.gz"]
    )


async def test_warm_reports_failures_by_name(proxy, registry, config_dir, ca_file):
    async with ProxyClient(proxy.url, ca_file) as client:
        report = await run_warm(client, [Platform.parse("plan9_mips")], directory=config_dir)
    assert list(report.failed) == [f"provider {PROVIDER} 1.0.0 plan9_mips"]
    assert report.failed[f"provider {PROVIDER} 1.0.0 plan9_mips"] == (
        "the version has no package for plan9_mips (it offers: darwin_arm64, linux_amd64, windows_amd64)"
    )


# ---- bundles -------------------------------------------------------------------------------------


async def _stores(data_dir):
    store = DiskStore(data_dir / "archives")
    await store.open()
    return (await open_metadata_store(Settings(data_dir=data_dir)))[0], store


async def _export(data_dir, out, only=(), progress=None):
    cache, store = await _stores(data_dir)
    try:
        return await export_bundle(cache, store, out, list(only), progress=progress)
    finally:
        await cache.close()
        await store.close()


async def _import(data_dir, bundle, trusted=None, progress=None):
    with verified_bundle(bundle, trusted, progress) as verified:
        cache, store = await _stores(data_dir)
        try:
            return await import_verified(verified, cache, store, progress)
        finally:
            await cache.close()
            await store.close()


MODULE_ARCHIVE = "/registry/registry.example.test/modules/v1/acme/net/aws/1.0.0/archive.tar.gz"


@pytest.fixture
async def exported(make_local_settings, client_ssl, registry, config_dir, tmp_path):
    settings = make_local_settings(data_dir=tmp_path / "a")
    async with serve_proxy(settings, client_ssl) as running:
        assert (await running.json(f"/mirror/v1/{PROVIDER}/1.0.0.json"))[0] == 200
        assert (await running.get(ARCHIVE))[0] == 200
        assert (await running.get(MODULE_ARCHIVE))[0] == 200
    bundle = tmp_path / "bundle.tar.zst"
    report = await _export(settings.data_dir, bundle)
    assert (len(report.providers), len(report.modules)) == (1, 1)
    return bundle


async def test_bundle_round_trip_serves_offline(
    exported, make_local_settings, client_ssl, registry, tmp_path, signing_key
):
    target = tmp_path / "b"
    shown = io.StringIO()  # not a terminal: plain lines
    with Progress("import", "archives", stream=shown) as progress:
        first = await _import(target, exported, {signing_key.fingerprint}, progress)
    assert (first.archives, first.already_present) == (2, 0)
    lines = shown.getvalue().splitlines()
    assert lines[0] == f"import: unpacking {exported}"
    assert [line.split(",")[0] for line in lines[1:3]] == ["import: 1/2 archives", "import: 2/2 archives"]
    assert lines[3:5] == [
        "import: verifying 1 provider archives and 1 modules",
        f"import: adding 2 archives and {first.entries} metadata entries to the data dir",
    ]
    assert re.fullmatch(rf"import: done: 2 archives, {first.bytes} bytes in \d+\.\ds", lines[5]), lines
    assert first.signing_keys == {signing_key.fingerprint}
    again = await _import(target, exported, {signing_key.fingerprint})
    assert (again.archives, again.already_present) == (0, 2)
    await registry.stop()
    async with serve_proxy(make_local_settings(data_dir=target, offline=True), client_ssl) as offline:
        status, _, data = await offline.get(ARCHIVE)
        assert status == 200 and data == registry.releases[("acme", "foo")]["1.0.0"].zips["linux_amd64"]
        _, doc = await offline.json(f"/mirror/v1/{PROVIDER}/1.0.0.json")
        assert any(h.startswith("h1:") for h in doc["archives"]["linux_amd64"]["hashes"])
        status, _, data = await offline.get(MODULE_ARCHIVE)
        assert status == 200 and data == registry.static["net.tar.gz"]


async def test_import_replaces_a_corrupt_stored_copy_instead_of_counting_it_present(
    exported, registry, tmp_path, signing_key
):
    target = tmp_path / "b"
    await _import(target, exported, {signing_key.fingerprint})
    release = registry.releases[("acme", "foo")]["1.0.0"]
    sha = release.sha256("linux_amd64")
    stored = target / "archives" / "sha256" / sha[:2] / sha[2:4] / sha
    stored.write_bytes(b"not the archive")
    again = await _import(target, exported, {signing_key.fingerprint})
    assert (again.archives, again.already_present, again.replaced_corrupt) == (1, 1, 1)
    assert stored.read_bytes() == release.zips["linux_amd64"]
    assert [p.name.split("-")[0] for p in (target / "archives" / "quarantine").iterdir()] == [sha]


def _rewrite_bundle(source, target, change):
    import zstandard

    with open(source, "rb") as handle, zstandard.ZstdDecompressor().stream_reader(handle) as raw:
        members = []
        with tarfile.open(fileobj=raw, mode="r|") as tar:
            for member in tar:
                members.append((member, tar.extractfile(member).read()))
    with open(target, "wb") as out, tarfile.open(fileobj=out, mode="w") as tar:
        for member, data in members:
            data = change(member.name, data)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))


async def test_bundle_signed_by_an_untrusted_key_is_rejected(exported, tmp_path, other_key, signing_key):
    with pytest.raises(CommandError, match=f"signed by key {signing_key.fingerprint}, which is not trusted"):
        await _import(tmp_path / "u", exported, {other_key.fingerprint})
    assert not (tmp_path / "u" / "archives" / "sha256").exists() or not any(
        p.is_file() for p in (tmp_path / "u" / "archives" / "sha256").rglob("*")
    )


async def test_imported_version_lists_arrive_stale(exported, tmp_path):
    from proxy.metadata_store import CacheEntry

    await _import(tmp_path / "s", exported)
    cache, _ = await _stores(tmp_path / "s")
    try:
        entry = CacheEntry.decode(await cache.get(f"versions:{PROVIDER}"))
        discovery = CacheEntry.decode(await cache.get(f"discovery:{REGISTRY_HOST}"))
    finally:
        await cache.close()
    assert entry.fetched_at == 0.0 and discovery.fetched_at == 0.0


def _rewrite_metadata(source, target, change_item):
    """Copy a bundle, passing each metadata.jsonl item (a dict) through `change_item`."""
    import json

    def change(name, data):
        if name != "metadata.jsonl":
            return data
        items = [change_item(json.loads(line)) for line in data.decode().splitlines()]
        return ("\n".join(json.dumps(item) for item in items) + "\n").encode()

    _rewrite_bundle(source, target, change)


async def test_tampered_bundle_archive_is_rejected_naming_it(exported, tmp_path):
    def flip(name, data):
        return data[:-1] + bytes([data[-1] ^ 1]) if name.startswith("archives/") and data[:2] == b"PK" else data

    tampered = tmp_path / "tampered.tar"
    _rewrite_bundle(exported, tampered, flip)
    with pytest.raises(CommandError, match=r"archives/[0-9a-f]{64} was modified"):
        await _import(tmp_path / "c", tampered)
    assert not [p for p in (tmp_path / "c" / "archives" / "sha256").rglob("*") if p.is_file()]


async def test_bundle_with_planted_metadata_is_rejected(exported, tmp_path):
    def plant(name, data):
        return (
            data + b'{"key": "download:evil.example/x/y/1.0.0/linux_amd64", "value": "e30="}\n'
            if name == "metadata.jsonl"
            else data
        )

    planted = tmp_path / "planted.tar"
    _rewrite_bundle(exported, planted, plant)
    with pytest.raises(CommandError, match="belongs to no archive"):
        await _import(tmp_path / "d", planted)


@pytest.mark.parametrize(
    ("member", "content", "reason"),
    [
        ("manifest.json", b"[" * 200_000, "manifest.json is nested deeper than 64 levels"),
        ("metadata.jsonl", b"[" * 200_000 + b"\n", "metadata line 1 is nested deeper than 64 levels"),
        ("metadata.jsonl", b"[]\n", "metadata line 1 has an unknown key"),
        ("metadata.jsonl", b'{"key": "versions:r/a/b"}\n', "metadata line 1 has no value"),
        ("manifest.json", b'{"format": "registry-proxy-bundle", "version": 1, "providers": [1]}', "'providers'"),
    ],
)
async def test_bundle_with_malformed_json_is_rejected_naming_the_problem(exported, tmp_path, member, content, reason):
    broken = tmp_path / "broken.tar"
    _rewrite_bundle(exported, broken, lambda name, data: content if name == member else data)
    with pytest.raises(CommandError, match=re.escape(reason)):
        await _import(tmp_path / "j", broken)


async def test_bundle_with_a_forged_signature_is_rejected(exported, tmp_path, other_key):
    import base64
    import json

    def forge(item):
        if item["key"].startswith("sums:"):
            record = json.loads(base64.b64decode(item["value"]))
            record["data"]["signature"] = other_key.sign(bytes.fromhex(record["data"]["sums"])).hex()
            item["value"] = base64.b64encode(json.dumps(record).encode()).decode()
        return item

    forged = tmp_path / "forged.tar"
    _rewrite_metadata(exported, forged, forge)
    with pytest.raises(CommandError, match=r"terraform-provider-foo_1\.0\.0_linux_amd64\.zip .* signature"):
        await _import(tmp_path / "e", forged)


async def test_export_only_filters_and_empty_export_fails(exported, tmp_path):
    source = tmp_path / "a"
    shown = io.StringIO()  # not a terminal: plain lines
    with Progress("export", "archives", stream=shown) as progress:
        report = await _export(source, tmp_path / "only.tar.gz", only=[f"{PROVIDER}@1.0.0"], progress=progress)
    assert (len(report.providers), len(report.modules)) == (1, 0)
    lines = shown.getvalue().splitlines()
    assert re.fullmatch(r"export: read \d+ metadata entries", lines[0]), lines
    assert lines[1:3] == [
        f"export: writing 1 archives and {report.entries} metadata entries to {tmp_path / 'only.tar.gz'}",
        f"export: 1/1 archives, {report.bytes} bytes",
    ]
    assert re.fullmatch(rf"export: done: 1 archives, {report.bytes} bytes in \d+\.\ds", lines[3]), lines
    with pytest.raises(CommandError, match="nothing to export"):
        await _export(source, tmp_path / "none.tar", only=["registry.example.test/acme/nothing"])


async def test_bundle_with_altered_metadata_of_another_platform_is_rejected(exported, tmp_path):
    import base64
    import json

    from proxy.metadata_store import CacheEntry

    def alter(item):
        if item["key"].startswith("download:") and item["key"].endswith("darwin_arm64"):
            entry = CacheEntry.decode(base64.b64decode(item["value"]))
            document = json.loads(entry.body)
            document["shasum"] = "0" * 64
            altered = CacheEntry(200, json.dumps(document).encode(), entry.url, entry.fetched_at)
            item["value"] = base64.b64encode(altered.encode()).decode()
        return item

    altered = tmp_path / "altered.tar"
    _rewrite_metadata(exported, altered, alter)
    with pytest.raises(CommandError, match=r"darwin_arm64.*registry's shasum"):
        await _import(tmp_path / "f", altered)
