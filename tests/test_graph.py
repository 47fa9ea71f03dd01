import numpy as np
import pytest

from reverie.engines.graph import (
    build_graph,
    canonical_labels,
    communities,
    components,
    importance,
    seeded,
    similarity_graph,
)


def test_same_graph_same_scores_whatever_the_input_order() -> None:
    nodes = [f"m{i}" for i in range(12)]
    edges = [(f"m{i}", f"m{(i + 1) % 6}", 0.5 + i / 20) for i in range(6)]
    edges += [(f"m{6 + i}", f"m{6 + (i + 1) % 6}", 0.9) for i in range(6)]
    edges += [("m0", "m6", 0.05)]
    first = importance(nodes, edges)
    assert importance(list(reversed(nodes)), list(reversed(edges))) == first
    assert len({s.community for s in first}) == 2
    assert sum(s.pagerank for s in first) == pytest.approx(1.0)


def test_communities_are_numbered_by_their_first_member() -> None:
    assert canonical_labels([5, 5, 2, 9, 2]) == [0, 0, 1, 2, 1]


def test_heavier_edges_raise_pagerank() -> None:
    scores = {s.memory_id: s.pagerank for s in importance(
        ["a", "b", "c"], [("a", "b", 1.0), ("a", "c", 0.1)])}
    assert scores["b"] > scores["c"]


def test_parallel_edges_are_summed_and_unknown_nodes_ignored() -> None:
    graph = build_graph(["a", "b"], [("a", "b", 0.3), ("b", "a", 0.2), ("a", "zz", 1.0)])
    assert graph.ecount() == 1 and graph.es[0]["weight"] == pytest.approx(0.5)


def test_isolated_and_empty_graphs() -> None:
    assert importance([], []) == []
    scores = importance(["a", "b"], [])
    assert [s.community for s in scores] == [0, 1]


def test_components_of_a_similarity_graph() -> None:
    graph = similarity_graph(5, np.array([0, 3]), np.array([1, 4]), np.array([0.9, 0.8]))
    assert components(graph) == [0, 0, 1, 2, 2]
    assert graph.es["weight"] == pytest.approx([0.9, 0.8])


def test_leiden_one_iteration_at_a_time_ends_where_igraphs_own_loop_does() -> None:
    # communities() iterates Leiden itself, with a cap, instead of igraph's
    # n_iterations=-1 (which can oscillate for ever). Where igraph's loop ends, the
    # partition is nearly always the same; a rare one differs (3 in 1,920 random graphs
    # here), another local optimum within a few percent of igraph's modularity. The
    # graphs are drawn from seeded generators: the test sees the same 120 whatever ran
    # before it (drawn from the process's generator, they once gave CI a graph that
    # differs and an assertion of equality failed there alone).
    import random as stdlib_random

    import igraph as ig

    rng = stdlib_random.Random(7)
    same = 0
    trials = 120
    for trial in range(trials):
        with seeded(10_000 + trial):
            graph = ig.Graph.Erdos_Renyi(n=rng.randint(2, 120), p=rng.uniform(0.02, 0.3))
        graph.es["weight"] = [rng.random() for _ in range(graph.ecount())]
        weights = "weight" if graph.ecount() else None
        with seeded(trial):
            expected = canonical_labels(graph.community_leiden(
                objective_function="modularity", weights=weights, n_iterations=-1).membership)
        found = communities(graph, seed=trial)
        same += found == expected
        if graph.ecount():
            quality = graph.modularity(found, weights=weights)
            best = graph.modularity(expected, weights=weights)
            assert quality >= best - 0.05 * abs(best), trial
    assert same >= trials - 3
