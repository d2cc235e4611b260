"""Where each CLI option's value comes from: flags > environment > config file > defaults.

Every option declared with `option()` has an environment variable `REGISTRY_PROXY_<NAME>` and a
key in the optional TOML config file (`--config FILE` or `REGISTRY_PROXY_CONFIG`), spelled as
the long flag with dashes or underscores. The rules are the same for every option, so options
added later need no code here:

- switches: a flag, an environment boolean (`1/true/yes/on`, `0/false/no/off` or empty; anything
  else is an error) or a TOML boolean;
- repeatable options: the flag repeated, a comma-separated variable or a TOML list of strings;
- values: the flag, the variable, or a TOML string or number.

Unknown `REGISTRY_PROXY_*` variables and unknown or mistyped file keys are errors that name the
variable or the key and the file.
"""

from __future__ import annotations

import argparse
import difflib
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.config import ENV_PREFIX, ConfigError, env_name

CONFIG_FLAG = "--config"
CONFIG_ENV = env_name(CONFIG_FLAG)
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


@dataclass(frozen=True)
class OptionSpec:
    """One option as declared: its flag, kind and default."""

    flag: str
    kind: str  # "value", "switch" or "repeat"
    default: Any

    @property
    def dest(self) -> str:
        return dest(self.flag)

    @property
    def env(self) -> str:
        return env_name(self.flag)

    @property
    def key(self) -> str:
        return self.flag.lstrip("-")


def dest(flag: str) -> str:
    """`--upstream-map` → `upstream_map` (argparse's attribute name)."""
    return flag.lstrip("-").replace("-", "_")


class OptionParser(argparse.ArgumentParser):
    """An ArgumentParser whose `option()`s are resolved after parsing (flags > env > file > defaults).

    Subcommand parsers made with `add_subparsers` are OptionParsers too; the top-level parser
    resolves the chosen subcommand's options and refuses unknown `REGISTRY_PROXY_*` variables.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.option_specs: list[OptionSpec] = []
        self.config_file_options: list[OptionSpec] | None = None  # keys a --config file may name

    def parse_known_args(
        self,
        args: Sequence[str] | None = None,  # type: ignore[override]
        namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        if self._subcommands() is not None:  # the top-level parser: the subcommand has parsed by now
            self._resolve(parsed)
        return parsed, rest

    def _subcommands(self) -> argparse._SubParsersAction | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action
        return None

    def _resolve(self, parsed: argparse.Namespace) -> None:
        subcommands = self._subcommands()
        assert subcommands is not None
        parsers = [p for p in subcommands.choices.values() if isinstance(p, OptionParser)]
        environ = os.environ
        check_environment(environ, {spec.env for p in [self, *parsers] for spec in p.option_specs} | {CONFIG_ENV})
        chosen = subcommands.choices.get(getattr(parsed, subcommands.dest, None) or "")
        parser = chosen if isinstance(chosen, OptionParser) else self
        file_values: dict[str, Any] = {}
        config = getattr(parsed, dest(CONFIG_FLAG), None) or environ.get(CONFIG_ENV)
        if parser.config_file_options is not None and config:
            file_values = read_config_file(Path(config), parser.config_file_options, parser.option_specs)
        for spec in parser.option_specs:
            if hasattr(parsed, spec.dest):  # given as a flag
                continue
            if spec.env in environ:
                value = _from_env(spec, environ[spec.env])
            elif spec.dest in file_values:
                value = file_values[spec.dest]
            else:
                value = list(spec.default or []) if spec.kind == "repeat" else spec.default
                value = bool(value) if spec.kind == "switch" else value
            setattr(parsed, spec.dest, value)


def option(
    parser: argparse.ArgumentParser,
    flag: str,
    help_text: str,
    *,
    default: Any = None,
    repeat: bool = False,
    switch: bool = False,
    metavar: str | None = None,
) -> None:
    """Declare `flag` on `parser` with its environment variable and config-file key (resolved after parsing)."""
    env = env_name(flag)
    kind = "switch" if switch else "repeat" if repeat else "value"
    if isinstance(parser, OptionParser):
        parser.option_specs.append(OptionSpec(flag, kind, default))
    if switch:
        parser.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=f"{help_text} [env: {env}]")
    elif repeat:
        shown = ", ".join(default) if default else "none"
        parser.add_argument(
            flag,
            action="append",
            default=argparse.SUPPRESS,
            metavar=metavar,
            help=f"{help_text} (repeatable; default: {shown}) [env: {env}, comma-separated]",
        )
    else:
        shown = f"; default: {default}" if default is not None else ""
        parser.add_argument(flag, default=argparse.SUPPRESS, metavar=metavar, help=f"{help_text}{shown} [env: {env}]")


def config_option(parser: OptionParser, keys: list[OptionSpec] | None = None) -> None:
    """Give `parser` a `--config FILE` whose keys are its own options, or `keys` (a wider set, e.g. the
    keys of `serve`, so one file serves several commands; keys this command lacks are then ignored)."""
    parser.config_file_options = keys if keys is not None else parser.option_specs
    parser.add_argument(
        CONFIG_FLAG,
        default=None,
        metavar="FILE",
        help="TOML file of settings, keys as the long flags (dashes or underscores); "
        f"flags and environment variables win over it [env: {CONFIG_ENV}]",
    )


def _from_env(spec: OptionSpec, raw: str) -> Any:
    if spec.kind == "switch":
        text = raw.strip().lower()
        if text not in _TRUE | _FALSE:
            raise ConfigError(f"invalid {spec.env}={raw!r}: use true or false (or 1/0, yes/no, on/off)")
        return text in _TRUE
    if spec.kind == "repeat":
        return [item.strip() for item in raw.split(",") if item.strip()]
    return raw


def check_environment(environ: Mapping[str, str], known: set[str]) -> None:
    """Refuse `REGISTRY_PROXY_*` variables no option reads (a typo would otherwise be ignored silently)."""
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"unknown environment variable {name}{hint}")


def read_config_file(path: Path, accepted: list[OptionSpec], own: list[OptionSpec]) -> dict[str, Any]:
    """The values of a TOML config file by argparse attribute name, checked against `accepted` (unknown
    keys and wrong types are errors); only the keys of `own` are returned."""
    try:
        with path.open("rb") as stream:
            document = tomllib.load(stream)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: invalid TOML: {exc}") from None
    by_key = {spec.key: spec for spec in accepted}
    own_dests = {spec.dest for spec in own}
    values: dict[str, Any] = {}
    for raw_key, value in document.items():
        key = raw_key.replace("_", "-")
        spec = by_key.get(key)
        if spec is None:
            close = difflib.get_close_matches(key, sorted(by_key), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"config file {path}: unknown key {raw_key!r}{hint}")
        if spec.dest in values:
            raise ConfigError(f"config file {path}: key {raw_key!r} given twice")
        if spec.dest in own_dests:
            values[spec.dest] = _from_file(path, raw_key, spec, value)
        else:
            _from_file(path, raw_key, spec, value)  # still checked
    return values


def _from_file(path: Path, key: str, spec: OptionSpec, value: Any) -> Any:
    if spec.kind == "switch":
        if not isinstance(value, bool):
            raise ConfigError(f"config file {path}: key {key!r} must be true or false, not {_shown(value)}")
        return value
    if spec.kind == "repeat":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ConfigError(f"config file {path}: key {key!r} must be a list of strings, not {_shown(value)}")
        return [item.strip() for item in value if item.strip()]
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ConfigError(f"config file {path}: key {key!r} must be a string or a number, not {_shown(value)}")
    return str(value)


def _shown(value: Any) -> str:
    names = {bool: "a boolean", list: "a list", dict: "a table", str: "a string", int: "a number", float: "a number"}
    return f"{names.get(type(value), type(value).__name__)} ({value!r})"
