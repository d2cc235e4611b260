"""What `registry-proxy doctor` found, and how it is shown. Pure: findings in, text and an exit code out.

Each check is one line, `STATUS  CHECK  detail — fix` (the fix only where something is to be done), in the
order the checks are listed, whatever order they finished in; `--json` prints the same as a JSON list of
objects with the keys `status`, `check`, `detail` and `fix`. The exit code is 0 when every check is ok, 1 when
the worst is a warning, 2 when one failed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

OK, WARNING, FAILED = "ok", "warning", "failed"
_EXIT = {OK: 0, WARNING: 1, FAILED: 2}


@dataclass(frozen=True)
class Finding:
    """One check's outcome: its status (`OK`, `WARNING`, `FAILED`), what it found, and what to do about it."""

    status: str
    check: str
    detail: str
    fix: str = ""


def ok(check: str, detail: str) -> Finding:
    return Finding(OK, check, detail)


def warning(check: str, detail: str, fix: str) -> Finding:
    return Finding(WARNING, check, detail, fix)


def failed(check: str, detail: str, fix: str) -> Finding:
    return Finding(FAILED, check, detail, fix)


def counted(count: int, noun: str) -> str:
    """`1 rule`, `2 rules`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def exit_code(findings: Iterable[Finding]) -> int:
    """0: every check ok; 1: the worst is a warning; 2: one failed."""
    return max((_EXIT[finding.status] for finding in findings), default=0)


def text_lines(findings: list[Finding]) -> list[str]:
    """One line per finding, the status and check names in columns."""
    width = max((len(finding.check) for finding in findings), default=0)
    fixes = [f" — {finding.fix}" if finding.fix else "" for finding in findings]
    return [
        f"{finding.status:<7}  {finding.check:<{width}}  {finding.detail}{fix}"
        for finding, fix in zip(findings, fixes, strict=True)
    ]


def json_text(findings: list[Finding]) -> str:
    """The findings as a JSON list (one object per check)."""
    return json.dumps([asdict(finding) for finding in findings], indent=2, ensure_ascii=False)
