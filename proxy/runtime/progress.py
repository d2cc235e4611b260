"""Progress of the long commands (`warm`, `export`, `import`, `gc`, `purge`, `verify`), on stderr.

On a terminal a tqdm bar counts the command's steps (archives, items, records) with the bytes beside it; where
stderr is not a terminal (a pipe, a file, a CI log) plain lines instead of a bar: one per step that has
something to say (`advance(note=...)`), else one every few steps (about `LINES` for the whole run), never a
carriage return. Either way one summary line at the end: the steps, the bytes and the seconds. Phases that are
not counted are announced with `note`. What a command prints on stdout (its result) is not touched.

    with Progress("export", "archives") as progress:
        progress.total(len(files))
        for ...:
            progress.advance(bytes=size)

A service takes a `Progress` and advances it; the web API's calls of the same services pass none and show
nothing (`Progress.silent()`). tqdm is imported only when a bar is shown.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

LINES = 20  # where no bar is shown, about this many count lines for a whole run
REFRESH = 0.2  # seconds between redraws of the bar for bytes alone


class Progress:
    """A command's progress (see the module's docstring): a context manager; `total`, `advance`, `note`."""

    def __init__(
        self,
        command: str,
        unit: str = "items",
        *,
        stream: TextIO | None = None,
        terminal: bool | None = None,
        quiet: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.command = command
        self.unit = unit
        self.stream = sys.stderr if stream is None else stream
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self.quiet = quiet
        self.done = 0
        self.bytes = 0
        self._total = 0
        self._clock = clock
        self._started = clock()
        self._drawn = 0.0
        self._bar: Any = None

    @classmethod
    def silent(cls) -> Progress:
        """A progress that shows nothing (a service called without one)."""
        return cls("", quiet=True)

    def __enter__(self) -> Progress:
        self._started = self._drawn = self._clock()
        if self.terminal and not self.quiet:
            from tqdm import tqdm

            self._bar = tqdm(
                total=self._total or None, desc=self.command, unit=f" {self.unit}", file=self.stream, dynamic_ncols=True
            )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if kind is None:  # a failure says itself, in one line
            self._line(self.summary())

    @property
    def seconds(self) -> float:
        return self._clock() - self._started

    def total(self, steps: int) -> None:
        """The steps the run will take (known once it has looked)."""
        self._total = steps
        if self._bar is not None:
            self._bar.reset(total=steps)
            self._bar.update(self.done)

    def advance(self, steps: int = 1, *, bytes: int = 0, note: str | None = None) -> None:
        """`steps` more done (0: only `bytes` more, e.g. a download under way); `note` says what the step was,
        a line of its own where no bar shows it."""
        before = self.done
        self.done += steps
        self.bytes += bytes
        if self.quiet:
            return
        if self._bar is not None:
            if bytes:
                self._bar.set_postfix_str(self._bar.format_sizeof(self.bytes, "B", 1024), refresh=False)
            if steps:
                self._bar.update(steps)
            elif self._clock() - self._drawn >= REFRESH:
                self._drawn = self._clock()
                self._bar.refresh()
        elif note is not None:
            self._line(f"[{self._count()}] {note}")
        elif steps and (self.done == self._total or self.done // self._every() > before // self._every()):
            self._line(f"{self._count()} {self.unit}" + (f", {self.bytes} bytes" if self.bytes else ""))

    def note(self, text: str) -> None:
        """A line about the run (a phase begins, something worth knowing), above the bar on a terminal."""
        self._line(text)

    def summary(self) -> str:
        """`export: done: 12 archives, 3456789 bytes in 1.2s`."""
        return f"done: {self.done} {self.unit}, {self.bytes} bytes in {self.seconds:.1f}s"

    def _count(self) -> str:
        return f"{self.done}/{self._total}" if self._total else str(self.done)

    def _every(self) -> int:
        return max(1, -(-self._total // LINES))

    def _line(self, text: str) -> None:
        if self.quiet:
            return
        line = f"{self.command}: {text}"
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)
