import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import select, update

from reverie.models.db import dispose, engine_for, writing
from reverie.models.errors import AmbiguousIdError, NotFoundError
from reverie.models.export import export_jsonl
from reverie.models.records import NewEdge
from reverie.models.repositories import edges as edges_repo
from reverie.models.repositories import forgetting as forgetting_repo
from reverie.models.repositories import memories as memories_repo
from reverie.models.repositories import summaries as summaries_repo
from reverie.models.repositories.bulk import owned_by
from reverie.models.repositories.memories import M
from reverie.models.settings import Settings
from reverie.models.store import Store
from reverie.models.tables import EdgeKind, Memory, Tier, Tombstone
from reverie.recall.search import recall

from factories import get_memory, in_read, in_write, ingest_records, record, record_access

T0 = datetime(2025, 3, 1)


def test_get_finds_a_memory_by_either_id_in_any_tier(store: Store) -> None:
    ingest_records(store, [record("alpha", id="a1")], profile="p")
    m = get_memory(store, "a1")
    assert get_memory(store, m.id).external_id == "a1"
    with pytest.raises(NotFoundError):
        get_memory(store, "missing")


def test_an_external_id_in_two_profiles_needs_a_profile(store: Store) -> None:
    ingest_records(store, [record("one", id="x", profile="p"), record("two", id="x", profile="q")])
    with pytest.raises(AmbiguousIdError, match="p, q"):
        get_memory(store, "x")
    assert get_memory(store, "x", profile="q").content == "two"


def test_get_returns_the_tombstone_of_a_deleted_memory(store: Store) -> None:
    with writing(store.url) as s:
        s.add(Tombstone(memory_id="m-gone", profile_id="p", external_id="g", content_hash="h",
                        reason="forgotten", deleted_at=T0))
    assert isinstance(get_memory(store, "g"), Tombstone)
    assert get_memory(store, "m-gone").reason == "forgotten"


def test_record_access_counts_and_strengthens_co_accessed_edges(store: Store) -> None:
    ingest_records(store, [record("a", id="a"), record("b", id="b"), record("c", id="c")], profile="p")
    a, b, c = (get_memory(store, x).id for x in "abc")
    in_write(store, "p", edges_repo.add_edges, [NewEdge(a, b, EdgeKind.ASSOCIATION, 0.5), NewEdge(a, c, EdgeKind.ASSOCIATION, 0.98),
                          NewEdge(b, c, EdgeKind.ASSOCIATION, 0.3)], T0)
    later = T0 + timedelta(days=40)
    assert record_access(store, "p", [a, b, c, a], later) == 3
    assert get_memory(store, a).access_count == 1 and get_memory(store, a).last_accessed_at == later
    weights = {(e.source_id, e.target_id): (e.weight, e.base_weight, e.last_strengthened_at)
               for e in in_read(store, "p", edges_repo.edges)}
    pair = lambda x, y: (min(x, y), max(x, y))  # noqa: E731
    assert weights[pair(a, b)] == (pytest.approx(0.55), pytest.approx(0.55), later)
    assert weights[pair(a, c)][0] == 1.0  # capped
    # An older access does not move the last-access time backwards.
    record_access(store, "p", [a], T0)
    assert get_memory(store, a).last_accessed_at == later and get_memory(store, a).access_count == 2


def test_an_edge_added_again_keeps_its_larger_weight_and_its_later_strengthening(
    store: Store,
) -> None:
    ingest_records(store, [record("a", id="a"), record("b", id="b"), record("c", id="c")],
                   profile="p")
    a, b, c = (get_memory(store, x).id for x in "abc")
    later = T0 + timedelta(days=3)

    def add(edges: list[tuple[str, str, float]], at: datetime) -> None:
        def write(tx):  # type: ignore[no-untyped-def]
            edges_repo.upsert_edges(tx.session, tx.profile, [
                NewEdge(x, y, EdgeKind.ASSOCIATION, w) for x, y, w in edges], at, T0)
        in_write(store, "p", write)

    def stored() -> dict[tuple[str, str], tuple[float, float, datetime]]:
        return {(e.source_id, e.target_id): (e.weight, e.base_weight, e.last_strengthened_at)
                for e in in_read(store, "p", edges_repo.edges)}

    pair = lambda x, y: (min(x, y), max(x, y))  # noqa: E731
    # Twice in one batch, the larger weight wins; reversed, it is the same edge.
    add([(a, b, 0.4), (b, a, 0.6), (a, c, 0.5)], later)
    assert stored() == {pair(a, b): (0.6, 0.6, later), pair(a, c): (0.5, 0.5, later)}
    # A weaker arrival changes nothing; a stronger one from an earlier time raises the
    # weight but does not move the strengthening back.
    add([(a, b, 0.3), (a, c, 0.7)], T0)
    assert stored() == {pair(a, b): (0.6, 0.6, later), pair(a, c): (0.7, 0.7, later)}
    # A stronger one from a later time moves both; a new edge beside them is added.
    latest = later + timedelta(days=1)
    add([(a, b, 0.9), (b, c, 0.2)], latest)
    assert stored() == {pair(a, b): (0.9, 0.9, latest), pair(a, c): (0.7, 0.7, later),
                        pair(b, c): (0.2, 0.2, latest)}


def test_a_lookup_by_ids_stays_inside_its_profile(store: Store) -> None:
    ingest_records(store, [record("mine", id="a")], profile="p")
    ingest_records(store, [record("theirs", id="b")], profile="q")
    a, b = get_memory(store, "a", "p").id, get_memory(store, "b", "q").id

    def ids_of(profile: str) -> list[str]:
        with writing(store.url) as s:
            return sorted(s.execute(
                select(M.c.id).where(owned_by(M, profile)).where(M.c.id.in_([a, b]))
            ).scalars())

    assert ids_of("p") == [a]
    assert ids_of("q") == [b]
    assert ids_of("nobody") == []


def test_a_sqlite_connection_keeps_the_page_cache_the_settings_give(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REVERIE_SQLITE_CACHE_MIB", "3")
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    try:
        with engine_for(url, create=True).connect() as conn:
            assert conn.exec_driver_sql("PRAGMA cache_size").scalar() == -3 * 1024
    finally:
        dispose(url)
    for allowed in (2, 65_536):
        assert Settings(sqlite_cache_mib=allowed).sqlite_cache_mib == allowed
    for refused in (1, 65_537):
        with pytest.raises(ValidationError):
            Settings(sqlite_cache_mib=refused)


def test_recall_searches_hot_and_deep_adds_cold(store: Store) -> None:
    ingest_records(store, [record("Maya's cat is called Pixel", id="cat"),
                  record("Maya deploys with Argo CD", id="deploy")], profile="p")
    cat = get_memory(store, "cat").id
    with writing(store.url) as s:
        s.execute(update(Memory).where(Memory.id == cat).values(tier=Tier.COLD, superseded_by="m-sum"))
    hot = recall(store, "p", "what is the name of the cat", k=5)
    assert [h.memory.external_id for h in hot] == ["deploy"]
    deep = recall(store, "p", "what is the name of the cat", k=5, deep=True)
    assert deep[0].memory.external_id == "cat" and deep[0].superseded_by == "m-sum"
    assert deep[0].score > deep[1].score


def test_recall_with_tracking_records_the_hits(store: Store) -> None:
    ingest_records(store, [record("one fact"), record("another fact")], profile="p")
    hits = recall(store, "p", "fact", k=1, track=True, at=T0)
    assert get_memory(store, hits[0].memory.id).access_count == 1


def test_recall_never_crosses_profiles(store: Store) -> None:
    ingest_records(store, [record("secret of p", profile="p"), record("secret of q", profile="q")])
    assert {h.memory.profile_id for h in recall(store, "p", "secret", k=10)} == {"p"}
    with pytest.raises(NotFoundError):
        recall(store, "nobody", "secret")


def test_export_is_canonical_and_hides_run_ids(store: Store) -> None:
    ingest_records(store, [record("b text", id="b"), record("a text", id="a")], profile="p")
    text = export_jsonl(store.url, "p")
    lines = text.splitlines()
    assert [line.count('"type": "memory"') for line in lines] == [1, 1]
    assert text == export_jsonl(store.url, "p")
    assert "embedding_sha256" in lines[0] and '"embedding":' not in text
    ids_in_order = [json.loads(line)["id"] for line in lines]
    assert ids_in_order == sorted(ids_in_order)


def test_counts_by_tier(store: Store) -> None:
    ingest_records(store, [record("x")], profile="p")
    assert in_read(store, "p", memories_repo.counts) == {Tier.HOT: 1, Tier.COLD: 0, "tombstones": 0}


def test_whole_profile_id_lists_go_in_chunks(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from reverie.models.repositories import bulk

    monkeypatch.setattr(bulk, "IN_CHUNK", 2)
    ingest_records(store, [record(f"fact {i}", id=f"f{i}") for i in range(7)], profile="p")
    ids_ = [get_memory(store, f"f{i}").id for i in range(7)]
    with writing(store.url) as s:
        s.execute(update(Memory).where(Memory.id.in_(ids_[:5])).values(superseded_by="m-sum"))
    assert len(in_read(store, "p", summaries_repo.originals_of, ["m-sum", "m-other"])["m-sum"]) == 5
    in_write(store, "p", forgetting_repo.forget, ids_[:3], [(i, 0.0, "test") for i in ids_[3:]], T0, None, {})
    assert in_read(store, "p", memories_repo.counts) == {Tier.HOT: 0, Tier.COLD: 3, "tombstones": 4}


def test_bulk_updates_write_every_chunk_and_only_the_named_profile(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reverie.models.repositories import bulk

    ingest_records(store, [record(f"fact {k}", id=f"a{k}") for k in range(5)], profile="a")
    ingest_records(store, [record("other", id="b0")], profile="b")
    monkeypatch.setattr(bulk, "BULK_SET_CHUNK", 2)  # 5 rows: chunks of 2, 2 and 1
    ids = [m.id for m in in_read(store, "a", memories_repo.memories)]
    other = in_read(store, "b", memories_repo.memories)[0].id
    in_write(store, "a", memories_repo.set_relevance, [(mid, k / 10) for k, mid in enumerate(ids)] + [(other, 0.9)])
    assert [m.relevance for m in in_read(store, "a", memories_repo.memories)] == [0.0, 0.1, 0.2, 0.3, 0.4]
    assert in_read(store, "b", memories_repo.memories)[0].relevance is None  # an id of another profile is left alone


def test_a_snapshot_of_driver_rows_reads_as_sqlalchemys_rows(store: Store) -> None:
    """snapshot() builds its views from the driver's own tuples (SQLite: text times and
    integer booleans); memories() from SQLAlchemy's rows. Every field agrees."""
    ingest_records(store, [record("alpha", id="a", metadata={"why": ["é", 1]}),
                           record("beta", id="b")], profile="p")
    at = datetime(2025, 3, 1, 12, 30, 45, 123456)
    with writing(store.url) as s:
        s.execute(update(Memory).where(Memory.external_id == "a").values(
            last_accessed_at=at, valid_from=at - timedelta(days=1),
            valid_until=at + timedelta(days=1, microseconds=1), linked_at=at,
            protected=True, relevance=0.25))
    views, vectors = in_read(store, "p", memories_repo.snapshot)
    assert views == in_read(store, "p", memories_repo.memories)
    assert len(vectors) == 2
    first = next(v for v in views if v.external_id == "a")
    assert first.protected is True and first.linked_at == at
    assert first.valid_until == at + timedelta(days=1, microseconds=1)
    assert first.meta == {"why": ["é", 1]}
    assert next(v for v in views if v.external_id == "b").protected is False


def test_plain_row_inserts_read_back_as_sqlalchemys_own(store: Store) -> None:
    """Rows written by bulk.insert_rows (on SQLite the driver's executemany, each
    distinct value converted once) read back exactly as SQLAlchemy's own insert writes
    them: timestamps to the microsecond, JSON, and NULLs."""
    from sqlalchemy import insert, select

    from reverie.models.db import reading
    from reverie.models.repositories import bulk

    at = datetime(2025, 3, 1, 12, 30, 45, 123456)
    metas = [{}, {"why": ["é", 1, 2.5, None]}, {"nested": {"x": True}}]
    rows = [
        {"profile_id": "p", "source_id": f"s{k}", "target_id": f"t{k}",
         "kind": EdgeKind.DISCOVERED, "subkind": None if k else "shares_theme",
         "weight": 0.25 * (k + 1), "base_weight": 0.25, "confidence": None if k == 1 else 0.5,
         "last_strengthened_at": at + timedelta(days=k), "created_at": at, "metadata": meta}
        for k, meta in enumerate(metas)
    ]
    E = edges_repo.E
    with writing(store.url) as s:
        bulk.insert_rows(s, E, [{"id": f"plain{k}"} | r for k, r in enumerate(rows)])
        s.execute(insert(E), [{"id": f"sqla{k}"} | r for k, r in enumerate(rows)])
    with reading(store.url) as s:
        read = {r.id: {**r._mapping, "id": None} for r in s.execute(select(E))}
    assert len(read) == 6
    assert [read[f"plain{k}"] for k in range(3)] == [read[f"sqla{k}"] for k in range(3)]
    assert read["plain1"]["metadata"] == metas[1]
    assert read["plain0"]["created_at"] == at  # to the microsecond
    assert read["plain1"]["confidence"] is None
