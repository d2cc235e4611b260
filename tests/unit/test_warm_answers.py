"""`proxy.web.warm_answers`: whole warm answers reused for a moment, never past their freshness, the store front's
generation, the policy they were decided under or the policy's own validity; bounded; emptied by a purge."""

from __future__ import annotations

import math

from proxy.runtime.memo import forget_all
from proxy.web.renderings import Rendering
from proxy.web.warm_answers import HOLD, WarmAnswers

ANSWER = Rendering.of(b'{"versions":{}}')
OTHER = Rendering.of(b'{"versions":{"1.0.0":{}}}')


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def answers(clock: Clock, generation: list[int] | None = None, **kwargs) -> WarmAnswers:
    counter = generation if generation is not None else [0]
    return WarmAnswers(lambda: counter[0], clock=clock, **kwargs)


def test_an_answer_is_reused_for_at_most_the_hold_with_the_freshness_it_has_left():
    clock = Clock()
    warm = answers(clock)
    warm.put("k", ANSWER, fresh_for=300.0, mark=warm.mark())
    assert warm.get("k") == (ANSWER, 300.0)
    clock.now += HOLD / 2
    assert warm.get("k") == (ANSWER, 300.0 - HOLD / 2)  # its Cache-Control counts down as a fresh rendering's would
    clock.now += HOLD / 2
    assert warm.get("k") is None and len(warm) == 0
    assert warm.reused == 2


def test_an_answer_never_outlives_the_freshness_of_what_it_was_made_from():
    clock = Clock()
    warm = answers(clock)
    warm.put("k", ANSWER, fresh_for=0.25, mark=warm.mark())
    clock.now += 0.25
    assert warm.get("k") is None
    for fresh_for in (None, 0.0, -5.0):  # it read no cached document, or a stale one: not kept at all
        warm.put("k", ANSWER, fresh_for=fresh_for, mark=warm.mark())
        assert warm.get("k") is None


def test_any_write_through_the_store_front_since_the_answer_was_made_drops_it():
    clock, generation = Clock(), [7]
    warm = answers(clock, generation)
    mark = warm.mark()
    generation[0] += 1  # written while the answer was being made: it may predate the write
    warm.put("k", ANSWER, fresh_for=300.0, mark=mark)
    assert warm.get("k") is None
    warm.put("k", ANSWER, fresh_for=300.0, mark=warm.mark())
    assert warm.get("k") == (ANSWER, 300.0)
    generation[0] += 1  # a later write (a new archive record, a purge in this process)
    assert warm.get("k") is None


def test_answers_are_kept_apart_by_key_and_by_the_policy_object_they_were_decided_under():
    clock = Clock()
    warm = answers(clock)
    policy, reloaded = object(), object()
    warm.put(("index.json", "team-a"), ANSWER, 300.0, warm.mark(), policy)
    warm.put(("index.json", "team-b"), OTHER, 300.0, warm.mark(), policy)
    assert warm.get(("index.json", "team-a"), policy)[0] is ANSWER
    assert warm.get(("index.json", "team-b"), policy)[0] is OTHER
    assert warm.get(("index.json", "team-a"), reloaded) is None  # a reload made another policy: decided anew
    assert warm.get(("index.json", "team-b"), None) is None


def test_a_publish_time_learned_since_ends_the_reuse():
    clock = Clock()
    warm = answers(clock)
    policy = object()
    warm.put("k", ANSWER, 300.0, warm.mark(), policy, stamp=3)
    assert warm.get("k", policy, stamp=3) is not None
    assert warm.get("k", policy, stamp=4) is None  # the gatekeeper learned a publish time: decided anew


def test_a_policy_decision_that_expires_ends_the_reuse_by_the_policys_clock():
    clock = Clock()
    warm = answers(clock)
    policy = object()
    warm.put("k", ANSWER, 300.0, warm.mark(), policy, valid_until=5000.0)  # a held-back version comes of age then
    assert warm.get("k", policy, policy_now=4999.0) is not None
    assert warm.get("k", policy, policy_now=5000.0) is None
    warm.put("k", ANSWER, 300.0, warm.mark(), policy, valid_until=math.inf)
    assert warm.get("k", policy, policy_now=1e12) is not None


def test_the_memo_is_bounded_and_emptied_with_every_memo_by_a_purge():
    clock = Clock()
    warm = answers(clock, limit=2)
    for key in ("a", "b", "c"):
        warm.put(key, ANSWER, 300.0, warm.mark())
    assert len(warm) == 2 and warm.get("a") is None and warm.get("c") is not None
    forget_all()
    assert len(warm) == 0 and warm.get("c") is None


def test_a_zero_hold_reuses_nothing():
    clock = Clock()
    warm = answers(clock, hold=0.0)
    warm.put("k", ANSWER, 300.0, warm.mark())
    assert warm.get("k") is None
