"""Reading what a Terraform/OpenTofu configuration needs: providers and registry modules.

Parses the `.tf` and `.tofu` files of the root module and of every local child module
(`source = "./…"` or `"../…"`) with a real HCL parser. A `.tofu` file replaces the `.tf`
file of the same name, as OpenTofu does. Providers come from `required_providers`
(object or legacy string form), `provider` blocks and, as the clients infer them, the
resource and data source types (`aws_instance` → `hashicorp/aws` on the default registry).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.domain.addresses import AddressError, Hostname, ProviderAddr
from proxy.domain.lockfile import LockFileError, parse_hcl

BUILTIN_PROVIDER = "terraform"


class ProjectConfigError(ValueError):
    """The configuration cannot be read or names something invalid."""


@dataclass(frozen=True)
class ModuleCall:
    """A registry module used by the configuration."""

    source: str  # host/namespace/name/system, host included
    version: str
    caller: str  # file that declares it, for messages


@dataclass
class Requirements:
    providers: dict[ProviderAddr, list[str]] = field(default_factory=dict)  # address → constraint strings
    modules: list[ModuleCall] = field(default_factory=list)


def read_requirements(root: Path, default_host: str = "registry.terraform.io") -> Requirements:
    """Providers (with every constraint that applies) and registry modules of the configuration at `root`."""
    check_root_module(root)
    requirements = Requirements()
    seen: set[Path] = set()
    pending = [root.resolve()]
    while pending:
        directory = pending.pop()
        if directory in seen:
            continue
        seen.add(directory)
        documents = list(_documents(directory))
        local_names: dict[str, ProviderAddr] = {}  # provider local names apply to the whole module
        for path, document in documents:
            local_names.update(_declared_providers(path, document, requirements, default_host))
        for path, document in documents:
            pending.extend(_read_document(path, document, requirements, default_host, local_names))
    return requirements


def check_root_module(root: Path) -> None:
    """Refuse a `root` that is not a directory, or holds no configuration (ProjectConfigError naming it)."""
    shown = f"{root} ({root.resolve()})" if not root.is_absolute() and root.parts in ((), ("..",)) else str(root)
    if not root.is_dir():
        raise ProjectConfigError(f"{shown} is not a directory")
    if not _configuration_files(root):
        raise ProjectConfigError(
            f"{shown} holds no .tf or .tofu file: name the root module's directory (where `terraform init` runs)"
        )


def _configuration_files(directory: Path) -> list[Path]:
    """The `.tf` and `.tofu` files of a module (a `.tofu` file replaces the `.tf` file of the same name)."""
    files = {p.stem: p for p in sorted(directory.glob("*.tf"))}
    files.update({p.stem: p for p in sorted(directory.glob("*.tofu"))})
    return sorted(files.values())


def _documents(directory: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in _configuration_files(directory):
        try:
            yield path, parse_hcl(path.read_text(encoding="utf-8"), str(path))
        except (LockFileError, UnicodeDecodeError) as exc:
            raise ProjectConfigError(str(exc)) from None


def _declared_providers(
    path: Path, document: dict[str, Any], requirements: Requirements, default_host: str
) -> dict[str, ProviderAddr]:
    local_names: dict[str, ProviderAddr] = {}
    for terraform in document.get("terraform", []):
        for required in terraform.get("required_providers", []):
            for name, spec in required.items():
                source, version = (spec.get("source"), spec.get("version")) if isinstance(spec, dict) else (None, spec)
                addr = _provider_address(source or name, default_host, path)
                local_names[name] = addr
                _require(requirements, addr, version)
    return local_names


def _read_document(
    path: Path,
    document: dict[str, Any],
    requirements: Requirements,
    default_host: str,
    local_names: dict[str, ProviderAddr],
) -> list[Path]:
    for block in document.get("provider", []):
        for name in block:
            _require(requirements, local_names.get(name) or _provider_address(name, default_host, path), None)
    for kind in ("resource", "data"):
        for block in document.get(kind, []):
            for type_name, instances in block.items():
                explicit = _explicit_provider(instances)
                name = explicit or type_name.split("_", 1)[0]
                if name == BUILTIN_PROVIDER and name not in local_names:
                    continue  # terraform_data, terraform_remote_state: built into the client
                _require(requirements, local_names.get(name) or _provider_address(name, default_host, path), None)
    children = []
    for block in document.get("module", []):
        for name, body in block.items():
            source = body.get("source") if isinstance(body, dict) else None
            if not isinstance(source, str):
                raise ProjectConfigError(f"{path}: module {name!r} has no source")
            if source.startswith(("./", "../")):
                child = (path.parent / source).resolve()
                if not child.is_dir():
                    raise ProjectConfigError(f"{path}: module {name!r}: {source} is not a directory")
                children.append(child)
            elif _is_registry_source(source):
                package = source.split("//", 1)[0]
                host = package if package.count("/") == 3 else f"{default_host}/{package}"
                requirements.modules.append(ModuleCall(host, str(body.get("version") or ""), str(path)))
    return children


def _explicit_provider(instances: Any) -> str | None:
    for body in instances.values() if isinstance(instances, dict) else []:
        provider = body.get("provider") if isinstance(body, dict) else None
        if isinstance(provider, str):
            return provider.removeprefix("${").removesuffix("}").split(".", 1)[0]
    return None


def _require(requirements: Requirements, addr: ProviderAddr, version: Any) -> None:
    constraints = requirements.providers.setdefault(addr, [])
    if isinstance(version, str) and version.strip():
        constraints.append(version)


def _provider_address(source: str, default_host: str, path: Path) -> ProviderAddr:
    parts = source.split("/")
    if len(parts) == 1:
        parts = ["hashicorp", parts[0]]
    if len(parts) == 2:
        parts = [default_host, *parts]
    if len(parts) != 3:
        raise ProjectConfigError(f"{path}: invalid provider source {source!r}")
    try:
        return ProviderAddr.parse(*parts)
    except AddressError as exc:
        raise ProjectConfigError(f"{path}: invalid provider source {source!r}: {exc}") from None


def _is_registry_source(source: str) -> bool:
    """`ns/name/system` or `host/ns/name/system` (not a URL, git, path or other getter form)."""
    if "::" in source or "://" in source or source.startswith(("/", "github.com/", "bitbucket.org/", "git@")):
        return False
    parts = source.split("//", 1)[0].split("/")
    if len(parts) == 4:
        try:
            Hostname.parse(parts[0])
        except AddressError:
            return False
        return "." in parts[0] or ":" in parts[0]
    return len(parts) == 3
