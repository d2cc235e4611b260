"""The real CLI's errors: one clear line on stderr, exit code 2 (usage) or 1, never a traceback."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from proxy.cli import main
from tests.conftest import serve_proxy
from tests.fakes.ports import PORT_ATTEMPTS, free_port
from tests.fakes.process import REPO_ROOT, terminate, wait_healthy
from tests.fakes.redis_server import METADATA_SECRET


def _env(**extra: str) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("REGISTRY_PROXY_") and name != "SSL_CERT_FILE"
    }
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(extra)
    return env


def run_cli(*argv: str, cwd: Path, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m proxy ARGV` in `cwd` with only the given REGISTRY_PROXY_* variables."""
    return subprocess.run(
        [sys.executable, "-m", "proxy", *argv],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def main_in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str, cwd: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    """proxy.cli.main(ARGV) in this process, in `cwd`, with only the given REGISTRY_PROXY_* variables."""
    for name in list(os.environ):
        if name.startswith("REGISTRY_PROXY_") or name == "SSL_CERT_FILE":
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, captured.out, captured.err)


def assert_one_line(result: subprocess.CompletedProcess[str], code: int, *phrases: str) -> str:
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("registry-proxy: error: "), lines[0]
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    assert result.returncode == code, result
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "env", "phrases"),
    [
        (
            ["--tls-cert", "missing-cert.pem", "--tls-key", "key.pem"],
            {},
            ["--tls-cert", "missing-cert.pem", "no such file"],
        ),
        (["--upstream-ca-file", "missing-ca.pem"], {}, ["--upstream-ca-file", "missing-ca.pem", "no such file"]),
        (["--metadata-secret-file", "missing-secret"], {}, ["--metadata-secret-file", "missing-secret"]),
        (["--allow-host", "https://registry.example.com"], {}, ["--allow-host", "give a hostname, not a URL"]),
        (["--default-upstream", "https://registry.example.com/"], {}, ["--default-upstream", "not a URL"]),
        (["--allow-private-host", "http://artifacts.internal"], {}, ["--allow-private-host", "not a URL"]),
        (["--upstream-map", "https://reg.example=https://10.0.0.5"], {}, ["--upstream-map", "not a URL"]),
        ([], {"REGISTRY_PROXY_ALLOW_HOST": "registry.example.com,https://other.example"}, ["not a URL"]),
        ([], {"REGISTRY_PROXY_PLAIN_HTTP": "ture"}, ["REGISTRY_PROXY_PLAIN_HTTP", "'ture'", "true or false"]),
        ([], {"REGISTRY_PROXY_OFFLINE": "maybe"}, ["REGISTRY_PROXY_OFFLINE"]),
        (
            ["--tls-hostname", "https://proxy.example.com/"],
            {},
            ["invalid --tls-hostname 'https://proxy.example.com/'", "not a URL", "--tls-hostname proxy.example.com"],
        ),
        (["--tls-hostname", "proxy.example.com:8443"], {}, ["invalid --tls-hostname", "no port"]),
        ([], {"REGISTRY_PROXY_TLS_HOSTNAME": "https://proxy.example.com"}, ["(from REGISTRY_PROXY_TLS_HOSTNAME)"]),
        (["--log-level", "verbose"], {}, ["--log-level", "'verbose'", "debug, info, warning, error"]),
        ([], {"REGISTRY_PROXY_LOG_LEVEL": "loud"}, ["--log-level", "'loud'"]),
        (
            [],
            {"REGISTRY_PROXY_PLAN_HTTP": "1"},
            ["unknown environment variable REGISTRY_PROXY_PLAN_HTTP", "did you mean REGISTRY_PROXY_PLAIN_HTTP?"],
        ),
        ([], {"REGISTRY_PROXY_NONSENSE_XYZZY": "1"}, ["unknown environment variable REGISTRY_PROXY_NONSENSE_XYZZY"]),
    ],
)
def test_serve_configuration_errors(
    tmp_path: Path,
    refused_port: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    env: dict[str, str],
    phrases: list[str],
) -> None:
    """In process (proxy.cli.main, which the `registry-proxy` script calls) for speed; the real
    process is run for one of them below."""
    occupied = ["--listen", f"127.0.0.1:{refused_port}"]  # a mistake let through fails to bind, never serves
    result = main_in_process(
        monkeypatch, capsys, "serve", "--data-dir", str(tmp_path / "data"), *argv, *occupied, cwd=tmp_path, **env
    )
    assert_one_line(result, 2, *phrases)
    assert not (tmp_path / "data" / "tls").exists()  # stopped before anything was made


@pytest.mark.process
def test_serve_configuration_error_from_the_real_process(tmp_path: Path) -> None:
    result = run_cli(
        "serve",
        "--data-dir",
        str(tmp_path / "data"),
        "--allow-host",
        "https://registry.example.com/",
        cwd=tmp_path,
        REGISTRY_PROXY_PLAIN_HTTP="on",
    )
    assert_one_line(result, 2, "--allow-host", "give a hostname, not a URL")


@pytest.mark.parametrize(
    "env",
    [
        {"REGISTRY_PROXY_PLAIN_HTTP": "false"},
        {"REGISTRY_PROXY_OFFLINE": "Yes"},
        {"REGISTRY_PROXY_PLAIN_HTTP": ""},
        {"REGISTRY_PROXY_LOG_LEVEL": "WARNING"},
    ],
)
def test_valid_env_booleans_and_levels_are_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], env: dict[str, str]
) -> None:
    """The checks refuse only what is wrong: these all get past configuration (to the missing file)."""
    result = main_in_process(
        monkeypatch,
        capsys,
        "serve",
        "--data-dir",
        str(tmp_path),
        "--upstream-ca-file",
        "missing-ca.pem",
        cwd=tmp_path,
        **env,
    )
    assert_one_line(result, 2, "missing-ca.pem")


def test_export_refuses_an_unknown_suffix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["export", "--data-dir", str(tmp_path / "data"), "--out", "bundle.zip"]
    result = main_in_process(monkeypatch, capsys, *argv, cwd=tmp_path)
    assert_one_line(result, 2, "bundle.zip", "NAME.tar", "NAME.tar.gz", "NAME.tar.zst")
    assert not (tmp_path / "data").exists()  # refused before the stores were opened
    assert not list(tmp_path.glob("*bundle*"))


NOT_PEM = "not-pem.txt"  # in each test's directory: a file that holds no certificate
A_FILE = "a-file"
PATH_MISTAKES = [
    (
        ["serve", "--upstream-ca-file", NOT_PEM],
        {},
        [f"invalid --upstream-ca-file '{NOT_PEM}': not a file of PEM certificates", "BEGIN CERTIFICATE"],
    ),
    (
        ["serve"],
        {"REGISTRY_PROXY_UPSTREAM_CA_FILE": NOT_PEM},
        ["(from REGISTRY_PROXY_UPSTREAM_CA_FILE)", "not a file of PEM"],
    ),
    (["serve", "--config", "config.toml"], {}, ["(from 'upstream-ca-file' in config file config.toml)", "PEM"]),
    (["serve", "--s3-ca-file", NOT_PEM, "--archive-store", "s3://bucket/p"], {}, ["invalid --s3-ca-file", "PEM"]),
    (["serve", "--tls-cert", NOT_PEM, "--tls-key", NOT_PEM], {}, ["--tls-cert", NOT_PEM, "not a matching PEM"]),
    (["serve", "--data-dir", A_FILE], {}, [f"invalid --data-dir '{A_FILE}': not a directory (a file is there)"]),
    (["serve", "--data-dir", f"{A_FILE}/data"], {}, ["invalid --data-dir", f"{A_FILE} is a file, not a directory"]),
    (
        ["serve", "--data-dir", "/proc/registry-proxy"],
        {},
        ["invalid --data-dir '/proc/registry-proxy': is under /proc"],
    ),
    (["serve", "--audit-log", "logs/audit.jsonl"], {}, ["invalid --audit-log 'logs/audit.jsonl'", "no such directory"]),
    (["serve", "--audit-log", "."], {}, ["invalid --audit-log '.': is a directory", "or stdout"]),
    (["gc", "--data-dir", A_FILE], {}, [f"invalid --data-dir '{A_FILE}': not a directory"]),
    (["verify", "--data-dir", A_FILE], {}, [f"invalid --data-dir '{A_FILE}': not a directory"]),
    (["export", "--out", "bundles/b.tar"], {}, ["--out bundles/b.tar: no such directory", "create it first"]),
    (["export", "--out", "."], {}, ["--out .: is a directory; name the bundle file, e.g. bundle.tar.zst"]),
    (["import", "nowhere.tar", "--trust-bundle-keys"], {}, ["bundle nowhere.tar: no such file"]),
    (["import", A_FILE], {}, ["name the signing keys to trust: --trust-key FINGERPRINT"]),
    (["lock", ".", "--ca-file", NOT_PEM, "--proxy", "https://127.0.0.1:1/"], {}, ["invalid --ca-file", "PEM"]),
]


@pytest.mark.parametrize(("argv", "env", "phrases"), PATH_MISTAKES)
def test_a_path_that_cannot_be_what_its_option_needs_is_one_line_before_anything_is_made(
    tmp_path: Path,
    refused_port: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    env: dict[str, str],
    phrases: list[str],
) -> None:
    """Exit 2 naming the option and the path, whatever the value's source (not the path alone, exit 1, after
    the local CA or the metadata secret was made); nothing is made in the data dir or beside it."""
    (tmp_path / NOT_PEM).write_text("not a certificate\n")
    (tmp_path / A_FILE).write_text("")
    (tmp_path / "config.toml").write_text(f'upstream-ca-file = "{NOT_PEM}"\n')
    (tmp_path / "main.tf").write_text("terraform {}\n")
    before = sorted(tmp_path.rglob("*"))
    data = [] if "--data-dir" in argv or argv[0] == "lock" else ["--data-dir", "data"]
    if argv[0] == "serve":  # a mistake let through fails to bind there, and never serves
        data += ["--listen", f"127.0.0.1:{refused_port}"]
    result = main_in_process(monkeypatch, capsys, *argv, *data, cwd=tmp_path, **env)
    assert_one_line(result, 2, *phrases)
    assert sorted(tmp_path.rglob("*")) == before


def test_import_verifies_the_bundle_before_the_data_dir_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle refused leaves no metadata secret, keyring or archive store behind (they were made first)."""
    (tmp_path / "bundle.tar").write_bytes(b"not a tar file" * 64)
    argv = ["import", "bundle.tar", "--trust-bundle-keys", "--data-dir", "data", "--quiet"]  # no progress lines
    result = main_in_process(monkeypatch, capsys, *argv, cwd=tmp_path)
    assert_one_line(result, 1, "bundle rejected: bundle.tar is not a readable bundle")
    assert not (tmp_path / "data").exists()


def test_token_new_refuses_hosts_that_serve_would_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["token", "new", "ci", "--hosts", "registry.terraform.io,https://registry.example.com/"]
    result = main_in_process(monkeypatch, capsys, *argv, cwd=tmp_path)
    assert_one_line(result, 2, "token new: --hosts: 'https://registry.example.com/'", "not a URL")
    assert result.stdout == ""  # no token shown for an entry that could not be used


@pytest.mark.parametrize("command", ["lock", "warm"])
def test_lock_and_warm_refuse_a_directory_without_configuration(
    tmp_path: Path, refused_port: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """Not an empty lock file and exit 0: the directory named, before the proxy is asked."""
    (tmp_path / "notes.md").write_text("# not a module\n")
    argv = [command, str(tmp_path), "--proxy", f"https://127.0.0.1:{refused_port}/", "--platform", "linux_amd64"]
    result = main_in_process(monkeypatch, capsys, *argv, cwd=tmp_path)
    assert_one_line(result, 2, f"{tmp_path} holds no .tf or .tofu file", "root module")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.md"]


@pytest.mark.parametrize(
    "url", ["not a url", "ftp://proxy.example/", "proxy.example:8443", "https:///mirror", "http://[::1"]
)
def test_lock_and_warm_with_bad_proxy_urls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str
) -> None:
    (tmp_path / "main.tf").write_text("terraform {}\n")
    for command in ("lock", "warm"):
        result = main_in_process(
            monkeypatch, capsys, command, str(tmp_path), "--proxy", url, "--platform", "linux_amd64", cwd=tmp_path
        )
        assert_one_line(result, 2, "invalid --proxy", "base URL")


def test_lock_with_a_missing_ca_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    result = main_in_process(
        monkeypatch,
        capsys,
        "lock",
        str(tmp_path),
        "--proxy",
        "https://127.0.0.1:1/",
        "--ca-file",
        "nowhere.pem",
        "--platform",
        "linux_amd64",
        cwd=tmp_path,
    )
    assert_one_line(result, 2, "invalid --ca-file 'nowhere.pem': no such file")


def test_warm_with_nothing_listening(
    tmp_path: Path, refused_port: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    port = refused_port
    (tmp_path / "main.tf").write_text("terraform {}\n")
    argv = ["warm", str(tmp_path), "--proxy", f"https://127.0.0.1:{port}/", "--platform", "linux_amd64"]
    result = main_in_process(monkeypatch, capsys, *argv, cwd=tmp_path)
    assert_one_line(result, 1, "cannot connect to the proxy", str(port))


async def test_lock_and_warm_with_an_untrusted_proxy_certificate(
    make_local_settings,
    client_ssl,
    tmp_path: Path,
    ca_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        """The CLI in a thread (its own event loop) while the proxy serves on this one."""
        return await asyncio.to_thread(main_in_process, monkeypatch, capsys, *argv, cwd=tmp_path)

    (tmp_path / "main.tf").write_text("terraform {}\n")
    async with serve_proxy(make_local_settings(), client_ssl) as proxy:
        for command in ("lock", "warm"):
            result = await cli(command, str(tmp_path), "--proxy", proxy.url, "--platform", "linux_amd64")
            assert_one_line(result, 1, "not trusted", "--ca-file")
        plain = proxy.url.replace("https://", "http://")
        for command in ("lock", "warm"):  # the TLS port asked in plain HTTP: "Server disconnected", and no hint
            result = await cli(command, str(tmp_path), "--proxy", plain, "--platform", "linux_amd64")
            assert_one_line(result, 1, "speaks TLS: use --proxy " + proxy.url.rstrip("/") + "/")
        argv = ["lock", str(tmp_path), "--proxy", proxy.url, "--ca-file", str(ca_file), "--platform", "linux_amd64"]
        trusted = await cli(*argv)
    assert "Traceback" not in trusted.stderr and "not trusted" not in trusted.stderr
    assert trusted.returncode == 0, trusted.stderr


def _taken_port(sock: socket.socket) -> int:
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock.getsockname()[1]


@pytest.mark.process
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_in_use_is_refused_at_once_in_one_line(tmp_path: Path, workers: str) -> None:
    """No retries, no supervisor lines, nothing made in the data dir: one line naming the address, exit 2
    (before: about 9 s, 14 JSON lines from gunicorn's attempts, exit 1)."""
    with socket.socket() as taken:
        port = _taken_port(taken)
        result = run_cli(
            "serve",
            "--data-dir",
            str(tmp_path / "data"),
            "--workers",
            workers,
            "--listen",
            f"127.0.0.1:{port}",
            "--log-format",
            "json",
            cwd=tmp_path,
        )
    assert_one_line(result, 2, f"--listen 127.0.0.1:{port}", "address already in use")
    assert not (tmp_path / "data" / "tls").exists()  # refused before the certificate was made


def test_an_address_this_host_does_not_have_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--data-dir", str(tmp_path / "data"), "--plain-http", "--listen", "192.0.2.1:8443"]
    result = main_in_process(monkeypatch, capsys, *argv, cwd=tmp_path)
    assert_one_line(result, 2, "--listen 192.0.2.1:8443", "this host has no such address")


@pytest.mark.parametrize("content", ["", "# nobody yet\n", "[tokens]\n"])
def test_a_tokens_file_without_tokens_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(content)
    argv = ["serve", "--data-dir", str(tmp_path / "data"), "--plain-http", "--auth-tokens", str(tokens)]
    result = main_in_process(monkeypatch, capsys, *argv, cwd=tmp_path)
    assert_one_line(result, 2, f"--auth-tokens {tokens}", "no tokens", "401", "registry-proxy token new")


@pytest.mark.process
def test_a_tokens_file_error_from_the_real_process_names_the_file(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    for content, phrase in (("", "no tokens"), ("[tokens.ci\n", "not valid TOML")):
        tokens.write_text(content)
        argv = ["serve", "--data-dir", str(tmp_path / "data"), "--plain-http", "--auth-tokens", str(tokens)]
        assert_one_line(run_cli(*argv, cwd=tmp_path), 2, f"--auth-tokens {tokens}", phrase)


CREDENTIALS_ERRORS = [
    ('credentials "a.example" {\n  token = "x"\n', ":3:1", "not valid HCL (unexpected end of file)"),
    ('credentials "a.example" {\n  token = "x" $\n}\n', ":2:15", "not valid HCL (unexpected '$')"),
    ('credentials "a.example" {\n  token = \n}\n', ":2:11", "not valid HCL (unexpected end of line)"),
    ('# ci\n\ncredentials "a.example" {\n  user = "x"\n}\n', ":3", 'credentials "a.example": needs token'),
    ('credentials "a.example" {\n  token = "x"\n}\ncredentials "b..x" {\n  token = "y"\n}\n', ":4", "b..x"),
]


@pytest.mark.parametrize(("content", "where", "what"), CREDENTIALS_ERRORS)
def test_credentials_file_errors_name_the_file_and_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    content: str,
    where: str,
    what: str,
) -> None:
    credentials = tmp_path / "credentials.tfrc"
    credentials.write_text(content)
    argv = ["serve", "--data-dir", str(tmp_path / "data"), "--plain-http", "--upstream-credentials", str(credentials)]
    line = assert_one_line(main_in_process(monkeypatch, capsys, *argv, cwd=tmp_path), 2, what)
    assert f"--upstream-credentials {credentials}{where}: " in line, line


@pytest.mark.process
def test_a_credentials_file_error_from_the_real_process_names_the_file_and_line(tmp_path: Path) -> None:
    content, where, what = CREDENTIALS_ERRORS[0]
    credentials = tmp_path / "credentials.tfrc"
    credentials.write_text(content)
    argv = ["serve", "--data-dir", str(tmp_path / "data"), "--plain-http", "--upstream-credentials", str(credentials)]
    assert_one_line(run_cli(*argv, cwd=tmp_path), 2, f"--upstream-credentials {credentials}{where}: {what}")


def stderr_until(argv: list[str], cwd: Path, marker: str, host: str = "127.0.0.1", **env: str) -> tuple[int, list[str]]:
    """Run `serve ARGV --listen HOST:PORT` on a free port until a line of its stderr contains `marker` (it
    listens), then stop it: the port and its lines. Again on another port if another test took it first."""
    for _ in range(PORT_ATTEMPTS):
        port = free_port()
        command = [sys.executable, "-m", "proxy", "serve", *argv, "--listen", f"{host}:{port}"]
        process = subprocess.Popen(command, cwd=cwd, env=_env(**env), stderr=subprocess.PIPE, text=True)
        lines: list[str] = []
        try:
            assert process.stderr is not None
            for line in process.stderr:  # ends when the process exits; the test's timeout bounds it
                lines.append(line)
                if marker in line:
                    break
        finally:
            process.terminate()
            process.wait(timeout=30)
        if not any("address already in use" in line for line in lines):
            return port, lines
    raise AssertionError(f"no free port in {PORT_ATTEMPTS} attempts")


def log_until_listening(argv: list[str], cwd: Path, host: str = "127.0.0.1") -> tuple[int, dict[str, dict]]:
    """Run `serve ARGV` with JSON logs until it listens, then stop it: its port and log records by event."""
    port, lines = stderr_until(["--log-format", "json", *argv], cwd, '"proxy.listening"', host)
    records = [json.loads(line) for line in lines if line.startswith("{")]
    return port, {record.get("event", ""): record for record in records}


@pytest.mark.process
def test_ca_hint_has_an_absolute_path_and_the_cli_snippet(tmp_path: Path) -> None:
    """A relative --data-dir still gives an absolute CA path; the snippet names this proxy's mirror URL."""
    port, records = log_until_listening(["--data-dir", "relative-data", "--workers", "1"], tmp_path, "0.0.0.0")
    hint = records["tls.local_ca"]
    ca_path = Path(hint["ca_file"])
    assert ca_path.is_absolute() and ca_path == (tmp_path / "relative-data" / "tls" / "ca.pem").resolve()
    assert f"SSL_CERT_FILE={ca_path.with_name('ca-bundle.pem')} " in hint["hint"]
    assert hint["cli_config"] == (
        f'provider_installation {{\n  network_mirror {{\n    url = "https://127.0.0.1:{port}/mirror/v1/"\n  }}\n}}\n'
    )
    assert records["proxy.listening"]["mirror_url"] == f"https://127.0.0.1:{port}/mirror/v1/"


@pytest.mark.process
def test_the_logged_mirror_url_is_the_public_url(tmp_path: Path) -> None:
    argv = ["--data-dir", "data", "--workers", "1", "--public-url", "https://lb.example/tf"]
    _, records = log_until_listening(argv, tmp_path)
    assert records["proxy.listening"]["mirror_url"] == "https://lb.example/tf/mirror/v1/"
    assert 'url = "https://lb.example/tf/mirror/v1/"' in records["tls.local_ca"]["cli_config"]


@pytest.mark.process
def test_console_logs_into_a_pipe_have_no_colour_codes(tmp_path: Path) -> None:
    argv = ["--data-dir", "data", "--plain-http", "--workers", "1", "--log-format", "console"]
    _, lines = stderr_until(argv, tmp_path, "proxy.listening")
    assert any("proxy.listening" in line for line in lines), lines
    assert not [line for line in lines if "\x1b[" in line], lines


@pytest.mark.process
def test_a_plain_http_upstream_is_warned_about_once(tmp_path: Path) -> None:
    mapped = [
        "--upstream-map",
        "internal.example=http://10.0.0.5:8080",
        "--upstream-map",
        "safe.example=https://10.0.0.6",
    ]
    argv = ["--data-dir", "data", "--plain-http", "--workers", "2", *mapped]
    _, lines = stderr_until(argv, tmp_path, "proxy.listening", REGISTRY_PROXY_LOG_FORMAT="json")
    records = [json.loads(line) for line in lines]
    warnings = [record for record in records if record["event"] == "config.plain_http_upstream"]
    assert len(warnings) == 1 and warnings[0]["hosts"] == ["internal.example"], records
    assert warnings[0]["level"] == "warning" and "without TLS" in warnings[0]["effect"]


@pytest.mark.process
async def test_an_unreachable_redis_is_one_warning_at_start_and_readyz_says_why(
    tmp_path: Path, refused_port: int
) -> None:
    redis_port = refused_port  # nothing listens there while the test runs
    argv = ["--data-dir", "data", "--plain-http", "--workers", "2", "--log-format", "json"]
    argv += ["--redis-url", f"redis://127.0.0.1:{redis_port}/0", "--metadata-secret", METADATA_SECRET]
    for _ in range(PORT_ATTEMPTS):  # again on another port if another test took this one first
        port = free_port()
        process = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "proxy", "serve", *argv, "--listen", f"127.0.0.1:{port}"],
            cwd=tmp_path,
            env=_env(),
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert process.stderr is not None
            before: list[dict] = []
            while not before or before[-1]["event"] != "proxy.listening":
                line = await asyncio.wait_for(process.stderr.readline(), 60)
                assert line, before  # exited
                if b"address already in use" in line:
                    break
                before.append(json.loads(line))
            else:
                down = [record for record in before if record["level"] in ("warning", "error")]
                assert [record["event"] for record in down] == ["redis.down"], before
                assert f"127.0.0.1:{redis_port}" in down[0]["error"]
                url = f"http://127.0.0.1:{port}"
                await wait_healthy(f"{url}/healthz", None, process, lambda: "", timeout=60)
                async with aiohttp.ClientSession() as session, session.get(f"{url}/readyz") as response:
                    body = await response.json()
                assert response.status == 200 and body["status"] == "degraded", body
                assert f"127.0.0.1:{redis_port}" in body["reasons"]["metadata_store"], body
                return
        finally:
            await terminate(process, 15)
    raise AssertionError(f"no free port in {PORT_ATTEMPTS} attempts")
