"""`registry-proxy doctor` against real parts: the fake registry over HTTPS (trustme), a real redis-server, moto's
S3 server, a proxy serving in this process. Every check passes on a healthy setup, and each fails on purpose on a
broken one: a certificate from a CA the proxy does not trust (its issuer named), an upstream down and one that
hangs, Redis evicting `allkeys-lru` without persistence under a min-age rule, another fleet's secret, an
unwritable data dir, broken policy/tokens/issuers files, a damaged embedded file, a skewed clock (the time source
injected), a proxy at --url that is down.

The checks run in this process (`run_doctor` with Settings); the command line's wiring (serve's options,
variables, --json, exit codes) through `main` in this process, and once as a real process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trustme
from yarl import URL

from proxy.cli import main
from proxy.commands import doctor
from proxy.commands.doctor import run_doctor
from proxy.commands.doctor_report import FAILED, OK, WARNING, Finding
from proxy.identity.tokens import new_token, token_entry
from proxy.metadata_store.factory import open_metadata
from proxy.metadata_store.keys import FLEET_SECRET
from proxy.settings.config import Settings, SpaceFloor
from tests.conftest import serve_proxy
from tests.fakes import ports
from tests.fakes.process import REGISTRY_HOST, REPO_ROOT, child_environment, wait_for
from tests.fakes.redis_server import METADATA_SECRET, RedisServer, free_port
from tests.fakes.registry import FakeRegistry

MIN_AGE = '[[rule]]\nname = "cooldown"\nproviders = ["*/*/*"]\nmin-age = "72h"\n'
ISSUERS = (
    '[issuers.ci]\nurl = "https://issuer.example"\naudiences = ["https://proxy.example"]\nleeway = "60s"\n'
    '[[issuers.ci.rules]]\nclaims = { repository_owner = "acme" }\nhosts = ["*"]\n'
)
OTHER_SECRET = "another-fleet-secret-0123456789abcdef"
WRONG_CA_HOST, DOWN_HOST, HUNG_HOST = "wrong-ca.example.test", "down.example.test", "hung.example.test"


@pytest.fixture(scope="module")
def durable_redis(tmp_path_factory) -> RedisServer:
    """A redis-server that persists (AOF): what a fleet with a min-age rule wants."""
    server = RedisServer(tmp_path_factory.mktemp("doctor-redis"), options=["--appendonly", "yes"])
    server.start()
    yield server
    server.stop()


def aof_written(redis) -> bool:
    """No AOF rewrite running or scheduled."""
    persistence = redis.info("persistence")
    return not persistence["aof_rewrite_in_progress"] and not persistence["aof_rewrite_scheduled"]


def by_check(findings: list[Finding]) -> dict[str, Finding]:
    assert len({finding.check for finding in findings}) == len(findings), findings
    return {finding.check: finding for finding in findings}


def files(folder: Path, **texts: str) -> dict[str, Path]:
    """`name=text` written to FOLDER/name, by name."""
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, text in texts.items():
        written[name] = folder / name
        written[name].write_text(text)
    return written


def tokens_file() -> str:
    return token_entry("ci", new_token(), ["*"], None, lock=False, metrics=False, admin=False)


async def test_a_single_proxy_on_its_data_dir_passes_every_check(tmp_path, registry, ca_file, client_ssl):
    """Embedded store, local archives, one upstream, and the proxy itself running (--url)."""
    settings = Settings(
        data_dir=tmp_path / "data",
        allowed_hosts=frozenset(),
        upstream_map={REGISTRY_HOST: URL(registry.url)},
        upstream_ca_file=ca_file,
        plain_http=True,
    )
    async with serve_proxy(settings, client_ssl) as proxy:
        found = by_check(await run_doctor(settings, url=proxy.url))
    assert {name: finding.status for name, finding in found.items()} == dict.fromkeys(
        [
            "policy",
            "auth-tokens",
            "oidc-issuers",
            "data-dir",
            "disk-space",
            "archive-store",
            "metadata-store",
            "fleet-secret",
            f"upstream:{REGISTRY_HOST}",
            "clock",
            "proxy-ready",
            "proxy-discovery",
        ],
        OK,
    ), found
    assert "whole" in found["metadata-store"].detail  # the proxy made the file; SQLite's quick_check passed
    assert "put, read back and deleted" in found["archive-store"].detail
    assert not list((tmp_path / "data" / "archives" / "sha256").iterdir())  # the probe left nothing behind
    assert "providers.v1, modules.v1" in found[f"upstream:{REGISTRY_HOST}"].detail
    assert found["proxy-ready"].detail.startswith("ready:")


async def test_a_fleet_on_redis_with_every_file_passes_every_check(tmp_path, registry, ca_file, durable_redis):
    """Redis that persists under a min-age rule, tokens and OIDC issuers; the fleet's marker is only read: a
    doctor never writes one (its secret is the one being diagnosed)."""
    paths = files(tmp_path / "etc", policy=MIN_AGE, tokens=tokens_file(), issuers=ISSUERS)
    settings = Settings(
        data_dir=tmp_path / "data",
        allowed_hosts=frozenset(),
        upstream_map={REGISTRY_HOST: URL(registry.url)},
        upstream_ca_file=ca_file,
        redis_url=durable_redis.url,
        redis_prefix="doctor-healthy",
        metadata_secret=METADATA_SECRET,
        policy_file=paths["policy"],
        auth_tokens=paths["tokens"],
        oidc_issuers=paths["issuers"],
    )
    found = by_check(await run_doctor(settings))
    assert found["fleet-secret"] == Finding(OK, "fleet-secret", found["fleet-secret"].detail)
    assert "no marker yet" in found["fleet-secret"].detail
    assert durable_redis.client().get(f"doctor-healthy:{FLEET_SECRET}") is None  # nothing written

    store, _, _ = await open_metadata(settings)  # a replica starts: it writes the marker
    await store.require_fleet()
    await store.close()
    found = by_check(await run_doctor(settings))
    assert [finding for finding in found.values() if finding.status != OK] == []
    assert "opens with this proxy's metadata secret" in found["fleet-secret"].detail
    assert "appendonly 'yes'" in found["redis-durability"].detail
    assert found["policy"].detail.endswith("1 rule, 1 with a min-age")
    assert found["auth-tokens"].detail.endswith("1 token") and found["oidc-issuers"].detail.endswith("1 issuer")
    assert "leeway 60s" in found["clock"].detail  # the issuers file's own


async def test_the_archive_store_probe_puts_reads_and_deletes_an_object_in_s3(tmp_path, s3_server, s3_bucket):
    settings = Settings(data_dir=tmp_path / "data", offline=True, **s3_server.settings(s3_bucket))
    found = by_check(await run_doctor(settings))
    assert found["archive-store"].status == OK, found
    assert f"s3://{s3_bucket}/archives/: a probe object put, read back and deleted" in found["archive-store"].detail
    assert s3_server.keys(s3_bucket) == []  # the probe object is gone

    missing = Settings(data_dir=tmp_path / "data", offline=True, **s3_server.settings(s3_bucket + "-gone"))
    found = by_check(await run_doctor(missing))
    assert found["archive-store"].status == FAILED and "not reachable" in found["archive-store"].detail
    assert "--s3-endpoint-url" in found["archive-store"].fix


@contextlib.asynccontextmanager
async def hung_server():
    """A TCP port that accepts connections and never says a word (no TLS handshake either)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in held:
            writer.close()
        server.close()


async def test_a_broken_fleet_fails_each_check_with_its_fix(tmp_path, registry, ca_file, durable_redis, signing_key):
    """One setup broken every way a fleet's can be at once, each check answering within its bound."""
    other_ca = trustme.CA(organization_name="Corp Internal")
    untrusted = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    other_ca.issue_cert("127.0.0.1").configure_cert(untrusted)
    wrong_ca = FakeRegistry(untrusted)
    await wrong_ca.start()
    redis = durable_redis.client()
    redis.config_set("appendonly", "no")
    redis.config_set("maxmemory-policy", "allkeys-lru")
    paths = files(tmp_path / "etc", policy=MIN_AGE, tokens="[tokens.ci]\nhash = 'sha256:nope'\n", issuers=ISSUERS)
    common = dict(redis_url=durable_redis.url, redis_prefix="doctor-broken", data_dir=Path("/sys"))
    try:
        other_fleet, _, _ = await open_metadata(Settings(**common, metadata_secret=OTHER_SECRET))
        await other_fleet.require_fleet()  # the marker of a fleet with another secret
        await other_fleet.close()
        async with hung_server() as hung_port:
            with ports.refused_port() as down_port, ports.refused_port() as proxy_port:
                settings = Settings(
                    **common,
                    metadata_secret=METADATA_SECRET,
                    allowed_hosts=frozenset(),
                    upstream_map={
                        REGISTRY_HOST: URL(registry.url),
                        WRONG_CA_HOST: URL(wrong_ca.url),
                        DOWN_HOST: URL(f"https://127.0.0.1:{down_port}"),
                        HUNG_HOST: URL(f"https://127.0.0.1:{hung_port}"),
                    },
                    upstream_ca_file=ca_file,
                    policy_file=paths["policy"],
                    auth_tokens=paths["tokens"],
                    oidc_issuers=paths["issuers"],
                )
                started = time.monotonic()
                found = by_check(
                    await run_doctor(
                        settings,
                        url=f"https://127.0.0.1:{proxy_port}/",
                        clock=lambda: time.time() + 3600,  # this host an hour fast
                        timeout=1.0,
                    )
                )
                took = time.monotonic() - started
    finally:
        redis.config_set("appendonly", "yes")
        redis.config_set("maxmemory-policy", "noeviction")
        await wrong_ca.stop()
        # AOF turned on writes its first file in the background, and until it is written Redis refuses to stop
        # ("Writing initial AOF, can't exit"): the module's server would outlast its stop's bound on a loaded disk.
        await wait_for(lambda: aof_written(redis), 20, "the initial AOF")
    assert took < 3, took  # the hung upstream is bounded
    status = {name: finding.status for name, finding in found.items()}
    assert status == {
        "policy": OK,
        "auth-tokens": FAILED,
        "oidc-issuers": OK,
        "data-dir": FAILED,
        "disk-space": FAILED,
        "archive-store": FAILED,
        "metadata-store": OK,
        "redis-durability": WARNING,
        "fleet-secret": FAILED,
        f"upstream:{REGISTRY_HOST}": OK,
        f"upstream:{WRONG_CA_HOST}": FAILED,
        f"upstream:{DOWN_HOST}": FAILED,
        f"upstream:{HUNG_HOST}": FAILED,
        "clock": FAILED,
        "proxy-ready": FAILED,
    }, found
    wrong = found[f"upstream:{WRONG_CA_HOST}"]
    assert "O=Corp Internal" in wrong.detail and "issued by" in wrong.detail
    assert wrong.fix == f"trust that CA: add its certificate (PEM) to --upstream-ca-file ({ca_file} does not hold it)"
    assert "cannot connect" in found[f"upstream:{DOWN_HOST}"].detail
    assert "timed out" in found[f"upstream:{HUNG_HOST}"].detail
    assert f"--auth-tokens {paths['tokens']}" in found["auth-tokens"].detail
    assert "not writable by this user" in found["data-dir"].detail
    assert "below --min-free-space" in found["disk-space"].detail
    durability = found["redis-durability"]
    assert "allkeys-lru" in durability.detail and "persists nothing" in durability.detail
    assert "min-age rule" in durability.detail and "appendonly yes" in durability.fix
    assert found["fleet-secret"].detail.startswith("--metadata-secret differs from the fleet's in redis://127.0.0.1")
    assert "3600s ahead of" in found["clock"].detail and "leeway 60s" in found["clock"].detail
    assert "NTP" in found["clock"].fix
    assert "cannot connect to the proxy" in found["proxy-ready"].detail


async def test_a_damaged_embedded_store_and_broken_files_each_fail(tmp_path):
    """The embedded file is checked read-only (serve moves a damaged one aside, the doctor leaves it); a policy
    or issuers file that does not parse names its key; a --max-store-size the disk cannot hold is a warning."""
    data = tmp_path / "data"
    (data / "metadata").mkdir(parents=True)
    damaged = data / "metadata" / "metadata.sqlite"
    damaged.write_bytes(b"this is no database, not even a small one" * 100)
    paths = files(tmp_path / "etc", policy='[[rule]]\nname = "x"\nprovidres = ["*/*/*"]\n', issuers="[issuers.ci]\n")
    settings = Settings(
        data_dir=data,
        offline=True,
        policy_file=paths["policy"],
        oidc_issuers=paths["issuers"],
        max_store_size=2**60,
    )
    found = by_check(await run_doctor(settings))
    assert {name: finding.status for name, finding in found.items() if finding.status != OK} == {
        "policy": FAILED,
        "oidc-issuers": FAILED,
        "disk-space": WARNING,
        "metadata-store": FAILED,
    }
    assert "providres" in found["policy"].detail
    assert f"--oidc-issuers {paths['issuers']}" in found["oidc-issuers"].detail
    assert "is damaged" in found["metadata-store"].detail and "moves it aside" in found["metadata-store"].fix
    assert damaged.read_bytes().startswith(b"this is no database")  # left where it is
    assert "floor, not the cap" in found["disk-space"].detail

    found = by_check(await run_doctor(Settings(data_dir=data, offline=True, min_free_space=SpaceFloor(2**62))))
    assert found["disk-space"].status == FAILED and "below --min-free-space" in found["disk-space"].detail


def test_the_command_takes_serves_options_and_exits_by_the_worst_check(tmp_path, monkeypatch, capsys):
    """Through `main`, as the command line runs it: serve's flags, variables and --config; 0, 2; --json."""
    for name in [name for name in os.environ if name.startswith("REGISTRY_PROXY_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(doctor, "setup_logging", lambda *_: None)  # the process's logging is the tests'
    config = tmp_path / "serve.toml"
    config.write_text(f'data-dir = "{tmp_path / "data"}"\noffline = true\n')
    assert main(["doctor", "--config", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ok", "configuration", "serve's", "options", "parse", "(flags,", *lines[0].split()[6:]]
    assert all(line.startswith("ok ") for line in lines) and any("--offline" in line for line in lines)

    monkeypatch.setenv("REGISTRY_PROXY_MAX_STORE_SIZE", "0")  # a serve option's variable, refused
    assert main(["doctor", "--config", str(config), "--json"]) == 2
    [only] = json.loads(capsys.readouterr().out)
    assert only["status"] == FAILED and only["check"] == "configuration"
    assert "--max-store-size '0' (from REGISTRY_PROXY_MAX_STORE_SIZE)" in only["detail"]

    monkeypatch.setenv("REGISTRY_PROXY_NO_SUCH_THING", "1")  # refused while the arguments are parsed
    assert main(["doctor", "--json"]) == 2
    [only] = json.loads(capsys.readouterr().out)
    assert only["check"] == "configuration" and "REGISTRY_PROXY_NO_SUCH_THING" in only["detail"]


@pytest.mark.process
def test_the_real_command_prints_one_line_per_check_and_exits_2_on_a_failure(tmp_path):
    closed = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy",
            "doctor",
            "--data-dir",
            str(tmp_path / "data"),
            "--allow-host",
            "registry.corp.example",
            "--upstream-map",
            f"registry.corp.example={closed}",
        ],
        cwd=REPO_ROOT,
        env={name: value for name, value in child_environment().items() if not name.startswith("REGISTRY_PROXY_")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["ok", "configuration"],
        ["ok", "policy"],
        ["ok", "auth-tokens"],
        ["ok", "oidc-issuers"],
        ["ok", "data-dir"],
        ["ok", "disk-space"],
        ["ok", "archive-store"],
        ["ok", "metadata-store"],
        ["failed", "upstream:registry.corp.example"],
        ["warning", "clock"],
    ]
    assert "cannot connect to 127.0.0.1" in lines[8] and " — check that it is reachable from here" in lines[8]
