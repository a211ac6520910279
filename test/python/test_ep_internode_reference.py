"""The node topology of the EP schema and the reference model's inter-node pieces (issue 13's groundwork):
the rail-aligned proxy mapping, the tokens that cross nodes, the hierarchical combine
(docs/ep-protocols.md §15). CPU only, NumPy only."""

from __future__ import annotations

import numpy as np
import pytest

from mori_compiler.ep_schema import TRAFFIC_COUNTERS, EpTopology, KernelType, topology_problems
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
    # V0: one record per remote PE: rank 0 token 0 -> PE 2, token 2 -> PEs 3, 2; rank 3 token 0 -> PEs 0, 1
    assert ref.predicted_internode_sends(all_idx, shape, topo, "V0").tolist() == [3, 0, 0, 2]
    for bad in ("V2", KernelType.IntraNode):
        with pytest.raises(ValueError, match="inter-node|'V0', 'V1' or 'V1LL'"):
            ref.predicted_internode_sends(all_idx, shape, topo, bad)


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


# ---- traffic counters ------------------------------------------------------------------------------------

# W = 4, G = 2 (nodes {0, 1} and {2, 3}), expert e on PE e, K = 2; PE 0 and PE 3 send, PEs 1 and 2 do not.
HAND_SHAPE, HAND_TOPO = EpShape(4, 1, 2, 4), EpTopology(4, 2)
HAND_IDX = [np.array([[1, 2], [2, 3], [-1, -1], [0, -1]]),  # P = {1, 2}, {2, 3}, {}, {0}
            np.zeros((0, 2), np.int64), np.zeros((0, 2), np.int64),
            np.array([[0, 1]])]  # P = {0, 1}  # fmt: skip


def test_the_records_and_row_writers_of_a_hand_made_routing():
    records = {kind: ref.internode_records(HAND_IDX, HAND_SHAPE, HAND_TOPO, kind) for kind in ("V0", "V1", "V1LL")}
    nonzero = {kind: {(int(r), int(q)): int(m[r, q]) for r, q in zip(*np.nonzero(m))} for kind, m in records.items()}
    # V1: rank 0's tokens 0 and 1 cross to node 1 through its proxy PE 2; rank 3's token 0 to node 0 via PE 1.
    assert nonzero["V1"] == {(0, 2): 2, (3, 1): 1}
    assert nonzero["V1LL"] == {(0, 2): 4, (3, 1): 1}  # all 4 tokens of rank 0, the empty one included
    assert nonzero["V0"] == {(0, 2): 2, (0, 3): 1, (3, 0): 1, (3, 1): 1}  # straight to each remote PE
    # Rows: rank 0 writes its node's rows (t0 -> 1, t3 -> 0), the proxy PE 2 writes node 1's rows of rank 0
    # (t0 -> 2, t1 -> 2, t1 -> 3), the proxy PE 1 node 0's rows of rank 3 (t0 -> 0, t0 -> 1).
    assert ref.row_writers(HAND_IDX, HAND_SHAPE, HAND_TOPO, "V1").tolist() == [2, 2, 3, 0]
    assert ref.row_writers(HAND_IDX, HAND_SHAPE, HAND_TOPO, KernelType.InterNodeV1LL).tolist() == [2, 2, 3, 0]
    # V0: each destination writes the rows of remote sources itself: PE 0 gets rank 3's t0 too.
    assert ref.row_writers(HAND_IDX, HAND_SHAPE, HAND_TOPO, KernelType.InterNode).tolist() == [3, 1, 2, 1]


def test_the_traffic_of_a_hand_made_routing():
    # H = 16, K = 2, scales 2 x 4 bytes. bf16 record: round16(16*2 + round16(8) + 8*2 + 4 = 68) = 80 bytes; a row
    # written: 60 bytes; bf16 partial: round16(16*2 + 4*2 = 40) = 48 bytes; a row read (with weights): 40.
    got = ref.predicted_traffic(HAND_IDX, HAND_SHAPE, HAND_TOPO, "V1", hidden=16, dispatch_dtype="bf16",
                                combine_dtype="bf16", scale_bytes=8)  # fmt: skip
    assert [tuple(d[c] for c in TRAFFIC_COUNTERS) for d in got] == [
        (2 * 80, 2 * 60, 0, 2 * 40),  # PE 0 sends 2 records, writes and reads 2 rows
        (0, 2 * 60, 1 * 48, 2 * 40),  # PE 1 received 1 record (from 3), writes and reads 2 rows
        (0, 3 * 60, 2 * 48, 3 * 40),  # PE 2 received 2 records, writes and reads 3 rows
        (1 * 80, 0, 0, 0),  # PE 3 sends 1 record
    ]  # fmt: skip
    # fp8 dispatch, no scales passed (the record keeps the config's 8 scale bytes), no combine weights:
    # record round16(16 + round16(8) + 16 + 4 = 52) = 64, row written 16 + 16 + 4 = 36, row read 32.
    got = ref.predicted_traffic(HAND_IDX, HAND_SHAPE, HAND_TOPO, "V0", hidden=16, dispatch_dtype="float8_e4m3fn",
                                combine_dtype="bf16", scale_bytes=8, scales_given=False, has_w=False)  # fmt: skip
    assert [tuple(d[c] for c in TRAFFIC_COUNTERS) for d in got] == [
        (3 * 64, 3 * 36, 1 * 48, 3 * 32), (0, 1 * 36, 1 * 48, 1 * 32), (0, 2 * 36, 2 * 48, 2 * 32),
        (2 * 64, 1 * 36, 1 * 48, 1 * 32),
    ]  # fmt: skip


@pytest.mark.parametrize("W, G", TOPOLOGIES)
@pytest.mark.parametrize("mode", ["random", "sentinel", "spread_pes", "all_to_one"])
def test_traffic_properties(W, G, mode):
    shape, topo = EpShape(W, 8, min(W, 8), 24), EpTopology(W, G)
    counts = [[0, 1, 24][p % 3] for p in range(W)]
    all_idx = ref.make_routing(mode, counts, shape, W * G)
    kw = dict(hidden=64, dispatch_dtype="bf16", scale_bytes=16)
    traffic = {k: np.array([[d[c] for c in TRAFFIC_COUNTERS] for d in
                            ref.predicted_traffic(all_idx, shape, topo, k, **kw)]) for k in ("V0", "V1", "V1LL")}
    records = {k: ref.internode_records(all_idx, shape, topo, k) for k in ("V0", "V1", "V1LL")}
    assert (records["V1"] <= records["V1LL"]).all()
    assert (records["V1"].sum(axis=1) <= records["V0"].sum(axis=1)).all()  # a node's PEs share one V1 record
    record = -(-(64 * 2 + 8 * shape.K + 16 + 4) // 16) * 16
    partial = -(-(64 * 2 + 4 * shape.K) // 16) * 16
    rows = int(ref.expected_recv_counts(all_idx, shape).sum())
    for k, t in traffic.items():
        assert t[:, 1].sum() == rows * (64 * 2 + 8 * shape.K + 4 + 16)  # every row written once, on its node
        assert t[:, 3].sum() == rows * (64 * 2 + 4 * shape.K)  # and read back once
        assert (t[:, 0] == records[k].sum(axis=1) * record).all()
        assert (t[:, 2] == records[k].sum(axis=0) * partial).all()  # a partial back for every record
    assert (traffic["V1LL"][:, 0] == np.array(counts) * (topo.nodes - 1) * record).all()


def test_one_node_has_no_rdma_traffic():
    shape = EpShape(8, 4, 6, 16)
    all_idx = ref.make_routing("random", [16, 3, 0, 1, 16, 9, 2, 5], shape, 3)
    recv_by_source = [int(ref.destinations(idx, shape).sum()) for idx in all_idx]
    for kind in ("V0", "V1", "V1LL"):
        got = ref.predicted_traffic(all_idx, shape, EpTopology(8, 8), kind, hidden=32, dispatch_dtype="bf16")
        assert all(d["dispatch_rdma"] == d["combine_rdma"] == 0 for d in got)
        # on one node every source writes and gathers its own rows
        assert [d["dispatch_xgmi"] for d in got] == [n * (64 + 48 + 4) for n in recv_by_source]
        assert [d["combine_xgmi"] for d in got] == [n * (64 + 24) for n in recv_by_source]


def test_sentinel_slots_are_dropped():
    shape, topo = EpShape(4, 1, 2, 4), EpTopology(4, 2)
    with_sentinels = [np.array([[2, -1], [-1, -1], [-1, 3]]), *[np.zeros((0, 2), np.int64)] * 3]
    without = [np.array([[2, 2], [-7, -7], [3, 3]]), *with_sentinels[1:]]  # same PEs; -7 is a sentinel too
    for kind in ("V0", "V1", "V1LL"):
        a = ref.internode_records(with_sentinels, shape, topo, kind)
        assert (a == ref.internode_records(without, shape, topo, kind)).all()
    assert ref.internode_records(with_sentinels, shape, topo, "V1")[0].tolist() == [0, 0, 2, 0]  # not PE 0's
    assert ref.internode_records(with_sentinels, shape, topo, "V0")[0].tolist() == [0, 0, 1, 1]
    assert ref.internode_records(with_sentinels, shape, topo, "V1LL")[0].tolist() == [0, 0, 3, 0]  # every token
    assert ref.row_writers(with_sentinels, shape, topo, "V1").tolist() == [0, 0, 2, 0]  # no row on PE 0


def test_spread_pes_reaches_k_distinct_pes():
    shape = EpShape(16, 4, 8, 32)
    all_idx = ref.make_routing("spread_pes", [32] * 16, shape, 9)
    for idx in all_idx:
        assert (ref.unique_dest_count(idx, shape) == 8).all()
        assert ((idx >= 0) & (idx < 64)).all()
    with pytest.raises(ValueError, match="K <= W"):
        ref.make_routing("spread_pes", [1] * 4, EpShape(4, 4, 5, 4), 0)


# ---- the hierarchical combine's tolerance ---------------------------------------------------------------


@pytest.mark.parametrize("W, G", TOPOLOGIES)
def test_the_hierarchical_bound_holds_and_is_needed(W, G):
    shape, topo = EpShape(W, 2, min(W, 8), 64), EpTopology(W, G)
    all_idx = ref.make_routing("random", [64] * W, shape, W + G)
    xs = [ref.make_tokens(64, 256, "bf16", r) for r in range(W)]
    hier = ref.hierarchical_combine(xs, all_idx, shape, topo, "bf16")
    atol, rtol = ref.hierarchical_bound("bf16", W)
    worst = 0.0
    for r in range(W):
        ref.check_hierarchical_combine(hier[r], xs[r], all_idx[r], shape, "bf16", rank=r)
        ux = ref.unique_dest_count(all_idx[r], shape)[:, None] * xs[r].astype(np.float64)
        worst = max(worst, float((np.abs(hier[r] - ux) / np.maximum(np.abs(ux), 1e-30)).max()))
    assert worst <= rtol
    if topo.nodes > 1 and G >= 4:  # two roundings exceed the flat combine's single-rounding bound u = 2^-8
        assert worst > 2.0**-8  # (with G = 2 a partial c_n x, c_n <= 2, is exact: one rounding only)


def test_check_hierarchical_combine_catches_errors():
    shape = EpShape(4, 1, 2, 2)
    idx = np.array([[0, 2], [1, -1]])
    x = np.array([[1.0, -3.0], [0.5, 2.0]], np.float32)
    good = np.array([[2.0, -6.0], [0.5, 2.0]], np.float32)
    ref.check_hierarchical_combine(good, x, idx, shape, "bf16")
    _, rtol = ref.hierarchical_bound("bf16", 4)
    bad = good.copy()
    bad[0, 1] *= 1 + 2 * rtol
    with pytest.raises(AssertionError, match="token 0, element 1"):
        ref.check_hierarchical_combine(bad, x, idx, shape, "bf16", rank=3)
    nan = good.copy()
    nan[1, 0] = np.nan
    with pytest.raises(AssertionError, match="token 1"):
        ref.check_hierarchical_combine(nan, x, idx, shape, "bf16")
    # with a receive cap, the copies actually received: token 0 reached only one PE
    ref.check_hierarchical_combine(np.array([[1.0, -3.0], [0.5, 2.0]]), x, idx, shape, "bf16", copies=[1, 1])
    with pytest.raises(ValueError, match="partials"):
        ref.hierarchical_bound("bf16", 0)


def test_a_capped_dispatch_is_checked_on_the_rows_it_received():
    shape = EpShape(2, 1, 2, 3)
    all_idx = [np.array([[0, 1], [1, -1], [0, -1]]), np.array([[1, 0]])]
    xs = [np.arange(6, dtype=np.int16).reshape(3, 2), np.array([[7, 8]], np.int16)]
    expected = ref.expected_recv_rows(xs, None, None, all_idx, shape)[1]  # rank 1: (0, 0), (0, 1), (1, 0)
    pos = np.array([shape.encode_src(1, 0), shape.encode_src(0, 1)])  # (0, 0) was dropped
    rows = np.array([[7, 8], [2, 3]], np.int16)
    idx_rows = np.array([[1, 0], [1, -1]])
    ref.check_dispatch(1, rows, None, None, idx_rows, pos, 2, expected, shape, complete=False)
    with pytest.raises(AssertionError, match="expected 3 rows"):
        ref.check_dispatch(1, rows, None, None, idx_rows, pos, 2, expected, shape)
    wrong = rows.copy()
    wrong[1, 0] = 9
    with pytest.raises(AssertionError, match="src rank 0, src token 1"):
        ref.check_dispatch(1, wrong, None, None, idx_rows, pos, 2, expected, shape, complete=False)


# ---- the GPU oracle's host side (test/python/gpu/test_ep_internode_gpu.py), on the reference model ----------


def _gpu_tests():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "gpu"))
    import test_ep_internode_gpu

    return test_ep_internode_gpu


def test_the_gpu_configs_fit_their_heaps_and_rules():
    from mori_compiler.ep_schema import EpSizes, buffers_for

    gpu = _gpu_tests()
    configs = list(gpu.all_configs())
    assert len({repr(c) for c in configs}) == len(configs) == len(gpu.KINDS) * (3 * len(gpu.TOPOLOGIES) + 2)
    for c in configs:
        assert topology_problems(c.world_size, c.gpu_per_node) == []
        assert c.block_num % c.world_size == 0 and c.block_num >= 2 and 0 < c.rdma_block_num < c.block_num
        need = sum(size for _, size in buffers_for(KernelType(c.kernel_type), EpSizes.from_config(c)))
        assert need < gpu.heap_size(c.world_size, c.gpu_per_node)
    assert sum(W * gpu.heap_size(W, G) for W, G in gpu.TOPOLOGIES) < 16 << 30  # far below the H200's 139 GiB


@pytest.mark.parametrize("n, case", list(enumerate(_gpu_tests().CASES)), ids=lambda v: str(v) if isinstance(v, int)
                         else "-".join(str(x) for x in v[:4]))  # fmt: skip
def test_the_gpu_rounds_pass_on_the_reference_model(n, case):
    """Each GPU oracle case, with the reference model standing in for the kernels (rows in a shuffled arrival
    order, the hierarchical combine): the oracle accepts it, and the predicted traffic is consistent."""
    gpu = _gpu_tests()
    config, routing, counts, dtype, weights, scales = case
    kind = gpu.KINDS[n % 3]
    W, G = gpu.TOPOLOGIES[n % len(gpu.TOPOLOGIES)]
    cfg = gpu.CONFIGS[config](kind, W, G)
    shape, topo = gpu._shape(cfg), gpu._topology(cfg)
    inputs = gpu.Inputs(cfg, shape, routing=routing, counts=counts, dtype=dtype, seed=n, weights=weights,
                        scales=scales)  # fmt: skip
    expected = inputs.expected_rows()
    rng = np.random.default_rng(n)
    for p in range(W):
        keys = list(expected[p])
        keys = [keys[i] for i in rng.permutation(len(keys))]
        rows = [expected[p][key] for key in keys]
        stack = (lambda get, width, dt: np.stack([get(r) for r in rows]) if rows else np.zeros((0, width), dt))
        ref.check_dispatch(p, stack(lambda r: r.x, cfg.hidden_dim, np.uint16),
                           stack(lambda r: r.w, shape.K, np.float32) if weights else None,
                           stack(lambda r: r.s, cfg.scale_dim * 4, np.uint8) if scales else None,
                           stack(lambda r: r.idx, shape.K, np.int32),
                           np.array([shape.encode_src(*key) for key in keys], np.int64), len(keys), expected[p],
                           shape)  # fmt: skip
    combined = ref.hierarchical_combine(inputs.x, inputs.idx, shape, topo, "bf16")
    for p in range(W):
        ref.check_hierarchical_combine(combined[p], inputs.x[p], inputs.idx[p], shape, "bf16", rank=p)
    traffic = inputs.predicted_traffic(has_w=weights)
    rows = int(ref.expected_recv_counts(inputs.idx, shape).sum())
    sb = cfg.scale_dim * 4  # the record layout's, passed or not
    elem = 1 if dtype.startswith("fp8") else 2
    assert sum(d["dispatch_xgmi"] for d in traffic) == rows * (cfg.hidden_dim * elem + 8 * shape.K + 4 + sb)
    assert sum(d["combine_xgmi"] for d in traffic) == rows * (cfg.hidden_dim * 2 + 4 * shape.K * weights)


# ---- bench/ep_internode_bench.py's host side ---------------------------------------------------------------


def _bench():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
    import ep_internode_bench

    return ep_internode_bench


def test_the_bench_counts_rdma_tokens_as_mori_does():
    bench = _bench()
    shape = EpShape(8, 1, 2, 4)
    idx = [np.array([[0, 1], [0, 4], [-1, -1]]), *[np.zeros((0, 2), np.int64)] * 7]
    # G = 4: token 0 on node 0 only (its own, counted), token 1 on nodes 0 and 1, token 2 nowhere
    assert bench.rdma_algo_tokens(idx, shape, "InterNodeV1", 4)[0] == 3
    assert bench.rdma_algo_tokens(idx, shape, "InterNode", 4)[0] == 3
    assert bench.rdma_algo_tokens(idx, shape, "InterNodeV1LL", 4)[0] == 3 * 2  # every token on every node
    assert bench.rdma_algo_tokens(idx, shape, "InterNodeV1", 1)[0] == 4  # G = 1: PEs 0, 1 / 0, 4


def test_the_bench_refuses_bad_arguments_and_sizes_its_heap(capsys):
    from mori_compiler.ep_schema import EpSizes, buffers_for

    bench = _bench()
    for argv, needle in ((["--gpn", "3"], "must be a power of two"), (["--kinds", "IntraNode,V2"], "unknown --kinds")):
        with pytest.raises(SystemExit) as exc:
            bench.parse_args(argv)
        assert exc.value.code == 1 and needle in capsys.readouterr().err  # the user's error, not exit 2
    args = bench.parse_args(["--tokens", "128,4096"])
    assert [k for k, _ in bench.variants(args)].count("IntraNode") == 1
    heap = bench.heap_size(args)
    for tokens in args.tokens:
        for kind, gpn in bench.variants(args):
            cfg = bench.bench_config(kind, gpn, tokens, args)
            assert cfg.block_num % cfg.world_size == 0 or kind != "InterNode"
            assert sum(s for _, s in buffers_for(KernelType(cfg.kernel_type), EpSizes.from_config(cfg))) < heap
