"""The import contracts of setup.cfg hold, and they do catch a module that breaks one.

`lint-imports` runs in a child process from the directory holding setup.cfg and the `proxy`
package, so the package checked is that directory's, never an installed copy. The breaking
imports are all written into one copy of the package, checked once: each must be reported
under its own contract (a run costs a second of CPU; one per breaking import was most of this file).
"""

from __future__ import annotations

import configparser
import re
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
BREAKING_IMPORTS = [  # (module, the import added to it, the contract it breaks)
    ("proxy/domain/addresses.py", "import socket", "pure"),
    ("proxy/protocol/cache_control.py", "import socket", "pure"),
    ("proxy/metadata_store/breaker.py", "import structlog", "pure"),
    ("proxy/storage/disk.py", "import proxy.providers.mirror", "layers"),
    ("proxy/web/health.py", "import proxy.commands.lock", "layers"),
    ("proxy/commands/lock.py", "import proxy.cli", "layers"),
    ("proxy/providers/mirror.py", "import proxy.governance.gatekeeper", "layers"),
    ("proxy/runtime/log.py", "import proxy.services.shared_fetches", "layers"),
    ("proxy/domain/hashes.py", "import proxy.settings.values", "layers"),
    ("proxy/storage/disk.py", "import redis", "adapters"),
    ("proxy/services/downloader.py", "import proxy.storage.disk", "storage-internals"),
    ("proxy/web/archive_responses.py", "from proxy.storage import guard", "storage-internals"),
    ("proxy/commands/terraform_config.py", "import proxy.errors", "neutral-errors"),
    ("proxy/commands/verify.py", "import proxy.providers.mirror", "commands-services"),
]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """Run lint-imports on `root`'s setup.cfg and `proxy` package."""
    return subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS], cwd=root, capture_output=True, text=True, timeout=120, check=False
    )


def contract_name(section: str) -> str:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    return config[f"importlinter:contract:{section}"]["name"]


def chain(module: str, line: str) -> str:
    """The import as lint-imports reports it: `proxy/a/b.py` and `from x import y` → `proxy.a.b -> x.y`."""
    imported = re.sub(r"^from (\S+) import (\S+)$", r"\1.\2", line).removeprefix("import ")
    return f"{module.removesuffix('.py').replace('/', '.')} -> {imported}"


def broken_contracts(report: str) -> dict[str, str]:
    """The "Broken contracts" part of a lint-imports report: each contract's name → its text."""
    details = report.split("Broken contracts\n----------------\n", 1)[1]
    headings = list(re.finditer(r"^(.+)\n-+\n", details, flags=re.MULTILINE))
    ends = [heading.start() for heading in headings[1:]] + [len(details)]
    return {heading.group(1): details[heading.end() : end] for heading, end in zip(headings, ends, strict=True)}


@pytest.fixture(scope="module")
def broken_copy(tmp_path_factory) -> subprocess.CompletedProcess[str]:
    """lint-imports' answer on a copy of the package with every import of BREAKING_IMPORTS added."""
    root = tmp_path_factory.mktemp("broken")
    shutil.copy(REPO / "setup.cfg", root / "setup.cfg")
    shutil.copytree(REPO / "proxy", root / "proxy", ignore=shutil.ignore_patterns("__pycache__"))
    for module, line, _ in BREAKING_IMPORTS:
        with (root / module).open("a", encoding="utf-8") as source:
            source.write(f"\n{line}\n")
    return lint_imports(root)


def test_the_project_keeps_its_import_contracts():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ", 0 broken." in result.stdout


def test_the_copy_breaks_every_contract_and_fails_the_check(broken_copy):
    contracts = {contract_name(contract) for _, _, contract in BREAKING_IMPORTS}
    assert broken_copy.returncode == 1, broken_copy.stdout + broken_copy.stderr
    assert set(broken_contracts(broken_copy.stdout)) == contracts
    assert f"Contracts: 0 kept, {len(contracts)} broken." in broken_copy.stdout


@pytest.mark.parametrize(("module", "line", "contract"), BREAKING_IMPORTS)
def test_a_module_that_breaks_a_contract_fails_the_check(broken_copy, module, line, contract):
    assert f"{contract_name(contract)} BROKEN" in broken_copy.stdout
    assert chain(module, line) in broken_contracts(broken_copy.stdout)[contract_name(contract)]
