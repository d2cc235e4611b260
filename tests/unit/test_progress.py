"""The long commands' progress (`proxy.runtime.progress`): plain lines where stderr is not a terminal, a tqdm bar
where it is, a summary either way, nothing with --quiet."""

from __future__ import annotations

import io
import itertools

import pytest

from proxy.runtime.progress import LINES, Progress


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as stderr on one does."""

    def isatty(self) -> bool:
        return True


def ticking(step: float = 0.5):
    """A clock that moves `step` seconds each time it is read."""
    counter = itertools.count()
    return lambda: next(counter) * step


def test_plain_lines_name_each_noted_step_then_the_summary() -> None:
    stream = io.StringIO()
    with Progress("warm", "items", stream=stream, clock=ticking()) as progress:
        progress.note("2 providers to warm")
        progress.total(2)
        progress.advance(0, bytes=300)  # bytes under way: no line of their own
        progress.advance(note="provider a 1.0.0 linux_amd64: ok (300 bytes)")
        progress.advance(note="provider b 1.0.0 linux_amd64: FAILED: gone")
    assert stream.getvalue().splitlines() == [
        "warm: 2 providers to warm",
        "warm: [1/2] provider a 1.0.0 linux_amd64: ok (300 bytes)",
        "warm: [2/2] provider b 1.0.0 linux_amd64: FAILED: gone",
        "warm: done: 2 items, 300 bytes in 0.5s",
    ]
    assert "\r" not in stream.getvalue()


def test_plain_count_lines_come_every_few_steps_and_at_the_last() -> None:
    stream = io.StringIO()
    steps = 3 * LINES + 1
    with Progress("export", "archives", stream=stream) as progress:
        progress.total(steps)
        for _ in range(steps):
            progress.advance(bytes=10)
    lines = stream.getvalue().splitlines()
    assert lines[:2] == ["export: 4/61 archives, 40 bytes", "export: 8/61 archives, 80 bytes"]  # every 4th
    assert lines[-2:-1] == ["export: 61/61 archives, 610 bytes"]  # and the last
    assert len(lines) == 61 // 4 + 2 and lines[-1].startswith("export: done: 61 archives, 610 bytes in ")


def test_a_failed_run_ends_without_a_summary_and_quiet_shows_nothing() -> None:
    stream = io.StringIO()
    with pytest.raises(RuntimeError), Progress("gc", stream=stream) as progress:
        progress.total(1)
        progress.advance()
        raise RuntimeError("the metadata store went away")
    assert stream.getvalue() == "gc: 1/1 items\n"  # the error is said once, by the command

    quiet = Terminal()
    with Progress("gc", stream=quiet, quiet=True) as progress:
        progress.note("never shown")
        progress.total(1)
        progress.advance(bytes=1)
    assert quiet.getvalue() == "" and (progress.done, progress.bytes) == (1, 1)


def test_on_a_terminal_a_bar_counts_the_steps_and_notes_go_above_it() -> None:
    stream = Terminal()
    with Progress("import", "archives", stream=stream, clock=ticking(0)) as progress:
        progress.total(4)
        progress.note("unpacking bundle.tar.zst")
        for _ in range(4):
            progress.advance(bytes=2048)
    shown = stream.getvalue()
    assert "\r" in shown and "import: 100%|" in shown and "4/4" in shown and "archives/s" in shown
    assert "8.00kB" in shown  # the bytes beside the bar
    assert "import: unpacking bundle.tar.zst\n" in shown
    assert shown.endswith("\nimport: done: 4 archives, 8192 bytes in 0.0s\n")  # below the bar, which stays
    assert "[1/4]" not in shown  # no plain lines under a bar
