"""docs/configuration.md, rendered from the declared options (`proxy.settings.config`): one section per area of
settings, one entry per option with its flag, variable, file key, value and bounds, default and commands.

`scripts/configuration_reference.py` writes the file; a test keeps it equal to what this renders.
Pure: text in, text out.
"""

from __future__ import annotations

from dataclasses import fields

from proxy.settings.config import OPTIONS, CheckOptions, ClientOptions, Settings
from proxy.settings.optionspec import AREA, OPTION, Duration, MachineValue, Option, env_name
from proxy.settings.values import format_duration

PREAMBLE = f"""\
# Configuration reference

<!-- Generated from the option declarations in proxy/settings/config.py by scripts/configuration_reference.py.
Do not edit by hand: a test fails while this file and the code differ. -->

Every option of `registry-proxy` is listed here, by area. Each can be given, the first that is set
winning:

1. as a flag: `--eviction-grace 15m`;
2. as an environment variable: `REGISTRY_PROXY_EVICTION_GRACE=15m`;
3. as a key of the TOML file named by `--config FILE` (or `{env_name("--config")}`), spelled as the flag
   with dashes or underscores: `eviction-grace = "15m"`;
4. else its default.

Repeatable options take the flag several times, a comma-separated variable or a TOML list of strings.
Switches take a bare flag, a variable of `true`/`false` (or `1`/`0`, `yes`/`no`, `on`/`off`; empty is
off) or a TOML boolean. Numbers may be written bare in the file. An empty variable leaves an option
without a default unset. `export`, `import`, `verify`, `gc` and `healthcheck` read the same file as
`serve`: they take the keys they have and check the others.

Durations are written `500ms`, `30s`, `10m`, `1h` or `1d` (a number alone is seconds); sizes `100KB`,
`64KiB`, `512MiB` or `2GiB` (a number alone is bytes). Every value is checked against the bounds given
below, whatever its source, and a value out of bounds stops start-up with one line naming the option,
the value and where it came from: zero and negative values are refused unless the bounds say
"0 or more". So are an unknown `REGISTRY_PROXY_*` variable and an unknown or mistyped file key.

For tests only, `--unsafe-short-timings` lowers every duration's minimum to
{format_duration(0.001)} (see [Testing](#testing)).
"""

# The sections of the top-level groups' own options (an area's section comes from its docstring).
_TOP = {
    Settings: (
        "Data directory",
        "Where the proxy keeps its archives (unless they are in S3), metadata, keyring and generated TLS files.",
    ),
    ClientOptions: (
        "Clients of a running proxy",
        "How `lock` and `warm` reach a running proxy, and which CA `healthcheck` trusts.",
    ),
    CheckOptions: (
        "Health checks and garbage collection",
        "How long `healthcheck` waits, and what `gc` keeps (flags only).",
    ),
}


TESTING = """\
## Testing

Not shown by `--help`: for test suites that need short timings, never for a proxy that serves anyone.
"""


def render() -> str:
    """The whole reference, as docs/configuration.md holds it."""
    sections = [PREAMBLE]
    for group, (title, about) in _TOP.items():
        sections.extend(_sections(group, title, about))
    sections.append(TESTING)
    sections.extend(_entry(spec) for spec in OPTIONS if spec.hidden)
    return "\n".join(sections)


def _sections(group: type, title: str, about: str) -> list[str]:
    """The section of `group`'s own options, then one per area of it (titled by the area's docstring: its
    first line, then what it is about)."""
    own = [item.metadata[OPTION] for item in fields(group) if OPTION in item.metadata]
    text = [f"## {title}\n\n{about}\n", *(_entry(spec) for spec in own if not spec.hidden)]
    sections = ["\n".join(text)]
    for item in fields(group):
        if AREA in item.metadata:
            heading, _, rest = (item.metadata[AREA].__doc__ or "").strip().partition("\n")
            sections.extend(_sections(item.metadata[AREA], heading.rstrip("."), " ".join(rest.split())))
    return sections


def _entry(spec: Option) -> str:
    """One option: its names, what it does, its value and bounds, its default and its commands."""
    metavar = spec.metavar or spec.kind.metavar
    heading = f"### `{spec.flag}{'' if spec.kind.switch else f' {metavar or spec.dest.upper()}'}`"
    names = [f"variable `{spec.env_name}`", f"key `{spec.key}`"] if spec.env else ["a flag only"]
    value = spec.kind.describes
    if spec.kind.repeat:
        value += ", repeatable"
    if spec.kind.limits():
        value += f"; {spec.kind.limits()}"
    if isinstance(spec.kind, Duration) and spec.kind.why:
        value += f" ({spec.kind.why})"
    default = spec.shown_default()
    if default is not None and not isinstance(spec.default, MachineValue):
        default = f"`{default}`"
    lines = [
        heading,
        "",
        spec.help[0].upper() + spec.help[1:] + ".",
        "",
        f"- {', '.join(names)}",
        f"- value: {value}",
        f"- default: {default or 'none'}",
        f"- commands: {', '.join(f'`{command}`' for command in spec.commands)}",
        "",
    ]
    return "\n".join(lines)
