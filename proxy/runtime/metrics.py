"""Prometheus metrics, one registry per application instance (so tests never collide).

Series labelled with a registry `host` can be left out of an exposition (`exposition(shown_host=…)`):
a client sees a private registry's series only when its token may read that host.

Worker processes (`serve --workers N`) keep their values in files of one directory instead
(prometheus_client's multiprocess mode, `share_between_processes`), so /metrics answers
the same totals whichever worker takes the request.

What is counted on every request (its count by route and status, its duration, the cache outcome) is tallied in
plain numbers of this process first (`count_request`, `count_cache`) and folded into the metrics at most
`FOLD_EVERY` seconds later, before this process reports them (`exposition`, `totals`) and when the application
closes (`fold`): a value in the shared files costs a lock, a `getpid` and a write to the mapped file. So /metrics
counts every request of the worker that answers it, and those of the other workers within `FOLD_EVERY`.
"""

from __future__ import annotations

import asyncio
import copy
import os
import platform
import shutil
import tempfile
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess, values
from prometheus_client.metrics_core import Metric

from proxy import __version__

_shared_dir: Path | None = None
FOLD_EVERY = 1.0  # seconds the per-request counts stay in this process's tally at most


def new_shared_dir(root: Path) -> Path:
    """In the supervisor, before the workers start: an empty directory of its own (replicas may share
    `root`) where its workers will keep their values."""
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="workers-", dir=root))


def share_between_processes(directory: Path) -> None:
    """In a worker process, before any Metrics is made: keep every value in `directory`, shared by
    the workers of one supervisor."""
    global _shared_dir
    _shared_dir = directory
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    values.ValueClass = values.MultiProcessValue()


def remove_shared_dir(directory: Path) -> None:
    """In the supervisor, when it exits."""
    shutil.rmtree(directory, ignore_errors=True)


def forget_process(directory: Path, pid: int) -> None:
    """In the supervisor, when a worker exits: drop its live gauges (its counters keep counting)."""
    multiprocess.mark_process_dead(pid, str(directory))


# Request durations: metadata in milliseconds, a cold archive of several GiB in up to 15 minutes.
DURATION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    900.0,
)


class Metrics:
    """The counters, gauges and histograms the proxy exports on /metrics (Prometheus naming: base units
    in the name, `_total` on counters, `_seconds` and `_bytes`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._request_series: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._cache_series: dict[str, Any] = {}
        self._counted: dict[Any, int] = {}  # counter series -> requests counted since the last fold
        self._timed: dict[Any, list[float]] = {}  # histogram series -> [sum, count per bucket...] since then
        self._fold_timer: asyncio.TimerHandle | None = None
        self._upstream_series: dict[str, Any] = {}
        self._redis_up: Gauge | None = None
        self._store_max_bytes: Gauge | None = None
        self.build_info = Gauge(
            "registry_proxy_build_info",
            "Always 1; the labels name the running version",
            ["version", "python"],
            registry=self.registry,
            multiprocess_mode="max",
        )
        self.build_info.labels(__version__, platform.python_version()).set(1)
        self.requests = Counter(
            "registry_proxy_requests_total", "HTTP requests served", ["route", "status"], registry=self.registry
        )
        self.request_seconds = Histogram(
            "registry_proxy_request_duration_seconds",
            "Time from a request's arrival to its answer's end",
            ["route"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.upstream_seconds = Histogram(
            "registry_proxy_upstream_request_duration_seconds",
            "Time from an upstream request to its answer's headers, by host",
            ["host"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.cache = Counter(
            "registry_proxy_cache_total", "Metadata cache outcomes", ["outcome"], registry=self.registry
        )
        self.upstream_fetches = Counter(
            "registry_proxy_upstream_fetches_total",
            "Upstream requests by kind and outcome",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.upstream_bytes = Counter(
            "registry_proxy_upstream_bytes_total", "Archive bytes downloaded from upstreams", registry=self.registry
        )
        self.verification_failures = Counter(
            "registry_proxy_verification_failures_total",
            "Archives or checksums that failed verification",
            ["check"],
            registry=self.registry,
        )
        self.archive_redirects = Counter(
            "registry_proxy_archive_redirects_total",
            "Archive requests answered with a presigned URL of the object store",
            registry=self.registry,
        )
        self.store_corruptions = Counter(
            "registry_proxy_store_corruptions_total",
            "Stored archives found corrupt (and quarantined), by check",
            ["check"],
            registry=self.registry,
        )
        self.metadata_rejected = Counter(
            "registry_proxy_metadata_rejected_total",
            "Metadata store values refused (poisoned): no seal, a bad seal, or not what their namespace holds",
            ["store", "reason"],
            registry=self.registry,
        )
        self.passthrough = Counter(
            "registry_proxy_archive_passthrough_total",
            "Archives relayed from the upstream without being stored (disk full), by kind and outcome",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.unsigned_archives = Counter(
            "registry_proxy_unsigned_archives_total",
            "Provider archives stored although their registry lists no signing keys "
            "(--unsigned-providers; checked against SHA256SUMS and shasum only), by "
            "registry host",
            ["host"],
            registry=self.registry,
        )
        self.served_bytes = Counter(
            "registry_proxy_archive_served_bytes_total", "Archive bytes sent to clients", registry=self.registry
        )
        self.connections_open = Gauge(
            "registry_proxy_connections_open",
            "Client connections open (admitted)",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.connections_refused = Counter(
            "registry_proxy_connections_refused_total",
            "Client connections refused at --max-connections",
            registry=self.registry,
        )
        self.connections_dropped = Counter(
            "registry_proxy_connections_dropped_total",
            "Client connections closed by a timeout",
            ["reason"],
            registry=self.registry,
        )
        self.negative_entries = Gauge(
            "registry_proxy_negative_cache_entries",
            "Remembered upstream 404s held (fleet-wide with Redis)",
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        self.negative_bytes = Gauge(
            "registry_proxy_negative_cache_bytes",
            "Size of the remembered upstream 404s held",
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        self.store_bytes = Gauge(
            "registry_proxy_store_bytes",
            "Bytes of the archives in the store (as last listed, plus what was stored since)",
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        self.store_objects = Gauge(
            "registry_proxy_store_objects",
            "Archives in the store (as last listed, plus what was stored since)",
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        self.oidc_tokens = Counter(
            "registry_proxy_oidc_tokens_total",
            "OIDC tokens presented, by issuer (its name in --oidc-issuers; '-': none matched) and outcome "
            "(accepted, or why refused: expired, wrong_audience, bad_signature, unknown_key, ...)",
            ["issuer", "outcome"],
            registry=self.registry,
        )
        self.oidc_rules = Counter(
            "registry_proxy_oidc_rule_matches_total",
            "Accepted OIDC tokens by the issuer and the rule whose claims they matched (a rule per series)",
            ["issuer", "rule"],
            registry=self.registry,
        )
        self.oidc_key_fetches = Counter(
            "registry_proxy_oidc_key_fetches_total",
            "Fetches of an OIDC issuer's signing keys (discovery and JWKS), by issuer and outcome (ok, failed)",
            ["issuer", "outcome"],
            registry=self.registry,
        )
        self.evictions = Counter(
            "registry_proxy_store_evictions_total",
            "Archives evicted from the store (least recently served first)",
            registry=self.registry,
        )
        self.evicted_bytes = Counter(
            "registry_proxy_store_evicted_bytes_total", "Bytes freed by evicting archives", registry=self.registry
        )
        self.audit_dropped = Counter(
            "registry_proxy_audit_events_dropped_total",
            "Audit events that could not be written to --audit-log (a full disk, a removed directory) and were "
            "dropped; with --audit-required, the requests that would have produced them were refused",
            registry=self.registry,
        )
        self.policy_decisions = Counter(
            "registry_proxy_policy_decisions_total",
            "Policy decisions that refused (deny) or would have refused (would-deny, warn mode) a request, and "
            "versions withheld from a list when it was filtered anew (withheld), by rule",
            ["rule", "decision"],
            registry=self.registry,
        )
        self.signing_key_changes = Counter(
            "registry_proxy_signing_key_changes_total",
            "Releases signed by a key never seen for their provider, whose earlier releases another key signed, by "
            "what the policy's key-change decided (hold, warn, allow), and releases a pin refused (unpinned)",
            ["decision"],
            registry=self.registry,
        )

    def count_request(self, route: str, status: int, seconds: float, cache: str | None = None) -> None:
        """One request served: its count by route and status, its duration by route, and the metadata cache outcome
        `cache` it stands for when given (see `count_cache`; runs per request: tallied, and folded into the series
        later)."""
        series = self._request_series.get((route, status))
        if series is None:
            series = self._request_series[route, status] = (
                self.requests.labels(route, str(status)),
                self.request_seconds.labels(route),
            )
        counted = self._counted
        counted[series[0]] = counted.get(series[0], 0) + 1
        timed = self._timed.get(series[1])
        if timed is None:
            timed = self._timed[series[1]] = [0.0] * (len(DURATION_BUCKETS) + 2)  # the sum, the buckets, +Inf
        timed[0] += seconds
        timed[1 + bisect_left(DURATION_BUCKETS, seconds)] += 1  # the first bucket whose bound is >= seconds
        if cache is not None:
            self.count_cache(cache)
        elif self._fold_timer is None:
            self._fold_later()

    def count_cache(self, outcome: str) -> None:
        """One metadata cache outcome (hit, miss, stale): tallied, folded later."""
        series = self._cache_series.get(outcome)
        if series is None:
            series = self._cache_series[outcome] = self.cache.labels(outcome)
        self._counted[series] = self._counted.get(series, 0) + 1
        if self._fold_timer is None:
            self._fold_later()

    def _fold_later(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop to wait on: at once
            self.fold()
            return
        self._fold_timer = loop.call_later(FOLD_EVERY, self.fold)

    def fold(self) -> None:
        """Add what this process tallied since the last fold to the series (and so to the shared files)."""
        if self._fold_timer is not None:
            self._fold_timer.cancel()
            self._fold_timer = None
        counted, self._counted = self._counted, {}
        timed, self._timed = self._timed, {}
        for counter, count in counted.items():
            counter.inc(count)
        for histogram, (total, *buckets) in timed.items():
            # prometheus_client keeps a histogram child's sum and per-bucket counts as values of their own
            # (`_sum`, `_buckets`; not cumulative): `observe` adds to the sum and to the first bucket that fits.
            histogram._sum.inc(total)
            for value, count in zip(histogram._buckets, buckets, strict=True):
                if count:
                    value.inc(count)

    def observe_upstream(self, host: str, seconds: float) -> None:
        """One upstream request answered (its headers arrived) after `seconds`."""
        series = self._upstream_series.get(host)
        if series is None:
            series = self._upstream_series[host] = self.upstream_seconds.labels(host)
        series.observe(seconds)

    def redis_up(self, up: bool) -> None:
        """Whether Redis answered (exported only by a proxy that uses Redis)."""
        if self._redis_up is None:
            self._redis_up = Gauge(
                "registry_proxy_redis_up",
                "1 when the Redis metadata store answered at the last scrape, else 0",
                registry=self.registry,
                multiprocess_mode="livemin",
            )
        self._redis_up.set(1 if up else 0)

    def store_cap(self, size: int) -> None:
        """The archive store's size cap, for alerting before it is reached (exported only with a cap)."""
        if self._store_max_bytes is None:
            self._store_max_bytes = Gauge(
                "registry_proxy_store_max_bytes",
                "The archive store's size cap (--max-store-size)",
                registry=self.registry,
                multiprocess_mode="livemax",
            )
        self._store_max_bytes.set(size)

    def exposition(self, shown_host: Callable[[str], bool] | None = None) -> bytes:
        """The text format for /metrics: this instance's values, or every worker's when they are shared;
        without the series whose `host` label names a host not `shown_host` (a private registry the
        client may not read)."""
        self.fold()
        reported = self._reported()
        return generate_latest(reported if shown_host is None else _HostsShown(reported, shown_host))

    def _reported(self) -> CollectorRegistry:
        """The registry /metrics reports: this instance's, or one merging every worker's values."""
        if _shared_dir is None:
            return self.registry
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged, str(_shared_dir))
        return merged

    def totals(self) -> Totals:
        """The headline numbers, from the same values as /metrics (every worker's when they are shared)."""
        self.fold()
        sums: dict[tuple[str, str], float] = {}
        for family in self._reported().collect():
            for sample in family.samples:
                label = sample.labels.get("outcome", "")
                sums[sample.name, label] = sums.get((sample.name, label), 0.0) + sample.value
        fetches = sum(v for (name, _), v in sums.items() if name == "registry_proxy_upstream_fetches_total")
        return Totals(
            cache_hits=int(sums.get(("registry_proxy_cache_total", "hit"), 0)),
            cache_misses=int(sums.get(("registry_proxy_cache_total", "miss"), 0)),
            cache_stale=int(sums.get(("registry_proxy_cache_total", "stale"), 0)),
            bytes_served=int(sums.get(("registry_proxy_archive_served_bytes_total", ""), 0)),
            upstream_fetches=int(fetches),
            upstream_bytes=int(sums.get(("registry_proxy_upstream_bytes_total", ""), 0)),
            all_workers=_shared_dir is not None,
        )


class _HostsShown:
    """A collector passing on another's metrics without the samples labelled with a host not shown."""

    def __init__(self, source: CollectorRegistry, shown_host: Callable[[str], bool]) -> None:
        self._source = source
        self._shown = shown_host

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            kept = copy.copy(family)
            kept.samples = [s for s in family.samples if "host" not in s.labels or self._shown(s.labels["host"])]
            yield kept


@dataclass(frozen=True)
class Totals:
    """Counters since start: of this process, or of all the worker processes of this server (`all_workers`)."""

    cache_hits: int
    cache_misses: int
    cache_stale: int
    bytes_served: int
    upstream_fetches: int
    upstream_bytes: int
    all_workers: bool
