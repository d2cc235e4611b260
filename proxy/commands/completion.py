"""`registry-proxy completion bash|zsh|fish`: the shell's completion script, generated from the parser by shtab.

Every command, subcommand and option of the parser (`proxy.cli.build_parser`) completes. What an option's value
completes with comes from its declaration (`proxy.settings.config`): a file (`FILE`) or a directory
(`DIRECTORY`) as a path, a `Choice` as its words. An argument that is no declared option (a command's own,
`--config`) completes as a path where its metavar names a FILE or a DIR. shtab is imported only here, by this
command: no other command pays for it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import shtab

from proxy.settings.config import DIRECTORY, FILE, OPTIONS
from proxy.settings.optionspec import Choice

SHELLS = ("bash", "zsh", "fish")
_PATHS = {FILE: shtab.FILE, DIRECTORY: shtab.DIRECTORY}
_METAVARS = {"FILE": shtab.FILE, "DIR": shtab.DIRECTORY}


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of `parser` for `shell` (its actions get what their values complete with)."""
    declared = {spec.flag: spec for spec in OPTIONS}
    for action in arguments(parser):
        spec = next((declared[flag] for flag in action.option_strings if flag in declared), None)
        if spec is not None and isinstance(spec.kind, Choice):
            action.choices = spec.kind.choices  # this parser only completes: it parses nothing
        elif spec is not None and spec.kind in _PATHS:
            action.complete = _PATHS[spec.kind]  # type: ignore[attr-defined]  # shtab's own attribute
        elif (path := _by_metavar(action)) is not None:
            action.complete = path  # type: ignore[attr-defined]
    return shtab.complete(parser, shell=shell)


def arguments(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """Every argument of `parser` and of its subcommands, at any depth (subcommands' own actions left out)."""
    for action in parser._actions:  # argparse has no public list of a parser's actions (shtab reads it too)
        if isinstance(action, argparse._SubParsersAction):
            for command in dict.fromkeys(action.choices.values()):  # aliases name one parser twice
                yield from arguments(command)
        else:
            yield action


def _by_metavar(action: argparse.Action) -> dict[str, str] | None:
    metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    return next((_METAVARS[word] for word in metavar.split("|") if word in _METAVARS), None)
