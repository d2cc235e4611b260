"""CHANGELOG.md keeps the Keep a Changelog 1.1.0 shape, its latest released version is the one the proxy says it
is (`registry-proxy --version`, the Kubernetes base's image tag, the Helm chart's appVersion), and every release
after the first says what to do when upgrading to it."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

import pytest

from proxy import __version__
from proxy.cli import build_parser
from tests.fakes.process import REPO_ROOT

TYPES = ["Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"]  # Keep a Changelog's, in its order
RELEASE = re.compile(r"^## \[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2})$")


class ShapeError(ValueError):
    """CHANGELOG.md is not in the Keep a Changelog shape."""


@dataclass
class Version:
    name: str  # "Unreleased" or "X.Y.Z"
    date: str = ""
    preamble: list[str] = field(default_factory=list)
    sections: dict[str, list[str]] = field(default_factory=dict)  # type -> its items


def parse(text: str) -> list[Version]:
    """The versions of a changelog, newest first; ShapeError names the first line out of shape."""
    lines = text.splitlines()
    if not lines or lines[0] != "# Changelog":
        raise ShapeError("the first line is not '# Changelog'")
    versions: list[Version] = []
    section: list[str] | None = None
    for number, line in enumerate(lines[1:], start=2):
        if line.startswith("## "):
            if line == "## [Unreleased]":
                if versions:
                    raise ShapeError(f"line {number}: [Unreleased] is not the first version")
                versions.append(Version("Unreleased"))
            elif match := RELEASE.match(line):
                versions.append(Version(".".join(match.groups()[:3]), match.group(4)))
            else:
                raise ShapeError(f"line {number}: not '## [X.Y.Z] - YYYY-MM-DD': {line!r}")
            section = None
        elif line.startswith("### "):
            kind = line[4:]
            if not versions or kind not in TYPES or kind in versions[-1].sections:
                raise ShapeError(f"line {number}: not a new section of {TYPES}: {line!r}")
            if TYPES.index(kind) < max((TYPES.index(k) for k in versions[-1].sections), default=-1):
                raise ShapeError(f"line {number}: {kind} out of order")
            section = versions[-1].sections[kind] = []
        elif line.startswith("#"):
            raise ShapeError(f"line {number}: a heading Keep a Changelog has not: {line!r}")
        elif section is not None:
            if line.startswith("- "):
                section.append(line[2:])
            elif line.startswith("  ") and section:
                section[-1] += " " + line.strip()
            elif line:
                raise ShapeError(f"line {number}: not a list item under ### {kind}: {line!r}")
        elif versions:
            versions[-1].preamble.append(line)
    for version in versions:
        if not any(version.sections.values()):
            raise ShapeError(f"[{version.name}] lists no change")
    return versions


def released(versions: list[Version]) -> list[Version]:
    """The released versions, newest first, checked to go down in version and date."""
    releases = [v for v in versions if v.name != "Unreleased"]
    numbers = [tuple(int(n) for n in v.name.split(".")) for v in releases]
    if numbers != sorted(numbers, reverse=True) or len(set(numbers)) != len(numbers):
        raise ShapeError(f"versions not newest first: {[v.name for v in releases]}")
    if [v.date for v in releases] != sorted((v.date for v in releases), reverse=True):
        raise ShapeError("dates not newest first")
    return releases


@pytest.fixture(scope="module")
def versions() -> list[Version]:
    return parse((REPO_ROOT / "CHANGELOG.md").read_text())


def test_the_changelog_is_in_the_keep_a_changelog_shape(versions):
    assert versions[0].name == "Unreleased"
    releases = released(versions)
    assert len(releases) >= 2 and releases[-1].name == "0.1.0"


def test_the_latest_release_is_the_version_the_proxy_says_it_is(versions, capsys):
    assert released(versions)[0].name == __version__
    with pytest.raises(SystemExit) as exit:
        build_parser().parse_args(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.strip() == f"registry-proxy {__version__}"


def test_the_shipped_images_and_chart_name_the_same_version():
    base = (REPO_ROOT / "deploy" / "kubernetes" / "base" / "deployment.yaml").read_text()
    assert re.findall(r"image: \S+/registry-proxy:(\S+)", base) == [__version__]
    chart = REPO_ROOT / "deploy" / "helm" / "registry-proxy" / "Chart.yaml"
    if chart.exists():  # the chart's appVersion is the image tag it deploys by default
        (app_version,) = re.findall(r"^appVersion:\s*[\"']?([^\"'\s]+)", chart.read_text(), flags=re.MULTILINE)
        assert app_version == __version__


def test_every_release_after_the_first_says_how_to_upgrade_to_it(versions):
    releases = released(versions)
    for release, previous in itertools.pairwise(releases):
        preamble = "\n".join(release.preamble)
        assert f"**Upgrading from {previous.name}:**" in preamble, release.name


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        ("# Log\n", "first line"),
        ("# Changelog\n## [0.2.0] - 2026-01-02\n### Added\n- a\n## [Unreleased]\n### Added\n- b\n", "first version"),
        ("# Changelog\n## [0.1.0]\n### Added\n- a\n", "YYYY-MM-DD"),
        ("# Changelog\n## [0.1.0] - 2026-01-01\n### Improved\n- a\n", "new section"),
        ("# Changelog\n## [0.1.0] - 2026-01-01\n### Fixed\n- a\n### Added\n- b\n", "out of order"),
        ("# Changelog\n## [0.1.0] - 2026-01-01\n### Added\n- a\n#### More\n", "heading"),
        ("# Changelog\n## [0.1.0] - 2026-01-01\n### Added\n", "lists no change"),
        ("# Changelog\n## [0.1.0] - 2026-01-01\n### Added\nprose\n", "not a list item"),
    ],
)
def test_the_shape_check_can_fail(text, wrong):
    with pytest.raises(ShapeError, match=wrong):
        parse(text)


def test_the_order_check_can_fail():
    entry = "### Added\n- a\n"
    older_first = f"# Changelog\n## [0.1.0] - 2026-01-01\n{entry}## [0.2.0] - 2026-01-02\n{entry}"
    with pytest.raises(ShapeError, match="newest first"):
        released(parse(older_first))
    dates_backwards = f"# Changelog\n## [0.2.0] - 2026-01-01\n{entry}## [0.1.0] - 2026-01-02\n{entry}"
    with pytest.raises(ShapeError, match="dates"):
        released(parse(dates_backwards))
