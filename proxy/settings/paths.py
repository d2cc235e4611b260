"""The disk checks of the options that name a path (`proxy.settings.optionspec.LocalPath`): a file that is not
there or not readable, a CA file that holds no PEM certificate, a data dir that is a file or under /proc, an
audit log whose directory is missing. `proxy.settings.command_line` runs them on every resolved value, so each is
one line naming the option (exit 2) before any command does anything, whatever the value's source.

Nothing is made or changed here: a directory that does not exist yet passes when it can be made.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from proxy.settings.optionspec import LocalPath

KERNEL_FILESYSTEMS = (Path("/proc"), Path("/sys"))  # no place for files the proxy keeps
STDOUT = "stdout"


def path_problem(kind: LocalPath, value: Path | str) -> str | None:
    """Why `value` cannot be what `kind` expects there, or None."""
    if kind.expects == "directory":
        return _directory_problem(Path(value))
    if kind.expects == "appendable":
        return None if value == STDOUT else _appendable_problem(Path(value))
    problem = _file_problem(Path(value))
    if problem is None and kind.expects == "certificates":
        return _certificates_problem(Path(value))
    return problem


def _file_problem(path: Path) -> str | None:
    if path.is_dir():
        return "is a directory"
    if not path.is_file():
        return "no such file"
    if not os.access(path, os.R_OK):
        return "not readable by this user"
    return None


def _certificates_problem(path: Path) -> str | None:
    try:
        ssl.create_default_context().load_verify_locations(cafile=str(path))
    except ssl.SSLError as exc:
        reason = (exc.reason or str(exc)).replace("_", " ").lower()
        return (
            f"not a file of PEM certificates (OpenSSL: {reason}); give the CA certificates in PEM form, "
            "each between -----BEGIN CERTIFICATE----- and -----END CERTIFICATE-----"
        )
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _directory_problem(path: Path) -> str | None:
    kernel = _kernel_filesystem(path)
    if kernel is not None:
        return f"is under {kernel}, a filesystem of the kernel where no files can be kept: give a directory on a disk"
    if path.exists():
        return None if path.is_dir() else "not a directory (a file is there)"
    return _creatable_problem(path)


def _appendable_problem(path: Path) -> str | None:
    if path.is_dir():
        return f"is a directory: name a file in it (e.g. {path / 'audit.log'}), or stdout"
    if path.exists():
        return None if os.access(path, os.W_OK) else "not writable by this user"
    return _creatable_problem(path, made_by_the_proxy=False)


def _creatable_problem(path: Path, *, made_by_the_proxy: bool = True) -> str | None:
    """Why `path`, which does not exist, cannot be made: its nearest existing ancestor is not a writable
    directory; or, for a file the proxy does not make directories for, its directory is missing."""
    parent = path.absolute().parent
    if not made_by_the_proxy and not parent.exists():
        return f"no such directory {parent}: create it first"
    ancestor = next(candidate for candidate in (parent, *parent.parents) if candidate.exists())
    if not ancestor.is_dir():
        return f"cannot be made: {ancestor} is a file, not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot be made: {ancestor} is not writable by this user"
    return None


def _kernel_filesystem(path: Path) -> Path | None:
    """The kernel filesystem (/proc, /sys) that `path` is under once links are followed, if any."""
    real = Path(os.path.realpath(path))
    return next((root for root in KERNEL_FILESYSTEMS if real == root or root in real.parents), None)
