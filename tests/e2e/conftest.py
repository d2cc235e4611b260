"""End-to-end fixtures: the real `terraform` binary (the proxy process fixture is in tests/conftest.py)."""

from __future__ import annotations

import sys
import warnings

import pytest

from tests.fakes.gitrepo import make_bare_repo
from tests.fakes.packages import MODULE_FILES
from tests.fakes.process import TERRAFORM, Terraform
from tests.fakes.registry import ModuleRelease


def pytest_collection_modifyitems(items):
    if TERRAFORM is None:
        message = "terraform binary NOT FOUND on PATH: end-to-end tests are SKIPPED"
        warnings.warn(message, stacklevel=1)
        print(f"\n*** {message} ***\n", file=sys.stderr)
        for item in items:
            if "e2e" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=message))


@pytest.fixture
def terraform(tmp_path) -> Terraform:
    return Terraform(tmp_path / "tf")


@pytest.fixture
def git_modules(registry, tmp_path):
    """Modules `acme/net/aws` and `acme/subnet/aws` 1.2.0 in the fake registry, their sources in a git repository."""
    bare, _ = make_bare_repo(tmp_path / "repos", "net", MODULE_FILES, "v1.2.0")
    registry.git_root = bare.parent
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.2.0", "git::{base}/git/net.git?ref=v1.2.0"))
    registry.add_module(
        ModuleRelease(
            "acme", "subnet", "aws", "1.2.0", "git::{base}/git/net.git//modules/subnet?ref=v1.2.0", answer="json"
        )
    )
