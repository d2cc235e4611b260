"""The command line, derived from the declared options (`proxy.settings.config`): where each value comes from
(flags > environment > config file > defaults), how it is read, and the one line when it is wrong.

Every declared option has a flag, an environment variable `REGISTRY_PROXY_<NAME>` and a key in the
optional TOML config file (`--config FILE` or `REGISTRY_PROXY_CONFIG`), spelled as the long flag with
dashes or underscores (flag-only options, such as `gc --grace`, have neither). The rules are the same
for every option:

- switches: a flag, an environment boolean (`1/true/yes/on`, `0/false/no/off` or empty; anything
  else is an error) or a TOML boolean;
- repeatable options: the flag repeated, a comma-separated variable or a TOML list of strings;
- values: the flag, the variable, or a TOML string or number; an empty value leaves an option
  without a default unset.

Each value is then parsed and checked against its declared bounds, whatever its source: zero,
negative and below-minimum values are refused with one line naming the option, the value and where
it came from; so is a path that is not what the option needs there (`proxy.settings.paths`).
`--unsafe-short-timings` (hidden, for tests) lets every duration go down to 1ms.
Unknown `REGISTRY_PROXY_*` variables and unknown or mistyped file keys are errors that name the
variable or the key and the file.

Only public argparse API is used: subcommands come from `add_subparsers().add_parser()` and the
chosen one from the namespace's `command`.
"""

from __future__ import annotations

import argparse
import difflib
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import platformdirs

from proxy.settings.config import OPTIONS, ConfigError, options_for
from proxy.settings.optionspec import LocalPath, MachineValue, Option, env_name
from proxy.settings.paths import path_problem

CONFIG_FLAG = "--config"
CONFIG_ENV = env_name(CONFIG_FLAG)
UNSAFE_FLAG = "--unsafe-short-timings"
UNSAFE_EFFECT = (
    f"{UNSAFE_FLAG}: durations below their safe minimums are accepted, for tests only: never use it in production"
)
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. a container's cpuset)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


_MACHINE = {
    "available-cpus": available_cpus,
    "user-cache-dir": lambda: Path(platformdirs.user_cache_dir("registry-proxy")),
}


class OptionParser(argparse.ArgumentParser):
    """The top-level parser: once argparse has parsed, the chosen command's declared options are resolved
    (flags > environment > config file > defaults), parsed and checked (ConfigError)."""

    def parse_known_args(
        self,
        args: Sequence[str] | None = None,  # type: ignore[override]
        namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        command = getattr(parsed, "command", None)
        if command is not None:
            try:
                resolve(parsed, command, os.environ)
            except ConfigError as exc:
                exc.command, exc.arguments = command, parsed
                raise
        return parsed, rest

    def add_commands(self) -> Any:
        """The subcommands' action (`add_parser` makes one); the chosen name lands in `command`."""
        return self.add_subparsers(dest="command", required=True, parser_class=argparse.ArgumentParser)


def add_command(
    commands: Any, name: str, *, config: bool = False, options_of: str | None = None, **kwargs: Any
) -> argparse.ArgumentParser:
    """The parser of subcommand `name` with its declared options (and those of command `options_of`, when given:
    `resolve` them as that command's) and `--config FILE` when `config`."""
    parser = commands.add_parser(name, **kwargs)
    if config:
        parser.add_argument(
            CONFIG_FLAG,
            default=None,
            metavar="FILE",
            help="TOML file of settings, keys as the long flags (dashes or underscores); flags and environment "
            f"variables win over it [env: {CONFIG_ENV}]",
        )
    others = options_for(options_of) if options_of else ()
    for spec in (*others, *(spec for spec in options_for(name) if spec not in others)):
        _add_argument(parser, spec)
    return parser


def _add_argument(parser: argparse.ArgumentParser, spec: Option) -> None:
    text = help_text(spec).replace("%", "%%")  # argparse %-formats help
    shown = argparse.SUPPRESS if spec.hidden else text
    metavar = spec.metavar or spec.kind.metavar
    if spec.kind.switch:
        parser.add_argument(spec.flag, action="store_true", default=argparse.SUPPRESS, help=shown)
    elif spec.kind.repeat:
        parser.add_argument(spec.flag, action="append", default=argparse.SUPPRESS, metavar=metavar, help=shown)
    else:
        parser.add_argument(spec.flag, default=argparse.SUPPRESS, metavar=metavar, help=shown)


def help_text(spec: Option) -> str:
    """The option's help as --help shows it: what it does, its bounds, its default and its variable."""
    details = []
    if spec.kind.repeat:
        details.append("repeatable")
    if spec.kind.limits():
        details.append(spec.kind.limits())
    default = spec.shown_default()
    if default is not None and not spec.kind.switch:
        details.append(f"default: {default}")
    text = spec.help + (f" ({'; '.join(details)})" if details else "")
    if spec.env_name:
        text += f" [env: {spec.env_name}{', comma-separated' if spec.kind.repeat else ''}]"
    return text


def environment_variables() -> frozenset[str]:
    """Every REGISTRY_PROXY_* variable some command reads."""
    return frozenset(spec.env_name for spec in OPTIONS if spec.env_name) | {CONFIG_ENV}


def resolve(namespace: argparse.Namespace, command: str, environ: Mapping[str, str]) -> None:
    """Replace the flags of `command` in `namespace` by the parsed, checked value of each of its options."""
    check_environment(environ, environment_variables())
    specs = sorted(options_for(command), key=lambda spec: spec.flag != UNSAFE_FLAG)  # the hatch first
    file_values: dict[str, tuple[str, Any]] = {}
    if hasattr(namespace, "config"):  # the command takes --config
        config = namespace.config or environ.get(CONFIG_ENV)
        if config:
            file_values = read_config_file(Path(config), options_for("serve"), specs)
    unsafe = False
    given: list[tuple[Option, str]] = []  # the options given a value, and where it came from
    for spec in specs:
        value, where = _resolved(spec, namespace, environ, file_values, unsafe)
        setattr(namespace, spec.dest, value)
        unsafe = unsafe or (spec.flag == UNSAFE_FLAG and value)
        if where is not None and isinstance(spec.kind, LocalPath) and value is not None:
            given.append((spec, where))
    for spec, where in given:  # the disk last: a value written wrong is said first, whatever it names
        value = getattr(namespace, spec.dest)
        problem = path_problem(spec.kind, value)
        if problem is not None:
            raise ConfigError(f"invalid {spec.flag} {str(value)!r}{where}: {problem}")


def _resolved(
    spec: Option,
    namespace: argparse.Namespace,
    environ: Mapping[str, str],
    file_values: dict[str, tuple[str, Any]],
    unsafe: bool,
) -> tuple[Any, str | None]:
    """The value of one option from the first source that has it (flag, variable, file, default), and where
    it came from (None: the default)."""
    if hasattr(namespace, spec.dest):  # given as a flag (not given, argparse leaves it out)
        return _parsed(spec, getattr(namespace, spec.dest), "", unsafe), ""
    if spec.env_name and spec.env_name in environ:
        where = f" (from {spec.env_name})"
        return _parsed(spec, _from_env(spec, environ[spec.env_name], where), where, unsafe), where
    if spec.dest in file_values:
        where, value = file_values[spec.dest]
        return _parsed(spec, value, where, unsafe), where
    return _machine(spec.default_value()), None


def _parsed(spec: Option, raw: Any, where: str, unsafe: bool) -> Any:
    """The value of `raw` (a flag's or variable's text, a file's value), parsed and checked."""
    if spec.kind.switch:
        return bool(raw)
    if spec.kind.repeat:
        return spec.kind.collect([_checked(spec, item, where, unsafe) for item in raw])
    if not str(raw).strip() and spec.default is None:
        return None  # empty: unset
    return _checked(spec, str(raw), where, unsafe)


def _checked(spec: Option, text: str, where: str, unsafe: bool) -> Any:
    try:
        value = _machine(spec.kind.parse(text))
        spec.kind.check(value, unsafe=unsafe)
    except ConfigError as exc:
        raise ConfigError(f"invalid {spec.flag} {text!r}{where}: {exc}") from None
    return value


def _machine(value: Any) -> Any:
    return _MACHINE[value.name]() if isinstance(value, MachineValue) else value


def below_safe_minimums(namespace: argparse.Namespace, command: str) -> dict[str, Any]:
    """The options of `command` whose values passed only because --unsafe-short-timings lowered the minimums."""
    return {
        spec.flag: getattr(namespace, spec.dest)
        for spec in options_for(command)
        if getattr(namespace, spec.dest, None) is not None
        and not spec.kind.repeat
        and spec.kind.below_safe_minimum(getattr(namespace, spec.dest))
    }


def shown_seconds(values: Mapping[str, float]) -> str:
    """`--eviction-grace 1s, --eviction-interval 0.2s`."""
    return ", ".join(f"{flag} {seconds:g}s" for flag, seconds in values.items())


def _from_env(spec: Option, raw: str, where: str) -> Any:
    if spec.kind.switch:
        text = raw.strip().lower()
        if text not in _TRUE | _FALSE:
            raise ConfigError(f"invalid {spec.flag} {raw!r}{where}: use true or false (or 1/0, yes/no, on/off)")
        return text in _TRUE
    if spec.kind.repeat:
        return [item.strip() for item in raw.split(",") if item.strip()]
    return raw


def check_environment(environ: Mapping[str, str], known: frozenset[str]) -> None:
    """Refuse `REGISTRY_PROXY_*` variables no option reads (a typo would otherwise be ignored silently)."""
    for name in sorted(environ):
        if name.startswith("REGISTRY_PROXY_") and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"unknown environment variable {name}{hint}")


def read_config_file(path: Path, accepted: Sequence[Option], own: Sequence[Option]) -> dict[str, tuple[str, Any]]:
    """The values of a TOML config file by option `dest`, each with where it was found (the key and the
    file), checked against `accepted` (unknown keys and wrong types are errors); only the keys of `own`
    are returned."""
    try:
        with path.open("rb") as stream:
            document = tomllib.load(stream)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: invalid TOML: {exc}") from None
    by_key = {spec.key: spec for spec in accepted if spec.env}
    own_dests = {spec.dest for spec in own}
    values: dict[str, tuple[str, Any]] = {}
    seen: set[str] = set()
    for raw_key, value in document.items():
        spec = by_key.get(raw_key.replace("_", "-"))
        if spec is None:
            close = difflib.get_close_matches(raw_key.replace("_", "-"), sorted(by_key), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"config file {path}: unknown key {raw_key!r}{hint}")
        if spec.dest in seen:
            raise ConfigError(f"config file {path}: key {raw_key!r} given twice")
        seen.add(spec.dest)
        checked = _from_file(path, raw_key, spec, value)  # checked even when this command does not use it
        if spec.dest in own_dests:
            values[spec.dest] = (f" (from {raw_key!r} in config file {path})", checked)
    return values


def _from_file(path: Path, key: str, spec: Option, value: Any) -> Any:
    if spec.kind.switch:
        if not isinstance(value, bool):
            raise ConfigError(f"config file {path}: key {key!r} must be true or false, not {_shown(value)}")
        return value
    if spec.kind.repeat:
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
