"""Offline-capable commands run from the CLI: `lock`, `warm`, `export`, `import`."""


class CommandError(Exception):
    """A command failed for a reason the user can act on; the message says what and why."""
