from datetime import timedelta

from reverie.models.config import ConsolidationConfig, ForgetConfig
from reverie.models.repositories import blocks as blocks_repo
from reverie.models.repositories import memories as memories_repo
from reverie.tasks.forget import ARCHIVE, DELETE, NOT_APPROVED, PROTECTED, plan_forget

from factories import AS_OF, get_memory, in_read, ingest_records, view

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

from reverie.deployments.cli import EXIT_ERROR, EXIT_OK, main  # noqa: E402
from reverie.flows.decay import decay  # noqa: E402
from reverie.flows.forget import forget  # noqa: E402
from reverie.flows.lightweight_consolidation import lightweight_consolidation  # noqa: E402
from reverie.models.config import preset, with_forget_thresholds  # noqa: E402
from reverie.models.errors import ConfigError  # noqa: E402
from reverie.models.store import Store  # noqa: E402

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
    assert not ingest_records(store, rows, profile="mia").errors
    decay(profile="mia", as_of=AS_OF)
    lightweight_consolidation(profile="mia", as_of=AS_OF)
    (profile_block,) = [b for b in in_read(store, "mia", blocks_repo.blocks) if b.block_type == "user_profile"]
    assert "4417" in profile_block.content and "Tromsø" in profile_block.content
    return store


@pytest.mark.usefixtures("prefect_api")
def test_deleting_removes_the_text_from_core_memory_in_the_same_run(faded: Store) -> None:
    report = forget(profile="mia", as_of=AS_OF, delete_threshold=1.0, auto_approve_deletion=True)
    (step,) = report.steps
    assert step.facts["deleted"] == 2 and step.facts["blocks_recompiled"] >= 1
    assert any(c.action == "recompiled" and c.target == "user_profile" for c in step.changes)
    text = " ".join(b.content for b in in_read(faded, "mia", blocks_repo.blocks))
    assert "4417" not in text and "Tromsø" not in text and "violinist" in text
    # A second run of the same date forgets nothing more and rewrites nothing.
    assert forget(profile="mia", as_of=AS_OF, delete_threshold=1.0,
                  auto_approve_deletion=True).changed() == 0


@pytest.mark.usefixtures("prefect_api")
def test_archiving_also_takes_the_memory_out_of_core_memory(faded: Store) -> None:
    forget(profile="mia", as_of=AS_OF, archive_threshold=1.0)
    text = " ".join(b.content for b in in_read(faded, "mia", blocks_repo.blocks))
    assert "4417" not in text and "violinist" in text
    assert in_read(faded, "mia", memories_repo.counts)["cold"] == 2


@pytest.mark.usefixtures("prefect_api")
def test_forget_thresholds_from_the_cli(faded: Store, capsys: pytest.CaptureFixture[str]) -> None:
    as_of = ["--as-of", AS_OF.isoformat()]
    assert main(["run", "forget", "--profile", "mia", *as_of, "--delete-below", "1.5"]) == EXIT_ERROR
    assert main(["run", "decay", "--profile", "mia", *as_of, "--archive-below", "0.1"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "delete_threshold" in err and "less than or equal to 1" in err
    assert "apply to `run cold-notes` and `run forget` only" in err  # the registry's order
    assert main(["run", "forget", "--profile", "mia", *as_of, "--dry-run",
                 "--delete-below", "1", "--json"]) == EXIT_OK
    assert '"deleted": 2' in capsys.readouterr().out
    assert in_read(faded, "mia", memories_repo.counts)["hot"] == 3  # a dry run
    assert main(["run", "forget", "--profile", "mia", *as_of, "--preset", "archive-faded"]) == EXIT_OK
    assert main(["run", "forget", "--profile", "mia", *as_of, "--archive-below", "1"]) == EXIT_OK
    assert in_read(faded, "mia", memories_repo.counts)["cold"] == 2


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

from reverie.flows.forget import (  # noqa: E402
    APPROVAL_ARTIFACT,
    DeletionApproval,
    forget_with_approval,
)
from reverie.models.errors import ReverieError  # noqa: E402
from reverie.models.export import export_jsonl  # noqa: E402
from reverie.models.tables import Tombstone  # noqa: E402
from reverie.runner.artifacts import artifact_key  # noqa: E402

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
    return {m.external_id for m in in_read(store, "mia", memories_repo.memories) if m.tier == "hot"}


@pytest.mark.usefixtures("prefect_api")
def test_archive_only_and_nothing_to_delete_never_pause(faded: Store, pauses) -> None:
    never = pauses()
    # Deletion is configured, but every candidate is protected: nothing to approve.
    guarded = ConsolidationConfig(forget=ForgetConfig(
        delete_threshold=1.0, protected_kinds=("semantic",)))
    assert forget(profile="mia", as_of=AS_OF, config=guarded).changed() == 0
    forget(profile="mia", as_of=AS_OF, archive_threshold=1.0)
    assert never.asked == [] and in_read(faded, "mia", memories_repo.counts)["cold"] == 2


@pytest.mark.usefixtures("prefect_api")
def test_auto_approve_and_dry_runs_never_pause(faded: Store, pauses) -> None:
    never = pauses()
    dry = forget(profile="mia", as_of=AS_OF, delete_threshold=1.0, dry_run=True)
    assert dry.steps[0].facts["deleted"] == 2 and hot_ids(faded) == {"old-1", "old-2", "keep"}
    forget(profile="mia", as_of=AS_OF, delete_threshold=1.0, auto_approve_deletion=True)
    assert never.asked == [] and hot_ids(faded) == {"keep"}


@pytest.mark.usefixtures("prefect_api")
def test_a_dry_run_says_when_the_real_run_waits_for_approval(
    faded: Store, pauses, capsys: pytest.CaptureFixture[str]
) -> None:
    never = pauses()
    args = ["run", "forget", "--profile", "mia", "--as-of", AS_OF.isoformat(), "--dry-run",
            "--delete-below", "1"]
    assert main(args) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[-1].endswith(
        "(dry run: nothing written); a real run waits for an operator's approval before "
        "deleting 2 memories")
    # So does the run's summary in the Prefect UI.
    dry = forget(profile="mia", as_of=AS_OF, delete_threshold=1.0, dry_run=True)
    [summary] = [a for a in run_artifacts(dry.run_id) if a.key == artifact_key(dry)]
    assert ("**A real run waits for an operator's approval before deleting 2 memories.**"
            in summary.data)
    # Approved up front, archiving only, or nothing to delete: the real run does not wait.
    assert main([*args, "--approve-deletion"]) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[-1].endswith("(dry run: nothing written)")
    assert forget(profile="mia", as_of=AS_OF, archive_threshold=1.0,
                  dry_run=True).waits_for is None
    guarded = ConsolidationConfig(forget=ForgetConfig(
        delete_threshold=1.0, protected_kinds=("semantic",)))
    assert forget(profile="mia", as_of=AS_OF, config=guarded, dry_run=True).waits_for is None
    assert never.asked == [] and hot_ids(faded) == {"old-1", "old-2", "keep"}


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
    assert report.steps[0].facts["deleted"] == 0 and in_read(faded, "mia", memories_repo.counts)["cold"] == 2
    assert not any(isinstance(get_memory(faded, mid, profile="mia"), Tombstone) for mid, _ in FACTS)
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
    monkeypatch.setattr("reverie.flows.forget.api_configured", lambda: False)
    config = with_forget_thresholds(preset("default"), None, 0.5)
    with pytest.raises(ConfigError, match="auto_approve_deletion=True"):
        forget_with_approval("mia", AS_OF, config, 60)


def test_the_cli_refuses_to_delete_without_an_api_or_approval(
    faded: Store, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("reverie.runner.event_delivery.api_configured", lambda: False)
    before = export_jsonl(faded.url, "mia")
    args = ["run", "forget", "--profile", "mia", "--as-of", AS_OF.isoformat()]
    assert main([*args, "--delete-below", "0.5"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--approve-deletion" in err and "PREFECT_API_URL" in err
    assert main(["run", "decay", "--profile", "mia", "--approve-deletion"]) == EXIT_ERROR
    assert "--approve-deletion applies to `run cold-notes`, `run forget`" in capsys.readouterr().err
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


# --- policy 'risk': linksee's forget sweep (src/lib/forgetting.ts, which seed 002's
# consolidate calls as decideForgetting) ------------------------------------------------
#
#   risk = (1 - heat/100) * (1 - importance) * d * (1 + d/30),  d = days since last access
#   0 for the goal layer (and protected memories); drop at >= 200, compress at >= 50.
#
# Each value below is worked out by hand from that formula and linksee's heat index
# (min(3*a30, 30) + min(a90, 20) + recency (+20 <= 7 d, +10 <= 30 d, 0 <= 90 d, -10 after)
# + min(0.5*a, 15) + 15*importance, clamped to 0-100); never read back from the code.

import math  # noqa: E402

import numpy as np  # noqa: E402

from reverie.models.config import FORGET_BY_RISK  # noqa: E402
from reverie.tasks.forget import forget as forget_step  # noqa: E402
from reverie.tasks.forget import forgetting_risk, risk_action  # noqa: E402
from reverie.tasks.step import StepArgs  # noqa: E402

RISK = ForgetConfig(policy="risk", delete_threshold=0.5)  # deletion armed
MINUTE = timedelta(minutes=1)


def idle(days: float, **fields):
    """An old (outside the grace period) unscored memory last accessed ``days`` ago."""
    return {"created_at": OLD, "last_accessed_at": AS_OF - timedelta(days=days), **fields}


def days_for(risk: float, factor: float) -> float:
    """The idle days d at which factor * d * (1 + d/30) equals ``risk``."""
    return 15.0 * (math.sqrt(1.0 + 4.0 * risk / (30.0 * factor)) - 1.0)


def risk_decisions(*memories, config=RISK, standing=frozenset(), deletable=None):
    return {d.memory.id: d
            for d in plan_forget(memories, set(standing), AS_OF, config, deletable)}


def test_the_risk_formula_with_linksee_numbers() -> None:
    assert forgetting_risk(0.0, 0.0, 30.0, "context", RISK) == 60.0  # 30 * (1 + 1)
    assert forgetting_risk(50.0, 0.5, 60.0, None, RISK) == 45.0  # .5 * .5 * 60 * 3
    assert forgetting_risk(100.0, 0.0, 400.0, "context", RISK) == 0.0  # hottest: none
    assert forgetting_risk(0.0, 1.0, 400.0, "context", RISK) == 0.0  # most important
    assert forgetting_risk(0.0, 0.0, 0.0, "context", RISK) == 0.0  # just touched
    assert forgetting_risk(0.0, 0.0, -45.0, "context", RISK) == 0.0  # touched after as_of
    assert forgetting_risk(0.0, 0.0, 90.0, "learning", RISK) == 360.0  # 90 * 4
    # The time scale is linksee's 30 days; a knob.
    assert forgetting_risk(0.0, 0.0, 60.0, None, RISK.model_copy(
        update={"risk_time_scale_days": 60.0})) == 120.0


def test_layer_factors_goal_and_caveat_have_no_risk_the_others_full_risk() -> None:
    for layer in ("goal", "caveat"):
        assert forgetting_risk(0.0, 0.0, 400.0, layer, RISK) == 0.0
    for layer in ("context", "emotion", "implementation", "learning", None):
        assert forgetting_risk(0.0, 0.0, 90.0, layer, RISK) == 360.0
    out = risk_decisions(*[view(layer, **idle(400), layer=layer)
                           for layer in ("goal", "caveat", "context")])
    assert set(out) == {"context"} and out["context"].action == DELETE
    none_exempt = RISK.model_copy(update={"risk_exempt_layers": ()})
    assert forgetting_risk(0.0, 0.0, 90.0, "goal", none_exempt) == 360.0
    assert risk_decisions(view("g", **idle(400), layer="goal"),
                          config=none_exempt)["g"].action == DELETE


def test_risk_levels_are_inclusive_at_linksee_50_and_200() -> None:
    def below(x: float) -> float:
        return float(np.nextafter(x, 0.0))

    def above(x: float) -> float:
        return float(np.nextafter(x, math.inf))

    assert risk_action(below(50.0), RISK) is None
    assert risk_action(50.0, RISK) == ARCHIVE and risk_action(above(50.0), RISK) == ARCHIVE
    assert risk_action(below(200.0), RISK) == ARCHIVE
    assert risk_action(200.0, RISK) == DELETE and risk_action(above(200.0), RISK) == DELETE
    # Inclusive in a whole plan too: d = 60, heat 0, importance 0 is exactly 180.
    at_180 = view("m", **idle(60), importance=0.0)
    assert risk_decisions(at_180)["m"].risk == 180.0
    level = RISK.model_copy(update={"risk_delete_at": 180.0})
    assert risk_decisions(at_180, config=level)["m"].action == DELETE
    past = RISK.model_copy(update={"risk_delete_at": above(180.0)})
    assert risk_decisions(at_180, config=past)["m"].action == ARCHIVE


def test_a_minute_either_side_of_risk_200_and_50() -> None:
    # 30 < d <= 90 idle days, no accesses, importance 0: heat 0, risk = d * (1 + d/30).
    d200 = timedelta(days=days_for(200.0, 1.0))  # 63.90 days
    # 7 < d <= 30: heat 10 (recency), risk = 0.9 * d * (1 + d/30).
    d50 = timedelta(days=days_for(50.0, 0.9))  # 28.49 days
    memories = [view(name, importance=0.0, created_at=OLD, last_accessed_at=AS_OF - d)
                for name, d in (("199", d200 - MINUTE), ("200", d200 + MINUTE),
                                ("49", d50 - MINUTE), ("50", d50 + MINUTE))]
    out = risk_decisions(*memories)
    assert 199.99 < out["199"].risk < 200.0 < out["200"].risk < 200.01
    assert out["199"].action == ARCHIVE and out["200"].action == DELETE
    assert "49" not in out  # risk just under 50: kept, not listed
    assert 50.0 < out["50"].risk < 50.01 and out["50"].action == ARCHIVE
    assert out["200"].reason.startswith("risk 200.00 >= 200 (policy risk: heat 0.0, "
                                        "importance 0, 63.9 days idle, layer -)")


def test_heat_edges_feed_the_risk() -> None:
    # 30 days idle: recency +10, heat 10, risk 0.9 * 60 = 54; a minute more: heat 0, ~60.
    # 90 days idle, importance 0.6: heat 9, risk 0.91 * 0.4 * 360 = 131.04; then heat
    # max(0, -10 + 9) = 0, risk ~0.4 * 360 = 144.
    out = risk_decisions(
        view("30", **idle(30), importance=0.0), view("30+", **idle(30 + 1 / 1440), importance=0.0),
        view("90", **idle(90), importance=0.6), view("90+", **idle(90 + 1 / 1440), importance=0.6),
    )
    assert out["30"].risk == pytest.approx(54.0, abs=1e-9)
    assert out["30+"].risk == pytest.approx(60.0, abs=0.01)
    assert out["90"].risk == pytest.approx(131.04, abs=1e-9)
    assert out["90+"].risk == pytest.approx(144.0, abs=0.01)
    # Accesses heat a memory. 29 days idle, importance 0: with no accesses heat 10, risk
    # 0.9 * 57.03 = 51.33 (archived); with 5 (all within 30 and 90 days) heat
    # 15 + 5 + 10 + 2.5 = 32.5, risk 0.675 * 57.03 = 38.50 (kept).
    out = risk_decisions(view("cold", **idle(29), importance=0.0),
                         view("used", **idle(29), importance=0.0, access_count=5))
    assert out["cold"].risk == pytest.approx(0.9 * 29 * (1 + 29 / 30)) and "used" not in out
    # Never accessed: idle since creation.
    never = view("n", importance=0.0, created_at=AS_OF - timedelta(days=200))
    assert risk_decisions(never)["n"].risk == pytest.approx(200 * (1 + 200 / 30))


def test_protection_beats_any_risk() -> None:
    huge = idle(3650, importance=0.0)  # risk ~ 447,000
    memories = [view("flag", **huge, protected=True), view("kind", **huge, kind="decision"),
                view("ins", **huge, kind="insight"),
                view("imp", **(huge | {"importance": 0.7})),
                view("young", importance=0.0, created_at=AS_OF - timedelta(days=90) + MINUTE)]
    out = risk_decisions(*memories)
    assert {k: d.action for k, d in out.items()} == dict.fromkeys(
        ("flag", "kind", "ins", "imp", "young"), PROTECTED)
    assert out["flag"].reason.startswith("flagged protected; risk ")
    assert "grace period" in out["young"].reason and out["young"].risk > 200
    # The grace period's edge: 90 days old and never touched is deletable (risk 360).
    of_age = view("old", importance=0.0, created_at=AS_OF - timedelta(days=90))
    assert risk_decisions(of_age)["old"].action == DELETE
    # Just under protected importance: risk (1 - 0.69) * d * (1 + d/30), deleted.
    assert risk_decisions(view("q", **(huge | {"importance": 0.69})))["q"].action == DELETE


def test_risk_ignores_relevance_and_only_live_memories_are_swept() -> None:
    out = risk_decisions(view("s", **idle(400), relevance=1.0), view("u", **idle(400)),
                         view("c", **idle(400), tier="cold"),
                         view("x", **idle(400), superseded_by="s2"))
    assert set(out) == {"s", "u"}


def test_what_may_not_be_deleted_is_archived() -> None:
    m = view("m", **idle(400))
    # Deletion off (delete_threshold 0.0, which a rejected approval sets): archived.
    off = risk_decisions(m, config=FORGET_BY_RISK.forget)["m"]
    assert off.action == ARCHIVE and "delete_threshold is 0.0" in off.reason
    assert risk_decisions(m, standing={"m"})["m"].action == ARCHIVE
    unapproved = risk_decisions(m, deletable=set())["m"]
    assert unapproved.action == ARCHIVE and "not approved, archived" in unapproved.reason
    assert risk_decisions(m, deletable={"m"})["m"].action == DELETE


def test_the_default_policy_is_thresholds_and_ignores_risk() -> None:
    assert ForgetConfig().policy == "thresholds" and ON.policy == "thresholds"
    assert FORGET_BY_RISK.forget.policy == "risk" and FORGET_BY_RISK.forget.delete_threshold == 0.0
    assert (ForgetConfig().risk_archive_at, ForgetConfig().risk_delete_at) == (50.0, 200.0)
    # Risk 447,000 but relevance 0.5: the thresholds keep it; they alone decide.
    assert decide(view("r", **idle(3650), importance=0.0, relevance=0.5)) == {}
    (decision,) = plan_forget([view("r", relevance=0.0, created_at=OLD)], set(), AS_OF, ON)
    assert decision.risk is None


def test_risk_config_is_bounded() -> None:
    with pytest.raises(ValueError, match="risk_delete_at"):
        ForgetConfig(policy="risk", risk_archive_at=300.0)
    for bad in ({"risk_archive_at": 0.0}, {"risk_time_scale_days": 0.0},
                {"policy": "relevance"}, {"risk_delete_at": 2e6}):
        with pytest.raises(ValueError):
            ForgetConfig(**bad)


# The step on a store: tombstones, the deletions table, idempotence; the flow: dry run
# and approval.

SWEPT = [("hot-note", idle(2, importance=0.0)),  # risk ~2: kept
         ("faded", idle(60, importance=0.0)),  # 180: archived
         ("gone", idle(120, importance=0.0)),  # 600: deleted
         ("pinned", idle(120, importance=0.0, protected=True)),  # protected
         ("goal", idle(120, importance=0.0, layer="goal"))]  # exempt layer


@pytest.fixture
def sweepable(store: Store) -> Store:
    rows = [{"id": mid, "content": f"note {mid} 4417", "kind": "semantic",
             "embedding": axis(i).tolist(),
             **{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in f.items()}}
            for i, (mid, f) in enumerate(SWEPT)]
    assert not ingest_records(store, rows, profile="risk").errors
    return store


def risk_config(delete_threshold: float = 0.5) -> ConsolidationConfig:
    return ConsolidationConfig(forget=ForgetConfig(policy="risk",
                                                   delete_threshold=delete_threshold))


def by_external(store: Store) -> dict[str, str]:
    return {m.external_id: m.tier for m in in_read(store, "risk", memories_repo.memories, ("hot", "cold"))}


def test_the_risk_step_archives_deletes_and_reports_the_risk(sweepable: Store) -> None:
    args = StepArgs(sweepable.url, "risk", AS_OF, risk_config(), "run-1")
    report = forget_step(sweepable, args)
    assert report.facts == {"archived": 1, "deleted": 1, "protected": 1,
                            "blocks_recompiled": 0}
    assert report.notes == ["policy risk (linksee's forget sweep): archive at risk >= 50, "
                            "delete at >= 200"]
    assert by_external(sweepable) == {"hot-note": "hot", "faded": "cold", "pinned": "hot",
                                      "goal": "hot"}
    ids = {m.external_id: m.id for m in in_read(sweepable, "risk", memories_repo.memories, ("hot", "cold"))}
    details = {c.target: (c.action, c.detail) for c in report.changes}
    assert details[ids["faded"]][0] == "archived"
    assert details[ids["faded"]][1].startswith("risk 180.00 >= 50 (policy risk: heat 0.0")
    gone_id = next(c.target for c in report.changes if c.action == "deleted")
    assert details[gone_id][1].startswith("risk 600.00 >= 200 (policy risk:")
    for c in report.changes:  # no content in the reasons
        assert "4417" not in c.detail
    (row,) = report.tables["deletions"]
    assert (row["external_id"], row["policy"], row["risk"], row["relevance"]) == (
        "gone", "risk", 600.0, 0.0)
    tomb = get_memory(sweepable, gone_id, profile="risk")
    assert isinstance(tomb, Tombstone) and tomb.score == pytest.approx(600.0)
    assert "policy risk" in tomb.reason and "4417" not in tomb.reason
    # A second run at the same as_of changes nothing, writes nothing.
    before = export_jsonl(sweepable.url, "risk")
    again = forget_step(sweepable, args)
    assert again.changed == 0 and "deletions" not in again.tables
    assert export_jsonl(sweepable.url, "risk") == before


def test_without_deletion_the_risk_step_archives_what_it_would_delete(sweepable: Store) -> None:
    report = forget_step(sweepable, StepArgs(sweepable.url, "risk", AS_OF, FORGET_BY_RISK))
    assert report.facts["deleted"] == 0 and report.facts["archived"] == 2
    assert "deletion off" in report.notes[0] and "deletions" not in report.tables
    assert by_external(sweepable)["gone"] == "cold"


@pytest.mark.usefixtures("prefect_api")
def test_risk_dry_run_writes_nothing_and_deletion_waits_for_approval(
    sweepable: Store, pauses
) -> None:
    before = export_jsonl(sweepable.url, "risk")
    never = pauses()
    dry = forget(profile="risk", as_of=AS_OF, config=risk_config(), dry_run=True)
    assert dry.steps[0].facts["deleted"] == 1 and dry.steps[0].facts["archived"] == 1
    assert export_jsonl(sweepable.url, "risk") == before and never.asked == []
    asked = pauses(DeletionApproval(approve=False))
    rejected = forget(profile="risk", as_of=AS_OF, config=risk_config())
    assert len(asked.asked) == 1 and rejected.steps[0].facts["deleted"] == 0
    assert by_external(sweepable)["gone"] == "cold"  # rejected: archived instead


# The thresholds step leaves protected memories to SQL: it reads only those it may
# forget, and counts the others by reason.

SPARED = [("flag", {"protected": True}), ("flag-decision", {"protected": True, "kind": "decision"}),
          ("decision", {"kind": "decision"}), ("insight", {"kind": "insight"}),
          ("important", {"importance": 0.7}), ("young", {"created_at": AS_OF - timedelta(days=89, hours=23)}),
          ("of-age", {"created_at": AS_OF - timedelta(days=90)}), ("plain", {}),
          ("unscored", {}), ("superseded", {}), ("fresh", {})]


def test_the_thresholds_step_reads_what_it_may_forget_and_counts_the_protected(store: Store) -> None:
    rows = [{"id": mid, "content": f"note {mid} 4417", "kind": "semantic", "importance": 0.3,
             "embedding": axis(i).tolist(),
             **{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in
                ({"created_at": OLD} | fields).items()}}
            for i, (mid, fields) in enumerate(SPARED)]
    assert not ingest_records(store, rows, profile="p").errors
    ids = {m.external_id: m.id for m in in_read(store, "p", memories_repo.memories)}
    scores = [(ids[mid], 0.5 if mid == "fresh" else 0.01) for mid in ids if mid != "unscored"]
    with store.writing("p") as tx:
        memories_repo.set_relevance(tx, scores)
        memories_repo.set_column(tx, "superseded_by", [(ids["superseded"], ids["plain"])])
    config = ConsolidationConfig(forget=ForgetConfig(archive_threshold=0.2))
    whole = plan_forget(in_read(store, "p", memories_repo.memories), set(), AS_OF, config.forget)

    report = forget_step(store, StepArgs(store.url, "p", AS_OF, config))
    assert report.facts == {"archived": 2, "deleted": 0, "protected": 6, "blocks_recompiled": 0}
    assert report.examined == len(SPARED) and report.skipped == 6 and report.changed == 2
    kept = "relevance below 0.2, kept"
    assert [(c.action, c.target, c.detail) for c in report.changes[:5]] == [
        ("protected", "2 memories", f"flagged protected; {kept}"),
        ("protected", "1 memory", f"kind 'decision' is protected; {kept}"),
        ("protected", "1 memory", f"kind 'insight' is protected; {kept}"),
        ("protected", "1 memory", f"importance >= 0.7; {kept}"),
        ("protected", "1 memory", f"inside the 90-day grace period; {kept}")]
    archived = {c.target for c in report.changes[5:] if c.action == "archived"}
    assert archived == {ids["of-age"], ids["plain"]} == {
        d.memory.id for d in whole if d.action == ARCHIVE}
    assert sum(d.action == PROTECTED for d in whole) == report.facts["protected"]
