"""The one error hierarchy: every exception of the package is named `…Error`, every HTTP error comes from
`proxy.errors` with a stable code of its own, and docs/errors.md lists exactly those codes."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import proxy
from proxy import errors
from proxy.errors import ProxyError, code_table, hierarchy

DOC = Path(__file__).parents[2] / "docs" / "errors.md"
BEGIN, END = (
    "<!-- codes: generated from proxy/errors.py by code_table(); a test keeps them equal -->",
    "<!-- /codes -->",
)


def package_modules() -> list:
    return [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(proxy.__path__, "proxy.")
        if not info.name.startswith("proxy.__main__")
    ]


def test_every_exception_of_the_package_is_named_error_and_every_http_error_lives_in_proxy_errors():
    defined = {
        (module.__name__, cls.__name__, cls)
        for module in package_modules()
        for cls in vars(module).values()
        if inspect.isclass(cls) and issubclass(cls, BaseException) and cls.__module__ == module.__name__
    }
    assert defined, "no exception classes found"
    assert [name for _, name, _ in defined if not name.endswith("Error")] == []
    assert [
        (module, name) for module, name, cls in defined if issubclass(cls, ProxyError) and module != "proxy.errors"
    ] == []


def test_codes_are_unique_and_statuses_are_errors():
    classes = list(hierarchy())
    codes = [cls.code for cls in classes if cls is not ProxyError]
    assert len(codes) == len(set(codes)), sorted(c for c in codes if codes.count(c) > 1)
    assert all(400 <= cls.status < 600 for cls in classes)
    assert all(cls.__doc__ for cls in classes)


def test_the_body_keeps_the_protocols_errors_list_and_adds_the_code():
    error = errors.NotFoundError("no such thing")
    assert error.document() == {"errors": ["no such thing"], "code": "not_found"}
    assert errors.UnauthorizedError("x", headers={"WWW-Authenticate": "Bearer"}).headers == {
        "WWW-Authenticate": "Bearer"
    }


def test_docs_list_exactly_the_codes_of_the_hierarchy():
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC} lost its markers"
    listed = text.split(BEGIN, 1)[1].split(END, 1)[0].strip() + "\n"
    assert listed == code_table(), "docs/errors.md is out of date: paste code_table()'s output between its markers"
