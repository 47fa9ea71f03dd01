import math
from datetime import UTC, timedelta

import numpy as np
import pytest

from reverie.models.config import DecayConfig
from reverie.models.records import RelevanceInputs
from reverie.tasks.decay import distribution, plan_decay, relevance

from factories import AS_OF, in_read, record_runs

CONFIG = DecayConfig()
NOW = AS_OF.replace(tzinfo=UTC).timestamp()
DAY = 86_400.0


def inputs(created_days_ago=10.0, accessed_hours_ago=None, importance=0.5, confidence=0.5,
           relationships=0, current=None) -> RelevanceInputs:
    nan = float("nan")
    return RelevanceInputs(
        ids=["m"],
        created=np.array([nan if created_days_ago is None else NOW - created_days_ago * DAY]),
        accessed=np.array([nan if accessed_hours_ago is None else NOW - accessed_hours_ago * 3600]),
        importance=np.array([nan if importance is None else importance], dtype=float),
        confidence=np.array([nan if confidence is None else confidence], dtype=float),
        relationships=np.array([relationships]),
        relevance=np.array([nan if current is None else current]),
    )


def score(**kw) -> float:
    return float(relevance(inputs(**kw), AS_OF, CONFIG)[0])


def test_the_formula() -> None:
    expected = math.exp(-0.01 * 10) * math.exp(-0.05 * 2) * (1 + 0.3 * math.log(1 + 3)) \
        * (0.5 + 0.6) * (0.7 + 0.3 * 0.8)
    assert score(created_days_ago=10, accessed_hours_ago=48, importance=0.6, confidence=0.8,
                 relationships=3) == pytest.approx(min(expected, 1.0))


def test_access_within_24_hours_counts_in_full() -> None:
    base = math.exp(-0.01 * 10) * 1.0 * (0.5 + 0.5) * 0.85  # importance/confidence 0.5
    assert score(accessed_hours_ago=23) == pytest.approx(base)
    assert score(accessed_hours_ago=24) == pytest.approx(base)
    assert score(accessed_hours_ago=25) == pytest.approx(base * math.exp(-0.05 * 25 / 24))


def test_relevance_is_capped_at_one() -> None:
    assert score(created_days_ago=0, accessed_hours_ago=1, importance=1.0, confidence=1.0,
                 relationships=50) == 1.0


def test_relationships_slow_decay() -> None:
    ratio = score(relationships=5) / score(relationships=0)
    assert ratio == pytest.approx(1 + 0.3 * math.log(6))


def test_missing_and_future_timestamps() -> None:
    # Never accessed: access counts from creation.
    neutral = (0.5 + 0.5) * (0.7 + 0.3 * 0.5)
    assert score(created_days_ago=10) == pytest.approx(
        math.exp(-0.1) * math.exp(-0.5) * neutral)
    # No creation time at all: as new as can be.
    assert score(created_days_ago=None) == pytest.approx(neutral)
    # Times after as_of count as as_of.
    assert score(created_days_ago=-5, accessed_hours_ago=-3) == pytest.approx(neutral)


def test_unknown_importance_and_confidence_use_the_defaults() -> None:
    assert score(importance=None, confidence=None) == score(importance=0.5, confidence=0.5)


def test_importance_threshold_leaves_less_important_memories_alone() -> None:
    config = DecayConfig(importance_threshold=0.3)
    low = plan_decay(inputs(importance=0.29, current=0.42), AS_OF, config)
    assert low.scores[0] == 0.42 and not low.write[0] and not low.eligible[0]
    high = plan_decay(inputs(importance=0.3, current=0.42), AS_OF, config)
    assert high.eligible[0] and high.write[0]


def test_unchanged_scores_are_not_rewritten() -> None:
    first = plan_decay(inputs(), AS_OF, CONFIG)
    again = plan_decay(inputs(current=float(first.scores[0])), AS_OF, CONFIG)
    assert first.write[0] and not again.write[0]


def test_bands() -> None:
    rows = distribution(np.array([0.71, 0.7, 0.31, 0.3, 0.11, 0.1, 0.0]))
    assert {r["band"]: r["memories"] for r in rows} == {
        "high": 1, "medium": 2, "low": 2, "archive": 2}


def test_one_day_later_everything_scores_lower() -> None:
    a = relevance(inputs(accessed_hours_ago=48), AS_OF, CONFIG)[0]
    b = relevance(inputs(accessed_hours_ago=48), AS_OF + timedelta(days=1), CONFIG)[0]
    assert b < a


def _decayed_at(store, as_of) -> None:
    from reverie.models.tables import RunRecord

    record_runs(store, [RunRecord(profile_id="p", flow="decay", as_of=as_of, started_at=as_of,
                                 finished_at=as_of)])


def test_steps_say_when_the_relevance_they_act_on_is_more_than_a_day_old(store) -> None:
    from reverie.tasks.decay import relevance_notes

    assert in_read(store, "p", relevance_notes, AS_OF, scored=False) == [
        "no memory has a relevance score yet: run decay first"]
    assert in_read(store, "p", relevance_notes, AS_OF, scored=True) == []  # no decay recorded
    _decayed_at(store, AS_OF)
    assert in_read(store, "p", relevance_notes, AS_OF + timedelta(days=1), True) == []
    (stale,) = in_read(store, "p", relevance_notes, AS_OF + timedelta(days=1, seconds=1), True)
    assert stale.startswith("relevance is 1.0 days older than as_of")
    (later,) = in_read(store, "p", relevance_notes, AS_OF - timedelta(days=3), True)
    assert later.startswith("relevance was computed as of") and "3.0 days after" in later
    assert in_read(store, "other", relevance_notes, AS_OF + timedelta(days=9), True) == []
    # The day is a knob: a week's tolerance takes the same 3 days without a note.
    week = DecayConfig(stale_after_days=7.0)
    assert in_read(store, "p", relevance_notes, AS_OF - timedelta(days=3), True, week) == []
    assert in_read(store, "p", relevance_notes, AS_OF + timedelta(days=7, seconds=1), True, week)


def test_a_weekly_run_after_a_missed_decay_says_so_in_its_artifact(sample_store) -> None:
    from reverie.flows.creative import creative
    from reverie.flows.decay import decay

    decay(profile="maya", as_of=AS_OF)
    fresh = creative(profile="maya", as_of=AS_OF + timedelta(hours=2))
    assert not any("older than as_of" in n for s in fresh.steps for n in s.notes)
    late = creative(profile="maya", as_of=AS_OF + timedelta(days=8), dry_run=True)
    assert any("relevance is 8.0 days older than as_of" in n for s in late.steps for n in s.notes)


def test_a_step_that_finds_nothing_relevant_enough_says_so() -> None:
    from reverie.tasks.decay import none_above_note

    from factories import view

    faded = [view("a", relevance=0.004), view("b", relevance=0.3)]
    (note,) = none_above_note(faded, 0.3, "cluster")
    assert note == ("no memory's relevance is above 0.3 (the highest of 2 is 0.300): "
                    "nothing to cluster")
    assert none_above_note([*faded, view("c", relevance=0.31)], 0.3, "cluster") == []
    assert none_above_note([view("d")], 0.3, "cluster") == []  # unscored: said elsewhere
