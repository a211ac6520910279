"""The node topology of the EP schema and the reference model's inter-node pieces (issue 13's groundwork):
the rail-aligned proxy mapping, the tokens that cross nodes, the hierarchical combine
(docs/ep-protocols.md §15). CPU only, NumPy only."""

from __future__ import annotations

import numpy as np
import pytest

from mori_compiler.ep_schema import EpTopology, topology_problems
from mori_compiler.ops import reference as ref
from mori_compiler.ops.reference import EpShape

TOPOLOGIES = [(4, 2), (8, 4), (8, 2), (16, 8)]  # the (W, G) pairs issue 13 tests


@pytest.mark.parametrize("W, G", TOPOLOGIES)
def test_the_proxy_is_the_same_local_rank_on_the_remote_node(W, G):
    topo = EpTopology(W, G)
    assert topo.nodes == W // G
    assert sorted(pe for n in range(topo.nodes) for pe in topo.node_pes(n)) == list(range(W))  # nodes partition
    for r in range(W):
        assert topo.proxy(r, topo.node_of(r)) == r  # on its own node a PE is its own proxy
        for n in range(topo.nodes):
            proxy = topo.proxy(r, n)
            assert topo.node_of(proxy) == n and topo.local_rank(proxy) == topo.local_rank(r)
    # every PE of a node proxies for exactly one PE of each other node (the rails)
    for n in range(topo.nodes):
        for m in range(topo.nodes):
            assert sorted(topo.proxy(r, n) for r in topo.node_pes(m)) == list(topo.node_pes(n))


@pytest.mark.parametrize("W, G, problem", [
    (8, 3, "must be a power of two"), (8, 16, "must divide world_size 8"), (12, 8, "must divide world_size 12"),
    (8, 0, "positive integer"), (8, True, "positive integer"),
])  # fmt: skip
def test_invalid_topologies_are_named(W, G, problem):
    problems = topology_problems(W, G)
    assert any(problem in p for p in problems), problems
    with pytest.raises(ValueError, match="gpu_per_node"):
        ref.remote_nodes(np.zeros((1, 1), np.int64), EpShape(W, 1, 1, 1), EpTopology(W, G), 0)


@pytest.mark.parametrize("W, G", TOPOLOGIES)
def test_valid_topologies_have_no_problem(W, G):
    assert topology_problems(W, G) == []


def test_remote_nodes_and_the_predicted_sends_of_a_hand_made_routing():
    shape, topo = EpShape(4, 1, 2, 4), EpTopology(4, 2)  # experts e on PE e; nodes {0, 1} and {2, 3}
    idx0 = np.array([[1, 2], [0, 1], [3, 2], [-1, -1]])  # rank 0: node 1 once (dedup by node), none, node 1, none
    idx3 = np.array([[0, 1], [2, 3]])  # rank 3 (node 1): node 0, none
    empty = np.zeros((0, 2), np.int64)
    assert ref.remote_nodes(idx0, shape, topo, 0) == [(1,), (), (1,), ()]
    assert ref.remote_nodes(idx3, shape, topo, 3) == [(0,), ()]
    all_idx = [idx0, empty, empty, idx3]
    assert ref.predicted_internode_sends(all_idx, shape, topo, "V1").tolist() == [2, 0, 0, 1]
    assert ref.predicted_internode_sends(all_idx, shape, topo, "V1LL").tolist() == [4, 0, 0, 2]  # every token
    with pytest.raises(ValueError, match="'V1' or 'V1LL'"):
        ref.predicted_internode_sends(all_idx, shape, topo, "V0")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_v1_sends_each_token_once_per_remote_node(seed):
    shape, topo = EpShape(8, 4, 6, 40), EpTopology(8, 2)
    counts = ref.make_token_counts(shape, seed)
    all_idx = ref.make_routing("random", counts, shape, seed)
    v1 = ref.predicted_internode_sends(all_idx, shape, topo, "V1")
    for r, idx in enumerate(all_idx):
        nodes = {n for n in range(topo.nodes) if n != topo.node_of(r)}
        want = sum(len({p // 4 // 2 for p in row if p >= 0} & nodes) for row in idx.tolist())
        assert v1[r] == want
    assert (v1 <= ref.predicted_internode_sends(all_idx, shape, topo, "V1LL")).all()


def test_one_node_makes_the_hierarchical_combine_the_flat_one():
    shape = EpShape(4, 2, 3, 16)
    rng = np.random.default_rng(5)
    all_idx = ref.make_routing("random", [16, 9, 1, 0], shape, 5)
    xs = [rng.integers(-8, 8, size=(idx.shape[0], 64)).astype(np.float32) for idx in all_idx]  # exact sums
    flat = ref.reference_combine(xs, all_idx, shape)
    hier = ref.hierarchical_combine(xs, all_idx, shape, EpTopology(4, 4), "bf16")
    for f, h in zip(flat, hier):
        np.testing.assert_array_equal(h, ref.quantize(f, "bf16"))


@pytest.mark.parametrize("W, G", TOPOLOGIES)
def test_the_hierarchical_combine_rounds_each_node_partial(W, G):
    shape, topo = EpShape(W, 2, 4, 12), EpTopology(W, G)
    all_idx = ref.make_routing("random", [12] * W, shape, W + G)
    xs = [ref.quantize(np.random.default_rng(r).standard_normal((12, 32)).astype(np.float32), "bf16")
          for r in range(W)]  # fmt: skip
    hier = ref.hierarchical_combine(xs, all_idx, shape, topo, "bf16")
    atol, rtol = ref.combine_tolerance("bf16")
    for r in range(W):
        dest = ref.destinations(all_idx[r], shape)
        per_node = np.stack([dest[:, list(topo.node_pes(n))].sum(axis=1) for n in range(topo.nodes)], axis=1)
        want = np.zeros_like(xs[r])
        for n in range(topo.nodes):  # identity expert: node n's partial is c_n * x, stored in bf16
            want += ref.quantize(per_node[:, n:n + 1] * xs[r], "bf16")
        np.testing.assert_array_equal(hier[r], ref.quantize(want, "bf16"))
        u = dest.sum(axis=1, keepdims=True)
        np.testing.assert_allclose(hier[r], u * xs[r], atol=2 * atol, rtol=2 * rtol)  # within the double rounding


def test_the_double_rounding_is_visible():
    # Two nodes of 8, a token on 3 PEs of node 0 and 5 of node 1: round(round(3x) + round(5x)) differs from
    # the flat round(8x) for some bf16 x (the numerical difference MORI's hierarchical combine has).
    shape, topo = EpShape(16, 1, 8, 1), EpTopology(16, 8)
    idx = np.array([[0, 1, 2, 8, 9, 10, 11, 12]])
    others = [np.zeros((0, 8), np.int64)] * 15
    differs = 0
    for v in ref.representable_values("bf16")[::37]:
        if not np.isfinite(v) or abs(v) > 1e30:
            continue
        x = np.full((1, 4), v, np.float32)
        hier = ref.hierarchical_combine([x] + [np.zeros((0, 4), np.float32)] * 15, [idx] + others, shape, topo,
                                        "bf16")[0]  # fmt: skip
        assert abs(hier[0, 0] - 8 * v) <= 2 ** -7 * abs(8 * v)  # within two bf16 roundings
        differs += int(hier[0, 0] != ref.quantize(8 * x, "bf16")[0, 0])
    assert differs > 0
