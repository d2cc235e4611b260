"""Provider version constraints as Terraform and OpenTofu apply them (Ruby-style). Pure.

Operators: `=` (or none), `!=`, `>`, `>=`, `<`, `<=`, `~>`, followed by at most one space;
no `v` prefix (the clients reject both). Omitted parts count as zero,
except for `~>`, whose precision decides what may change: `~> 1.2` allows 1.x from 1.2 on,
`~> 1.2.3` allows 1.2.x from 1.2.3 on, and `~> 1` means the same as `~> 1.0`.
A pre-release is selected only when a constraint names it exactly with `=` (or no
operator); otherwise only releases match. `canonical` renders constraints the way the
clients write them into lock files: deduplicated, sorted, omitted parts as zero.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from proxy.domain.addresses import Version

_TERM = re.compile(
    r"^\s*(?:(=|!=|>=|<=|>|<|~>) ?)?(\d+)(?:\.(\d+))?(?:\.(\d+))?"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?\s*\Z"
)
_PRIORITY = {">": 1, ">=": 2, "=": 3, "~>patch": 4, "~>minor": 5, "<=": 6, "<": 7, "!=": 8}


class ConstraintError(ValueError):
    """A version constraint string cannot be parsed."""


@dataclass(frozen=True)
class Constraint:
    """One term: operator and boundary; `precision` is how many version parts were written (1 to 3)."""

    op: str
    boundary: Version
    precision: int

    @property
    def kind(self) -> str:
        if self.op != "~>":
            return self.op
        return "~>patch" if self.precision == 3 else "~>minor"

    def allows(self, version: Version) -> bool:
        b, v = self.boundary, version
        if self.op == "=":
            return v == b
        if self.op == "!=":
            return v != b
        # Ordering operators ignore build metadata, as semantic versioning says.
        b, v = replace(b, build=""), replace(v, build="")
        if self.op == ">":
            return v > b
        if self.op == ">=":
            return v >= b
        if self.op == "<":
            return v < b
        if self.op == "<=":
            return v <= b
        upper = Version(b.major, b.minor + 1, 0) if self.kind == "~>patch" else Version(b.major + 1, 0, 0)
        return b <= v < upper

    def render(self) -> str:
        b = self.boundary
        core = f"{b.major}.{b.minor}" if self.kind == "~>minor" else f"{b.major}.{b.minor}.{b.patch}"
        core += f"-{b.prerelease}" if b.prerelease else ""
        core += f"+{b.build}" if b.build else ""
        operator = "" if self.op == "=" else f"{self.op} "
        return operator + core


def parse(text: str) -> list[Constraint]:
    """Parse `">= 1.0, < 2.0"` (comma-separated terms). An empty string means no constraint."""
    terms = []
    for raw in text.split(","):
        if not raw.strip():
            if text.strip():
                raise ConstraintError(f"invalid version constraint {text!r}: empty term")
            continue
        match = _TERM.match(raw)
        if not match:
            raise ConstraintError(f"invalid version constraint {raw.strip()!r}")
        op, major, minor, patch, pre, build = match.groups()
        precision = 1 + (minor is not None) + (patch is not None)
        boundary = Version(int(major), int(minor or 0), int(patch or 0), pre or "", build or "")
        terms.append(Constraint(op or "=", boundary, precision))
    return terms


def allows(constraints: list[Constraint], version: Version) -> bool:
    """Whether `version` meets every constraint, with the clients' pre-release rule."""
    if version.prerelease and not any(c.op == "=" and c.boundary == version for c in constraints):
        return False
    return all(c.allows(version) for c in constraints)


def newest(constraints: list[Constraint], available: list[Version]) -> Version | None:
    """The newest available version meeting all constraints (None if there is none)."""
    matching = [v for v in available if allows(constraints, v)]
    return max(matching) if matching else None


def canonical(constraints: list[Constraint]) -> str:
    """The lock-file form: deduplicated, sorted by boundary then operator, joined by ", "."""
    unique = {(c.kind, c.boundary): c for c in constraints}.values()
    ordered = sorted(unique, key=lambda c: (c.boundary.precedence(), c.boundary.build, _PRIORITY[c.kind]))
    return ", ".join(c.render() for c in ordered)
