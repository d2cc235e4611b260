"""A proxy with the embedded store starts without the libraries only other configurations need.

Every process start pays for what it imports (about a second of CPU, nearly all imports): the S3 client
(aiobotocore/botocore) only with an S3 archive store, redis-py only with Redis, gunicorn only with
`--workers N`, python-hcl2 only for `--upstream-credentials` and the CLI's lock-file commands, jinja2 only
when the page is first rendered, joserfc (and cryptography under it) only when an OIDC token is first
checked. Checked in a fresh interpreter that imports what `serve` imports for one process and runs the
application's start-up (stores opened), then lists what it imported.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.process import child_environment

REPO = Path(__file__).resolve().parents[2]
# Each only for some configurations: the start-up of the default one must not import it.
LAZY = ("botocore", "aiobotocore", "redis", "gunicorn", "hcl2", "lark", "jinja2", "joserfc")

START = """
import asyncio, json, sys
from aiohttp import web
from proxy import cli
from proxy.web import server  # what `serve` imports to run one process
from proxy.web.app import create_app

async def start(data_dir):
    args = cli.build_parser().parse_args(["serve", "--data-dir", data_dir, "--plain-http"])
    runner = web.AppRunner(create_app(cli.settings_from_args(args)))
    await runner.setup()  # the application's start-up: stores, keyring, upstream session opened
    try:
        return sorted({name.split(".")[0] for name in sys.modules})
    finally:
        await runner.cleanup()

print("imported:", json.dumps(asyncio.run(start(sys.argv[1]))))
"""

pytestmark = pytest.mark.process


def started_imports(data_dir: Path) -> set[str]:
    """The top-level packages a fresh interpreter imported to start the default proxy in `data_dir`."""
    result = subprocess.run(
        [sys.executable, "-c", START, str(data_dir)],
        cwd=REPO,
        env={name: value for name, value in os.environ.items() if not name.startswith("REGISTRY_PROXY_")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stdout.splitlines() if line.startswith("imported: ")]
    return set(json.loads(line.removeprefix("imported: ")))


def test_the_default_start_imports_no_library_of_other_configurations(tmp_path: Path) -> None:
    imported = started_imports(tmp_path / "data")
    assert "aiohttp" in imported and "structlog" in imported  # it did start
    assert imported.isdisjoint(LAZY), sorted(imported.intersection(LAZY))


def test_the_processes_tests_start_lack_the_development_tools_as_installs_do() -> None:
    """structlog imports rich where it is installed; the test virtualenv has it (for import-linter), an install
    of the proxy does not, and the proxy processes tests start (`child_environment`) do not see it."""
    check = "import sys, structlog; print('rich' in sys.modules)"

    def imports_rich(environment: dict[str, str] | None) -> bool:
        result = subprocess.run(
            [sys.executable, "-c", check], cwd=REPO, env=environment, capture_output=True, text=True, check=True
        )
        return result.stdout.strip() == "True"

    assert imports_rich(None) == (importlib.util.find_spec("rich") is not None)  # the test virtualenv itself
    assert not imports_rich(child_environment())
