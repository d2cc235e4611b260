"""Every REGISTRY_PROXY_* name written anywhere under deploy/ (comments included) is a variable the
CLI reads, so the container, compose, Kubernetes and systemd files cannot drift from the flags."""

from __future__ import annotations

import re

from tests.deploy.envvars import PENDING, cli_env_vars, unknown
from tests.fakes.process import REPO_ROOT

NAME = re.compile(r"\bREGISTRY_PROXY_[A-Z0-9_]*[A-Z0-9]\b")


def deploy_files():
    return [path for path in sorted((REPO_ROOT / "deploy").rglob("*")) if path.is_file()]


def test_deploy_files_name_only_real_variables():
    seen: dict[str, set[str]] = {}
    for path in deploy_files():
        for name in NAME.findall(path.read_text()):
            seen.setdefault(name, set()).add(str(path.relative_to(REPO_ROOT)))
    assert len(seen) > 10
    bad = unknown(set(seen))
    assert not bad, {name: sorted(seen[name]) for name in bad}


def test_the_check_knows_the_serve_variables():
    names = cli_env_vars()
    assert {"REGISTRY_PROXY_LISTEN", "REGISTRY_PROXY_PLAIN_HTTP", "REGISTRY_PROXY_METADATA_SECRET_FILE"} <= names
    assert unknown({"REGISTRY_PROXY_LISTN", "REGISTRY_PROXY_LISTEN"}) == {"REGISTRY_PROXY_LISTN"}
    assert all(name.startswith("REGISTRY_PROXY_") for name in PENDING)
