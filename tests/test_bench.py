"""The LoCoMo quality benchmark, on a small file in LoCoMo's format."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from reverie.benchmarks.locomo import (
    Question,
    answered,
    bench_locomo,
    budgeted_context,
    load_locomo,
    render_locomo,
    session_date,
    words,
)
from reverie.deployments.cli import EXIT_OK, main

from factories import view

pytestmark = pytest.mark.store_independent(
    "the LoCoMo bench's reading and scoring")

SMALL = Path(__file__).parent / "data" / "locomo_small.json"


def test_normalisation_drops_case_punctuation_and_articles() -> None:
    assert words("The City-Hospital, 2023!") == {"city", "hospital", "2023"}
    assert words(2022) == {"2022"}
    assert answered(Question("q", "the city hospital", 4), "Ana works at the City Hospital.")
    assert not answered(Question("q", "city hospital", 4), "Ana works at the city.")


def test_session_dates() -> None:
    assert session_date("1:56 pm on 8 May, 2023") == datetime(2023, 5, 8, 13, 56)
    assert session_date("9:15 am on 3 March, 2023") == datetime(2023, 3, 3, 9, 15)


def test_loading_keeps_observations_and_answerable_questions() -> None:
    (conv,) = load_locomo(SMALL)
    assert conv.profile == "tiny-1" and len(conv.memories) == 6
    assert conv.last_session == datetime(2023, 4, 17, 18, 40)
    assert [q.category for q in conv.questions] == [1, 2, 4, 4]  # category 5 has no answer
    cat = next(m for m in conv.memories if "Mochi." in m["content"])
    assert cat["entity"] == "Ana" and cat["created_at"] == "2023-03-03T09:15:00"


def test_the_budget_counts_characters_not_memories() -> None:
    long = view("l", content="x" * 80)
    short = view("s", content="short fact")
    context = budgeted_context([long, short, short], 60)
    assert "x" not in context and context.count("short fact") == 2
    assert len(context) <= 60


@pytest.mark.usefixtures("prefect_api")
def test_bench_reports_size_and_recall_before_and_after(tmp_path: Path) -> None:
    result = bench_locomo(SMALL, offset_days=90, budget=2000)
    totals = result.totals()
    assert totals["hot_before"] == 6 and totals["questions"] == 4
    assert totals["recall_before"] == 0.75  # the favourite food is never mentioned
    assert totals["hot_after"] <= totals["hot_before"]
    assert 0.0 <= totals["recall_after"] <= 1.0
    (conv,) = result.conversations
    assert conv.as_of == "2023-07-16T18:40:00"
    # Half the budget too, per category, and deep recall: nothing it found is lost.
    assert 0.0 <= totals["recall_1000_before"] <= totals["recall_before"]
    assert sum(c["questions"] for c in totals["categories"].values()) == 4
    assert set(totals["categories"]) == {"single-hop", "temporal", "open-domain", "multi-hop"}
    assert totals["deep_recall_before"] == 0.75 and totals["lost"] == 0
    text = render_locomo(result)
    assert "lost" in text and "single-hop" in text and "r@1000" in text


@pytest.mark.usefixtures("prefect_api")
def test_bench_from_the_cli_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "result.json"
    args = ["bench", "locomo", str(SMALL), "--as-of-offset-days", "30", "--budget", "20",
            "--json", str(out)]
    assert main(args) == EXIT_OK
    assert "tiny-1" in capsys.readouterr().out
    data = json.loads(out.read_text())
    for key in ("hot_before", "hot_after", "chars_before", "chars_after", "recall_before",
                "recall_after", "recall_10_before", "recall_10_after", "deep_recall_before",
                "deep_recall_after", "lost", "categories"):
        assert key in data
    assert data["budget"] == 20 and data["conversations"][0]["profile"] == "tiny-1"
    assert data["recall_before"] == 0.0  # no memory and its date fit in 20 characters


def test_the_bench_shows_a_summary_by_its_matched_members() -> None:
    from reverie.benchmarks.locomo import shown
    from reverie.engines.ranking import passages, plan_candidates, tiers_for
    from reverie.models.tables import Origin, Tier

    from factories import axis

    memories = [view("o1", tier=Tier.COLD, superseded_by="s", content="a fact"),
                view("o2", tier=Tier.COLD, superseded_by="s", content="another"),
                view("s", origin=Origin.COMPRESSED, content="a fact; another")]
    candidates = plan_candidates(memories, np.stack([axis(1), axis(2), axis(0)]),
                                 tiers_for(deep=False))
    [found] = passages(candidates, axis(2)[None, :], 1)
    assert [m.id for m in shown(candidates, found)] == ["o2", "o1"]


def test_one_fold_runs_the_conversations_named(capsys: pytest.CaptureFixture[str]) -> None:
    from reverie.benchmarks.locomo import select_conversations
    from reverie.models.errors import InputError

    conversations = load_locomo(SMALL)
    assert select_conversations(conversations, ["tiny-1"]) == conversations
    assert select_conversations(conversations, None) == conversations
    with pytest.raises(InputError, match="no conversation conv-9.*tiny-1"):
        select_conversations(conversations, ["conv-9"])
    assert main(["bench", "locomo", str(SMALL), "--conversations", "conv-9"]) != EXIT_OK
    assert "no conversation conv-9 in the file (it holds tiny-1)" in capsys.readouterr().err
