"""README.md and docs/*.md against the code: every `--flag` and `REGISTRY_PROXY_*` variable they name
exists, every link (and its #anchor) resolves, docs/architecture.md names every module of proxy/ and shows
the stack of setup.cfg's `layers` contract, the README stays a short quick start, each guide has contents,
and the container facts the deployment guide gives match deploy/Containerfile."""

from __future__ import annotations

import argparse
import configparser
import re
from pathlib import Path

import pytest
import yaml

from proxy import __version__
from proxy.cli import build_parser
from proxy.settings.config import Settings
from tests.deploy.envvars import unknown
from tests.fakes.process import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
# Their links are checked in the changelog too (it names past flags and commands, so not those).
LINKED = [*DOCS, REPO_ROOT / "CHANGELOG.md"]
# Guides that must open with their contents.
GUIDES = ["usage", "deployment", "operations", "security", "performance", "development", "protocol", "policy"]
# Flags of other programs the docs show, and where they belong.
FOREIGN = {
    "--entrypoint": "docker run",
    "--name": "docker run",
    "--rm": "docker run",
    "--scale": "docker compose up",
    "--from-file": "kubectl create configmap",
    "--namespace": "helm install",
    "--create-namespace": "helm install",
    "--set": "helm install",
    "--set-file": "helm install",
    "--wait": "helm install",
    "--logs": "helm test",
    "--from-literal": "kubectl create secret",
    "--for": "kubectl wait",
    "--replicas": "kubectl scale",
    "--now": "systemctl enable",
    "--no-autostart": "gpg",
    "--no-cache": "lint-imports",
    "--dist": "pytest-xdist",
    "--durations": "pytest",
}
BENCH = "\n".join(path.read_text() for path in sorted((REPO_ROOT / "bench").glob("*.py")))  # the benchmarks' own flags
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*\*?")
VARIABLE = re.compile(r"\bREGISTRY_PROXY_[A-Z0-9_]*[A-Z0-9]\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
COMMAND = re.compile(r"(?:^\s*(?:\$ )?|`|&& )registry-proxy ([a-z][a-z-]*)", re.MULTILINE)


def cli_flags(parser: argparse.ArgumentParser | None = None) -> set[str]:
    """Every long option of every subcommand (nested ones included)."""
    flags: set[str] = set()
    for action in (parser or build_parser())._actions:
        flags.update(option for option in action.option_strings if option.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= cli_flags(sub)
    return flags


def named(pattern: re.Pattern) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in DOCS:
        for name in pattern.findall(path.read_text()):
            found.setdefault(name, set()).add(str(path.relative_to(REPO_ROOT)))
    return found


def unknown_flags(flags: set[str], known: set[str]) -> set[str]:
    """The flags that are neither the CLI's (a trailing `*` names a family, `--s3-*`), nor bench/'s, nor
    another program's the docs show."""
    bad = set()
    for flag in flags:
        if flag.endswith("*"):
            if not any(option.startswith(flag[:-1]) for option in known):
                bad.add(flag)
        elif flag not in known and flag not in FOREIGN and f'"{flag}"' not in BENCH:
            bad.add(flag)
    return bad


def test_every_flag_the_docs_name_exists():
    found = named(FLAG)
    assert len(found) > 60
    bad = unknown_flags(set(found), cli_flags())
    assert not bad, {flag: sorted(found[flag]) for flag in bad}


def test_every_variable_the_docs_name_exists():
    found = named(VARIABLE)
    assert len(found) > 10
    bad = unknown(set(found))
    assert not bad, {name: sorted(found[name]) for name in bad}


def subcommands() -> set[str]:
    (action,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return set(action.choices)


def test_every_command_the_docs_run_exists():
    found = named(COMMAND)
    assert {"serve", "lock", "warm", "export", "import", "verify", "gc", "healthcheck", "token"} <= set(found)
    bad = set(found) - subcommands()
    assert not bad, {name: sorted(found[name]) for name in bad}


def test_the_checks_catch_a_wrong_name():
    assert COMMAND.findall("run `registry-proxy frobnicate X`\n    registry-proxy serve --listen x") == [
        "frobnicate",
        "serve",
    ]
    assert "frobnicate" not in subcommands()
    known = cli_flags()
    assert {"--upstream-map", "--upstream-ca-file", "--max-store-size", "--only"} <= known  # serve's and export's
    assert unknown_flags({"--upstream-mpa", "--s3-*", "--s4-*", "--clients", "--rm"}, known) == {
        "--upstream-mpa",
        "--s4-*",
    }
    assert unknown({"REGISTRY_PROXY_PUBLIC_URL", "REGISTRY_PROXY_PUBLIC_URI"}) == {"REGISTRY_PROXY_PUBLIC_URI"}


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE):
        anchor, n = slug(heading), 1
        while anchor in found:
            anchor, n = f"{slug(heading)}-{n}", n + 1
        found.add(anchor)
    return found


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
            broken.append(target)
    return broken


def test_every_link_and_anchor_resolves():
    broken = {str(path.relative_to(REPO_ROOT)): found for path in LINKED if (found := broken_links(path))}
    assert not broken, broken


def test_the_link_check_can_fail(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## A `b`: c\n\n[ok](#a-b-c) [gone](#a-b) [file](missing.md) [web](https://x.org/)\n")
    assert broken_links(page) == ["#a-b", "missing.md"]


MODULE = re.compile(r"`((?:[\w.-]+/)*)(\w+\.py)`")  # `mirror.py`, `proxy/cli.py`, `metadata_store/factory.py`


def unlisted_modules(text: str, modules: list[Path]) -> tuple[set[str], set[str]]:
    """The modules of `modules` (paths under proxy/) that `text` never names, and the `x.py` it names that
    are none of them (but paths of tests/, bench/ and scripts/)."""
    others = ("tests/", "bench/", "scripts/")
    named_there = {name for folder, name in MODULE.findall(text) if not folder.startswith(others)}
    names = {path.name for path in modules if path.name != "__main__.py"}
    return names - named_there - {"__init__.py"}, named_there - names


def test_docs_architecture_names_every_module_and_only_modules():
    modules = sorted((REPO_ROOT / "proxy").rglob("*.py"))
    missing, gone = unlisted_modules((REPO_ROOT / "docs" / "architecture.md").read_text(), modules)
    assert (missing, gone) == (set(), set()), "docs/architecture.md: modules it lacks, and names of no module"


def test_the_module_check_can_fail():
    text = "`a.py` and `proxy/gone.py`, `__init__.py`; `tests/b.py`, `bench/c.py`"
    modules = [Path("proxy/x/a.py"), Path("proxy/x/b.py"), Path("proxy/x/__init__.py")]
    assert unlisted_modules(text, modules) == ({"b.py"}, {"gone.py"})


def documented_layers(text: str) -> list[frozenset[str]]:
    """The stack as docs/architecture.md's table under "The stack" gives it, top first: each row's packages
    (`web/` is proxy.web, `proxy/cli.py` is proxy.cli), `, then ` between layers of one row, `\\|` between
    siblings of one layer."""
    section = text.split("## The stack", 1)[1].split("\n## ", 1)[0]
    layers = []
    for row in re.findall(r"^\| [^|]+ \| (.+?) \| [^\n]*\|$", section, flags=re.MULTILINE)[2:]:  # past the header
        for layer in row.split(", then "):
            names = re.findall(r"`(?:proxy/)?(\w+)(?:/|\.py)`", layer)
            layers.append(frozenset(f"proxy.{name}" for name in names))
    return layers


def linted_layers() -> list[frozenset[str]]:
    """The stack of setup.cfg's `layers` contract, top first."""
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    lines = config["importlinter:contract:layers"]["layers"].split("\n")
    return [frozenset(name.strip() for name in line.split("|")) for line in lines if line.strip()]


def test_docs_architecture_shows_the_stack_lint_imports_checks():
    assert documented_layers((REPO_ROOT / "docs" / "architecture.md").read_text()) == linted_layers()
    assert len(linted_layers()) > 8


def test_the_stack_check_can_fail():
    text = (
        "## The stack\n\n| layer | packages | what |\n| --- | --- | --- |\n| entry | `proxy/cli.py` | x |\n"
        "| edges | `web/` \\| `commands/` | y |\n| low | `a/`, then `b/` | z |\n\n## Next\n| x | `c/` | w |\n"
    )
    assert documented_layers(text) == [
        {"proxy.cli"},
        {"proxy.web", "proxy.commands"},
        {"proxy.a"},
        {"proxy.b"},
    ]


def test_the_readme_is_a_quick_start():
    text = (REPO_ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 120
    for needed in (
        "make run",
        "make test",
        "make run ARGS=",
        "REGISTRY_PROXY_",
        "--config",
        "--upstream-map",
        "--upstream-ca-file",
        "tls/ca-bundle.pem",
        "network_mirror",
        'host "registry.terraform.io"',
        "terraform init",
        "502 Bad Gateway",
        "request.failed",
    ):
        assert needed in text, needed
    assert "SSL_CERT_FILE=~/.cache/registry-proxy/tls/ca.pem" not in text  # the CA alone replaces the roots


@pytest.mark.parametrize("guide", GUIDES)
def test_every_guide_opens_with_its_contents(guide):
    text = (REPO_ROOT / "docs" / f"{guide}.md").read_text()
    sections = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    contents = re.findall(r"^- \[(.+?)\]\(#([^)]+)\)$", text, flags=re.MULTILINE)
    assert [title for title, _ in contents if not title.startswith(" ")][: len(sections)] == sections
    assert text.index(f"- [{sections[0]}]") < text.index(f"## {sections[0]}")


def test_the_container_facts_in_the_deployment_guide_match_the_image():
    containerfile = (REPO_ROOT / "deploy" / "Containerfile").read_text()
    guide = (REPO_ROOT / "docs" / "deployment.md").read_text()
    (user,) = re.findall(r"^USER (\d+):(\d+)$", containerfile, flags=re.MULTILINE)
    (data_dir,) = re.findall(r"REGISTRY_PROXY_DATA_DIR=(\S+)", containerfile)
    ca = Settings(data_dir=Path(data_dir)).tls_dir / "ca.pem"
    assert f"-o {user[0]} -g {user[1]}" in guide and f"chown -R {user[0]}:{user[1]}" in guide
    assert f"docker cp registry-proxy:{ca} " in guide and f"--entrypoint cat registry-proxy {ca} >" in guide
    assert f"-v proxy-data:{data_dir} " in guide and f":{data_dir}:Z" in guide


def test_the_image_tags_the_guides_build_and_run_are_the_charts_default():
    """A tag pushed as the guide says is the one the chart pulls by default (its appVersion, the proxy's
    version): a stale tag in the build commands is an install stuck in ImagePullBackOff."""
    chart = (REPO_ROOT / "deploy" / "helm" / "registry-proxy" / "Chart.yaml").read_text()
    (app_version,) = re.findall(r'^appVersion: "?([^"\s]+)"?$', chart, flags=re.MULTILINE)
    assert app_version == __version__
    tags = {
        f"{path.name}: {tag}"
        for path in DOCS
        for tag in re.findall(r"\bregistry-proxy:(\d+\.\d+\.\d+)\b", path.read_text())
        if tag != app_version
    }
    assert not tags, f"image tags other than the chart's appVersion {app_version}: {sorted(tags)}"


def test_the_helm_guides_restore_pod_is_admitted_where_the_charts_pods_are():
    """The restore pod of docs/deployment.md runs as the chart's pods do (the user, the group, the seccomp
    profile a "restricted" namespace demands) and mounts the default release's claim."""
    guide = (REPO_ROOT / "docs" / "deployment.md").read_text()
    (manifest,) = re.findall(r"```yaml\n(# restore-pod\.yaml.*?)```", guide, flags=re.DOTALL)
    pod = yaml.safe_load(manifest)["spec"]
    values = yaml.safe_load((REPO_ROOT / "deploy" / "helm" / "registry-proxy" / "values.yaml").read_text())
    wanted = {key: value for key, value in values["podSecurityContext"].items() if key != "fsGroupChangePolicy"}
    assert pod["securityContext"] == wanted
    assert pod["containers"][0]["securityContext"].items() <= values["securityContext"].items()
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "registry-proxy-data"
