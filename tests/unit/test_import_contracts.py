"""The import contracts of setup.cfg hold, and they do catch a module that breaks one.

`lint-imports` runs in a child process from the directory holding setup.cfg and the `proxy`
package, so the package checked is that directory's, never an installed copy.
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # lint-imports runs in a child process

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = (
    "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"
)


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """Run lint-imports on `root`'s setup.cfg and `proxy` package."""
    return subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS], cwd=root, capture_output=True, text=True, timeout=120, check=False
    )


def contract_name(section: str) -> str:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    return config[f"importlinter:contract:{section}"]["name"]


def test_the_project_keeps_its_import_contracts():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ", 0 broken." in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract", "chain"),
    [
        ("proxy/domain/addresses.py", "import socket", "pure", "proxy.domain.addresses -> socket"),
        ("proxy/protocol/cache_control.py", "import socket", "pure", "proxy.protocol.cache_control -> socket"),
        ("proxy/metadata_store/breaker.py", "import structlog", "pure", "proxy.metadata_store.breaker -> structlog"),
        (
            "proxy/storage/disk.py",
            "import proxy.providers.mirror",
            "layers",
            "proxy.storage.disk -> proxy.providers.mirror",
        ),
        ("proxy/web/health.py", "import proxy.commands.lock", "layers", "proxy.web.health -> proxy.commands.lock"),
        ("proxy/commands/lock.py", "import proxy.cli", "layers", "proxy.commands.lock -> proxy.cli"),
        (
            "proxy/providers/mirror.py",
            "import proxy.governance.gatekeeper",
            "layers",
            "proxy.providers.mirror -> proxy.governance.gatekeeper",
        ),
        (
            "proxy/runtime/log.py",
            "import proxy.services.flights",
            "layers",
            "proxy.runtime.log -> proxy.services.flights",
        ),
        (
            "proxy/domain/hashes.py",
            "import proxy.settings.values",
            "layers",
            "proxy.domain.hashes -> proxy.settings.values",
        ),
        ("proxy/storage/disk.py", "import redis", "adapters", "proxy.storage.disk -> redis"),
        (
            "proxy/services/downloader.py",
            "import proxy.storage.disk",
            "storage-internals",
            "proxy.services.downloader -> proxy.storage.disk",
        ),
        (
            "proxy/web/archive_responses.py",
            "from proxy.storage import guard",
            "storage-internals",
            "proxy.web.archive_responses -> proxy.storage.guard",
        ),
        (
            "proxy/commands/terraform_config.py",
            "import proxy.errors",
            "neutral-errors",
            "proxy.commands.terraform_config -> proxy.errors",
        ),
        (
            "proxy/commands/verify.py",
            "import proxy.providers.mirror",
            "commands-services",
            "proxy.commands.verify -> proxy.providers.mirror",
        ),
    ],
)
def test_a_module_that_breaks_a_contract_fails_the_check(tmp_path, module, line, contract, chain):
    shutil.copy(REPO / "setup.cfg", tmp_path / "setup.cfg")
    shutil.copytree(REPO / "proxy", tmp_path / "proxy", ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / module).open("a", encoding="utf-8") as source:
        source.write(f"\n{line}\n")

    result = lint_imports(tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{contract_name(contract)} BROKEN" in result.stdout
    assert chain in result.stdout
    assert "Contracts: " in result.stdout and ", 1 broken." in result.stdout
