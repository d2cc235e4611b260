"""constraints.txt pins every dependency setup.cfg declares (runtime and test) to a version its
specifier allows, `make` and the container install with it, and LICENSE is the licence setup.cfg names."""

from __future__ import annotations

import configparser
import hashlib
import re
import shlex
import shutil
import subprocess

import pytest
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


def make_dry_run(tmp_path, target: str) -> list[list[str]]:
    """The commands `make TARGET` runs on a machine without the virtualenv (make's own dry run: nothing
    is executed), each split into its arguments."""
    make = shutil.which("make")
    assert make, "make is not installed"
    result = subprocess.run(
        [make, "--no-print-directory", "-n", "-C", str(REPO_ROOT), f"VENV={tmp_path / 'venv'}", target],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return [shlex.split(line) for line in result.stdout.splitlines() if line.strip()]


def option(argv: list[str], flag: str) -> str | None:
    """The value after `flag` in `argv` (None without the flag)."""
    return argv[argv.index(flag) + 1] if flag in argv else None


def installs(commands: list[list[str]]) -> list[list[str]]:
    return [argv for argv in commands if "install" in argv and ("pip" in argv or "-m" in argv)]


@pytest.mark.process
def test_make_run_installs_the_runtime_only_with_the_constraints_then_serves(tmp_path):
    commands = make_dry_run(tmp_path, "run")
    project = [argv for argv in installs(commands) if "-e" in argv]
    assert len(project) == 1, commands
    (argv,) = project
    assert option(argv, "-e") == "." and option(argv, "-c") == "constraints.txt", argv
    assert commands[-1][0] == str(tmp_path / "venv" / "bin" / "registry-proxy") and commands[-1][1] == "serve"


@pytest.mark.process
def test_make_install_installs_the_test_extra_with_the_constraints(tmp_path):
    project = [argv for argv in installs(make_dry_run(tmp_path, "install")) if "-e" in argv]
    assert len(project) == 1, project
    (argv,) = project
    assert option(argv, "-e") == ".[test]" and option(argv, "-c") == "constraints.txt", argv
    # every other install is of a pinned tool (the installer itself), never of an unpinned package
    for other in installs(make_dry_run(tmp_path, "install")):
        if "-e" not in other:
            assert all("==" in word for word in other[other.index("install") + 1 :] if not word.startswith("-"))


def test_license_is_the_official_mpl_2_0_named_in_setup_cfg():
    assert setup_cfg()["metadata"]["license"] == "MPL-2.0"
    text = (REPO_ROOT / "LICENSE").read_bytes()
    assert text.startswith(b"Mozilla Public License Version 2.0\n")
    assert hashlib.sha256(text).hexdigest() == MPL_2_0_SHA256
