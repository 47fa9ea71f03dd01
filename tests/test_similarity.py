import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reverie.engines import similarity
from reverie.engines.similarity import (
    chosen_rows,
    nearest_within,
    radius_neighbours,
    search_cells,
    similarity_pairs,
    top_k,
)
from reverie.models.config import SearchConfig

from factories import at_cosine, axis, below, clustered


def test_threshold_is_inclusive_in_float32() -> None:
    vectors = np.stack([axis(0), at_cosine(0.85, other=1), at_cosine(below(0.85), other=2)])
    found = radius_neighbours(vectors, 0.85)
    assert list(found.indices[0]) == [1]
    assert found.similarities[0][0] == np.float32(0.85)


def test_a_row_is_not_its_own_neighbour_but_duplicates_are() -> None:
    vectors = np.stack([axis(0), axis(0), axis(1)])
    found = radius_neighbours(vectors, 0.99)
    assert [list(i) for i in found.indices] == [[1], [0], []]


def test_neighbours_are_ordered_best_first_then_by_index() -> None:
    vectors = np.stack([axis(0), at_cosine(0.9, other=1), at_cosine(0.95, other=2),
                        at_cosine(0.9, other=3)])
    found = radius_neighbours(vectors, 0.8)
    assert list(found.indices[0]) == [2, 1, 3]


def test_chunked_search_matches_brute_force(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    centres = rng.normal(size=(20, 32))
    vectors = centres[rng.integers(0, 20, 600)] + 0.25 * rng.normal(size=(600, 32))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    monkeypatch.setattr(similarity, "QUERY_CHUNK", 37)
    found = radius_neighbours(vectors, 0.8)
    sims = vectors @ vectors.T
    for i in range(len(vectors)):
        expected = {j for j in np.flatnonzero(sims[i] >= np.float32(0.8)) if j != i}
        # Brute-force float32 sums can differ from FAISS in the last bit; skip razor-edge pairs.
        edge = {j for j in range(len(vectors)) if abs(sims[i, j] - 0.8) < 1e-5}
        assert set(found.indices[i]) - edge == expected - edge


def test_separate_queries_and_empty_inputs() -> None:
    vectors = np.stack([axis(0), axis(1)])
    found = radius_neighbours(vectors, 0.5, queries=np.stack([axis(1)]))
    assert list(found.indices[0]) == [1]
    empty = radius_neighbours(np.zeros((0, 4), np.float32), 0.5, queries=np.ones((2, 4), np.float32))
    assert [len(i) for i in empty.indices] == [0, 0]


def test_chosen_rows_stay_aligned_and_none_chosen_keeps_the_width() -> None:
    vectors = np.stack([axis(0), axis(1), axis(2)])
    kept, kept_vectors = chosen_rows(["a", "b", "c"], vectors, lambda m: m != "b")
    assert kept == ["a", "c"]
    assert np.array_equal(kept_vectors, vectors[[0, 2]])
    none, no_vectors = chosen_rows(["a"], vectors[:1], lambda m: False)
    assert none == [] and no_vectors.shape == (0, vectors.shape[1])


def test_top_k_pads_with_minus_one_when_short() -> None:
    sims, idx = top_k(np.stack([axis(0), axis(1)]), np.stack([axis(0)]), 5)
    assert list(idx[0]) == [0, 1]
    sims, idx = top_k(np.zeros((0, 4), np.float32), np.ones((1, 4), np.float32), 3)
    assert list(idx[0]) == [-1, -1, -1]


def test_pairs_are_each_unordered_pair_once_and_match_neighbours() -> None:
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(300, 16))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    i, j, s = similarity_pairs(vectors, 0.5)
    assert np.all(i < j) and len(set(zip(i.tolist(), j.tolist(), strict=True))) == len(i)
    found = radius_neighbours(vectors, 0.5)
    assert len(i) * 2 == sum(len(x) for x in found.indices)
    assert np.all(s >= np.float32(0.5))


def test_pairs_threshold_is_inclusive() -> None:
    vectors = np.stack([axis(0), at_cosine(0.75, other=1), at_cosine(below(0.75), other=2)])
    i, j, _ = similarity_pairs(vectors, 0.75)
    assert list(zip(i.tolist(), j.tolist(), strict=True)) == [(0, 1)]


def test_large_sets_go_by_cells_with_high_recall_and_no_false_pairs() -> None:
    vectors = clustered(4000)
    exact = set(zip(*similarity_pairs(vectors, 0.8)[:2], strict=True))
    cells = SearchConfig(exact_limit=1000, rows_per_cell=50)
    i, j, s = similarity_pairs(vectors, 0.8, cells)
    found = set(zip(i, j, strict=True))
    assert len(found & exact) / len(exact) >= 0.99
    assert found <= exact and np.all(i < j) and np.all(s >= np.float32(0.8))
    # The same input always gives the same answer.
    again = similarity_pairs(vectors, 0.8, cells)
    assert all(np.array_equal(a, b) for a, b in zip(again, (i, j, s), strict=True))
    # Neighbour lists built from the pairs are symmetric.
    lists = radius_neighbours(vectors, 0.8, search=cells)
    assert sum(len(x) for x in lists.indices) == 2 * len(i)


@settings(max_examples=60, deadline=None, database=None)
@given(
    n=st.integers(1, 300), k=st.integers(0, 12), seed=st.integers(0, 2**32 - 1),
    threshold=st.sampled_from([0.0, 0.5, 0.7, 0.9, 1.0]),
    spread=st.sampled_from([0.0, 0.1, 0.5]), duplicates=st.booleans(),
)
def test_nearest_within_is_the_radius_search_cut_to_k(
    n: int, k: int, seed: int, threshold: float, spread: float, duplicates: bool
) -> None:
    """Linking's bounded search lists exactly what the range search would, without the
    row itself, cut to k: ties across the cut (exact duplicates) included."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(max(1, n // 10), 16))
    v = centres[rng.integers(0, len(centres), n)] + spread * rng.normal(size=(n, 16))
    if duplicates:
        v[rng.integers(0, n, n // 3)] = v[0]
    v = (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)
    rows = sorted(rng.choice(n, size=min(n, 40), replace=False).tolist())
    bounded = nearest_within(v, rows, threshold, k)
    ranged = radius_neighbours(v, threshold, queries=v[rows])
    for row, idx, sims, all_idx, all_sims in zip(
        rows, bounded.indices, bounded.similarities, ranged.indices, ranged.similarities,
        strict=True,
    ):
        others = all_idx != row
        assert idx.tolist() == all_idx[others][:k].tolist()
        assert np.array_equal(sims, all_sims[others][:k])


def test_probing_every_cell_is_the_exact_search_and_fewer_probes_find_less() -> None:
    vectors = clustered(3000)
    exact = similarity_pairs(vectors, 0.8)
    everywhere = SearchConfig(exact_limit=100, rows_per_cell=50, cell_probes=4096)
    i, j, sims = similarity_pairs(vectors, 0.8, everywhere)
    # The same pairs and the same similarities, bit for bit: each is the pair's own,
    # not the product of the block it was found in.
    assert np.array_equal(i, exact[0]) and np.array_equal(j, exact[1])
    assert np.array_equal(sims, exact[2])
    one = similarity_pairs(vectors, 0.8, everywhere.with_probes(1))
    assert 0 < len(one[0]) < len(exact[0])


def test_linking_goes_by_cells_above_the_limit_with_high_recall_and_no_false_neighbours(
) -> None:
    vectors = clustered(4000)
    rows = list(range(0, 4000, 3))
    exact = nearest_within(vectors, rows, 0.7, 10)
    cells = SearchConfig(exact_limit=1000, rows_per_cell=50)
    found = nearest_within(vectors, rows, 0.7, 10, cells)
    exact_links = {(r, int(j)) for r, idx in zip(rows, exact.indices, strict=True) for j in idx}
    links = {(r, int(j)) for r, idx in zip(rows, found.indices, strict=True) for j in idx}
    assert len(links & exact_links) / len(exact_links) >= 0.99
    for row, idx, sims in zip(rows, found.indices, found.similarities, strict=True):
        assert len(idx) <= 10 and row not in idx.tolist()
        assert np.all(sims >= np.float32(0.7))
        assert np.array_equal(sims, similarity.exact(vectors, np.full(len(idx), row), idx))
        # Best first, ties by index.
        assert np.array_equal(np.lexsort((idx, -sims)), np.arange(len(idx)))
    # Below the limit the same call is the exact search.
    exact_again = nearest_within(vectors, rows, 0.7, 10, SearchConfig(exact_limit=4000))
    assert all(np.array_equal(a, b) for a, b in
               zip(exact_again.indices, exact.indices, strict=True))


def test_linking_by_cells_probing_every_cell_is_exact_whatever_its_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    vectors = clustered(2000)
    rows = [5, 5, 17, *range(100, 2000, 7)]  # a row asked twice gets its answer twice
    exact = nearest_within(vectors, rows, 0.6, 8)
    everywhere = SearchConfig(exact_limit=100, rows_per_cell=50, cell_probes=4096)
    monkeypatch.setattr(similarity, "NEAREST_CHUNK", 37)
    found = nearest_within(vectors, rows, 0.6, 8, everywhere)
    for a, b in zip(found.indices, exact.indices, strict=True):
        assert a.tolist() == b.tolist()
    for a, b in zip(found.similarities, exact.similarities, strict=True):
        assert np.array_equal(a, b)
    one = nearest_within(vectors, rows, 0.6, 8, everywhere.with_probes(1))
    assert sum(map(len, one.indices)) < sum(map(len, exact.indices))


THREADS = """
import sys, numpy as np
from reverie.engines import similarity as s
v = np.load(sys.argv[1])
i, j, sims = s.similarity_pairs(v, 0.8)
near = s.nearest_within(v, list(range(0, len(v), 5)), 0.6, 8)
top, idx = s.top_k(v, v[:40], 7)
np.savez(sys.argv[2], i=i, j=j, sims=sims, top=top, idx=idx,
         near=np.concatenate(near.similarities), near_idx=np.concatenate(near.indices),
         sample=s.pair_similarities(v[:60]))
"""


def test_similarities_are_the_same_with_one_thread_or_two(tmp_path: Path) -> None:
    """A Dask worker computes with one thread (OMP_NUM_THREADS=1); BLAS and FAISS then
    sum a product's terms in another order. What the search returns may not differ."""
    np.save(tmp_path / "v.npy", clustered(3000))
    results = []
    for threads in ("1", "2"):
        env = {**os.environ, "OMP_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads,
               "MKL_NUM_THREADS": threads}
        out = tmp_path / f"{threads}.npz"
        subprocess.run([sys.executable, "-c", THREADS, str(tmp_path / "v.npy"), str(out)],
                       env=env, check=True, timeout=300)
        results.append(np.load(out))
    one, two = results
    assert len(one["i"]) > 1000 and len(one["near"]) > 1000
    for key in one.files:
        assert np.array_equal(one[key], two[key]), key


def test_a_pairs_similarity_is_its_own_whatever_is_searched_with_it() -> None:
    vectors = clustered(3000)
    i, j, sims = similarity_pairs(vectors, 0.8)
    some = np.unique(np.concatenate([i[::7], j[::7]]))[:500]
    si, sj, ssims = similarity_pairs(vectors[some], 0.8)
    whole = dict(zip(zip(i.tolist(), j.tolist(), strict=True), sims.tolist(), strict=True))
    for a, b, sim in zip(some[si].tolist(), some[sj].tolist(), ssims.tolist(), strict=True):
        assert whole[a, b] == sim


@settings(max_examples=30, deadline=None, database=None)
@given(
    n=st.integers(0, 120), seed=st.integers(0, 2**32 - 1), groups=st.integers(1, 12),
    threshold=st.sampled_from([0.3, 0.5, 0.8]), exact_limit=st.sampled_from([2, 50, 1000]),
    probes=st.integers(1, 4), tiny=st.sampled_from([0, 3, 32]),
)
def test_a_grouped_search_finds_the_whole_search_s_pairs_within_groups(
    n: int, seed: int, groups: int, threshold: float, exact_limit: int, probes: int,
    tiny: int,
) -> None:
    """Searched by groups, exactly the pairs the search of every row finds that lie in
    one group (and none of a row in group -1), exact or by cells: the cells are all the
    rows', whichever way a group's rows are compared (every pair, a product, or cells)."""
    rng = np.random.default_rng(seed)
    v = clustered(n, dim=16, seed=seed % 1000) if n >= 20 else rng.normal(size=(n, 16))
    v = (v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-9)).astype(np.float32)
    # Group sizes from one row to most of the set: every way of comparing is taken.
    label = np.minimum(rng.geometric(0.3, n) - 2, groups - 1)
    search = SearchConfig(exact_limit=exact_limit, rows_per_cell=10, cell_probes=probes)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(similarity, "TINY_GROUP", tiny)
        grouped = similarity_pairs(v, threshold, search, label)
    i, j, s = similarity_pairs(v, threshold, search)
    keep = (label[i] == label[j]) & (label[i] >= 0)
    for got, want in zip(grouped, (i[keep], j[keep], s[keep]), strict=True):
        assert np.array_equal(got, want)


def _blas_threads() -> list[int]:
    return [lib.get_num_threads()
            for lib in similarity._blas().select(user_api="blas").lib_controllers]


def test_products_in_one_thread_find_what_the_libraries_threads_find(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The searches' products run in one BLAS thread and only propose pairs: the pairs,
    neighbours and similarities are those of the products in the library's threads,
    and the library's thread count is given back, also to callers in other threads."""
    # The suite's processes compute with one thread (conftest): the library gets two here.
    with similarity._blas().limit(limits=2, user_api="blas"):
        vectors = clustered(3000)
        cells = SearchConfig(exact_limit=1000, rows_per_cell=50)
        groups = np.arange(len(vectors)) % 7
        searched = [similarity_pairs(vectors, 0.8), similarity_pairs(vectors, 0.8, cells),
                    similarity_pairs(vectors, 0.6, cells, groups),
                    nearest_within(vectors, range(0, 3000, 3), 0.6, 5, cells).indices]
        before = _blas_threads()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: similarity.products(vectors[:500], vectors[:300].T), range(16)))
        assert _blas_threads() == before == [2] * len(before) and len(before) >= 1
        monkeypatch.setattr(similarity, "products", lambda a, b: a @ b)
        plain = [similarity_pairs(vectors, 0.8), similarity_pairs(vectors, 0.8, cells),
                 similarity_pairs(vectors, 0.6, cells, groups),
                 nearest_within(vectors, range(0, 3000, 3), 0.6, 5, cells).indices]
        assert len(searched[1][0]) > 1000
        for ours, theirs in zip(searched[:3], plain[:3], strict=True):
            assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))
        assert all(np.array_equal(a, b) for a, b in zip(searched[3], plain[3], strict=True))
        assert np.allclose(similarity.products(vectors[:50], vectors[:40].T),
                           vectors[:50] @ vectors[:40].T, atol=float(similarity.MARGIN) / 10)


def test_cells_worked_out_ahead_find_what_the_search_finds_itself() -> None:
    """``search_cells`` worked out in another thread (as the update search does, beside
    its values) is what the search works out itself: the same pairs, grouped or not;
    and None where the search compares every pair."""
    vectors = clustered(3000)
    search = SearchConfig(exact_limit=500, rows_per_cell=30, cell_probes=2)
    groups = np.arange(3000) % 7 - 1  # one row in seven in no group
    with ThreadPoolExecutor(1) as pool:
        cells = pool.submit(search_cells, vectors, search).result()
    assert cells is not None and search_cells(vectors[:500], search) is None
    for grouped in (None, groups):
        own = similarity_pairs(vectors, 0.6, search, grouped)
        ahead = similarity_pairs(vectors, 0.6, search, grouped, cells)
        assert len(own[0]) > 1000
        for a, b in zip(own, ahead, strict=True):
            assert np.array_equal(a, b)
    # The cells given are the ones used: other cells, other pairs.
    other = search_cells(vectors, search.model_copy(update={"rows_per_cell": 300}))
    assert len(similarity_pairs(vectors, 0.6, search, None, other)[0]) != \
        len(similarity_pairs(vectors, 0.6, search)[0])
