"""Each merge says why (#37 item 4): the audit of every merge, compression, cluster and
cold note records the rule that grouped its members and each member's similarity to the
group (a cold note: its heat), and `reverie consolidations` shows the decisions newest
first, each with its summary's text, with a total, never silently cut."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from reverie.demo.run import DEMO_AS_OF
from reverie.deployments.cli import CONSOLIDATIONS_SHOWN, EXIT_OK, main
from reverie.flows.catalog import FLOWS
from reverie.models.backup import backup_lines, restore
from reverie.models.config import ClusterConfig, CompressConfig, ConsolidationConfig
from reverie.models.repositories import audit
from reverie.models.store import Store
from reverie.models.tables import Memory, Operation
from reverie.tasks import cluster, cold_notes, compress, dedup

from factories import at_cosine, axis, in_read, view

pytestmark = pytest.mark.usefixtures("prefect_api")

# Groups of 2 to 8 at 0.60: with the seed's groups of 5 the sample store compresses
# nothing, and every operation's audit is wanted here.
RULES = ConsolidationConfig(summarizer="rules", compress=CompressConfig(
    similarity=0.60, min_group_size=2, max_group_size=8))
PROFILE = "maya"


@pytest.fixture
def consolidated(sample_store: Store) -> Store:
    """The sample store after a night's decay, full consolidation and cold notes."""
    for name in ("decay", "full", "cold-notes"):
        FLOWS[name](profile=PROFILE, as_of=DEMO_AS_OF, config=RULES)
    return sample_store


def decisions(store: Store) -> list:
    return in_read(store, PROFILE, audit.consolidations, limit=None)


def test_every_merge_compression_and_cold_note_audits_its_rule_and_members(
    consolidated: Store,
) -> None:
    made = decisions(consolidated)
    by_operation = {r.operation for r in made}
    assert {Operation.DEDUP, Operation.COMPRESS, Operation.COLD_LEARNING} <= by_operation
    for r in made:
        why = r.parameters
        absorbed = set(why.get("absorbed", []))
        if r.operation == Operation.DEDUP:
            threshold, lead = RULES.dedup.similarity, why["representative"]
            assert why["rule"] == dedup.RULE
        elif r.operation == Operation.COMPRESS:
            threshold, lead = RULES.compress.similarity, why["seed"]
            assert why["rule"] == compress.RULE and why["same"] == ["kind", "entity"]
        elif r.operation == Operation.COLD_LEARNING:
            assert why["rule"] == cold_notes.RULE and why["same"] == ["entity", "layer"]
            assert set(why["heats"]) == set(r.member_ids) | absorbed
            assert all(h < RULES.cold.max_heat for h in why["heats"].values())
            continue
        else:
            continue
        sims = why["similarities"]
        # Every memory the rule grouped: a member, or an earlier summary absorbed (which
        # stands for its originals, among the members).
        assert absorbed <= set(sims) <= set(r.member_ids) | absorbed
        if not absorbed:
            assert set(sims) == set(r.member_ids)
        assert sims[lead] == 1.0
        assert all(s >= threshold for s in sims.values()), (r.id, sims)


def test_a_cluster_audits_each_members_similarity_to_its_centroid() -> None:
    members = [view(f"m{k}", content=f"note {k}", relevance=0.9) for k in range(5)]
    vectors = np.stack([axis(0), *(at_cosine(0.9, other=1 + k) for k in range(4))])
    config = ClusterConfig(similarity=0.75, min_cluster_size=5)
    (plan,) = cluster.plan_clusters("p", members, vectors, {}, config)
    assert plan.parameters["rule"] == cluster.RULES["components"]
    centroid = np.frombuffer(plan.embedding, np.float32)
    assert set(plan.similarities) == set(plan.member_ids)
    for k, m in enumerate(members):
        assert plan.similarities[m.id] == pytest.approx(float(vectors[k] @ centroid), abs=1e-5)


def rows_of(out: str) -> tuple[str, list[str], str]:
    header, *rows, footer = out.splitlines()
    return header, [r for r in rows if not r.startswith("    ")], footer


def test_consolidations_lists_newest_first_with_text_and_a_total(
    consolidated: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    made = decisions(consolidated)
    later = DEMO_AS_OF.replace(year=2026)  # a year on, a forget archives what faded
    FLOWS["decay"](profile=PROFILE, as_of=later, config=RULES)
    FLOWS["forget"](profile=PROFILE, as_of=later, config=RULES, archive_threshold=0.1)
    total = len(decisions(consolidated))
    assert total > len(made)
    assert main(["consolidations", "--profile", PROFILE]) == EXIT_OK
    header, rows, footer = rows_of(capsys.readouterr().out)
    assert header.split()[:3] == ["id", "created", "operation"] and "summary text" in header
    assert len(rows) == min(total, CONSOLIDATIONS_SHOWN)
    dates = [row.split()[1] for row in rows]
    assert dates == sorted(dates, reverse=True) and dates[0] == f"{later:%Y-%m-%d}"
    assert rows[0].split()[2] == Operation.FORGET and rows[0].endswith("  -")  # no summary
    assert footer == f"{total} decisions, newest first"
    merge = next(r for r in made if r.operation == Operation.DEDUP)
    summary = in_read(consolidated, PROFILE, lambda tx: tx.session.get(Memory, merge.summary_id))
    line = next(row for row in rows if row.startswith(merge.id))
    assert merge.summary_id in line and " ".join(summary.content.split())[:30] in line

    assert main(["consolidations", "--profile", PROFILE, "--limit", "2"]) == EXIT_OK
    _, rows, footer = rows_of(capsys.readouterr().out)
    assert len(rows) == 2
    assert footer == f"showing 2 of {total}, newest first; --limit N or --all for more"

    assert main(["consolidations", "--profile", PROFILE, "--all", "--why"]) == EXIT_OK
    out = capsys.readouterr().out
    _, rows, footer = rows_of(out)
    assert len(rows) == total and footer.startswith(f"{total} decisions")
    assert f"    rule: {dedup.RULE}" in out and "    similarity: " in out
    assert "    heat: " in out

    assert main(["consolidations", "--profile", PROFILE, "--limit", "3", "--json"]) == EXIT_OK
    listed = json.loads(capsys.readouterr().out)
    assert (listed["total"], listed["shown"]) == (total, 3)
    assert [c["created_at"] for c in listed["consolidations"]] == sorted(
        (c["created_at"] for c in listed["consolidations"]), reverse=True)
    assert all(bool(c["summary_text"]) == bool(c["summary_id"])
               for c in listed["consolidations"])
    assert any(c["summary_text"] for c in listed["consolidations"])
    with pytest.raises(SystemExit):
        main(["consolidations", "--profile", PROFILE, "--limit", "0"])


def test_undo_still_restores_and_the_listing_keeps_the_undone_summarys_text(
    consolidated: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    merge = next(r for r in decisions(consolidated) if r.operation == Operation.DEDUP)
    text = in_read(consolidated, PROFILE,
                   lambda tx: tx.session.get(Memory, merge.summary_id).content)
    assert main(["undo", merge.id, "--profile", PROFILE]) == EXIT_OK
    assert f"{len(merge.member_ids)} memories restored" in capsys.readouterr().out
    (undone,) = [r for r in decisions(consolidated) if r.id == merge.id]
    assert undone.undone_at is not None
    assert undone.parameters["similarities"] == merge.parameters["similarities"]
    assert main(["consolidations", "--profile", PROFILE, "--all"]) == EXIT_OK
    line = next(r for r in capsys.readouterr().out.splitlines() if r.startswith(merge.id))
    assert "[undone " in line and " ".join(text.split())[:20] in line


def test_a_backup_round_trips_the_audits_why(
    consolidated: Store, new_store: Callable[[str], Store], tmp_path: Path
) -> None:
    lines = list(backup_lines(consolidated.url, PROFILE))
    target = new_store("target")
    restore(target.url, lines)
    assert list(backup_lines(target.url, PROFILE)) == lines
    assert [(r.id, r.parameters) for r in decisions(target)] == [
        (r.id, r.parameters) for r in decisions(consolidated)]
