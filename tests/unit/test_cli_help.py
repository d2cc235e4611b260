"""`--help` renders for the program and every subcommand (argparse %-formats each help string), and shows
every declared option of the command with its bounds, default and variable, except the hidden test hatch."""

from __future__ import annotations

import pytest

from proxy.cli import build_parser
from proxy.settings.config import options_for

SUBCOMMANDS = ["serve", "lock", "warm", "export", "import", "verify", "gc", "healthcheck", "token", "completion"]


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*argv, "--help"])
    assert exit_info.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


@pytest.mark.parametrize("argv", [[], *([name] for name in SUBCOMMANDS)])
def test_help_renders(argv, capsys):
    assert "usage:" in _help(argv, capsys)


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help_shows_every_declared_option_but_the_hidden_hatch(command, capsys):
    out = _help([command], capsys)
    for spec in options_for(command):
        if spec.hidden:
            assert spec.flag not in out
            continue
        assert spec.flag in out
        if spec.env_name:
            assert f"[env: {spec.env_name}" in out, spec.flag


def test_help_shows_bounds_and_defaults(capsys):
    out = _help(["serve"], capsys)
    assert "--eviction-grace DURATION never evict an archive served or stored within this long" in out
    assert "(at least 1m; default: 10m) [env: REGISTRY_PROXY_EVICTION_GRACE]" in out
    assert "(at least 1; default: 16) [env: REGISTRY_PROXY_UPSTREAM_CONCURRENCY]" in out
    assert "(repeatable; default: registry.opentofu.org, registry.terraform.io)" in out
    assert "such as 5%; 0: none" in out  # a % in help text survives argparse's %-formatting
    assert "--unsafe-short-timings" not in out
