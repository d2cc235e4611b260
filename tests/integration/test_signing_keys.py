"""Signing-key continuity through the real application and the fake registry (real gpg keys of its own): a release
signed by a key never seen for its provider is served with a warning (the default), held in hold mode until
`registry-proxy trust accept`, refused by a pin that does not list its key; a provider's record that fails its
seal is a key change, never a first use. Over both metadata stores: the record is what is checked."""

from __future__ import annotations

import json

import pytest
from yarl import URL

from proxy.domain.addresses import Platform, ProviderAddr, Version
from proxy.metadata_store import keys
from proxy.web.app import METADATA_BACKEND
from proxy.web.app_keys import GATEKEEPER, METRICS, SIGNING_KEYS
from tests.conftest import METADATA_SECRET, serve_proxy
from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST, registry_proxy_in_process
from tests.fakes.served_in_process import captured_logs

FOO = f"{REGISTRY_HOST}/acme/foo"
MIRROR = f"/mirror/v1/{FOO}"
FOO_ADDR = ProviderAddr.parse(REGISTRY_HOST, "acme", "foo")


def archive(version: str, platform: str = "linux_amd64") -> str:
    return f"{MIRROR}/{version}/{platform}/terraform-provider-foo_{version}_{platform}.zip"


def audit_events(path, event: str) -> list[dict]:
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == event]


def store_args(settings) -> list[str]:
    """The `trust` command's options for the store `settings` use (as an operator passes serve's)."""
    args = ["--data-dir", str(settings.data_dir), "--audit-log", str(settings.policy.audit_log)]
    if settings.metadata.redis_url:
        args += ["--redis-url", settings.metadata.redis_url, "--redis-prefix", settings.metadata.redis_prefix]
        args += ["--metadata-secret", settings.metadata.metadata_secret]
    return args


@pytest.fixture
def rotated(registry, other_key):
    """acme/foo 1.0.0 and 1.1.0 signed by the session's key; 1.2.0 by another one, listed by its download answer."""
    return registry.add(Release("acme", "foo", "1.2.0", other_key))


@pytest.fixture
def policy(tmp_path):
    def write(text: str):
        path = tmp_path / "policy.toml"
        path.write_text(text)
        return path

    return write


async def test_a_new_key_is_served_and_warned_about_by_default(
    make_settings, client_ssl, tmp_path, rotated, signing_key, other_key
):
    audit = tmp_path / "audit.jsonl"
    settings = make_settings(audit_log=str(audit))
    with captured_logs() as logs:
        async with serve_proxy(settings, client_ssl) as proxy:
            assert (await proxy.get(archive("1.0.0")))[0] == 200  # the first key: trusted on first use
            if settings.metadata.redis_url:  # a record a security decision depends on never expires
                redis = proxy.app[METADATA_BACKEND].inner
                assert await redis.client.ttl(redis.key(keys.signing_keys(FOO_ADDR))) == -1
            assert not [e for e in logs if e["event"] == "security.signing_key_changed"]
            assert (await proxy.get(archive("1.2.0")))[0] == 200
            assert (await proxy.get(archive("1.2.0", "darwin_arm64")))[0] == 200  # one release, one change
            assert (await proxy.get(archive("1.1.0")))[0] == 200  # the old key stays known
            _, _, page = await proxy.get("/")
            metrics = proxy.app[METRICS].exposition().decode()
    changed = [e for e in logs if e["event"] == "security.signing_key_changed"]
    assert len(changed) == 1 and changed[0]["log_level"] == "warning"
    assert (changed[0]["old_keys"], changed[0]["new_key"], changed[0]["decision"]) == (
        [signing_key.key_id],
        other_key.key_id,
        "warn",
    )
    assert f"registry-proxy trust accept {FOO} {other_key.key_id}" in changed[0]["accept"]
    [event] = audit_events(audit, "signing_key_changed")
    assert (event["provider"], event["version"], event["fingerprint"]) == (FOO, "1.2.0", other_key.fingerprint)
    assert 'registry_proxy_signing_key_changes_total{decision="warn"} 1.0' in metrics
    assert b'id="signing-key-changes"' in page and other_key.key_id.encode() in page


async def test_hold_refuses_a_new_key_naming_both_keys_and_the_command_that_accepts_it(
    make_settings, client_ssl, tmp_path, rotated, policy, signing_key, other_key
):
    settings = make_settings(policy_file=policy('key-change = "hold"\n'), audit_log=str(tmp_path / "audit.jsonl"))
    async with serve_proxy(settings, client_ssl) as proxy:
        assert (await proxy.get(archive("1.0.0")))[0] == 200
        for path in (
            archive("1.2.0"),
            f"/registry/{REGISTRY_HOST}/providers/v1/acme/foo/1.2.0/download/linux/amd64/SHA256SUMS",
            f"{MIRROR}/1.2.0.json",
            archive("1.2.0"),  # held every time: nothing of the release was recorded
        ):
            status, _, body = await proxy.get(path)
            document = json.loads(body)
            assert (status, document["code"], document["rule"]) == (403, "signing_key_changed", "key-change"), path
            assert signing_key.key_id in document["reason"] and other_key.key_id in document["reason"]
            assert f"registry-proxy trust accept {FOO} {other_key.key_id}" in document["errors"][0]
        assert (await proxy.get(archive("1.1.0")))[0] == 200  # releases of the known key are not held
        metrics = proxy.app[METRICS].exposition().decode()
    assert 'registry_proxy_signing_key_changes_total{decision="hold"}' in metrics
    code, output = await registry_proxy_in_process("trust", "list", FOO, *store_args(settings))
    assert code == 0 and f"HELD key {other_key.key_id} {other_key.fingerprint}: signed 1.2.0" in output, output
    assert f"key {signing_key.key_id} {signing_key.fingerprint}: seen first with 1.0.0" in output


async def test_trust_accept_records_the_key_on_purpose_and_the_release_is_served(
    make_settings, client_ssl, tmp_path, rotated, policy, other_key
):
    audit = tmp_path / "audit.jsonl"
    settings = make_settings(policy_file=policy('key-change = "hold"\n'), audit_log=str(audit))
    async with serve_proxy(settings, client_ssl) as proxy:
        assert (await proxy.get(archive("1.0.0")))[0] == 200
        assert (await proxy.get(archive("1.2.0")))[0] == 403
        code, output = await registry_proxy_in_process(
            "trust", "accept", FOO, "0" * 16, "--by", "alice", *store_args(settings)
        )
        assert code == 1 and "names no key held or seen" in output and other_key.key_id in output, output
        code, output = await registry_proxy_in_process(
            "trust", "accept", FOO, other_key.key_id.lower(), "--by", "alice", *store_args(settings)
        )
        assert code == 0 and f"accepted key {other_key.key_id} ({other_key.fingerprint})" in output, output
        status, _, _ = await proxy.get(archive("1.2.0"))  # the running proxy reads the record again
        assert status == 200
    [accepted] = audit_events(audit, "signing_key_accepted")
    assert (accepted["provider"], accepted["fingerprint"], accepted["by"]) == (FOO, other_key.fingerprint, "alice")


async def test_a_pin_refuses_any_other_key_naming_the_pin_whatever_key_change_says(
    make_settings, client_ssl, tmp_path, rotated, policy, signing_key, other_key
):
    text = (
        f'key-change = "allow"\n[[pin]]\nname = "acme-releases"\nproviders = ["{REGISTRY_HOST}/acme/*"]\n'
        f'keys = ["{signing_key.fingerprint}"]\n'
    )
    async with serve_proxy(
        make_settings(policy_file=policy(text), audit_log=str(tmp_path / "a.jsonl")), client_ssl
    ) as proxy:
        assert (await proxy.get(archive("1.0.0")))[0] == 200
        status, _, body = await proxy.get(archive("1.2.0"))
        document = json.loads(body)
        assert (status, document["code"], document["rule"]) == (403, "signing_key_not_pinned", "pin acme-releases")
        assert "pin acme-releases" in document["reason"] and other_key.fingerprint in document["reason"]
        assert (await proxy.get(archive("1.1.0")))[0] == 200


@pytest.mark.parametrize("forged", [b"not sealed at all", None])
async def test_a_record_that_fails_its_seal_is_a_key_change_never_a_first_use(
    make_settings, client_ssl, tmp_path, policy, forged
):
    """A forged (unsealed) record, or one sealed for another key (moved), is held in hold mode: the proxy never
    takes it for a provider it has not seen."""
    settings = make_settings(policy_file=policy('key-change = "hold"\n'), audit_log=str(tmp_path / "a.jsonl"))
    with captured_logs() as logs:
        async with serve_proxy(settings, client_ssl) as proxy:
            backend = proxy.app[METADATA_BACKEND]
            record = keys.SIGNING_KEYS.key(host=REGISTRY_HOST, namespace="acme", type="foo")
            if forged is None:  # a genuine record of another provider, moved under this one's key
                other = keys.SIGNING_KEYS.key(host=REGISTRY_HOST, namespace="acme", type="bar")
                await backend.set(other, b"{}")
                forged = await backend.inner.get(other)
            await backend.inner.set(record, forged)
            status, _, body = await proxy.get(archive("1.0.0"))
            assert (status, json.loads(body)["code"]) == (403, "signing_key_changed")
            assert "unreadable record" in json.loads(body)["reason"]
            assert await backend.inner.get(record) == forged  # never rewritten as if the provider were new
            assert (await proxy.app[SIGNING_KEYS].read(FOO_ADDR)).unreadable
    assert [e for e in logs if e["event"] == "security.signing_key_changed" and e["log_level"] == "error"], [
        (e["event"], e.get("log_level"), e.get("level")) for e in logs if "security" in e["event"]
    ]


async def test_with_the_store_unavailable_no_key_is_trusted_on_first_use_in_hold_mode(
    make_local_settings, client_ssl, tmp_path, policy, refused_port
):
    """Redis down answers like a miss: a missing record then cannot tell a provider never seen from a lost record,
    so a key this process does not know already is a key change (held), never a first use."""
    settings = make_local_settings(
        redis_url=f"redis://127.0.0.1:{refused_port}/0",
        metadata_secret=METADATA_SECRET,
        policy_file=policy('key-change = "hold"\n'),
        audit_log=str(tmp_path / "a.jsonl"),
    )
    async with serve_proxy(settings, client_ssl) as proxy:
        status, _, body = await proxy.get(archive("1.0.0"))
    document = json.loads(body)
    assert (status, document["code"]) == (403, "signing_key_changed"), document
    assert "the metadata store is unavailable" in document["reason"]


@pytest.mark.one_metadata_store
async def test_a_pinned_provider_is_not_served_unsigned(make_settings, client_ssl, registry, tmp_path, policy):
    """registry.opentofu.org's releases are admitted without signing keys by default (`--unsigned-providers`): a
    pin on them refuses a release that lists none."""
    registry.signing_keys_override = []
    text = f'[[pin]]\nname = "tofu-acme"\nproviders = ["registry.opentofu.org/acme/*"]\nkeys = ["{"A" * 40}"]\n'
    settings = make_settings(
        upstream_map={"registry.opentofu.org": URL(registry.url)},
        policy_file=policy(text),
        audit_log=str(tmp_path / "a.jsonl"),
    )
    async with serve_proxy(settings, client_ssl) as proxy:
        status, _, body = await proxy.get(
            "/mirror/v1/registry.opentofu.org/acme/foo/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
        )
    document = json.loads(body)
    assert (status, document["code"], document["rule"]) == (403, "signing_key_not_pinned", "pin tofu-acme")
    assert "unsigned" in document["reason"]


@pytest.mark.one_metadata_store
async def test_trust_accept_with_the_store_unavailable_accepts_nothing(refused_port, other_key, tmp_path):
    code, output = await registry_proxy_in_process(
        "trust",
        "accept",
        FOO,
        other_key.fingerprint,
        "--data-dir",
        str(tmp_path / "data"),
        "--redis-url",
        f"redis://127.0.0.1:{refused_port}/0",
        "--metadata-secret",
        METADATA_SECRET,
    )
    assert code == 1 and "the metadata store is unavailable" in output and "nothing was accepted" in output, output


@pytest.mark.one_metadata_store
async def test_a_pinned_providers_stored_archive_whose_signer_is_no_longer_known_is_not_served(
    make_settings, client_ssl, tmp_path, policy, registry, other_key
):
    """A pin added after an archive was stored, and the release's download document lost since (evicted, flushed):
    its signer cannot be checked against the pin from what is cached, so the archive is verified again, never
    served on its record alone; with the upstream down, refused."""
    async with serve_proxy(make_settings(), client_ssl) as proxy:
        assert (await proxy.get(archive("1.0.0")))[0] == 200  # stored, signed by the session's key
    pinned = policy(f'[[pin]]\nname = "other"\nproviders = ["{FOO}"]\nkeys = ["{other_key.fingerprint}"]\n')
    async with serve_proxy(make_settings(policy_file=pinned), client_ssl) as proxy:
        platform = Platform.parse("linux_amd64")
        await proxy.app[METADATA_BACKEND].delete(keys.download(FOO_ADDR, Version.parse("1.0.0"), platform))
        await registry.stop()
        status, _, body = await proxy.get(archive("1.0.0"))
        assert status != 200 and json.loads(body)["errors"], (status, body)


@pytest.mark.one_metadata_store
async def test_a_pin_added_by_a_reload_refuses_releases_recorded_before_it(
    make_settings, client_ssl, tmp_path, policy, signing_key, other_key
):
    path = policy("")
    async with serve_proxy(make_settings(policy_file=path, audit_log=str(tmp_path / "a.jsonl")), client_ssl) as proxy:
        sums = f"/registry/{REGISTRY_HOST}/providers/v1/acme/foo/1.0.0/download/linux/amd64/SHA256SUMS"
        assert (await proxy.get(sums))[0] == 200  # recorded, signed by the session's key
        assert (await proxy.get(archive("1.0.0")))[0] == 200  # stored
        path.write_text(f'[[pin]]\nname = "other"\nproviders = ["{FOO}"]\nkeys = ["{other_key.fingerprint}"]\n')
        proxy.app[GATEKEEPER].reload()  # what SIGHUP does
        for path in (sums, archive("1.0.0"), archive("1.1.0")):  # recorded, stored, new
            status, _, body = await proxy.get(path)
            assert (status, json.loads(body)["code"]) == (403, "signing_key_not_pinned"), path
