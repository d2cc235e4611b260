"""Another process using an archive store: it opens the store, leaves an unpublished download in
its temp area, and lives until told to exit or is killed (a crash).

Run as `python -m tests.fakes.store_holder MODULE:CLASS ROOT SIZE` (the store is `CLASS(ROOT)`, opened
on the event loop the process runs); it prints one JSON line `{"part": ...}` once the download is written
and fsynced, then waits for its stdin to close.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fakes.process import REPO_ROOT

READY_TIMEOUT = 30.0


class StoreHolder:
    """The parent's handle on a `store_holder` process; a context manager that kills it at exit."""

    def __init__(self, opener: str, root: Path, size: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.fakes.store_holder", opener, str(root), str(size)],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        line = self.process.stdout.readline()  # blocks until the child is ready (or died)
        if not line:
            self.process.wait(READY_TIMEOUT)
            raise RuntimeError(f"store holder failed: {self.process.stderr.read().decode()[-2000:]}")
        self.part = Path(json.loads(line)["part"])

    def kill(self) -> None:
        """SIGKILL: no cleanup, no unlock (a crash)."""
        self.process.kill()
        self.process.wait(READY_TIMEOUT)

    def exit(self) -> None:
        """A clean exit: the child closes its store."""
        self.process.stdin.close()
        self.process.wait(READY_TIMEOUT)

    def __enter__(self) -> StoreHolder:
        return self

    def __exit__(self, *exc_info) -> None:
        if self.process.poll() is None:
            self.kill()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            stream.close()


async def open_store(opener: str, root: Path) -> Any:
    """`CLASS(root)` for `opener` = "module:CLASS", opened."""
    module, _, name = opener.partition(":")
    store = getattr(importlib.import_module(module), name)(root)
    await store.open()
    return store


async def main(opener: str, root: str, size: str) -> None:
    store = await open_store(opener, Path(root))
    pending = store.begin()
    pending.write(b"\x00" * int(size))
    pending.finish()
    print(json.dumps({"part": str(pending.path)}), flush=True)
    await asyncio.to_thread(sys.stdin.read)  # until the parent closes our stdin (or kills us)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
