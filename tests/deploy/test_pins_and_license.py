"""constraints.txt pins every dependency setup.cfg declares (runtime and test) to a version its
specifier allows, `make` and the container install with it, and LICENSE is the licence setup.cfg names."""

from __future__ import annotations

import configparser
import hashlib
import re

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.fakes.process import REPO_ROOT

# SHA-256 of the official plain-text MPL 2.0 (https://www.mozilla.org/media/MPL/2.0/index.txt)
MPL_2_0_SHA256 = "fab3dd6bdab226f1c08630b1dd917e11fcb4ec5e1e020e2c16f83a0a13863e85"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)$")


def setup_cfg() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    return config


def pins() -> dict[str, Version]:
    found: dict[str, Version] = {}
    for line in (REPO_ROOT / "constraints.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"not a NAME==VERSION pin: {line!r}"
        name = canonicalize_name(match.group(1))
        assert name not in found, f"{name} pinned twice"
        found[name] = Version(match.group(2))
    return found


def declared() -> list[Requirement]:
    options = setup_cfg()
    lines = options["options"]["install_requires"].splitlines() + options["options.extras_require"]["test"].splitlines()
    return [Requirement(line.strip()) for line in lines if line.strip()]


def test_every_declared_dependency_is_pinned_within_its_specifier():
    pinned = pins()
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement.name} is not in constraints.txt: run `make constraints`"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"constraints.txt pins {name}=={pinned[name]}, outside setup.cfg's {requirement}"
        )


def test_the_project_itself_is_not_pinned():
    assert canonicalize_name(setup_cfg()["metadata"]["name"]) not in pins()


def test_make_installs_runtime_only_for_run_and_everything_with_the_constraints():
    makefile = (REPO_ROOT / "Makefile").read_text()

    def recipe(target: str) -> str:
        return re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)

    assert re.search(r"^run: (.+)$", makefile, re.MULTILINE).group(1).split() == ["install-runtime"]
    assert re.search(r"^install-runtime: (.+)$", makefile, re.MULTILINE).group(1).split() == ["$(RUN_STAMP)"]
    runtime, everything = recipe("$(RUN_STAMP)"), recipe("$(STAMP)")
    assert "-c $(CONSTRAINTS) -e .\n" in runtime and "[test]" not in runtime
    assert "-c $(CONSTRAINTS) -e '.[test]'" in everything
    assert re.search(r"^CONSTRAINTS := constraints.txt$", makefile, re.MULTILINE)


def test_license_is_the_official_mpl_2_0_named_in_setup_cfg():
    assert setup_cfg()["metadata"]["license"] == "MPL-2.0"
    text = (REPO_ROOT / "LICENSE").read_bytes()
    assert text.startswith(b"Mozilla Public License Version 2.0\n")
    assert hashlib.sha256(text).hexdigest() == MPL_2_0_SHA256
