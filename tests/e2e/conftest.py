"""End-to-end fixtures: the real `terraform` binary (the proxy process fixture is in tests/conftest.py)."""

from __future__ import annotations

import sys
import warnings

import pytest

from tests.fakes.process import TERRAFORM, Terraform


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
