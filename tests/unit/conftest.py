"""Hypothesis profiles for the property tests: `suite` bounds the examples a run of the suite generates;
`thorough` (`HYPOTHESIS_PROFILE=thorough make test-unit`) generates ten times as many."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

SUITE_EXAMPLES = 50

settings.register_profile(
    "suite", max_examples=SUITE_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=10 * SUITE_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))
