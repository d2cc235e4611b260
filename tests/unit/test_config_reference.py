"""docs/configuration.md is the code: rendered from the option declarations, it must equal the file."""

from __future__ import annotations

from pathlib import Path

from proxy.settings.config import OPTIONS
from proxy.settings.reference import render

REFERENCE = Path(__file__).parents[2] / "docs" / "configuration.md"


def test_the_reference_is_what_the_declarations_render() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == render(), (
        "docs/configuration.md differs from the options declared in proxy/settings/config.py: "
        "run `.venv/bin/python scripts/configuration_reference.py` and commit the result"
    )


def test_the_reference_names_every_option_its_variable_and_its_bounds() -> None:
    text = render()
    for spec in OPTIONS:
        assert f"### `{spec.flag}" in text
        if spec.env_name:
            assert f"variable `{spec.env_name}`, key `{spec.key}`" in text
        if spec.kind.limits():
            assert spec.kind.limits() in text
    assert "at least 1m (replicas record when they served an archive once a minute" in text  # why a minimum
