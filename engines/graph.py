"""Graph analysis of the memory graph, on igraph.

Results must be reproducible: the same graph gives the same PageRank and the same
communities on every run. Vertices and edges are therefore fed in sorted order,
the community search runs with a seeded random generator, and community labels are
renumbered canonically (by the first vertex, in id order, that belongs to each).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import igraph as ig
import numpy as np

from reverie.models.records import GraphScore

# igraph's random generator is process-global; seeding it must not interleave.
_rng_lock = threading.Lock()


def build_graph(node_ids: Sequence[str], edges: Sequence[tuple[str, str, float]]) -> ig.Graph:
    """An undirected weighted graph over ``node_ids``; parallel edges are summed and
    edges touching unknown nodes are ignored."""
    position = {node: i for i, node in enumerate(node_ids)}
    combined: dict[tuple[int, int], float] = {}
    # Summed in a fixed order: the store returns edges in no set order, and floating-point
    # addition in another order can move PageRank in its last digits.
    for source, target, weight in sorted(edges):
        a, b = position.get(source), position.get(target)
        if a is None or b is None or a == b:
            continue
        key = (a, b) if a < b else (b, a)
        combined[key] = combined.get(key, 0.0) + float(weight)
    pairs = sorted(combined)
    graph = ig.Graph(n=len(node_ids), edges=pairs, directed=False)
    graph.es["weight"] = [combined[p] for p in pairs]
    return graph


def canonical_labels(membership: Sequence[int]) -> list[int]:
    """Renumber communities 0, 1, ... in order of their first member."""
    relabel: dict[int, int] = {}
    return [relabel.setdefault(label, len(relabel)) for label in membership]


def importance(
    node_ids: Sequence[str],
    edges: Sequence[tuple[str, str, float]],
    damping: float = 0.85,
    seed: int = 0,
) -> list[GraphScore]:
    """Weighted PageRank and Leiden (modularity) communities for every node."""
    nodes = sorted(node_ids)
    if not nodes:
        return []
    graph = build_graph(nodes, edges)
    weights = "weight" if graph.ecount() else None
    ranks = graph.pagerank(weights=weights, damping=damping)
    labels = communities(graph, seed)
    return [
        GraphScore(node, round(float(rank), 12), label)
        for node, rank, label in zip(nodes, ranks, labels, strict=True)
    ]


# Leiden iterations before communities are taken as they stand; stable partitions take
# a handful.
LEIDEN_MAX_ITERATIONS = 100


def communities(graph: ig.Graph, seed: int = 0) -> list[int]:
    """Leiden (modularity) community of each vertex, reproducible for a given seed."""
    weights = "weight" if graph.ecount() and "weight" in graph.es.attributes() else None
    with seeded(seed):
        # igraph's n_iterations=-1 iterates until an iteration moves no vertex, with no
        # cap: a property test's store once kept it busy for 20 minutes. The same
        # iterations one at a time, capped, nearly always end on igraph's partition; a
        # rare one is another local optimum, within a few percent of its modularity
        # (tests/test_graph.py holds both).
        labels = canonical_labels(graph.community_leiden(
            objective_function="modularity", weights=weights, n_iterations=1
        ).membership)
        for _ in range(LEIDEN_MAX_ITERATIONS - 1):
            moved = canonical_labels(graph.community_leiden(
                objective_function="modularity", weights=weights, n_iterations=1,
                initial_membership=labels,
            ).membership)
            if moved == labels:
                break
            labels = moved
    return labels


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """igraph's random numbers drawn from ``seed`` for the block. The generator is one
    per process: the block holds it, so two threads drawing at once cannot take each
    other's numbers (and a result would then depend on timing)."""
    with _rng_lock:
        ig.set_random_number_generator(random.Random(seed))
        try:
            yield
        finally:
            ig.set_random_number_generator(random)


def similarity_graph(n: int, i: np.ndarray, j: np.ndarray, sims: np.ndarray) -> ig.Graph:
    """An undirected graph of ``n`` vertices with an edge (weight = similarity) per pair."""
    graph = ig.Graph(n=n, edges=np.column_stack([i, j]).tolist(), directed=False)
    graph.es["weight"] = sims.astype(float).tolist()
    return graph


def components(graph: ig.Graph) -> list[int]:
    """Connected-component label of each vertex (canonically numbered)."""
    return canonical_labels(graph.connected_components().membership)
