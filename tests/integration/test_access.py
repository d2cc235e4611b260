"""Client tokens and private upstreams through the real application: 401/403, scopes, grants, leaks.

A private fake registry requires a bearer token (the proxy's upstream credentials); its archives
are on a separate "CDN" (another origin), which must never see the token. The public fake
registry needs none.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from yarl import URL

from proxy.domain.credentials import UpstreamCredentials
from proxy.errors import HostNotAllowedError
from proxy.identity.tokens import hash_token
from tests.conftest import serve_proxy
from tests.fakes.gitrepo import make_bare_repo
from tests.fakes.packages import MODULE_FILES, Release
from tests.fakes.process import REGISTRY_HOST
from tests.fakes.registry import FakeRegistry, ModuleRelease

PRIVATE = "private.example.test"
UPSTREAM_TOKEN = "upstream-secret-7f3a"
ALL, PUBLIC, OTHER_NS, METRICS = "rpt_all_0001", "rpt_public_0002", "rpt_otherns_0003", "rpt_metrics_0004"
PRIVATE_MIRROR = f"/mirror/v1/{PRIVATE}/acme/foo"
PRIVATE_REGISTRY = f"/registry/{PRIVATE}/providers/v1/acme/foo"
ARCHIVE = f"{PRIVATE_MIRROR}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
TOKENS = f"""
[tokens.all]
hash = "{hash_token(ALL)}"
hosts = ["*"]
lock = true

[tokens.public]
hash = "{hash_token(PUBLIC)}"
hosts = ["{REGISTRY_HOST}"]

[tokens.otherns]
hash = "{hash_token(OTHER_NS)}"
hosts = ["{PRIVATE}"]
namespaces = ["other"]

[tokens.metrics]
hash = "{hash_token(METRICS)}"
hosts = []
metrics = true
"""


def bearer(token: str) -> dict:
    return {"headers": {"Authorization": f"Bearer {token}"}}


@pytest.fixture
async def cdn(upstream_ssl, signing_key):
    fake = FakeRegistry(upstream_ssl, host="localhost")  # another origin than the private registry
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def private(upstream_ssl, signing_key, cdn):
    fake = FakeRegistry(upstream_ssl)
    fake.require_token = UPSTREAM_TOKEN
    for version in ("1.0.0", "1.1.0"):
        release = fake.add(Release("acme", "foo", version, signing_key))
        cdn.add(release)
    fake.files_base = cdn.url
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def tokens_file(tmp_path) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(TOKENS)
    return path


@pytest.fixture
def access_settings(make_settings, registry, private, cdn, tokens_file):
    def make(**overrides):
        mapped = {REGISTRY_HOST: URL(registry.url), PRIVATE: URL(private.url)}
        values = {
            "upstream_map": mapped,
            "auth_tokens": tokens_file,
            "allowed_private_hosts": frozenset({f"localhost:{cdn.port}"}),
            "upstream_credentials": UpstreamCredentials({PRIVATE: UPSTREAM_TOKEN}, mapped),
            **overrides,
        }
        return make_settings(**values)

    return make


@pytest.mark.one_metadata_store
async def test_a_private_upstream_through_the_proxy_with_its_token_only_on_its_own_origin(
    access_settings, client_ssl, private, cdn
):
    release = private.releases[("acme", "foo")]["1.0.0"]
    async with serve_proxy(access_settings(), client_ssl) as proxy:
        status, _, body = await proxy.get(f"{PRIVATE_MIRROR}/index.json", **bearer(ALL))
        assert status == 200 and set(json.loads(body)["versions"]) == {"1.0.0", "1.1.0"}
        status, _, body = await proxy.get(f"{PRIVATE_MIRROR}/1.0.0.json", **bearer(ALL))
        url = json.loads(body)["archives"]["linux_amd64"]["url"]
        assert status == 200 and "?grant=" in url
        # the clients download archives without a token: the grant in the URL is what lets them
        status, _, data = await proxy.get(f"{PRIVATE_MIRROR}/{url}")
        assert (status, data) == (200, release.zips["linux_amd64"])
        status, _, body = await proxy.get(f"{PRIVATE_REGISTRY}/1.0.0/download/linux/amd64", **bearer(ALL))
        document = json.loads(body)
        for name in ("download_url", "shasums_url", "shasums_signature_url"):
            assert "?grant=" in document[name]
        assert (await proxy.get(document["shasums_url"]))[2] == release.shasums
    assert private.with_authorization() == [path for path, _ in private.authorizations]  # every request
    assert {header for _, header in private.authorizations} == {f"Bearer {UPSTREAM_TOKEN}"}
    assert cdn.requests and cdn.with_authorization() == []


@pytest.mark.one_metadata_store
async def test_the_token_is_not_sent_on_a_redirect_to_another_host(access_settings, client_ssl, private, cdn):
    release = private.releases[("acme", "foo")]["1.0.0"]
    private.files_base = private.url  # the registry names itself; its file server redirects to the CDN
    from tests.fakes.registry import Fault

    for path in (
        private.archive_path(release, "linux_amd64"),
        f"/files/acme/foo/1.0.0/{release.shasums_name}",
        f"/files/acme/foo/1.0.0/{release.shasums_name}.sig",
    ):
        private.faults[path] = Fault(status=302, headers={"Location": cdn.url + path})
    async with serve_proxy(access_settings(), client_ssl) as proxy:
        _, _, body = await proxy.get(f"{PRIVATE_MIRROR}/1.0.0.json", **bearer(ALL))
        url = json.loads(body)["archives"]["linux_amd64"]["url"]
        status, _, data = await proxy.get(f"{PRIVATE_MIRROR}/{url}")
        assert (status, data) == (200, release.zips["linux_amd64"])
    assert private.archive_path(release, "linux_amd64") in private.with_authorization()  # its own origin: yes
    assert cdn.count(private.archive_path(release, "linux_amd64")) == 1
    assert cdn.with_authorization() == []  # the redirect's target: never


async def test_nothing_private_leaks_to_anonymous_or_other_scoped_clients_even_when_cached(
    access_settings, client_ssl, private, registry
):
    release = private.releases[("acme", "foo")]["1.0.0"]
    secret_bytes = release.zips["linux_amd64"]
    async with serve_proxy(access_settings(), client_ssl) as proxy:
        _, _, body = await proxy.get(f"{PRIVATE_MIRROR}/1.0.0.json", **bearer(ALL))  # warms the cache
        grant_url = json.loads(body)["archives"]["linux_amd64"]["url"]
        assert (await proxy.get(f"{PRIVATE_MIRROR}/{grant_url}"))[0] == 200
        _, _, public_body = await proxy.get(f"/mirror/v1/{REGISTRY_HOST}/acme/foo/1.0.0.json", **bearer(PUBLIC))
        public_grant = json.loads(public_body)["archives"]["linux_amd64"]["url"].partition("?")[2]
        probes = [
            f"{PRIVATE_MIRROR}/index.json",
            f"{PRIVATE_MIRROR}/1.0.0.json",
            ARCHIVE,
            f"{PRIVATE_REGISTRY}/versions",
            f"{PRIVATE_REGISTRY}/1.0.0/download/linux/amd64",
            f"{PRIVATE_REGISTRY}/1.0.0/download/linux/amd64/SHA256SUMS",
            f"/lock/v1/{PRIVATE}/acme/foo/1.0.0?platform=linux_amd64",
        ]
        for path in probes:
            for who, expected in (
                (None, "token_required"),
                ("rpt_forged", "token_invalid"),
                (PUBLIC, "token_scope"),
                (OTHER_NS, "token_scope"),
            ):
                status, headers, body = await proxy.get(path, **(bearer(who) if who else {}))
                assert (status, json.loads(body)["code"]) == (403 if expected == "token_scope" else 401, expected)
                assert headers["Content-Type"] == "application/json" and secret_bytes not in body
        for who in (None, PUBLIC):
            async with proxy.session.head(proxy.url + ARCHIVE, **(bearer(who) if who else {})) as response:
                assert response.status in (401, 403) and "ETag" not in response.headers
        # a grant for another host (or a made-up one) opens nothing here
        for query in (public_grant, "grant=9999999999.0000", f"grant={grant_url.partition('grant=')[2]}x"):
            status, _, body = await proxy.get(f"{ARCHIVE}?{query}")
            assert status == 401 and secret_bytes not in body
        assert (await proxy.get(f"{ARCHIVE}?{grant_url.partition('?')[2]}"))[2] == secret_bytes
    # the same data dir and cache without client tokens: the private host is refused to everyone
    async with serve_proxy(access_settings(auth_tokens=None), client_ssl) as proxy:
        for path in (f"{PRIVATE_MIRROR}/1.0.0.json", ARCHIVE, f"{ARCHIVE}?{grant_url.partition('?')[2]}"):
            status, _, body = await proxy.get(path, **bearer(ALL))
            assert status == 403 and secret_bytes not in body
            assert json.loads(body) == HostNotAllowedError.for_host(PRIVATE).document()  # as if unknown
        assert (await proxy.get(f"/mirror/v1/{REGISTRY_HOST}/acme/foo/index.json"))[0] == 200  # public: anonymous


@pytest.mark.one_metadata_store
async def test_401_and_403_answers(access_settings, client_ssl):
    async with serve_proxy(access_settings(), client_ssl) as proxy:
        status, headers, body = await proxy.get(f"/mirror/v1/{REGISTRY_HOST}/acme/foo/index.json")
        assert status == 401 and headers["WWW-Authenticate"] == 'Bearer realm="registry-proxy"'
        assert json.loads(body)["code"] == "token_required"
        assert "`Authorization: Bearer TOKEN`" in json.loads(body)["errors"][0]  # the message says what to send
        status, headers, body = await proxy.get(f"/mirror/v1/{REGISTRY_HOST}/acme/foo/index.json", **bearer("nope"))
        assert status == 401 and headers["WWW-Authenticate"] == 'Bearer realm="registry-proxy", error="invalid_token"'
        assert json.loads(body)["code"] == "token_invalid"
        status, headers, body = await proxy.get(
            f"/mirror/v1/{REGISTRY_HOST}/acme/foo/index.json", headers={"Authorization": f"Basic {PUBLIC}"}
        )
        assert (status, json.loads(body)["code"]) == (401, "token_required")
        status, headers, body = await proxy.get(f"{PRIVATE_MIRROR}/index.json", **bearer(PUBLIC))
        assert status == 403 and "WWW-Authenticate" not in headers
        assert json.loads(body) == {"errors": [f"this token may not read {PRIVATE}"], "code": "token_scope"}
        assert (await proxy.get(f"/mirror/v1/{REGISTRY_HOST}/acme/foo/index.json", **bearer(PUBLIC)))[0] == 200
        status, _, body = await proxy.get(
            f"/lock/v1/{REGISTRY_HOST}/acme/foo/1.0.0?platform=linux_amd64", **bearer(PUBLIC)
        )
        assert status == 403 and json.loads(body) == {
            "errors": ["this token may not call /lock/v1"],
            "code": "token_scope",
        }
        status, _, body = await proxy.get(
            f"/lock/v1/{REGISTRY_HOST}/acme/foo/1.0.0?platform=linux_amd64", **bearer(ALL)
        )
        assert status == 200 and json.loads(body)["hashes"]
        for open_path in ("/healthz", "/readyz", "/.well-known/terraform.json", "/metrics"):
            assert (await proxy.get(open_path))[0] == 200, open_path


@pytest.mark.one_metadata_store
async def test_metrics_behind_a_token(access_settings, client_ssl):
    async with serve_proxy(access_settings(metrics_token_required=True), client_ssl) as proxy:
        assert (await proxy.get("/metrics"))[0] == 401
        assert (await proxy.get("/metrics", **bearer(ALL)))[0] == 403
        status, _, body = await proxy.get("/metrics", **bearer(METRICS))
        assert status == 200 and b"registry_proxy" in body
        assert (await proxy.get("/healthz"))[0] == 200


@pytest.mark.one_metadata_store
async def test_anonymous_stays_the_default_without_tokens(make_settings, client_ssl, registry):
    async with serve_proxy(make_settings(), client_ssl) as proxy:
        status, _, body = await proxy.get(f"/mirror/v1/{REGISTRY_HOST}/acme/foo/1.0.0.json")
        assert status == 200 and "grant" not in body.decode()  # documents unchanged for anonymous clients


@pytest.mark.one_metadata_store
async def test_no_token_in_the_log(access_settings, client_ssl):
    with capture_logs() as logs:
        async with serve_proxy(access_settings(), client_ssl) as proxy:
            await proxy.get(f"{PRIVATE_MIRROR}/1.0.0.json", **bearer(ALL))
            await proxy.get(f"{PRIVATE_MIRROR}/index.json", **bearer(PUBLIC))
            await proxy.get(f"{PRIVATE_MIRROR}/index.json", **bearer("rpt_wrong_guess"))
    text = repr(logs)
    assert "request" in text and "auth.refused" in text and "'token': 'public'" in text
    for secret in (ALL, PUBLIC, "rpt_wrong_guess", UPSTREAM_TOKEN, "Bearer", "grant="):
        assert secret not in text


@pytest.mark.one_metadata_store
async def test_a_private_git_module_is_cloned_with_the_hosts_token(access_settings, client_ssl, private, tmp_path):
    bare, _ = make_bare_repo(tmp_path / "repos", "net", MODULE_FILES, "v1.2.0")
    private.git_root = bare.parent
    private.add_module(
        ModuleRelease("acme", "net", "aws", "1.2.0", "git::{base}/git/net.git?ref=v1.2.0", answer="json")
    )
    base = f"/registry/{PRIVATE}/modules/v1/acme/net/aws/1.2.0"
    async with serve_proxy(access_settings(), client_ssl) as proxy:
        status, headers, body = await proxy.get(f"{base}/download", **bearer(ALL))
        location = json.loads(body)["location"]
        assert status == 200 and headers["X-Terraform-Get"] == location and "?grant=" in location
        assert (await proxy.get(location))[0] == 200
        assert (await proxy.get(f"{base}/download", **bearer(PUBLIC)))[0] == 403
        assert (await proxy.get(location.partition("?")[0]))[0] == 401
    git_requests = [header for path, header in private.authorizations if path.startswith("/git/")]
    assert git_requests and any(header and header.startswith("Basic ") for header in git_requests)
    assert UPSTREAM_TOKEN not in location


@pytest.mark.one_metadata_store
async def test_the_lock_and_warm_commands_send_their_token(access_settings, client_ssl, ca_file, tmp_path):
    from proxy.commands import CommandError
    from proxy.commands.lock import run_lock
    from proxy.commands.proxy_api import ProxyClient
    from proxy.commands.warm import run_warm
    from proxy.domain.addresses import Platform

    config = tmp_path / "config"
    config.mkdir()
    (config / "main.tf").write_text(
        f"terraform {{\n  required_providers {{\n    foo = {{\n"
        f'      source = "{PRIVATE}/acme/foo"\n      version = "1.0.0"\n    }}\n  }}\n}}\n'
    )
    linux = [Platform.parse("linux_amd64")]
    async with serve_proxy(access_settings(), client_ssl) as proxy:
        async with ProxyClient(proxy.url, ca_file, token=ALL) as client:
            await run_lock(config, client, linux)
            report = await run_warm(client, linux, directory=config)
        assert f'provider "{PRIVATE}/acme/foo"' in (config / ".terraform.lock.hcl").read_text()
        assert report.failed == {} and len(report.done) == 1
        async with ProxyClient(proxy.url, ca_file, token=PUBLIC) as client:
            with pytest.raises(CommandError, match="may not read"):
                await run_lock(config, client, linux)


async def test_a_public_release_listing_a_private_archives_digest_does_not_get_its_bytes(
    access_settings, client_ssl, private, registry
):
    """An attacker's public release whose signed SHA256SUMS names the digest of a private archive (digests
    are in lock files) but who cannot serve its bytes: the proxy must not hand out the stored private copy."""
    release = private.releases[("acme", "foo")]["1.0.0"]
    secret_bytes = release.zips["linux_amd64"]
    assert registry.releases[("acme", "foo")]["1.0.0"].sha256("linux_amd64") == release.sha256("linux_amd64")
    registry.tampered.add(release.filename("linux_amd64"))  # the attacker does not have the bytes
    public_archive = ARCHIVE.replace(PRIVATE, REGISTRY_HOST)
    async with serve_proxy(access_settings(), client_ssl) as proxy:
        assert (await proxy.get(ARCHIVE, **bearer(ALL)))[2] == secret_bytes  # stored by its content address
        status, _, body = await proxy.get(public_archive, **bearer(PUBLIC))
        assert status == 502 and secret_bytes not in body
        status, _, body = await proxy.get(
            f"/registry/{REGISTRY_HOST}/providers/v1/acme/foo/1.0.0/download/linux/amd64/SHA256SUMS", **bearer(PUBLIC)
        )
        assert status == 200  # the public release's own (verified) SHA256SUMS, fetched from the public registry
    assert registry.count(registry.archive_path(release, "linux_amd64")) == 1


async def test_a_public_document_naming_private_urls_gets_neither_the_token_nor_the_cached_sums(
    access_settings, client_ssl, private, registry, cdn
):
    release = private.releases[("acme", "foo")]["1.0.0"]
    sums_path = f"/files/acme/foo/1.0.0/{release.shasums_name}"
    private.files_base = private.url
    registry.extra_download_fields = {
        "shasums_url": private.url + sums_path,
        "shasums_signature_url": private.url + sums_path + ".sig",
    }
    public_sums = f"/registry/{REGISTRY_HOST}/providers/v1/acme/foo/1.0.0/download/linux/amd64/SHA256SUMS"
    async with serve_proxy(access_settings(), client_ssl) as proxy:
        assert (await proxy.get(f"{PRIVATE_REGISTRY}/1.0.0/download/linux/amd64/SHA256SUMS", **bearer(ALL)))[0] == 200
        status, _, body = await proxy.get(public_sums, **bearer(PUBLIC))
        assert status == 502 and json.loads(body)["errors"]
    tokenless = [path for path, header in private.authorizations if header is None]
    assert tokenless and set(tokenless) <= {sums_path, sums_path + ".sig"}  # asked for the public host: no token


@pytest.fixture
def public_archive(registry, signing_key) -> str:
    """A public provider's archive path (the private host's is ARCHIVE)."""
    registry.add(Release("hashicorp", "null", "3.2.1", signing_key))
    return f"/mirror/v1/{REGISTRY_HOST}/hashicorp/null/3.2.1/linux_amd64/terraform-provider-null_3.2.1_linux_amd64.zip"


async def test_the_page_needs_a_token_and_lists_only_what_the_token_may_read(
    access_settings, client_ssl, public_archive
):
    async with serve_proxy(access_settings(), client_ssl) as proxy:
        assert (await proxy.get(ARCHIVE, **bearer(ALL)))[0] == 200
        assert (await proxy.get(public_archive, **bearer(ALL)))[0] == 200
        status, headers, body = await proxy.get("/")
        assert (
            status == 401 and "Bearer" in headers["WWW-Authenticate"] and json.loads(body)["code"] == "token_required"
        )
        _, _, everything = await proxy.get("/", **bearer(ALL))
        _, _, public_only = await proxy.get("/", **bearer(PUBLIC))
        assert PRIVATE.encode() in everything and b"hashicorp" in everything
        assert b"hashicorp" in public_only
        assert f"{PRIVATE}/acme".encode() not in public_only  # the private host's providers are not listed
        assert (await proxy.get("/ca.pem"))[0] != 401  # the CA certificate is public


async def test_without_client_tokens_the_page_hides_private_hosts(access_settings, client_ssl, public_archive):
    async with serve_proxy(access_settings(), client_ssl) as proxy:
        assert (await proxy.get(ARCHIVE, **bearer(ALL)))[0] == 200
    async with serve_proxy(access_settings(auth_tokens=None), client_ssl) as proxy:
        assert (await proxy.get(public_archive))[0] == 200
        status, _, page = await proxy.get("/")
        assert status == 200 and b"hashicorp" in page  # the same store: the page lists what it holds
        assert f"{PRIVATE}/acme".encode() not in page


async def test_archives_a_client_needed_a_token_or_grant_for_are_not_for_shared_caches(access_settings, client_ssl):
    """`Cache-Control: public` would let a shared cache in front of the proxy hand them to anyone."""
    async with serve_proxy(access_settings(), client_ssl) as proxy:
        _, _, body = await proxy.get(f"{PRIVATE_MIRROR}/1.0.0.json", **bearer(ALL))
        grant_url = json.loads(body)["archives"]["linux_amd64"]["url"]
        for path, auth in (
            (f"{PRIVATE_MIRROR}/{grant_url}", {}),
            (f"{PRIVATE_MIRROR}/{grant_url}", {}),
            (ARCHIVE, bearer(ALL)),
        ):  # cold (relayed), stored, with a token
            status, headers, _ = await proxy.get(path, **auth)
            assert status == 200 and headers["Cache-Control"] == "private, max-age=31536000, immutable"
    public_archive = f"/mirror/v1/{REGISTRY_HOST}/acme/foo/1.0.0/linux_amd64/{ARCHIVE.rpartition('/')[2]}"
    async with serve_proxy(access_settings(auth_tokens=None), client_ssl) as proxy:  # anonymous, public host
        status, headers, _ = await proxy.get(public_archive)
        assert status == 200 and headers["Cache-Control"] == "public, max-age=31536000, immutable"
