"""How an option is declared: its flag, the kind of value it takes (with its bounds), its default and help.

Every option is declared once, on the dataclass field it fills (`proxy.settings.config`):

    eviction_grace: float = option("--eviction-grace", Duration(minimum="1m", why=...), "help", default="10m")

From that declaration come the flag, the `REGISTRY_PROXY_*` variable, the `--config` key, the default
(parsed once for code; shown as written in `--help` and docs/configuration.md), the checks every value
must pass whatever its source, and the help text. `proxy.settings.command_line` turns the declarations into the
command line; `build` turns resolved values back into the dataclasses. Pure: no argparse, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

from proxy.settings.values import ConfigError, format_duration, format_size, parse_count, parse_duration, parse_size

ENV_PREFIX = "REGISTRY_PROXY_"
OPTION = "registry-proxy.option"  # dataclass field metadata: the Option the field is configured by
AREA = "registry-proxy.area"  # dataclass field metadata: a nested group of settings
UNSAFE_FLOOR = 0.001  # with --unsafe-short-timings, a duration may be as short as this (never 0)


class Kind:
    """The kind of value an option takes: how it is written (`parse`), its bounds (`check`), its description."""

    repeat: ClassVar[bool] = False  # a list: the flag repeated, a comma-separated variable, a TOML list
    switch: ClassVar[bool] = False  # on or off: a bare flag, a boolean variable, a TOML boolean
    describes: ClassVar[str] = "a value"
    metavar: ClassVar[str | None] = None  # how --help names the value, unless the option names it

    def parse(self, text: str) -> Any:
        """The value written as `text` (one item of a list), or ConfigError with the reason."""
        return text

    def collect(self, items: list[Any]) -> Any:
        """The value of a repeatable option from its parsed items."""
        return items

    def check(self, value: Any, *, unsafe: bool = False) -> None:
        """Refuse a parsed value outside the bounds (ConfigError with the reason)."""

    def limits(self) -> str:
        """The bounds in words ("at least 1s"), for --help and the reference; "" when there are none."""
        return ""

    def below_safe_minimum(self, value: Any) -> bool:
        """Whether `value` passed only because --unsafe-short-timings lowered the minimum."""
        return False


@dataclass(frozen=True)
class Duration(Kind):
    """Seconds, written `500ms`, `30s`, `10m`, `1h`, `1d`: at least `minimum` (0 only where `minimum` is 0)."""

    minimum: str = "1s"
    maximum: str | None = None
    why: str = ""  # why the minimum is what it is, shown when a value is below it
    describes: ClassVar[str] = "a duration"
    metavar: ClassVar[str | None] = "DURATION"

    def parse(self, text: str) -> float:
        return parse_duration(text)

    def check(self, value: float, *, unsafe: bool = False) -> None:
        floor = parse_duration(self.minimum)
        if value < floor and not (unsafe and value >= UNSAFE_FLOOR):
            if unsafe:
                raise ConfigError(f"must be at least {format_duration(UNSAFE_FLOOR)}, even with short timings")
            raise ConfigError(f"must be at least {self.minimum}" + (f": {self.why}" if self.why else ""))
        if self.maximum is not None and value > parse_duration(self.maximum):
            raise ConfigError(f"must be at most {self.maximum}")

    def limits(self) -> str:
        low = "0 or more" if parse_duration(self.minimum) == 0 else f"at least {self.minimum}"
        return low + (f", at most {self.maximum}" if self.maximum else "")

    def below_safe_minimum(self, value: float) -> bool:
        return value < parse_duration(self.minimum)


@dataclass(frozen=True)
class Size(Kind):
    """Bytes, written `1048576`, `100KB`, `512MiB`, `2GiB`: at least `minimum`."""

    minimum: str = "1B"
    describes: ClassVar[str] = "a size"
    metavar: ClassVar[str | None] = "SIZE"

    def parse(self, text: str) -> int:
        return parse_size(text)

    def check(self, value: int, *, unsafe: bool = False) -> None:
        if value < parse_size(self.minimum):
            raise ConfigError(f"must be at least {self.minimum}")

    def limits(self) -> str:
        floor = parse_size(self.minimum)
        return "0 or more" if floor == 0 else f"at least {format_size(floor) if floor > 1 else '1 byte'}"


@dataclass(frozen=True)
class Count(Kind):
    """A whole number: at least `minimum`."""

    minimum: int = 1
    describes: ClassVar[str] = "a whole number"
    metavar: ClassVar[str | None] = "N"

    def parse(self, text: str) -> int:
        return parse_count(text)

    def check(self, value: int, *, unsafe: bool = False) -> None:
        if value < self.minimum:
            raise ConfigError(f"must be at least {self.minimum}")

    def limits(self) -> str:
        return f"at least {self.minimum}"


@dataclass(frozen=True)
class MachineValue:
    """A value that depends on the machine (the user's cache directory, the CPUs the process may use):
    the command line computes it at start-up, so that this module and the settings stay pure."""

    name: str
    shown: str  # how --help and the reference show it

    def __str__(self) -> str:
        return self.shown


AVAILABLE_CPUS = MachineValue("available-cpus", "auto")
USER_CACHE_DIR = MachineValue("user-cache-dir", "the user's cache directory (~/.cache/registry-proxy on Linux)")


@dataclass(frozen=True)
class Workers(Count):
    """A number of worker processes, or `auto` (one per CPU the process may use)."""

    describes: ClassVar[str] = "a whole number, or auto (one per CPU the process may use)"

    def parse(self, text: str) -> int | MachineValue:
        return AVAILABLE_CPUS if str(text).strip() == "auto" else parse_count(text)

    def check(self, value: int | MachineValue, *, unsafe: bool = False) -> None:
        if not isinstance(value, MachineValue):
            super().check(value)


@dataclass(frozen=True)
class Choice(Kind):
    """One of a few words (case does not matter)."""

    choices: tuple[str, ...]

    @property
    def describes(self) -> str:  # type: ignore[override]
        return "one of " + ", ".join(self.choices)

    @property
    def metavar(self) -> str:  # type: ignore[override]
        return "|".join(self.choices)

    def parse(self, text: str) -> str:
        value = str(text).strip().lower()
        if value not in self.choices:
            raise ConfigError("use one of " + ", ".join(self.choices))
        return value


@dataclass(frozen=True)
class Text(Kind):
    """Free text, at least `min_bytes` long once surrounding space is stripped."""

    min_bytes: int = 1
    hint: str = ""  # how to make a good one, shown when it is too short
    describes: ClassVar[str] = "text"

    def check(self, value: str, *, unsafe: bool = False) -> None:
        if len(value.strip().encode()) < self.min_bytes:
            if self.min_bytes == 1:
                raise ConfigError("must not be empty")
            raise ConfigError(f"must be at least {self.min_bytes} bytes" + (f" ({self.hint})" if self.hint else ""))

    def limits(self) -> str:
        return f"at least {self.min_bytes} bytes" if self.min_bytes > 1 else ""


@dataclass(frozen=True)
class Parsed(Kind):
    """A value one parser reads (a path, an address, a URL, a policy)."""

    parser: Callable[[str], Any]
    what: str  # e.g. "HOST:PORT"

    @property
    def describes(self) -> str:  # type: ignore[override]
        return self.what

    def parse(self, text: str) -> Any:
        try:
            return self.parser(text)
        except ValueError as exc:  # ConfigError, AddressError and the like: the reason
            raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class LocalPath(Parsed):
    """A path on this machine, and what must be there: `expects` "file" (a readable file), "certificates" (a
    readable file of PEM certificates), "directory" (a directory, or one that can be made) or "appendable" (a
    file that can be appended to, in a directory that exists; or `stdout`). Checked on the disk once the value
    is resolved (`proxy.settings.paths`), before any command does anything: this module does no I/O."""

    expects: str = "file"


@dataclass(frozen=True)
class Each(Parsed):
    """A repeatable option: each item read by `parser`, the items gathered by `gather`."""

    gather: Callable[[Iterable[Any]], Any] = tuple
    repeat: ClassVar[bool] = True

    def collect(self, items: list[Any]) -> Any:
        return self.gather(items)


class Switch(Kind):
    """On or off."""

    switch: ClassVar[bool] = True
    describes: ClassVar[str] = "a switch: true or false"


@dataclass(frozen=True)
class Option:
    """One option as declared: see the module's docstring."""

    flag: str  # "--eviction-grace"
    kind: Kind
    help: str
    default: Any = None  # as a user writes it (a tuple of items for a repeatable option), None: unset
    metavar: str | None = None
    commands: tuple[str, ...] = ("serve",)
    env: bool = True  # also a REGISTRY_PROXY_* variable and a --config key (else a flag only)
    hidden: bool = False  # left out of --help (still in the reference)

    @property
    def key(self) -> str:
        """The key in a `--config` file (underscores are accepted for the dashes)."""
        return self.flag.removeprefix("--")

    @property
    def dest(self) -> str:
        """The attribute of the parsed command line."""
        return self.key.replace("-", "_")

    @property
    def env_name(self) -> str | None:
        """`REGISTRY_PROXY_EVICTION_GRACE`, or None for a flag-only option."""
        return env_name(self.flag) if self.env else None

    def default_value(self) -> Any:
        """The default parsed (a MachineValue is left for the command line to compute)."""
        if self.kind.switch:
            return bool(self.default)
        if self.kind.repeat:
            return self.kind.collect([self.kind.parse(item) for item in self.default or ()])
        if self.default is None or isinstance(self.default, MachineValue):
            return self.default
        return self.kind.parse(self.default)

    def shown_default(self) -> str | None:
        """The default as --help and the reference show it; None when there is none."""
        if self.kind.switch:
            return "off" if not self.default else "on"
        if self.kind.repeat:
            return ", ".join(self.default) if self.default else None
        return None if self.default is None else str(self.default)


def env_name(flag: str) -> str:
    """`--upstream-map` → `REGISTRY_PROXY_UPSTREAM_MAP`."""
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


_SAME = object()
REQUIRED = object()  # code_default: the field has no default in code (Settings(data_dir=...))


def option(
    flag: str,
    kind: Kind,
    help: str,
    *,
    default: Any = None,
    metavar: str | None = None,
    commands: Iterable[str] = ("serve",),
    env: bool = True,
    hidden: bool = False,
    secret: bool = False,
    code_default: Any = _SAME,
) -> Any:
    """A dataclass field configured by the option `flag` (see the module's docstring). `code_default`:
    the field's default when the dataclass is built in code, if not the option's parsed default;
    `secret`: the value is left out of the dataclass's repr (so never logged)."""
    spec = Option(flag, kind, help, default, metavar, tuple(commands), env, hidden)
    value = spec.default_value() if code_default is _SAME else code_default
    metadata = {OPTION: spec}
    if value is REQUIRED:
        return field(metadata=metadata, repr=not secret)
    if isinstance(value, dict | list | set):
        return field(default_factory=value.copy, metadata=metadata, repr=not secret)
    return field(default=value, metadata=metadata, repr=not secret)


def area(cls: type) -> Any:
    """A dataclass field holding a nested group of settings (built from the same option values)."""
    return field(default_factory=cls, metadata={AREA: cls})


def options_of(cls: type) -> tuple[Option, ...]:
    """The options of a settings dataclass and its areas, in the order they are declared."""
    found: list[Option] = []
    for item in fields(cls):
        if AREA in item.metadata:
            found.extend(options_of(item.metadata[AREA]))
        elif OPTION in item.metadata:
            found.append(item.metadata[OPTION])
    return tuple(found)


def build(cls: type, values: Mapping[str, Any], **derived: Any) -> Any:
    """An instance of the settings dataclass `cls` from option values by `Option.dest` (a value of None,
    or none, leaves the field's default) and `derived` values by field name; a `cls` with areas takes
    its settings by name, whichever their area (`nest`)."""
    given: dict[str, Any] = {}
    for item in _leaves(cls):
        spec = item.metadata.get(OPTION)
        if spec is not None and values.get(spec.dest) is not None:
            given[item.name] = values[spec.dest]
    return cls(**given, **derived)


def nest(cls: type, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `cls` from `settings` named by their own field names, whichever area holds them, or
    by an area's name for a whole area; the rest keep their defaults (TypeError for an unknown name)."""
    rest = dict(settings)
    values: dict[str, Any] = {}
    for item in fields(cls):
        if item.name in rest:
            values[item.name] = rest.pop(item.name)
        elif AREA in item.metadata:
            inner = {leaf.name for leaf in fields(item.metadata[AREA])}
            values[item.name] = item.metadata[AREA](**{name: rest.pop(name) for name in list(rest) if name in inner})
        elif item.default_factory is not MISSING:
            values[item.name] = item.default_factory()
        elif item.default is not MISSING:
            values[item.name] = item.default
        else:
            raise TypeError(f"{cls.__name__}() needs {item.name}")
    if rest:
        raise TypeError(f"{cls.__name__}() has no setting {', '.join(sorted(rest))}")
    return values


def _leaves(cls: type) -> list[Any]:
    """The fields of `cls` and of its areas, areas left out."""
    found = []
    for item in fields(cls):
        found.extend(_leaves(item.metadata[AREA]) if AREA in item.metadata else [item])
    return found
