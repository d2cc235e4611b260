"""Nonsense values stop start-up (issue 18.9): zero, negative and below-minimum values are refused with one
line, the same way whether they come from a flag, a REGISTRY_PROXY_* variable or a `--config` file key.

Before, `--upstream-timeout 0` started and every uncached request then failed in milliseconds, and
`--eviction-grace 1s` (below the documented 1 m: replicas record served times once a minute) started and
evicted an archive that another worker was still sending.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.redis_server import free_port
from tests.integration.test_cli_errors import _env, assert_one_line, log_until_listening, main_in_process

# Each refused at start: (flag, value). Sizes and counts of 0, durations of 0 (or below their floor).
REFUSED = [
    ("--upstream-timeout", "0"),
    ("--upstream-timeout", "500ms"),
    ("--git-timeout", "0"),
    ("--ttl-discovery", "0"),
    ("--ttl-versions", "0s"),
    ("--ttl-negative", "0"),
    ("--client-header-timeout", "0"),
    ("--keepalive-timeout", "0s"),
    ("--send-timeout", "0"),
    ("--request-deadline", "0"),
    ("--download-idle-timeout", "0"),
    ("--download-rate-window", "0"),
    ("--download-slot-wait", "0"),
    ("--shutdown-grace", "0"),
    ("--eviction-grace", "0"),
    ("--eviction-grace", "1s"),
    ("--eviction-grace", "59s"),
    ("--eviction-interval", "0"),
    ("--fleet-lock-ttl", "0"),
    ("--fleet-lock-ttl", "500ms"),
    ("--redis-retention", "0"),
    ("--redis-retention", "30m"),
    ("--s3-timeout", "0"),
    ("--archive-redirect-expiry", "0"),
    ("--max-archive-size", "0"),
    ("--max-metadata-size", "0"),
    ("--max-module-size", "0"),
    ("--max-module-unpacked-size", "0"),
    ("--max-store-size", "0"),
    ("--negative-cache-bytes", "0"),
    ("--negative-cache-bytes", "1000"),
    ("--upstream-concurrency", "0"),
    ("--upstream-host-concurrency", "0"),
    ("--max-module-entries", "0"),
    ("--max-connections", "0"),
    ("--negative-cache-entries", "0"),
    ("--workers", "0"),
]

# Zero means something documented for these: accepted.
ZERO_MEANS_SOMETHING = ["--stale-deadline", "--min-download-rate", "--min-free-space"]


def _serve(monkeypatch, capsys, tmp_path: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`serve` in process; a configuration that passes stops at the missing CA file, so nothing is served."""
    return main_in_process(
        monkeypatch,
        capsys,
        "serve",
        "--data-dir",
        str(tmp_path / "data"),
        "--upstream-ca-file",
        "missing-ca.pem",
        *argv,
        cwd=tmp_path,
        **env,
    )


def _key(flag: str) -> str:
    return flag.removeprefix("--")


def _variable(flag: str) -> str:
    return "REGISTRY_PROXY_" + _key(flag).replace("-", "_").upper()


@pytest.mark.parametrize(("flag", "value"), REFUSED)
@pytest.mark.parametrize("source", ["flag", "environment", "file"])
def test_nonsense_values_are_refused_from_every_source(
    tmp_path: Path, monkeypatch, capsys, flag: str, value: str, source: str
) -> None:
    if source == "flag":
        result = _serve(monkeypatch, capsys, tmp_path, flag, value)
        line = assert_one_line(result, 2, flag, repr(value))
    elif source == "environment":
        result = _serve(monkeypatch, capsys, tmp_path, **{_variable(flag): value})
        line = assert_one_line(result, 2, flag, _variable(flag), repr(value))
    else:
        config = tmp_path / "settings.toml"
        config.write_text(f'{_key(flag)} = "{value}"\n')
        result = _serve(monkeypatch, capsys, tmp_path, "--config", str(config))
        line = assert_one_line(result, 2, flag, str(config), repr(value))
    assert "at least" in line
    assert not (tmp_path / "data").exists()  # stopped before anything was made


@pytest.mark.parametrize("flag", ZERO_MEANS_SOMETHING)
def test_zero_is_accepted_where_it_means_something(tmp_path: Path, monkeypatch, capsys, flag: str) -> None:
    result = _serve(monkeypatch, capsys, tmp_path, flag, "0")
    assert_one_line(result, 2, "missing-ca.pem")  # got past the configuration


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["warm", ".", "--proxy", "https://127.0.0.1:1/", "--platform", "linux_amd64", "--jobs", "0"], "--jobs"),
        (["gc", "--data-dir", "data", "--grace", "0"], "--grace"),
        (["gc", "--data-dir", "data", "--grace", "10s"], "--grace"),
    ],
)
def test_the_other_commands_refuse_them_too(tmp_path: Path, monkeypatch, capsys, argv: list[str], flag: str) -> None:
    result = main_in_process(monkeypatch, capsys, *argv, cwd=tmp_path)
    assert_one_line(result, 2, flag, "at least")


def test_healthcheck_refuses_them_with_its_one_unhealthy_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """The health check exits 1 on a bad setting (Docker reserves 2), printing its one line."""
    result = main_in_process(monkeypatch, capsys, "healthcheck", "--timeout", "0", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout.strip().startswith("registry-proxy healthcheck: unhealthy: invalid --timeout '0'")
    assert "at least" in result.stdout


@pytest.mark.process
@pytest.mark.parametrize(
    ("argv", "env", "config", "phrases"),
    [
        (["--upstream-timeout", "0"], {}, None, ["--upstream-timeout", "'0'", "at least"]),
        ([], {"REGISTRY_PROXY_EVICTION_GRACE": "1s"}, None, ["REGISTRY_PROXY_EVICTION_GRACE", "at least 1m"]),
        ([], {}, 'eviction-grace = "1s"\n', ["--eviction-grace", "'1s'", "at least 1m"]),
    ],
    ids=["flag", "environment", "file"],
)
def test_the_real_process_refuses_at_start(
    tmp_path: Path, argv: list[str], env: dict[str, str], config: str | None, phrases: list[str]
) -> None:
    """The real `serve` process exits at once with one line (before: it started and served)."""
    if config is not None:
        (tmp_path / "settings.toml").write_text(config)
        argv = [*argv, "--config", str(tmp_path / "settings.toml")]
    command = [sys.executable, "-m", "proxy", "serve", "--plain-http", "--workers", "1"]
    command += ["--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "data"), *argv]
    try:
        result = subprocess.run(command, cwd=tmp_path, env=_env(**env), capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the proxy started with a nonsense value instead of refusing it")
    assert_one_line(result, 2, *phrases)
    assert not (tmp_path / "data").exists()


# --- the one escape hatch for tests: --unsafe-short-timings ----------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "config"),
    [
        (["--unsafe-short-timings"], {}, None),
        ([], {"REGISTRY_PROXY_UNSAFE_SHORT_TIMINGS": "true"}, None),
        ([], {}, "unsafe-short-timings = true\n"),
    ],
    ids=["flag", "environment", "file"],
)
def test_unsafe_short_timings_lowers_every_duration_minimum_to_1ms(
    tmp_path: Path, monkeypatch, capsys, argv: list[str], env: dict[str, str], config: str | None
) -> None:
    if config is not None:
        (tmp_path / "settings.toml").write_text(config)
        argv = [*argv, "--config", str(tmp_path / "settings.toml")]
    short = [
        "--eviction-grace",
        "1s",
        "--eviction-interval",
        "200ms",
        "--ttl-versions",
        "5ms",
        "--fleet-lock-ttl",
        "1ms",
    ]
    result = _serve(monkeypatch, capsys, tmp_path, *argv, *short, **env)
    assert_one_line(result, 2, "missing-ca.pem")  # got past the configuration


@pytest.mark.parametrize(("flag", "value"), [("--eviction-grace", "0"), ("--upstream-timeout", "0.5ms")])
def test_unsafe_short_timings_still_refuses_zero(tmp_path: Path, monkeypatch, capsys, flag: str, value: str) -> None:
    result = _serve(monkeypatch, capsys, tmp_path, "--unsafe-short-timings", flag, value)
    assert_one_line(result, 2, flag, repr(value), "at least 1ms")


def test_unsafe_short_timings_leaves_sizes_and_counts_alone(tmp_path: Path, monkeypatch, capsys) -> None:
    result = _serve(monkeypatch, capsys, tmp_path, "--unsafe-short-timings", "--negative-cache-bytes", "100")
    assert_one_line(result, 2, "--negative-cache-bytes", "at least 1KiB")


def test_other_commands_print_the_warning(tmp_path: Path, monkeypatch, capsys) -> None:
    result = main_in_process(
        monkeypatch, capsys, "gc", "--data-dir", "data", "--unsafe-short-timings", "--grace", "10s", cwd=tmp_path
    )
    warning, error = result.stderr.strip().splitlines()
    assert warning.startswith("registry-proxy: warning: --unsafe-short-timings: ") and "--grace 10s" in warning
    assert "holds no archive store" in error  # got past the configuration


@pytest.mark.process
def test_the_real_process_logs_a_loud_warning_at_start(tmp_path: Path) -> None:
    """With the hatch, `serve` starts with a below-minimum grace and says so in its log before it listens."""
    argv = ["--plain-http", "--workers", "1", "--data-dir", str(tmp_path / "data")]
    argv += ["--unsafe-short-timings", "--eviction-grace", "1s", "--eviction-interval", "200ms"]
    _, records = log_until_listening(argv, tmp_path)  # on a free port
    warning = records["config.unsafe_short_timings"]
    assert warning["level"] == "warning"
    assert warning["below_safe_minimum"] == "--eviction-grace 1s, --eviction-interval 0.2s"
    assert "never use it in production" in warning["effect"]
