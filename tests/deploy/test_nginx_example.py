"""deploy/nginx.conf passes the client's address and scheme on, and never a client-forged list."""

from __future__ import annotations

import re

from tests.fakes.process import REPO_ROOT


def test_nginx_example_sets_the_forwarded_headers_from_its_own_view():
    text = (REPO_ROOT / "deploy" / "nginx.conf").read_text()
    headers = dict(re.findall(r"^\s*proxy_set_header\s+(\S+)\s+(\S+);", text, re.MULTILINE))
    assert headers["X-Forwarded-For"] == "$remote_addr"  # not $proxy_add_x_forwarded_for: the edge overwrites
    assert headers["X-Forwarded-Proto"] == "$scheme"
    assert headers["X-Request-Id"] == "$request_id"
