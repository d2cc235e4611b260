"""deploy/Containerfile checked by its parsed instructions (hadolint-like rules; no image can be built
here), .dockerignore by docker-py's own matcher, deploy/compose.yaml against the compose-spec schema."""

from __future__ import annotations

import json
import re
import shlex
from importlib import resources

import pytest
import yaml

from proxy.cli import build_parser
from tests.deploy.envvars import unknown
from tests.fakes.process import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"


@pytest.fixture(scope="module")
def instructions() -> list[tuple[str, str]]:
    from dockerfile_parse import DockerfileParser  # here: every worker collects this module, few run it

    with open(DEPLOY / "Containerfile", "rb") as file:
        parser = DockerfileParser(fileobj=file)
        return [(item["instruction"], item["value"]) for item in parser.structure if item["instruction"] != "COMMENT"]


def values(instructions, name: str) -> list[str]:
    return [value for instruction, value in instructions if instruction == name]


def index(instructions, predicate) -> int:
    return next(i for i, item in enumerate(instructions) if predicate(*item))


def test_base_image_is_a_full_version_tag_ready_for_a_digest(instructions):
    (base,) = values(instructions, "FROM")
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", base), base
    assert "latest" not in base and not values(instructions, "ARG")


def test_runs_as_the_non_root_user_that_owns_the_volume(instructions):
    users = values(instructions, "USER")
    assert users, "no USER: the image would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0, "numeric non-root (runAsNonRoot)"
    setup = next(value for value in values(instructions, "RUN") if "useradd" in value)
    assert re.search(rf"groupadd .*--gid {gid} proxy", setup) and re.search(rf"useradd .*--uid {uid} ", setup)
    # /data exists, owned by that user, BEFORE VOLUME: a fresh named volume copies that ownership
    creates_data = re.compile(r"install -d -o proxy -g proxy( -m 0?7[0-5]0)? /data\b")
    owned = index(instructions, lambda i, v: i == "RUN" and creates_data.search(v))
    volume = index(instructions, lambda i, v: i == "VOLUME")
    assert owned < volume and json.loads(values(instructions, "VOLUME")[0]) == ["/data"]
    user = index(instructions, lambda i, v: i == "USER")
    assert user < volume


def test_apt_installs_git_and_gnupg_without_recommends_and_removes_its_lists(instructions):
    for value in values(instructions, "RUN"):
        if "apt-get install" in value:
            assert "--no-install-recommends" in value and "-y" in value
            assert "rm -rf /var/lib/apt/lists/*" in value, "apt lists left in the layer"
            assert re.search(r"\bgit\b", value) and "gnupg" in value and "ca-certificates" in value
            assert "apt-get upgrade" not in value and "dist-upgrade" not in value


def test_pip_installs_with_the_constraints_and_no_cache(instructions):
    pip_runs = [
        i for i, (instruction, value) in enumerate(instructions) if instruction == "RUN" and "pip install" in value
    ]
    assert pip_runs
    copied = index(instructions, lambda i, v: i == "COPY" and "constraints.txt" in v.split())
    for position in pip_runs:
        value = instructions[position][1]
        assert "--no-cache-dir" in value and "-c constraints.txt" in value, value
        assert copied < position


def test_healthcheck_runs_the_healthcheck_command(instructions):
    (check,) = values(instructions, "HEALTHCHECK")
    options, _, command = check.partition("CMD")
    argv = json.loads(command)
    assert argv == ["registry-proxy", "healthcheck"]
    assert re.search(r"--timeout=(\d+)s", options) and int(re.search(r"--timeout=(\d+)s", options).group(1)) > 5
    build_parser().parse_args(argv[1:])  # the subcommand exists


def test_entrypoint_serves_by_default_and_names_only_real_settings(instructions):
    assert json.loads(values(instructions, "ENTRYPOINT")[-1]) == ["registry-proxy"]
    assert json.loads(values(instructions, "CMD")[-1]) == ["serve"]
    env = {}
    for value in values(instructions, "ENV"):
        env.update(item.split("=", 1) for item in shlex.split(value))
    assert not unknown(set(env))
    assert env["REGISTRY_PROXY_DATA_DIR"] == "/data"
    port = env["REGISTRY_PROXY_LISTEN"].rpartition(":")[2]
    assert values(instructions, "EXPOSE") == [port]
    build_parser().parse_args(["serve"])


def test_every_copied_file_is_in_the_build_context_and_nothing_else_is(instructions):
    from docker.utils.build import exclude_paths  # docker-py (requests, urllib3): only where it is used

    patterns = [
        line
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    included = exclude_paths(str(REPO_ROOT), patterns, dockerfile="deploy/Containerfile")
    for value in values(instructions, "COPY"):
        *sources, _ = value.split()
        for source in sources:
            assert (REPO_ROOT / source).exists(), f"COPY {source}: no such file"
            assert source.rstrip("/") in included, f"COPY {source}: excluded by .dockerignore"
    assert "proxy/cli.py" in included
    for unwanted in ("tests", ".git", ".venv", "bench", "run", ".data"):
        assert not any(path == unwanted or path.startswith(unwanted + "/") for path in included), unwanted


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_file_is_valid_by_the_compose_spec_schema(compose):
    import jsonschema

    schema_file = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    # the schema can fail: a misspelt key is rejected
    assert list(validator.iter_errors({"services": {"x": {"imagee": "a"}}}))


def test_compose_runs_one_proxy_on_a_fixed_port_with_redis_and_the_shared_secret(compose):
    proxy, redis = compose["services"]["registry-proxy"], compose["services"]["redis"]
    assert "scale" not in proxy and "replicas" not in proxy.get("deploy", {})
    assert "--scale registry-proxy=" not in (DEPLOY / "compose.yaml").read_text()
    assert proxy["ports"] == ["${PROXY_HOST_PORT:-8443}:8443"]
    assert proxy["environment"]["REGISTRY_PROXY_REDIS_URL"].startswith("redis://redis:")
    assert proxy["environment"]["REGISTRY_PROXY_METADATA_SECRET"].startswith("${REGISTRY_PROXY_METADATA_SECRET:?")
    assert proxy["depends_on"]["redis"]["condition"] == "service_healthy" and "healthcheck" in redis
    assert "ports" not in redis, "Redis is not published"
    assert re.fullmatch(r"redis:\d+\.\d+\.\d+-\w+", redis["image"])
    assert proxy["read_only"] is True and "/tmp" in proxy["tmpfs"]
    env_file = {
        line.split("=", 1)[0].lstrip("# ")
        for line in (DEPLOY / proxy["env_file"]).read_text().splitlines()
        if "=" in line
    }
    assert not unknown(set(proxy["environment"]) | env_file)
