"""The CLI commands besides `serve`: `lock` and `warm` (through a running proxy), `export`, `import`
and `verify` (on a data directory, no proxy needed)."""

from dataclasses import dataclass


class CommandError(Exception):
    """A command failed for a reason the user can act on; the message says what and why."""


@dataclass(frozen=True)
class Refusal:
    """One thing the proxy's policy refused: what, and the rule and reason it gave."""

    what: str
    rule: str
    reason: str

    def __str__(self) -> str:
        return f"{self.what}: rule {self.rule}: {self.reason}"


class PolicyRefusedError(CommandError):
    """The proxy's policy refused what a command asked for; `refusals` name each rule and its reason."""

    def __init__(self, message: str, refusals: list[Refusal]) -> None:
        super().__init__(message)
        self.refusals = refusals
