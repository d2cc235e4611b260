#!/usr/bin/env python3
"""Run the benchmark suite: `make bench` or `.venv/bin/python bench/run.py [--help]`."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the proxy, tests.fakes and tests.e2e helpers, and bench itself

from bench.suite import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
