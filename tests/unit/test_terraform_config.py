"""Unit tests for proxy.commands.terraform_config: which providers and registry modules a configuration needs.

Expectations follow what `terraform init` (and, for `.tofu` files, `tofu init`) installs for the
same configuration; the provider-inference cases were checked against Terraform 1.11.4.
"""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path

import pytest

from proxy.commands.terraform_config import ModuleCall, ProjectConfigError, Requirements, read_requirements
from proxy.domain.addresses import ProviderAddr

TF = "registry.terraform.io"
TOFU = "registry.opentofu.org"


def addr(source: str) -> ProviderAddr:
    parts = source.split("/")
    if len(parts) == 2:
        parts = [TF, *parts]
    return ProviderAddr.parse(*parts)


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def providers(root: Path, default_host: str = TF) -> dict[ProviderAddr, list[str]]:
    """Providers with their constraints, sorted (the order modules are visited in is not specified)."""
    return {a: sorted(c) for a, c in read_requirements(root, default_host).providers.items()}


def expected(mapping: dict[str, list[str]]) -> dict[ProviderAddr, list[str]]:
    return {addr(k): sorted(v) for k, v in mapping.items()}


# ---------------------------------------------------------------------------------------------
# required_providers
# ---------------------------------------------------------------------------------------------


def test_required_providers_object_and_legacy_string_forms(tmp_path):
    write(
        tmp_path,
        {
            "main.tf": """
        terraform {
          required_providers {
            aws = {
              source  = "hashicorp/aws"
              version = "~> 5.0"
            }
            google = "~> 4.0"
            random = {
              source = "hashicorp/random"
            }
            null = {
              version = ">= 3.0"
            }
          }
        }
    """
        },
    )
    assert providers(tmp_path) == expected(
        {
            "hashicorp/aws": ["~> 5.0"],
            "hashicorp/google": ["~> 4.0"],
            "hashicorp/random": [],
            "hashicorp/null": [">= 3.0"],
        }
    )


@pytest.mark.parametrize(
    ("source", "expected_addr"),
    [
        ("hashicorp/aws", f"{TF}/hashicorp/aws"),
        ("HashiCorp/AWS", f"{TF}/hashicorp/aws"),
        ("integrations/github", f"{TF}/integrations/github"),
        ("registry.opentofu.org/opentofu/random", f"{TOFU}/opentofu/random"),
        ("Registry.Terraform.IO/hashicorp/aws", f"{TF}/hashicorp/aws"),
        ("example.com:8443/acme/thing", "example.com:8443/acme/thing"),
        ("münchen.de/acme/cloud", "xn--mnchen-3ya.de/acme/cloud"),
    ],
)
def test_provider_source_forms(tmp_path, source, expected_addr):
    write(
        tmp_path,
        {
            "versions.tf": f"""
        terraform {{
          required_providers {{
            p = {{ source = "{source}", version = "1.0.0" }}
          }}
        }}
    """
        },
    )
    found = read_requirements(tmp_path)
    assert {str(a): c for a, c in found.providers.items()} == {expected_addr: ["1.0.0"]}


def test_default_host_applies_to_short_sources_and_implied_providers(tmp_path):
    write(
        tmp_path,
        {
            "main.tf": """
        terraform {
          required_providers {
            aws    = { source = "hashicorp/aws", version = "~> 5.0" }
            legacy = "1.0.0"
            thing  = { source = "example.com/acme/thing" }
          }
        }
        resource "random_pet" "x" {}
        provider "google" {}
    """
        },
    )
    assert providers(tmp_path, TOFU) == {
        ProviderAddr.parse(TOFU, "hashicorp", "aws"): ["~> 5.0"],
        ProviderAddr.parse(TOFU, "hashicorp", "legacy"): ["1.0.0"],
        ProviderAddr.parse("example.com", "acme", "thing"): [],
        ProviderAddr.parse(TOFU, "hashicorp", "random"): [],
        ProviderAddr.parse(TOFU, "hashicorp", "google"): [],
    }


def test_default_host_defaults_to_terraform_registry(tmp_path):
    write(tmp_path, {"main.tf": 'resource "aws_instance" "x" {}\n'})
    assert list(read_requirements(tmp_path).providers) == [ProviderAddr.parse(TF, "hashicorp", "aws")]


def test_a_configuration_without_providers_or_modules(tmp_path):
    write(tmp_path, {"main.tf": "terraform {}\n"})
    assert read_requirements(tmp_path) == Requirements()


@pytest.mark.parametrize("files", [{}, {"README.md": "# not a module\n", "x.tf.bak": "terraform {}\n"}])
def test_a_directory_without_tf_files_is_refused_naming_it(tmp_path, files):
    """Not an empty lock file written and exit 0: the directory named, and what to give instead."""
    write(tmp_path, files)
    with pytest.raises(ProjectConfigError, match=f"^{tmp_path} holds no .tf or .tofu file: name the root module"):
        read_requirements(tmp_path)


# ---------------------------------------------------------------------------------------------
# Local child modules
# ---------------------------------------------------------------------------------------------


def test_constraints_from_root_and_local_child_modules_are_merged(tmp_path):
    write(
        tmp_path,
        {
            "main.tf": """
            terraform {
              required_providers {
                aws = { source = "hashicorp/aws", version = ">= 5.0" }
              }
            }
            module "x" {
              source = "./modules/x"
            }
        """,
            "modules/x/main.tf": """
            terraform {
              required_providers {
                aws = { source = "hashicorp/aws", version = "< 6.0" }
              }
            }
            module "y" {
              source = "../y"
            }
        """,
            "modules/y/versions.tf": """
            terraform {
              required_providers {
                aws    = { source = "hashicorp/aws", version = "!= 5.5.0" }
                random = { source = "hashicorp/random", version = "~> 3.0" }
              }
            }
        """,
            "modules/unused/main.tf": """
            terraform {
              required_providers {
                aws = { source = "hashicorp/aws", version = "4.0.0" }
              }
            }
        """,
        },
    )
    assert providers(tmp_path) == expected(
        {
            "hashicorp/aws": [">= 5.0", "< 6.0", "!= 5.5.0"],
            "hashicorp/random": ["~> 3.0"],
        }
    )


def test_module_called_twice_is_read_once(tmp_path):
    write(
        tmp_path,
        {
            "main.tf": """
            module "one" {
              source = "./mod"
            }
            module "two" {
              source = "./mod/"
            }
            module "three" {
              source = "./other/../mod"
            }
        """,
            "mod/main.tf": 'terraform {\n  required_providers {\n    aws = "~> 5.0"\n  }\n}\n',
        },
    )
    assert providers(tmp_path) == expected({"hashicorp/aws": ["~> 5.0"]})


def _read_with_deadline(root: Path, seconds: float = 10.0) -> Requirements:
    result: list[Requirements] = []
    errors: list[BaseException] = []

    def run():
        try:
            result.append(read_requirements(root))
        except BaseException as exc:  # re-raised below in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "read_requirements did not finish: module cycle followed forever"
    if errors:
        raise errors[0]
    return result[0]


def test_cycle_between_local_modules_terminates(tmp_path):
    write(
        tmp_path,
        {
            "main.tf": 'module "a" {\n  source = "./modules/a"\n}\nmodule "self" {\n  source = "./"\n}\n',
            "modules/a/main.tf": 'module "b" {\n  source = "../b"\n}\nresource "aws_instance" "x" {}\n',
            "modules/b/main.tf": 'module "a" {\n  source = "../a"\n}\nmodule "root" {\n  source = "../.."\n}\n'
            'resource "random_pet" "x" {}\n',
        },
    )
    found = _read_with_deadline(tmp_path)
    assert set(found.providers) == {addr("hashicorp/aws"), addr("hashicorp/random")}


# ---------------------------------------------------------------------------------------------
# Providers implied by resources, data sources and provider blocks
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "expected_sources"),
    [
        ('resource "aws_instance" "web" {}', ["hashicorp/aws"]),
        ('data "google_compute_image" "img" {}', ["hashicorp/google"]),
        ('resource "azurerm_resource_group" "rg" {\n  name = "x"\n}', ["hashicorp/azurerm"]),
        ('resource "null_resource" "a" {}\nresource "null_resource" "b" {}', ["hashicorp/null"]),
        ('provider "google" {}', ["hashicorp/google"]),
        ('provider "aws" {\n  alias  = "west"\n  region = "us-west-2"\n}', ["hashicorp/aws"]),
        # the provider meta-argument decides, not the type prefix
        ('resource "random_pet" "x" {\n  provider = aws.west\n}', ["hashicorp/aws"]),
        ('resource "random_pet" "x" {\n  provider = aws\n}', ["hashicorp/aws"]),
        ('data "random_id" "x" {\n  provider = google.eu\n}', ["hashicorp/google"]),
        ('resource "aws_instance" "x" {\n  provider = aws.west\n}', ["hashicorp/aws"]),
    ],
)
def test_implied_providers(tmp_path, config, expected_sources):
    write(tmp_path, {"main.tf": config + "\n"})
    assert providers(tmp_path) == expected({s: [] for s in expected_sources})


def test_local_name_maps_resources_provider_blocks_and_meta_arguments(tmp_path):
    write(
        tmp_path,
        {
            "main.tf": """
        terraform {
          required_providers {
            mycloud = { source = "acme/cloud", version = "~> 1.0" }
          }
        }
        provider "mycloud" {
          alias = "eu"
        }
        resource "mycloud_thing" "a" {}
        data "mycloud_image" "b" {}
        resource "random_pet" "c" {
          provider = mycloud.eu
        }
    """
        },
    )
    assert providers(tmp_path) == expected({"acme/cloud": ["~> 1.0"]})


def test_local_names_apply_to_the_whole_module_not_just_their_file(tmp_path):
    # The usual layout: required_providers in versions.tf, resources elsewhere.
    # `terraform init` installs only acme/cloud here (no hashicorp/mycloud).
    write(
        tmp_path,
        {
            "versions.tf": """
            terraform {
              required_providers {
                mycloud = { source = "acme/cloud", version = "~> 1.0" }
              }
            }
        """,
            "main.tf": 'resource "mycloud_thing" "x" {}\nprovider "mycloud" {}\n',
            "z_more.tf": 'resource "random_pet" "y" {\n  provider = mycloud\n}\n',
        },
    )
    assert providers(tmp_path) == expected({"acme/cloud": ["~> 1.0"]})


def test_local_names_do_not_leak_between_modules(tmp_path):
    write(
        tmp_path,
        {
            "main.tf": 'module "child" {\n  source = "./child"\n}\nresource "mycloud_thing" "x" {}\n',
            "child/main.tf": """
            terraform {
              required_providers {
                mycloud = { source = "acme/cloud" }
              }
            }
            resource "mycloud_thing" "y" {}
        """,
        },
    )
    assert providers(tmp_path) == expected({"acme/cloud": [], "hashicorp/mycloud": []})


@pytest.mark.parametrize(
    "config",
    [
        'resource "terraform_data" "x" {}',
        'data "terraform_remote_state" "net" {\n  backend = "local"\n}',
    ],
)
def test_builtin_terraform_provider_is_not_a_registry_provider(tmp_path, config):
    # terraform_* types belong to terraform.io/builtin/terraform, which is never installed.
    write(tmp_path, {"main.tf": config + '\nresource "aws_instance" "x" {}\n'})
    assert providers(tmp_path) == expected({"hashicorp/aws": []})


# ---------------------------------------------------------------------------------------------
# .tofu files
# ---------------------------------------------------------------------------------------------


def test_tofu_file_replaces_tf_file_of_the_same_name(tmp_path):
    write(
        tmp_path,
        {
            "main.tf": """
            terraform {
              required_providers {
                aws = { source = "hashicorp/aws", version = "~> 4.0" }
              }
            }
            resource "google_compute_instance" "only_in_tf" {}
            module "only_in_tf" {
              source = "hashicorp/consul/aws"
            }
        """,
            "main.tofu": """
            terraform {
              required_providers {
                aws = { source = "hashicorp/aws", version = "~> 5.0" }
              }
            }
        """,
            "other.tf": 'resource "random_pet" "x" {}\n',
            "extra.tofu": 'resource "null_resource" "x" {}\n',
        },
    )
    found = read_requirements(tmp_path)
    assert {a: sorted(c) for a, c in found.providers.items()} == expected(
        {
            "hashicorp/aws": ["~> 5.0"],
            "hashicorp/random": [],
            "hashicorp/null": [],
        }
    )
    assert found.modules == []


def test_tofu_replacement_applies_in_child_modules(tmp_path):
    write(
        tmp_path,
        {
            "main.tf": 'module "c" {\n  source = "./c"\n}\n',
            "c/versions.tf": 'terraform {\n  required_providers {\n    aws = "~> 4.0"\n  }\n}\n',
            "c/versions.tofu": 'terraform {\n  required_providers {\n    aws = "~> 5.0"\n  }\n}\n',
        },
    )
    assert providers(tmp_path) == expected({"hashicorp/aws": ["~> 5.0"]})


# ---------------------------------------------------------------------------------------------
# Registry module calls
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "version", "registry_address"),
    [
        ("hashicorp/consul/aws", "0.1.0", f"{TF}/hashicorp/consul/aws"),
        ("terraform-aws-modules/vpc/aws", "~> 5.0", f"{TF}/terraform-aws-modules/vpc/aws"),
        (
            "app.terraform.io/example-corp/k8s-cluster/azurerm",
            ">= 1.0",
            "app.terraform.io/example-corp/k8s-cluster/azurerm",
        ),
        ("registry.opentofu.org/acme/net/aws", "", "registry.opentofu.org/acme/net/aws"),
        ("example.com:8443/acme/net/aws", "1.2.3", "example.com:8443/acme/net/aws"),
        # a sub-directory of the package does not change which package is fetched
        ("hashicorp/consul/aws//modules/consul-cluster", "0.1.0", f"{TF}/hashicorp/consul/aws"),
        (
            "app.terraform.io/example-corp/k8s-cluster/azurerm//modules/x",
            "~> 1.0",
            "app.terraform.io/example-corp/k8s-cluster/azurerm",
        ),
    ],
)
def test_registry_module_calls_are_collected(tmp_path, source, version, registry_address):
    version_line = f'  version = "{version}"\n' if version else ""
    write(tmp_path, {"main.tf": f'module "m" {{\n  source = "{source}"\n{version_line}}}\n'})
    (call,) = read_requirements(tmp_path).modules
    assert call.source.split("//", 1)[0] == registry_address
    assert call.version == version
    assert call.caller == str((tmp_path / "main.tf").resolve())


def test_module_calls_use_default_host_and_are_collected_from_child_modules(tmp_path):
    write(
        tmp_path,
        {
            "main.tf": 'module "c" {\n  source = "./c"\n}\n'
            'module "vpc" {\n  source = "acme/vpc/aws"\n  version = "1.0.0"\n}\n',
            "c/main.tf": 'module "net" {\n  source = "acme/net/aws"\n  version = "~> 2.0"\n}\n',
        },
    )
    found = read_requirements(tmp_path, TOFU)
    root, child = (tmp_path / "main.tf").resolve(), (tmp_path / "c" / "main.tf").resolve()
    assert sorted(found.modules, key=lambda m: m.source) == [
        ModuleCall(f"{TOFU}/acme/net/aws", "~> 2.0", str(child)),
        ModuleCall(f"{TOFU}/acme/vpc/aws", "1.0.0", str(root)),
    ]


@pytest.mark.parametrize(
    "source",
    [
        "./local",
        "../sibling",
        "git::https://example.com/vpc.git",
        "git::https://example.com/vpc.git?ref=v1.2.0",
        "git@github.com:hashicorp/example.git",
        "github.com/hashicorp/example",
        "github.com/hashicorp/example//sub",
        "bitbucket.org/hashicorp/terraform-consul-aws",
        "https://example.com/vpc-module.zip",
        "s3::https://s3-eu-west-1.amazonaws.com/examplecorp-terraform-modules/vpc.zip",
        "gcs::https://www.googleapis.com/storage/v1/modules/foomodule.zip",
        "hg::http://example.com/vpc.hg",
        "hashicorp/consul",
    ],
)
def test_non_registry_module_sources_are_not_collected(tmp_path, source):
    root = tmp_path / "root"
    (root / "local").mkdir(parents=True)
    (tmp_path / "sibling").mkdir()
    write(root, {"main.tf": f'module "m" {{\n  source = "{source}"\n}}\n'})
    assert read_requirements(root).modules == []


def test_missing_local_module_directory_is_an_error(tmp_path):
    write(tmp_path, {"main.tf": 'module "m" {\n  source = "./nowhere"\n}\n'})
    with pytest.raises(ProjectConfigError, match="nowhere is not a directory"):
        read_requirements(tmp_path)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "bad_file"),
    [
        ({"main.tf": 'resource "aws_instance" "x" {\n'}, "main.tf"),
        ({"main.tf": "terraform {\n  required_providers = = {}\n}\n"}, "main.tf"),
        ({"ok.tf": 'resource "aws_instance" "x" {}\n', "broken.tofu": "provider {"}, "broken.tofu"),
        ({"main.tf": 'module "c" {\n  source = "./c"\n}\n', "c/bad.tf": 'module "x" {'}, "c/bad.tf"),
    ],
)
def test_unparseable_file_is_named(tmp_path, files, bad_file):
    write(tmp_path, files)
    with pytest.raises(ProjectConfigError) as info:
        read_requirements(tmp_path)
    assert str((tmp_path / bad_file).resolve()) in str(info.value)


def test_non_utf8_file_is_an_error(tmp_path):
    (tmp_path / "main.tf").write_bytes(b'resource "aws_instance" "\xff" {}\n')
    with pytest.raises(ProjectConfigError):
        read_requirements(tmp_path)


@pytest.mark.parametrize(
    "source",
    [
        "a/b/c/d",
        "hashicorp/-aws",
        "hashicorp/aws-",
        "hashi--corp/aws",
        "hashicorp/",
        "/aws",
        "bad host!/acme/thing",
        "example.com:99999/acme/thing",
    ],
)
def test_invalid_provider_source(tmp_path, source):
    config = f'terraform {{\n  required_providers {{\n    p = {{ source = "{source}" }}\n  }}\n}}\n'
    write(tmp_path, {"main.tf": config})
    with pytest.raises(ProjectConfigError, match="invalid provider source") as info:
        read_requirements(tmp_path)
    assert "main.tf" in str(info.value)


@pytest.mark.parametrize(
    "body",
    ['module "m" {}\n', 'module "m" {\n  version = "1.0.0"\n}\n', 'module "m" {\n  source = 5\n}\n'],
)
def test_module_without_source(tmp_path, body):
    write(tmp_path, {"main.tf": body})
    with pytest.raises(ProjectConfigError, match="'m' has no source"):
        read_requirements(tmp_path)


def test_path_that_is_not_a_directory(tmp_path):
    file = write(tmp_path, {"main.tf": 'resource "aws_instance" "x" {}\n'}) / "main.tf"
    for path in (file, tmp_path / "missing"):
        with pytest.raises(ProjectConfigError, match="not a directory"):
            read_requirements(path)
