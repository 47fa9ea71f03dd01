"""Linking's plan: which summaries get which neighbours, exactly below the search's
limit and by linking's own cell probes above it."""

from __future__ import annotations

from reverie.models.config import LinkConfig, SearchConfig
from reverie.models.tables import Origin
from reverie.tasks.linking import plan_links

from factories import clustered, view


def test_above_the_limit_linking_probes_as_many_cells_as_its_own_config_says() -> None:
    vectors = clustered(3000)
    memories = [view(f"m{i:05d}", origin=Origin.COMPRESSED if i % 3 == 0
                     else Origin.INGESTED) for i in range(len(vectors))]
    # Its own probes decide, not the search's (which would find everything here).
    search = SearchConfig(exact_limit=100, rows_per_cell=50, cell_probes=4096)
    exact_linked, exact = plan_links(memories, vectors, LinkConfig(), SearchConfig())
    every_linked, every = plan_links(memories, vectors, LinkConfig(cell_probes=4096), search)
    _, one = plan_links(memories, vectors, LinkConfig(cell_probes=1), search)
    assert every_linked == exact_linked == [m.id for m in memories[::3]]
    assert {(e.source_id, e.target_id) for e in every} == {
        (e.source_id, e.target_id) for e in exact}
    assert 0 < len(one) < len(exact)
    assert all(e.weight >= 0.7 for e in one)
