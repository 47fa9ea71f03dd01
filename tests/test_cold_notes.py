from datetime import timedelta

import pytest

from reverie.models.config import ColdConfig
from reverie.models.tables import Origin
from reverie.tasks.cold_notes import heat, is_candidate, plan_cold, plan_stalled

from factories import AS_OF, get_memory, ingest_records, view

CONFIG = ColdConfig()
WEEK = timedelta(days=7)


def note(mid: str, entity: str = "billing", layer: str = "context", **fields):
    values = {"created_at": AS_OF - timedelta(days=40), "importance": 0.2} | fields
    return view(mid, entity=entity, layer=layer, **values)


def test_heat_index() -> None:
    assert heat(0, 100, 0.0) == 0.0  # -10 clamps at 0
    assert heat(2, 3, 0.0) == 29.0  # 6 + 2 + 20 + 1
    assert heat(20, 60, 0.0) == 30.0  # 0 + 20 + 0 + 10
    assert heat(100, 1, 1.0) == 100.0
    assert heat(0, 30, 0.5) == pytest.approx(17.5)  # 10 + 7.5


def test_heat_29_is_cold_30_is_not() -> None:
    warm = note("w", access_count=20, last_accessed_at=AS_OF - timedelta(days=60), importance=0.0)
    cold = note("c", access_count=2, last_accessed_at=AS_OF - timedelta(days=3), importance=0.0)
    assert is_candidate(cold, AS_OF, CONFIG) and not is_candidate(warm, AS_OF, CONFIG)


def test_min_age_6_vs_7_days_and_zero() -> None:
    six = note("a", created_at=AS_OF - timedelta(days=6, hours=23))
    seven = note("b", created_at=AS_OF - WEEK)
    assert not is_candidate(six, AS_OF, CONFIG) and is_candidate(seven, AS_OF, CONFIG)
    assert is_candidate(six, AS_OF, ColdConfig(min_age_days=0))


def test_only_unprotected_notes_of_the_cold_layers_with_an_entity() -> None:
    assert is_candidate(note("a", layer="emotion"), AS_OF, CONFIG)
    assert is_candidate(note("a", layer="implementation"), AS_OF, CONFIG)
    for layer in ("goal", "caveat", "learning", None):
        assert not is_candidate(note("a", layer=layer), AS_OF, CONFIG)
    assert not is_candidate(note("a", protected=True), AS_OF, CONFIG)
    assert not is_candidate(note("a", entity=None), AS_OF, CONFIG)


def test_one_note_is_not_a_group_two_are() -> None:
    assert plan_cold("p", [note("a"), note("b", entity="other")], AS_OF, CONFIG) == []
    (p,) = plan_cold("p", [note("a"), note("b")], AS_OF, CONFIG)
    assert p.member_ids == ("a", "b") and p.operation == Origin.COLD_LEARNING


def test_groups_are_by_entity_and_layer() -> None:
    plans = plan_cold("p", [note("a"), note("b"), note("c", layer="emotion"),
                            note("d", layer="emotion"), note("e", entity="x")], AS_OF, CONFIG)
    assert [p.member_ids for p in plans] == [("a", "b"), ("c", "d")]


def test_the_learning_memory() -> None:
    group = [note("a", importance=0.1, content="x" * 300, created_at=AS_OF - timedelta(days=50)),
             note("b", importance=0.3, content="second", created_at=AS_OF - timedelta(days=20)),
             note("c", importance=0.2, content="third", created_at=AS_OF - timedelta(days=30),
                  external_id="ext-c"),
             note("d", importance=0.0, content="fourth", created_at=AS_OF - timedelta(days=10))]
    (p,) = plan_cold("p", group, AS_OF, CONFIG)
    assert (p.layer, p.kind, p.protected, p.entity) == ("learning", "insight", True, "billing")
    assert p.importance == 0.55  # mean 0.15, raised to the floor
    meta = p.meta
    assert meta["count"] == 4 and meta["original_layer"] == "context"
    assert meta["period"] == {"from": "2025-05-12", "to": "2025-06-21"}
    assert [e["fragment"][:6] for e in meta["exemplars"]] == ["second", "third", "xxxxxx"]
    assert len(meta["exemplars"][2]["fragment"]) == 200
    assert meta["replaced_ids"] == ["a", "b", "d", "ext-c"]
    # Every note whole, by day: the exemplars are linksee's quotes, in the metadata.
    assert p.content == ("4 context notes on billing from 2025-05-12 to 2025-06-21: 12 May 2025: "
                         + "x" * 300 + ". 1 June: third. 11 June: second. 21 June: fourth.")
    assert p.gist == ("4 context notes on billing from 2025-05-12 to 2025-06-21: "
                      + "x" * 300 + ". third. second. fourth.")


def test_session_scope() -> None:
    config = ColdConfig(scope="session", session_id="s1")
    assert is_candidate(note("a", session_id="s1"), AS_OF, config)
    assert not is_candidate(note("a", session_id="s2"), AS_OF, config)
    with pytest.raises(ValueError, match="session_id"):
        ColdConfig(scope="session")


def test_stalled_after_30_days_untouched() -> None:
    day29 = view("a", status="in_progress", created_at=AS_OF - timedelta(days=29, hours=23))
    day30 = view("b", status="in_progress", created_at=AS_OF - timedelta(days=30))
    touched = view("c", status="in_progress", created_at=AS_OF - timedelta(days=90),
                   last_accessed_at=AS_OF - timedelta(days=5))
    done = view("d", status="done", created_at=AS_OF - timedelta(days=90))
    assert [m.id for m in plan_stalled([day29, day30, touched, done], AS_OF, CONFIG)] == ["b"]


def test_groups_of_summaries_stand_for_their_originals_and_never_share_an_id() -> None:
    """Two (entity, layer) groups made only of earlier summaries: each learning memory
    stands for its summaries' originals (before, both had no members and one id)."""
    from dataclasses import replace as with_

    s1, s2 = with_(note("s1"), origin="compress"), with_(note("s2"), origin="compress")
    s3, s4 = (with_(note(x, layer="emotion"), origin="dedup") for x in ("s3", "s4"))
    originals = {s: [with_(note(f"{s}-o{k}"), tier="cold") for k in range(2)]
                 for s in ("s1", "s2", "s3", "s4")}
    plans = plan_cold("p", [s1, s2, s3, s4], AS_OF, CONFIG, originals)
    assert [p.absorbed_ids for p in plans] == [("s1", "s2"), ("s3", "s4")]
    assert plans[0].member_ids == ("s1-o0", "s1-o1", "s2-o0", "s2-o1")
    assert len({p.summary_id for p in plans}) == 2


def test_a_protected_goal_is_never_stalled() -> None:
    """linksee's sweep leaves protected memories alone (issue #16: a pinned in-progress
    goal untouched since January was marked stalled in June)."""
    pinned = view("g", status="in_progress", protected=True,
                  created_at=AS_OF - timedelta(days=152))
    day30 = view("b", status="in_progress", created_at=AS_OF - timedelta(days=30))
    assert [m.id for m in plan_stalled([pinned, day30], AS_OF, CONFIG)] == ["b"]


def test_the_model_words_the_learning_memory_and_the_rules_stand_in_when_it_cannot(
    store, llm
) -> None:
    """linksee's use_llm: cold consolidation asks the configured model for the learning
    memory's wording, checked like every wording; a refused answer keeps the rules'."""
    from datetime import UTC

    from reverie.flows.cold_notes import consolidate_cold

    old = (AS_OF - timedelta(days=40)).replace(tzinfo=UTC).isoformat()
    notes = [{"id": f"n{i}", "content": f"billing export failed on node {i} during the night",
              "entity": "billing", "layer": "context", "importance": 0.2, "created_at": old}
             for i in range(3)]
    ingest_records(store, notes, profile="p")
    ingest_records(store, [{**n, "id": f"q{i}", "entity": "search"} for i, n in enumerate(notes)], profile="q")
    llm.behaviour = "good"
    report = consolidate_cold(profile="p", as_of=AS_OF)
    (learned,) = [c for c in report.steps[0].changes if c.action == "consolidated"]
    summary = get_memory(store, learned.target)
    assert summary.layer == "learning" and summary.protected
    assert not summary.content.startswith("3 context notes")  # the model's words
    assert any("billing" in r["body"]["messages"][-1]["content"] for r in llm.requests)
    llm.behaviour = "injection"
    report = consolidate_cold(profile="q", as_of=AS_OF)
    (learned,) = [c for c in report.steps[0].changes if c.action == "consolidated"]
    assert get_memory(store, learned.target).content.startswith("3 context notes on search")
    assert any("fell back" in n or "rules" in n for n in report.steps[0].notes)
