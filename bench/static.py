"""A local TLS server process answering a directory of static files: what nginx and the bare
aiohttp ceiling have in common (their port, their files, stopping them)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from tests.fakes.process import free_port, terminate


class StaticServer:
    """A server process of ours on 127.0.0.1 answering the files under `root/www` over TLS."""

    def __init__(self, root: Path, cert: Path, key: Path) -> None:
        self.root = root
        self.www = root / "www"
        self.port = free_port()
        self._cert, self._key = cert, key
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def put(self, path: str, data: bytes | Path) -> None:
        """Serve `data` (bytes, or a file linked/copied in) at URL path `path`."""
        target = self.www / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        if isinstance(data, Path):
            try:
                target.hardlink_to(data)
            except OSError:
                shutil.copyfile(data, target)
        else:
            target.write_bytes(data)

    async def stop(self) -> None:
        await terminate(self.process, 10)
        self.process = None
