"""Every comparison of memories goes through here, on FAISS.

Vectors are unit length, so inner product is cosine similarity. Thresholds are
inclusive and compared in float32: a pair whose similarity is exactly the threshold
counts.

Every similarity this module returns is a pair's own (``exact``): the two vectors'
products summed in float64 in one fixed order, rounded once to float32. FAISS and
numpy's matrix products sum in an order that depends on the block shape and on how
many threads BLAS and OpenMP use (a Dask worker runs with one), so their float32
results differ in the last bits from one process to another; taken as they are, an
edge weight and the PageRanks computed from it differed between two runs of the same
store. The products only find candidates, with ``MARGIN`` below the bound to spare.

All-pairs searches (dedup, compression, clustering) and linking's nearest neighbours
are exact up to ``SearchConfig.exact_limit`` rows. Above it they go by cells, the pairs FAISS's
inverted file would find: spherical k-means splits the set into cells of about
``rows_per_cell`` rows (at most ``MAX_CELLS``; past that, cells hold more rows), each
row is listed in its nearest cell, and each row is compared with the rows of the
``cell_probes`` cells nearest to it, one matrix product per cell. Exact search of
100k x 100k takes about 50 s on two cores, cells a few seconds at a recall above 0.99
on clustered data (BENCHMARKS.md measures it). The price: a pair
the cells miss may be found by a later run, so above the limit a repeated run is not
guaranteed to find nothing more.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, TypeVar

import faiss
import numpy as np

from reverie.models.config import SearchConfig

if TYPE_CHECKING:
    from threadpoolctl import ThreadpoolController

# Query rows per range search, and rows per side of a block of products: bounds
# the memory FAISS allocates for results, and a block's similarities (64 MB).
QUERY_CHUNK = 4096
# Beyond this many cells, cells grow instead: k-means and assigning rows to cells cost
# rows x cells, which at a million rows and 10,000 cells is minutes.
MAX_CELLS = 4096
TRAIN_ROWS_PER_CELL = 40
# k-means iterations for the cells: 6 found the same pairs as 10 (recall 0.99999 against
# exact search of dedup's 100k rows at 0.80) in 2.7 s instead of 3.4 s.
CELL_ITERATIONS = 6
CELL_SEED = 1234
# Query rows per pass of linking's search by cells: bounds the hits held before each
# row's are cut to its k best.
NEAREST_CHUNK = 16_384
# How far below a bound a matrix product's similarity may lie and the pair still be
# at the bound: float32 products of unit vectors of 384 dimensions are off by ~1e-6
# at worst, so this spares an order of magnitude.
MARGIN = np.float32(1e-5)
# Pairs per step of ``exact``: two blocks of 1.5 MB each.
EXACT_CHUNK = 1024
# A group of a grouped search this small proposes every pair of its rows: a matrix
# product per group of a few rows costs more in calls than ``exact`` of each pair.
TINY_GROUP = 32

DEFAULT_SEARCH = SearchConfig()

# Held while products run in one BLAS thread, and by how many callers: the thread count
# is the library's, shared by every thread, so the last to leave gives it back.
_ONE_THREAD = threading.Lock()
_one_thread_users = 0
_threads_before: list[int] = []

Row = TypeVar("Row")
# A search's cells (``search_cells``): their number, and per row the cells it probes.
Cells = tuple[int, np.ndarray]


@dataclass(frozen=True, slots=True)
class Neighbours:
    """For each query row: neighbour indices and similarities, best first (ties by index)."""

    indices: list[np.ndarray]
    similarities: list[np.ndarray]


def similarities_to_first(neighbours: Neighbours, group: Sequence[int]) -> list[float]:
    """Each row of ``group``'s cosine to its first (the representative or seed: 1.0
    itself), from the search that grouped them (6 decimals, as a supersession's)."""
    lead = group[0]
    found = dict(zip(neighbours.indices[lead].tolist(),
                     neighbours.similarities[lead].tolist(), strict=True))
    return [1.0, *(round(float(found[row]), 6) for row in group[1:])]


def chosen_rows(
    memories: Sequence[Row], vectors: np.ndarray, keep: Callable[[Row], bool]
) -> tuple[list[Row], np.ndarray]:
    """The memories ``keep`` accepts and their vectors, still row-aligned."""
    rows = [i for i, m in enumerate(memories) if keep(m)]
    if not rows:
        return [], np.zeros((0, vectors.shape[1]), np.float32)
    if len(rows) == len(memories):  # all of them: no copy of the matrix
        return list(memories), vectors
    return [memories[i] for i in rows], vectors[rows]


def exact(
    vectors: np.ndarray, rows: np.ndarray, others: np.ndarray,
    queries: np.ndarray | None = None,
) -> np.ndarray:
    """The similarity of each pair (``queries[rows[n]]`` or ``vectors[rows[n]]``,
    ``vectors[others[n]]``), the same whatever else is computed with it and however
    many threads run: products of float32 values are exact in float64, and einsum sums
    each pair's products in one fixed order (it calls no BLAS for this form)."""
    left = vectors if queries is None else queries
    out = np.empty(len(rows), np.float32)
    for start in range(0, len(rows), EXACT_CHUNK):
        a, b = left[rows[start : start + EXACT_CHUNK]], vectors[others[start : start + EXACT_CHUNK]]
        # Cast inside einsum: 7x faster than casting the blocks first.
        out[start : start + EXACT_CHUNK] = np.einsum("ij,ij->i", a, b, dtype=np.float64)
    return out


def _at_least(
    vectors: np.ndarray, rows: np.ndarray, others: np.ndarray, bound: np.float32,
    queries: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of candidate pairs (as for ``exact``), those whose exact similarity is >=
    ``bound``: (row, other, similarity)."""
    sims = exact(vectors, rows, others, queries)
    keep = sims >= bound
    return rows[keep], others[keep], sims[keep]


def _index(vectors: np.ndarray) -> faiss.Index:
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index


def _check(vectors: np.ndarray) -> np.ndarray:
    if vectors.ndim != 2:
        raise ValueError(f"expected a 2-d matrix of vectors, got shape {vectors.shape}")
    return np.ascontiguousarray(vectors, dtype=np.float32)


def _hits(
    vectors: np.ndarray, queries: np.ndarray, threshold: float
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per chunk of queries: (query row, hit row, similarity) of every hit >= threshold."""
    return _range_hits(_index(vectors), vectors, queries, threshold)


@cache
def _blas() -> ThreadpoolController:
    # Found on first use: looking up the loaded libraries at import would be a side
    # effect, and each lookup costs about a millisecond. Imported here too: a search
    # by FAISS alone (`reverie recall`) never needs it, and its import was about 1.5%
    # of that command's CPU.
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def products(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in one BLAS thread. The searches' products are small (a cell's 100
    rows against the 800 that probe it) and only propose pairs (``exact`` decides, so
    the thread count changes no result); split across threads, the threads waited on
    each other: the cell search of dedup's 100k candidates took 2.8 s of CPU and 13 s
    on a loaded machine in two threads, 0.5 s and 3.7 s in one."""
    global _one_thread_users
    libraries = _blas().select(user_api="blas").lib_controllers
    with _ONE_THREAD:
        if not _one_thread_users:
            _threads_before[:] = [lib.get_num_threads() for lib in libraries]
            for lib in libraries:
                lib.set_num_threads(1)
        _one_thread_users += 1
    try:
        return a @ b
    finally:
        with _ONE_THREAD:
            _one_thread_users -= 1
            if not _one_thread_users:
                for lib, threads in zip(libraries, _threads_before, strict=True):
                    lib.set_num_threads(threads)


def _product_candidates(vectors: np.ndarray, bound: np.float32) -> Iterator[np.ndarray]:
    """Every pair of rows (i < j) whose product is within ``MARGIN`` of ``bound``, as
    keys i * rows + j, per block of products. Compression searches each of ~2,500
    small subjects of a 100k profile apart: on a quiet machine FAISS's range searches
    cost about what the products do (1.4 s of planning against 1.3 s), but each call
    starts OpenMP threads, and with the cores busy elsewhere (a shared worker) they
    took 15 s against 1 s."""
    n = len(vectors)
    for start in range(0, n, QUERY_CHUNK):
        block = vectors[start : start + QUERY_CHUNK]
        for first in range(start, n, QUERY_CHUNK):
            sims = products(block, vectors[first : first + QUERY_CHUNK].T)
            q, r = np.nonzero(sims >= bound - MARGIN)
            i, j = q.astype(np.int64) + start, r.astype(np.int64) + first
            later = i < j  # a block on the diagonal holds each pair twice, and the rows
            yield i[later] * n + j[later]


def _range_hits(
    index: faiss.Index, vectors: np.ndarray, queries: np.ndarray, threshold: float
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``index``'s (of ``vectors``) hits >= ``threshold`` for each query row, chunk by
    chunk."""
    bound = np.float32(threshold)
    for start in range(0, len(queries), QUERY_CHUNK):
        block = queries[start : start + QUERY_CHUNK]
        lims, _, idx = index.range_search(block, float(bound - MARGIN))
        counts = np.diff(lims).astype(np.int64)
        rows = np.repeat(np.arange(start, start + len(block), dtype=np.int64), counts)
        yield _at_least(vectors, rows, idx.astype(np.int64), bound, queries)


def radius_neighbours(
    vectors: np.ndarray, threshold: float, queries: np.ndarray | None = None,
    search: SearchConfig = DEFAULT_SEARCH, groups: np.ndarray | None = None,
    cells: Cells | None = None,
) -> Neighbours:
    """All rows of ``vectors`` with similarity >= ``threshold`` to each query row.

    Without ``queries`` every row is a query and a row is not its own neighbour (an
    all-pairs search, as ``search`` says, only within ``groups`` if given: see
    ``similarity_pairs``, and ``cells`` for cells worked out already); with them,
    always exact.
    """
    vectors = _check(vectors)
    if queries is None:
        i, j, sims = similarity_pairs(vectors, threshold, search, groups, cells)
        rows = np.concatenate([i, j])
        idx = np.concatenate([j, i])
        sims = np.concatenate([sims, sims])
        return _per_row(rows, idx, sims, len(vectors))
    queries = _check(queries)
    if len(vectors) == 0:
        empty = np.zeros(0, np.int64)
        return _per_row(empty, empty, np.zeros(0, np.float32), len(queries))
    return _per_row(*_joined(_hits(vectors, queries, threshold)), len(queries))


def _joined(
    parts: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hits given chunk by chunk as one (row, other row, similarity) triple of arrays."""
    found = list(parts)
    if not found:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    rows, others, similarities = (np.concatenate([p[k] for p in found]) for k in range(3))
    return rows, others, similarities


def nearest_within(
    vectors: np.ndarray, rows: Sequence[int] | np.ndarray, threshold: float, k: int,
    search: SearchConfig = DEFAULT_SEARCH,
) -> Neighbours:
    """For each of ``rows`` (rows of ``vectors``): its ``k`` most similar other rows at
    similarity >= ``threshold``, best first, ties by index. What
    ``radius_neighbours(vectors, threshold, queries=vectors[rows])`` lists, without the
    row itself, cut to ``k``; but held in memory ``len(rows) x k`` whatever the
    threshold lets through (a low threshold among alike memories returns thousands
    per row, which at a million memories was gigabytes). Exact up to
    ``search.exact_limit`` rows of ``vectors``, among the rows of each row's probed
    cells above it."""
    vectors = _check(vectors)
    n, bound = len(vectors), np.float32(threshold)
    if n == 0 or k <= 0:
        empty = [np.zeros(0, np.int64) for _ in rows]
        return Neighbours(empty, [np.zeros(0, np.float32) for _ in rows])
    if n > search.exact_limit:
        return _nearest_by_cells(vectors, np.asarray(rows, dtype=np.int64), bound, k, search)
    index = _index(vectors)
    # k others, the row itself, and one more: a row beyond those found that may be as
    # similar as the k-th kept shows as the last one found coming that close to it.
    want = min(k + 2, n)
    indices: list[np.ndarray] = []
    similarities: list[np.ndarray] = []
    for start in range(0, len(rows), QUERY_CHUNK):
        chunk = np.asarray(rows[start : start + QUERY_CHUNK], dtype=np.int64)
        found_sims, found_idx = index.search(vectors[chunk], want)
        found_idx = found_idx.astype(np.int64)
        exact_sims = exact(vectors, np.repeat(chunk, want), np.maximum(found_idx, 0).ravel())
        exact_sims = np.where(found_idx >= 0, exact_sims.reshape(found_idx.shape), -np.inf)
        for row, near, idx, sims in zip(chunk, found_sims, found_idx, exact_sims, strict=True):
            kept_idx, kept_sims = _best_others(row, idx, sims.astype(np.float32), bound, k)
            if want < n and len(kept_idx) == k and near[-1] >= kept_sims[-1] - MARGIN:
                # Rows beyond those found may tie with the k-th: take every row about
                # that similar and choose among them exactly, ties by index.
                _, _, all_idx = index.range_search(
                    vectors[row : row + 1], float(kept_sims[-1] - MARGIN))
                all_idx = all_idx.astype(np.int64)
                kept_idx, kept_sims = _best_others(
                    row, all_idx, exact(vectors, np.full(len(all_idx), row), all_idx),
                    bound, k)
            indices.append(kept_idx)
            similarities.append(kept_sims)
    return Neighbours(indices, similarities)


def _best_others(
    row: int, idx: np.ndarray, sims: np.ndarray, bound: np.float32, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best of (idx, sims) other than ``row`` and at least ``bound``, best
    first, ties by index."""
    idx = idx.astype(np.int64)
    keep = (idx != row) & (idx >= 0) & (sims >= bound)
    idx, sims = idx[keep], sims[keep]
    order = np.lexsort((idx, -sims))[:k]
    return idx[order], sims[order]


def _per_row(rows: np.ndarray, idx: np.ndarray, sims: np.ndarray, count: int) -> Neighbours:
    order = np.lexsort((idx, -sims, rows))
    rows, idx, sims = rows[order], idx[order], sims[order]
    bounds = np.searchsorted(rows, np.arange(count + 1)).tolist()
    # Slices, not np.split: its generic path cost 3x as much for 100k rows.
    spans = list(zip(bounds[:-1], bounds[1:], strict=True))
    return Neighbours([idx[a:b] for a, b in spans], [sims[a:b] for a, b in spans])


def similarity_pairs(
    vectors: np.ndarray, threshold: float, search: SearchConfig = DEFAULT_SEARCH,
    groups: np.ndarray | None = None, cells: Cells | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every unordered pair of rows (i < j) with similarity >= ``threshold``, as arrays
    (i, j, similarity) sorted by (i, j). Vectorised: no Python loop over pairs.
    Exact up to ``search.exact_limit`` rows, by cells above it.

    ``groups`` (an integer per row): only pairs of rows in one group, none of a row
    in a negative one. Exactly the pairs the search of every row finds that are in
    one group: the cells are still those of all the rows (a search of each group
    apart would make other cells, and so find other pairs above the limit), but
    only the rows of a group are compared with each other.

    ``cells``: ``search_cells(vectors, search)``, if the caller worked it out already
    (in another thread, while it did something else: ``tasks.supersede``)."""
    vectors = _check(vectors)
    n, bound = len(vectors), np.float32(threshold)
    if groups is not None:
        groups = np.asarray(groups, dtype=np.int64)
        if groups.shape != (n,):
            raise ValueError(f"expected one group per row ({n}), got shape {groups.shape}")
        keys = list(_grouped_candidates(vectors, bound, search, groups, cells))
    elif n > search.exact_limit:
        keys = [_pair_keys(asked, found, n) for asked, found, _ in _cell_candidates(
            vectors, bound, cells or _cells(vectors, search))]
    else:
        keys = list(_product_candidates(vectors, bound))
    if not keys:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    # Each pair once (the cells may find it from both of its rows), ordered by (i, j).
    unique = np.unique(np.concatenate(keys))
    i, j = unique // max(n, 1), unique % max(n, 1)
    sims = exact(vectors, i, j)
    keep = sims >= bound
    return i[keep], j[keep], sims[keep]


def _grouped_candidates(
    vectors: np.ndarray, bound: np.float32, search: SearchConfig, groups: np.ndarray,
    given: Cells | None,
) -> Iterator[np.ndarray]:
    """Keys (i * rows + j, i < j) of candidate pairs in one group: every pair of a
    group that the search of all the rows would propose, and maybe more that ``exact``
    then refuses (a product only proposes; the exact similarity decides).

    By cells, a pair is proposed when one row's probed cells hold the other, so a pair
    of one group is tested for that directly. The rows of a group are compared as the
    group is small, or by the cells as in the search of all rows when it holds more
    rows than a row's probed cells do (each row is then compared with fewer)."""
    n = len(vectors)
    rows = np.flatnonzero(groups >= 0)
    if len(rows) < 2:
        return
    order = rows[np.argsort(groups[rows], kind="stable")]  # each group's rows ascending
    starts = np.flatnonzero(np.diff(groups[order], prepend=-1)).tolist()
    spans = list(zip(starts, [*starts[1:], len(order)], strict=True))
    cells_of = given if given is not None else search_cells(vectors, search)
    limit = comparisons_per_row(n, search) if cells_of else n

    def probed(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        if cells_of is None:
            return np.ones(len(i), dtype=bool)
        nearest = cells_of[1]
        own = nearest[:, 0]
        return (nearest[i] == own[j, None]).any(axis=1) | (nearest[j] == own[i, None]).any(axis=1)

    by_size: dict[int, list[int]] = {}
    large: list[np.ndarray] = []
    for start, end in spans:
        size = end - start
        if size <= TINY_GROUP:
            by_size.setdefault(size, []).append(start)
        elif size <= limit:
            members = order[start:end]
            for keys in _product_candidates(vectors[members], bound):
                i, j = members[keys // size], members[keys % size]
                yield (i * n + j)[probed(i, j)]
        else:
            large.append(order[start:end])
    # Small groups of one size at once, every pair of each proposed (``exact`` decides):
    # thousands of groups of a few rows are what a store of many entities holds.
    for size, firsts in by_size.items():
        if size < 2:
            continue
        members = order[np.asarray(firsts)[:, None] + np.arange(size)]
        ti, tj = np.triu_indices(size, 1)
        i, j = members[:, ti].ravel(), members[:, tj].ravel()
        yield (i * n + j)[probed(i, j)]
    if large and cells_of is not None:
        cells, nearest = cells_of
        queries = np.concatenate(large)
        # Only the large groups' rows in the cells and among the queries.
        own = np.full(n, cells, dtype=nearest.dtype)
        own[queries] = nearest[queries, 0]
        for asking, found, _ in _probed_candidates(
                vectors, own, queries, nearest[queries], cells, bound):
            asked = queries[asking]
            alike = groups[asked] == groups[found]
            yield _pair_keys(asked[alike], found[alike], n)


def _pair_keys(rows: np.ndarray, others: np.ndarray, n: int) -> np.ndarray:
    """Pairs of different rows as keys min * n + max."""
    apart = rows != others
    rows, others = rows[apart], others[apart]
    return np.minimum(rows, others) * n + np.maximum(rows, others)


def _cell_count(rows: int, search: SearchConfig) -> int:
    return min(MAX_CELLS, max(2, rows // search.rows_per_cell))


def comparisons_per_row(rows: int, search: SearchConfig = DEFAULT_SEARCH) -> int:
    """How many rows an all-pairs search of ``rows`` rows compares each row with, about:
    all of them up to ``exact_limit``, the rows of its probed cells above it."""
    if rows <= search.exact_limit:
        return rows
    return min(rows, search.cell_probes * -(-rows // _cell_count(rows, search)))


def search_cells(vectors: np.ndarray, search: SearchConfig = DEFAULT_SEARCH) -> Cells | None:
    """The cells an all-pairs search of ``vectors`` goes by, or None when it compares
    every pair (up to ``exact_limit`` rows)."""
    return _cells(_check(vectors), search) if len(vectors) > search.exact_limit else None


def _cells(vectors: np.ndarray, search: SearchConfig) -> Cells:
    """The cells of ``vectors``: their number, and per row the ``cell_probes`` cells
    nearest to it, nearest first (a row lies in the first)."""
    n, dim = vectors.shape
    cells = _cell_count(n, search)
    rng = np.random.default_rng(CELL_SEED)
    sample = np.sort(rng.choice(n, min(n, cells * TRAIN_ROWS_PER_CELL), replace=False))
    kmeans = faiss.Kmeans(dim, cells, niter=CELL_ITERATIONS, seed=CELL_SEED, spherical=True)
    kmeans.train(vectors[sample])
    assert kmeans.centroids is not None  # set by train
    quantizer = faiss.IndexFlatIP(dim)
    quantizer.add(kmeans.centroids / np.linalg.norm(kmeans.centroids, axis=1, keepdims=True))
    # Each row probes the cells nearest to itself, not to its cell: a row at the edge
    # of its cell looks across that edge (cell-to-cell probing found 0.92 of the pairs
    # of a sparse 84k-row set at 1M, where these probes find 0.996).
    _, nearest = quantizer.search(vectors, min(search.cell_probes, cells))
    return cells, nearest


def _cell_candidates(
    vectors: np.ndarray, bound: np.float32, cells_of: Cells
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Candidate pairs (row, other row, product) found by ``cells_of``; see the module
    docstring."""
    cells, nearest = cells_of
    yield from _probed_candidates(vectors, nearest[:, 0], np.arange(len(vectors)), nearest,
                                  cells, bound)


def _probed_candidates(
    vectors: np.ndarray, own: np.ndarray, queries: np.ndarray, probed: np.ndarray,
    cells: int, bound: np.float32,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Candidates (query's position in ``queries``, row, product) of each query row among
    the rows of the cells it probes (``own``: each row's cell; ``probed``: per query,
    its cells). The pairs FAISS's inverted file finds, but computed cell by cell, as
    one matrix product of a cell's rows with every query probing it: FAISS's range
    search compares one query at a time and took 6 s of dedup at 100k."""
    probes = probed.shape[1]
    members = np.argsort(own, kind="stable")
    member_bounds = np.searchsorted(own[members], np.arange(cells + 1))
    flat = probed.ravel()
    probing = np.argsort(flat, kind="stable")
    probing_bounds = np.searchsorted(flat[probing], np.arange(cells + 1))
    probing //= probes  # the probing queries, grouped by the cell they probe
    for cell in range(cells):
        rows = members[member_bounds[cell] : member_bounds[cell + 1]]
        asked = probing[probing_bounds[cell] : probing_bounds[cell + 1]]
        # In blocks: a crowded cell (skewed data) would otherwise need a product of
        # its rows with hundreds of thousands of probing rows at once.
        for start in range(0, len(rows), QUERY_CHUNK):
            block = rows[start : start + QUERY_CHUNK]
            block_vectors = vectors[block].T
            for first in range(0, len(asked), QUERY_CHUNK):
                asking = asked[first : first + QUERY_CHUNK]
                sims = products(vectors[queries[asking]], block_vectors)
                q, r = np.nonzero(sims >= bound - MARGIN)
                yield asking[q].astype(np.int64), block[r].astype(np.int64), sims[q, r]


def _nearest_by_cells(
    vectors: np.ndarray, rows: np.ndarray, bound: np.float32, k: int, search: SearchConfig
) -> Neighbours:
    """``nearest_within`` among the rows of each row's probed cells. Queries go in
    chunks, each cut to its ``k`` best before the next: a low threshold among alike
    memories finds thousands of hits per row."""
    cells, nearest = _cells(vectors, search)
    indices: list[np.ndarray] = []
    similarities: list[np.ndarray] = []
    for start in range(0, len(rows), NEAREST_CHUNK):
        chunk = rows[start : start + NEAREST_CHUNK]
        asking, others, products = _joined(_probed_candidates(
            vectors, nearest[:, 0], chunk, nearest[chunk], cells, bound))
        apart = others != chunk[asking]
        asking, others, products = _near_the_best(
            asking[apart], others[apart], products[apart], len(chunk), k)
        sims = exact(vectors, chunk[asking], others)
        keep = sims >= bound
        listed = _per_row(asking[keep], others[keep], sims[keep], len(chunk))
        indices += [idx[:k] for idx in listed.indices]
        similarities += [s[:k] for s in listed.similarities]
    return Neighbours(indices, similarities)


def _near_the_best(
    rows: np.ndarray, others: np.ndarray, products: np.ndarray, count: int, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of each row's candidates, those whose product is within ``MARGIN`` of its k-th
    best: the only ones that can be among its k best by exact similarity. A low
    threshold among alike memories finds thousands per row; each row keeps about k."""
    if len(rows) == 0:
        return rows, others, products
    order = np.lexsort((others, -products, rows))
    rows, others, products = rows[order], others[order], products[order]
    first = np.searchsorted(rows, np.arange(count))
    found = np.bincount(rows, minlength=count)
    kth = products[np.maximum(first + np.minimum(found, k) - 1, 0)]
    keep = products >= kth[rows] - MARGIN
    return rows[keep], others[keep], products[keep]


def pair_similarities(vectors: np.ndarray) -> np.ndarray:
    """The full similarity matrix of a small set (a sample), in float32, each pair's
    own (``exact``)."""
    vectors = _check(vectors)
    n = len(vectors)
    i, j = np.triu_indices(n)
    out = np.zeros((n, n), np.float32)
    out[i, j] = exact(vectors, i.astype(np.int64), j.astype(np.int64))
    out[j, i] = out[i, j]
    return out


def top_k(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` most similar rows of ``vectors`` per query: (similarities, indices),
    best first, ties by index.

    Missing places (fewer than k vectors) hold index -1.
    """
    return FlatSearch(vectors).top_k(queries, k)


FEW_QUERIES = 8  # searched in the calling thread alone (FlatSearch.top_k)


class FlatSearch:
    """``top_k`` over a fixed set of vectors whose index is built once: a server that
    answers many queries on one profile's vectors copies them into FAISS once, not per
    query. Searching it from several threads at once is safe (FAISS's flat search only
    reads the index)."""

    def __init__(self, vectors: np.ndarray) -> None:
        self.vectors = _check(vectors)
        self.index = _index(self.vectors) if len(self.vectors) else None

    @property
    def nbytes(self) -> int:
        return 2 * self.vectors.nbytes  # the matrix, and FAISS's copy of it

    def top_k(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        vectors, queries = self.vectors, _check(queries)
        if self.index is None or k <= 0:
            shape = (len(queries), max(k, 0))
            return np.full(shape, -np.inf, np.float32), np.full(shape, -1, np.int64)
        if len(queries) > FEW_QUERIES:
            return _ranked(self.index, vectors, queries, k)
        # A few queries gain nothing from OpenMP's threads, and waking them on busy
        # cores cost 18 ms per search of 10k vectors against 1.2 ms in the calling
        # thread. The setting is the calling thread's own (OpenMP keeps it per thread),
        # and is given back.
        before = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            return _ranked(self.index, vectors, queries, k)
        finally:
            faiss.omp_set_num_threads(before)


def _ranked(
    index: faiss.Index, vectors: np.ndarray, queries: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    # Two more than asked, ranked again by their exact similarities: what decides a
    # place at the cut is the pair's own similarity, not the block it was found in.
    want = min(k + 2, len(vectors))
    _, idx = index.search(queries, want)
    idx = idx.astype(np.int64)
    rows = np.repeat(np.arange(len(queries), dtype=np.int64), want)
    sims = exact(vectors, rows, np.maximum(idx, 0).ravel(), queries).reshape(idx.shape)
    sims = np.where(idx >= 0, sims, np.float32(-np.inf)).astype(np.float32)
    order = np.lexsort((np.where(idx >= 0, idx, len(vectors)), -sims), axis=1)[:, :k]
    keep = min(k, len(vectors))
    return (np.take_along_axis(sims, order, axis=1)[:, :keep],
            np.take_along_axis(idx, order, axis=1)[:, :keep])
