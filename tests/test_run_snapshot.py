"""A run works on its snapshot (issue #36): what an ingest writes while a run is in
progress waits for the next run, and the store ends as "the run, then the ingest"
leaves it.

Every writing step of full and lightweight consolidation gets two ingests of its own:
one as it starts (the run is under way, the step has not read yet) and one right
after it has read its snapshot (before it plans and writes). Each brings memories that
the step, or a later one, would merge, link, promote, put in a block, score or decay
the edges of, had it seen them. The store must end byte for byte as the same run
followed by the same ingests leaves it, and a second run must then treat the
newcomers as it does there. An ingest that gives a memory new words after a step has
read it makes that part of the step's plan wait for the next run: nothing is merged,
linked, promoted or compiled from words the memory no longer holds, and an edge
strengthened meanwhile keeps its new weight.

The ingests run in the flow's own task threads, found through ``tasks.step.run_step``
(which step a thread is in; the crash tests hold a step there too) and the end of a
``Store.reading`` block: production code has no hook for them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from reverie.benchmarks.synthetic import SyntheticSpec, profile_name, records
from reverie.flows.catalog import FLOWS
from reverie.flows.full_consolidation import full_consolidation
from reverie.flows.lightweight_consolidation import lightweight_consolidation
from reverie.models.config import ConsolidationConfig, DedupConfig
from reverie.models.db import dispose
from reverie.models.export import export_jsonl
from reverie.models.ingest import ingest
from reverie.models.repositories.memories import snapshot
from reverie.models.store import Store
from reverie.models.tables import Consolidation, CoreBlock, Edge, EdgeKind, Memory, Tier
from reverie.runner.report import RunReport
from reverie.tasks import step as step_module
from reverie.tasks.decay import decay
from reverie.tasks.step import StepArgs, run_step

from conftest import clone_sample

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

SPEC = SyntheticSpec(400)
PROFILE = profile_name(0)
AS_OF = SPEC.as_of
NEXT = AS_OF + timedelta(days=1)
# When the ingests during the run happen (the same in the serial order they are held to).
AT = AS_OF + timedelta(hours=1)
# The synthetic profile was drawn so that every step of a full run acts on it with merges at
# cosine 0.80 (the default until the seed's 0.85 came back); what is under test is the run's
# snapshot, not the merge threshold, so the profile keeps the threshold it was drawn for.
RULES = ConsolidationConfig(summarizer="rules", dedup=DedupConfig(similarity=0.80))
FULL_STEPS = ("dedup", "compress_fading", "dedup_new_summaries", "decay_edges", "promote",
              "compile_blocks", "link_summaries", "graph_importance")
LIGHT_STEPS = ("compile_blocks", "decay_edges")
# The other flows' writing steps, each flow by its catalog name.
OTHER_STEPS = {"decay": ("decay",), "creative": ("creative",), "cluster": ("cluster",),
               "forget": ("forget",), "cold-notes": ("forget", "consolidate_cold", "mark_stalled"),
               "cold-tier": ("migrate_cold", "expire_cold")}
Flow = Callable[..., RunReport]
# (step, "before" it reads | "after" it has read, before it writes)
Moment = tuple[str, str]


class NoModel:
    """Every record here brings its vector: ingest must not need a model."""

    name = "none"

    def encode(self, texts: list[str], progress: object = False) -> np.ndarray:
        raise AssertionError("ingest asked a model for vectors it was given")


def put(store: Store, rows: Sequence[dict[str, Any]]) -> None:
    report = ingest(store, rows, NoModel(), at=AT)
    assert not report.errors, report.errors


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic profile with relevance scored: every step of a full run has work."""
    path = tmp_path_factory.mktemp("snapshot") / "template.db"
    store = Store(f"sqlite:///{path}")
    rows, _ = records(SPEC)
    report = ingest(store, rows, NoModel(), at=AS_OF - timedelta(days=1))
    assert not report.errors
    run_step("decay", decay, StepArgs(store.url, PROFILE, AS_OF, RULES))
    dispose(store.url)
    return path


def fresh(template: Path, new_store: Callable[[str], Store], name: str,
          monkeypatch: pytest.MonkeyPatch) -> Store:
    store = clone_sample(template, new_store(name))
    monkeypatch.setenv("REVERIE_DATABASE_URL", store.url)
    return store


def export(store: Store) -> str:
    return export_jsonl(store.url, PROFILE)


# --- what the run would act on, had it seen it -------------------------------------------


def vectors_of(store: Store, ids: Sequence[str]) -> dict[str, np.ndarray]:
    with store.reading(PROFILE) as tx:
        found, vectors = snapshot(tx, (Tier.HOT, Tier.COLD), list(ids))
    return {m.id: v for m, v in zip(found, vectors, strict=True)}


def decisions(store: Store, operation: str) -> list[Consolidation]:
    with store.reading_all() as s:
        return list(s.execute(
            select(Consolidation).where(Consolidation.profile_id == PROFILE)
            .where(Consolidation.operation == operation).order_by(Consolidation.id)
        ).scalars())


def hot_originals(store: Store) -> list[str]:
    with store.reading_all() as s:
        return list(s.execute(
            select(Memory.id).where(Memory.profile_id == PROFILE)
            .where(Memory.tier == Tier.HOT).where(Memory.origin == "ingest")
            .order_by(Memory.id)
        ).scalars())


def kits(store: Store, moments: Sequence[Moment]) -> dict[Moment, list[dict[str, Any]]]:
    """For each moment, memories (and edges) to ingest then, made from what the
    run did to ``store``: two more near-duplicates of a merged group (with its
    summary, a group again), one at a summary's vector (linking would pick it), one
    used and trusted enough to be promoted and to lead the user profile block, the
    newest episodic fact (the project block), and two joined by old edges, one to a
    memory the run kept hot (decayed, pruned, and in the graph)."""
    merged, compressed = decisions(store, "dedup"), decisions(store, "compress")
    hot = hot_originals(store)
    # A run that merges nothing (lightweight) is offered hot memories instead.
    groups = [d.member_ids for d in merged] or [hot[i:i + 3] for i in range(0, 30, 3)]
    anchors = [d.summary_id for d in (*merged, *compressed)] or hot[-10:]
    vectors = vectors_of(store, [*{m for g in groups for m in g}, *anchors])
    old = AS_OF - timedelta(days=100)
    out: dict[Moment, list[dict[str, Any]]] = {}
    for k, moment in enumerate(moments):
        group, anchor, tag = groups[k % len(groups)], anchors[k % len(anchors)], f"k{k}"
        name = "/".join(moment)
        rows: list[dict[str, Any]] = [
            {"id": f"{tag}-dup{n}", "profile": PROFILE, "kind": "semantic",
             "content": f"said once more while {name} ran ({n})",
             "created_at": (AS_OF - timedelta(days=2)).isoformat(),
             "embedding": vectors[group[n % len(group)]].tolist()}
            for n in range(2)
        ]
        rows += [
            {"id": f"{tag}-near", "profile": PROFILE, "kind": "episodic",
             "content": f"close to a new summary, stored during {name}",
             "created_at": (AS_OF - timedelta(days=3)).isoformat(),
             "embedding": vectors[anchor].tolist()},
            {"id": f"{tag}-used", "profile": PROFILE, "kind": "semantic",
             "content": f"used a lot, stored during {name}", "access_count": 90 + k,
             "confidence": 0.95, "importance": 0.9,
             "created_at": (AS_OF - timedelta(days=5)).isoformat(),
             "embedding": unit(1000 + k).tolist()},
            {"id": f"{tag}-newest", "profile": PROFILE, "kind": "episodic",
             "content": f"the newest thing, stored during {name}",
             "created_at": AS_OF.isoformat(), "embedding": unit(2000 + k).tolist()},
            {"id": f"{tag}-a", "profile": PROFILE, "content": f"one end, {name}",
             "created_at": old.isoformat(), "embedding": unit(3000 + k).tolist()},
            {"id": f"{tag}-b", "profile": PROFILE, "content": f"other end, {name}",
             "created_at": old.isoformat(), "embedding": unit(4000 + k).tolist()},
            {"type": "edge", "profile": PROFILE, "source": f"{tag}-a", "target": f"{tag}-b",
             "weight": 0.5, "last_strengthened_at": old.isoformat()},
            {"type": "edge", "profile": PROFILE, "source": f"{tag}-a", "target": hot[k],
             "weight": 0.06, "last_strengthened_at": old.isoformat()},
            {"type": "edge", "profile": PROFILE, "source": f"{tag}-b", "target": hot[-1 - k],
             "weight": 0.9, "last_strengthened_at": AS_OF.isoformat()},
        ]
        out[moment] = rows
    return out


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(384).astype(np.float32)
    return v / np.linalg.norm(v)


# --- an ingest inside a step ------------------------------------------------------------


@contextmanager
def ingesting_during(
    monkeypatch: pytest.MonkeyPatch, batches: dict[Moment, Callable[[Store], None]]
) -> Iterator[set[Moment]]:
    """Call each function of ``batches`` on the store once, at its moment: (step,
    "before") as the step starts, before it reads; (step, "after") once it has read its
    snapshot (its first read transaction ended), before it plans and writes. Yields
    the moments reached."""
    current = threading.local()
    reached: set[Moment] = set()
    lock = threading.Lock()
    original_run_step, original_reading = step_module.run_step, Store.reading

    def at(moment: Moment, store: Store) -> None:
        with lock:
            due = moment in batches and moment not in reached
            reached.add(moment)
        if due:
            batches[moment](store)

    def tracked(name: str, fn: Any, args: StepArgs) -> Any:
        at((name, "before"), Store(args.store_url))
        current.step = name
        try:
            return original_run_step(name, fn, args)
        finally:
            current.step = None

    @contextmanager
    def reading(self: Store, profile: str, horizon: int | None = None,
                as_of: datetime | None = None) -> Iterator[Any]:
        with original_reading(self, profile, horizon, as_of) as tx:
            yield tx
        name = getattr(current, "step", None)
        if name is not None:
            at((name, "after"), self)

    monkeypatch.setattr(step_module, "run_step", tracked)
    monkeypatch.setattr(Store, "reading", reading)
    yield reached


def moments_of(steps: Sequence[str]) -> list[Moment]:
    return [(name, when) for name in steps for when in ("before", "after")]


# --- the serial orders the runs are held to ---------------------------------------------


@pytest.fixture(scope="module")
def serial() -> dict[str, Any]:
    """Per flow: the ingests, and the exports after "run, then ingest" and after a
    second run (filled by the first test of each flow)."""
    return {}


def run_then_ingest(
    flow: Flow, moments: Sequence[Moment], template: Path,
    new_store: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch, serial: dict[str, Any],
) -> dict[str, Any]:
    key = flow.__name__
    if key not in serial:
        store = fresh(template, new_store, f"serial-{key}", monkeypatch)
        flow(profile=PROFILE, as_of=AS_OF, config=RULES)
        made = kits(store, moments)
        aims = targets(store) if flow is full_consolidation else None
        for moment in moments:
            put(store, made[moment])
        after_ingest = export(store)
        flow(profile=PROFILE, as_of=NEXT, config=RULES)
        if flow in (full_consolidation, lightweight_consolidation):
            acted_on_newcomers(store, len(moments), merges=flow is full_consolidation)
        serial[key] = {"kits": made, "after_ingest": after_ingest,
                       "after_second": export(store), "targets": aims}
    return serial[key]


def acted_on_newcomers(store: Store, kits_made: int, merges: bool) -> None:
    """The serial order's second run did to the newcomers what the first would have
    done had it seen them: the test holds the first run to something."""
    with store.reading_all() as s:
        mine = {m.external_id: m for m in s.execute(
            select(Memory).where(Memory.profile_id == PROFILE)
            .where(Memory.external_id.like("k%"))).scalars()}
        edges = list(s.execute(select(Edge).where(Edge.profile_id == PROFILE)).scalars())
        blocks = list(s.execute(select(CoreBlock).where(CoreBlock.profile_id == PROFILE))
                      .scalars())
    pairs = {frozenset((e.source_id, e.target_id)): e for e in edges}
    sources = {mid for b in blocks for mid in b.source_ids}
    for k in range(kits_made):
        ends = frozenset((mine[f"k{k}-a"].id, mine[f"k{k}-b"].id))
        assert pairs[ends].weight < 0.5  # decayed
    assert any(m.id in sources for m in mine.values())
    if merges:
        assert all(mine[f"k{k}-used"].lifecycle == "promoted" for k in range(kits_made))
        assert sum(m.tier == Tier.COLD for m in mine.values()) >= kits_made  # merged
        assert all(m.pagerank is not None for m in mine.values() if m.tier == Tier.HOT)


# --- the tests ----------------------------------------------------------------------------


@pytest.mark.parametrize("flow, steps", [
    pytest.param(full_consolidation, FULL_STEPS, id="full"),
    pytest.param(lightweight_consolidation, LIGHT_STEPS, id="lightweight"),
    *[pytest.param(name, steps, id=name) for name, steps in OTHER_STEPS.items()],
])
def test_memories_ingested_during_each_step_wait_for_the_next_run(
    flow: Flow | str, steps: Sequence[str], template: Path,
    new_store: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch,
    serial: dict[str, Any],
) -> None:
    if isinstance(flow, str):
        flow = FLOWS[flow]
    moments = moments_of(steps)
    expected = run_then_ingest(flow, moments, template, new_store, monkeypatch, serial)
    store = fresh(template, new_store, "during", monkeypatch)
    batches = {m: (lambda s, rows=expected["kits"][m]: put(s, rows)) for m in moments}
    with ingesting_during(monkeypatch, batches) as reached:
        flow(profile=PROFILE, as_of=AS_OF, config=RULES)
    assert reached == set(moments)
    assert_same(export(store), expected["after_ingest"])
    flow(profile=PROFILE, as_of=NEXT, config=RULES)
    assert_same(export(store), expected["after_second"])


def assert_same(got: str, want: str) -> None:
    if got != want:
        extra = sorted(set(got.splitlines()) - set(want.splitlines()))
        missing = sorted(set(want.splitlines()) - set(got.splitlines()))
        pytest.fail(f"{len(extra)} lines not in the serial order's export, {len(missing)} "
                    f"missing; first of each:\n  got:  {extra[:1]}\n  want: {missing[:1]}")


# --- new words for a memory a step holds in its plan --------------------------------------


def targets(store: Store) -> dict[str, Any]:
    """What the full run did to ``store`` (already run; its template is the store as
    it was): for each step, one memory it acted on (for decay_edges, one edge it
    decayed), each a different one."""
    merged, compressed = decisions(store, "dedup")[0], decisions(store, "compress")[0]
    taken = {*merged.member_ids, *compressed.member_ids}
    with store.reading_all() as s:
        rows = {m.id: m for m in s.execute(
            select(Memory).where(Memory.profile_id == PROFILE)).scalars()}
        edges = list(s.execute(select(Edge).where(Edge.profile_id == PROFILE)
                               .where(Edge.kind == EdgeKind.ASSOCIATION)
                               .order_by(Edge.id)).scalars())
        blocks = list(s.execute(select(CoreBlock).where(CoreBlock.profile_id == PROFILE)
                                .order_by(CoreBlock.block_type)).scalars())

    def original(mid: str) -> bool:
        m = rows.get(mid)
        return (m is not None and m.origin == "ingest" and m.tier == Tier.HOT
                and mid not in taken)

    def pick(candidates: Any) -> str:
        found = next(c for c in candidates if original(c))
        taken.add(found)
        return found

    new_summaries = {m.id for m in rows.values() if m.linked_at == AS_OF}
    new_summaries -= {merged.summary_id, compressed.summary_id}
    link = next(e for e in edges if (e.source_id in new_summaries) != (e.target_id in
                                                                        new_summaries)
                and original(e.target_id if e.source_id in new_summaries else e.source_id))
    summary, neighbour = ((link.source_id, link.target_id) if link.source_id in new_summaries
                          else (link.target_id, link.source_id))
    out = {
        "dedup": merged, "compress_fading": compressed,
        "link_summaries": (summary, pick([neighbour])),
        "promote": pick(m.id for m in rows.values() if m.lifecycle == "promoted"),
        "compile_blocks": pick(mid for b in blocks for mid in b.source_ids),
        "graph_importance": pick(e.source_id for e in edges if e.created_at < AS_OF),
    }
    decayed = next(e for e in edges if e.weight < e.base_weight < 1.0
                   and not taken & {e.source_id, e.target_id})
    out["decay_edges"] = decayed
    out["external"] = {mid: m.external_id for mid, m in rows.items()}
    return out


def test_a_memory_ingested_again_during_a_step_is_left_to_the_next_run(
    template: Path, new_store: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch,
    serial: dict[str, Any],
) -> None:
    aim = run_then_ingest(full_consolidation, moments_of(FULL_STEPS), template, new_store,
                          monkeypatch, serial)["targets"]
    store = fresh(template, new_store, "during", monkeypatch)
    before = {m.id: m for m in memories(store)}
    updated = {
        "dedup": aim["dedup"].member_ids[0],
        "compress_fading": aim["compress_fading"].member_ids[0],
        "link_summaries": aim["link_summaries"][1],
        **{name: aim[name] for name in ("promote", "compile_blocks", "graph_importance")},
    }
    vectors = vectors_of(store, list(updated.values()))
    external = aim["external"]

    def new_words(mid: str) -> Callable[[Store], None]:
        return lambda s: put(s, [{"id": external[mid], "profile": PROFILE,
                                  "content": f"{before[mid].content}, now said otherwise",
                                  "embedding": vectors[mid].tolist()}])

    edge = aim["decay_edges"]
    batches: dict[Moment, Callable[[Store], None]] = {
        (name, "after"): new_words(mid) for name, mid in updated.items()}
    batches["decay_edges", "after"] = lambda s: put(s, [{
        "type": "edge", "profile": PROFILE, "source": external[edge.source_id],
        "target": external[edge.target_id], "weight": 1.0,
        "last_strengthened_at": AT.isoformat()}])
    with ingesting_during(monkeypatch, batches) as reached:
        first = full_consolidation(profile=PROFILE, as_of=AS_OF, config=RULES)
    assert reached >= set(batches)

    # Nothing was done with what these memories said before.
    now = {m.id: m for m in memories(store)}
    stale = {before[mid].content for mid in updated.values()}
    assert not [m.id for m in now.values() if m.tier == Tier.HOT and m.id not in before
                and says_stale(m.content, stale)]
    for name, mid in updated.items():
        assert now[mid].content.endswith("now said otherwise"), name
    for name in ("dedup", "compress_fading"):  # its group waits, whole
        decision, mid = aim[name], updated[name]
        assert decision.summary_id not in now, name
        assert now[mid].tier == Tier.HOT and now[mid].superseded_by is None, name
        assert not [d.id for d in everything_decided(store) if mid in d.member_ids], name
        assert deferred(first, name) == [decision.summary_id]
    summary = aim["link_summaries"][0]
    assert now[summary].linked_at is None and not associations(store, summary)
    assert summary in deferred(first, "link_summaries")
    assert now[aim["promote"]].lifecycle == before[aim["promote"]].lifecycle == "active"
    assert aim["promote"] in deferred(first, "promote")
    assert aim["compile_blocks"] not in {m for b in blocks(store) for m in b.source_ids}
    assert not any(before[aim["compile_blocks"]].content in b.content for b in blocks(store))
    scored = aim["graph_importance"]
    assert (now[scored].pagerank, now[scored].community) == (
        before[scored].pagerank, before[scored].community)
    strengthened = next(e for e in associations(store, edge.source_id) if e.id == edge.id)
    assert (strengthened.weight, strengthened.base_weight) == (1.0, 1.0)
    assert strengthened.last_strengthened_at == AT

    # The next run takes them as they are now.
    full_consolidation(profile=PROFILE, as_of=NEXT, config=RULES)
    later = {m.id: m for m in memories(store)}
    for name, mid in updated.items():  # scored with the rest now (or merged away)
        assert later[mid].pagerank is not None or later[mid].tier == Tier.COLD, name
    assert later[summary].linked_at == NEXT and associations(store, summary)
    assert later[aim["promote"]].lifecycle == "promoted"
    assert later[scored].pagerank != before[scored].pagerank
    assert not [m.id for m in later.values() if m.tier == Tier.HOT and m.id not in before
                and says_stale(m.content, stale)]


def says_stale(content: str, stale: set[str]) -> bool:
    """Whether ``content`` states one of the old words as they were (a summary that
    quotes the new words whole holds the old ones as their start)."""
    return any(old in content.replace(f"{old}, now said otherwise", "") for old in stale)


def everything_decided(store: Store) -> list[Consolidation]:
    with store.reading_all() as s:
        return list(s.execute(select(Consolidation)
                              .where(Consolidation.profile_id == PROFILE)).scalars())


def memories(store: Store) -> list[Memory]:
    with store.reading_all() as s:
        return list(s.execute(select(Memory).where(Memory.profile_id == PROFILE)).scalars())


def blocks(store: Store) -> list[CoreBlock]:
    with store.reading_all() as s:
        return list(s.execute(select(CoreBlock).where(CoreBlock.profile_id == PROFILE))
                    .scalars())


def associations(store: Store, memory_id: str) -> list[Edge]:
    with store.reading_all() as s:
        return list(s.execute(
            select(Edge).where(Edge.profile_id == PROFILE)
            .where(Edge.kind == EdgeKind.ASSOCIATION)
            .where((Edge.source_id == memory_id) | (Edge.target_id == memory_id))).scalars())


def deferred(report: RunReport, step: str) -> list[str]:
    found = next(r for r in report.steps if r.step == step)
    return [c.target for c in found.changes if c.action == "deferred"]
