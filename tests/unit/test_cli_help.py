"""`--help` renders for the program and every subcommand (argparse %-formats each help string)."""

from __future__ import annotations

import pytest

from proxy.cli import build_parser

SUBCOMMANDS = ["serve", "lock", "warm", "export", "import", "verify", "healthcheck"]


@pytest.mark.parametrize("argv", [[], *([name] for name in SUBCOMMANDS)])
def test_help_renders(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*argv, "--help"])
    assert exit_info.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_serve_help_names_the_new_flags(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    out = capsys.readouterr().out
    for flag in ("--workers", "--access-log", "--event-loop", "--min-free-space"):
        assert flag in out
