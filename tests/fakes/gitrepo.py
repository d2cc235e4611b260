"""A real git repository, published as a bare repo for git's dumb HTTP protocol."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

FIXED_DATE = "2024-01-01T00:00:00+00:00"


def _git(*args: str, cwd: Path) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.test",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.test",
        "GIT_AUTHOR_DATE": FIXED_DATE,
        "GIT_COMMITTER_DATE": FIXED_DATE,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make_bare_repo(root: Path, name: str, files: dict[str, str], tag: str) -> tuple[Path, str]:
    """Commit `files`, tag the commit, add a later commit on main; returns (bare repo dir, tagged commit)."""
    work = root / f"{name}-work"
    work.mkdir(parents=True)
    _git("init", "-q", "-b", "main", cwd=work)
    for relative, text in files.items():
        path = work / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "first", cwd=work)
    _git("tag", tag, cwd=work)
    tagged = _git("rev-parse", "HEAD", cwd=work).strip()
    (work / "later.txt").write_text("a later commit, not part of the tag\n")
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "later", cwd=work)
    bare = root / "git" / f"{name}.git"
    bare.parent.mkdir(parents=True, exist_ok=True)
    _git("clone", "-q", "--bare", str(work), str(bare), cwd=root)
    _git("update-server-info", cwd=bare)
    return bare, tagged
