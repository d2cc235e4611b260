"""Rewrite reads of the flat Settings attributes into their areas: `settings.redis_url` becomes
`settings.metadata.redis_url` (for code written before Settings was grouped by area).

    .venv/bin/python scripts/settings_areas.py FILE...      # rewrite the files, print what changed
    .venv/bin/python scripts/settings_areas.py --list       # print the old -> new names

Which name is in which area comes from proxy/settings/config.py. Only reads of a Settings object are rewritten:
the receiver must be `settings`, `self._settings`, `app[SETTINGS]`, `Settings(...)`, a call of
`settings_from_args`/`make_settings`/`make_local_settings` or of a test's `_settings(...)` helper; other
objects with same-named attributes (an argparse namespace, server limits) are left alone. Building a
Settings needs no change: `Settings(redis_url=...)` takes any setting by its name.
"""

from __future__ import annotations

import re
import sys
from dataclasses import fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.settings.config import Settings
from proxy.settings.optionspec import AREA

CALLS = {"Settings", "settings_from_args", "make_settings", "make_local_settings", "settings", "_settings"}


def areas() -> dict[str, str]:
    """Each name an area holds (its fields and properties) → the area's name in Settings."""
    found = {}
    for item in fields(Settings):
        if AREA in item.metadata:
            cls = item.metadata[AREA]
            names = [leaf.name for leaf in fields(cls)]
            names += [name for name, value in vars(cls).items() if isinstance(value, property)]
            found.update(dict.fromkeys(names, item.name))
    return found


def receiver(text: str, end: int) -> str:
    """The expression that ends at `end`: names, dots, calls and subscripts."""
    start = end
    while start > 0:
        char = text[start - 1]
        if char in ")]":
            depth, start = 0, start - 1
            while start >= 0:
                depth += text[start] in ")]"
                depth -= text[start] in "(["
                if depth == 0:
                    break
                start -= 1
        elif char.isalnum() or char in "_.":
            start -= 1
        else:
            break
    return text[start:end]


def is_settings(expression: str) -> bool:
    """Whether `expression` (as `receiver` finds it) is a Settings object, by the patterns above."""
    if expression.endswith("SETTINGS]"):
        return True
    if expression.endswith(")"):  # a call: of one of CALLS?
        callee = expression[: len(expression) - len(_arguments(expression))]
        return callee.split(".")[-1] in CALLS
    return expression.split(".")[-1] in ("settings", "_settings")


def _arguments(expression: str) -> str:
    """The last call's parenthesised arguments at the end of `expression`."""
    depth = 0
    for start in range(len(expression) - 1, -1, -1):
        depth += expression[start] in ")]"
        depth -= expression[start] in "(["
        if depth == 0:
            return expression[start:]
    return expression


def rewrite(text: str, area_of: dict[str, str]) -> tuple[str, int]:
    pattern = re.compile(r"\.(" + "|".join(sorted(area_of, key=len, reverse=True)) + r")\b")
    parts, last, count = [], 0, 0
    for match in pattern.finditer(text):
        if is_settings(receiver(text, match.start())):
            parts += [text[last : match.start()], f".{area_of[match.group(1)]}.{match.group(1)}"]
            last, count = match.end(), count + 1
    return "".join(parts) + text[last:], count


def main(argv: list[str]) -> None:
    area_of = areas()
    if argv == ["--list"]:
        for name, area in area_of.items():
            print(f"settings.{name} -> settings.{area}.{name}")
        return
    for name in argv:
        path = Path(name)
        text, count = rewrite(path.read_text(encoding="utf-8"), area_of)
        if count:
            path.write_text(text, encoding="utf-8")
            print(f"{count:4} {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
