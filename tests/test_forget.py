from datetime import timedelta

from models.config import ForgetConfig
from tasks.forget import ARCHIVE, DELETE, PROTECTED, plan_forget

from factories import AS_OF, view

ON = ForgetConfig(archive_threshold=0.2, delete_threshold=0.1)
OLD = AS_OF - timedelta(days=200)


def decide(*memories, config=ON, standing=frozenset()):
    return {d.memory.id: (d.action, d.reason) for d in plan_forget(memories, set(standing), AS_OF, config)}


def test_off_by_default() -> None:
    assert decide(view("a", relevance=0.0, created_at=OLD), config=ForgetConfig()) == {}


def test_thresholds_are_strict() -> None:
    out = decide(view("d", relevance=0.099, created_at=OLD), view("a", relevance=0.1, created_at=OLD),
                 view("k", relevance=0.2, created_at=OLD))
    assert out["d"][0] == DELETE and out["a"][0] == ARCHIVE and "k" not in out


def test_grace_period_89_vs_90_days() -> None:
    young = view("y", relevance=0.0, created_at=AS_OF - timedelta(days=89, hours=23))
    of_age = view("o", relevance=0.0, created_at=AS_OF - timedelta(days=90))
    out = decide(young, of_age)
    assert out["y"][0] == PROTECTED and "grace period" in out["y"][1]
    assert out["o"][0] == DELETE


def test_importance_at_07_is_protected() -> None:
    out = decide(view("p", relevance=0.0, created_at=OLD, importance=0.7),
                 view("q", relevance=0.0, created_at=OLD, importance=0.69))
    assert out["p"] == (PROTECTED, "importance 0.7 >= 0.7") and out["q"][0] == DELETE


def test_protected_kinds_and_flag() -> None:
    out = decide(view("d", relevance=0.0, created_at=OLD, kind="decision"),
                 view("i", relevance=0.0, created_at=OLD, kind="insight"),
                 view("f", relevance=0.0, created_at=OLD, protected=True))
    assert {k: v[0] for k, v in out.items()} == {"d": PROTECTED, "i": PROTECTED, "f": PROTECTED}
    custom = ForgetConfig(delete_threshold=0.1, protected_kinds=("episodic",))
    assert decide(view("d", relevance=0.0, created_at=OLD, kind="decision"), config=custom)["d"][0] == DELETE


def test_a_summary_standing_for_originals_is_archived_not_deleted() -> None:
    out = decide(view("s", relevance=0.0, created_at=OLD), standing={"s"})
    assert out["s"][0] == ARCHIVE and "stands for originals" in out["s"][1]


def test_unscored_cold_and_superseded_memories_are_not_considered() -> None:
    assert decide(view("a", created_at=OLD), view("b", relevance=0.0, created_at=OLD, tier="cold"),
                  view("c", relevance=0.0, created_at=OLD, superseded_by="s")) == {}


# --- through the flow and the CLI: thresholds, and Core Memory after forgetting ---------

import pytest  # noqa: E402

from deployments.cli import EXIT_ERROR, EXIT_OK, main  # noqa: E402
from flows.decay import decay  # noqa: E402
from flows.forget import forget  # noqa: E402
from flows.lightweight_consolidation import lightweight_consolidation  # noqa: E402
from models.config import preset, with_forget_thresholds  # noqa: E402
from models.errors import ConfigError  # noqa: E402
from models.store import Store  # noqa: E402

from factories import axis  # noqa: E402

FACTS = [("old-1", "Mia's locker code is 4417"), ("old-2", "Mia once lived in Tromsø"),
         ("keep", "Mia is a violinist")]


@pytest.fixture
def faded(store: Store) -> Store:
    """Three semantic facts (the user_profile block quotes them): two long unused, one
    important enough to be protected; decay scored them, lightweight compiled the blocks."""
    rows = [{"id": mid, "content": text, "kind": "semantic", "importance": 0.9 if mid == "keep" else 0.3,
             "created_at": "2024-01-01", "embedding": axis(i).tolist()}
            for i, (mid, text) in enumerate(FACTS)]
    assert not store.ingest(rows, profile="mia").errors
    decay(profile="mia", as_of=AS_OF)
    lightweight_consolidation(profile="mia", as_of=AS_OF)
    (profile_block,) = [b for b in store.blocks("mia") if b.block_type == "user_profile"]
    assert "4417" in profile_block.content and "Tromsø" in profile_block.content
    return store


@pytest.mark.usefixtures("prefect_api")
def test_deleting_removes_the_text_from_core_memory_in_the_same_run(faded: Store) -> None:
    report = forget(profile="mia", as_of=AS_OF, delete_threshold=1.0)
    (step,) = report.steps
    assert step.facts["deleted"] == 2 and step.facts["blocks_recompiled"] >= 1
    assert any(c.action == "recompiled" and c.target == "user_profile" for c in step.changes)
    text = " ".join(b.content for b in faded.blocks("mia"))
    assert "4417" not in text and "Tromsø" not in text and "violinist" in text
    # A second run of the same date forgets nothing more and rewrites nothing.
    assert forget(profile="mia", as_of=AS_OF, delete_threshold=1.0).changed() == 0


@pytest.mark.usefixtures("prefect_api")
def test_archiving_also_takes_the_memory_out_of_core_memory(faded: Store) -> None:
    forget(profile="mia", as_of=AS_OF, archive_threshold=1.0)
    text = " ".join(b.content for b in faded.blocks("mia"))
    assert "4417" not in text and "violinist" in text
    assert faded.counts("mia")["cold"] == 2


@pytest.mark.usefixtures("prefect_api")
def test_forget_thresholds_from_the_cli(faded: Store, capsys: pytest.CaptureFixture[str]) -> None:
    as_of = ["--as-of", AS_OF.isoformat()]
    assert main(["run", "forget", "--profile", "mia", *as_of, "--delete-below", "1.5"]) == EXIT_ERROR
    assert main(["run", "decay", "--profile", "mia", *as_of, "--archive-below", "0.1"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "delete_threshold" in err and "less than or equal to 1" in err
    assert "apply to `run forget` and `run cold` only" in err
    assert main(["run", "forget", "--profile", "mia", *as_of, "--dry-run",
                 "--delete-below", "1", "--json"]) == EXIT_OK
    assert '"deleted": 2' in capsys.readouterr().out
    assert faded.counts("mia")["hot"] == 3  # a dry run
    assert main(["run", "forget", "--profile", "mia", *as_of, "--preset", "archive-faded"]) == EXIT_OK
    assert main(["run", "forget", "--profile", "mia", *as_of, "--archive-below", "1"]) == EXIT_OK
    assert faded.counts("mia")["cold"] == 2


def test_thresholds_override_the_config_only_where_given() -> None:
    base = preset("archive-faded")
    assert base.forget.archive_threshold == 0.05 and base.forget.delete_threshold == 0.0
    assert with_forget_thresholds(base, None, None) is base
    both = with_forget_thresholds(base, None, 0.01)
    assert (both.forget.archive_threshold, both.forget.delete_threshold) == (0.05, 0.01)
    with pytest.raises(ConfigError, match="archive_threshold"):
        with_forget_thresholds(base, -0.1, None)
