"""Shared fixtures: real GPG keys, a test CA, the fake HTTPS registry, and proxy factories."""

from __future__ import annotations

import contextlib
import functools
import ssl
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import redis
import trustme
from aiohttp import web
from yarl import URL

from proxy.settings.config import Settings
from proxy.upstream.client import create_ssl_context
from proxy.web import app as proxy_app
from proxy.web.aiohttp_internals import put_in_front
from proxy.web.app import create_app
from tests.fakes import ports
from tests.fakes.children import ProcessMarkCheck
from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST, ProxyProcess
from tests.fakes.redis_server import METADATA_SECRET, ClusterSetup, RedisServer, SentinelSetup, Tls
from tests.fakes.registry import FakeRegistry
from tests.fakes.s3_server import (
    CREDENTIALS,
    ENV_BUCKET,
    ENV_CA,
    ENV_ENDPOINT,
    S3Server,
    sessions_sharing_one_loader,
)
from tests.fakes.served_in_process import ServedInProcess, captured_logs
from tests.fakes.signing import SigningKey

PROVIDER = f"{REGISTRY_HOST}/acme/foo"
# Tests that use these fixtures, or live in these folders, start child processes: marked `process`
# here (a test that starts one some other way carries the mark itself; `ProcessMarkCheck` fails one that
# does not). tests/deploy runs the tools that check the examples (kubectl, promtool, systemd-analyze, nginx).
PROCESS_FIXTURES = frozenset({"proxy_process", "terraform"})
PROCESS_FOLDERS = frozenset({"e2e", "browser", "deploy"})
# Modules of those folders that start nothing unless a test says so (Helm's engine runs in this process, by ctypes)
IN_PROCESS_MODULES = frozenset({"test_helm_chart.py"})


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked `one_metadata_store` runs over the embedded store only: its own parametrization of
    `metadata_backend` (a mark, which takes precedence over the fixture's two stores)."""
    if "metadata_backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker("one_metadata_store"):
        metafunc.definition.add_marker(pytest.mark.parametrize("metadata_backend", ["embedded"], indirect=True))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        in_folder = item.path.parent.name in PROCESS_FOLDERS and item.path.name not in IN_PROCESS_MODULES
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())) or in_folder:
            item.add_marker(pytest.mark.process)


def pytest_configure(config: pytest.Config) -> None:
    # registered as a plugin, not hooks of this conftest: those are not called for session fixtures
    config.pluginmanager.register(ProcessMarkCheck(), "process-mark-check")


@pytest.fixture(autouse=True, scope="session")
def _upstream_trust_read_once() -> Iterator[None]:
    """Each application made in a test's process reads the system's trust store for its upstream session
    (`create_ssl_context`: about 25 ms of CPU, in hundreds of starts of the application per run). Here
    the context is made once per CA file (its path and its state on disk, so a rewritten file is read again)
    and shared, as the one application of a `serve` process would have it; a CA file that fails to load still
    fails at every start. Processes the tests start make their own."""

    @functools.cache
    def made(extra_ca_file: Path | None, state: tuple[int, int, int] | None) -> ssl.SSLContext:
        return create_ssl_context(extra_ca_file)

    def shared(extra_ca_file: Path | None) -> ssl.SSLContext:
        if extra_ca_file is None:
            return made(None, None)
        try:
            state = extra_ca_file.stat()
        except OSError:
            return create_ssl_context(extra_ca_file)  # its error, as the application would meet it
        return made(extra_ca_file, (state.st_ino, state.st_size, state.st_mtime_ns))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(proxy_app, "create_ssl_context", shared)
        yield


@pytest.fixture(scope="session")
def signing_key(tmp_path_factory) -> SigningKey:
    key = SigningKey(tmp_path_factory.mktemp("gpg-signer"), "Acme Release Signer")
    yield key
    key.close()


@pytest.fixture(scope="session")
def other_key(tmp_path_factory) -> SigningKey:
    key = SigningKey(tmp_path_factory.mktemp("gpg-other"), "Someone Else")
    yield key
    key.close()


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def ca_file(ca, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture(scope="session")
def server_cert_files(ca, tmp_path_factory) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1/localhost, for proxies started in tests."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    folder = tmp_path_factory.mktemp("proxy-cert")
    cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(folder / "cert.pem"), append=True)
    cert.private_key_pem.write_to_path(str(folder / "key.pem"))
    return folder / "cert.pem", folder / "key.pem"


@pytest.fixture(scope="session")
def upstream_ssl(ca) -> ssl.SSLContext:
    """The fake upstreams' server context, made once: loading a certificate into a context costs about 2 ms
    of CPU, in hundreds of tests. No test changes it, and no client resumes a TLS session of another test."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    return context


@pytest.fixture
def client_ssl(ca_file) -> ssl.SSLContext:
    """A client context trusting the test CA alone: without a CA file, Python reads the system's whole CA
    store first (about 30 ms of CPU, in hundreds of tests), which no test server needs."""
    return ssl.create_default_context(cafile=str(ca_file))


@pytest.fixture
async def registry(upstream_ssl, signing_key) -> AsyncIterator[FakeRegistry]:
    fake = FakeRegistry(upstream_ssl)
    fake.add(Release("acme", "foo", "1.0.0", signing_key))
    fake.add(Release("acme", "foo", "1.1.0", signing_key))
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory) -> RedisServer:
    """One real redis-server for the session; tests isolate themselves with a key prefix."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory, server_cert_files, ca_file) -> SentinelSetup:
    """Redis under Sentinel for the session (a master, its replica, a sentinel), over TLS with passwords;
    started only by the tests that use it. A test may fail it over: the setup stays whole."""
    setup = SentinelSetup(
        tmp_path_factory.mktemp("sentinel"),
        service="registry-proxy",
        password=uuid.uuid4().hex,
        sentinel_password=uuid.uuid4().hex,
        tls=Tls(*server_cert_files, ca_file),
    )
    setup.start()
    yield setup
    setup.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory, server_cert_files, ca_file) -> ClusterSetup:
    """A Redis Cluster of three masters for the session, over TLS with a password; started only by the tests
    that use it."""
    setup = ClusterSetup(
        tmp_path_factory.mktemp("cluster"), password=uuid.uuid4().hex, tls=Tls(*server_cert_files, ca_file)
    )
    setup.start()
    yield setup
    setup.stop()


@pytest.fixture
def attacker(redis_server) -> redis.Redis:
    """A plain Redis client on the session's server: whoever else can write to the fleet's Redis."""
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def s3_server(server_cert_files, ca_file) -> S3Server:
    """One real S3 API server (moto's server mode, over HTTPS) for the session; tests use a fresh bucket each.

    The dummy AWS credentials go into the environment, where botocore's default chain (of this
    process and of every proxy process a test starts) finds them. The S3 stores opened in this process
    read botocore's models once (`sessions_sharing_one_loader`)."""
    from proxy.storage import s3 as s3_store

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(s3_store, "get_session", sessions_sharing_one_loader())
        for name, value in CREDENTIALS.items():
            patch.setenv(name, value)
        patch.delenv("AWS_PROFILE", raising=False)
        server = S3Server(*server_cert_files, ca_file)
        patch.setenv(ENV_ENDPOINT, server.url)
        patch.setenv(ENV_CA, str(ca_file))
        yield server
        server.stop()


@pytest.fixture
def s3_bucket(s3_server, monkeypatch) -> str:
    """A fresh bucket (also named in the environment, for child processes that open the store)."""
    bucket = s3_server.bucket()
    monkeypatch.setenv(ENV_BUCKET, bucket)
    return bucket


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port where connections are refused for the whole test (no other test can take it)."""
    with ports.refused_port() as port:
        yield port


@pytest.fixture(params=["embedded", "redis"])
def metadata_backend(request) -> str:
    """Runs a test once with the embedded store and once with Redis."""
    return request.param


@pytest.fixture
def backend_settings(metadata_backend, request) -> dict:
    if metadata_backend == "redis":
        server = request.getfixturevalue("redis_server")
        return {
            "redis_url": server.url,
            "redis_prefix": f"test-{uuid.uuid4().hex[:12]}",
            "metadata_secret": METADATA_SECRET,
        }
    return {}


def _settings_factory(tmp_path, registry, ca_file, server_cert_files, backend: dict):
    def make(**overrides) -> Settings:
        values = dict(
            data_dir=tmp_path / "data",
            tls_cert=server_cert_files[0],
            tls_key=server_cert_files[1],
            allowed_hosts=frozenset(),
            upstream_map={REGISTRY_HOST: URL(registry.url)},
            upstream_ca_file=ca_file,
            **backend,
        )
        values.update(overrides)
        return Settings(**values)

    return make


@pytest.fixture
def make_settings(tmp_path, registry, ca_file, server_cert_files, backend_settings):
    """Settings for a proxy in front of the fake registry, once per metadata backend; keywords override."""
    return _settings_factory(tmp_path, registry, ca_file, server_cert_files, backend_settings)


@pytest.fixture
def make_local_settings(tmp_path, registry, ca_file, server_cert_files):
    """Like make_settings, with the embedded store only (for tests about something else than the backend)."""
    return _settings_factory(tmp_path, registry, ca_file, server_cert_files, {})


@dataclass
class RunningProxy:
    url: str
    session: aiohttp.ClientSession
    app: web.Application

    async def get(self, path: str, **kwargs) -> tuple[int, dict, bytes]:
        async with self.session.get(self.url + path, **kwargs) as response:
            return response.status, response.headers.copy(), await response.read()

    async def json(self, path: str) -> tuple[int, object]:
        async with self.session.get(self.url + path) as response:
            return response.status, await response.json(content_type=None)


@contextlib.asynccontextmanager
async def serve_proxy(
    settings: Settings, client_ssl: ssl.SSLContext, *, handler_cancellation: bool = False, middlewares: Iterable = ()
) -> AsyncIterator[RunningProxy]:
    """Run the real application over TLS (or plain HTTP) on a free loopback port.

    `handler_cancellation`: cancel a request's handler when its client goes away (aiohttp's
    option; off by default, as in the real server). `middlewares` go inside the app's own.
    """
    app = create_app(settings)
    app.middlewares.extend(middlewares)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=handler_cancellation)
    await runner.setup()
    put_in_front(runner)  # as `proxy.web.server.serve_app` does: `proxy.web.front_door`
    server_ssl = None
    if not settings.tls.plain_http:
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(str(settings.tls.tls_cert), str(settings.tls.tls_key))
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl)
    await site.start()
    port = runner.addresses[0][1]
    scheme = "http" if settings.tls.plain_http else "https"
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl, force_close=False))
    try:
        yield RunningProxy(f"{scheme}://127.0.0.1:{port}", session, app)
    finally:
        await session.close()
        await runner.cleanup()


@pytest.fixture
async def proxy(make_settings, client_ssl) -> AsyncIterator[RunningProxy]:
    async with serve_proxy(make_settings(), client_ssl) as running:
        yield running


@contextlib.asynccontextmanager
async def _started_proxies(tmp_path: Path, registry: FakeRegistry, ca_file: Path, make) -> AsyncIterator:
    """`start(*flags, data_dir=..., upstream=...)`: a proxy in front of the fake registry, made by
    `make(data_dir, registry_url or None, ca_file, *flags)` and started; every one stopped at the end."""
    started = []

    async def start(*extra: str, data_dir: Path | None = None, upstream: bool = True):
        proxy = make(data_dir or tmp_path / "proxy-data", registry.url if upstream else None, ca_file, *extra)
        await proxy.start()
        started.append(proxy)
        return proxy

    try:
        yield start
    finally:
        for proxy in started:
            await proxy.stop()


@pytest.fixture
async def proxy_process(tmp_path, registry, ca_file) -> AsyncIterator:
    """Start `python -m proxy serve` processes in front of the fake registry; stopped after the test."""
    async with _started_proxies(tmp_path, registry, ca_file, ProxyProcess) as start:
        yield start


@pytest.fixture
async def in_process_proxy(tmp_path, registry, ca_file) -> AsyncIterator:
    """`await in_process_proxy(*flags, data_dir=..., upstream=...)`, as `proxy_process` takes them: `serve` in
    front of the fake registry, served in this process (`tests.fakes.served_in_process`); stopped after the test."""
    with captured_logs() as logs:
        async with _started_proxies(
            tmp_path, registry, ca_file, functools.partial(ServedInProcess, logs=logs)
        ) as start:
            yield start
