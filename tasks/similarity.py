"""Every comparison of memories goes through here, on FAISS.

Vectors are unit length, so inner product is cosine similarity. Thresholds are
inclusive and compared in float32 (the precision FAISS computes in): a pair whose
similarity is exactly the threshold counts. FAISS's own range search is strict
(``> radius``), so the radius is widened by one float32 step and the result
filtered with ``>=``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import faiss
import numpy as np

# Query rows per range search: bounds the memory FAISS allocates for results.
QUERY_CHUNK = 4096


@dataclass(frozen=True, slots=True)
class Neighbours:
    """For each query row: neighbour indices and similarities, best first (ties by index)."""

    indices: list[np.ndarray]
    similarities: list[np.ndarray]


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
    index = _index(vectors)
    bound = np.float32(threshold)
    radius = float(np.nextafter(bound, np.float32(-np.inf)))
    for start in range(0, len(queries), QUERY_CHUNK):
        block = queries[start : start + QUERY_CHUNK]
        lims, sims, idx = index.range_search(block, radius)
        counts = np.diff(lims).astype(np.int64)
        rows = np.repeat(np.arange(start, start + len(block), dtype=np.int64), counts)
        keep = sims >= bound
        yield rows[keep], idx[keep].astype(np.int64), sims[keep]


def radius_neighbours(
    vectors: np.ndarray, threshold: float, queries: np.ndarray | None = None
) -> Neighbours:
    """All rows of ``vectors`` with similarity >= ``threshold`` to each query row.

    Without ``queries`` every row is a query and a row is not its own neighbour.
    """
    vectors = _check(vectors)
    self_search = queries is None
    queries = vectors if queries is None else _check(queries)
    if len(vectors) == 0:
        empty_i, empty_s = np.zeros(0, np.int64), np.zeros(0, np.float32)
        return Neighbours([empty_i] * len(queries), [empty_s] * len(queries))
    out_idx: list[np.ndarray] = []
    out_sim: list[np.ndarray] = []
    done = 0
    for rows, idx, sims in _hits(vectors, queries, threshold):
        if self_search:
            keep = idx != rows
            rows, idx, sims = rows[keep], idx[keep], sims[keep]
        order = np.lexsort((idx, -sims, rows))
        rows, idx, sims = rows[order], idx[order], sims[order]
        last = min(done + QUERY_CHUNK, len(queries))
        bounds = np.searchsorted(rows, np.arange(done, last + 1))
        out_idx += np.split(idx, bounds[1:-1])
        out_sim += np.split(sims, bounds[1:-1])
        done = last
    return Neighbours(out_idx, out_sim)


def similarity_pairs(
    vectors: np.ndarray, threshold: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every unordered pair of rows (i < j) with similarity >= ``threshold``, as arrays
    (i, j, similarity) sorted by (i, j). Vectorised: no Python loop over pairs."""
    vectors = _check(vectors)
    parts_i, parts_j, parts_s = [], [], []
    if len(vectors):
        for rows, idx, sims in _hits(vectors, vectors, threshold):
            upper = idx > rows
            parts_i.append(rows[upper])
            parts_j.append(idx[upper])
            parts_s.append(sims[upper])
    if not parts_i:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    i, j, s = np.concatenate(parts_i), np.concatenate(parts_j), np.concatenate(parts_s)
    order = np.lexsort((j, i))
    return i[order], j[order], s[order]


def pair_similarities(vectors: np.ndarray) -> np.ndarray:
    """The full similarity matrix of a small set (a sample), in float32."""
    vectors = _check(vectors)
    return vectors @ vectors.T


def top_k(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` most similar rows of ``vectors`` per query: (similarities, indices).

    Missing places (fewer than k vectors) hold index -1.
    """
    vectors, queries = _check(vectors), _check(queries)
    if len(vectors) == 0 or k <= 0:
        shape = (len(queries), max(k, 0))
        return np.full(shape, -np.inf, np.float32), np.full(shape, -1, np.int64)
    sims, idx = _index(vectors).search(queries, min(k, len(vectors)))
    return sims, idx
