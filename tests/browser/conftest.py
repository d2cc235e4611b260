"""Browser fixtures: Debian's `chromium` driven by `chromedriver` through selenium, headless."""

from __future__ import annotations

import shutil
import sys
import warnings

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
try:
    import selenium  # noqa: F401 - only whether it is installed
except ImportError:  # pragma: no cover - the test extra installs it
    SELENIUM = False
else:
    SELENIUM = True


def pytest_collection_modifyitems(items):
    missing = [
        name
        for name, found in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER), ("selenium (pip)", SELENIUM))
        if not found
    ]
    if not missing:
        return
    message = f"{' and '.join(missing)} NOT FOUND: the browser tests of the page are SKIPPED (make test installs them)"
    warnings.warn(message, stacklevel=1)
    print(f"\n*** {message} ***\n", file=sys.stderr)
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=message))
