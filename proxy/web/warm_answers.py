"""Whole warm metadata answers, reused by this process for a moment: a warm `index.json` or `:version.json` asked
again within `HOLD` seconds is answered from the answer rendered last time, without asking the services.

Each answer is kept under a key of everything it depends on (the request's path, the client's signed-URL key,
the policy in force and the client's facets that policy judges), and reused only

- until `HOLD` has passed since it was made, and never after the cached documents it was made from turn stale
  (by the documents' clock), nor once the policy's decisions in it may change (`valid_until`, by the policy's
  clock: a held-back version coming of age);
- while this process's metadata store front has not changed since (`generation`: any write or purge here
  drops every reuse at once, so this process sees its own new archives and records at once; a write by another
  worker or replica is seen within `HOLD`);
- while the policy in force is the very object it was made under (a reload makes another) and the process has
  learned no publish time since (`proxy.governance.gatekeeper.Gatekeeper.stamp`: decisions may change with one).

Refusals are never kept (only answers that were made are), access control runs before every request, and a
purge empties this memo with every other (`proxy.runtime.memo.forget_all`). The remaining freshness of a reused answer
is what it was made with, less the time since: its `Cache-Control` is the one a fresh rendering would get.
Pure: no I/O here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from proxy.runtime.memo import Memo
from proxy.web.renderings import Rendering

HOLD = 1.0  # seconds a warm answer is reused at most
ENTRIES = 4096


@dataclass(frozen=True)
class _Kept:
    rendered: Rendering
    fresh_until: float  # when the documents it was made from turn stale (this memo's clock)
    reuse_until: float
    generation: int
    policy: object
    stamp: int  # the gatekeeper's stamp it was decided at
    valid_until: float  # the policy's decisions in it hold until then (the policy's clock)


class WarmAnswers:
    """Rendering warm answers by key, each reused for at most `hold` seconds (see the module docstring)."""

    def __init__(
        self,
        generation: Callable[[], int] = lambda: 0,
        *,
        hold: float = HOLD,
        limit: int = ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._generation = generation
        self._hold = hold
        self._clock = clock
        self._kept: Memo[Hashable, _Kept] = Memo(limit)
        self.reused = 0  # answers reused so far: for tests and profiling

    def get(
        self, key: Hashable, policy: object = None, policy_now: float = 0.0, stamp: int = 0
    ) -> tuple[Rendering, float] | None:
        """The answer kept under `key` and the seconds it stays fresh, if it may be reused now under `policy` (whose
        clock says `policy_now`, at the gatekeeper's `stamp`)."""
        kept = self._kept.get(key)
        if kept is None:
            return None
        now = self._clock()
        if (
            now >= kept.reuse_until
            or kept.policy is not policy
            or kept.stamp != stamp
            or policy_now >= kept.valid_until
            or kept.generation != self._generation()
        ):
            self._kept.pop(key)
            return None
        self.reused += 1
        return kept.rendered, kept.fresh_until - now

    def mark(self) -> int:
        """The store front's generation now: taken before an answer is made, and given to `put` with it."""
        return self._generation()

    def put(
        self,
        key: Hashable,
        rendered: Rendering,
        fresh_for: float | None,
        mark: int,
        policy: object = None,
        valid_until: float = math.inf,
        stamp: int = 0,
    ) -> None:
        """Keep an answer just made from what the store front held at `mark`, fresh for `fresh_for` more seconds
        (None: it read no cached document, and is not kept), decided by `policy` until `valid_until` (the policy's
        clock) at the gatekeeper's `stamp` (taken before it was made, as `mark`). A write since `mark` (the answer
        may predate it) makes it unusable at once."""
        if fresh_for is None or fresh_for <= 0 or self._hold <= 0:
            return
        now = self._clock()
        fresh_until = now + fresh_for
        reuse_until = min(now + self._hold, fresh_until)
        self._kept.put(key, _Kept(rendered, fresh_until, reuse_until, mark, policy, stamp, valid_until))

    def __len__(self) -> int:
        return len(self._kept)
