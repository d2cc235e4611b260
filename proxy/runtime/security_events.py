"""Security events: a check that refused an archive, a checksum file or a signature.

Every one is logged as `security.verification_failed` (naming the provider or module and the
facts of the failure) and counted in `registry_proxy_verification_failures_total{check}`.
"""

from __future__ import annotations

import structlog

from proxy.domain.addresses import ModuleAddr, ProviderAddr
from proxy.runtime.metrics import Metrics

log = structlog.get_logger(__name__)


def security_event(metrics: Metrics, check: str, subject: ProviderAddr | ModuleAddr, **facts: object) -> None:
    """Log and count a failed verification of `check` for a provider's or module's artifact."""
    metrics.verification_failures.labels(check).inc()
    kind = "module" if isinstance(subject, ModuleAddr) else "provider"
    log.error("security.verification_failed", check=check, **{kind: str(subject)}, **facts)
