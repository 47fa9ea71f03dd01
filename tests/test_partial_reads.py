"""Steps that read part of a profile (creative's sample, forget's candidates) read
exactly what their rules would have picked from the whole profile.

Creative draws its sample from ``Store.live_ids`` and forget (thresholds policy) reads
``below_relevance`` (the unprotected live memories below its threshold, and counts of the
protected ones), so that what they cost follows what they change. Over generated stores, after every step has run (so that there are summaries,
cold and superseded memories, archived and promoted ones), each query must agree with
the pure rule applied to every row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select
from test_invariant_properties import AS_OF, SETTINGS, _ingested, stores

from reverie.models.config import CreativeConfig, ForgetConfig
from reverie.models.records import RelevanceSpread
from reverie.models.repositories.forgetting import below_relevance
from reverie.models.repositories.memories import (
    M,
    hot_count,
    live_ids,
    memories,
    memory_ids,
    relevance_spread,
    set_lifecycles,
    snapshot,
)
from reverie.models.store import Store
from reverie.models.tables import Lifecycle, Tier
from reverie.tasks import creative
from reverie.tasks.forget import protection, spared_counts

from test_ingest_properties import run_steps

THRESHOLDS = st.sampled_from([0.0, 0.05, 0.3, 0.5, 0.99])


@SETTINGS
@given(records=stores, floor=THRESHOLDS, below=THRESHOLDS, draw=st.randoms())
def test_partial_reads_match_the_rules_over_the_whole_profile(
    new_store: Callable[[str], Store], records: dict[str, list[dict[str, Any]]],
    floor: float, below: float, draw: Any,
) -> None:
    store = _ingested(new_store, records)
    run_steps(store, "ada", AS_OF)
    for profile in ("ada", "bo"):
        # Every lifecycle on hot rows too, whatever the steps left: the queries must
        # follow MemoryView.is_live, not what the steps happen to produce.
        with store.writing(profile) as tx:
            hot_ids = memory_ids(tx)
            set_lifecycles(tx, [(i, draw.choice(list(Lifecycle)))
                                for i in draw.sample(hot_ids, len(hot_ids) // 3)])
        with store.reading(profile) as tx:
            everything, vectors = snapshot(tx)
            config = CreativeConfig(min_relevance=floor)
            assert live_ids(tx, relevance_above=floor) == [
                m.id for m in everything if creative.is_candidate(m, config)]

            hot = memories(tx)
            assert relevance_spread(tx) == RelevanceSpread.of(hot)
            assert memories(tx, relevance_below=below) == [
                m for m in hot if m.relevance is not None and m.relevance < below]
            assert hot_count(tx) == (len(hot), any(m.relevance is not None for m in hot))

            rules = ForgetConfig(archive_threshold=below, grace_period_days=floor * 400)
            selectable = [m for m in hot if m.is_live and m.relevance is not None
                          and m.relevance < below]
            candidates, spared = below_relevance(tx, below, AS_OF, rules)
            assert candidates == [m for m in selectable if protection(m, AS_OF, rules) is None]
            assert spared_counts(spared, rules) == Counter(
                first_rule(protection(m, AS_OF, rules), rules) for m in selectable
                if protection(m, AS_OF, rules) is not None)

            rows = draw.sample(range(len(everything)), len(everything) // 2)
            some, some_vectors = snapshot(tx, ids_=[everything[i].id for i in rows])
        assert some == [everything[i] for i in rows]
        assert (some_vectors == vectors[rows]).all()
        # Both tiers, and a run's horizon (the read by id is a statement built once, the
        # whole read is built per call: they must agree row for row).
        with store.reading(profile) as tx:
            seqs = sorted(tx.session.execute(select(M.c.ingest_seq).distinct().where(
                M.c.profile_id == profile)).scalars())
        for horizon in (None, seqs[0] - 1, seqs[0], seqs[len(seqs) // 2]):
            with store.reading(profile, horizon) as tx:
                whole, whole_vectors = snapshot(tx, (Tier.HOT, Tier.COLD))
                with store.reading(profile) as unbounded:
                    every = snapshot(unbounded, (Tier.HOT, Tier.COLD))[0]
                asked = [m.id for m in draw.sample(every, len(every) // 2)] + ["no-such-id"]
                read, read_vectors = snapshot(tx, (Tier.HOT, Tier.COLD), asked)
            at = {m.id: k for k, m in enumerate(whole)}
            kept = [at[i] for i in asked if i in at]
            assert read == [whole[k] for k in kept]
            assert (read_vectors == whole_vectors[kept]).all()


def first_rule(reason: str | None, rules: ForgetConfig) -> str:
    """The protection reason of one memory as forget counts it (without its figures)."""
    assert reason is not None
    if reason.startswith("importance"):
        return f"importance >= {rules.protected_importance:g}"
    if "grace period" in reason:
        return f"inside the {rules.grace_period_days:g}-day grace period"
    return reason
