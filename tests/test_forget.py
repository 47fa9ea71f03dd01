from datetime import timedelta

from models.config import ConsolidationConfig, ForgetConfig
from tasks.forget import ARCHIVE, DELETE, NOT_APPROVED, PROTECTED, plan_forget

from factories import AS_OF, view

ON = ForgetConfig(archive_threshold=0.2, delete_threshold=0.1)
OLD = AS_OF - timedelta(days=200)


def decide(*memories, config=ON, standing=frozenset(), deletable=None):
    return {d.memory.id: (d.action, d.reason)
            for d in plan_forget(memories, set(standing), AS_OF, config, deletable)}


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


def test_only_approved_deletions_happen_the_others_are_archived_or_kept() -> None:
    approved = view("ok", relevance=0.05, created_at=OLD)
    later = view("new", relevance=0.05, created_at=OLD)  # selected since the approval
    delete_only = ForgetConfig(delete_threshold=0.1)
    out = decide(approved, later, deletable={"ok"}, config=delete_only)
    assert out["ok"][0] == DELETE
    assert out["new"] == (NOT_APPROVED, "relevance 0.0500 < 0.1; its deletion was not "
                          "approved, kept")
    # Below the archive threshold too: archived, as a run without deletion would.
    assert decide(later, deletable=set())["new"][0] == ARCHIVE
    assert decide(later, deletable=None)["new"][0] == DELETE


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
    report = forget(profile="mia", as_of=AS_OF, delete_threshold=1.0, auto_approve_deletion=True)
    (step,) = report.steps
    assert step.facts["deleted"] == 2 and step.facts["blocks_recompiled"] >= 1
    assert any(c.action == "recompiled" and c.target == "user_profile" for c in step.changes)
    text = " ".join(b.content for b in faded.blocks("mia"))
    assert "4417" not in text and "Tromsø" not in text and "violinist" in text
    # A second run of the same date forgets nothing more and rewrites nothing.
    assert forget(profile="mia", as_of=AS_OF, delete_threshold=1.0,
                  auto_approve_deletion=True).changed() == 0


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


# --- approval of deletions (the pause itself: tests/test_forget_approval.py) -----------

from prefect.exceptions import FlowPauseTimeout  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from flows.forget import APPROVAL_ARTIFACT, DeletionApproval, forget_with_approval  # noqa: E402
from models.errors import ReverieError  # noqa: E402
from models.export import export_jsonl  # noqa: E402
from models.tables import Tombstone  # noqa: E402
from prefect_reads import run_artifacts  # noqa: E402


class Pauses:
    """Stands in for Prefect's pause_flow_run: counts the pauses and answers them."""

    def __init__(self, answer: DeletionApproval | None = None, during=None) -> None:
        self.answer, self.during, self.asked = answer, during, []

    def __call__(self, wait_for_input, timeout, poll_interval):
        self.asked.append((wait_for_input, timeout))
        if self.during:
            self.during()
        if self.answer is None:
            raise FlowPauseTimeout("Flow run was paused and never resumed.")
        return self.answer


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch):
    def install(answer: DeletionApproval | None = None, during=None) -> Pauses:
        fake = Pauses(answer, during)
        monkeypatch.setattr("prefect.flow_runs.pause_flow_run", fake)
        return fake

    return install


def approval_text(run_id: str | None) -> str:
    """The last version of the run's approval artifact."""
    versions = [a for a in run_artifacts(run_id) if a.key == APPROVAL_ARTIFACT]
    return max(versions, key=lambda a: a.created).data


def hot_ids(store: Store) -> set[str]:
    return {m.external_id for m in store.memories("mia") if m.tier == "hot"}


@pytest.mark.usefixtures("prefect_api")
def test_archive_only_and_nothing_to_delete_never_pause(faded: Store, pauses) -> None:
    never = pauses()
    # Deletion is configured, but every candidate is protected: nothing to approve.
    guarded = ConsolidationConfig(forget=ForgetConfig(
        delete_threshold=1.0, protected_kinds=("semantic",)))
    assert forget(profile="mia", as_of=AS_OF, config=guarded).changed() == 0
    forget(profile="mia", as_of=AS_OF, archive_threshold=1.0)
    assert never.asked == [] and faded.counts("mia")["cold"] == 2


@pytest.mark.usefixtures("prefect_api")
def test_auto_approve_and_dry_runs_never_pause(faded: Store, pauses) -> None:
    never = pauses()
    dry = forget(profile="mia", as_of=AS_OF, delete_threshold=1.0, dry_run=True)
    assert dry.steps[0].facts["deleted"] == 2 and hot_ids(faded) == {"old-1", "old-2", "keep"}
    forget(profile="mia", as_of=AS_OF, delete_threshold=1.0, auto_approve_deletion=True)
    assert never.asked == [] and hot_ids(faded) == {"keep"}


@pytest.mark.usefixtures("prefect_api")
def test_an_approved_run_deletes_what_it_listed(faded: Store, pauses) -> None:
    asked = pauses(DeletionApproval(approve=True, reason="checked"))
    report = forget(profile="mia", as_of=AS_OF, delete_threshold=1.0,
                    approval_timeout_seconds=60)
    ((form, timeout),) = asked.asked
    assert timeout == 60 and "2 memories in 1 profile(s) would be deleted" in form._description
    assert report.steps[0].facts["deleted"] == 2 and hot_ids(faded) == {"keep"}
    text = approval_text(report.run_id)
    assert "**Approval:** approved" in text and "(checked)" in text
    assert "| mia | 2 | 0 | 1 |" in text
    for external, content in FACTS[:2]:
        assert f"| {external} | semantic |" in text and content in text


@pytest.mark.usefixtures("prefect_api")
def test_content_in_the_approval_artifact_obeys_the_preview_limit(
    faded: Store, pauses, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REVERIE_ARTIFACT_CONTENT_CHARS", "0")
    pauses(DeletionApproval(approve=True))
    report = forget(profile="mia", as_of=AS_OF, delete_threshold=1.0)
    text = approval_text(report.run_id)
    assert "| old-1 |" in text and "4417" not in text and "Tromsø" not in text


@pytest.mark.usefixtures("prefect_api")
def test_a_memory_selected_after_the_approval_was_asked_is_not_deleted(
    faded: Store, pauses
) -> None:
    def keep_loses_its_protection() -> None:
        engine = create_engine(faded.url)  # as a re-import lowering its importance would
        with engine.begin() as conn:
            conn.execute(text("UPDATE memory SET importance = 0.3 WHERE external_id = 'keep'"))
        engine.dispose()

    pauses(DeletionApproval(approve=True), during=keep_loses_its_protection)
    report = forget(profile="mia", as_of=AS_OF, delete_threshold=1.0)
    (step,) = report.steps
    assert step.facts["deleted"] == 2 and hot_ids(faded) == {"keep"}
    assert any(c.action == "not approved" and "not approved, kept" in c.detail
               for c in step.changes)


@pytest.mark.usefixtures("prefect_api")
def test_a_rejected_run_deletes_nothing_and_still_archives(faded: Store, pauses) -> None:
    pauses(DeletionApproval(approve=False, reason="too many"))
    report = forget(profile="mia", as_of=AS_OF, delete_threshold=1.0, archive_threshold=1.0)
    assert report.steps[0].facts["deleted"] == 0 and faded.counts("mia")["cold"] == 2
    assert not any(isinstance(faded.get(mid, profile="mia"), Tombstone) for mid, _ in FACTS)
    text = approval_text(report.run_id)
    assert "**Approval:** rejected" in text and "(too many)" in text


@pytest.mark.usefixtures("prefect_api")
def test_no_answer_in_time_writes_nothing(faded: Store, pauses) -> None:
    pauses(None)
    before = export_jsonl(faded.url, "mia")
    with pytest.raises(ReverieError, match="no approval within 5 s"):
        forget(profile="mia", as_of=AS_OF, delete_threshold=1.0, archive_threshold=1.0,
               approval_timeout_seconds=5)
    assert export_jsonl(faded.url, "mia") == before


def test_without_a_prefect_api_a_deleting_run_refuses_instead_of_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("flows.forget.api_configured", lambda: False)
    config = with_forget_thresholds(preset("default"), None, 0.5)
    with pytest.raises(ConfigError, match="auto_approve_deletion=True"):
        forget_with_approval("mia", AS_OF, config, 60)


def test_the_cli_refuses_to_delete_without_an_api_or_approval(
    faded: Store, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("models.events.api_configured", lambda: False)
    before = export_jsonl(faded.url, "mia")
    args = ["run", "forget", "--profile", "mia", "--as-of", AS_OF.isoformat()]
    assert main([*args, "--delete-below", "0.5"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--approve-deletion" in err and "PREFECT_API_URL" in err
    assert main(["run", "decay", "--profile", "mia", "--approve-deletion"]) == EXIT_ERROR
    assert "applies to `run forget` only" in capsys.readouterr().err
    assert main(["approve", "0d7c1f8e-8a55-4b8e-9a43-2b1e6f1b9d21"]) == EXIT_ERROR
    assert "PREFECT_API_URL" in capsys.readouterr().err
    assert export_jsonl(faded.url, "mia") == before


@pytest.mark.usefixtures("prefect_api")
def test_the_cli_with_an_api_pauses_unless_told_to_approve(
    faded: Store, capsys: pytest.CaptureFixture[str], pauses
) -> None:
    asked = pauses(DeletionApproval(approve=False))
    args = ["run", "forget", "--profile", "mia", "--as-of", AS_OF.isoformat(),
            "--delete-below", "1"]
    assert main(args) == EXIT_OK
    assert len(asked.asked) == 1 and "reverie approve <run id>" in capsys.readouterr().err
    assert hot_ids(faded) == {"old-1", "old-2", "keep"}
    assert main([*args, "--approve-deletion"]) == EXIT_OK
    assert len(asked.asked) == 1 and hot_ids(faded) == {"keep"}
    assert main(["approve", "not-a-run"]) == EXIT_ERROR
    assert main(["approve", "0d7c1f8e-8a55-4b8e-9a43-2b1e6f1b9d21"]) == EXIT_ERROR
    assert "no flow run" in capsys.readouterr().err
