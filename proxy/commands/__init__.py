"""The CLI commands besides `serve`: `lock` and `warm` (through a running proxy), `export`, `import`
and `verify` (on a data directory, no proxy needed)."""


class CommandError(Exception):
    """A command failed for a reason the user can act on; the message says what and why."""
