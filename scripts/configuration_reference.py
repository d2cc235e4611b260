"""Write docs/configuration.md from the option declarations (proxy/settings/config.py): run after changing an option.

.venv/bin/python scripts/configuration_reference.py
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from proxy.settings.reference import render  # noqa: E402 - after the path above

TARGET = REPO / "docs" / "configuration.md"


def main() -> None:
    TARGET.write_text(render(), encoding="utf-8")
    print(f"wrote {TARGET.relative_to(REPO)}")


if __name__ == "__main__":
    main()
