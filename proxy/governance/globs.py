"""The policy file's address globs and names, shared by its rules (`proxy.governance.policy`) and its pins
(`proxy.governance.key_trust`): checked and compiled one way. Pure."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")  # a rule's or a pin's name
_GLOB_PART = re.compile(r"^[A-Za-z0-9._:*?-]+\Z")


def address_globs(value: object, parts: int, shape: str, fail: Callable[[str], Exception]) -> tuple[str, ...] | None:
    """`value` as a list of globs of `parts` slash-separated parts (`shape`, e.g. HOST/NAMESPACE/TYPE), stripped;
    None when not given; raises `fail(why)` when malformed."""
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(item, str) for item in value):
        raise fail(f"must be a list of {shape} globs")
    globs = tuple(glob.strip() for glob in value)
    for glob in globs:
        pieces = glob.split("/")
        if len(pieces) != parts or not all(_GLOB_PART.match(piece) for piece in pieces):
            raise fail(f"{glob!r} is not a {shape} glob (each part: letters, digits, '.', '-', '_', ':', '*', '?')")
    return globs


def compile_globs(globs: Iterable[str]) -> re.Pattern[str]:
    """One case-insensitive pattern matching what any of `globs` matches."""
    return re.compile("|".join(fnmatch.translate(glob.lower()) for glob in globs), re.IGNORECASE)


def one_line(text: str) -> str:
    """`text` with its runs of white space made single spaces (a reason is shown on one line)."""
    return " ".join(text.split())
