"""`registry-proxy completion bash|zsh|fish`: scripts the shells accept, naming every command and option of the
parser, completing declared file and directory options as paths and declared choices as their words.

The scripts are made once, in this process; each shell runs once per check (bash and fish complete for real; zsh,
whose completion needs a terminal, checks the syntax). zsh and fish come with `make system-deps`; a missing one
skips its test, saying so.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess

import pytest

from proxy.cli import build_parser, main
from proxy.commands.completion import SHELLS, script
from proxy.settings.config import DIRECTORY, FILE, OPTIONS
from proxy.settings.optionspec import Choice

PREFIX = "_shtab_registry_proxy"


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("completion")
    paths = {}
    for shell in SHELLS:
        paths[shell] = folder / f"registry-proxy.{shell}"
        paths[shell].write_text(script(build_parser(), shell))
    return paths


def run(shell: str, *args: str) -> str:
    if shutil.which(shell) is None:
        pytest.skip(
            f"{shell} is not installed (apt-get install {shell}, or `make system-deps`): its script is unchecked"
        )
    result = subprocess.run([shell, *args], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, its parser) for the program and every command and subcommand."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                yield from commands(command, (*path, name))


def shown_options(parser: argparse.ArgumentParser) -> list[str]:
    return [flag for a in parser._actions if a.help != argparse.SUPPRESS for flag in a.option_strings]


def bash_name(path: tuple[str, ...], flag: str) -> str:
    """shtab's bash variable of an option of a command: `_shtab_registry_proxy_serve___tls_cert`."""
    return "_".join([PREFIX, *path, flag.replace("-", "_")]).replace("-", "_")


@pytest.mark.process
def test_the_bash_script_names_every_command_and_option_and_completes_paths_and_choices(scripts):
    run("bash", "-n", str(scripts["bash"]))
    text = scripts["bash"].read_text()
    for path, parser in commands(build_parser()):
        name = "_".join([PREFIX, *path]).replace("-", "_")
        listed = re.search(rf"^{name}_option_strings=\((.*)\)$", text, re.MULTILINE)
        assert listed is not None and sorted(listed[1].split()) == sorted(shown_options(parser)), path
        below = [sub[0] for sub, _ in commands(parser) if len(sub) == 1]
        if below:
            assert re.search(rf"^{name}_subparsers=\({' '.join(below)}\)$", text, re.MULTILINE), path
    assert "--unsafe-short-timings" not in text  # hidden: for tests only
    for path, parser in commands(build_parser()):
        flags = set(shown_options(parser))
        for spec in OPTIONS:
            if spec.flag not in flags:
                continue
            if spec.kind is FILE:
                assert f"{bash_name(path, spec.flag)}_COMPGEN=_shtab_compgen_files" in text
            elif spec.kind is DIRECTORY:
                assert f"{bash_name(path, spec.flag)}_COMPGEN=_shtab_compgen_dirs" in text
            elif isinstance(spec.kind, Choice):
                assert f"{bash_name(path, spec.flag)}_choices=({' '.join(spec.kind.choices)})" in text
    for path, flag in ((("serve",), "--config"), (("export",), "--out"), (("warm",), "--lock-file")):
        assert f"{bash_name(path, flag)}_COMPGEN=_shtab_compgen_files" in text  # no declared option: by metavar
    assert f"{PREFIX}_import_pos_0_COMPGEN=_shtab_compgen_files" in text
    assert f"{PREFIX}_warm_pos_0_COMPGEN=_shtab_compgen_dirs" in text


BASH_COMPLETES = {  # what is typed after the program's name: what bash offers (one bash for all)
    "ex": "export",
    "gc --dr": "--dry-run",
    "serve --log-format ''": "auto json console",
    "policy ch": "check",
    "completion ''": "bash zsh fish",
}


@pytest.mark.process
def test_bash_completes_commands_options_and_values(scripts):
    calls = "".join(
        f'COMP_WORDS=(registry-proxy {typed}); COMP_CWORD={len(typed.split())}; {PREFIX}; echo "${{COMPREPLY[*]}}"; '
        for typed in BASH_COMPLETES
    )
    shown = run("bash", "-c", f"source {scripts['bash']}; {calls}")
    assert shown.splitlines() == list(BASH_COMPLETES.values())


@pytest.mark.process
def test_the_zsh_script_is_valid_and_installs_as_a_function_file(scripts):
    text = scripts["zsh"].read_text()
    assert text.startswith("#compdef registry-proxy\n")
    assert all(f"{command}:" in text or f"'{command}'" in text for command in ("serve", "export", "completion"))
    assert "--tls-cert" in text and "_files" in text and "_files -/" in text
    run("zsh", "-n", str(scripts["zsh"]))


@pytest.mark.process
def test_the_fish_script_is_valid_and_completes(scripts):
    run("fish", "--no-execute", str(scripts["fish"]))
    shown = run(
        "fish",
        "-c",
        f"source {scripts['fish']}; complete -C 'registry-proxy ex'; complete -C 'registry-proxy gc --dr'",
    )
    assert [line.split("\t")[0] for line in shown.splitlines()] == ["export", "--dry-run"]


def test_the_command_prints_the_script(capsys):
    assert main(["completion", "fish"]) == 0
    assert capsys.readouterr().out == script(build_parser(), "fish")
    with pytest.raises(SystemExit) as refused:
        main(["completion", "powershell"])
    assert refused.value.code == 2
