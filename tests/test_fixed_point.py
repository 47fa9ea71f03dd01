"""A second full consolidation with the same as_of changes nothing, at a size where
compression writes near-duplicate summaries (the sample store is too small to show it),
and two clean runs of the same input end byte for byte alike, PageRank included."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from reverie.benchmarks.locomo import load_locomo
from reverie.benchmarks.synthetic import SyntheticSpec, records
from reverie.engines.graph import build_graph, importance
from reverie.flows.decay import decay
from reverie.flows.full_consolidation import full_consolidation
from reverie.models.export import export_jsonl
from reverie.models.store import Store

from factories import ingest_records

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

# At 2,000 synthetic memories compression leaves a few groups of near-duplicate
# summaries (7 of them): enough to show the effect, small enough for every CI run.
SYNTHETIC = SyntheticSpec(2_000)
LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo3.json"


def step(report, name: str):  # type: ignore[no-untyped-def]
    return next(s for s in report.steps if s.step == name)


def _consolidated(store: Store, monkeypatch: pytest.MonkeyPatch, as_of: datetime):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("REVERIE_DATABASE_URL", store.url)
    decay(profile=None, as_of=as_of)
    return full_consolidation(profile=None, as_of=as_of)


def _exports(store: Store) -> dict[str, str]:
    return {p: export_jsonl(store.url, p) for p in store.profiles()}


def test_a_second_full_run_on_a_synthetic_store_changes_nothing(
    new_store: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    rows, _ = records(SYNTHETIC)
    first_store = new_store("first")
    assert not ingest_records(first_store, rows).errors
    first = _consolidated(first_store, monkeypatch, SYNTHETIC.as_of)
    # The effect is there: compression's own summaries were merged in the same run.
    assert step(first, "compress_fading").changed > 0
    assert step(first, "dedup_new_summaries").facts["groups"] > 0
    after_first = _exports(first_store)

    second = full_consolidation(profile=None, as_of=SYNTHETIC.as_of)
    assert second.changed() == 0, {s.step: s.changed for s in second.steps if s.changed}
    assert _exports(first_store) == after_first

    # A second clean store from the same records ends byte for byte alike.
    other = new_store("other")
    assert not ingest_records(other, rows).errors
    _consolidated(other, monkeypatch, SYNTHETIC.as_of)
    assert _exports(other) == after_first


@pytest.mark.skipif(not LOCOMO.exists(), reason=f"LoCoMo dev set not found at {LOCOMO}")
def test_a_second_full_run_on_the_locomo_dev_set_changes_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    conversations = load_locomo(LOCOMO)
    for conv in conversations:
        assert not ingest_records(store, conv.memories, profile=conv.profile).errors
    as_of = max(c.last_session for c in conversations) + timedelta(days=90)
    first = _consolidated(store, monkeypatch, as_of)
    assert first.changed() > 0
    after_first = _exports(store)
    second = full_consolidation(profile=None, as_of=as_of)
    assert second.changed() == 0, {s.step: s.changed for s in second.steps if s.changed}
    assert _exports(store) == after_first


def test_the_graph_does_not_depend_on_the_order_edges_are_read_in() -> None:
    # (0.1 + 0.2) + 0.3 != (0.3 + 0.2) + 0.1 in floating point: parallel edges summed in
    # the order the store happened to return them gave PageRank another last digit.
    nodes = ["a", "b", "c"]
    edges = [("a", "b", 0.1), ("b", "a", 0.2), ("a", "b", 0.3), ("b", "c", 0.5)]
    expected = build_graph(nodes, edges).es["weight"]
    assert build_graph(nodes, list(reversed(edges))).es["weight"] == expected
    assert importance(nodes, list(reversed(edges))) == importance(nodes, edges)
